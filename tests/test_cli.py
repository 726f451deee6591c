"""The installed console script: exit codes, stdout discipline, -q, --json."""

import json
import os
import shutil
from functools import partial
from pathlib import Path

import kit.cli
import pytest
from factory import simple_pair, tree

#: the installed console script, as a user runs it; output as bytes
run = partial(kit.cli.run, script=True, text=False)


@pytest.fixture
def pair(tmp_path):
    A, B = simple_pair(tmp_path)
    return tmp_path, A, B


@pytest.mark.slow
def test_version_and_help():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.decode().startswith("wdiff ")
    from wdiff.cli.help import EXAMPLES

    for cmd in [[]] + [[c] for c in EXAMPLES]:
        r = run(*cmd, "--help")
        assert r.returncode == 0, r.stderr
        text = r.stdout.decode()
        assert "Exit status" in text
        assert max(len(line) for line in text.splitlines()) <= 80
    assert "Examples" in run("diff", "--help").stdout.decode()


def test_no_arguments_and_unknown_command_are_usage_errors():
    assert run().returncode == 2
    r = run("frobnicate")
    assert r.returncode == 2 and r.stdout == b""


def test_diff_exit_codes(pair):
    tmp, A, B = pair
    r = run("diff", A, B)
    assert r.returncode == 0
    assert b"modified" in r.stdout and b"layer.0.w" in r.stdout
    assert run("diff", "--exit-code", A, B).returncode == 1
    r = run("diff", "--exit-code", A, A)
    assert r.returncode == 0 and b"identical" in r.stdout
    r = run("diff", "-q", "--exit-code", A, B)
    assert r.returncode == 1 and r.stdout == b"" and r.stderr == b""


def test_diff_json_is_one_document(pair):
    tmp, A, B = pair
    r = run("diff", "--json", A, B)
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    assert doc["schema"] == "wdiff.diff/1"
    assert doc["totals"]["modified"] >= 2
    assert {t["name"] for t in doc["tensors"] if t["status"] == "added"} == {"new"}


def test_diff_stat(pair):
    tmp, A, B = pair
    r = run("diff", "--stat", A, B)
    assert r.returncode == 0
    lines = r.stdout.decode().splitlines()
    assert any("layer.0.w" in line and "changed" in line for line in lines)
    assert "unchanged of" in lines[-1]


def test_pack_apply_info(pair):
    tmp, A, B = pair
    r = run("pack", A, B, "-o", tmp / "d.wdb")
    assert r.returncode == 0, r.stderr
    assert b"smaller" in r.stdout
    r = run("info", "--json", tmp / "d.wdb")
    assert r.returncode == 0 and json.loads(r.stdout)["verified"] is True
    r = run("apply", "-q", tmp / "d.wdb", A, "-o", tmp / "C")
    assert r.returncode == 0 and r.stdout == b"" and r.stderr == b""
    assert tree(tmp / "C") == tree(B)
    r = run("apply", "--json", tmp / "d.wdb", A, "-o", tmp / "D")
    assert json.loads(r.stdout)["schema"] == "wdiff.apply/1"


def test_anchor_via_cli(pair):
    tmp, A, B = pair
    assert run("pack", "--anchor", B, "-o", tmp / "a.wdb").returncode == 0
    assert run("apply", tmp / "a.wdb", "-o", tmp / "C").returncode == 0
    assert tree(tmp / "C") == tree(B)
    assert run("pack", "--anchor", A, B, "-o", tmp / "x.wdb").returncode == 2


def test_error_exit_codes(pair):
    tmp, A, B = pair
    assert run("pack", A, B, "-o", tmp / "d.wdb").returncode == 0
    r = run("apply", tmp / "d.wdb", B, "-o", tmp / "C")
    assert r.returncode == 5 and r.stdout == b""
    assert r.stderr.startswith(b"wdiff: error:")
    assert not (tmp / "C").exists()
    r = run("diff", tmp / "missing", A)
    assert r.returncode == 3
    r = run("apply", "--json", tmp / "nope.wdb", A, "-o", tmp / "C")
    assert r.returncode == 3
    doc = json.loads(r.stdout)
    assert doc["schema"] == "wdiff.error/1" and doc["error"]["exit_code"] == 3
    bad = tmp / "bad.wdb"
    bad.write_bytes(b"not a bundle at all, just text" * 10)
    assert run("info", bad).returncode == 4
    assert run("apply", tmp / "d.wdb", A).returncode == 2  # neither -o nor --in-place


def test_in_place_via_cli(pair):
    tmp, A, B = pair
    run("pack", A, B, "-o", tmp / "d.wdb")
    W = tmp / "W"
    shutil.copytree(A, W)
    r = run("apply", tmp / "d.wdb", W, "--in-place")
    assert r.returncode == 0, r.stderr
    assert tree(W) == tree(B)


@pytest.mark.slow
def test_demo(tmp_path):
    r = run("demo", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["verified"] is True and doc["ratio"] > 50
    r = run("demo", tmp_path / "d")
    assert r.returncode == 0
    assert b"byte-identical" in r.stdout
    assert (tmp_path / "d" / "A-to-B.wdb").exists()


def test_unexpected_errors_never_exit_1(pair, tmp_path):
    # a directory where a bundle is expected: an OS-level surprise, not a crash
    tmp, A, B = pair
    r = run("info", tmp)
    assert r.returncode not in (0, 1)
    assert b"Traceback" not in r.stderr


@pytest.mark.parametrize("text,want", [
    ("20GB", 20 * 10**9), ("20gb", 20 * 10**9), ("20 GB", 20 * 10**9), ("500MB", 500 * 10**6), ("1.5T", 1.5e12),
    ("20GiB", 20 * 2**30), ("1MiB", 2**20), ("1.5TiB", int(1.5 * 2**40)), ("4 kib", 4096), ("4k", 4000),
    ("1048576", 2**20), (" 2 Mi ", 2 * 2**20), ("0.5GB", 5 * 10**8),
])
def test_sizes_read_decimal_and_binary_units(text, want):
    from wdiff.cli.output import parse_size

    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["", "GB", "20XB", "20 G B", "1.5", "-1GB", "20GiBs", "nanGB", "1e3MB"])
def test_sizes_refuse_what_is_not_one(text):
    from wdiff.cli.output import parse_size

    with pytest.raises(ValueError):
        parse_size(text)


def test_usage_mistakes_and_layouts_are_usage_errors(pair):
    tmp, A, B = pair
    assert run("pack", "-q", A, B, "-o", tmp / "d.wdb").returncode == 0
    r = run("info", "--json", tmp)  # a directory where a bundle belongs
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["kind"] == "usage"
    r = run("apply", A, "-o", tmp / "out")  # BUNDLE position holds a directory, no BASE
    assert r.returncode == 2 and b"hint:" in r.stderr and not (tmp / "out").exists()
    odd = tmp / "odd"
    shutil.copytree(B, odd)
    os.mkfifo(odd / "pipe")
    r = run("diff", "--json", A, odd)
    assert r.returncode == 2 and b"hint:" in r.stderr
    assert json.loads(r.stdout)["error"]["kind"] == "layout"


@pytest.mark.slow
def test_status_ahead_missing_and_hub_hint(pair):
    tmp, A, B = pair
    R = tmp / "R"
    assert run("push", "-q", "--anchor", A, R, "--label", "v1").returncode == 0
    assert run("push", "-q", B, R, "--base", A).returncode == 0
    doc = json.loads(run("status", "--json", B, R, "--to", "v1").stdout)
    assert doc["ahead"] == 1 and not doc["up_to_date"]
    assert json.loads(run("status", "--json", A, R).stdout)["ahead"] == 0
    r = run("status", "--json", tmp / "nowhere", R)
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["exists"] is False and doc["from_anchor"] and doc["behind"] == 2
    assert json.loads(run("status", "--json", A, R).stdout)["exists"] is True
    r = run("status", "--exit-code", tmp / "nowhere", R)
    assert r.returncode == 1 and b"does not exist" in r.stdout and b"behind" not in r.stdout
    r = run("status", Path(A) / "config.json", R)
    assert r.returncode == 2 and b"not a directory" in r.stderr
    for args in (("status", A, "acme/policy"), ("pull", "acme/policy", tmp / "P"), ("log", "acme/policy@main")):
        r = run(*args, cwd=tmp)
        assert r.returncode == 3 and b"did you mean hf://acme/policy" in r.stderr, (args, r.stderr)
    r = run("log", "./acme/policy", cwd=tmp)  # plainly a path: no such guess
    assert r.returncode == 3 and b"hf://" not in r.stderr


def test_generate_check_reports_drift(tmp_path):
    assert run("generate", "--check", Path(__file__).resolve().parent.parent).returncode == 0
    r = run("generate", "--check", tmp_path)  # nothing generated there yet
    assert r.returncode == 1 and b"out of date: man/wdiff.1" in r.stdout
