"""What a killed writer leaves beside its output: ``pack`` writes its bundle
as ``.OUT.wdiff-tmp-PID-START-RANDOM``, ``apply -o`` builds the checkpoint
in such a directory. Killed, the process leaves a partial bundle or a
partial checkpoint (gigabytes, hidden). The next writer of the same output
removes the ones whose owner is gone, and only those: a live owner's temp,
another output's, or a name wdiff did not make stays. Every test drives the
real command line; the debris is made by SIGKILL or planted by hand in the
layout fsutil.temp_name writes."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from factory import simple_pair, tree
from kit.cli import argv
from threatlib import dead_owner, ok, user_env, wdiff

from wdiff.fsutil import owner_tag


@pytest.fixture
def world(tmp_path):
    A, B = simple_pair(tmp_path / "data")
    env = user_env(tmp_path / "user")
    ab = tmp_path / "ab.wdb"
    ok(wdiff("pack", "-q", A, B, "-o", ab, env=env))
    return A, B, ab, env


def hidden(parent: Path) -> list[str]:
    return sorted(n for n in os.listdir(parent) if n.startswith("."))


def test_pack_clears_the_partial_bundle_of_a_killed_pack(world, tmp_path):
    A, B, _, env = world
    out = tmp_path / "out.wdb"
    partial = tmp_path / f".out.wdb.wdiff-tmp-{dead_owner()}-0badc0de"
    partial.write_bytes(b"WDIFF" + b"\0" * 4096)  # what a pack killed mid-write leaves
    ok(wdiff("pack", "-q", A, B, "-o", out, env=env))
    assert not partial.exists()
    assert hidden(tmp_path) == []
    ok(wdiff("verify", "--bundle", out, B, env=env))


def test_apply_clears_the_partial_checkpoint_of_a_killed_apply(world, tmp_path):
    A, B, ab, env = world
    out = tmp_path / "out"
    partial = tmp_path / f".out.wdiff-tmp-{dead_owner()}-0badc0de"
    partial.mkdir()
    (partial / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 8192)
    (partial / "sub").mkdir()
    (partial / "sub" / "x").write_bytes(b"x")
    ok(wdiff("apply", "-q", ab, A, "-o", out, env=env))
    assert not partial.exists()
    assert tree(out) == tree(B)
    assert hidden(tmp_path) == []


def test_a_sigkilled_apply_leaves_nothing_once_rerun(world, tmp_path):
    """A real kill, once the temp directory holds files: OUT never appears
    half-written, and the rerun clears the partial copy."""
    A, B, ab, env = world
    out = tmp_path / "out"
    env1 = dict(env, WDIFF_THREADS="1")
    p = subprocess.Popen(argv("apply", "-q", ab, A, "-o", out), env=env1, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    killed = False
    while p.poll() is None and time.monotonic() < deadline:
        tmps = [n for n in os.listdir(tmp_path) if n.startswith(".out.wdiff-tmp-")]
        if tmps and any((tmp_path / tmps[0]).iterdir()):
            p.send_signal(signal.SIGKILL)
            killed = True
            break
    p.wait()
    if not killed:
        pytest.skip("the apply finished before its temp directory could be seen (machine too fast)")
    assert not out.exists()
    assert any(n.startswith(".out.wdiff-tmp-") for n in os.listdir(tmp_path)), "the kill left nothing to clear"
    ok(wdiff("apply", "-q", ab, A, "-o", out, env=env))
    assert tree(out) == tree(B)
    assert hidden(tmp_path) == []


def test_what_is_not_a_dead_writers_temp_of_this_output_stays(world, tmp_path):
    A, B, ab, env = world
    out = tmp_path / "out"
    keep = [
        f".out.wdiff-tmp-{owner_tag()}-0badc0de",  # its owner (this test) runs
        ".out.wdiff-tmp-0badc0de",  # no owner in the name: not provably dead
        f".other.wdiff-tmp-{dead_owner()}-0badc0de",  # another output's
        f".out.wdiff-tmpx-{dead_owner()}-0badc0de",
        f".out.wdiff-tmp-{dead_owner()}-0badc0de.mine",
        f".out.x.wdiff-tmp-{dead_owner()}-0badc0de",
    ]
    for n in keep:
        (tmp_path / n).mkdir()
        (tmp_path / n / "f").write_bytes(b"user data")
    ok(wdiff("apply", "-q", ab, A, "-o", out, env=env))
    assert tree(out) == tree(B)
    assert hidden(tmp_path) == sorted(keep)
    for n in keep:
        assert (tmp_path / n / "f").read_bytes() == b"user data"


def test_a_link_planted_as_a_dead_temp_is_removed_not_followed(world, tmp_path):
    A, B, ab, env = world
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_bytes(b"weeks of GPU time")
    link = tmp_path / f".out.wdiff-tmp-{dead_owner()}-0badc0de"
    link.symlink_to(victim, target_is_directory=True)
    ok(wdiff("apply", "-q", ab, A, "-o", tmp_path / "out", env=env))
    assert not os.path.lexists(link)
    assert (victim / "precious").read_bytes() == b"weeks of GPU time"


def test_apply_into_an_output_another_apply_is_writing_is_busy(world, tmp_path):
    """Two ``apply -o OUT`` at once: the second is refused (exit 8) before
    it writes anything, instead of building a second copy beside OUT."""
    A, B, ab, env = world
    out = tmp_path / "out"
    lock = tmp_path / ".out.wdiff-lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        run = wdiff("apply", "-q", ab, A, "-o", out, env=env)
        assert run.rc == 8, str(run)
        assert "in use" in run.stderr, str(run)
        assert not out.exists()
        assert hidden(tmp_path) == [".out.wdiff-lock"]
    finally:
        os.close(fd)
    ok(wdiff("apply", "-q", ab, A, "-o", out, env=env))
    assert tree(out) == tree(B)


@pytest.mark.parametrize("pid", ["0", "2147483648", "99999999999999999999"])
def test_a_planted_temp_naming_no_process_is_cleared_not_a_crash(world, tmp_path, pid):
    """A hostile name beside OUT whose PID is no process (0 would signal
    this process group; a huge one overflows kill) is debris, removed, and
    the apply succeeds."""
    A, B, ab, env = world
    planted = tmp_path / f".out.wdiff-tmp-{pid}-1-0badc0de"
    planted.mkdir()
    ok(wdiff("apply", "-q", ab, A, "-o", tmp_path / "out", env=env))
    assert not planted.exists()
    assert tree(tmp_path / "out") == tree(B)

