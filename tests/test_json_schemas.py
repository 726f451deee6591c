"""Every --json document wdiff prints is documented by a JSON Schema in
wdiff/cli/schemas/ (shipped in the wheel), and real output of every command
is checked against it: a field added, renamed or retyped without its schema
fails here."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import kit.cli
from factory import simple_pair
from schemacheck import errors

#: both tests read the documents of some forty commands, run once for the module
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "wdiff" / "cli" / "schemas"


def _schemas() -> dict[str, dict]:
    out = {}
    for p in sorted(SCHEMAS.glob("*.json")):
        s = json.loads(p.read_text())
        assert s["$id"] == s["properties"]["schema"]["const"], p.name
        assert p.stem == s["$id"].split(".", 1)[1].split("/")[0], p.name
        out[s["$id"]] = s
    return out


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> list[tuple[str, int, dict]]:
    """(what was run, exit status, document) for every command and outcome."""
    t = tmp_path_factory.mktemp("json")
    A, B = simple_pair(t)
    docs = []

    def run(*args, want=0):
        r = kit.cli.run(*args, "--json", cwd=t, env={"WDIFF_THREADS": "2"}, want=want, timeout=120)
        docs.append((" ".join(map(str, args)), r.returncode, json.loads(r.stdout)))

    run("diff", A, B)
    run("diff", A, A)
    run("pack", A, B, "-o", "d.wdb")
    run("pack", "--anchor", B, "-o", "b.wdb")
    run("info", "d.wdb")
    run("apply", "d.wdb", A, "-o", "C")
    shutil.copytree(A, t / "live")
    run("apply", "d.wdb", "live", "--in-place")
    run("squash", "d.wdb", "--base", A, "-o", "s.wdb")
    run("push", "--anchor", A, "R", "--label", "v1")
    run("push", "d.wdb", "R", "--label", "v2")
    run("push", "d.wdb", "R")  # already there
    run("log", "R")
    run("log", "empty-remote", want=3)
    run("status", A, "R")
    run("status", B, "R")
    run("status", B, "R", "--to", "v1")
    run("pull", "R", "P")
    run("pull", "R", "P")  # up to date
    run("export", "R", "HF")
    run("export", "R", "HF")  # up to date
    run("pull", "HF", "HP", "--layout", "hf-delta")
    run("pull", "HF", "HP", "--layout", "hf-delta")  # up to date
    run("verify", "C", "--remote", "R")
    run("verify", "C", "--bundle", "d.wdb")
    run("verify", A, "--remote", "R", want=4)
    run("squash", "--remote", "R")
    run("push", B, "R2", "--anchor", "--label", "b")
    run("push", A, "R2", "--base", B, "--anchor-every", "1")
    run("gc", "R2", "--keep-last", "1", "--dry-run")
    run("gc", "R2", "--keep-last", "1", "--grace", "0")
    run("gc", "nowhere-remote", "--keep-last", "1", want=3)
    run("push", B, "R2", "--base", A, "--only", "*", "--stage", "s")
    run("commit", "R2", "--stage", "s", "--expect", "1")
    run("keygen", "k")
    run("sign", "d.wdb", "--key", "k")
    run("demo", "--size-mb", "1")
    run("diff", A, want=2)  # usage, found while parsing
    run("apply", A, "d.wdb", "-o", "X", want=2)
    run("diff", A, "nowhere", want=3)
    run("apply", "d.wdb", B, "-o", "Y", want=5)
    return docs


def test_every_document_matches_its_schema(documents):
    schemas = _schemas()
    seen = set()
    for what, rc, doc in documents:
        name = doc.get("schema")
        assert name in schemas, f"`wdiff {what}`: no schema file documents {name!r}"
        assert (name == "wdiff.error/1") == (rc not in (0, 1)), f"`wdiff {what}` exited {rc} with a {name}"
        problems = errors(schemas[name], doc)
        details = doc.get("error", {}).get("details")
        if details is not None:
            seen.add(details["schema"])
            problems += errors(schemas[details["schema"]], details, "$.error.details")
        assert not problems, f"`wdiff {what} --json` breaks {name}:\n" + "\n".join(problems)
        seen.add(name)
    assert seen == set(schemas), f"schemas no command was seen printing: {set(schemas) - seen}"


def test_every_schema_the_code_names_has_a_file():
    named = set()
    for p in (ROOT / "wdiff").rglob("*.py"):
        named |= set(re.findall(r"\"(wdiff\.[a-z]+/\d+)\"", p.read_text()))
    assert named and named <= set(_schemas()), named - set(_schemas())


def test_the_validator_refuses_what_breaks_a_schema(documents):
    schemas = _schemas()
    _, _, doc = next(d for d in documents if d[2]["schema"] == "wdiff.status/1")
    s = schemas["wdiff.status/1"]
    assert errors(s, doc) == []
    assert errors(s, {k: v for k, v in doc.items() if k != "behind"}) == ["$: missing 'behind'"]
    assert errors(s, dict(doc, behind="1")) == ["$.behind: str is not integer"]
    assert errors(s, dict(doc, new_field=1)) == ["$: 'new_field' is not documented in the schema"]
    assert errors(s, dict(doc, current="XYZ"))[0].startswith("$.current: 'XYZ' does not match")
    assert errors(s, dict(doc, up_to_date=1)) == ["$.up_to_date: int is not boolean"]
    with pytest.raises(ValueError):
        errors({"oneOf": []}, 1)
