"""The manifest cache serves digests only while it can vouch for them."""

import os

import numpy as np
import pytest
from factory import mutate, rand, write_ckpt

import wdiff
from wdiff.store import cache, manifest
from wdiff.store.checkpoint import scan


@pytest.fixture
def pair(tmp_path, monkeypatch):
    monkeypatch.setenv("WDIFF_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(8)
    a = {"w": rand(rng, "BF16", (700, 1000)), "b": rand(rng, "F32", (50,))}
    b = {k: mutate(t, 0.01, rng) for k, t in a.items()}
    A = write_ckpt(tmp_path / "A", a, companions={"config.json": b"{}"})
    B = write_ckpt(tmp_path / "B", b, companions={"config.json": b"{}"})
    return A, B


def no_reading(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("read a file the cache should have served")

    monkeypatch.setattr(manifest, "read_target", boom)
    monkeypatch.setattr(manifest, "hash_file", boom)


def test_pack_leaves_the_target_fingerprinted(pair, tmp_path, monkeypatch):
    A, B = pair
    res = wdiff.pack(A, B, tmp_path / "d.wdb")
    with monkeypatch.context() as m:
        no_reading(m)
        assert manifest.compute(scan(B), threads=1, use_cache=True).fingerprint == res.target_fingerprint
        assert manifest.compute(scan(A), threads=1, use_cache=True).fingerprint == res.base_fingerprint


def test_apply_leaves_the_output_fingerprinted(pair, tmp_path, monkeypatch):
    A, B = pair
    res = wdiff.pack(A, B, tmp_path / "d.wdb")
    wdiff.apply(tmp_path / "d.wdb", A, tmp_path / "C")
    with monkeypatch.context() as m:
        no_reading(m)
        assert manifest.compute(scan(tmp_path / "C"), threads=1, use_cache=True).fingerprint == res.target_fingerprint


def test_a_changed_file_is_never_served_stale(pair, tmp_path):
    A, B = pair
    before = manifest.compute(scan(A), threads=1, use_cache=True).fingerprint
    shard = os.path.join(A, "model.safetensors")
    st = os.stat(shard)
    with open(shard, "r+b") as f:  # same size, same mtime: only ctime and content change
        f.seek(st.st_size - 3)
        old = f.read(1)
        f.seek(st.st_size - 3)
        f.write(bytes([old[0] ^ 0xFF]))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = manifest.compute(scan(A), threads=1, use_cache=True).fingerprint
    assert after != before


def test_damaged_entries_are_misses(pair, tmp_path, monkeypatch):
    A, B = pair
    fp = manifest.compute(scan(A), threads=1, use_cache=True).fingerprint
    root = cache.cache_dir()
    for name in os.listdir(root):
        p = os.path.join(root, name)
        data = bytearray(open(p, "rb").read())
        data[len(data) // 2] ^= 1
        open(p, "wb").write(bytes(data))
    assert all(cache.lookup(f) is None for f in scan(A).files)
    assert manifest.compute(scan(A), threads=1, use_cache=True).fingerprint == fp


def test_cache_can_be_turned_off(pair, tmp_path, monkeypatch):
    A, B = pair
    monkeypatch.setenv("WDIFF_CACHE_DIR", "none")
    manifest.compute(scan(A), threads=1, use_cache=True)
    assert not (tmp_path / "cache").exists()


def test_the_cache_is_pruned_when_it_grows_past_its_limit_only(pair, tmp_path, monkeypatch):
    """Past MAX_ENTRIES, storing a new entry prunes the oldest; replacing
    entries already there (a diff of files seen before) adds none, so the
    cache is not listed for them, even when it is over the limit."""
    A, B = pair
    monkeypatch.setattr(cache, "MAX_ENTRIES", 10)
    root = tmp_path / "cache"
    root.mkdir()
    for i in range(12):  # over the limit, older than anything stored below
        (root / f"{i:032x}.mc").write_bytes(b"old")
        os.utime(root / f"{i:032x}.mc", ns=(i, i))
    manifest.compute(scan(A), threads=1)  # two new entries: pruned to 9 (90% of the limit)
    entries = sorted(os.listdir(root))
    assert len(entries) == 9 and all(cache.lookup(f) is not None for f in scan(A).files)
    for i in range(5):
        (root / f"{100 + i:032x}.mc").write_bytes(b"old")
    manifest.compute(scan(A), threads=1)  # the same two entries replaced: nothing pruned
    assert len(os.listdir(root)) == 14 and all(cache.lookup(f) is not None for f in scan(A).files)
    manifest.compute(scan(B), threads=1)  # two more: pruned again
    assert len(os.listdir(root)) == 9 and all(cache.lookup(f) is not None for f in scan(B).files)
