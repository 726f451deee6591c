"""The manifest cache never turns into a wrong result, whatever the writer did.

A second write through a shared mmap to a page that is already dirty changes
nothing stat can see (size, mtime, ctime, inode), and this kernel exposes no
change cookie. These tests do that for real, and plant forged cache entries,
then run the real command line with the cache on: every command either
reports the change or produces exactly B."""

import json
import mmap
import os
import shutil

import kit.cli
import numpy as np
import pytest
from factory import mutate, rand, tree, write_ckpt
from threatlib import ok

from wdiff.store import cache, manifest
from wdiff.store.checkpoint import scan

SHARD = "model.safetensors"


def run(cache_dir, *args):
    """The installed console script, its manifest cache in ``cache_dir``; output as bytes."""
    return kit.cli.run(*args, script=True, text=False, env={"WDIFF_CACHE_DIR": cache_dir})


@pytest.fixture
def pair(tmp_path):
    """A and B: "a.w" changed, "b.w" (in the middle of the shard, outside the
    cache's 64 KiB probes) and "c.w" the same."""
    rng = np.random.default_rng(3)
    a = {"a.w": rand(rng, "BF16", (1024, 512)), "b.w": rand(rng, "BF16", (1024, 512)), "c.w": rand(rng, "BF16", (256, 512))}
    b = dict(a, **{"a.w": mutate(a["a.w"], 0.01, rng)})
    A = write_ckpt(tmp_path / "A", a, companions={"config.json": b'{"v": 1}'})
    B = write_ckpt(tmp_path / "B", b, companions={"config.json": b'{"v": 1}'})
    return tmp_path, A, B


def offset_in(ckpt, name, at):
    f, t = scan(ckpt).tensors[name]
    return f.abspath, f.header.data_start + t.start + at


def ident(path):
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev


def stale_write(path, offset, fill, tries=5):
    """Dirty the page at ``offset`` through a shared mmap (same byte back),
    run ``fill()`` (a command that fills the cache), then flip the byte
    through the same mapping: the page is still dirty, so no fault, and no
    time changes. Asserts that stat is indeed unchanged; retries when
    writeback happened to clean the page in between."""
    for _ in range(tries):
        fd = os.open(path, os.O_RDWR)
        try:
            m = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        try:
            m[offset] = m[offset]  # dirties the page: mtime and ctime move now
            fill()
            before = ident(path)
            m[offset] = m[offset] ^ 0x5A  # the same dirty page: nothing moves
            after = ident(path)
        finally:
            m.close()
        if before == after:
            return before
        m2 = open(path, "r+b")  # undo and try again
        m2.seek(offset)
        b = m2.read(1)
        m2.seek(offset)
        m2.write(bytes([b[0] ^ 0x5A]))
        m2.close()
    pytest.fail("could not make a change that stat does not see (writeback cleaned the page every time)")


def test_a_stat_invisible_change_of_b(pair, monkeypatch):
    tmp, A, B = pair
    cdir = tmp / "cache"
    path, off = offset_in(B, "b.w", 300_000)
    st = stale_write(path, off, lambda: ok(run(cdir, "diff", "-q", A, B)))
    # the entry the fill wrote is still a hit: the cache cannot see the change
    monkeypatch.setenv("WDIFF_CACHE_DIR", "none")  # hashing B here must not touch the entry
    true = list(manifest.compute(scan(B), threads=1).file(SHARD).blocks)
    monkeypatch.setenv("WDIFF_CACHE_DIR", str(cdir))
    stale = cache.lookup(scan(B).file(SHARD))
    assert stale is not None and stale != true

    d = json.loads(ok(run(cdir, "diff", "--json", A, B)).stdout)
    status = {t["name"]: t["status"] for t in d["tensors"]}
    assert status["b.w"] == "modified" and status["c.w"] == "unchanged"

    bundle, C = tmp / "d.wdb", tmp / "C"
    ok(run(cdir, "pack", "-q", A, B, "-o", bundle))
    ok(run(cdir, "apply", "-q", bundle, A, "-o", C))
    assert tree(C) == tree(B)
    ok(run(cdir, "verify", "-q", B, "--bundle", bundle))
    ok(run(cdir, "verify", "-q", C, "--bundle", bundle))
    assert ident(path) == st


@pytest.mark.slow
def test_a_stat_invisible_change_of_the_base_is_refused(pair, monkeypatch):
    tmp, A, B = pair
    cdir = tmp / "cache"
    bundle = tmp / "d.wdb"
    ok(run(cdir, "pack", "-q", A, B, "-o", bundle))
    # a unit the bundle patches ("a.w") and one it copies as it is ("b.w")
    for name in ("a.w", "b.w"):
        base = tmp / f"A-{name}"
        shutil.copytree(A, base)
        path, off = offset_in(base, name, 300_000)
        st = stale_write(path, off, lambda: ok(run(cdir, "diff", "-q", base, B)))
        monkeypatch.setenv("WDIFF_CACHE_DIR", str(cdir))
        assert cache.lookup(scan(base).file(SHARD)) is not None  # the stale entry is a hit
        held = tree(base)
        r = run(cdir, "apply", "-q", bundle, base, "-o", tmp / f"C-{name}")
        assert r.returncode == 5, r.stderr.decode()
        assert not (tmp / f"C-{name}").exists()
        r = run(cdir, "apply", "-q", bundle, base, "--in-place")
        assert r.returncode == 5, r.stderr.decode()
        assert tree(base) == held  # refused before anything was written
        assert ident(path) == st


def test_a_stat_invisible_change_of_an_output_fails_verify(pair):
    tmp, A, B = pair
    cdir = tmp / "cache"
    bundle, C = tmp / "d.wdb", tmp / "C"
    ok(run(cdir, "pack", "-q", A, B, "-o", bundle))
    ok(run(cdir, "apply", "-q", bundle, A, "-o", C))  # fills C's entries
    path, off = offset_in(C, "c.w", 100_000)
    stale_write(path, off, lambda: ok(run(cdir, "verify", "-q", C, "--bundle", bundle)))
    r = run(cdir, "verify", C, "--bundle", bundle)
    assert r.returncode == 4, r.stderr.decode()


def forge(cdir, victim, claimed, monkeypatch):
    """Plant, for every file of ``victim``, an entry with its real stat and
    probe that claims the digests of the same file of ``claimed``."""
    monkeypatch.setenv("WDIFF_CACHE_DIR", "none")
    m = manifest.compute(scan(claimed), threads=1)
    monkeypatch.setenv("WDIFF_CACHE_DIR", str(cdir))
    for f in scan(victim).files:
        blocks = list(m.file(f.path).blocks)
        cache.store(f, blocks)
        assert cache.lookup(f) == blocks  # the forged entry is served as a hit


def test_forged_entries_never_lead_to_a_wrong_result(pair, monkeypatch):
    tmp, A, B = pair
    cdir = tmp / "cache"
    forge(cdir, B, A, monkeypatch)  # "B is A"
    d = json.loads(ok(run(cdir, "diff", "--json", A, B)).stdout)
    assert {t["name"]: t["status"] for t in d["tensors"]}["a.w"] == "modified"
    bundle, C = tmp / "d.wdb", tmp / "C"
    ok(run(cdir, "pack", "-q", A, B, "-o", bundle))
    forge(cdir, A, B, monkeypatch)  # "A is B" as well
    ok(run(cdir, "apply", "-q", bundle, A, "-o", C))
    assert tree(C) == tree(B)
    forge(cdir, C, A, monkeypatch)
    r = run(cdir, "verify", C, "--bundle", bundle)
    assert r.returncode == 0, r.stderr.decode()


def test_forged_entries_never_mislead_pull_or_status(pair, monkeypatch):
    tmp, A, B = pair
    cdir = tmp / "cache"
    remote = tmp / "remote"
    ok(run(cdir, "push", "-q", "--anchor", A, remote))
    ok(run(cdir, "push", "-q", B, remote, "--base", A))
    # a directory at A whose entries claim it is B, the head
    D = tmp / "D"
    shutil.copytree(A, D)
    forge(cdir, D, B, monkeypatch)
    s = json.loads(ok(run(cdir, "status", "--json", D, remote)).stdout)
    assert s["up_to_date"] is False and s["behind"] == 1
    ok(run(cdir, "pull", "-q", remote, D))
    assert tree(D) == tree(B)
    # a directory at B whose entries claim it is A: the guessed plan is
    # refused by the apply, and the pull finds the directory up to date
    E = tmp / "E"
    shutil.copytree(B, E)
    forge(cdir, E, A, monkeypatch)
    ok(run(cdir, "pull", "-q", remote, E))
    assert tree(E) == tree(B)
