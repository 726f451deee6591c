"""What a killed commit, gc, verify or squashing push leaves in the system's
temporary directory: a scratch folder holding every part it downloaded
(gigabytes for a real version). Killed again and again from cron, they
would fill the disk. The next run that needs the same kind of scratch
removes those whose owner is gone, and only those: a live owner's, another
user's, a name wdiff did not make, or what a planted link points at stay.

Every test drives the real command line; the debris is made by SIGKILL or
planted by hand in the layout fsutil.scratch_dir writes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from factory import mutate, rand, write_ckpt
from threatlib import dead_owner, finish, ok, start, user_env, wdiff

from wdiff.fsutil import owner_tag


def staged(tmp_path: Path, env: dict) -> Path:
    """A directory remote at A with two staged parts of B (a few MiB each,
    so that a commit spends a while downloading them)."""
    rng = np.random.default_rng(7)
    t = {"a": rand(rng, "BF16", (1024, 2048)), "b": rand(rng, "BF16", (1024, 2048))}
    A = write_ckpt(tmp_path / "A", t, groups=[["a"], ["b"]])
    B = write_ckpt(tmp_path / "B", {n: mutate(x, 0.3, rng) for n, x in t.items()}, groups=[["a"], ["b"]])
    remote = tmp_path / "remote"
    ok(wdiff("push", "--anchor", A, remote, "-q", env=env))
    for k, shard in enumerate(sorted(p.name for p in Path(B).glob("*.safetensors"))):
        more = ["--only", "*.json"] if k == 0 else []
        ok(wdiff("push", B, remote, "--base", A, "--only", shard, *more, "--stage", "s1", "-q", env=env))
    return remote


def scratches(tmp: Path, what: str) -> list[str]:
    return sorted(n for n in os.listdir(tmp) if n.startswith(f"wdiff-{what}-"))


@pytest.mark.slow
def test_a_killed_commit_leaves_scratch_that_the_next_commit_removes(tmp_path):
    env = user_env(tmp_path / "user")
    tmp = Path(env["TMPDIR"])
    remote = staged(tmp_path, env)
    args = ["commit", remote, "--stage", "s1", "--expect", 2, "-q"]
    t0 = time.monotonic()
    p = start(args, env)
    while not scratches(tmp, "commit") and p.poll() is None and time.monotonic() < t0 + 60:
        time.sleep(0.001)
    caught = p.poll() is None and bool(scratches(tmp, "commit"))
    if caught:
        os.killpg(p.pid, signal.SIGKILL)
    finish(p, args, t0, 60)
    assert caught, "the commit ended before it was caught holding its scratch folder"
    left = scratches(tmp, "commit")
    assert left, "a SIGKILL before the clean-up must leave the folder (else this tests nothing)"
    # the next commit (here: of a stage that is gone, or a rerun) clears the dead run's folder
    rerun = wdiff("commit", remote, "--stage", "s1", "--expect", 2, "-q", env=env)
    assert scratches(tmp, "commit") == [], str(rerun)


@pytest.mark.slow
def test_only_dead_owners_scratch_of_this_user_goes(tmp_path):
    env = user_env(tmp_path / "user")
    tmp = Path(env["TMPDIR"])
    remote = staged(tmp_path, env)
    dead = tmp / f"wdiff-commit-{dead_owner()}-0123abcd"
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "part00000.wdb").write_bytes(b"x" * 4096)
    live = tmp / f"wdiff-commit-{owner_tag()}-0123abcd"  # this test process: alive
    live.mkdir()
    other_user = tmp / f"wdiff-commit-{dead_owner()}-4567abcd"
    other_user.mkdir()
    os.chown(other_user, 65534, 65534)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"keep")
    link = tmp / f"wdiff-commit-{dead_owner()}-89abcdef"
    link.symlink_to(outside)
    foreign = tmp / f"wdiff-commit-{dead_owner()}-notwdiff"  # not a name wdiff makes
    foreign.mkdir()
    other_kind = tmp / f"wdiff-gc-{dead_owner()}-0123abcd"  # another command's scratch: its own run clears it
    other_kind.mkdir()

    ok(wdiff("commit", remote, "--stage", "s1", "--expect", 2, "-q", env=env))

    assert not dead.exists()
    assert live.is_dir() and other_user.is_dir() and foreign.is_dir() and other_kind.is_dir()
    assert not os.path.lexists(link), "a dead owner's link is removed, as a link"
    assert (outside / "keep").read_bytes() == b"keep", "never followed"
    assert sorted(scratches(tmp, "commit")) == sorted([live.name, other_user.name, foreign.name])


@pytest.mark.slow
def test_gc_and_verify_clear_their_own_kind(tmp_path):
    env = user_env(tmp_path / "user")
    tmp = Path(env["TMPDIR"])
    remote = staged(tmp_path, env)
    ok(wdiff("commit", remote, "--stage", "s1", "--expect", 2, "-q", env=env))
    for what in ("gc", "verify"):
        (tmp / f"wdiff-{what}-{dead_owner()}-0123abcd").mkdir()
    ok(wdiff("verify", tmp_path / "B", "--remote", remote, "-q", env=env))
    ok(wdiff("gc", remote, "--keep-last", 1, "--grace", "0s", "-q", env=env))
    assert scratches(tmp, "verify") == [] and scratches(tmp, "gc") == []
