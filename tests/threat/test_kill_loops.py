"""Killed at any moment, a writer of a remote or of a checkpoint directory
leaves the old or the new state, never a mix; and writers racing on one
directory and one remote end with documented exit codes only.

Each loop runs the real command line and SIGKILLs it at a moment drawn
uniformly over one and a half times an uninterrupted run's duration
(measured first: a loaded machine runs slower than the probe did), sixty
times: ``squash --remote``, a signed push, and a pull that rebuilds the
directory beside itself. After every kill the state is checked from outside:
the remote's chain is one of the two chains (the one before, or the one
after) and every version it names still pulls bit for bit, or the directory
is byte for byte the old or the new version; then a rerun finishes the job
and leaves no debris. The last test starts pull, pull, push and an in-place
apply at once on the same directory and remote, round after round.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from functools import partial
from pathlib import Path

import kit.cli
import numpy as np
import pytest
from factory import mutate, rand, tree, write_ckpt

#: kill loops: 60 SIGKILLs at random moments a test
pytestmark = pytest.mark.slow

KILLS = 60
#: every exit status a command may end with when it loses a race: success,
#: base mismatch (the directory moved on), busy (a lock or an unfinished apply)
RACE_CODES = {0, 5, 8}


#: the command line, which must succeed; ``env``: changes to the environment
run = partial(kit.cli.run, want=0)


def killed_at(args, when: float, env=None) -> None:
    """Start ``wdiff ARGS`` and SIGKILL it after ``when`` seconds (or let it end)."""
    p = subprocess.Popen(kit.cli.argv(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=kit.cli.environment(env))
    try:
        p.wait(timeout=when)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGKILL)
        p.wait()


def duration(args, env=None) -> float:
    t0 = time.monotonic()
    run(*args, env=env)
    return time.monotonic() - t0


def chain_of(remote: Path) -> tuple:
    """What a chain says, less the times a rerun writes anew: its head and
    its entries (bundle, base, target, parts)."""
    d = json.loads((remote / "chain.json").read_bytes())
    return d["head"], tuple((e["bundle"], e["parent"], e["version"], json.dumps(e["parts"])) for e in d["entries"])


def head_of(remote: Path, env=None, *extra) -> str:
    return json.loads(run("log", "--json", remote, *extra, env=env).stdout)["head"]


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """Three versions of a small checkpoint, A -> B -> C, a few RL steps apart."""
    t = tmp_path_factory.mktemp("kill")
    rng = np.random.default_rng(2026)
    a = {f"layer.{i}.w": rand(rng, "BF16", (256, 256)) for i in range(4)}
    a["norm"] = rand(rng, "F32", (256,))
    b = {k: mutate(v, 0.02, rng) for k, v in a.items()}
    c = {k: mutate(v, 0.02, rng) for k, v in b.items()}
    c["extra"] = rand(rng, "F32", (32, 32))
    out = []
    for name, tensors in (("A", a), ("B", b), ("C", c)):
        out.append(Path(write_ckpt(t / name, tensors, shards=2, companions={"config.json": name.encode()})))
    return out


@pytest.fixture()
def env(tmp_path):
    """Changes to the environment (kit.cli.environment): this test's own user state, one thread."""
    return {"WDIFF_STATE_DIR": tmp_path / "state", "WDIFF_THREADS": "1"}


def _pulls_exactly(remote: Path, versions, tmp: Path, env, *extra) -> None:
    """Every version the remote's chain names pulls into an empty directory bit for bit."""
    log = json.loads(run("log", "--json", remote, *extra, env=env).stdout)
    known = {json.loads(run("status", "--json", v, remote, *extra, env=env).stdout)["current"]: v for v in versions}
    for e in log["entries"]:
        want = known.get(e["version"])
        assert want is not None, f"the chain names a version that is none of ours: {e['version']}"
        d = tmp / f"check-{e['version'][:8]}"
        shutil.rmtree(d, ignore_errors=True)
        run("pull", "-q", "--to", e["version"], remote, d, *extra, env=env)
        assert tree(d) == tree(want)
        shutil.rmtree(d)


def test_squash_remote_killed_anywhere_leaves_the_old_or_the_new_chain(versions, tmp_path, env):
    A, B, C = versions
    remote = tmp_path / "remote"
    run("push", "-q", "--anchor", A, remote, env=env)
    run("push", "-q", B, remote, "--base", A, env=env)
    run("push", "-q", C, remote, "--base", B, env=env)
    before = tmp_path / "before"
    shutil.copytree(remote, before)
    old = chain_of(remote)
    probe = tmp_path / "probe"
    shutil.copytree(before, probe)
    t = duration(["squash", "-q", "--remote", probe], env=env)
    new = chain_of(probe)
    rng = np.random.default_rng(1)
    outcomes = {"old": 0, "new": 0}
    for k in range(KILLS):
        shutil.rmtree(remote)
        shutil.copytree(before, remote)
        killed_at(["squash", "-q", "--remote", remote], float(rng.uniform(0, 1.5 * t)), env=env)
        now = chain_of(remote)
        assert now in (old, new), f"kill {k}: the chain is neither the old one nor the squashed one"
        outcomes["old" if now == old else "new"] += 1
        if k % 25 == 0:
            _pulls_exactly(remote, versions, tmp_path, env)
        run("squash", "-q", "--remote", remote, env=env)  # the rerun finishes the job
        assert chain_of(remote) == new
    assert sum(outcomes.values()) == KILLS and outcomes["old"] and outcomes["new"], outcomes
    _pulls_exactly(remote, versions, tmp_path, env)


def test_signed_push_killed_anywhere_leaves_a_verifiable_old_or_new_chain(versions, tmp_path, env):
    A, B, C = versions
    key = tmp_path / "release.key"
    run("keygen", key, env=env)
    pub = f"{key}.pub"
    remote = tmp_path / "remote"
    run("push", "-q", "--anchor", A, remote, "--sign", key, env=env)
    run("push", "-q", B, remote, "--base", A, "--sign", key, env=env)
    before = tmp_path / "before"
    shutil.copytree(remote, before)
    state_before = tmp_path / "state-before"
    shutil.copytree(env["WDIFF_STATE_DIR"], state_before)
    old_head = head_of(remote, env, "--trusted-key", pub)
    args = ["push", "-q", C, remote, "--base", B, "--sign", key]
    probe = tmp_path / "probe"
    shutil.copytree(before, probe)
    t = duration([*args[:2], C, probe, *args[4:]], env=env)
    new_head = head_of(probe, env, "--trusted-key", pub)
    rng = np.random.default_rng(2)
    outcomes = {"old": 0, "new": 0}
    for k in range(KILLS):
        for src, dst in ((before, remote), (state_before, Path(env["WDIFF_STATE_DIR"]))):
            shutil.rmtree(dst)
            shutil.copytree(src, dst)
        killed_at(args, float(rng.uniform(0, 1.5 * t)), env=env)
        head = head_of(remote, env, "--trusted-key", pub)  # the signed chain verifies, whichever it is
        assert head in (old_head, new_head), f"kill {k}: head {head} is neither the old nor the new one"
        outcomes["old" if head == old_head else "new"] += 1
        if k % 25 == 0:
            _pulls_exactly(remote, versions, tmp_path, env, "--trusted-key", pub)
        if head == old_head:
            run(*args, env=env)  # the rerun publishes it
        assert head_of(remote, env, "--trusted-key", pub) == new_head
    assert sum(outcomes.values()) == KILLS and outcomes["old"] and outcomes["new"], outcomes
    _pulls_exactly(remote, versions, tmp_path, env, "--trusted-key", pub)


def test_rebuild_beside_pull_killed_anywhere_leaves_old_or_new_and_no_debris(versions, tmp_path, env):
    """A directory at a version the remote does not know is rebuilt (--force)
    from the anchor beside itself and swapped in: killed anywhere, DIR is the old
    bytes or the new, and the next pull leaves nothing beside it."""
    A, B, C = versions
    remote = tmp_path / "remote"
    run("push", "-q", "--anchor", A, remote, env=env)
    run("push", "-q", B, remote, "--base", A, env=env)
    parent = tmp_path / "deploy"
    parent.mkdir()
    live = parent / "live"
    probe = tmp_path / "probe"
    shutil.copytree(C, probe)  # C is not on the remote: a pull rebuilds from the anchor
    t = duration(["pull", "-q", "--force", remote, probe], env=env)
    old, new = tree(C), tree(B)
    rng = np.random.default_rng(3)
    outcomes = {"old": 0, "new": 0, "empty": 0}
    for k in range(KILLS):
        shutil.rmtree(live, ignore_errors=True)
        shutil.copytree(C, live)
        killed_at(["pull", "-q", "--force", remote, live], float(rng.uniform(0, 1.5 * t)), env=env)
        if live.exists():
            now = tree(live)
            if now == old:
                outcomes["old"] += 1
            elif now == new:
                outcomes["new"] += 1
            else:
                assert now == {}, f"kill {k}: {live} holds a mix of versions: {sorted(now)}"
                outcomes["empty"] += 1
        else:  # killed between the two renames: no directory, which the next pull treats as empty
            outcomes["empty"] += 1
        run("pull", "-q", "--force", remote, live, env=env)
        assert tree(live) == new
        assert sorted(p.name for p in parent.iterdir()) == ["live"], f"kill {k}: debris beside DIR"
    assert sum(outcomes.values()) == KILLS and outcomes["new"], outcomes


def test_pull_pull_push_and_in_place_apply_race_with_documented_outcomes(versions, tmp_path, env):
    """Round after round, two pulls, a push and an in-place apply start at
    once on one directory and one remote. Each ends with 0, 5 (the directory
    moved on) or 8 (busy); the directory is always exactly one version; the
    remote's chain always decodes and every version on it pulls exactly."""
    A, B, C = versions
    rounds = 9
    bundle = tmp_path / "b-to-c.wdb"
    run("pack", "-q", B, C, "-o", bundle, env=env)
    rng = np.random.default_rng(4)
    for k in range(rounds):
        remote = tmp_path / f"remote{k}"
        run("push", "-q", "--anchor", A, remote, env=env)
        run("push", "-q", B, remote, "--base", A, env=env)
        live = tmp_path / f"live{k}"
        shutil.copytree(B, live)
        cmds = [["pull", "-q", remote, live], ["pull", "-q", remote, live],
                ["push", "-q", C, remote, "--base", B], ["apply", "-q", bundle, live, "--in-place"]]
        order = rng.permutation(len(cmds))
        procs = [subprocess.Popen(kit.cli.argv(*cmds[i]), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True, env=kit.cli.environment(env)) for i in order]
        for i, p in zip(order, procs):
            _, err = p.communicate(timeout=120)
            assert p.returncode in RACE_CODES, f"round {k}: wdiff {' '.join(map(str, cmds[i]))} exited {p.returncode}\n{err}"
        state = tree(live)
        assert state in (tree(B), tree(C)), f"round {k}: {live} is a mix of versions"
        head = head_of(remote, env)
        run("pull", "-q", remote, live, env=env)  # and the directory follows the remote afterwards
        want = C if head == json.loads(run("status", "--json", C, remote, env=env).stdout)["current"] else B
        assert tree(live) == tree(want)
        shutil.rmtree(live)
        shutil.rmtree(remote)
