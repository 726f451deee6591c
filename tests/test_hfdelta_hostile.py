"""``pull --layout hf-delta`` against hostile sources, planted by hand from
the layout's description (tests/hfdelta_ref.py): each is refused with its
documented exit status (4 malformed or a checksum that does not match, 5 a
base that is not the version held, 3 something the index names is missing,
2 a checksum format this install cannot read), and the directory is left
byte for byte as it was, its .wdiff/ included; a directory the pull would
have created does not appear, nor does anything beside it."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
import time

import numpy as np
import pytest
import zstandard
from factory import rand
from hfdelta_ref import INDEX, encode, load_full, st_bytes, st_read, write_delta, write_full
from test_hfdelta import snapshot, wd

SHARD = "model-00000-of-00001.safetensors"


def _tensor(rng, shape=(64, 64)):
    return ("BF16", shape, rand(rng, "BF16", shape).data)


def _step(rng, t: dict, names, density=0.02) -> dict:
    new = dict(t)
    for k in names:
        dt, shape, raw = new[k]
        a = np.frombuffer(raw, np.uint8).copy()
        idx = rng.choice(a.size, max(1, int(density * a.size)), replace=False)
        a[idx] ^= rng.integers(1, 255, idx.size, dtype=np.uint8)
        new[k] = (dt, shape, a.tobytes())
    return new


@pytest.fixture
def src(tmp_path):
    """S: weight_v000000 full, 000001 xor, 000002 overwrite; D pulled to 000001."""
    rng = np.random.default_rng(5)
    S = tmp_path / "S"
    os.makedirs(S)
    v0 = {f"w{i}": _tensor(rng) for i in range(4)}
    v1 = _step(rng, v0, ["w0", "w1"])
    v2 = _step(rng, v1, ["w2", "w3"])
    write_full(str(S), 0, v0, {"config.json": b"{}"})
    write_delta(str(S), 1, v0, v1)
    write_delta(str(S), 2, v1, v2, encoding="overwrite")
    D = tmp_path / "D"
    wd("pull", S, D, "--layout", "hf-delta", "--to", "1", "-q")
    return S, D, (v0, v1, v2)


def _index(S, n=2) -> dict:
    return json.loads((S / f"weight_v{n:06d}" / INDEX).read_bytes())


def _put_index(S, ix, n=2) -> None:
    (S / f"weight_v{n:06d}" / INDEX).write_bytes(json.dumps(ix).encode())


def _shard(S, n=2):
    return st_read((S / f"weight_v{n:06d}" / SHARD).read_bytes())


def _put_shard(S, entries, meta, n=2) -> None:
    (S / f"weight_v{n:06d}" / SHARD).write_bytes(st_bytes(entries, meta))


def _frame(S, name, blob, n=2) -> None:
    entries, meta = _shard(S, n)
    entries[name] = ("U8", (len(blob),), blob)
    _put_shard(S, entries, meta, n)


def _bomb(content_size: int, fill: int = 0, *, windowed: bool = False) -> bytes:
    """A valid zstd frame header declaring ``content_size`` (8-byte size
    field; single segment, or with a 128 KiB window), then RLE blocks of 128
    KiB of ``fill``, the last one marked: 13 to 22 bytes that say they hold
    ``content_size``."""
    rle = 1 << 1 | ((128 << 10) << 3)
    head = bytes([0xC0, 7 << 3]) if windowed else bytes([0xE0])
    return (b"\x28\xb5\x2f\xfd" + head + struct.pack("<Q", content_size)
            + rle.to_bytes(3, "little") + bytes([fill]) + (rle | 1).to_bytes(3, "little") + bytes([fill]))


def bad_checksum(S, v):
    entries, meta = _shard(S)
    meta["w2"] = "0" * 32
    _put_shard(S, entries, meta)


def flipped_frame(S, v):
    entries, meta = _shard(S)
    blob = bytearray(entries["w3"][2])
    blob[len(blob) // 2] ^= 0x10
    _frame(S, "w3", bytes(blob))


def wrong_base(S, v):
    ix = _index(S)
    ix["metadata"]["base_version"] = "000000"
    _put_index(S, ix)


def wrong_version(S, v):
    ix = _index(S)
    ix["metadata"]["version"] = "000009"
    _put_index(S, ix)


def traversal_shard(S, v):
    ix = _index(S)
    ix["weight_map"]["w2"] = "../../weight_v000001/" + SHARD
    _put_index(S, ix)


def folder_shard(S, v):
    ix = _index(S)
    ix["weight_map"] = {k: "sub/" + s for k, s in ix["weight_map"].items()}
    _put_index(S, ix)


def traversal_name(S, v):
    entries, meta = _shard(S)
    entries["../../etc/passwd"] = entries.pop("w2")
    meta["../../etc/passwd"] = meta.pop("w2")
    _put_shard(S, entries, meta)
    ix = _index(S)
    ix["weight_map"]["../../etc/passwd"] = ix["weight_map"].pop("w2")
    _put_index(S, ix)


def extra_tensor(S, v):
    entries, meta = _shard(S)
    entries["w9"] = entries["w2"]
    meta["w9"] = meta["w2"]
    _put_shard(S, entries, meta)


def missing_tensor(S, v):
    entries, meta = _shard(S)
    del entries["w2"]
    _put_shard(S, entries, meta)


def missing_shard(S, v):
    os.unlink(S / "weight_v000002" / SHARD)


def symlinked_shard(S, v):
    p = S / "weight_v000002" / SHARD
    outside = S.parent / "elsewhere.safetensors"
    shutil.move(p, outside)
    os.symlink(outside, p)


def malformed_json(S, v):
    (S / "weight_v000002" / INDEX).write_bytes(b'{"metadata": {"delta_encoding": "xor",')


def duplicate_keys(S, v):
    raw = (S / "weight_v000002" / INDEX).read_bytes()
    (S / "weight_v000002" / INDEX).write_bytes(raw.replace(b'"weight_map": {', b'"weight_map": {"w2": "x.safetensors", ', 1))


def unknown_encoding(S, v):
    ix = _index(S)
    ix["metadata"]["delta_encoding"] = "add"
    _put_index(S, ix)


def other_compression(S, v):
    ix = _index(S)
    ix["metadata"]["compression_format"] = "lz4"
    _put_index(S, ix)


def blake3_checksums(S, v):
    ix = _index(S)
    ix["metadata"]["checksum_format"] = "blake3"
    _put_index(S, ix)
    entries, meta = _shard(S)
    _put_shard(S, entries, {k: "ab" * 32 for k in meta})


def oversized_count(S, v):
    n = len(v[1]["w2"][2])
    raw = struct.pack("<I", n + 1) + bytes(4 * (n + 1)) + bytes(n + 1)
    _frame(S, "w2", zstandard.ZstdCompressor(level=1).compress(raw))


def position_past_the_end(S, v):
    n = len(v[1]["w2"][2])
    raw = struct.pack("<I", 1) + struct.pack("<I", n + 7) + b"\x01"
    _frame(S, "w2", zstandard.ZstdCompressor(level=1).compress(raw))


def zstd_bomb(S, v):
    """A 17-byte frame that says it holds 1.4 TB of overwrite entries
    (one-shot decompression raised MemoryError on such)."""
    k = 1 << 38
    _frame(S, "w2", _bomb(4 + 5 * k, fill=0, windowed=True))


def zstd_bomb_xor(S, v):
    """The same as an xor frame: 1 TiB for a tensor of 8 KiB."""
    ix = _index(S)
    ix["metadata"]["delta_encoding"] = "xor"
    _put_index(S, ix)
    _frame(S, "w2", _bomb(1 << 40))


def no_content_size(S, v):
    raw = encode("overwrite", v[1]["w2"][2], v[2]["w2"][2])
    plain = zstandard.ZstdDecompressor().decompress(raw)
    _frame(S, "w2", zstandard.ZstdCompressor(level=1, write_content_size=False).compress(plain))


def two_frames(S, v):
    entries, _ = _shard(S)
    _frame(S, "w2", entries["w2"][2] * 2)


def trailing_bytes(S, v):
    entries, _ = _shard(S)
    _frame(S, "w2", entries["w2"][2] + b"\x00junk")


def not_u8(S, v):
    entries, meta = _shard(S)
    dt, shape, blob = entries["w2"]
    entries["w2"] = ("I8", shape, blob)
    _put_shard(S, entries, meta)


def huge_header(S, v):
    p = S / "weight_v000002" / SHARD
    raw = p.read_bytes()
    p.write_bytes(struct.pack("<Q", 1 << 40) + raw[8:])


def index_missing(S, v):
    """The index of a delta not (yet) there: by the layout's rule a full
    version, but its folder holds only a delta's shards."""
    os.unlink(S / "weight_v000002" / INDEX)


def version_missing(S, v):
    write_delta(str(S), 3, v[2], _step(np.random.default_rng(1), v[2], ["w0"]))
    shutil.rmtree(S / "weight_v000002")


ATTACKS = [
    (bad_checksum, 4), (flipped_frame, 4), (wrong_base, 5), (wrong_version, 4), (traversal_shard, 4),
    (folder_shard, 4), (traversal_name, 4), (extra_tensor, 4), (missing_tensor, 4), (missing_shard, 3),
    (symlinked_shard, 4), (malformed_json, 4), (duplicate_keys, 4), (unknown_encoding, 4), (other_compression, 4),
    (blake3_checksums, 2), (oversized_count, 4), (position_past_the_end, 4), (zstd_bomb, 4), (zstd_bomb_xor, 4), (no_content_size, 4),
    (two_frames, 4), (trailing_bytes, 4), (not_u8, 4), (huge_header, 4), (index_missing, 4), (version_missing, 3),
]


@pytest.mark.parametrize("attack,code", ATTACKS, ids=[a.__name__ for a, _ in ATTACKS])
def test_a_hostile_source_is_refused_and_the_directory_untouched(src, attack, code, tmp_path):
    S, D, v = src
    if attack is blake3_checksums and importlib.util.find_spec("blake3") is not None:
        pytest.skip("blake3 is installed here: its checksums are read")
    attack(S, v)
    before = snapshot(D)
    t0 = time.process_time()
    r = wd("pull", S, D, "--layout", "hf-delta", check=False)
    assert r.returncode == code, (r.returncode, r.stderr)
    assert r.stdout == "" and "Traceback" not in r.stderr and r.stderr.startswith("wdiff: error:")
    assert snapshot(D) == before
    assert sorted(os.listdir(tmp_path)) == ["D", "S"] + (["elsewhere.safetensors"] if attack is symlinked_shard else [])
    # a directory the pull would create does not appear, nor anything beside it
    r = wd("pull", S, tmp_path / "new" / "E", "--layout", "hf-delta", "--to", "2", check=False)
    assert r.returncode == code, (r.returncode, r.stderr)
    assert not os.path.lexists(tmp_path / "new")
    assert time.process_time() - t0 < 5  # the bomb costs nothing in this process; the CLIs run apart


def test_state_and_paths_are_input(src, tmp_path):
    S, D, v = src
    # DIR inside the source, the source inside DIR: refused before anything is written
    assert wd("pull", S, S / "inner", "--layout", "hf-delta", check=False).returncode == 2
    assert wd("pull", S, tmp_path, "--layout", "hf-delta", check=False).returncode == 2
    # another source's version: refused (5), replaced with --force
    other = tmp_path / "S2"
    shutil.copytree(S, other)
    before = snapshot(D)
    r = wd("pull", other, D, "--layout", "hf-delta", check=False)
    assert r.returncode == 5 and "another source" in r.stderr and snapshot(D) == before
    # a planted record is refused, not obeyed
    held = D / ".wdiff" / "hfdelta.json"
    good = held.read_bytes()
    held.write_bytes(b'{"schema": "wdiff-hfdelta/1", "source": "/x", "version": "1"}')
    assert wd("pull", S, D, "--layout", "hf-delta", check=False).returncode == 4
    held.write_bytes(good)
    # a work area that is a link is refused (the link is never followed)
    os.symlink(tmp_path, D / ".wdiff" / "hfdelta")
    before = snapshot(D)
    assert wd("pull", S, D, "--layout", "hf-delta", check=False).returncode == 4
    assert snapshot(D) == before
    os.unlink(D / ".wdiff" / "hfdelta")
    # local changes: refused (5) and named; --force starts again from the full version
    (D / "config.json").write_bytes(b'{"mine": 1}')
    r = wd("pull", S, D, "--layout", "hf-delta", check=False)
    assert r.returncode == 5 and "config.json" in r.stderr
    wd("pull", S, D, "--layout", "hf-delta", "--force", "-q")
    assert load_full(str(D)) == v[2] and (D / "config.json").read_bytes() == b"{}"
    # a directory of files and no record: refused; with --force, replaced
    E = tmp_path / "E"
    os.makedirs(E)
    (E / "notes.txt").write_bytes(b"mine")
    assert wd("pull", S, E, "--layout", "hf-delta", check=False).returncode == 5
    assert sorted(os.listdir(E)) == ["notes.txt"]


def test_killed_at_any_moment_a_pull_leaves_the_old_version_or_the_new(tmp_path):
    """SIGKILL at a moment drawn over 1.5 times an uninterrupted pull: the
    directory is byte for byte the old or the new version, or holds the
    journal of the in-place apply, which the next pull finishes."""
    import random
    import signal
    import subprocess
    import sys

    from factory import tree

    rng = np.random.default_rng(9)
    S = tmp_path / "S"
    os.makedirs(S)
    v0 = {f"layer.{i}.w": ("BF16", (512, 1024), rand(rng, "BF16", (512, 1024)).data) for i in range(8)}
    v1 = _step(rng, v0, list(v0), density=0.05)
    write_full(str(S), 0, v0, {"config.json": b"{}"})
    write_delta(str(S), 1, v0, v1)
    D = tmp_path / "D"
    wd("pull", S, D, "--layout", "hf-delta", "--to", "0", "-q")
    old = tree(D)
    t0 = time.monotonic()
    wd("pull", S, D, "--layout", "hf-delta", "-q")
    took = time.monotonic() - t0
    new = tree(D)
    pick = random.Random(2026)
    outcomes = set()
    for _ in range(8):
        wd("pull", S, D, "--layout", "hf-delta", "--to", "0", "-q")
        assert tree(D) == old
        p = subprocess.Popen([sys.executable, "-m", "wdiff", "pull", str(S), str(D), "--layout", "hf-delta", "-q"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            p.wait(timeout=pick.uniform(0.2, 1.5) * took)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            p.wait()
        if (D / ".wdiff" / "txn" / "journal.json").exists():
            outcomes.add("mid-apply")
        else:
            now = tree(D)
            assert now in (old, new)
            outcomes.add("old" if now == old else "new")
        doc = json.loads(wd("pull", S, D, "--layout", "hf-delta", "--json").stdout)
        assert doc["after"] == "000001" and tree(D) == new
        assert sorted(os.listdir(D / ".wdiff")) == ["hfdelta.json", "lock", "state.json"]
        assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]
    assert len(outcomes) >= 2, outcomes


def test_part_of_a_full_version_is_never_taken_for_the_whole(tmp_path):
    """A full version whose index names a shard that is not there (an upload
    under way, a lost file) is refused (4); nothing is created."""
    from factory import write_ckpt

    rng = np.random.default_rng(4)
    S = tmp_path / "S"
    write_ckpt(S / "weight_v000000", {f"w{i}": rand(rng, "F32", (16, 16)) for i in range(4)}, shards=2,
               companions={"config.json": b"{}"})
    os.unlink(S / "weight_v000000" / "model-00002-of-00002.safetensors")
    r = wd("pull", S, tmp_path / "D", "--layout", "hf-delta", check=False)
    assert r.returncode == 4 and "not a whole checkpoint" in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["S"]
