"""What a pull leaves in DIR/.wdiff over time (issue 33, item 6), the disk
it says it needs before it starts, and what a refused pull leaves behind.

Cron pulls a moving head forever: after a success nothing stays but the
record of the version (and the lock file); an interrupted pull keeps its
verified downloads for the next one, which removes whatever else a dead
pull left; a pull that lacks disk refuses with "needs N free, has M" (exit
9) before it writes anything; and no refusal leaves a ``.wdiff/``, DIR, or a
parent directory it made."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from factory import mutate, rand, tree, write_ckpt
from kit.cli import argv, environment, run
from kit.system import namespaces_work
from kit.trees import du, snapshot

import wdiff

#: a record (state.json, a few hundred bytes here) and the lock file: "a few kB"
FEW_KB = 4096


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Per-test user state and cache, for the library and the CLI alike."""
    for k, v in {"WDIFF_CACHE_DIR": tmp_path / "cache", "WDIFF_STATE_DIR": tmp_path / "state",
                 "WDIFF_THREADS": "1", "NO_COLOR": "1"}.items():
        monkeypatch.setenv(k, str(v))
    monkeypatch.delenv("WDIFF_TRUSTED_KEYS", raising=False)
    return dict(os.environ)


#: the command line, which must succeed unless told another ``want`` (None: any)
cli = partial(run, want=0)


class Head:
    """A remote whose head moves: each :meth:`next` pushes one more version."""

    def __init__(self, root: Path, *, seed: int = 0, shape=(64, 64), tensors: int = 4) -> None:
        self.root, self.rng = root, np.random.default_rng(seed)
        self.remote = root / "remote"
        self.t = {f"layer.{i}.w": rand(self.rng, "BF16", shape) for i in range(tensors)}
        self.n = 0
        self.prev = write_ckpt(root / "v0", self.t)
        self.largest = wdiff.push(self.prev, self.remote, anchor=True).bytes

    def next(self, **extra) -> str:
        self.n += 1
        self.t = {k: mutate(x, 0.05, self.rng) for k, x in self.t.items()} | extra
        cur = write_ckpt(self.root / f"v{self.n}", self.t)
        self.largest = max(self.largest, wdiff.push(cur, self.remote, base=self.prev).bytes)
        _rmtree(self.prev)
        self.prev = cur
        return cur


def _rmtree(p) -> None:
    import shutil

    shutil.rmtree(p)


# -- over time -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_hundred_cron_pulls_of_a_moving_head_leave_one_bundle_at_most(env, tmp_path):
    """Push, pull, 100 times: DIR is the head each time, and DIR/.wdiff never
    holds more than the largest bundle plus a few kB (it held every bundle
    ever downloaded: the anchor and one more delta per pull)."""
    head = Head(tmp_path)
    d = tmp_path / "d"
    sizes = {}
    for n in range(1, 101):
        cur = head.next()
        wdiff.pull(head.remote, d)
        used = du(d / ".wdiff")
        assert used <= head.largest + FEW_KB, (n, used, sorted(os.listdir(d / ".wdiff")))
        if n in (1, 10, 100):
            sizes[n] = used
            assert tree(d) == tree(cur)
    assert not (d / ".wdiff" / "pull").exists()
    print(f"\nDIR/.wdiff after N pulls (largest bundle {head.largest} B): {sizes}")


def test_a_pull_on_the_command_line_leaves_only_its_record(env, tmp_path):
    """The CLI, an anchor pull and then a run of two deltas (squashed): what
    stays in DIR/.wdiff is the record and the lock, nothing downloaded."""
    head = Head(tmp_path)
    d = tmp_path / "d"
    cli("pull", "-q", head.remote, d, env=env)
    assert sorted(os.listdir(d / ".wdiff")) in (["lock", "state.json"], ["state.json"])
    head.next()
    cur = head.next()
    cli("pull", "-q", head.remote, d, env=env)
    assert sorted(os.listdir(d / ".wdiff")) in (["lock", "state.json"], ["state.json"])
    assert du(d / ".wdiff") <= FEW_KB and tree(d) == tree(cur)


# -- interrupted pulls ---------------------------------------------------------------------


class StopAt(wdiff.Reporter):
    """Ctrl-C as the ``k``-th bundle's download starts (the ones before it are
    downloaded and verified)."""

    def __init__(self, k: int) -> None:
        self.k, self.phases = k, 0

    def phase(self, name, total=None):
        if name == "download":
            self.phases += 1
            if self.phases == self.k:
                raise KeyboardInterrupt


def test_an_interrupted_pull_resumes_without_downloading_again(env, tmp_path):
    """Killed after the first of two deltas: that one stays, verified, and
    the next pull downloads only the second (which status says, beforehand);
    then the work area goes."""
    head = Head(tmp_path)
    d = tmp_path / "d"
    wdiff.pull(head.remote, d)
    head.next()
    cur = head.next()
    size = {e.bundle: e.size for e in wdiff.log(head.remote).entries}
    with pytest.raises(KeyboardInterrupt):
        wdiff.pull(head.remote, d, reporter=StopAt(2))
    kept = sorted(os.listdir(d / ".wdiff" / "pull"))
    said = json.loads(cli("status", d, head.remote, "--json", env=env).stdout)
    res = wdiff.pull(head.remote, d)
    first, second = res.bundles
    assert kept == [f"{first.hex()}.wdb"], kept
    assert res.downloaded == size[second]
    assert said["behind"] == 2 and said["download_bytes"] == size[second], said  # what the pull really took
    assert tree(d) == tree(cur) and not (d / ".wdiff" / "pull").exists()


def test_what_dead_pulls_left_is_removed_by_the_next_one(env, tmp_path):
    """Bundles and temp files dead pulls left for other versions (a
    download, its parts, a squash, a squash's temp, a rollback's inverse)
    are removed by the next pull, even one that is itself interrupted: a
    crash leaves at most one pull's worth."""
    head = Head(tmp_path)
    d = tmp_path / "d"
    wdiff.pull(head.remote, d)
    head.next()
    head.next()
    work = d / ".wdiff" / "pull"
    work.mkdir()
    dead = {f"{'ab' * 16}.wdb": 300_000, f"{'cd' * 16}.part00000": 200_000, f"{'cd' * 16}.wdb.tmp": 1000,
            "squash-0123456789ab-ba9876543210.wdb": 100_000, ".wdiff-squash-4242-abc": 5000,
            f"inverse-{'ef' * 16}.tmp": 7000}
    for name, size in dead.items():
        (work / name).write_bytes(os.urandom(size))
    with pytest.raises(KeyboardInterrupt):
        wdiff.pull(head.remote, d, reporter=StopAt(2))
    kept = sorted(os.listdir(work))
    res = wdiff.pull(head.remote, d)
    assert kept == [f"{res.bundles[0].hex()}.wdb"], kept
    assert not work.exists() and du(d / ".wdiff") <= FEW_KB


# -- refusals leave nothing ----------------------------------------------------------------


@pytest.fixture
def world(env, tmp_path):
    head = Head(tmp_path / "w")
    empty = tmp_path / "w" / "empty-remote"
    empty.mkdir()
    return head


def _refusals(head: Head, place: Path):
    """(name, argv, expected exit status) of pulls that must refuse."""
    return [
        ("no such remote", ["pull", head.root / "nothing-here", place], 3),
        ("a bundle for a remote", ["pull", next(head.remote.rglob("*.wdb")), place], None),
        ("no such version", ["pull", head.remote, place, "--to", "no-such-label"], 3),
        ("bad argument", ["pull", head.remote, place, "--max-age", "1h"], 2),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["missing", "missing-parents", "existing-empty", "existing-foreign"])
def test_a_refused_pull_leaves_no_state_dir_nor_a_directory_it_made(world, tmp_path, env, where):
    """Wrong remote, no such version, a bad argument, another pull holding
    the lock, a directory of files the remote does not know: the pull
    refuses, and the user's tree is as it was: no DIR, no parent, no
    ``.wdiff/`` (a refused pull into an existing directory left an empty
    ``.wdiff/``; one into a missing nested path left its parents)."""
    base = tmp_path / "u"
    base.mkdir()
    place = {"missing": base / "m", "missing-parents": base / "a" / "b" / "m"}.get(where, base / "m")
    if where.startswith("existing"):
        place.mkdir()
        if where == "existing-foreign":
            (place / "notes.txt").write_bytes(b"mine\n")
            write_ckpt(place, {"x": rand(np.random.default_rng(5), "F32", (8,))})
    before = snapshot(tmp_path / "u")
    runs = [(name, cli(*argv, env=env, want=None), code) for name, argv, code in _refusals(world, place)]
    lock = place.parent / f".{place.name}.wdiff-lock"
    if place.parent.exists():
        with open(lock, "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            runs.append(("lock held", cli("pull", world.remote, place, env=env, want=None), 8))
        lock.unlink()
    if where == "existing-foreign":
        runs.append(("unknown version", cli("pull", world.remote, place, env=env, want=None), 5))
    for name, r, code in runs:
        assert r.returncode not in (0, 1) and (code is None or r.returncode == code), (name, r.returncode, r.stderr)
        assert snapshot(tmp_path / "u") == before, (name, r.stderr)


# -- the disk a pull needs -----------------------------------------------------------------


def on_small_disk(size: str, mount: Path, steps: list[list], env: dict, fill: dict | None = None) -> list[dict]:
    """Run wdiff commands one after the other inside a user and mount
    namespace where ``mount`` is a fresh tmpfs of ``size`` (holding a copy
    of each directory of ``fill`` under its name): each one's exit status,
    stderr, and what the tmpfs then holds (path -> sha256)."""
    if not namespaces_work():
        pytest.skip("this system allows no user and mount namespaces (unshare -Urm)")
    driver = (
        "import hashlib, json, os, subprocess, sys\n"
        "spec = json.loads(sys.argv[1])\n"
        "subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=' + spec['size'], 'tmpfs', spec['mount']], check=True)\n"
        "import shutil\n"
        "for name, src in spec['fill'].items():\n"
        "    shutil.copytree(src, os.path.join(spec['mount'], name))\n"
        "out = []\n"
        "for argv in spec['steps']:\n"
        "    r = subprocess.run(argv, capture_output=True, text=True)\n"
        "    files = {}\n"
        "    for dp, ds, fs in os.walk(spec['mount']):\n"
        "        for n in ds + fs:\n"
        "            p = os.path.join(dp, n)\n"
        "            files[os.path.relpath(p, spec['mount'])] = None if os.path.isdir(p) else "
        "hashlib.sha256(open(p, 'rb').read()).hexdigest()\n"
        "    out.append({'rc': r.returncode, 'stderr': r.stderr, 'files': files})\n"
        "print(json.dumps(out))\n"
    )
    spec = {"size": size, "mount": str(mount), "steps": [argv(*s) for s in steps],
            "fill": {k: str(v) for k, v in (fill or {}).items()}}
    r = subprocess.run(["unshare", "-Urm", sys.executable, "-c", driver, json.dumps(spec)], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def zeros(shape) -> object:
    """A tensor that compresses to almost nothing: its bundle is tiny, its file is not."""
    from factory import T, numel

    return T("BF16", tuple(shape), bytes(2 * numel(shape)))


def test_a_first_pull_that_lacks_disk_refuses_before_it_writes(env, tmp_path):
    """A 4 MB checkpoint whose anchor is a few kB, pulled onto a 2 MB disk:
    refused with exit 9 and "needs N free, has M" in human units before a
    file of the checkpoint is written; the DIR it made goes with its
    download. (The pull checked only its downloads, and filled the disk
    before it failed.)"""
    src = write_ckpt(tmp_path / "src", {"w": zeros((1024, 2048))})
    remote = tmp_path / "remote"
    wdiff.push(src, remote, anchor=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    [got] = on_small_disk("2m", mnt, [["pull", remote, mnt / "d"]], env)
    assert got["rc"] == 9, got
    assert "needs 4.2 MB free, has 2.1 MB" in got["stderr"], got["stderr"]
    assert got["files"] == {}


def test_an_in_place_pull_that_lacks_disk_for_a_new_shard_refuses_before_touching_dir(env, tmp_path):
    """DIR at a version, the next one adds a 4 MB shard (a small bundle):
    exit 9 naming what it needs and has; DIR's files are as they were, no
    apply was begun (no .wdiff/txn), and the verified download is kept for
    the next pull. (The pull began the apply and ran out of disk staging.)"""
    rng = np.random.default_rng(3)
    t = {"a": rand(rng, "BF16", (64, 64))}
    v1 = write_ckpt(tmp_path / "v1", t)
    t2 = {"a": mutate(t["a"], 0.05, rng), "big": zeros((1024, 2048))}
    v2 = write_ckpt(tmp_path / "v2", t2, groups=[["a"], ["big"]])
    remote = tmp_path / "remote"
    wdiff.push(v1, remote, anchor=True)
    wdiff.push(v2, remote, base=v1)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    d = mnt / "d"
    steps = [["pull", "-q", remote, d, "--to", "HEAD~1"], ["pull", "-q", remote, d]]
    first, second = on_small_disk("3m", mnt, steps, env)
    assert first["rc"] == 0, first
    assert second["rc"] == 9 and "needs" in second["stderr"] and "has" in second["stderr"], second
    before = {k: v for k, v in first["files"].items() if not k.startswith("d/.wdiff")}
    after = {k: v for k, v in second["files"].items() if not k.startswith("d/.wdiff")}
    assert after == before
    assert not any(k.startswith("d/.wdiff/txn") for k in second["files"])
    [delta] = [e for e in wdiff.log(remote).entries if not e.anchor]
    assert f"d/.wdiff/pull/{delta.bundle.hex()}.wdb" in second["files"], second
    print(second["stderr"])


@pytest.mark.slow
def test_atomic_pulls_leave_only_records_and_refusals_leave_nothing(env, tmp_path):
    """``pull --atomic`` downloads into the old directory's .wdiff: after
    each pull that holds no work area, the new directory holds its record
    only; a refused --atomic pull leaves no .wdiff/ in a target that had
    none (it left the downloads of every pull in the old directories)."""
    head = Head(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    link = tmp_path / "current"
    os.symlink("empty", link)
    r = cli("pull", head.remote, link, "--atomic", "--to", "no-such-label", env=env, want=None)
    assert r.returncode == 3 and os.listdir(empty) == [], r.stderr
    for _ in range(3):
        cur = head.next()
        cli("pull", "-q", head.remote, link, "--atomic", env=env)
        assert tree(link) == tree(cur)
        assert sorted(os.listdir(link / ".wdiff")) == ["state.json"]
    for d in tmp_path.iterdir():
        if d.is_dir() and (d / ".wdiff").is_dir():
            assert not (d / ".wdiff" / "pull").exists() and du(d / ".wdiff") <= FEW_KB, d


def test_a_rebuild_beside_that_lacks_disk_refuses_before_it_builds(env, tmp_path):
    """DIR holds a version the remote does not know; ``pull --force`` would
    rebuild the remote's 4 MB version beside it: on a 3 MB disk, exit 9
    saying what it needs and has, DIR as it was (no .wdiff/ of this pull's
    in it: it had none), no copy beside it."""
    src = write_ckpt(tmp_path / "src", {"w": zeros((1024, 2048))})
    remote = tmp_path / "remote"
    wdiff.push(src, remote, anchor=True)
    mine = write_ckpt(tmp_path / "mine", {"x": rand(np.random.default_rng(9), "F32", (64,))})
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    d = mnt / "d"
    [got] = on_small_disk("3m", mnt, [["pull", "--force", remote, d]], env, fill={"d": mine})
    assert got["rc"] == 9 and "needs 4.2 MB free" in got["stderr"], got
    assert got["files"] == {"d": None, "d/model.safetensors": hashlib.sha256(
        (Path(mine) / "model.safetensors").read_bytes()).hexdigest()}, got["files"]


@pytest.mark.slow
def test_a_pull_killed_applying_the_squash_of_its_run_is_finished_by_the_next(env, tmp_path):
    """A cron pull two versions behind squashes its run and applies that in
    place; SIGKILLed once the apply's journal exists, the next pull finishes
    it (the squash joins two versions of the verified chain) and reaches the
    head, leaving no work area. (It refused with status 8 forever, "an
    in-place apply that this pull did not start", keeping three bundles.)"""
    rng = np.random.default_rng(7)
    t = {f"layer.{i}.w": rand(rng, "BF16", (1024, 1024)) for i in range(8)}
    remote, d = tmp_path / "remote", tmp_path / "d"
    prev = write_ckpt(tmp_path / "v0", t)
    wdiff.push(prev, remote, anchor=True)
    wdiff.pull(remote, d)
    for k in (1, 2):
        t = {n: mutate(x, 0.3, rng) for n, x in t.items()}
        cur = write_ckpt(tmp_path / f"v{k}", t)
        wdiff.push(cur, remote, base=prev)
        prev = cur
    journal = d / ".wdiff" / "txn" / "journal.json"
    p = subprocess.Popen(argv("pull", "-q", remote, d), env=environment({**env, "WDIFF_THREADS": "1"}))
    while p.poll() is None and not journal.exists():
        time.sleep(0.001)  # polling for the journal's appearance, the event waited for
    if p.poll() is not None:
        pytest.skip("the pull finished before its journal could be seen")
    p.kill()
    p.wait()
    assert journal.exists() and any(n.startswith("squash-") for n in os.listdir(d / ".wdiff" / "pull"))
    r = cli("pull", remote, d, env=env, want=None)
    assert r.returncode == 0, r.stderr
    assert tree(d) == tree(prev)
    assert sorted(os.listdir(d / ".wdiff")) == ["lock", "state.json"]
