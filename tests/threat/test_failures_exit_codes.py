"""Threat model, class 8: every failure has its documented exit code, and
nothing is left behind.

Exit codes (README): 0 ok, 2 usage/unexpected, 3 not found, 4 integrity,
5 base mismatch, 6 remote, 7 auth, 8 busy, 9 I/O, 130 interrupted. An
"unexpected error ... this is a bug" (exit 2) is never an acceptable answer
to a hostile or unlucky environment: a full disk, a mount point, a file
where a directory should be, a malformed journal, a crashed predecessor's
debris, a concurrent writer.

Every test drives the real command line (``python -m wdiff``); states left by
crashes are made by SIGKILLing a real ``wdiff`` process, or planted in the
layout inplace.py / sync.py / fsutil.py use:

    DIR/.wdiff/lock, DIR/.wdiff/txn/{journal.json,stage/<i>,undo.log}
    DIR/.wdiff/pull/                       a pull's downloads
    PARENT/.NAME.wdiff-lock                a pull's lock, beside DIR
    PARENT/.NAME.wdiff-new-PID             a rebuild-beside pull's new DIR
    PARENT/..NAME.wdiff-new-PID.wdiff-tmp-XXXXXXXX   (apply's temp for it)
    PARENT/.NAME.wdiff-old-PID             the old DIR, while swapping
    X/.journal.json.wdiff-tmp-XXXXXXXX     fsutil.atomic_write_bytes' temp

The tests that need a small file system or a mount point run in a user and
mount namespace (``unshare -Urm``).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pytest

import kit.cli
import kit.trees
from kit.system import namespaces_work
from kit.trees import snapshot
from threatlib import dead_pid, in_place_pair, interrupt_in_place, legit_journal, plant, staged_from

#: the environment of every command here: changes to the test's (kit.cli.environment)
ENV = {"WDIFF_THREADS": "2"}
#: MiB of the shard patched in place: enough that a SIGKILL sent when the
#: journal appears lands before the apply ends
SHARD_MIB = 8


# -- helpers ---------------------------------------------------------------------------------


#: the command line, in ENV
wd = partial(kit.cli.run, env=ENV, timeout=120)


#: factory.tree (every file but .wdiff/) by digest, its first 16 hex digits: short failure messages
digests = partial(kit.trees.digests, length=16)


def debris(parent: Path, name: str) -> list[str]:
    """wdiff's own leftovers beside DIR (its lock file is not debris)."""
    pat = re.compile(rf"^\.{{1,2}}{re.escape(name)}\.wdiff-(?!lock$)")
    return sorted(n for n in os.listdir(parent) if pat.match(n))


def describe(r) -> str:
    return f"\nexit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"


def documented(r, codes) -> list[str]:
    problems = []
    if "unexpected error" in r.stderr or "this is a bug" in r.stderr:
        problems.append("an 'unexpected error' (exit 2: a bug)")
    if r.returncode not in codes:
        problems.append(f"exit {r.returncode}, not one of {sorted(codes)}")
    return problems


@dataclass(repr=False)
class World:
    root: Path
    A: Path
    B: Path
    C: Path  # a version the remote does not know: a pull rebuilds it beside
    bundle: Path
    info: dict
    ta: dict
    tb: dict
    tc: dict
    remote: Path
    anchor_bytes: int


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    t = tmp_path_factory.mktemp("threat-fail")
    A, B, _, _ = in_place_pair(t, np.random.default_rng(808), SHARD_MIB)
    C = t / "C"
    shutil.copytree(A, C)
    (C / "keep.txt").write_bytes(b"edited locally: a version the remote never saw")
    bundle, remote = t / "d.wdb", t / "remote"
    for args in (("pack", "-q", A, B, "-o", bundle), ("push", "-q", "--anchor", A, remote), ("push", "-q", bundle, remote)):
        r = wd(*args)
        assert r.returncode == 0, r.stderr
    r = wd("info", "--json", bundle)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    r = wd("log", "--json", remote)
    assert r.returncode == 0, r.stderr
    anchor = next(e for e in json.loads(r.stdout)["entries"] if e["parent"] is None)
    return World(t, A, B, C, bundle, info, digests(A), digests(B), digests(C), remote, anchor["size"])


#: run inside `unshare -Urm`: mount a tmpfs, prepare, run one wdiff command,
#: and report what a test outside the namespace can no longer see
NS_DRIVER = textwrap.dedent(
    """
    import hashlib, json, os, shutil, subprocess, sys
    spec = json.loads(sys.argv[1])
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={spec['size']}", "tmpfs", spec["mount"]], check=True)
    if spec.get("fill_from"):
        shutil.copytree(spec["fill_from"], spec["dir"], dirs_exist_ok=True)
    r = subprocess.run(spec["argv"], capture_output=True, text=True, env=dict(os.environ, **spec["env"]))
    def digests(root):
        out = {}
        for dp, dirs, files in os.walk(root):
            if dp == root:
                dirs[:] = [d for d in dirs if d != ".wdiff"]
            for f in files:
                p = os.path.join(dp, f)
                out[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest()[:16]
        return out
    d = spec["dir"]
    state = []
    for dp, dirs, files in os.walk(os.path.join(d, ".wdiff")):
        state += [os.path.relpath(os.path.join(dp, f), d) for f in files]
    print(json.dumps({
        "rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr,
        "is_dir": os.path.isdir(d), "digests": digests(d) if os.path.isdir(d) else None,
        "state": sorted(state), "beside": sorted(os.listdir(os.path.dirname(d))),
    }))
    """
)


def in_namespace(spec: dict) -> dict:
    if not namespaces_work():
        pytest.skip("this system allows no user and mount namespaces (unshare -Urm)")
    spec = dict(spec, env={"WDIFF_THREADS": "2", "NO_COLOR": "1"})
    r = subprocess.run(["unshare", "-Urm", sys.executable, "-c", NS_DRIVER, json.dumps(spec)],
                       capture_output=True, text=True, env=kit.cli.environment(ENV), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


class NS:
    """A namespace result, shaped like a CompletedProcess for the checks."""

    def __init__(self, d: dict) -> None:
        self.returncode, self.stdout, self.stderr = d["rc"], d["stdout"], d["stderr"]
        self.d = d


# -- pull: where DIR cannot be -----------------------------------------------------------------


def test_pull_into_a_path_that_is_a_file(world, tmp_path):
    """DIR is a regular file: a usage or I/O error naming it, the file left
    alone, nothing created beside it."""
    target = tmp_path / "model"
    target.write_bytes(b"not a directory\n")
    before = snapshot(tmp_path)
    r = wd("pull", world.remote, target)
    problems = documented(r, {2, 9})
    if str(target) not in r.stderr:
        problems.append("the message does not name the path")
    if snapshot(tmp_path) != before:
        problems.append("something beside DIR changed")
    assert not problems, "; ".join(problems) + describe(r)


def test_pull_into_a_mount_point(world, tmp_path):
    """DIR is a mount point holding a version the remote does not know: the
    rebuild-beside pull cannot rename a mount point (EBUSY). Either it
    updates DIR some other way, or it fails with status 9 naming DIR, DIR
    unchanged and no half-built copy left beside it."""
    parent = tmp_path / "mnt"
    W = parent / "W"
    W.mkdir(parents=True)
    d = in_namespace({"size": "64m", "mount": str(W), "dir": str(W), "fill_from": str(world.C),
                      "argv": kit.cli.argv("pull", "--force", world.remote, W)})
    r = NS(d)
    problems = documented(r, {0, 9})
    if r.returncode == 0 and d["digests"] != world.tb:
        problems.append("exit 0 but DIR is not the head")
    if r.returncode != 0:
        if d["digests"] != world.tc:
            problems.append("DIR changed although the pull failed")
        if str(W) not in r.stderr:
            problems.append("the message does not name DIR")
    left = [n for n in d["beside"] if n.startswith((".W.wdiff-", "..W.wdiff-")) and n != ".W.wdiff-lock"]
    if left:
        problems.append(f"left beside DIR: {left}")
    assert not problems, "; ".join(problems) + describe(r)


def test_full_disk_while_pull_reassembles_parts(world, tmp_path):
    """DIR on a file system with room for the anchor's downloaded parts but
    not for reassembling them into the bundle: status 9 naming the path,
    no checkpoint file in DIR, and no half-reassembled bundle left."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    W = mnt / "W"
    size = world.anchor_bytes * 3 // 2 // 4096 * 4096
    d = in_namespace({"size": str(size), "mount": str(mnt), "dir": str(W),
                      "argv": kit.cli.argv("pull", world.remote, W)})
    r = NS(d)
    problems = documented(r, {9})
    if "space" not in r.stderr.lower():
        problems.append("the message does not say the disk is full")
    if str(W) not in r.stderr:
        problems.append("the message does not name the path")
    if d["digests"]:
        problems.append(f"checkpoint files appeared in DIR: {sorted(d['digests'])}")
    partial = [p for p in d["state"] if p.endswith(".tmp") or ".wdiff-tmp-" in p]
    if partial:
        problems.append(f"half-written files left: {partial}")
    assert not problems, "; ".join(problems) + describe(r)


@pytest.mark.parametrize("what,command", [
    (".wdiff", "pull"),
    (".wdiff/pull", "pull"),
    (".wdiff", "apply"),
    (".wdiff/txn", "apply"),
    (".wdiff/txn", "pull"),
])
def test_state_path_that_is_a_regular_file(world, tmp_path, what, command):
    """A state directory that is a regular file: refused with a documented
    status naming it, DIR untouched."""
    W = tmp_path / "W"
    shutil.copytree(world.A, W)
    p = W / what
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"a file where wdiff keeps a directory\n")
    r = wd("pull", world.remote, W) if command == "pull" else wd("apply", world.bundle, W, "--in-place")
    problems = documented(r, {4, 8, 9})
    if ".wdiff" not in r.stderr:
        problems.append("the message does not name the state path")
    if {k: v for k, v in digests(W).items() if k != ".wdiff"} != world.ta:  # tree() lists a file .wdiff
        problems.append("DIR changed")
    if p.read_bytes() != b"a file where wdiff keeps a directory\n":
        problems.append("the file was changed")
    assert not problems, "; ".join(problems) + describe(r)


# -- malformed journals ----------------------------------------------------------------------


def _set(key, value):
    def f(j):
        j[key] = value
        return json.dumps(j).encode()
    return f


def _drop(key):
    def f(j):
        del j[key]
        return json.dumps(j).encode()
    return f


JOURNALS = {
    "missing-phase": _drop("phase"),
    "missing-patch": _drop("patch"),
    "missing-stage": _drop("stage"),
    "missing-remove": _drop("remove"),
    "missing-bundle_id": _drop("bundle_id"),
    "phase-int": _set("phase", 7),
    "patch-int": _set("patch", 2),
    "patch-nested": _set("patch", [[2]]),
    "stage-list": _set("stage", []),
    "stage-key-not-int": _set("stage", {"x": "config.json"}),
    "stage-path-int": _set("stage", {"0": 5}),
    "remove-string": _set("remove", "old.txt"),
    "remove-int-items": _set("remove", [5]),
    "bundle_id-int": _set("bundle_id", 5),
    "not-an-object": lambda j: b"[]",
    "null": lambda j: b"null",
}


def _malformed(world, tmp_path, name, bundle_in_pull=False):
    W = tmp_path / "W"
    shutil.copytree(world.A, W)
    bundle = None
    if bundle_in_pull:  # as a pull that was interrupted while applying leaves it
        (W / ".wdiff" / "pull").mkdir(parents=True)
        bundle = W / ".wdiff" / "pull" / f"{world.info['bundle_id']}.wdb"
        shutil.copy(world.bundle, bundle)
    j = legit_journal(world.info, bundle or world.bundle, W)
    plant(W, j, staged_from(world.B, j), raw=JOURNALS[name](dict(j)))
    return W


def _check_malformed(r, W, world, *, success_is) -> None:
    problems = documented(r, {0, 4, 8})
    got = digests(W)
    if got not in (world.ta, world.tb):
        problems.append("DIR is neither the old nor the new version")
    elif r.returncode == 0 and got != success_is:
        problems.append("exit 0 but DIR is not what the command promises")
    assert not problems, "; ".join(problems) + describe(r)


@pytest.mark.parametrize("name", list(JOURNALS))
def test_malformed_journal_on_resume(world, tmp_path, name):
    """`apply --in-place` over a journal with a member missing or of the
    wrong type: a documented refusal (4, or 8 "needs attention") before
    anything is changed, or a correct finish."""
    W = _malformed(world, tmp_path, name)
    _check_malformed(wd("apply", world.bundle, W, "--in-place"), W, world, success_is=world.tb)


@pytest.mark.parametrize("name", ["missing-phase", "missing-bundle_id", "phase-int", "not-an-object", "null"])
def test_malformed_journal_on_abort(world, tmp_path, name):
    """`apply --in-place --abort` over a malformed journal."""
    W = _malformed(world, tmp_path, name)
    _check_malformed(wd("apply", world.bundle, W, "--in-place", "--abort"), W, world, success_is=world.ta)


@pytest.mark.parametrize("name", ["missing-stage", "missing-remove", "stage-list", "remove-string", "not-an-object",
                                  "null"])
def test_malformed_journal_of_an_interrupted_pull(world, tmp_path, name):
    """A pull finds a malformed journal (naming a bundle in its own work area,
    as an interrupted pull leaves it, or no object at all)."""
    W = _malformed(world, tmp_path, name, bundle_in_pull=True)
    _check_malformed(wd("pull", world.remote, W), W, world, success_is=world.tb)


# -- debris of killed runs ---------------------------------------------------------------------


def test_stale_journal_temp_file_left_by_a_killed_recovery(world, tmp_path):
    """A real apply is SIGKILLed; the recovery that followed was killed too,
    inside atomic_write_bytes, leaving txn/.journal.json.wdiff-tmp-XXXXXXXX.
    The next run must finish the apply, not fail on 'Directory not empty'."""
    W = tmp_path / "W"
    interrupt_in_place(world.A, world.bundle, W, kit.cli.environment({**ENV, "WDIFF_THREADS": "1"}))
    txn = W / ".wdiff" / "txn"
    (txn / ".journal.json.wdiff-tmp-0badc0de").write_bytes(b'{"version": 1, "pha')
    r = wd("apply", world.bundle, W, "--in-place")
    problems = documented(r, {0})
    if digests(W) != world.tb:
        problems.append("DIR is not the target")
    left = [str(p.relative_to(W)) for p in (W / ".wdiff").rglob("*wdiff-tmp-*")] if (W / ".wdiff").exists() else []
    if left:
        problems.append(f"debris left: {left}")
    assert not problems, "; ".join(problems) + describe(r)


def test_rebuild_beside_pull_holds_the_directory_lock(world, tmp_path):
    """An in-place apply holds DIR/.wdiff/lock (held here by the test, as a
    running apply would). A pull that rebuilds DIR beside it and swaps the
    two must wait for it or refuse with status 8, not swap DIR under it."""
    W = tmp_path / "W"
    shutil.copytree(world.C, W)
    (W / ".wdiff").mkdir()
    fd = os.open(W / ".wdiff" / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = wd("pull", "--force", world.remote, W)
    finally:
        os.close(fd)
    problems = documented(r, {8})
    if digests(W) != world.tc:
        problems.append("DIR was replaced while its lock was held")
    if debris(tmp_path, "W"):
        problems.append(f"left beside DIR: {debris(tmp_path, 'W')}")
    assert not problems, "; ".join(problems) + describe(r)


def test_later_pull_removes_debris_of_a_killed_pull(world, tmp_path):
    """A real rebuild-beside pull is SIGKILLed while it builds the new DIR
    beside the old one; the next pull finishes the job and removes the
    half-built copy, which no live process holds."""
    W = tmp_path / "W"
    for _ in range(10):
        if W.exists():
            shutil.rmtree(W)
        for n in debris(tmp_path, "W"):
            shutil.rmtree(tmp_path / n)
        shutil.copytree(world.C, W)
        p = subprocess.Popen(kit.cli.argv("pull", "-q", "--force", world.remote, W),
                             env=kit.cli.environment({**ENV, "WDIFF_THREADS": "1"}),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while p.poll() is None:
            if debris(tmp_path, "W"):
                p.send_signal(signal.SIGKILL)
                break
        p.wait()
        if p.returncode == -signal.SIGKILL and debris(tmp_path, "W"):
            break
    else:
        raise AssertionError("could not kill a real pull while it rebuilt DIR")
    killed = debris(tmp_path, "W")
    r = wd("pull", "--force", world.remote, W)
    problems = documented(r, {0})
    if not W.is_dir() or digests(W) != world.tb:
        problems.append("DIR is not the head")
    if debris(tmp_path, "W"):
        problems.append(f"debris of the killed pull {killed} still beside DIR: {debris(tmp_path, 'W')}")
    assert not problems, "; ".join(problems) + describe(r)


def test_later_pull_removes_debris_of_a_pull_killed_between_the_two_renames(world, tmp_path):
    """A pull killed between `rename(DIR, old)` and `rename(new, DIR)`
    leaves no DIR, the complete new version as .W.wdiff-new-PID and the old
    one as .W.wdiff-old-PID (and, from an earlier kill, apply's temp). PID
    is dead. The next pull rebuilds DIR (it is "empty") and must not leave
    those copies there forever."""
    W = tmp_path / "W"
    pid = dead_pid()
    shutil.copytree(world.C, tmp_path / f".W.wdiff-old-{pid}")
    shutil.copytree(world.B, tmp_path / f".W.wdiff-new-{pid}")
    shutil.copytree(world.B, tmp_path / f"..W.wdiff-new-{pid}.wdiff-tmp-0badc0de")
    r = wd("pull", world.remote, W)
    problems = documented(r, {0})
    if not W.is_dir() or digests(W) != world.tb:
        problems.append("DIR is not the head")
    if debris(tmp_path, "W"):
        problems.append(f"debris of dead pulls still beside DIR: {debris(tmp_path, 'W')}")
    assert not problems, "; ".join(problems) + describe(r)
