"""Crashes, full disks and races lose nothing.

A real process is SIGKILLed at random moments of apply (copy and in place)
and pull, more than sixty times in all; afterwards the checkpoint is
exactly the old or the new version (or an unfinished apply that every other
command refuses and a rerun finishes), never a mix."""

import errno
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from factory import mutate, rand, tree, write_ckpt
from kit.cli import argv
from kit.system import namespaces_work

import wdiff
from wdiff.errors import BusyError, WdiffIOError
from wdiff.format.undo import UndoLog
from wdiff.fsutil import io_error
from wdiff.ops.apply import engine as applying
from wdiff.ops.apply import patch as patching

SLOW = textwrap.dedent(
    """
    import sys, time
    from wdiff.ops.apply import engine as applying
    from wdiff import fsutil
    from wdiff.ops.apply import inplace
    from wdiff.ops.apply import patch as patching
    patching.BATCH_BYTES = 1
    def slow(real):
        def w(fd, data, off):
            time.sleep(0.004)
            real(fd, data, off)
        return w
    applying.write_all = slow(applying.write_all)
    patching.write_all = slow(patching.write_all)
    """
)

OPS = {
    "in-place": "import wdiff; wdiff.apply(sys.argv[1], sys.argv[2], in_place=True)",
    "copy": "import wdiff; wdiff.apply(sys.argv[1], sys.argv[2], sys.argv[3])",
    "pull": "import wdiff; wdiff.pull(sys.argv[4], sys.argv[2])",
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    t = tmp_path_factory.mktemp("crash")
    rng = np.random.default_rng(31)
    a = {f"w{i}": rand(rng, "BF16", (512, 512)) for i in range(6)}
    a["w3"] = rand(rng, "F32", (256, 512))  # another dtype: the patched shard has two chunks
    a["norm"] = rand(rng, "F32", (512,))
    b = {k: mutate(v, 0.05, rng) for k, v in a.items()}
    del b["w5"]
    b["extra"] = rand(rng, "F32", (64, 64))
    groups_a = [[f"w{i}" for i in range(4)], ["w4", "w5", "norm"]]
    groups_b = [[f"w{i}" for i in range(4)], ["w4", "norm", "extra"]]
    A = write_ckpt(t / "A", a, groups=groups_a, companions={"config.json": b"a"})
    B = write_ckpt(t / "B", b, groups=groups_b, companions={"config.json": b"b"})
    bundle = t / "d.wdb"
    wdiff.pack(A, B, bundle)
    remote = str(t / "remote")
    wdiff.push(A, remote, anchor=True)
    wdiff.push(bundle, remote)
    return t, A, B, bundle, remote, tree(A), tree(B)


@pytest.mark.slow
@pytest.mark.parametrize("op,trials", [("in-place", 24), ("copy", 21), ("pull", 21)])
def test_sigkill_at_random_points(world, tmp_path, op, trials):
    t, A, B, bundle, remote, ta, tb = world
    rng = np.random.default_rng({"in-place": 1, "copy": 2, "pull": 3}[op])
    seen = {"old": 0, "new": 0, "unfinished": 0}
    for k in range(trials):
        work = tmp_path / f"w{k}"
        out = tmp_path / f"out{k}"
        shutil.copytree(A, work)
        args = [str(bundle), str(work), str(out), remote]
        p = subprocess.Popen([sys.executable, "-c", SLOW + OPS[op], *args], stderr=subprocess.DEVNULL)
        time.sleep(float(rng.uniform(0.0, 1.0)))
        p.send_signal(signal.SIGKILL)
        p.wait()
        target = out if op == "copy" else work
        if op == "copy":
            assert tree(work) == ta  # the base of a copy is never touched
            if not out.exists():
                seen["old"] += 1
                wdiff.apply(bundle, work, out)  # the rerun finishes the job
            else:
                seen["new"] += 1
            assert tree(out) == tb
        else:
            try:
                wdiff.diff(work, work)
                state = tree(work)
                assert state in (ta, tb), "a mix of versions"
                seen["old" if state == ta else "new"] += 1
            except BusyError:
                seen["unfinished"] += 1
            # the rerun finishes whatever was interrupted
            if op == "pull":
                wdiff.pull(remote, work)
            elif tree(work) != tb:
                wdiff.apply(bundle, work, in_place=True)
            assert tree(target) == tb
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    assert sum(seen.values()) == trials
    print(op, seen)


class Full(Exception):
    pass


def enospc_after(monkeypatch, module, n: int):
    calls = {"n": 0}
    real = module.write_all

    def w(fd, data, off):
        calls["n"] += 1
        if calls["n"] >= n:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data, off)

    monkeypatch.setattr(module, "write_all", w)


@pytest.mark.parametrize("n", [1, 3, 8])
def test_full_disk_in_copy_mode(world, tmp_path, monkeypatch, n):
    t, A, B, bundle, remote, ta, tb = world
    enospc_after(monkeypatch, applying, n)
    with pytest.raises(WdiffIOError) as e:
        wdiff.apply(bundle, A, tmp_path / "out")
    assert e.value.exit_code == 9 and "space" in str(e.value) + str(e.value.hint)
    assert not (tmp_path / "out").exists()
    assert [p for p in tmp_path.iterdir()] == []
    assert tree(A) == ta


@pytest.mark.parametrize("n", [1, 2])
def test_full_disk_in_place_rolls_back(world, tmp_path, monkeypatch, n):
    """Patching in place overwrites existing bytes; what needs new space is the
    undo log. When it cannot grow, the patches made so far are undone."""
    t, A, B, bundle, remote, ta, tb = world
    W = tmp_path / "W"
    shutil.copytree(A, W)
    monkeypatch.setattr(patching, "BATCH_BYTES", 1)
    calls = {"n": 0}
    real = UndoLog.append

    def append(self, entries):
        calls["n"] += 1
        if calls["n"] >= n:
            raise io_error(self.path, OSError(errno.ENOSPC, "No space left on device"))
        real(self, entries)

    monkeypatch.setattr(UndoLog, "append", append)
    with pytest.raises(WdiffIOError) as e:
        wdiff.apply(bundle, W, in_place=True)
    assert "rolled back" in str(e.value)
    assert tree(W) == ta
    assert not (W / ".wdiff" / "txn").exists()


def test_full_disk_while_staging_in_place(world, tmp_path, monkeypatch):
    t, A, B, bundle, remote, ta, tb = world
    W = tmp_path / "W"
    shutil.copytree(A, W)
    enospc_after(monkeypatch, applying, 2)  # staging writes new files through applying.build
    with pytest.raises(WdiffIOError):
        wdiff.apply(bundle, W, in_place=True)
    assert tree(W) == ta
    assert not (W / ".wdiff" / "txn").exists()


def test_real_full_disk(world, tmp_path):
    """On a 2 MB tmpfs (in a user and mount namespace, when the system allows
    one): apply and pack fail with exit status 9 and leave nothing behind."""
    t, A, B, bundle, remote, ta, tb = world
    small = tmp_path / "small"
    small.mkdir()
    if not namespaces_work(small):
        pytest.skip("cannot mount a tmpfs here")
    wd = argv()
    script = (
        f"mount -t tmpfs -o size=2m tmpfs {small} && "
        f"{' '.join(wd)} apply -q {bundle} {A} -o {small}/out; echo apply=$?; ls -A {small}; "
        f"{' '.join(wd)} pack -q {A} {B} -o {small}/x.wdb 2>/dev/null; echo pack=$?; ls -A {small}; "
        f"{' '.join(wd)} pack --anchor -q {B} -o {small}/y.wdb 2>&1; echo anchor=$?; ls -A {small}"
    )
    r = subprocess.run(["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert "apply=9" in out, out
    assert "anchor=9" in out, out
    assert "No space left" in out or "space" in out
    assert ".wdiff-tmp" not in out and "out\n" not in out, out
    assert tree(A) == ta


def test_pull_racing_push(world, tmp_path):
    """A pull while pushes land on the same remote: every pull ends at a
    version the chain lists, complete and exact."""
    t, A, B, bundle, remote_unused, ta, tb = world
    remote = str(tmp_path / "remote")
    wdiff.push(A, remote, anchor=True)
    rng = np.random.default_rng(4)
    versions = [A]
    cur = {n: rand(rng, "F32", (64, 64)) for n in ("p", "q")}
    for k in range(4):
        cur = {n: mutate(v, 0.2, rng) for n, v in cur.items()}
        versions.append(write_ckpt(tmp_path / f"v{k}", cur))
    errors = []

    def pusher():
        try:
            wdiff.push(versions[1], remote, anchor=True)
            for k in range(2, len(versions)):
                wdiff.push(versions[k], remote, base=versions[k - 1])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    th = threading.Thread(target=pusher)
    th.start()
    d = tmp_path / "mirror"
    results = []
    while th.is_alive() or len(results) < 2:
        r = wdiff.pull(remote, d)
        results.append(r.after)
        assert tree(d) in [tree(v) for v in versions]
    th.join()
    assert not errors
    wdiff.pull(remote, d)
    assert tree(d) == tree(versions[-1])
