"""The record a pull leaves in DIR/.wdiff/state.json: what it narrows, what a
planted one can and cannot make a pull do, and the cases of pull --force and
--atomic that the issue's tests do not reach. Real command line only."""

from __future__ import annotations

import json
import os

import pytest
from factory import tree
from uxkit import Promises, one_json_doc, weights_tree, wdiff


def _state(d) -> dict:
    return json.loads((d / ".wdiff" / "state.json").read_text())


def test_a_pull_records_the_version_and_its_files(chain):
    d = chain.pull("d", to="v1")
    st = _state(d)
    assert st["schema"] == "wdiff-state/1"
    assert sorted(f["path"] for f in st["files"]) == sorted(tree(chain.A))
    r = wdiff("pull", "--json", chain.R, d)
    assert r.rc == 0, r
    assert _state(d)["version"] == one_json_doc(r.out)["after"]
    assert sorted(f["path"] for f in _state(d)["files"]) == sorted(tree(chain.B))


@pytest.mark.slow
def test_a_planted_record_is_refused_and_nothing_is_deleted(chain):
    d = chain.pull("d", to="v1")
    outside = chain.tmp / "victim.txt"
    outside.write_bytes(b"not DIR's")
    good = _state(d)
    with Promises() as p:
        for what, doc in [
            ("a path that climbs out", dict(good, files=good["files"] + [
                {"path": "../victim.txt", "kind": "file", "size": 9, "digest": "0" * 32}])),
            ("rows that are not the version it names", dict(good, version="f" * 32)),
            ("a path inside .git/", dict(good, files=[{"path": ".git/HEAD", "kind": "file", "size": 1,
                                                       "digest": "0" * 32}] + good["files"])),
            ("not JSON", None),
        ]:
            (d / ".wdiff" / "state.json").write_bytes(b"{" if doc is None else json.dumps(doc).encode())
            before = tree(d)
            r = wdiff("pull", "--force", chain.R, d)
            p.check(r.rc == 4, f"a record with {what} is refused as an integrity failure (exit 4)", r)
            p.check(tree(d) == before and outside.read_bytes() == b"not DIR's", f"{what}: nothing changed", r)
            p.check("state.json" in r.err, f"{what}: the message names the record", r)


def test_a_symlinked_record_is_refused(chain):
    d = chain.pull("d", to="v1")
    fake = chain.tmp / "fake-state.json"
    (d / ".wdiff" / "state.json").rename(fake)
    (d / ".wdiff" / "state.json").symlink_to(fake)
    before = tree(d)
    r = wdiff("pull", chain.R, d)
    assert r.rc == 4 and "symbolic link" in r.err, r
    assert tree(d) == before


@pytest.mark.slow
def test_an_untracked_file_where_the_new_version_has_one(chain):
    B = tree(chain.B)
    d = chain.pull("d", to="v1")
    (d / "tokenizer.json").write_bytes(b"my own tokenizer")  # v2 adds tokenizer.json
    (d / "NOTES.md").write_bytes(b"notes")
    before = tree(d)
    with Promises() as p:
        r = wdiff("pull", chain.R, d)
        p.check(r.rc == 5 and "tokenizer.json" in r.err and "--force" in r.err,
                "a pull that would overwrite an untracked file refuses, names it and hints --force", r)
        p.check(tree(d) == before, "and changes nothing", r)
        r = wdiff("pull", "--force", "--json", chain.R, d)
        p.check(r.rc == 0 and {k: v for k, v in weights_tree(d).items() if k != "NOTES.md"} == B,
                "--force writes the new version's tokenizer.json", r)
        p.check((d / "NOTES.md").read_bytes() == b"notes", "and keeps NOTES.md", r)
        doc = one_json_doc(r.out) or {}
        p.check(doc.get("restored") == ["tokenizer.json"] and not doc.get("from_anchor"),
                "the document names what was discarded; the delta sufficed", r)


@pytest.mark.slow
def test_force_over_a_change_no_delta_carries_restores_from_an_anchor(chain):
    B = tree(chain.B)
    d = chain.pull("d", to="v1")
    shard = sorted(p for p in tree(d) if p.endswith(".safetensors"))[0]
    data = bytearray((d / shard).read_bytes())
    data[-1] ^= 0xFF  # a tensor file, patched in place by the delta: the delta cannot restore it
    (d / shard).write_bytes(bytes(data))
    (d / "NOTES.md").write_bytes(b"notes")
    with Promises() as p:
        r = wdiff("pull", chain.R, d)
        p.check(r.rc == 5 and shard in r.err, f"the edited {shard} is refused by default", r)
        r = wdiff("pull", "--force", "--json", chain.R, d)
        p.check(r.rc == 0, "pull --force succeeds", r)
        p.check({k: v for k, v in weights_tree(d).items() if k != "NOTES.md"} == B, "DIR is the new version", r)
        p.check((d / "NOTES.md").read_bytes() == b"notes", "NOTES.md is kept", r)
        p.check((one_json_doc(r.out) or {}).get("from_anchor") is True, "it was restored from an anchor", r)


@pytest.mark.slow
def test_force_at_the_head_restores_the_changed_file(chain):
    d = chain.pull("d")
    (d / "config.json").write_bytes(b"edited")
    r = wdiff("pull", chain.R, d)
    assert r.rc == 5 and "config.json" in r.err, r
    r = wdiff("pull", "--force", chain.R, d)
    assert r.rc == 0 and weights_tree(d) == tree(chain.B), r


@pytest.mark.slow
def test_atomic_needs_a_link_and_keeps_the_old_target(chain):
    d = chain.pull("d", to="v1")
    r = wdiff("pull", "--atomic", chain.R, d)
    assert r.rc == 2 and "symbolic link" in r.err, r
    site = chain.tmp / "site"
    site.mkdir()
    os.rename(d, site / "v1")
    (site / "current").symlink_to("v1")
    (site / "v1" / "NOTES.md").write_bytes(b"notes")
    old = tree(site / "v1")
    r = wdiff("pull", "--atomic", "--json", chain.R, site / "current")
    assert r.rc == 0, r
    assert os.readlink(site / "current") == "v2"  # relative stays relative, named after the label
    assert weights_tree(site / "current") == tree(chain.B)
    assert tree(site / "v1") == old  # the old version is kept, untouched
    assert set(os.listdir(site)) == {"current", "v1", "v2", ".current.wdiff-versions"}  # v1 is not --atomic's: kept
    r = wdiff("pull", "--atomic", chain.R, site / "current")
    assert r.rc == 0 and "already" in r.out, r


@pytest.mark.slow
def test_status_reads_the_record_as_pull_does(chain):
    """Files a pull did not put there are not part of the checkpoint for
    status either; a changed tracked file is named, as pull names it."""
    d = chain.pull("d", to="v1")
    (d / "NOTES.md").write_bytes(b"my notes")
    (d / ".git").mkdir()
    (d / ".git" / "HEAD").write_bytes(b"ref: refs/heads/main\n")
    with Promises() as p:
        r = wdiff("status", "--json", d, chain.R)
        doc = one_json_doc(r.out) or {}
        p.check(r.rc == 0 and doc.get("recorded") is True and doc.get("known") is True
                and doc.get("behind") == 1 and not doc.get("from_anchor") and doc.get("local_changes") == [],
                "untracked files leave DIR at its recorded version, one delta behind", r)
        r = wdiff("status", d, chain.R)
        p.check(r.rc == 0 and "1 bundle behind" in r.out and "local changes" not in r.out,
                "and the human answer says so", r)
        ok_pull = wdiff("pull", "-q", chain.R, d)
        p.check(ok_pull.rc == 0, "the pull goes through", ok_pull)
        r = wdiff("status", "--json", "--exit-code", d, chain.R)
        p.check(r.rc == 0 and (one_json_doc(r.out) or {}).get("up_to_date") is True,
                "after the pull, up to date though NOTES.md and .git/ are still there", r)
        (d / "config.json").write_bytes(b'{"hand": "edited"}')
        r = wdiff("status", "--json", "--exit-code", d, chain.R)
        doc = one_json_doc(r.out) or {}
        p.check(r.rc == 1 and doc.get("up_to_date") is False and doc.get("local_changes") == ["config.json"]
                and doc.get("current") == doc.get("target"),
                "a hand-edited tracked file is a local change of the recorded version, named, exit 1", r)
        r = wdiff("status", d, chain.R)
        p.check("local changes" in r.out and "config.json" in r.out and "--force" in r.out,
                "the human answer names the file and how pull treats it", r)
        r = wdiff("pull", chain.R, d)
        p.check(r.rc == 5 and "config.json" in r.err, "and pull refuses it as status said", r)
