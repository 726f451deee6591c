"""A writer and a receiver of the field's delta layout, written for the tests
from the layout's description (DOMAIN.md, "The field's delta layout"), not
from wdiff's code: nothing here imports wdiff. The receiver follows the
strictest reader's rules (SGLang's ``/pull_weights``); the writer writes as
slime does (one shard per writing rank, the index last).

Tensors are raw little-endian bytes by name, with their dtype and shape:
``{name: (dtype, shape, bytes)}``.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import zlib

import numpy as np
import xxhash
import zstandard

INDEX = "model.safetensors.index.json"


# -- safetensors, by hand ----------------------------------------------------------------


def st_bytes(tensors: dict, metadata: dict | None = None) -> bytes:
    """A safetensors file: u64 header length, JSON header, data (name order)."""
    head: dict = {}
    if metadata is not None:
        head["__metadata__"] = metadata
    data, off = [], 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        head[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        data.append(raw)
        off += len(raw)
    js = json.dumps(head).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js + b"".join(data)


def st_read(raw: bytes) -> tuple[dict, dict]:
    """(tensors, metadata) of a safetensors file, strictly: offsets contiguous and covering the data."""
    (n,) = struct.unpack_from("<Q", raw)
    head = json.loads(raw[8 : 8 + n])
    meta = head.pop("__metadata__", {}) or {}
    data = raw[8 + n :]
    out, pos = {}, 0
    for name, spec in sorted(head.items(), key=lambda kv: kv[1]["data_offsets"]):
        a, b = spec["data_offsets"]
        if a != pos:
            raise ValueError(f"{name}: offsets are not contiguous")
        out[name] = (spec["dtype"], tuple(spec["shape"]), data[a:b])
        pos = b
    if pos != len(data):
        raise ValueError("data region not covered")
    return out, meta


def _atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def checksum(fmt: str, raw: bytes) -> str:
    if fmt == "xxh3-128":
        return xxhash.xxh3_128_hexdigest(raw)
    if fmt == "adler32":
        return f"{zlib.adler32(raw, 1):08x}"
    raise ValueError(fmt)


# -- the writer (slime-style) ------------------------------------------------------------


def write_full(root: str, n: int, tensors: dict, companions: dict[str, bytes] | None = None, *,
               dirname: str | None = None) -> str:
    d = os.path.join(root, dirname or f"weight_v{n:06d}")
    os.makedirs(d)
    for name, content in (companions or {}).items():
        _atomic(os.path.join(d, name), content)
    _atomic(os.path.join(d, "model.safetensors"), st_bytes(tensors, {"format": "pt"}))
    return d


def encode(encoding: str, old: bytes, new: bytes) -> bytes:
    a, b = np.frombuffer(old, np.uint8), np.frombuffer(new, np.uint8)
    if encoding == "xor":
        raw = (a ^ b).tobytes()
    else:
        pos = np.flatnonzero(a != b).astype("<u4")
        raw = np.array([pos.size], "<u4").tobytes() + pos.tobytes() + b[a != b].tobytes()
    return zstandard.ZstdCompressor(level=1, write_content_size=True).compress(raw)


def write_delta(root: str, n: int, old: dict, new: dict, *, encoding: str = "xor", checksum_format: str = "xxh3-128",
                writers: int = 1, version: str | None = None, base: str | None = None,
                dirname: str | None = None) -> str:
    """Version ``n`` as a delta of ``old``: the changed tensors only, dealt
    to ``writers`` ranks in name order, each rank's shard named by its
    offset among the ranks that have one; the index last."""
    d = os.path.join(root, dirname or f"weight_v{n:06d}")
    os.makedirs(d)
    changed = sorted(k for k in new if new[k][2] != old[k][2])
    ranks = [changed[r::writers] for r in range(writers)]
    ranks = [r for r in ranks if r]
    weight_map = {}
    for off, names in enumerate(ranks):
        fname = f"model-{off:05d}-of-{len(ranks):05d}.safetensors"
        blob = {k: ("U8", (0,), encode(encoding, old[k][2], new[k][2])) for k in names}
        blob = {k: ("U8", (len(v[2]),), v[2]) for k, v in blob.items()}
        _atomic(os.path.join(d, fname), st_bytes(blob, {k: checksum(checksum_format, new[k][2]) for k in names}))
        weight_map.update({k: fname for k in names})
    index = {"metadata": {"version": version or f"{n:06d}", "base_version": base or f"{n - 1:06d}",
                          "delta_encoding": encoding, "compression_format": "zstd",
                          "checksum_format": checksum_format},
             "weight_map": weight_map}
    _atomic(os.path.join(d, INDEX), json.dumps(index).encode())
    return d


# -- the receiver (SGLang-style, strict) ------------------------------------------------


class Refused(Exception):
    pass


def load_full(d: str) -> dict:
    """A full version's tensors: every *.safetensors file of the folder."""
    out: dict = {}
    for name in sorted(os.listdir(d)):
        if name.endswith(".safetensors"):
            with open(os.path.join(d, name), "rb") as f:
                tensors, _ = st_read(f.read())
            for k, v in tensors.items():
                if k in out:
                    raise Refused(f"{k} twice")
                out[k] = v
    return out


def _index(d: str) -> dict | None:
    p = os.path.join(d, INDEX)
    if not os.path.exists(p):
        return None
    with open(p, "rb") as f:
        ix = json.loads(f.read())
    return ix if "delta_encoding" in (ix.get("metadata") or {}) else None


def _apply(ix: dict, d: str, tensors: dict) -> None:
    meta = ix["metadata"]
    enc, fmt = meta["delta_encoding"], meta["checksum_format"]
    if meta["compression_format"] != "zstd":
        raise Refused("compression")
    by_shard: dict = {}
    for name, shard in ix["weight_map"].items():
        by_shard.setdefault(shard, set()).add(name)
    for shard, names in sorted(by_shard.items()):
        with open(os.path.join(d, shard), "rb") as f:
            entries, sums = st_read(f.read())
        if set(entries) != names:
            raise Refused(f"{shard}: tensors are not the weight map's")
        for name in sorted(names):
            dtype, shape, blob = entries[name]
            if dtype != "U8" or shape != (len(blob),):
                raise Refused(f"{name}: not U8[len]")
            raw = zstandard.ZstdDecompressor().decompress(blob)  # needs the content size in the frame
            old_dtype, old_shape, old = tensors[name]
            cur = np.frombuffer(old, np.uint8).copy()
            if enc == "xor":
                if len(raw) != len(cur):
                    raise Refused("xor size")
                cur ^= np.frombuffer(raw, np.uint8)
            else:
                count = struct.unpack_from("<I", raw)[0]
                if len(raw) != 4 + 5 * count:
                    raise Refused("overwrite size")
                pos = np.frombuffer(raw, "<u4", count, 4)
                cur[pos] = np.frombuffer(raw, np.uint8, count, 4 + 4 * count)
            if checksum(fmt, cur.tobytes()) != sums[name]:
                raise Refused(f"{name}: checksum")
            tensors[name] = (old_dtype, old_shape, cur.tobytes())


class Receiver:
    """Holds a model's tensors in memory, as an engine does, and follows a
    source directory of ``weight_vN/`` versions."""

    def __init__(self, source: str, local: str) -> None:
        self.source, self.local = source, local
        self.tensors: dict = {}
        os.makedirs(os.path.join(local, ".weight_sync"), exist_ok=True)

    def _state(self) -> int | None:
        p = os.path.join(self.local, ".weight_sync", "state.json")
        if not os.path.exists(p):
            return None
        with open(p) as f:
            return int(json.load(f)["version"])

    def pull(self, target: int | None = None) -> int:
        with open(os.path.join(self.local, ".weight_sync", "lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            versions = sorted(int(n[len("weight_v"):]) for n in os.listdir(self.source) if n.startswith("weight_v"))
            target = versions[-1] if target is None else target
            held = self._state()
            if held == target:
                return held
            start = held if held is not None and held < target else None
            fulls = [v for v in versions if v <= target and (start is None or v > start)
                     and _index(os.path.join(self.source, f"weight_v{v:06d}")) is None]
            state = os.path.join(self.local, ".weight_sync", "state.json")
            if fulls:
                start = fulls[-1]
                self.tensors = load_full(os.path.join(self.source, f"weight_v{start:06d}"))
            elif start is None:
                raise Refused("no full version to seed from")
            if os.path.exists(state):
                os.unlink(state)  # in place from here on
            for v in range(start + 1, target + 1):
                d = os.path.join(self.source, f"weight_v{v:06d}")
                ix = _index(d)
                if ix is None:
                    raise Refused(f"{d}: not a delta")
                if int(ix["metadata"]["base_version"]) != v - 1:
                    raise Refused(f"{d}: base_version")
                if ix["weight_map"]:
                    _apply(ix, d, self.tensors)
            _atomic(state, json.dumps({"version": f"{target:06d}"}).encode())
            return target
