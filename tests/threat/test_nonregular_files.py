"""Threat model: non-regular files and unbounded reads. Whoever controls a
remote's storage, or hands over a bundle path, can put a FIFO where a file
is expected (an open() or read() that never returns) or a link to an
endless device (/dev/zero: a download that fills the disk). wdiff must open
everything without blocking, require regular files, and bound every read by
what the format allows; a refusal is exit status 4 (the input is not what
the format says), quickly, with nothing left behind.

A hang is a subprocess still running after HANG_S seconds (then killed).
The /dev/zero cases run under RLIMIT_FSIZE so that today's behaviour cannot
fill the test machine's disk.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from factory import simple_pair, tree
from threatlib import HANG_S, chain_signature_object, files_over, ok, read_chain, user_env, wdiff, wdiff_many

INTEGRITY = 4
FSIZE_GUARD = 64 * 1024 * 1024  # what today's unbounded copy may write before the kernel stops it
JUNK = 1024 * 1024  # a signature is a few hundred bytes: nothing left over this size


@pytest.fixture
def world(tmp_path):
    A, B = simple_pair(tmp_path)
    user = user_env(tmp_path / "user")
    ok(wdiff("keygen", tmp_path / "key", "-q", env=user))
    remote = tmp_path / "remote"
    ok(wdiff("push", "--sign", tmp_path / "key", "--anchor", A, remote, "-q", env=user))
    return {"tmp": tmp_path, "A": Path(A), "B": Path(B), "remote": remote, "user": user,
            "key": tmp_path / "key", "pub": tmp_path / "key.pub"}


def replace_with_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def replace_with_dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def problem(run, what: str) -> str | None:
    if run.hung:
        return f"{what} HUNG\n{run}"
    if run.rc != INTEGRITY:
        return f"{what} did not refuse with exit {INTEGRITY}\n{run}"
    return None


def refused(run, what: str) -> None:
    p = problem(run, what)
    assert p is None, p


def all_refused(runs, names) -> None:
    problems = [p for p in (problem(r, n) for r, n in zip(runs, names)) if p]
    assert not problems, f"{len(problems)} of {len(names)} commands:\n\n" + "\n\n".join(problems)


def test_fifo_as_chain_json_does_not_hang_log_status_or_pull(world):
    w = world
    replace_with_fifo(w["remote"] / "chain.json")
    d = w["tmp"] / "D"
    runs = wdiff_many([
        ["log", w["remote"]],
        ["status", w["A"], w["remote"]],
        ["pull", w["remote"], d],
    ], env=w["user"])
    all_refused(runs, ("log", "status", "pull"))
    assert not d.exists(), "a pull refused before it read a chain left a directory behind"


def test_fifo_as_a_part_object_does_not_hang_pull(world):
    w = world
    entry = read_chain(w["remote"])["entries"][0]
    replace_with_fifo(w["remote"] / entry["parts"][0]["path"])
    d = w["tmp"] / "D"
    (pull,) = wdiff_many([["pull", w["remote"], d]], env=w["user"])
    refused(pull, "pull")
    assert not d.exists() or tree(d) == {}


def test_fifo_as_a_bundle_does_not_hang_info_apply_verify_or_sign(world):
    w = world
    fifo = w["tmp"] / "bundle.wdb"
    os.mkfifo(fifo)
    runs = wdiff_many([
        ["info", fifo],
        ["apply", fifo, w["A"], "-o", w["tmp"] / "out"],
        ["verify", w["A"], "--bundle", fifo],
        ["sign", fifo, "--key", w["key"]],
    ], env=w["user"])
    all_refused(runs, ("info", "apply", "verify --bundle", "sign"))
    assert not (w["tmp"] / "out").exists()
    assert not (w["tmp"] / "bundle.wdb.minisig").exists()


def test_dev_zero_as_the_chain_signature_object_is_refused(world):
    w = world
    raw = (w["remote"] / "chain.json").read_bytes()
    replace_with_dev_zero(w["remote"] / chain_signature_object(raw))
    d = w["tmp"] / "D"
    r = wdiff("pull", w["remote"], d, "--trusted-key", w["pub"], env=w["user"], timeout=HANG_S,
              max_file_bytes=FSIZE_GUARD)
    refused(r, "pull with a chain signature linked to /dev/zero")
    assert not d.exists()
    junk = files_over(w["tmp"], JUNK)  # every legitimate file here is under 0.5 MB
    assert not junk, f"the download left junk behind: {junk}"


def test_dev_zero_as_a_bundle_signature_object_is_refused_and_leaves_no_junk(world):
    w = world
    entry = read_chain(w["remote"])["entries"][0]
    replace_with_dev_zero(w["remote"] / entry["signature"])
    d = w["tmp"] / "D"
    r = wdiff("pull", w["remote"], d, "--trusted-key", w["pub"], env=w["user"], timeout=HANG_S,
              max_file_bytes=FSIZE_GUARD)
    refused(r, "pull with a bundle signature linked to /dev/zero")
    assert not d.exists() or tree(d) == {}
    junk = files_over(w["tmp"], JUNK)  # every legitimate file here is under 0.5 MB
    assert not junk, f"the download left junk behind: {junk}"


def test_dev_zero_as_chain_json_is_refused_with_a_bounded_read(world):
    w = world
    replace_with_dev_zero(w["remote"] / "chain.json")
    runs = wdiff_many([["log", w["remote"]], ["status", w["A"], w["remote"]]], env=w["user"])
    all_refused(runs, ("log", "status"))
    for run in runs:  # 32 MiB (the chain size limit) is the most a bounded read may take
        assert run.maxrss_kib < 256 * 1024, str(run)
