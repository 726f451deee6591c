"""Threat model, class 1: the state directory is input, not trusted memory.

Everything under DIR/.wdiff/ (the in-place journal, staged files, the undo
log, the lock, downloaded bundles in .wdiff/pull/) can be planted by whoever
wrote DIR: a copied or shared checkpoint, a container image, an rsync from
elsewhere. Each test plays that attacker against the real command line
(``python -m wdiff``, never the library) and then checks:

- the exit status is a documented one, never 2 "unexpected error";
- nothing outside DIR changed (every file of a sibling ``outside`` tree is
  hashed before and after, links and directories included);
- DIR is exactly the old version or the new one, never a mix, and a
  successful exit means the new one.

The on-disk layout the attacks use (read from inplace.py, sync.py and
fsutil.py, and checked against a real SIGKILLed apply):

    DIR/.wdiff/lock                 flock of every in-place apply
    DIR/.wdiff/txn/journal.json     {"version": 1, "bundle_id", "bundle_path",
                                     "base_fingerprint", "target_fingerprint",
                                     "phase": "patch"|"commit", "patch": [i],
                                     "stage": {"i": path}, "remove": [path]}
    DIR/.wdiff/txn/stage/<i>        complete new file i of the bundle
    DIR/.wdiff/txn/undo.log         undo entries of the patch phase
    DIR/.wdiff/pull/                a pull's downloads (<id>.wdb, parts)
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pytest

import kit.cli
import kit.trees
from factory import mutate, write_ckpt
from kit.trees import snapshot
from threatlib import in_place_pair, interrupt_in_place, legit_journal, plant, staged_from

#: the environment of every command here: changes to the test's (kit.cli.environment)
ENV = {"WDIFF_THREADS": "2"}
#: MiB of the shard patched in place: enough that a SIGKILL sent when the
#: journal appears lands before the apply ends
SHARD_MIB = 8

#: documented refusals of a hostile state: integrity, busy (needs attention), I/O
REFUSED = {4, 8, 9}


# -- helpers ---------------------------------------------------------------------------------


#: factory.tree (every file but .wdiff/) by digest, its first 16 hex digits: short failure messages
digests = partial(kit.trees.digests, length=16)


#: the command line, in ENV
wd = partial(kit.cli.run, env=ENV, timeout=120)


@dataclass(repr=False)
class World:
    root: Path
    A: Path
    B: Path
    bundle: Path
    info: dict
    ta: dict
    tb: dict
    remote: Path
    key: Path
    pub: Path
    evil: Path  # an unsigned bundle A -> E, E a version nobody published
    evil_info: dict
    te: dict


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    t = tmp_path_factory.mktemp("threat-state")
    rng = np.random.default_rng(2024)
    A, B, a, layout = in_place_pair(t, rng, SHARD_MIB)
    e = dict(a, w00=mutate(a["w00"], 0.5, rng))
    E = Path(write_ckpt(t / "E", e, **layout))
    bundle, evil = t / "d.wdb", t / "evil.wdb"
    for args in (("pack", "-q", A, B, "-o", bundle), ("pack", "-q", A, E, "-o", evil)):
        r = wd(*args)
        assert r.returncode == 0, r.stderr
    key, remote = t / "release.key", t / "remote"
    for args in (("keygen", "-q", key), ("push", "-q", "--anchor", A, remote, "--sign", key),
                 ("push", "-q", bundle, remote, "--sign", key)):
        r = wd(*args)
        assert r.returncode == 0, r.stderr
    infos = []
    for b_ in (bundle, evil):
        r = wd("info", "--json", b_)
        assert r.returncode == 0, r.stderr
        infos.append(json.loads(r.stdout))
    return World(t, A, B, bundle, infos[0], digests(A), digests(B), remote, key, Path(str(key) + ".pub"), evil,
                 infos[1], digests(E))


def interrupt(world: World, W: Path) -> dict:
    """W a copy of A, its in-place apply SIGKILLed once its journal exists: the journal."""
    return interrupt_in_place(world.A, world.bundle, W, kit.cli.environment({**ENV, "WDIFF_THREADS": "1"}))


@pytest.fixture
def scene(tmp_path, world):
    """W: a copy of A, the checkpoint under attack. outside: a sibling tree
    of the user's that nothing may touch."""
    W = tmp_path / "W"
    shutil.copytree(world.A, W)
    out = tmp_path / "outside"
    (out / "userdir").mkdir(parents=True)
    (out / "victim.txt").write_bytes(b"the user's file, outside DIR\n")
    (out / "userdir" / "precious.bin").write_bytes(os.urandom(4096))
    (out / "userdir" / "0").write_bytes(b"a user's file that happens to be called 0\n")
    (out / "empty" / "sub").mkdir(parents=True)
    (out / "state" / "txn").mkdir(parents=True)
    (out / "state" / "txn" / "precious.txt").write_bytes(b"not wdiff's\n")
    (out / "state" / "pull").mkdir(parents=True)
    (out / "state" / "pull" / "precious.txt").write_bytes(b"not wdiff's either\n")
    return W, out, snapshot(out)


def check(r: subprocess.CompletedProcess, world: World, W: Path, out: Path, before: dict, codes, *,
          new_on_success: bool = True) -> None:
    """The three promises, all checked, all reported together."""
    problems = []
    if "unexpected error" in r.stderr:
        problems.append("an 'unexpected error' (exit 2: a bug)")
    if r.returncode not in codes:
        problems.append(f"exit {r.returncode}, not one of {sorted(codes)}")
    after = snapshot(out)
    if after != before:
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        problems.append(f"outside DIR changed: {changed}")
    got = digests(W) if W.is_dir() else None
    if got not in (world.ta, world.tb):
        problems.append("DIR is neither the old nor the new version")
    elif r.returncode == 0 and new_on_success and got != world.tb:
        problems.append("exit 0 but DIR is not the target")
    assert not problems, "; ".join(problems) + f"\nexit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"


def apply_in_place(world: World, W: Path) -> subprocess.CompletedProcess:
    return wd("apply", world.bundle, W, "--in-place")


# -- the crafted journal is the real one -----------------------------------------------------


@pytest.mark.slow
def test_crafted_journal_matches_a_real_interrupted_apply(world, tmp_path):
    """The planted journals below are what a real apply writes: a SIGKILLed
    CLI leaves the same plan (guards the tests against a format change)."""
    W = tmp_path / "W"
    real = interrupt(world, W)
    want = legit_journal(world.info, world.bundle, world.A, phase=real["phase"])
    assert real == want
    r = apply_in_place(world, W)
    assert r.returncode == 0, r.stderr
    assert digests(W) == world.tb


# -- planted journals: paths outside DIR -----------------------------------------------------


@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_planted_journal_remove_entry_outside_dir(world, scene, how):
    """journal "remove" names a file outside DIR: it must not be deleted."""
    W, out, before = scene
    victim = "../outside/victim.txt" if how == "dotdot" else str(out / "victim.txt")
    j = legit_journal(world.info, world.bundle, W)
    j["remove"].append(victim)
    plant(W, j, staged_from(world.B, j))
    check(apply_in_place(world, W), world, W, out, before, {0, 4})


def test_planted_journal_remove_entry_deletes_empty_directories_outside_dir(world, scene):
    """Removing a path also prunes its empty parents, up to DIR: a path
    outside DIR prunes the user's empty directories instead."""
    W, out, before = scene
    j = legit_journal(world.info, world.bundle, W)
    j["remove"].append("../outside/empty/sub/nothing-here")
    plant(W, j, staged_from(world.B, j))
    check(apply_in_place(world, W), world, W, out, before, {0, 4})


@pytest.mark.parametrize("how", ["dotdot-new-file", "absolute-overwrite"])
def test_planted_journal_stage_entry_outside_dir(world, scene, how):
    """journal "stage" renames a planted staged file to a path outside DIR."""
    W, out, before = scene
    dest = "../outside/planted.txt" if how == "dotdot-new-file" else str(out / "victim.txt")
    j = legit_journal(world.info, world.bundle, W)
    files = staged_from(world.B, j)
    j["stage"]["99"] = dest
    files["99"] = b"written by whoever planted the journal\n"
    plant(W, j, files)
    check(apply_in_place(world, W), world, W, out, before, {0, 4})


# -- planted journals: a plan that is not the bundle's ---------------------------------------


def test_planted_journal_removing_a_file_the_target_keeps(world, scene):
    """A well-formed journal whose "remove" lists keep.txt, which both the
    base and the target have: the result must still be the target."""
    W, out, before = scene
    j = legit_journal(world.info, world.bundle, W)
    j["remove"].append("keep.txt")
    plant(W, j, staged_from(world.B, j))
    check(apply_in_place(world, W), world, W, out, before, {0, 4})


def test_planted_journal_with_empty_patch_list(world, scene):
    """A journal that patches nothing: the shard stays the base's while the
    staged files are installed, and the apply says it updated DIR."""
    W, out, before = scene
    j = legit_journal(world.info, world.bundle, W)
    j["patch"] = []
    plant(W, j, staged_from(world.B, j))
    check(apply_in_place(world, W), world, W, out, before, {0, 4})


def test_planted_journal_with_patch_list_of_strings(world, scene):
    """"patch": ["2"] instead of [2] (a wrong member type) silently patches
    nothing."""
    W, out, before = scene
    j = legit_journal(world.info, world.bundle, W)
    j["patch"] = [str(i) for i in j["patch"]]
    plant(W, j, staged_from(world.B, j))
    check(apply_in_place(world, W), world, W, out, before, {0, 4})


def test_planted_staged_file_is_never_installed(world, scene):
    """A staged file that is not the target's file (config.json here) must
    not be renamed into DIR on the journal's word."""
    W, out, before = scene
    j = legit_journal(world.info, world.bundle, W)
    files = staged_from(world.B, j)
    k = next(i for i, p in j["stage"].items() if p == "config.json")
    files[k] = b'{"step": 2, "planted": true}'
    plant(W, j, files)
    check(apply_in_place(world, W), world, W, out, before, {0, 4})


def test_planted_commit_phase_journal_without_staged_files(world, scene):
    """A "commit" journal over an untouched base with no staged files: the
    apply removes old.txt, installs nothing, and reports the directory
    updated. A finished apply must have checked the target's digests."""
    W, out, before = scene
    j = legit_journal(world.info, world.bundle, W, phase="commit")
    plant(W, j, {})
    check(apply_in_place(world, W), world, W, out, before, {0, 4})


@pytest.mark.parametrize("what", ["companion", "tensor"])
def test_resume_after_a_file_was_modified_verifies_target_digests(world, tmp_path, what):
    """A real apply is SIGKILLed; someone then edits a file the bundle does
    not rewrite (keep.txt, or the untouched "frozen" tensor in the patched
    shard). The rerun must not report success: the result is not the target."""
    W = tmp_path / "W"
    interrupt(world, W)
    if what == "companion":
        (W / "keep.txt").write_bytes(b"edited while the apply was unfinished")
        name = "keep.txt"
    else:
        shard = next(p for p in sorted(W.glob("*.safetensors")) if b'"frozen"' in p.read_bytes()[:4096])
        with open(shard, "r+b") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            start = json.loads(f.read(n))["frozen"]["data_offsets"][0]
            f.seek(8 + n + start + 1000)
            old = f.read(4)
            f.seek(8 + n + start + 1000)
            f.write(bytes(x ^ 0x5A for x in old))
        name = shard.name
    r = apply_in_place(world, W)
    msg = f"exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    assert "unexpected error" not in r.stderr, msg
    assert r.returncode == 4, "a resumed apply reported success on a directory that is not the target\n" + msg
    assert name in r.stderr, msg


# -- symlinked state ------------------------------------------------------------------------


def test_symlinked_dot_wdiff_is_refused_by_in_place_apply(world, scene):
    """DIR/.wdiff -> outside/state: the lock, the transaction and its
    clearing (rmtree of outside/state/txn) all land outside DIR."""
    W, out, before = scene
    os.symlink(out / "state", W / ".wdiff")
    check(apply_in_place(world, W), world, W, out, before, REFUSED)


def test_symlinked_txn_dir_is_refused_by_in_place_apply(world, scene):
    """DIR/.wdiff/txn -> outside/userdir."""
    W, out, before = scene
    (W / ".wdiff").mkdir()
    os.symlink(out / "userdir", W / ".wdiff" / "txn")
    check(apply_in_place(world, W), world, W, out, before, REFUSED)


def test_symlinked_txn_dir_holding_a_planted_journal(world, scene):
    """DIR/.wdiff/txn -> outside/state/txn, where a journal waits: the
    transaction is read from, and then deleted in, the user's directory."""
    W, out, before = scene
    j = legit_journal(world.info, world.bundle, W)
    (out / "state" / "txn" / "journal.json").write_text(json.dumps(j))
    (out / "state" / "txn" / "stage").mkdir()
    for i, data in staged_from(world.B, j).items():
        (out / "state" / "txn" / "stage" / i).write_bytes(data)
    before = snapshot(out)
    (W / ".wdiff").mkdir()
    os.symlink(out / "state" / "txn", W / ".wdiff" / "txn")
    check(apply_in_place(world, W), world, W, out, before, REFUSED)


def test_symlinked_stage_dir_never_moves_outside_files_in(world, scene):
    """DIR/.wdiff/txn/stage -> outside/userdir, which holds a file named 0:
    committing renames the user's file into DIR as config.json."""
    W, out, before = scene
    j = legit_journal(world.info, world.bundle, W)
    assert j["stage"].get("0") == "config.json"
    plant(W, j, {})
    (W / ".wdiff" / "txn" / "stage").rmdir()
    os.symlink(out / "userdir", W / ".wdiff" / "txn" / "stage")
    check(apply_in_place(world, W), world, W, out, before, {0} | REFUSED)


def test_symlinked_undo_log_never_writes_outside_file(world, scene):
    """DIR/.wdiff/txn/undo.log -> outside/victim.txt: loading the undo log
    truncates what it cannot parse, and the patch phase appends to it."""
    W, out, before = scene
    j = legit_journal(world.info, world.bundle, W)
    plant(W, j, staged_from(world.B, j))
    os.symlink(out / "victim.txt", W / ".wdiff" / "txn" / "undo.log")
    check(apply_in_place(world, W), world, W, out, before, {0} | REFUSED)


def test_symlinked_lock_file_is_not_followed(world, scene):
    """DIR/.wdiff/lock -> outside/created-by-lock (dangling): O_CREAT
    through the link creates a file outside DIR."""
    W, out, before = scene
    (W / ".wdiff").mkdir()
    os.symlink(out / "created-by-lock", W / ".wdiff" / "lock")
    check(apply_in_place(world, W), world, W, out, before, {0} | REFUSED)


def test_symlinked_pull_dir_is_refused(world, scene):
    """DIR/.wdiff/pull -> outside/userdir: downloads land in the user's
    directory, and clearing the work area fails on the link."""
    W, out, before = scene
    (W / ".wdiff").mkdir()
    os.symlink(out / "userdir", W / ".wdiff" / "pull")
    check(wd("pull", world.remote, W), world, W, out, before, REFUSED)


def test_up_to_date_pull_never_deletes_through_symlinked_dot_wdiff(world, scene):
    """DIR is already the head and DIR/.wdiff -> outside/state: the pull
    "clears its work area", outside/state/pull, the user's directory."""
    W, out, before = scene
    shutil.rmtree(W)
    shutil.copytree(world.B, W)
    os.symlink(out / "state", W / ".wdiff")
    check(wd("pull", world.remote, W), world, W, out, before, {0} | REFUSED)


def test_pull_with_symlinked_dot_wdiff_is_refused(world, scene):
    """DIR (the base) behind the head, DIR/.wdiff -> outside/state: the
    download, the lock and the in-place transaction all go outside DIR."""
    W, out, before = scene
    os.symlink(out / "state", W / ".wdiff")
    check(wd("pull", world.remote, W), world, W, out, before, REFUSED)


# -- a planted bundle in .wdiff/pull ----------------------------------------------------------


def test_pull_with_trusted_key_never_applies_planted_unsigned_bundle(world, scene):
    """An unsigned bundle planted in DIR/.wdiff/pull/ and a journal naming
    it, as if an earlier pull had been interrupted: `pull --trusted-key`
    "finishes" that apply without checking any signature. (The --to names
    no version, so the pull then stops with status 3, before it would
    rebuild DIR from the anchor and hide what it did.)"""
    W, out, before = scene
    pull_dir = W / ".wdiff" / "pull"
    pull_dir.mkdir(parents=True)
    planted = pull_dir / f"{world.evil_info['bundle_id']}.wdb"
    shutil.copy(world.evil, planted)
    assert not os.path.exists(str(planted) + ".minisig")
    j = legit_journal(world.evil_info, planted, W)
    plant(W, j, staged_from(world.root / "E", j))
    r = wd("pull", "--trusted-key", world.pub, "--to", "f00dfeedf00d", world.remote, W)
    msg = f"exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    assert digests(W) != world.te, "pull --trusted-key applied an unsigned bundle it found in DIR\n" + msg
    check(r, world, W, out, before, {3} | REFUSED)


def test_pull_with_trusted_key_refuses_planted_unsigned_bundle_at_head(world, scene):
    """The same planted bundle and journal, pulling the head: whatever the
    pull does in the end, the exit status must not hide that DIR held an
    unsigned transaction, and DIR must end as the signed head or untouched."""
    W, out, before = scene
    pull_dir = W / ".wdiff" / "pull"
    pull_dir.mkdir(parents=True)
    planted = pull_dir / f"{world.evil_info['bundle_id']}.wdb"
    shutil.copy(world.evil, planted)
    j = legit_journal(world.evil_info, planted, W)
    plant(W, j, staged_from(world.root / "E", j))
    r = wd("pull", "--json", "--trusted-key", world.pub, world.remote, W)
    msg = f"exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    check(r, world, W, out, before, {0} | REFUSED)
    if r.returncode == 0:
        doc = json.loads(r.stdout)
        # DIR was the base, which the chain knows: a pull that did not obey
        # the planted journal goes base -> head by the signed delta
        assert doc["before"] == world.info["base_fingerprint"], "the pull started from the planted bundle's result\n" + msg
        assert not doc["from_anchor"], msg


# -- planted downloads in .wdiff/pull ----------------------------------------------------------


def _corrupt_copy(src: Path, dest: Path) -> None:
    data = bytearray(src.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a record byte: the bundle id (its index digest) stays the same
    dest.write_bytes(bytes(data))


@pytest.mark.parametrize("what", ["part-marked-verified", "reassembled-bundle"])
def test_planted_download_in_pull_dir_is_checked_again(world, scene, what):
    """A damaged part with its ".ok" marker, or a damaged reassembled bundle
    under its own id, planted in DIR/.wdiff/pull/ as a resumed download
    would find it: the pull trusts it without checking its digest, the
    apply then fails, and every later pull reuses it again. A pull must
    verify in this run what it applies (and throw away what fails)."""
    W, out, before = scene
    work = W / ".wdiff" / "pull"
    work.mkdir(parents=True)
    bid = world.info["bundle_id"]
    if what == "part-marked-verified":
        _corrupt_copy(world.bundle, work / f"{bid}.part00000")
        (work / f"{bid}.part00000.ok").write_bytes(b"")
    else:
        _corrupt_copy(world.bundle, work / f"{bid}.wdb")
    first = wd("pull", world.remote, W)
    if first.returncode == 0:
        check(first, world, W, out, before, {0})
        return
    check(first, world, W, out, before, {4})
    second = wd("pull", world.remote, W)  # the damaged download is gone: this one fetches afresh
    check(second, world, W, out, before, {0})


# -- state owned by someone else ----------------------------------------------------------------


@pytest.mark.parametrize("command", ["apply", "pull"])
def test_state_dir_owned_by_another_user_is_refused(world, scene, command):
    """DIR/.wdiff pre-created, world-writable, by another user (say in a
    shared /models): whatever they put there later is obeyed. wdiff must
    refuse a state directory it does not own."""
    if os.geteuid() != 0:
        pytest.skip("making a directory owned by another user needs root")
    W, out, before = scene
    state = W / ".wdiff"
    state.mkdir()
    os.chown(state, 65534, 65534)
    state.chmod(0o777)
    r = wd("apply", world.bundle, W, "--in-place") if command == "apply" else wd("pull", world.remote, W)
    check(r, world, W, out, before, REFUSED)
