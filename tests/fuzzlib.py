"""Semantic mutations of wdiff bundles, with every digest recomputed, and the
harness that applies them and checks the trust invariant.

The invariant (see tests/test_semantic_fuzz.py): whatever a well-formed but
hostile bundle says, ``wdiff apply`` either refuses it with a documented exit
code, leaving everything outside OUT (the base above all) as it was and OUT
absent, or exits 0 having written exactly the target the bundle's own index
states: the same paths, and for each file the size, kind and digest the index
gives, so that the fingerprint of OUT is target.fingerprint. Never an
unexpected error, a hang, a huge allocation, or a file outside OUT.

Everything about the format comes from specbundle (written from the spec);
wdiff is used only through ``wdiff.pack``/``wdiff.apply``/``wdiff.WdiffError``
and its command line.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

import specbundle as sb
from kit.trees import write_tree
import wdiff

WDIFF = os.path.join(os.path.dirname(sys.executable), "wdiff")

# -- checkpoints made here -------------------------------------------------------------


def _rand(rng: np.random.Generator, dt: str, shape) -> bytes:
    bits = sb.DTYPES.get(dt, (8, 1))[0]
    n = 1
    for d in shape:
        n *= d
    return rng.integers(0, 256, (n * bits + 7) // 8, dtype=np.uint8).tobytes()


def _change(rng: np.random.Generator, data: bytes, w: int, density: float) -> bytes:
    a = np.frombuffer(data, dtype=sb._UINT[w]).copy()
    if not a.size:
        return data
    k = max(1, int(density * a.size))
    pos = rng.choice(a.size, size=min(k, a.size), replace=False)
    a[pos] ^= rng.integers(1, 2 ** (8 * w) - 1, size=pos.size, dtype=a.dtype, endpoint=True)
    return a.tobytes()


def _shard_index(shards: dict) -> bytes:
    wm = {t[0]: fn for fn, ts in shards.items() for t in ts}
    return json.dumps({"metadata": {}, "weight_map": dict(sorted(wm.items()))}, sort_keys=True).encode()


@dataclass
class Scenario:
    name: str
    base_dir: str | None  # None: an anchor
    target_dir: str
    base: sb.Checkpoint | None
    target: sb.Checkpoint
    bundles: list = field(default_factory=list)  # (label, bytes)
    weight: float = 1.0

    @property
    def anchor(self) -> bool:
        return self.base_dir is None


def make_scenarios(root: str, *, big: bool = True) -> list[Scenario]:
    """Small checkpoints covering the shapes of bundle wdiff and the spec
    allow: sparse, bitmap, dense and raw chunks, an anchor with odd dtypes
    and names, structural changes (added, removed, retyped, reshaped and
    moved tensors, a file turning into a directory and back), a large
    tensor cut into block-aligned pieces, and a version 3 one (codec v2
    chunks, companion files of source delta)."""
    rng = np.random.default_rng(20261201)
    out = []

    def T(name, dt, shape):
        return (name, dt, tuple(shape), _rand(rng, dt, shape))

    def mod(t, density):
        return (t[0], t[1], t[2], _change(rng, t[3], sb.word_of(t[1]), density))

    # sparse: a step of an RL run
    base = [T("w0", "BF16", (256, 256)), T("w1", "F32", (64, 64)), T("s", "F8_E4M3", (64,)), T("sc", "I64", ()),
            T("e", "F32", (0, 3)), T("c", "C64", (8,))]
    tgt = [mod(base[0], 0.003), mod(base[1], 0.03), mod(base[2], 0.1), base[3], base[4], mod(base[5], 0.9)]
    a = write_tree(os.path.join(root, "sparse-A"), {
        "model.safetensors": sb.write_st(base, {"format": "pt"}), "config.json": b'{"step": 1}',
        "tokenizer.json": b'{"vocab": {}}'})
    b = write_tree(os.path.join(root, "sparse-B"), {
        "model.safetensors": sb.write_st(tgt, {"format": "pt"}), "config.json": b'{"step": 2}',
        "tokenizer.json": b'{"vocab": {}}'})
    out.append(("sparse", a, b, 1.0))

    # dense: bitmap, dense, raw, two shards and the shard index
    s1 = [T("a", "F16", (128, 128)), T("b", "U8", (4096,))]
    # u (I32) and v (F32): one word size, two dtypes, both with base sources
    s2 = [T("d", "F64", (256,)), T("u", "I32", (512,)), T("v", "F32", (64,)), T("flag", "BOOL", (100,))]
    t1 = [mod(s1[0], 0.4), mod(s1[1], 0.95)]
    t2 = [mod(s2[0], 0.6), mod(s2[1], 0.05), mod(s2[2], 0.1), s2[3]]
    names = {"model-00001-of-00002.safetensors": s1, "model-00002-of-00002.safetensors": s2}
    a = write_tree(os.path.join(root, "dense-A"), {
        "model-00001-of-00002.safetensors": sb.write_st(s1), "model-00002-of-00002.safetensors": sb.write_st(s2),
        "model.safetensors.index.json": _shard_index(names)})
    b = write_tree(os.path.join(root, "dense-B"), {
        "model-00001-of-00002.safetensors": sb.write_st(t1), "model-00002-of-00002.safetensors": sb.write_st(t2),
        "model.safetensors.index.json": _shard_index(names)})
    out.append(("dense", a, b, 1.0))

    # anchor: odd dtypes, unicode names, empty tensors and files, nesting,
    # a *.safetensors companion that breaks the strict rules
    u1 = [T("emb", "BF16", (64, 32)), T("f4", "F4", (16,)), T("f6", "F6_E2M3", (8,)), T("q", "Q7", (5,)),
          T("empty", "F32", (0,)), T("\u00fcn\u00ef/\u00e7\u00f8d\u00e9", "F32", (3, 3))]
    u2 = [T("head", "F32", (16, 16)), T("bias", "F32", (16,)), T("i8", "I8", (7,))]
    gap = sb.write_st([("x", "U8", (4,), b"abcd")])
    gap = gap[:8] + gap[8:].replace(b"[0,4]", b"[1,5]") + b"z"  # a gap before x: not strict
    b = write_tree(os.path.join(root, "anchor-B"), {
        "a.safetensors": sb.write_st(u1, {"note": "x"}), "z/b.safetensors": sb.write_st(u2),
        "bad.safetensors": gap, "empty.txt": b"", "sub/tok.json": b'{"t": 1}', "sub/deep/x.txt": b"x" * 300})
    out.append(("anchor", None, b, 1.0))

    # structural
    keep, gone, retype, reshape, moved, x = (T("keep", "F32", (32, 32)), T("gone", "F16", (10,)),
                                             T("retype", "F32", (4, 4)), T("reshape", "BF16", (8, 8)),
                                             T("moved", "U8", (100,)), T("x", "I16", (50,)))
    a = write_tree(os.path.join(root, "struct-A"), {
        "m1.safetensors": sb.write_st([keep, gone, retype, reshape, moved], {"v": "1"}),
        "m2.safetensors": sb.write_st([x]), "d/x.json": b"{}", "e": b"e-file", "old.txt": b"old"})
    b = write_tree(os.path.join(root, "struct-B"), {
        "m1.safetensors": sb.write_st([mod(keep, 0.01), T("retype", "BF16", (4, 4)),
                                       (reshape[0], "BF16", (4, 16), reshape[3]), T("new", "F32", (8, 8))], {"v": "2"}),
        "m3.safetensors": sb.write_st([moved, mod(x, 0.2)]), "d": b"now a file", "e/y.json": b"{}",
        "new.txt": b"new"})
    out.append(("struct", a, b, 1.0))

    # version 3: codec v2 chunks where they win (integers moved by a few
    # units, a bf16 optimizer step, fp32 that all moves a little, dense f64
    # ulps) and companion files of source delta: a 1.1 MiB fp32 blob changed
    # in place (word codecs), a 1.1 MiB file with an inserted block
    # (ZSTD_BASE), and small ones that wdiff stores whole but the spec's
    # writer gives DELTA records (one grown past the base file's end)
    def ulp(a, density):
        b = a.copy()
        k = max(1, int(density * a.size))
        pos = rng.choice(a.size, size=k, replace=False)
        d = rng.choice([1, 1, 1, 2, 3], size=k).astype(a.dtype)
        b[pos] = np.where(rng.random(k) < 0.5, a[pos] - d, a[pos] + d)
        return b

    def V(name, dt, arr):
        return (name, dt, arr.shape, arr.tobytes())

    master = (rng.standard_normal(16384) * 0.02).astype(np.float32)
    bf = lambda x: ((x.view(np.uint32).astype(np.uint64) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1))  # noqa: E731
                    >> 16).astype(np.uint16)
    lr = np.float32(3e-7) * np.where(rng.random(master.size) < 0.5, -1, 1).astype(np.float32)
    u8 = rng.integers(0, 255, 8192, dtype=np.uint8)
    u8b = u8.copy()
    u8b[rng.choice(u8.size, int(0.4 * u8.size), replace=False)] += np.uint8(1)
    i16 = rng.integers(0, 1 << 15, 8192, dtype=np.int16).view(np.uint16)
    i32 = rng.integers(0, 1 << 30, 4096, dtype=np.int32).view(np.uint32)
    f32 = (rng.standard_normal(4096) * 0.02).astype(np.float32)
    f64 = (rng.standard_normal(1024) * 0.02).astype(np.float64).view(np.uint64)
    vb = [V("u8", "U8", u8), V("i16", "I16", i16), V("i32", "I32", i32), V("bf", "BF16", bf(master)),
          V("f32", "F32", f32), V("f64", "F64", f64), V("f16", "F16", bf(master[:2048]))]
    vt = [V("u8", "U8", u8b), V("i16", "I16", ulp(i16, 0.005)), V("i32", "I32", ulp(i32, 0.1)),
          V("bf", "BF16", bf(master + lr)), V("f32", "F32", (f32 * np.float32(0.999) + np.float32(1e-7))),
          V("f64", "F64", ulp(f64, 0.95)), V("f16", "F16", ulp(bf(master[:2048]), 0.02))]
    # an embedding whose step moves a few rows only, Adam-like (RSPARSE); a
    # generator of its own, so that the data above and below stays as it was
    erng = np.random.default_rng(202612011)
    emb = (erng.standard_normal((1500, 128)) * 0.02).astype(np.float32)
    emb2 = emb.copy()
    hit = erng.choice(1500, 25, replace=False)
    emb2[hit] += np.float32(1e-4) * np.where(erng.random((25, 128)) < 0.5, -1, 1).astype(np.float32)
    vb.append(V("emb", "BF16", bf(emb)))
    vt.append(V("emb", "BF16", bf(emb2)))
    opt = (np.abs(rng.standard_normal(290_000)) * 1e-3).astype(np.float32)
    opt2 = opt.copy()
    idx = rng.choice(opt.size, 2000, replace=False)
    opt2[idx] = np.nextafter(opt[idx], np.float32(np.inf))
    gg = rng.integers(0, 16, (1 << 20) + 70_000, dtype=np.uint8).tobytes()
    gg2 = gg[:300_123] + rng.integers(0, 256, 20_000, dtype=np.uint8).tobytes() + gg[300_123:]
    sm = rng.integers(0, 256, 150_000, dtype=np.uint8).tobytes()
    sm2 = bytearray(sm)
    for k in rng.choice(len(sm), 300, replace=False):
        sm2[k] ^= 0x21
    a = write_tree(os.path.join(root, "v3-A"), {
        "model.safetensors": sb.write_st(vb), "opt.bin": b"PK" + opt.tobytes(), "w.gguf": gg,
        "small.bin": sm, "grow.bin": sm[:70_000], "config.json": b'{"step": 1}'})
    b = write_tree(os.path.join(root, "v3-B"), {
        "model.safetensors": sb.write_st(vt), "opt.bin": b"PK" + opt2.tobytes(), "w.gguf": gg2,
        "small.bin": bytes(sm2), "grow.bin": sm[:90_000] + b"tail", "config.json": b'{"step": 2}'})
    out.append(("v3", a, b, 1.0))

    if big:
        # a large tensor: 4 MiB units and block-aligned pieces, multi-block chunks
        t = T("t", "U8", (4 * (1 << 20) + (1 << 19),))
        h = T("h", "BF16", (640, 1024))
        t2 = (t[0], t[1], t[2], _change(rng, t[3], 1, 0.0005))
        a = write_tree(os.path.join(root, "big-A"), {"big.safetensors": sb.write_st([h, t])})
        b = write_tree(os.path.join(root, "big-B"), {"big.safetensors": sb.write_st([mod(h, 0.001), t2])})
        out.append(("big", a, b, 0.12))

    scenarios = []
    for name, a, b, weight in out:
        sc = Scenario(name, a, b, sb.scan(a) if a else None, sb.scan(b), weight=weight)
        path = os.path.join(root, f"{name}.wdb")
        # format version 1 for the version-1 scenarios (as before); the
        # version 3 one as wdiff writes it by default
        v = 3 if name == "v3" else 1
        wdiff.pack(a, b, path, format_version=v) if a else wdiff.pack(None, b, path, format_version=v)
        with open(path, "rb") as f:
            sc.bundles.append(("wdiff", f.read()))
        for seed in range(3 if v == 3 else 2):
            spec = sb.pack(sc.base, sc.target, random.Random(seed), version=v)
            sc.bundles.append((f"spec{seed}", sb.serialize(spec, level=3)))
        scenarios.append(sc)
    return scenarios


# -- crafted zstd frames -----------------------------------------------------------------


def zframe(declared: int | None, blocks, *, single: bool = True, window_log: int = 17, dict_id: int | None = None,
           checksum: bytes | None = None) -> bytes:
    """A zstd frame built by hand (RFC 8878): ``blocks`` are ("raw", bytes) or
    ("rle", byte, n); the last one is marked last."""
    fhd = 0
    if declared is not None:
        fhd |= 3 << 6  # 8-byte frame content size
    if single:
        fhd |= 1 << 5
    if checksum is not None:
        fhd |= 1 << 2
    if dict_id is not None:
        fhd |= 3  # 4-byte dictionary id
    out = bytearray(b"\x28\xb5\x2f\xfd") + bytes([fhd])
    if not single:
        out.append((window_log - 10) << 3)
    if dict_id is not None:
        out += struct.pack("<I", dict_id)
    if declared is not None:
        out += struct.pack("<Q", declared)
    for i, blk in enumerate(blocks):
        last = 1 if i == len(blocks) - 1 else 0
        if blk[0] == "raw":
            out += struct.pack("<I", last | (0 << 1) | (len(blk[1]) << 3))[:3] + blk[1]
        else:
            out += struct.pack("<I", last | (1 << 1) | (blk[2] << 3))[:3] + bytes([blk[1]])
    if not blocks:
        out += struct.pack("<I", 1 | (len(b"") << 3))[:3]
    if checksum is not None:
        out += checksum
    return bytes(out)


def raw_blocks(data: bytes, size: int = 1 << 17):
    return [("raw", data[i:i + size]) for i in range(0, len(data), size)] or [("raw", b"")]


SKIPPABLE = b"\x50\x2a\x4d\x18" + struct.pack("<I", 4) + b"skip"

# -- mutation context ------------------------------------------------------------------------


class Skip(Exception):
    """This mutation does not apply to this bundle."""


class Ctx:
    def __init__(self, sc: Scenario, b: sb.Bundle, rng: random.Random):
        self.sc, self.b, self.rng = sc, b, rng
        self.notes: list[str] = []

    # views
    @property
    def files(self):
        return self.b.index["target"]["files"]

    def recs(self, typ=None, codec=None):
        out = [i for i, r in enumerate(self.b.records) if (typ is None or r.type == typ)
               and (codec is None or r.codec in (codec if isinstance(codec, tuple) else (codec,)))]
        if not out:
            raise Skip
        return out

    def pick_rec(self, typ=None, codec=None):
        return self.rng.choice(self.recs(typ, codec))

    def tensor_files(self):
        out = [j for j, f in enumerate(self.files) if f["kind"] == "safetensors"]
        if not out:
            raise Skip
        return out

    def header(self, j):
        """(header bytes, StHeader) of target file j, as the bundle defines it."""
        f = self.files[j]
        if f["source"] == "bundle":
            for r in self.b.records:
                if r.type == sb.HEADER and r.file == j:
                    hb = sb.unZ(r.sections[0], r.hi)
                    break
            else:
                raise Skip
        else:
            bf = self.sc.base.by_path().get(f["path"]) if self.sc.base else None
            if bf is None or bf.header is None:
                raise Skip
            hb = bf.header_bytes
        return hb, sb.parse_st(hb, f["size"])

    def region(self, j) -> bytes:
        """The pristine target data region of file j (from the target dir)."""
        f = self.files[j]
        tf = self.sc.target.by_path().get(f["path"])
        if tf is None or tf.header is None:
            raise Skip
        return tf.data[tf.header.size:]

    def covered(self, r, h: sb.StHeader):
        return [t for t in h.tensors if t.nbytes and t.begin < r.hi and t.end > r.lo]

    def base_bytes(self, cov, lo, hi) -> bytes | None:
        if self.sc.base is None:
            return None
        bt = self.sc.base.tensors()
        parts = []
        for t in cov:
            hit = bt.get(t.name)
            if hit is None or hit[1].dtype != t.dtype or hit[1].shape != t.shape:
                return None
            data = hit[0].tensor_bytes(hit[1])
            parts.append(data[max(lo, t.begin) - t.begin:min(hi, t.end) - t.begin])
        return b"".join(parts)

    def chunk(self, i):
        """(record, header, covered tensors, old bytes or None, new bytes)."""
        r = self.b.records[i]
        if r.type != sb.CHUNK or r.word not in (1, 2, 4, 8) or not 0 < r.hi - r.lo <= sb.MAX_CHUNK_BYTES \
                or (r.hi - r.lo) % r.word:
            raise Skip  # an earlier mutation of a stack broke it beyond decoding
        hb, h = self.header(r.file)
        cov = self.covered(r, h)
        if not cov:
            raise Skip
        old = self.base_bytes(cov, r.lo, r.hi) if r.base != sb.ZERO else None
        new = sb.decode_chunk(r, old, (r.hi - r.lo) // r.word)
        return r, h, cov, old, new

    # edits
    def set_chunk(self, i, codec, new, *, rparam=None, h=None, cov=None, old=None, update_index=True):
        """Re-encode record i to produce ``new`` with ``codec``; update its
        target digest and, with update_index, the index's tensor digests."""
        r = self.b.records[i]
        if h is None:
            _, h, cov, old, _ = self.chunk(i)
        if codec != sb.RAW and (old is None or old == new):
            raise Skip
        param, count, secs = sb.encode_chunk(codec, old, new, r.word, r=rparam)
        r.codec, r.param, r.count, r.sections, r.lens = codec, param, count, secs, None
        r.target = sb._chunk_digest(cov, r.lo, r.hi, new)
        if update_index:
            region = bytearray(self.region(r.file))
            region[r.lo:r.hi] = new
            f = self.files[r.file]
            f["tensors"] = [sb.D(region[t.begin:t.end]).hex() for t in h.tensors]

    def rename(self, j, new):
        """Rename target file j, keeping target.files in path order and the
        records file by file (a semantic rename, not a byte edit)."""
        self.files[j]["path"] = new
        self.resort()

    def resort(self):
        files = self.files
        order = sorted(range(len(files)), key=lambda k: self._key(files[k]["path"]))
        pos = {old: new for new, old in enumerate(order)}
        self.b.index["target"]["files"] = [files[k] for k in order]
        for r in self.b.records:
            if r.file in pos:
                r.file = pos[r.file]
        self.b.records.sort(key=lambda r: r.file)

    @staticmethod
    def _key(p):
        try:
            return p.encode("utf-8", "surrogatepass") if isinstance(p, str) else b""
        except Exception:  # noqa: BLE001
            return b""

    def set_header(self, j, hb: bytes, *, tensors_from_region=True):
        """Give tensor file j the header ``hb`` (carried by a HEADER record),
        updating header_digest, header_size, size and, when it parses, the
        tensor digests from the pristine data region."""
        f = self.files[j]
        try:
            region = self.region(j)
        except Skip:
            region = None
        dlen = f["size"] - f["header_size"]
        f["header_digest"] = sb.H(hb).hex()
        f["header_size"] = len(hb)
        f["size"] = len(hb) + dlen
        if tensors_from_region and region is not None:
            try:
                h = sb.parse_st(hb, f["size"])
                f["tensors"] = [sb.D(region[t.begin:t.end]).hex() for t in h.tensors]
            except sb._NotStrict:
                pass
        rec = next((r for r in self.b.records if r.type == sb.HEADER and r.file == j), None)
        if rec is None:
            f["source"] = "bundle"
            rec = sb.Rec(sb.HEADER, sb.ZSTD, 1, 0, j, 0, 0, 0, sb.ZERO, sb.ZERO, [b"", b"", b""])
            first = next((k for k, r in enumerate(self.b.records) if r.file >= j), len(self.b.records))
            self.b.records.insert(first, rec)
        rec.hi, rec.sections, rec.target, rec.lens = len(hb), [sb.Z(hb), b"", b""], sb.H(hb), None

    def set_file(self, j, content: bytes):
        """Give companion file j the content ``content`` (a FILE record)."""
        f = self.files[j]
        f["size"], f["digest"] = len(content), sb.D(content).hex()
        rec = next((r for r in self.b.records if r.type == sb.FILE and r.file == j), None)
        if rec is None:
            f["source"] = "bundle"
            rec = sb.Rec(sb.FILE, sb.ZSTD, 1, 0, j, 0, 0, 0, sb.ZERO, sb.ZERO, [b"", b"", b""])
            first = next((k for k, r in enumerate(self.b.records) if r.file > j), len(self.b.records))
            self.b.records.insert(first, rec)
        rec.hi, rec.sections, rec.target, rec.lens = len(content), [sb.Z(content), b"", b""], sb.D(content), None

    def header_json(self, j):
        hb, h = self.header(j)
        n = struct.unpack_from("<Q", hb)[0]
        return json.loads(hb[8:8 + n], object_pairs_hook=lambda p: dict(p)), hb

    @staticmethod
    def st_header(obj, pad: bytes = b" ", align: int = 8) -> bytes:
        text = json.dumps(obj, separators=(",", ":")).encode()
        if align:
            text += pad * (-(8 + len(text)) % align)
        return struct.pack("<Q", len(text)) + text


# -- the mutations -----------------------------------------------------------------------------

MUTATIONS: dict[str, tuple] = {}


def mutation(name, weight=1.0):
    def deco(fn):
        MUTATIONS[name] = (fn, weight)
        return fn
    return deco


BIG = [0, 1, 2, 3, 7, 8, 255, 256, 65535, 1 << 20, (1 << 20) + 1, (1 << 26), (1 << 26) + 1, (1 << 31),
       (1 << 32) - 1, 1 << 32, (1 << 62) - 1, 1 << 62, (1 << 62) + 1, (1 << 63), (1 << 64) - 1]


def _num(ctx, v, word=1):
    c = ctx.rng.random()
    if c < 0.35:
        return max(0, v + ctx.rng.choice([-1, 1, -word, word, -2, 2]))
    if c < 0.5:
        return max(0, v + ctx.rng.choice([-1, 1]) * ctx.rng.choice([8, 64, 1 << 20, 1 << 22]))
    return ctx.rng.choice(BIG)


# record header fields
@mutation("rec.type")
def m_type(ctx):
    ctx.b.records[ctx.pick_rec()].type = ctx.rng.choice([0, 1, 2, 3, 4, 255])


@mutation("rec.codec", 2)
def m_codec(ctx):
    r = ctx.b.records[ctx.pick_rec()]
    r.codec = ctx.rng.choice([c for c in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 255) if c != r.codec])


@mutation("rec.word", 1.5)
def m_word(ctx):
    r = ctx.b.records[ctx.pick_rec()]
    r.word = ctx.rng.choice([w for w in (0, 1, 2, 3, 4, 8, 16) if w != r.word])


@mutation("rec.param", 1.5)
def m_param(ctx):
    r = ctx.b.records[ctx.pick_rec()]
    r.param = ctx.rng.choice([0, 1, r.param + 1, max(0, r.param - 1), 39, 40, 41, 63, 64, 200, 255])


@mutation("rec.file", 1.5)
def m_file(ctx):
    r = ctx.b.records[ctx.pick_rec()]
    r.file = ctx.rng.choice([0, max(0, r.file - 1), r.file + 1, len(ctx.files) - 1, len(ctx.files), (1 << 32) - 1])


@mutation("rec.reserved", 0.5)
def m_reserved(ctx):
    ctx.b.records[ctx.pick_rec()].reserved = ctx.rng.choice([1, 1 << 31, (1 << 32) - 1])


@mutation("rec.magic", 0.3)
def m_magic(ctx):
    ctx.b.records[ctx.pick_rec()].magic = ctx.rng.choice([b"WREc", b"\0\0\0\0", b"WUND"])


@mutation("rec.lo", 2)
def m_lo(ctx):
    r = ctx.b.records[ctx.pick_rec()]
    r.lo = _num(ctx, r.lo, r.word)


@mutation("rec.hi", 2)
def m_hi(ctx):
    r = ctx.b.records[ctx.pick_rec()]
    r.hi = _num(ctx, r.hi, r.word)


@mutation("rec.lo_hi_shift", 1.5)
def m_shift(ctx):
    """Move the record's range by a word, a tensor or a block, keeping its length."""
    r = ctx.b.records[ctx.pick_rec(sb.CHUNK)]
    d = ctx.rng.choice([r.word, -r.word, 1, -1, 1 << 20, -(1 << 20), r.hi - r.lo, r.lo - r.hi])
    if r.lo + d < 0:
        raise Skip
    r.lo, r.hi = r.lo + d, r.hi + d


@mutation("rec.count", 2)
def m_count(ctx):
    r = ctx.b.records[ctx.pick_rec()]
    n = (r.hi - r.lo) // max(r.word, 1)
    r.count = ctx.rng.choice([0, max(0, r.count - 1), r.count + 1, n, n + 1, 1 << 32, 1 << 62, (1 << 62) + 1,
                              (1 << 64) - 1])


@mutation("rec.lens", 2)
def m_lens(ctx):
    """Lie about len0..len2: move the boundaries between sections, or claim
    more or less payload than there is."""
    r = ctx.b.records[ctx.pick_rec()]
    lens = [len(s) for s in r.sections]
    c = ctx.rng.random()
    total = sum(lens)
    if c < 0.5 and total:
        a = ctx.rng.randrange(0, total + 1)
        b2 = ctx.rng.randrange(a, total + 1)
        lens = [a, b2 - a, total - b2]
        payload = r.payload()
        r.sections = [payload[:a], payload[a:b2], payload[b2:]]
        return
    k = ctx.rng.randrange(3)
    lens[k] = _num(ctx, lens[k])
    r.lens = tuple(lens)


@mutation("rec.base_digest", 1.5)
def m_base(ctx):
    r = ctx.b.records[ctx.pick_rec()]
    r.base = ctx.rng.choice([sb.ZERO, r.target, bytes(ctx.rng.randrange(256) for _ in range(16)), b"\xff" * 16])


@mutation("rec.target_digest", 1)
def m_target(ctx):
    r = ctx.b.records[ctx.pick_rec()]
    r.target = ctx.rng.choice([sb.ZERO, r.base, bytes(ctx.rng.randrange(256) for _ in range(16))])


# the record list
@mutation("records.drop", 1.5)
def m_drop(ctx):
    del ctx.b.records[ctx.pick_rec()]


@mutation("records.duplicate", 1.5)
def m_dup(ctx):
    i = ctx.pick_rec()
    ctx.b.records.insert(i + ctx.rng.choice([0, 1]), ctx.b.records[i].copy())


@mutation("records.swap", 1.5)
def m_swap(ctx):
    if len(ctx.b.records) < 2:
        raise Skip
    i = ctx.rng.randrange(len(ctx.b.records) - 1)
    j = i + 1 if ctx.rng.random() < 0.6 else ctx.rng.randrange(len(ctx.b.records))
    rs = ctx.b.records
    rs[i], rs[j] = rs[j], rs[i]


@mutation("records.reverse", 0.5)
def m_reverse(ctx):
    ctx.b.records.reverse()


@mutation("records.foreign", 1.5)
def m_foreign(ctx):
    """Splice in a record of another bundle of the same checkpoints (another
    writer's encoding of the same chunk, or of another one)."""
    others = [sb.parse(d) for lbl, d in ctx.sc.bundles]
    pool = [r for o in others for r in o.records]
    r = ctx.rng.choice(pool).copy()
    c = ctx.rng.random()
    if c < 0.5:  # replace the record for the same spot
        same = [k for k, q in enumerate(ctx.b.records) if q.type == r.type and q.file == r.file]
        if same:
            ctx.b.records[ctx.rng.choice(same)] = r
            return
    ctx.b.records.insert(ctx.rng.randrange(len(ctx.b.records) + 1), r)


@mutation("records.gap", 0.5)
def m_gap(ctx):
    ctx.b.gap = ctx.rng.choice([b"\0", b"\0" * 112, b"WREC" + b"\0" * 108, b"x" * 7])


@mutation("records.split", 1)
def m_split(ctx):
    """Split a CHUNK in two at a word or block boundary (both re-encoded
    RAW or delta, all digests right): valid only where the pieces still
    follow the coverage rules."""
    i = ctx.pick_rec(sb.CHUNK)
    r, h, cov, old, new = ctx.chunk(i)
    n = (r.hi - r.lo) // r.word
    if n < 2:
        raise Skip
    cut = ctx.rng.choice([ctx.rng.randrange(1, n) * r.word, min(1 << 20, r.hi - r.lo - r.word)]
                         + [t.end - r.lo for t in cov[:-1]])
    if not 0 < cut < r.hi - r.lo:
        raise Skip
    r2 = r.copy()
    r.hi = r.lo + cut
    r2.lo = r.hi
    ctx.b.records.insert(i + 1, r2)
    for k, (lo, hi) in ((i, (r.lo, r.hi)), (i + 1, (r2.lo, r2.hi))):
        q = ctx.b.records[k]
        cv = [t for t in h.tensors if t.nbytes and t.begin < hi and t.end > lo]
        o = None if old is None else old[lo - (r.lo):hi - r.lo]
        nw = new[lo - r.lo:hi - r.lo]
        codec = q.codec if o is not None and o != nw else sb.RAW
        param, count, secs = sb.encode_chunk(codec, o, nw, q.word)
        q.codec, q.param, q.count, q.sections, q.lens = codec, param, count, secs, None
        q.base = sb._chunk_digest(cv, lo, hi, o) if o is not None else sb.ZERO
        q.target = sb._chunk_digest(cv, lo, hi, nw)


@mutation("records.merge", 0.7)
def m_merge(ctx):
    """Merge two adjacent CHUNK records of one file into one record."""
    idx = ctx.recs(sb.CHUNK)
    pairs = [(a, b) for a, b in zip(idx, idx[1:]) if b == a + 1 and ctx.b.records[a].file == ctx.b.records[b].file]
    if not pairs:
        raise Skip
    a, b2 = ctx.rng.choice(pairs)
    ra, ha, cova, olda, newa = ctx.chunk(a)
    rb, hb_, covb, oldb, newb = ctx.chunk(b2)
    lo, hi = ra.lo, rb.hi
    region = bytearray(ctx.region(ra.file))
    region[ra.lo:ra.hi], region[rb.lo:rb.hi] = newa, newb
    new = bytes(region[lo:hi])
    cov = [t for t in ha.tensors if t.nbytes and t.begin < hi and t.end > lo]
    old = ctx.base_bytes(cov, lo, hi)
    codec = ra.codec if old is not None and old != new else sb.RAW
    param, count, secs = sb.encode_chunk(codec, old, new, ra.word)
    ra.hi, ra.codec, ra.param, ra.count, ra.sections, ra.lens = hi, codec, param, count, secs, None
    ra.base = sb._chunk_digest(cov, lo, hi, old) if old is not None and ra.base != sb.ZERO else sb.ZERO
    ra.target = sb._chunk_digest(cov, lo, hi, new)
    del ctx.b.records[b2]


# codecs, re-encoded (valid unless the codec cannot carry it)
@mutation("codec.reencode", 2.5)
def m_reencode(ctx):
    i = ctx.pick_rec(sb.CHUNK)
    r, h, cov, old, new = ctx.chunk(i)
    codec = ctx.rng.choice([sb.RAW, sb.SPARSE, sb.BITMAP, sb.DENSE])
    rparam = ctx.rng.choice([None, 0, 1, 5, 12, 20, 31, 40]) if codec == sb.SPARSE else None
    ctx.set_chunk(i, codec, new, rparam=rparam, h=h, cov=cov, old=old, update_index=False)
    if codec == sb.RAW:
        pass  # RAW over base-sourced tensors keeps its base digest


@mutation("codec.retarget", 3)
def m_retarget(ctx):
    """Change what a chunk produces and restate the target to match: a
    hostile but consistent bundle, which must give exactly the new bytes."""
    i = ctx.pick_rec(sb.CHUNK)
    r, h, cov, old, new = ctx.chunk(i)
    a = bytearray(new)
    for _ in range(ctx.rng.choice([1, 1, 3, 50])):
        a[ctx.rng.randrange(len(a))] ^= 1 << ctx.rng.randrange(8)
    a = bytes(a)
    codec = r.codec if (old is not None and old != a) or r.codec == sb.RAW else sb.RAW
    ctx.set_chunk(i, codec, a, h=h, cov=cov, old=old)


@mutation("codec.sparse_rice", 2)
def m_rice(ctx):
    """Rice parameter: state another one without re-encoding, or re-encode
    with an extreme one."""
    i = ctx.pick_rec(sb.CHUNK, sb.SPARSE)
    r = ctx.b.records[i]
    if ctx.rng.random() < 0.5:
        r.param = ctx.rng.choice([0, 1, 2, 40, 41, 64, 255, r.param + 1, max(r.param - 1, 0)])
    else:
        _, h, cov, old, new = ctx.chunk(i)
        ctx.set_chunk(i, sb.SPARSE, new, rparam=ctx.rng.choice([0, 30, 40]), h=h, cov=cov, old=old,
                      update_index=False)


@mutation("codec.sparse_streams", 2)
def m_sparse_streams(ctx):
    """Unary and remainder streams that break the rules: extra or missing
    1 bits, wrong lengths, set padding, gaps past n."""
    i = ctx.pick_rec(sb.CHUNK, sb.SPARSE)
    r = ctx.b.records[i]
    u, m, v = r.sections
    c = ctx.rng.randrange(9)
    if c == 0:
        u = u + b"\0"
    elif c == 1:
        u = u[:-1]
    elif c == 2 and u:
        k = ctx.rng.randrange(len(u))
        u = u[:k] + bytes([u[k] ^ (1 << ctx.rng.randrange(8))]) + u[k + 1:]
    elif c == 3:
        m = m + b"\0"
    elif c == 4 and m:
        m = m[:-1] + bytes([m[-1] | 1])
    elif c == 5:
        u = b"\0" * 64 + u  # q_1 grows by 512: positions shift past n
    elif c == 6:
        u = u + b"\x80"  # one more position
        r.count += 1
    elif c == 7:
        u = b"\x80" * r.count  # all gaps of 7 * 2^r + m
    else:
        u = b"\xff" * ((r.count + 7) // 8)  # consecutive positions
    r.sections = [u, m, v]


@mutation("codec.bitmap", 1.5)
def m_bitmap(ctx):
    i = ctx.pick_rec(sb.CHUNK, sb.BITMAP)
    r = ctx.b.records[i]
    if r.word not in (1, 2, 4, 8) or not 0 < r.hi - r.lo <= sb.MAX_CHUNK_BYTES:
        raise Skip
    n = (r.hi - r.lo) // r.word
    bm = sb.unZ(r.sections[0], (n + 7) // 8)
    c = ctx.rng.randrange(5)
    if c == 0:
        bm = bm + b"\0"
    elif c == 1:
        bm = bm[:-1]
    elif c == 2:
        bm = bm[:-1] + bytes([bm[-1] | 1]) if n % 8 else bm
        if n % 8 == 0:
            raise Skip
    elif c == 3:
        k = ctx.rng.randrange(len(bm))
        bm = bm[:k] + bytes([bm[k] ^ (1 << ctx.rng.randrange(8))]) + bm[k + 1:]
    else:
        bm = b"\xff" * len(bm)
    r.sections[0] = sb.Z(bm)


@mutation("codec.zero_xor", 1.5)
def m_zero_xor(ctx):
    """A listed position whose X word is zero (a change that changes nothing)."""
    i = ctx.pick_rec(sb.CHUNK, (sb.SPARSE, sb.BITMAP))
    r, h, cov, old, new = ctx.chunk(i)
    w, n = r.word, (r.hi - r.lo) // r.word
    x = sb.xor(old, new)
    pos = sb.changed_positions(x, w)
    if len(pos) >= n:
        raise Skip
    taken = set(pos)
    extra = next(p for p in iter(lambda: ctx.rng.randrange(n), None) if p not in taken)
    pos2 = sorted(pos + [extra])
    X = sb.pick_words(x, w, pos2)
    if r.codec == sb.SPARSE:
        u, m = sb.rice_encode(pos2, r.param)
        r.sections = [u, m, sb.Z(sb.P(X, w))]
    else:
        r.sections = [sb.Z(sb.bitmap_encode(pos2, n)), sb.Z(sb.P(X, w)), b""]
    r.count = len(pos2)


@mutation("codec.dense_count", 1)
def m_dense_count(ctx):
    r = ctx.b.records[ctx.pick_rec(sb.CHUNK, sb.DENSE)]
    n = (r.hi - r.lo) // r.word
    r.count = ctx.rng.choice([0, r.count - 1, r.count + 1, n, n + 1])


@mutation("codec.noop_delta", 1)
def m_noop(ctx):
    """A delta record that changes nothing (count 0, or DENSE of zeros)."""
    i = ctx.pick_rec(sb.CHUNK)
    r, h, cov, old, new = ctx.chunk(i)
    if old is None:
        raise Skip
    n = (r.hi - r.lo) // r.word
    c = ctx.rng.randrange(3)
    if c == 0:
        r.codec, r.param, r.count, r.sections = sb.DENSE, 0, 0, [sb.Z(bytes(n * r.word)), b"", b""]
    elif c == 1:
        r.codec, r.param, r.count, r.sections = sb.SPARSE, 0, 0, [b"", b"", sb.Z(b"")]
    else:
        r.codec, r.param, r.count, r.sections = sb.BITMAP, 0, 0, [sb.Z(bytes((n + 7) // 8)), sb.Z(b""), b""]
    r.target = r.base


@mutation("codec.raw_unchanged", 0.7)
def m_raw_unchanged(ctx):
    """A RAW record over base-sourced tensors carrying the base bytes (the
    target claims the base bytes): valid; changes nothing."""
    i = ctx.pick_rec(sb.CHUNK)
    r, h, cov, old, new = ctx.chunk(i)
    if old is None:
        raise Skip
    ctx.set_chunk(i, sb.RAW, old, h=h, cov=cov, old=old)


# zstd frames
def _pick_section(ctx):
    i = ctx.pick_rec()
    r = ctx.b.records[i]
    used = [k for k, s in enumerate(r.sections) if s[:4] == b"\x28\xb5\x2f\xfd"]
    if not used:
        raise Skip
    k = ctx.rng.choice(used)
    content = zstd_content(r.sections[k])
    return r, k, content


def zstd_content(frame: bytes) -> bytes:
    """What a section decompresses to (at most 64 MiB), or Skip when an
    earlier mutation of a stack left no usable frame there."""
    import zstandard

    try:
        with zstandard.ZstdDecompressor().stream_reader(frame, read_across_frames=False) as rd:
            out = rd.read(sb.MAX_CHUNK_BYTES + 1)
    except zstandard.ZstdError:
        raise Skip from None
    if len(out) > sb.MAX_CHUNK_BYTES:
        raise Skip
    return out


@mutation("zstd.declared_size", 2)
def m_zstd_declared(ctx):
    """Frames declaring a huge, missing or slightly wrong content size."""
    r, k, content = _pick_section(ctx)
    m = len(content)
    c = ctx.rng.randrange(6)
    if c == 0:
        r.sections[k] = zframe(ctx.rng.choice([1 << 40, (1 << 62), (1 << 64) - 2, 1 << 31]), raw_blocks(content),
                               single=False)
    elif c == 1:
        r.sections[k] = zframe(None, raw_blocks(content), single=False)
    elif c == 2:
        r.sections[k] = zframe(m + ctx.rng.choice([-1, 1]) if m else 1, raw_blocks(content), single=False)
    elif c == 3:  # declares m, holds less
        r.sections[k] = zframe(m, raw_blocks(content[:-1] if content else b""), single=False)
    elif c == 4:  # declares m, holds more
        r.sections[k] = zframe(m, raw_blocks(content + b"\0"), single=False)
    else:  # declares m, unrolls to 256 MiB of RLE blocks
        r.sections[k] = zframe(m, [("rle", 0, 1 << 17)] * 2048, single=False)


@mutation("zstd.frames", 2)
def m_zstd_frames(ctx):
    """Valid and invalid framings of the same bytes: checksums, skippable
    frames after the frame, two frames, dictionaries, huge windows, garbage."""
    import zstandard

    r, k, content = _pick_section(ctx)
    m = len(content)
    c = ctx.rng.randrange(9)
    if c == 0:  # checksum: MAY be included
        r.sections[k] = zstandard.ZstdCompressor(write_checksum=True).compress(content)
    elif c == 1:  # a skippable frame after it: tolerated
        r.sections[k] = r.sections[k] + SKIPPABLE
    elif c == 2:  # two frames with content, the first declaring all of it
        h = m // 2
        r.sections[k] = zframe(m, raw_blocks(content[:h]), single=False) + sb.Z(content[h:])
    elif c == 3:
        r.sections[k] = zframe(m, raw_blocks(content), single=False, dict_id=ctx.rng.choice([1, 0xdeadbeef]))
    elif c == 4:
        r.sections[k] = zframe(m, raw_blocks(content, 1 << 17), single=False, window_log=ctx.rng.choice([27, 30, 31]))
    elif c == 5:
        r.sections[k] = r.sections[k] + b"\0garbage"
    elif c == 6:  # an empty frame after it: decompresses to nothing
        r.sections[k] = r.sections[k] + sb.Z(b"")
    elif c == 7:
        r.sections[k] = zframe(m, raw_blocks(content), single=False, checksum=b"\0\0\0\0")  # wrong checksum
    else:  # recompressed at another level: valid
        r.sections[k] = sb.Z(content, ctx.rng.choice([-5, 1, 9, 19]))


@mutation("zstd.not_zstd", 0.7)
def m_not_zstd(ctx):
    r, k, content = _pick_section(ctx)
    r.sections[k] = ctx.rng.choice([content, b"", b"\x28\xb5\x2f\xfd", r.sections[k][:-1], SKIPPABLE])


# companion files and headers, consistently restated
@mutation("file.content", 2)
def m_file_content(ctx):
    comp = [j for j, f in enumerate(ctx.files) if f["kind"] == "file"]
    if not comp:
        raise Skip
    j = ctx.rng.choice(comp)
    ctx.set_file(j, ctx.rng.choice([b"", b"changed", b"\0" * 5000, ctx.rng.randbytes(3000), b"{\"a\": 1}"]))


@mutation("file.kind_confusion", 0.6)
def m_kind_confusion(ctx):
    """A companion file at a *.safetensors path whose bytes are a strict
    tensor file: the kind the index states is not the kind of the bytes."""
    comp = [j for j, f in enumerate(ctx.files) if f["kind"] == "file"]
    if not comp:
        raise Skip
    j = ctx.rng.choice(comp)
    name = ctx.rng.choice(["kc_unique", "kc_other"])
    ctx.set_file(j, sb.write_st([(name, "U8", (4,), b"abcd")]))
    if not ctx.files[j]["path"].endswith(".safetensors"):
        ctx.rename(j, ctx.files[j]["path"] + ".safetensors")


@mutation("file.size", 1.5)
def m_file_size(ctx):
    j = ctx.rng.randrange(len(ctx.files))
    f = ctx.files[j]
    f["size"] = _num(ctx, f["size"])
    if ctx.rng.random() < 0.5:
        for r in ctx.b.records:
            if r.file == j and r.type == sb.FILE:
                r.hi = f["size"]


@mutation("index.source", 1.5)
def m_source(ctx):
    j = ctx.rng.randrange(len(ctx.files))
    f = ctx.files[j]
    f["source"] = "base" if f["source"] == "bundle" else "bundle"
    if ctx.rng.random() < 0.5:  # and drop its record, as a consistent writer would
        ctx.b.records = [r for r in ctx.b.records if not (r.file == j and r.type in (sb.FILE, sb.HEADER))]


@mutation("index.kind", 1)
def m_kind(ctx):
    j = ctx.rng.randrange(len(ctx.files))
    f = ctx.files[j]
    if f["kind"] == "file":
        f["kind"] = "safetensors"
        f["header_digest"], f["header_size"], f["tensors"] = sb.H(b"").hex(), 10, []
    else:
        f["kind"] = "file"
        for k in ("header_digest", "header_size", "tensors"):
            del f[k]


@mutation("index.tensors", 2)
def m_tensors(ctx):
    j = ctx.rng.choice(ctx.tensor_files())
    t = ctx.files[j]["tensors"]
    c = ctx.rng.randrange(5)
    if c == 0 and t:
        t[ctx.rng.randrange(len(t))] = ctx.rng.randbytes(16).hex()
    elif c == 1 and t:
        del t[ctx.rng.randrange(len(t))]
    elif c == 2:
        t.insert(ctx.rng.randrange(len(t) + 1), sb.H(b"").hex())
    elif c == 3 and len(t) > 1:
        a, b2 = ctx.rng.sample(range(len(t)), 2)
        t[a], t[b2] = t[b2], t[a]
    else:
        t.reverse()


@mutation("index.header_size", 1.5)
def m_header_size(ctx):
    j = ctx.rng.choice(ctx.tensor_files())
    f = ctx.files[j]
    f["header_size"] = ctx.rng.choice([0, 9, 10, f["header_size"] - 8, f["header_size"] - 1, f["header_size"] + 1,
                                       f["header_size"] + 8, f["size"], f["size"] + 1])
    if ctx.rng.random() < 0.5:
        for r in ctx.b.records:
            if r.file == j and r.type == sb.HEADER:
                r.hi = f["header_size"]


@mutation("index.header_digest", 0.7)
def m_header_digest(ctx):
    j = ctx.rng.choice(ctx.tensor_files())
    f = ctx.files[j]
    f["header_digest"] = ctx.rng.randbytes(16).hex()
    if ctx.rng.random() < 0.5:
        for r in ctx.b.records:
            if r.file == j and r.type == sb.HEADER:
                r.target = bytes.fromhex(f["header_digest"])


EVIL_PATHS = [
    "../evil.json", "../../evil.json", "a/../../evil.json", "./x.json", "a//b.json", "a/./b.json", "/tmp/evil.json",
    "evil\x00.json", "a\\..\\evil.json", ".wdiff/lock", ".git/config", ".cache/x", ".wdiff", "sub/.wdiff/x",
    "x\n.json", "x\x7f", "x\u0085y", "\ud800.json", "caf\u00e9.json", "CONFIG.JSON", "a" * 255, "a" * 256,
    "/".join(["d"] * 40) + "/x", "x/", "", " ", "..", ".", "\u2028", "e\u0301.json", "nul\u0000",
]


@mutation("path.evil", 3)
def m_path(ctx):
    j = ctx.rng.randrange(len(ctx.files))
    f = ctx.files[j]
    p = ctx.rng.choice(EVIL_PATHS + [f["path"].upper(), f["path"] + "/x", f["path"].rsplit("/", 1)[0] + "/../"
                                     + f["path"].rsplit("/", 1)[-1]])
    if f["kind"] == "safetensors" and ctx.rng.random() < 0.7 and not p.endswith(".safetensors"):
        p += ".safetensors"
    if ctx.rng.random() < 0.8:
        ctx.rename(j, p)
    else:
        f["path"] = p


@mutation("path.duplicate", 1.5)
def m_path_dup(ctx):
    """Two entries with one path, a file below another, a case clash."""
    if len(ctx.files) < 2:
        raise Skip
    a, b2 = ctx.rng.sample(range(len(ctx.files)), 2)
    pa = ctx.files[a]["path"]
    c = ctx.rng.randrange(3)
    new = pa if c == 0 else (pa + "/inner" + (".safetensors" if ctx.files[b2]["kind"] == "safetensors" else "")
                             if c == 1 else pa.swapcase())
    if new == pa and c == 2:
        raise Skip
    ctx.rename(b2, new)


@mutation("path.rename", 1.5)
def m_path_rename(ctx):
    """A valid rename (the target simply has another name)."""
    j = ctx.rng.randrange(len(ctx.files))
    f = ctx.files[j]
    stem = ctx.rng.choice(["renamed", "zz/renamed", "\u00e9t\u00e9/r", "A", "0"])
    ctx.rename(j, stem + (".safetensors" if f["kind"] == "safetensors" else ".bin"))


@mutation("base.rows", 2)
def m_base_rows(ctx):
    base = ctx.b.index["base"]
    if base is None or not base["files"]:
        raise Skip
    rows = base["files"]
    k = ctx.rng.randrange(len(rows))
    c = ctx.rng.randrange(6)
    if c == 0:
        rows[k][2] = _num(ctx, rows[k][2])
    elif c == 1:
        rows[k][3] = ctx.rng.randbytes(16).hex()
    elif c == 2:
        rows[k][1] = "file" if rows[k][1] == "safetensors" else "safetensors"
    elif c == 3:
        del rows[k]
    elif c == 4:
        rows.insert(k, ["aaa-extra.json", "file", 3, sb.D(b"abc").hex()])
        rows.sort(key=lambda r: sb.path_key(r[0]))
    else:
        rows[k][0] = ctx.rng.choice(EVIL_PATHS)
        rows.sort(key=lambda r: Ctx._key(r[0]))


@mutation("base.fingerprint", 0.7)
def m_base_fp(ctx):
    base = ctx.b.index["base"]
    if base is None:
        raise Skip
    return ("nofix", lambda: base.__setitem__("fingerprint", ctx.rng.randbytes(16).hex()))


@mutation("base.null", 1)
def m_base_null(ctx):
    """A delta turned anchor (or an anchor given a base)."""
    if ctx.b.index["base"] is None:
        ctx.b.index["base"] = {"files": [], "fingerprint": sb.fingerprint([]).hex()}
        return
    ctx.b.index["base"] = None
    if ctx.rng.random() < 0.5:
        for f in ctx.files:
            f["source"] = "bundle"
        for r in ctx.b.records:
            if r.type == sb.CHUNK:
                r.base = sb.ZERO


@mutation("base.self", 0.5)
def m_base_self(ctx):
    """The index claims the target is the base (same fingerprint)."""
    if ctx.b.index["base"] is None:
        raise Skip
    ctx.b.index["base"]["files"] = [[f["path"], f["kind"], f["size"], f["digest"]] for f in ctx.files]


# headers, restated consistently
@mutation("header.edit", 4)
def m_header(ctx):
    j = ctx.rng.choice(ctx.tensor_files())
    obj, hb = ctx.header_json(j)
    names = [k for k in obj if k != "__metadata__"]
    if not names:
        raise Skip
    t = ctx.rng.choice(names)
    c = ctx.rng.randrange(22)
    other = [n for f in ctx.files if f["kind"] == "safetensors" for n in _names(ctx, f)]
    if c == 0:
        obj[t + "_renamed"] = obj.pop(t)
    elif c == 1:
        obj[ctx.rng.choice(other) if other else t] = obj.pop(t)  # maybe a name of another file
    elif c == 2:
        same = {"F32": "I32", "I32": "U32", "BF16": "F16", "F16": "BF16", "U8": "I8", "F64": "I64", "C64": "U64"}
        obj[t]["dtype"] = same.get(obj[t]["dtype"], "U8")
    elif c == 3:
        obj[t]["dtype"] = ctx.rng.choice(["U8", "F64", "F4", "UNKNOWN", "", "X" * 33, 7, None])
    elif c == 4:
        sh = obj[t]["shape"]
        n = 1
        for d in sh:
            n *= d
        obj[t]["shape"] = ctx.rng.choice([[n], [1, n], list(reversed(sh)), sh + [1], [n, 0], [-1], [2.0], [True],
                                         [1] * 65, None])
    elif c == 5:
        b0, e0 = obj[t]["data_offsets"]
        obj[t]["data_offsets"] = ctx.rng.choice([[b0, e0 + 1], [b0 + 1, e0], [e0, b0], [b0, e0, 0], [b0], [-1, e0],
                                                [float(b0), e0], [b0, 1 << 62]])
    elif c == 6 and len(names) > 1:  # swap two tensors' places in the data region
        u = ctx.rng.choice([n for n in names if n != t])
        obj[t]["data_offsets"], obj[u]["data_offsets"] = obj[u]["data_offsets"], obj[t]["data_offsets"]
    elif c == 7:
        obj["__metadata__"] = ctx.rng.choice([{"k": "v" * 1000}, {}, None, {"k": 1}, [], "x"])
    elif c == 8:
        obj[t]["extra"] = 1
    elif c == 9:
        del obj[t]
    elif c == 10:
        obj["zz_new"] = {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}  # an empty tensor: valid
    elif c == 11:  # pad with whitespace JSON allows: valid
        return ctx.set_header(j, Ctx.st_header(obj, pad=ctx.rng.choice([b" ", b"\n", b"\t", b"\r"]), align=64))
    elif c == 12:  # leading whitespace: not strict
        text = b" " + json.dumps(obj, separators=(",", ":")).encode()
        return ctx.set_header(j, struct.pack("<Q", len(text)) + text)
    elif c == 13:  # duplicate member
        text = json.dumps(obj, separators=(",", ":")).encode()
        text = text[:-1] + b"," + json.dumps(t).encode() + b":" + json.dumps(obj[t]).encode() + b"}"
        return ctx.set_header(j, struct.pack("<Q", len(text)) + text)
    elif c == 14:  # NaN, trailing junk, a list, deep nesting
        text = ctx.rng.choice([b'{"a":NaN}', json.dumps(obj).encode() + b"x", b"[]", b"{" * 3 + b"}" * 3,
                               b'{"__metadata__":' + b"[" * 50000 + b"]" * 50000 + b"}"])
        return ctx.set_header(j, struct.pack("<Q", len(text)) + text)
    elif c == 15:  # a length prefix that runs past the file, or below 2
        obj_text = json.dumps(obj).encode()
        n = ctx.rng.choice([0, 1, len(obj_text) + (1 << 30)])
        return ctx.set_header(j, struct.pack("<Q", n) + obj_text, tensors_from_region=False)
    elif c == 16:  # 8 MiB of padding: valid, slow?
        pass
    elif c == 17:  # unicode / surrogate names
        obj[ctx.rng.choice(["\ud800", "\u0000x", "a" * 4097, "\u00e9" * 2048, "\U0001f600"])] = obj.pop(t)
    elif c == 18:  # dtype of another word size with the same bytes
        b0, e0 = obj[t]["data_offsets"]
        obj[t]["dtype"], obj[t]["shape"] = ctx.rng.choice([("U8", [e0 - b0]), ("F64", [(e0 - b0) // 8]),
                                                         ("I16", [(e0 - b0) // 2])])
    elif c == 19:  # 65 dims or huge dims
        obj[t]["shape"] = ctx.rng.choice([[1] * 64 + [obj[t]["shape"][0] if obj[t]["shape"] else 1],
                                          [1 << 62, 0], [1 << 64]])
    elif c == 20:  # many empty tensors
        for k in range(ctx.rng.choice([10, 1000])):
            obj[f"e{k}"] = {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
    else:  # a tensor that takes the whole data region with an unknown dtype
        total = max(e for b0, e in (obj[n]["data_offsets"] for n in names))
        for n in names:
            del obj[n]
        obj["blob"] = {"dtype": "BLOB", "shape": [], "data_offsets": [0, total]}
    hb2 = Ctx.st_header(obj)
    if c == 16:
        text = hb2[8:] + b" " * (8 << 20)
        hb2 = struct.pack("<Q", len(text)) + text
    ctx.set_header(j, hb2)


def _names(ctx, f):
    try:
        j = ctx.files.index(f)
        return [t.name for t in ctx.header(j)[1].tensors]
    except Exception:  # noqa: BLE001
        return []


@mutation("header.data_region", 1)
def m_data_region(ctx):
    """Grow or shrink a tensor file's data region (size) with the header
    restating a tensor to match, with or without records to cover it."""
    j = ctx.rng.choice(ctx.tensor_files())
    obj, hb = ctx.header_json(j)
    names = [k for k in obj if k != "__metadata__"]
    end = max([obj[n]["data_offsets"][1] for n in names] or [0])
    extra = ctx.rng.choice([1, 8, 1 << 20, (1 << 26) + 8, 1 << 40])
    obj["zz_grow"] = {"dtype": "U8", "shape": [extra], "data_offsets": [end, end + extra]}
    hb2 = Ctx.st_header(obj)
    f = ctx.files[j]
    f["size"] += extra
    ctx.set_header(j, hb2, tensors_from_region=False)
    f["tensors"] = f["tensors"] + [sb.D(bytes(extra)).hex() if extra <= (1 << 20) else ctx.rng.randbytes(16).hex()]
    if extra <= (1 << 20) and ctx.rng.random() < 0.6:  # cover it with a RAW record
        hb3, h = ctx.header(j)
        t = next(t for t in h.tensors if t.name == "zz_grow")
        new = bytes(extra)
        rec = sb.Rec(sb.CHUNK, sb.RAW, 1, 0, j, t.begin, t.end, 0, sb.ZERO, sb._chunk_digest([t], t.begin, t.end, new),
                     [sb.Z(new), b"", b""])
        last = max([k for k, r in enumerate(ctx.b.records) if r.file == j] or [-1])
        ctx.b.records.insert(last + 1, rec)


# the index as a whole
@mutation("index.members", 1.5)
def m_members(ctx):
    ix = ctx.b.index
    c = ctx.rng.randrange(10)
    if c == 0:
        ix["extra"] = 1
    elif c == 1:
        del ix[ctx.rng.choice(list(ix))]
    elif c == 2:
        ix["version"] = ctx.rng.choice([0, 2, True, 1.0, "1"])
    elif c == 3:
        ix["block_size"] = ctx.rng.choice([1 << 19, 1 << 21, 0, True])
    elif c == 4:
        ix["writer"] = ctx.rng.choice(["", "\u00e9" * 1000, None, 1, "x" * (1 << 20)])
    elif c == 5:
        ix["format"] = "wdiff-chain"
    elif c == 6:
        f = ctx.rng.choice(ctx.files)
        f[ctx.rng.choice(["size", "digest", "path", "kind", "source"])] = ctx.rng.choice([True, None, -1, 1.5, [], "x"])
    elif c == 7:
        ix["records"]["count"] = ctx.rng.choice([0, ix["records"]["count"] + 1, True])
        return "nofix-records"
    elif c == 8:
        ix["target"]["fingerprint"] = ctx.rng.randbytes(16).hex()
        return "nofix"
    else:
        ctx.files.append(dict(ctx.files[-1]))


@mutation("index.encoding", 1)
def m_encoding(ctx):
    """Non-canonical index text: whitespace, key order, escapes, duplicates."""
    raw = sb.canon(ctx.b.index)
    c = ctx.rng.randrange(6)
    if c == 0:
        raw = json.dumps(ctx.b.index, sort_keys=True).encode()
    elif c == 1:
        raw = json.dumps(ctx.b.index, separators=(",", ":")).encode()  # insertion order
    elif c == 2:
        raw = raw + b" "
    elif c == 3:
        raw = raw.replace(b'"format"', b'"\\u0066ormat"', 1)
    elif c == 4:
        raw = raw[:-1] + b',"writer":"again"}'
    else:
        raw = raw.replace(b'"version":1', b'"version":1.0')
    return ("raw-index", raw)


@mutation("footer", 0.7)
def m_footer(ctx):
    c = ctx.rng.randrange(4)
    if c == 0:
        return ("footer", {"index_raw_length": ctx.rng.choice([0, 1, (64 << 20) + 1, (512 << 20) + 1, 1 << 62])})
    if c == 1:
        return ("footer", {"index_offset": ctx.rng.choice([0, 15, 16])})
    if c == 2:
        ctx.b.version = ctx.rng.choice([0, 2, 1 << 31])
    else:
        ctx.b.flags = ctx.rng.choice([1, 1 << 31])


@mutation("index.huge", 0.3)
def m_index_huge(ctx):
    """A big but valid index (a 2 MiB writer string, 300 extra files)."""
    if ctx.rng.random() < 0.5:
        ctx.b.index["writer"] = "w" * (2 << 20)
    else:
        j = len(ctx.files)
        for k in range(300):
            ctx.files.append({"path": f"zzz/f{k:05d}", "kind": "file", "size": 0, "digest": sb.D(b"").hex(),
                              "source": "bundle"})
            ctx.b.records.append(sb.Rec(sb.FILE, sb.ZSTD, 1, 0, j + k, 0, 0, 0, sb.ZERO, sb.D(b""),
                                        [sb.Z(b""), b"", b""]))


# -- version 3: codec v2 and DELTA records -------------------------------------------------------

V2 = sb.V2_CODECS
#: the v1 codec a v2 codec mirrors (same section layout, other meaning), and back
MIRROR = {sb.MSPARSE: sb.SPARSE, sb.MBITMAP: sb.BITMAP, sb.MDENSE: sb.DENSE, sb.CSPARSE: sb.SPARSE,
          sb.CDENSE: sb.DENSE, sb.SPARSE: sb.MSPARSE, sb.BITMAP: sb.MBITMAP, sb.DENSE: sb.MDENSE,
          sb.RSPARSE: sb.CSPARSE}
#: the codecs whose param is a bucket function
BUCKETED = (sb.CSPARSE, sb.CDENSE, sb.RSPARSE)


def _fns(w):
    return [fn for fn, (fw, _, _) in sb.BUCKETS.items() if fw == w]


def _encode_any(ctx, codec, old, new, w, **kw):
    if codec in V2:
        fns = _fns(w)
        if codec in BUCKETED and not fns:
            raise Skip
        return sb.encode_v2(codec, old, new, w, fn=ctx.rng.choice(fns) if fns else None, **kw)
    return sb.encode_chunk(codec, old, new, w, **kw)


def _set_version(ctx, v):
    ctx.b.version = v
    ctx.b.index["version"] = v


@mutation("v3.codec_swap", 2)
def m_v3_codec_swap(ctx):
    """A v2 codec number on v1 sections or the other way (same layout, other
    meaning: XOR against modular difference, plain positions against bucket
    positions), or another v2 codec's number."""
    r = ctx.b.records[ctx.pick_rec(sb.CHUNK, tuple(MIRROR))]
    if ctx.rng.random() < 0.7:
        r.codec = MIRROR[r.codec]
        if r.codec in (sb.CSPARSE, sb.CDENSE) or r.codec in (sb.SPARSE, sb.DENSE):
            pass
    else:
        r.codec = ctx.rng.choice([c for c in V2 + (11, 15, 16, 17) if c != r.codec])
    if r.codec in BUCKETED and r.param not in sb.BUCKETS:
        r.param = ctx.rng.choice(_fns(r.word) or [1])


@mutation("v3.v2_in_old_version", 2)
def m_v3_old_version(ctx):
    """Codec v2 or DELTA records in a bundle that states version 1 or 2
    (preamble and index both, so only the records betray it); or a v1
    bundle re-encoded with a v2 codec."""
    if ctx.b.version >= 3:
        _set_version(ctx, ctx.rng.choice([1, 2]))
        return
    i = ctx.pick_rec(sb.CHUNK)
    r, h, cov, old, new = ctx.chunk(i)
    if old is None or old == new:
        raise Skip
    codec = ctx.rng.choice(V2)
    r.param, r.count, r.sections = _encode_any(ctx, codec, old, new, r.word)
    r.codec, r.lens = codec, None


@mutation("v3.version_up", 1)
def m_v3_version_up(ctx):
    """A v1 bundle restated as version 2 or 3 (valid, by the v2 scoping rule
    on a one-directory tree), or as version 4."""
    _set_version(ctx, ctx.rng.choice([2, 3, 3, 4]))


@mutation("v3.reencode", 2.5)
def m_v3_reencode(ctx):
    """A chunk re-encoded with a random codec v2 (valid in version 3), any
    bucket function of the word size, any complement rule, any Rice r."""
    i = ctx.pick_rec(sb.CHUNK)
    r, h, cov, old, new = ctx.chunk(i)
    if old is None or old == new:
        raise Skip
    codec = ctx.rng.choice(V2)
    kw = {"complement": ctx.rng.choice([0.0, 0.5, 2.0])} if codec in (sb.CSPARSE, sb.RSPARSE) else {}
    if codec == sb.RSPARSE:
        kw.update(sb.rows_of(cov, r.lo, r.hi, r.word, ctx.rng))
    if codec in (sb.MSPARSE, sb.CSPARSE, sb.RSPARSE):
        kw["r"] = ctx.rng.choice([None, 0, 3, 40])
        if codec != sb.MSPARSE:
            kw["rm"] = ctx.rng.choice([None, 0, 40])
    r.param, r.count, r.sections = _encode_any(ctx, codec, old, new, r.word, **kw)
    r.codec, r.lens = codec, None
    if sum(len(s) for s in r.sections) > 2 * (r.hi - r.lo) + 65536:
        pass  # an extreme Rice parameter: the payload bound refuses it


@mutation("v3.bucket_fn", 2)
def m_v3_bucket_fn(ctx):
    """CSPARSE/CDENSE/RSPARSE with another bucket function: one of another word size,
    none (0, 5, 255), or a valid one of the same size stated without
    re-encoding (the positions then lie)."""
    r = ctx.b.records[ctx.pick_rec(sb.CHUNK, BUCKETED)]
    r.param = ctx.rng.choice([p for p in (0, 1, 2, 3, 4, 5, 255) if p != r.param])


def _movers(sec: bytes):
    km, p = sb.read_varint(sec, 0, "")
    rm, p = sb.read_varint(sec, p, "")
    um, p = sb.read_varint(sec, p, "")
    return km, rm, um, p


@mutation("v3.movers_lie", 3)
def m_v3_movers(ctx, codec=None):
    """A mover list that lies: k_m off by one, a mover added or dropped (the
    list re-coded, everything else kept), r_m or u_m wrong, r_m or u_m with
    no movers, r_m above 40 (for RSPARSE, in its CSPARSE part)."""
    i = ctx.pick_rec(sb.CHUNK, codec or BUCKETED)
    r, h, cov, old, new = ctx.chunk(i)
    n = (r.hi - r.lo) // r.word
    rows, n = _row_prefix(r, n)
    s0, s1, s2 = r.sections
    s0 = s0[len(rows):]
    km, rm, um, p = _movers(s0)
    if r.codec != sb.CDENSE:
        mu_end = um + (km * rm + 7) // 8
        mover_bits, rest_bits = s1[:mu_end], s1[mu_end:]
        table_rest = s0[p:]
    else:
        mover_bits, table_rest = s0[p:], b""
    movers = sb.rice_decode0(mover_bits[:um], mover_bits[um:], km, rm, n, "")
    c = ctx.rng.randrange(7)
    if c == 0:
        km = max(0, km + ctx.rng.choice([-1, 1]))
    elif c in (1, 2):
        if c == 1 or not movers:
            extra = ctx.rng.randrange(n)
            movers = sorted(set(movers) | {extra})
        else:
            movers = [m for m in movers if m != ctx.rng.choice(movers)]
        km = len(movers)
        u, m = sb.rice_encode(movers, rm) if movers else (b"", b"")
        mover_bits, um = u + m, len(u)
    elif c == 3:
        rm = ctx.rng.choice([rm + 1, max(0, rm - 1), 41, 64])
    elif c == 4:
        um = max(0, um + ctx.rng.choice([-1, 1]))
    elif c == 5:
        km, rm, um, mover_bits = 0, ctx.rng.choice([0, 1]), ctx.rng.choice([0, 1]), b""
    else:
        movers = list(range(min(n, km + 3)))  # consecutive movers from 0
        km = len(movers)
        u, m = sb.rice_encode(movers, rm)
        mover_bits, um = u + m, len(u)
    head = rows + sb.varint(km) + sb.varint(rm) + sb.varint(um)
    if r.codec != sb.CDENSE:
        r.sections = [head + table_rest, mover_bits + rest_bits, s2]
    else:
        r.sections = [head + mover_bits, s1, s2]
    r.lens = None


def _row_prefix(r, n: int) -> tuple[bytes, int]:
    """For RSPARSE: (its row list's bytes, n' the words of its subchunk);
    for another codec (b"", n)."""
    if r.codec != sb.RSPARSE:
        return b"", n
    rl = sb.rsparse_rows(r, n)
    s0 = bytes(r.sections[0])
    return s0[:len(s0) - len(rl.sub.sections[0])], int(rl.pos.size)


def _table(s0: bytes):
    km, rm, um, p = _movers(s0)
    E, p = sb.read_varint(s0, p, "")
    ents = []
    for _ in range(E):
        d, p = sb.read_varint(s0, p, "")
        c, p = sb.read_varint(s0, p, "")
        mode, p = sb.read_varint(s0, p, "")
        ents.append([d, c, mode])
    u, p = sb.read_varint(s0, p, "")
    return [km, rm, um], ents, u, s0[p:]


@mutation("v3.csparse_table", 3)
def m_v3_table(ctx, codec=None):
    """A CSPARSE table (CSPARSE's, or RSPARSE's after its row list) that lies
    or overflows: E off by one, an entry's count or mode (complement flag,
    Rice r) changed, buckets out of order or past 2^e, more entries than
    buckets, u wrong, trailing bytes, a non-minimal or overlong varint, k_m
    above k."""
    r = ctx.b.records[ctx.pick_rec(sb.CHUNK, codec or (sb.CSPARSE, sb.RSPARSE))]
    rows, _ = _row_prefix(r, (r.hi - r.lo) // max(r.word, 1))
    s0 = bytes(r.sections[0])[len(rows):]
    mv, ents, u, rest = _table(s0)
    e = sb.BUCKETS.get(r.param, (0, 0, 8))[2]
    c = ctx.rng.randrange(11)
    tail = b""
    E = len(ents)
    if c == 0:
        E = max(0, E + ctx.rng.choice([-1, 1]))
    elif c == 1 and ents:
        e_ = ents[ctx.rng.randrange(len(ents))]
        e_[1] = max(0, e_[1] + ctx.rng.choice([-1, 1, 1 << 20]))
    elif c == 2 and ents:
        ents[ctx.rng.randrange(len(ents))][2] ^= ctx.rng.choice([1, 2, 64, 82])
    elif c == 3 and ents:
        ents[ctx.rng.randrange(len(ents))][0] = ctx.rng.choice([(1 << e) - 1, 1 << e, (1 << e) + 1, 1 << 40])
    elif c == 4:
        ents = ents + [[0, 1, 0]] * ctx.rng.choice([1, (1 << e) + 1 - len(ents)])
        E = len(ents)
    elif c == 5:
        u = max(0, u + ctx.rng.choice([-1, 1, 1000]))
    elif c == 6:
        tail = b"\0"
    elif c == 7:
        mv[0] = r.count + 1  # k_m above k
    elif c == 8 and len(ents) >= 2:
        ents[1][0] = ctx.rng.choice([0, 1])  # a later bucket than it was: positions land elsewhere
    elif c == 9:
        mv[0] = mv[0]  # non-minimal varint for k_m below
        head = bytes([mv[0] | 0x80, 0x00]) + sb.varint(mv[1]) + sb.varint(mv[2])
        r.sections[0] = rows + head + sb.varint(E) + b"".join(sb.varint(a) + sb.varint(b) + sb.varint(m)
                                                              for a, b, m in ents[:E]) + sb.varint(u)
        return
    else:
        r.sections[0] = rows + s0 + b"\x80" * 11  # an overlong varint after the end
        return
    head = b"".join(sb.varint(x) for x in mv)
    body = b"".join(sb.varint(a) + sb.varint(b) + sb.varint(m) for a, b, m in ents[:E])
    r.sections[0] = rows + head + sb.varint(E) + body + sb.varint(u) + tail


def _rows_split(s0: bytes):
    """RSPARSE's section 0 as [R, o, k_r, r_r, u_r], the unary stream, the
    remainder stream and the rest (its CSPARSE table), by the stated lengths."""
    vals, p = [], 0
    for _ in range(5):
        v, p = sb.read_varint(s0, p, "")
        vals.append(v)
    ur, rl = vals[4], (vals[2] * vals[3] + 7) // 8
    return vals, s0[p:p + ur], s0[p + ur:p + ur + rl], s0[p + ur + rl:]


#: m_v3_rows's variants, by number: (what each one does, what a reader must
#: answer: a phrase of the spec reader's refusal, "refused" (status 4 for
#: one reason or another), "valid", or "either")
ROW_VARIANTS = {0: ("R = 0", "row length R outside"), 1: ("R > n", "row length R outside"),
                2: ("o >= R", "o not below R"), 3: ("k_r = 0", "k_r outside"), 4: ("k_r = N_r + 1", "k_r outside"),
                5: ("a row without a change listed, the CSPARSE part re-coded over its subchunk",
                    "listed row holds no changed word"),
                6: ("u_r + 1", "refused"), 7: ("u_r - 1", "refused"),
                8: ("a byte after the remainder stream", "either"), 9: ("the remainder's last byte cut", "either"),
                10: ("a padding bit of the remainder stream set", "remainder padding is not zero"),
                11: ("a padding bit of the unary stream set", "1 bits"),
                12: ("the rows re-coded with another Rice parameter", "valid"),
                13: ("r_r above 40", "Rice parameter above 40"),
                14: ("a changed row dropped, the CSPARSE part kept", "either"),
                15: ("other R and o, everything re-coded", "valid"),
                16: ("a non-minimal varint in the row list", "varint not minimal"),
                17: ("the last row at N_r", "refused"),
                18: ("the row streams past the end of section 0", "refused")}


@mutation("v3.rows", 3)
def m_v3_rows(ctx, variant: int | None = None):
    """RSPARSE's row list broken by each of its rules: R = 0 or R > n, o >=
    R, k_r = 0 or k_r > N_r, a listed row without a change (everything else
    valid), the unary stream's length u_r off by one, a byte more or less
    after the remainder stream, a padding bit set in either stream, r_r above
    40, a changed row left out, a non-minimal varint, a row at N_r, streams
    past section 0; and valid restatements (another r_r; other R and o with
    the CSPARSE part re-coded) that both readers must accept alike."""
    i = ctx.pick_rec(sb.CHUNK, sb.RSPARSE)
    r, h, cov, old, new = ctx.chunk(i)
    w = r.word
    n = (r.hi - r.lo) // w
    rl = sb.rsparse_rows(r, n)
    s0 = bytes(r.sections[0])
    (R, o, kr, rr, ur), un, rem, rest = _rows_split(s0)
    c = ctx.rng.randrange(len(ROW_VARIANTS)) if variant is None else variant
    rows = list(rl.rows)

    def head(R_=R, o_=o, kr_=kr, rr_=rr, ur_=ur):
        return b"".join(sb.varint(v) for v in (R_, o_, kr_, rr_, ur_))

    def recode(R_, o_, rows_, rr_=None):
        """Rows rows_ of R_ words from o_; the CSPARSE part re-coded over that
        subchunk, the same changes."""
        pos = sb.row_positions(rows_, n, R_, o_)
        ow, nw = sb._words(old, w)[pos], sb._words(new, w)[pos]
        _, _, secs = sb.encode_v2(sb.CSPARSE, ow.tobytes(), nw.tobytes(), w, fn=r.param)
        r.sections = [sb.row_head(rows_, n, R_, o_, rr_) + secs[0], secs[1], secs[2]]

    if c == 0:
        s0 = head(R_=0) + un + rem + rest
    elif c == 1:
        s0 = head(R_=ctx.rng.choice([n + 1, n + R, 1 << 40])) + un + rem + rest
    elif c == 2:
        s0 = head(o_=R + ctx.rng.choice([0, 0, 1, 1000])) + un + rem + rest
    elif c == 3:
        s0 = head(kr_=0) + (un + rem if ctx.rng.random() < 0.5 else b"") + rest
    elif c == 4:
        s0 = head(kr_=rl.Nr + 1) + un + rem + rest
    elif c == 5:
        free = sorted(set(range(rl.Nr)) - set(rows))
        if not free:
            raise Skip
        recode(R, o, sorted(rows + [ctx.rng.choice(free)]))
        r.lens = None
        return
    elif c == 6:
        s0 = head(ur_=ur + 1) + un + rem + rest
    elif c == 7:
        s0 = head(ur_=ur - 1) + un + rem + rest
    elif c == 8:
        s0 = head() + un + rem + bytes([ctx.rng.choice([0, 1, 0x80])]) + rest
    elif c == 9:
        if not rem:
            raise Skip
        s0 = head() + un + rem[:-1] + rest
    elif c == 10:
        rr2 = next((x for x in (rr, 1, 3, 5, 7) if (kr * x) % 8), None)
        if rr2 is None:
            raise Skip
        u, m = sb.rice_encode(rows, rr2)
        m = m[:-1] + bytes([m[-1] | 1])
        s0 = head(rr_=rr2, ur_=len(u)) + u + m + rest
    elif c == 11:
        last = un[-1]
        if last & 1:
            raise Skip  # the last 1 bit is the last bit: no padding
        s0 = head() + un[:-1] + bytes([last | 1]) + rem + rest
    elif c == 12:
        rr2 = ctx.rng.choice([x for x in (0, 1, 2, 5, 12, 40) if x != rr])
        s0 = sb.row_head(rows, n, R, o, rr2) + rest
    elif c == 13:
        s0 = head(rr_=ctx.rng.choice([41, 64, 1 << 20])) + un + rem + rest
    elif c == 14:
        if len(rows) < 2:
            raise Skip
        rows.remove(ctx.rng.choice(rows))
        s0 = sb.row_head(rows, n, R, o, rr) + rest
    elif c == 15:
        R2 = ctx.rng.choice([1, 2, R + 1, max(1, R - 1), ctx.rng.randint(1, n), n])
        o2 = ctx.rng.randrange(R2)
        c0 = (R2 - o2) % R2
        pos = np.flatnonzero(sb.moddiff(old, new, w))
        recode(R2, o2, sorted({(int(p) + c0) // R2 for p in pos}))
        r.lens = None
        return
    elif c == 16:
        v = sb.varint(R)  # R in one byte more than it needs
        s0 = v[:-1] + bytes([v[-1] | 0x80, 0]) + head()[len(v):] + un + rem + rest
    elif c == 17:
        rows[-1] = rl.Nr
        s0 = sb.row_head(rows, n, R, o, rr) + rest
    else:
        s0 = head(ur_=len(s0) + ctx.rng.choice([0, 1, 100])) + un + rem
    r.sections = [s0, r.sections[1], r.sections[2]]
    r.lens = None


def _restate_chunk(ctx, r, h, cov, new: bytes) -> None:
    """Record r now produces ``new``: its target digest and the index's
    tensor digests restated (the bundle stays valid)."""
    r.target = sb._chunk_digest(cov, r.lo, r.hi, new)
    region = bytearray(ctx.region(r.file))
    region[r.lo:r.hi] = new
    ctx.files[r.file]["tensors"] = [sb.D(region[t_.begin:t_.end]).hex() for t_ in h.tensors]


#: m_v3_values's variants, by number: (what each one does, what a reader
#: must answer: the refusal rule it breaks, "valid", or "either": other
#: values or a refusal; a stream of k + 1 values can even decode to the
#: same k values, its extra bits inside the final range)
VALUE_VARIANTS = {0: ("cut below 5 bytes", "shorter than 5 bytes"), 1: ("first byte", "first byte is not 0"),
                  2: ("cut short", "reads past the end"), 3: ("bytes appended", "bytes remain unread"),
                  4: ("bytes 1 to 4 ff ff ff ff", "code >= range"), 5: ("k - 1 or k + 1 values", "either"),
                  6: ("other runs", "either"), 7: ("a bit flipped", "either"),
                  8: ("tail within the final range", "valid"), 9: ("tail past the final range", "either"),
                  10: ("s = 0, M = 2^(8w-1) - 1, restated", "valid"), 11: ("the same as 10", "valid")}


@mutation("v3.value_section", 3)
def m_v3_values(ctx, variant: int | None = None, codec=None):
    """The range-coded value section V of MSPARSE, MBITMAP and CSPARSE, broken
    by each refusal rule of the spec: shorter than 5 bytes, a first byte other
    than 0, cut short (decoding reads past its end), bytes left unread, code
    >= range at the end (bytes 1 to 4 ff ff ff ff); the values coded for k - 1
    or k + 1 words, or in other runs (one run for a CSPARSE with entries, two
    for MSPARSE), a bit flipped, the tail bumped past the final range. Valid
    ones too: the tail bumped within the final range (the same values), and
    s = 0 with M = 2^(8w-1) - 1 (D = 2^(8w-1), a form no writer produces)
    with the target restated: both readers must accept them alike."""
    i = ctx.pick_rec(sb.CHUNK, codec or (sb.MSPARSE, sb.MBITMAP, sb.CSPARSE, sb.RSPARSE))
    r, h, cov, old, new = ctx.chunk(i)
    n = (r.hi - r.lo) // r.word
    w = r.word
    si, k, runs, listed = sb.value_layout(r, old, n)
    sec = bytes(r.sections[si])
    signs, mags, dec = sb.value_decode_sm(sec, k, w, "", runs, end=False)
    top = 8 * w - 1
    c = ctx.rng.randrange(len(VALUE_VARIANTS)) if variant is None else variant
    if c == 0:
        sec = sec[:ctx.rng.randrange(5)]
    elif c == 1:
        sec = bytes([ctx.rng.randrange(1, 256)]) + sec[1:]
    elif c == 2:
        sec = sec[:-ctx.rng.choice([1, 1, 2, 3])]
    elif c == 3:
        sec = sec + bytes([ctx.rng.randrange(256)]) * ctx.rng.choice([1, 1, 2])
    elif c == 4:  # code >= range from the start; zeros keep it there, random bytes may wrap it
        tail = bytes(8 * k * w + 16) if variant is not None or ctx.rng.random() < 0.7 else ctx.rng.randbytes(len(sec))
        s_, m_, d_ = sb.value_decode_sm(b"\0\xff\xff\xff\xff" + tail, k, w, "", runs, end=False)
        sec = (b"\0\xff\xff\xff\xff" + tail)[:d_.pos]
    elif c == 5:  # k - 1 or k + 1 values in the same runs
        if ctx.rng.random() < 0.5 and k > 1:
            j = max(x for x in range(len(runs)) if runs[x])
            rr = runs[:j] + [runs[j] - 1] + runs[j + 1:]
            sec = sb.value_encode_sm(signs[:-1], mags[:-1], w, rr)
        else:
            sec = sb.value_encode_sm(signs + [0], mags + [ctx.rng.choice([0, 1, 5])], w, runs[:-1] + [runs[-1] + 1])
    elif c == 6:  # other runs
        if len([x for x in runs if x]) > 1:
            rr = [k]
        elif k > 1:
            cut = ctx.rng.randrange(1, k)
            rr = [cut, k - cut]
        else:
            raise Skip
        sec = sb.value_encode_sm(signs, mags, w, rr)
    elif c == 7:
        b = bytearray(sec)
        b[ctx.rng.randrange(1, len(b))] ^= 1 << ctx.rng.randrange(8)
        sec = bytes(b)
    elif c in (8, 9):  # the tail bumped: within the final range (valid), or past it
        x = ctx.rng.randrange(1, dec.range) if c == 8 else dec.range + ctx.rng.choice([0, 1, 1 << 20])
        v = int.from_bytes(sec[-4:], "big") + x
        if v >> 32:
            raise Skip
        sec = sec[:-4] + v.to_bytes(4, "big")
    else:  # s = 0, M = 2^(8w-1) - 1 on one value (not a CSPARSE mover), target restated
        km = runs[0] if r.codec in (sb.CSPARSE, sb.RSPARSE) else 0
        if km >= k:
            raise Skip
        j = ctx.rng.randrange(km, k)
        signs, mags = list(signs), list(mags)
        signs[j], mags[j] = 0, (1 << top) - 1
        r.sections[si] = sb.value_encode_sm(signs, mags, w, runs)
        t = sb._UINT[w]
        a = np.frombuffer(new, t).copy()
        a[listed[j]] = t((int(np.frombuffer(old, t)[listed[j]]) + (1 << top)) % (1 << (8 * w)))
        _restate_chunk(ctx, r, h, cov, a.tobytes())
        r.lens = None
        return
    if sec == bytes(r.sections[si]):
        raise Skip  # e.g. a value k + 1 of 0 bits only: the same bytes
    r.sections[si] = sec
    r.lens = None


@mutation("v3.dense_values", 1.5)
def m_v3_dense_values(ctx):
    """CDENSE's V0 section (zstd frames): sign and magnitude frames of the
    wrong length (n +- 1), L off by one or past the section, a truncated or
    non-minimal varint, sign padding set, a magnitude above 2^(8w-1) or at
    it with the sign clear, a sign on a zero."""
    r = ctx.b.records[ctx.pick_rec(sb.CHUNK, sb.CDENSE)]
    k = 1
    w = r.word
    sec = r.sections[k]
    L, p = sb.read_varint(sec, 0, "")
    sign, mag = sec[p:p + L], sec[p + L:]
    cnt = (r.hi - r.lo) // w
    sbits = sb._bits(sb.unZ(sign, (cnt + 7) // 8))
    mags = sb.unP(sb.unZ(mag, cnt * w), w)
    c = ctx.rng.randrange(9)
    if c == 0:
        sbits = np.concatenate([sbits, np.zeros(8, np.uint8)])
    elif c == 1:
        sbits = sbits[:-8] if len(sbits) >= 8 else sbits
    elif c == 2:
        mags = mags + bytes(w)
    elif c == 3:
        mags = mags[:-w]
    elif c == 4:
        if cnt % 8 == 0:
            raise Skip
        sbits = sbits.copy()
        sbits[-1] = 1
    elif c == 5:
        m = bytearray(mags)
        j = ctx.rng.randrange(cnt)
        m[j * w:(j + 1) * w] = ((1 << (8 * w - 1)) + ctx.rng.choice([0, 0, 1])).to_bytes(w, "little")[:w]
        mags = bytes(m)
    elif c == 6:
        m = np.frombuffer(mags, sb._UINT[w])
        zero = np.flatnonzero(m == 0)
        if not len(zero):
            raise Skip
        sbits = sbits.copy()
        sbits[int(zero[0])] = 1
    elif c == 7:
        sfr = sb.Z(np.packbits(sbits).tobytes() if len(sbits) else b"")
        r.sections[k] = sb.varint(len(sfr) + ctx.rng.choice([-1, 1, 1 << 30])) + sfr + sb.Z(sb.P(mags, w))
        return
    else:
        r.sections[k] = bytes([0x80 | (L & 0x7F), L >> 7 if L >> 7 else 0]) + sec[p:] if L < 128 else sec[:1]
        return
    sfr = sb.Z(np.packbits(sbits).tobytes() if len(sbits) else b"")
    r.sections[k] = sb.varint(len(sfr)) + sfr + sb.Z(sb.P(mags, w))


@mutation("v3.count", 2)
def m_v3_count(ctx):
    """count off by one (or 0, n, n + 1) on a codec v2 record."""
    r = ctx.b.records[ctx.pick_rec(sb.CHUNK, V2)]
    n = (r.hi - r.lo) // max(r.word, 1)
    r.count = ctx.rng.choice([0, max(0, r.count - 1), r.count + 1, n, n + 1])


@mutation("v3.retarget", 2)
def m_v3_retarget(ctx):
    """A codec v2 chunk that produces other bytes, target restated: valid."""
    i = ctx.pick_rec(sb.CHUNK, V2)
    r, h, cov, old, new = ctx.chunk(i)
    t = sb._UINT[r.word]
    a = np.frombuffer(new, t).copy()
    pos = ctx.rng.randrange(a.size)
    a[pos] = t(int(a[pos]) + ctx.rng.choice([1, -1 % (1 << (8 * r.word)), 1 << (8 * r.word - 1)]))
    a = a.tobytes()
    if a == old:
        raise Skip
    r.param, r.count, r.sections = _encode_any(ctx, r.codec, old, a, r.word)
    r.lens = None
    r.target = sb._chunk_digest(cov, r.lo, r.hi, a)
    region = bytearray(ctx.region(r.file))
    region[r.lo:r.hi] = a
    ctx.files[r.file]["tensors"] = [sb.D(region[t_.begin:t_.end]).hex() for t_ in h.tensors]


# DELTA records
def _delta(ctx, codec=None):
    i = ctx.pick_rec(sb.DELTA, codec)
    r = ctx.b.records[i]
    f = ctx.files[r.file]
    bf = ctx.sc.base.by_path().get(f["path"]) if ctx.sc.base else None
    tf = ctx.sc.target.by_path().get(f["path"])
    if bf is None or tf is None or bf.kind != "file" or tf.kind != "file":
        raise Skip
    return i, r, f, bf.data, tf.data


def _restate_file(ctx, j, content):
    f = ctx.files[j]
    f["size"], f["digest"] = len(content), sb.D(content).hex()


@mutation("delta.range", 3)
def m_delta_range(ctx):
    """DELTA ranges out of bounds, overlapping, out of order, empty or
    reversed, or past MAX_CHUNK_BYTES, each re-encoded where it can be (so
    digests match the claimed bytes)."""
    i, r, f, old, new = _delta(ctx)
    c = ctx.rng.randrange(7)
    rs = [k for k in ctx.recs(sb.DELTA) if ctx.b.records[k].file == r.file]
    if c == 0:  # past the target size, base and target restated
        hi = f["size"] + ctx.rng.choice([1, 8, 1 << 20])
        r.hi = hi
    elif c == 1 and len(rs) >= 2:  # overlap the previous one
        k = rs.index(i)
        prev = ctx.b.records[rs[k - 1]] if k else None
        if prev is None:
            raise Skip
        lo = prev.hi - ctx.rng.choice([1, 8, 4096])
        if lo < 0 or lo >= r.hi:
            raise Skip
        ctx.b.records[i] = sb.delta_record(r.file, old, new, lo, r.hi, ctx.rng)
    elif c == 2 and len(rs) >= 2:  # wrong order
        a, b = rs[0], rs[1]
        ctx.b.records[a], ctx.b.records[b] = ctx.b.records[b], ctx.b.records[a]
    elif c == 3:
        r.lo, r.hi = r.hi, r.lo
    elif c == 4:
        r.hi = r.lo
    elif c == 5:  # longer than MAX_CHUNK_BYTES
        r.hi = r.lo + sb.MAX_CHUNK_BYTES + 1
    else:  # a valid different cut: split the record in two
        if r.hi - r.lo < 16:
            raise Skip
        mid = ctx.rng.randrange(r.lo + 1, r.hi)
        ctx.b.records[i:i + 1] = [sb.delta_record(r.file, old, new, r.lo, mid, ctx.rng),
                                  sb.delta_record(r.file, old, new, mid, r.hi, ctx.rng)]


@mutation("delta.wrong_file", 2)
def m_delta_file(ctx):
    """A DELTA record for a tensor file, a companion of source base or
    bundle, or a file past the list; or a CHUNK/FILE type on a delta file."""
    i, r, f, old, new = _delta(ctx)
    c = ctx.rng.randrange(4)
    if c == 0:
        r.file = ctx.rng.choice(ctx.tensor_files())
    elif c == 1:
        others = [j for j, g in enumerate(ctx.files) if g["kind"] == "file" and g["source"] != "delta"]
        if not others:
            raise Skip
        r.file = ctx.rng.choice(others)
    elif c == 2:
        r.type = ctx.rng.choice([sb.CHUNK, sb.FILE])
    else:
        r.file = len(ctx.files)
    ctx.b.records.sort(key=lambda x: x.file)


@mutation("delta.window", 3)
def m_delta_window(ctx):
    """ZSTD_BASE windows outside the base file, reversed, too large, or a
    valid other window (re-encoded: valid); section 0 not 16 bytes."""
    i, r, f, old, new = _delta(ctx, sb.ZSTD_BASE)
    bsize = len(old)
    c = ctx.rng.randrange(6)
    dlo, dhi = struct.unpack("<QQ", r.sections[0]) if len(r.sections[0]) == 16 else (0, 0)
    if c == 0:
        dhi = bsize + ctx.rng.choice([1, 4096, 1 << 40])
    elif c == 1:
        dlo, dhi = dhi + 1, dlo
    elif c == 2:
        dlo, dhi = 0, sb.MAX_CHUNK_BYTES + 1
    elif c == 3:
        r.sections[0] = r.sections[0] + b"\0" * ctx.rng.choice([1, 8])
        return
    elif c == 4:  # valid: another window, re-encoded (within the window budget: 4 x the range)
        a = ctx.rng.randrange(0, bsize + 1)
        b2 = ctx.rng.randrange(a, min(bsize, a + (4 << 20), a + 4 * (r.hi - r.lo)) + 1)
        ctx.b.records[i] = sb.delta_record(r.file, old, new, r.lo, r.hi, ctx.rng, codec=sb.ZSTD_BASE,
                                           window=(a, b2))
        return
    else:  # the base digest of the claimed window, frame unchanged
        dlo = max(0, dlo - ctx.rng.choice([1, 4096]))
    r.sections[0] = struct.pack("<QQ", min(dlo, (1 << 64) - 1), min(dhi, (1 << 64) - 1))
    r.base = sb.H(old[dlo:dhi])


@mutation("delta.word", 2.5)
def m_delta_word(ctx):
    """Word widths that do not divide the range, ranges of word codecs past
    the base file, another width stated without re-encoding, or a valid
    re-encoding at a random width and word codec."""
    i, r, f, old, new = _delta(ctx)
    c = ctx.rng.randrange(4)
    if c == 0:
        ws = [w for w in (2, 4, 8) if (r.hi - r.lo) % w]
        if not ws:
            lo = r.lo + 1 if r.hi - r.lo > 8 else None
            if lo is None:
                raise Skip
            r.lo = lo
        r.word = ctx.rng.choice(ws) if ws else r.word
        if r.codec == sb.ZSTD_BASE:
            r.codec = sb.RAW
    elif c == 1:
        r.word = ctx.rng.choice([w for w in (1, 2, 4, 8) if w != r.word])
    elif c == 2:  # a word codec over a range past the base file
        if r.hi <= len(old):
            raise Skip
        ws = [w for w in (1, 2, 4, 8) if (r.hi - r.lo) % w == 0]
        padded = old + bytes(r.hi - len(old))
        p, cnt, secs = sb.encode_chunk(sb.RAW, padded[r.lo:r.hi], new[r.lo:r.hi], ctx.rng.choice(ws))
        r.codec, r.param, r.count, r.sections = sb.RAW, p, cnt, secs
        r.base = sb.H(old[r.lo:r.hi])
    else:
        if r.hi > len(old):
            raise Skip
        ctx.b.records[i] = sb.delta_record(r.file, old, new, r.lo, r.hi, ctx.rng,
                                           codec=ctx.rng.choice(sb.V1_CODECS))


@mutation("delta.codec", 1.5)
def m_delta_codec(ctx):
    """DELTA with a codec it does not have: 4 (ZSTD), 5 to 9 (codec v2),
    17, or ZSTD_BASE fields (word, param, count, len2) not 1/0/0/0."""
    i, r, f, old, new = _delta(ctx)
    c = ctx.rng.randrange(3)
    if c == 0:
        r.codec = ctx.rng.choice([4, 5, 6, 7, 8, 9, 15, 17, 255])
    elif c == 1 and r.codec == sb.ZSTD_BASE:
        k = ctx.rng.randrange(4)
        if k == 0:
            r.word = ctx.rng.choice([2, 4, 8])
        elif k == 1:
            r.param = 1
        elif k == 2:
            r.count = 1
        else:
            r.sections[2] = b"x"
    else:
        r.codec = sb.ZSTD_BASE if r.codec != sb.ZSTD_BASE else sb.RAW


@mutation("delta.source", 3)
def m_delta_source(ctx):
    """Source "delta" where it cannot be: a file the base lacks (renamed),
    a tensor file, an anchor, a version 1/2 bundle; "delta" turned into
    "base" or "bundle" with its records kept or dropped; a delta file's
    records dropped (bytes past the base file's end uncovered)."""
    c = ctx.rng.randrange(6)
    if c == 0:
        js = [j for j, f in enumerate(ctx.files) if f["source"] == "delta"]
        if not js:
            raise Skip
        j = ctx.rng.choice(js)
        ctx.rename(j, ctx.files[j]["path"] + ".renamed")
    elif c == 1:
        j = ctx.rng.choice(ctx.tensor_files())
        ctx.files[j]["source"] = "delta"
    elif c == 2:
        ctx.b.index["base"] = None
    elif c == 3:
        js = [j for j, f in enumerate(ctx.files) if f["source"] == "delta"]
        if not js:
            raise Skip
        _set_version(ctx, ctx.rng.choice([1, 2]))
    elif c == 4:
        js = [j for j, f in enumerate(ctx.files) if f["source"] == "delta"]
        if not js:
            raise Skip
        j = ctx.rng.choice(js)
        ctx.files[j]["source"] = ctx.rng.choice(["base", "bundle"])
        if ctx.rng.random() < 0.5:
            ctx.b.records = [r for r in ctx.b.records if r.file != j]
    else:
        js = [j for j, f in enumerate(ctx.files) if f["source"] == "delta"]
        if not js:
            raise Skip
        j = ctx.rng.choice(js)
        rs = [k for k, r in enumerate(ctx.b.records) if r.file == j]
        if not rs:
            raise Skip
        del ctx.b.records[ctx.rng.choice(rs) if ctx.rng.random() < 0.6 else rs[-1]]


@mutation("delta.retarget", 2)
def m_delta_retarget(ctx):
    """A DELTA record that produces other bytes (a flip, or a size change of
    the last range), the file's size and digest restated: valid."""
    i, r, f, old, new = _delta(ctx)
    a = bytearray(new)
    for _ in range(ctx.rng.choice([1, 3, 40])):
        k = ctx.rng.randrange(r.lo, r.hi)
        a[k] ^= 1 << ctx.rng.randrange(8)
    a = bytes(a)
    ctx.b.records[i] = sb.delta_record(r.file, old, a, r.lo, r.hi, ctx.rng)
    # the rebuilt file: other records' bytes are those of the pristine target
    _restate_file(ctx, r.file, a)



def mutate(sc: Scenario, rng: random.Random, *, kinds=None, stack=None):
    """One mutated bundle: (kinds applied, bytes, bundle object)."""
    label, data = sc.bundles[0] if rng.random() < 0.55 else rng.choice(sc.bundles)
    names = kinds or list(MUTATIONS)
    weights = [MUTATIONS[n][1] for n in names]
    depth = stack if stack is not None else rng.choice([1, 1, 1, 1, 1, 1, 2, 2, 3])
    for attempt in range(50):
        if attempt:  # nothing applied: another bundle too (a mutation may need a codec only some hold)
            label, data = rng.choice(sc.bundles)
        b = sb.parse(data)
        ctx = Ctx(sc, b, rng)
        applied, fix_records, fix_index, raw_index, footer = [], True, True, None, None
        post = []
        for _ in range(depth):
            name = rng.choices(names, weights)[0]
            try:
                res = MUTATIONS[name][0](ctx)
            except (Skip, sb.SpecError, sb._NotStrict, IndexError, KeyError, ValueError, TypeError, StopIteration,
                    AttributeError, OverflowError, ZeroDivisionError):
                continue
            applied.append(name)
            if isinstance(res, tuple) and res[0] == "nofix":
                post.append(res[1])
            elif res == "nofix":
                fix_index = False
            elif res == "nofix-records":
                fix_records = False
            elif isinstance(res, tuple) and res[0] == "raw-index":
                raw_index = res[1]
            elif isinstance(res, tuple) and res[0] == "footer":
                footer = res[1]
        if not applied:
            continue
        try:
            if post:
                sb.serialize(b)  # the digests first, then the lie
                for p in post:
                    p()
                out = sb.serialize(b, fix_records=True, fix_index=False, index_raw=raw_index, footer=footer)
            else:
                out = sb.serialize(b, fix_records=fix_records, fix_index=fix_index, index_raw=raw_index, footer=footer)
        except (ValueError, TypeError, struct.error, OverflowError, UnicodeEncodeError):
            continue
        return "+".join(applied), out, f"{label}"
    raise RuntimeError(f"no mutation applies to {sc.name}")


# -- running wdiff and checking the invariant ---------------------------------------------------------


class Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise Hang()


DOCUMENTED = {3, 4, 5, 9}


@dataclass
class Outcome:
    status: int | str  # exit code, or "crash"/"hang"
    error: str = ""
    seconds: float = 0.0
    rss_growth_mb: float = 0.0


def stat_tree(root: str, skip: set) -> dict:
    """(mode, size, mtime_ns, inode) of everything under root but the
    ``skip`` roots; (mode, inode) for directories, whose mtimes move as
    entries come and go in the work directory."""
    out = {}

    def walk(d, rel):
        with os.scandir(d) as it:
            for e in it:
                if e.path in skip:
                    continue
                st = e.stat(follow_symlinks=False)
                r = rel + e.name
                if e.is_dir(follow_symlinks=False):
                    out[r] = (st.st_mode, st.st_ino)
                    walk(e.path, r + "/")
                else:
                    out[r] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino)

    walk(root, "")
    return out


def run_apply(bundle: str, base: str | None, out: str | None, *, in_place: bool = False, timeout: float = 60) -> Outcome:
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    try:
        if in_place:
            wdiff.apply(bundle, base, in_place=True, threads=2)
        else:
            wdiff.apply(bundle, base, out, threads=2)
        status, err = 0, ""
    except Hang:
        status, err = "hang", f"no answer in {timeout} s"
    except wdiff.WdiffError as e:
        status, err = int(e.exit_code), f"{type(e).__name__}: {e}"
    except MemoryError as e:
        status, err = "crash", f"MemoryError: {e}"
    except Exception as e:  # noqa: BLE001 - an unexpected error: the CLI's exit 2
        import traceback

        tb = traceback.extract_tb(e.__traceback__)
        where = next((f"{os.path.basename(fr.filename)}:{fr.name}:{fr.lineno}" for fr in reversed(tb)
                      if "/wdiff/" in fr.filename), "?")
        status, err = "crash", f"{type(e).__name__}: {e} (at {where})"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    dt = time.perf_counter() - t0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return Outcome(status, err, dt, (rss1 - rss0) / 1024)


def claimed(index) -> dict:
    return {f["path"]: f for f in index["target"]["files"]}


def check_output(out_dir: str, index) -> list[str]:
    """What in OUT differs from the target the index states (empty: exact)."""
    problems = []
    want = claimed(index)
    try:
        got = sb.scan(out_dir)
    except sb.SpecError as e:
        return [f"OUT is not a valid checkpoint: {e}"]
    have = {f.path: f for f in got.files}
    for p in sorted(set(want) | set(have), key=lambda p: Ctx._key(p)):
        if p not in have:
            problems.append(f"{p!r}: missing")
            continue
        if p not in want:
            problems.append(f"{p!r}: not in the index")
            continue
        w, h = want[p], have[p]
        if h.size != w["size"] or h.kind != w["kind"] or h.digest.hex() != w["digest"]:
            problems.append(f"{p!r}: {h.kind}/{h.size}/{h.digest.hex()[:12]} written, index says "
                            f"{w['kind']}/{w['size']}/{w['digest'][:12]}")
    if not problems and got.fingerprint.hex() != index["target"]["fingerprint"]:
        problems.append("fingerprint of OUT is not target.fingerprint")
    # nothing but regular files and directories
    for dirpath, dirs, files in os.walk(out_dir):
        for n in dirs + files:
            if os.path.islink(os.path.join(dirpath, n)):
                problems.append(f"symlink {n!r} in OUT")
    return problems


def spec_verdict(data: bytes, base: sb.Checkpoint | None, anchor: bool):
    """The reference reader's answer: (0, files) or (4/5, reason)."""
    try:
        return 0, sb.read(data, base if not anchor else None)
    except sb.SpecError as e:
        return e.status, str(e)
    except RecursionError:
        return 4, "recursion"


@dataclass
class Stats:
    kinds: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)
    by_kind: dict = field(default_factory=dict)
    wrong: list = field(default_factory=list)
    known: Counter = field(default_factory=Counter)
    known_examples: dict = field(default_factory=dict)
    crashes: list = field(default_factory=list)
    usage: list = field(default_factory=list)
    slow: list = field(default_factory=list)
    lenient: Counter = field(default_factory=Counter)
    strict: Counter = field(default_factory=Counter)
    lenient_examples: dict = field(default_factory=dict)
    strict_examples: dict = field(default_factory=dict)
    code_mismatch: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=dict)
    cli: list = field(default_factory=list)
    inplace: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    n: int = 0
    max_rss_growth_mb: float = 0.0

    def table(self) -> str:
        lines = [f"mutated bundles: {self.n} in {self.seconds:.1f} s"]
        lines.append("outcomes (copy mode, in-process): " + ", ".join(f"{k}: {v}" for k, v in sorted(
            self.outcomes.items(), key=lambda kv: str(kv[0]))))
        if self.inplace:
            lines.append("outcomes (in-place): " + ", ".join(f"{k}: {v}" for k, v in sorted(
                self.inplace.items(), key=lambda kv: str(kv[0]))))
        lines.append(f"wrong acceptances: {len(self.wrong)}; crashes: {len(self.crashes)}; "
                     f"known bugs: {dict(self.known)}; usage errors: {len(self.usage)}; slow: {len(self.slow)}")
        lines.append(f"largest RSS growth: {self.max_rss_growth_mb:.0f} MB")
        lines.append("by mutation kind (first kind of a stack): tried | " + " | ".join(["0", "3", "4", "5", "9", "other"]))
        for k in sorted(self.by_kind):
            c = self.by_kind[k]
            lines.append(f"  {k:<22} {sum(c.values()):>6} | " + " | ".join(
                f"{c.get(s, 0):>5}" for s in (0, 3, 4, 5, 9)) + f" | {sum(v for s, v in c.items() if s not in (0, 3, 4, 5, 9)):>5}")
        if self.lenient:
            lines.append("wdiff accepted, spec reader refused: " + ", ".join(f"{k}: {v}" for k, v in self.lenient.most_common()))
        if self.strict:
            lines.append("wdiff refused, spec reader accepted: " + ", ".join(f"{k}: {v}" for k, v in self.strict.most_common()))
        if self.code_mismatch:
            lines.append("both refused, other status (wdiff/spec): " + ", ".join(
                f"{k}: {v}" for k, v in self.code_mismatch.most_common(12)))
        return "\n".join(lines)


#: bugs this fuzzer found, recognised so that the default run stays green;
#: each has its own strict xfail test in test_semantic_fuzz.py
KNOWN_BUGS = {
    "inplace-companion-unverified":
        "apply --in-place never checks a companion file of source 'base' against the target's size and digest "
        "(inplace._start skips it as unchanged)",
    "companion-size-unchecked":
        "apply -o copies a companion file of source 'base' and checks its digest but not the size the index "
        "states (applying.build.on_file)",
    "kind-confusion-accepted":
        "a 'file' entry at a *.safetensors path whose bytes are a strict tensor file is accepted: the output's "
        "fingerprint is not target.fingerprint (no check anywhere in applying.py; the spec's reader steps miss it too)",
    "refusal-after-output-renamed":
        "apply -o renames OUT into place, then scan(OUT) for the manifest cache refuses it (duplicate tensor "
        "names, a tree deeper than 32 levels): exit 4 with OUT exposed (applying.apply)",
}


#: crashes this fuzzer found that are not fixed yet: name -> (what the error
#: says, the description); each has its strict xfail test in test_semantic_fuzz.py
KNOWN_CRASHES: dict[str, tuple[str, str]] = {
    # none now: the one this fuzzer found (a complemented CSPARSE entry with c
    # past the chunk, which crashed the fused C path) is refused since, with
    # test_csparse_entry_count_past_the_chunk_is_refused as its regression test
}


def known_crash(error: str) -> str | None:
    """The known crash an unexpected error (in process, or the CLI's stderr)
    is an instance of, or None."""
    return next((k for k, (sig, _) in KNOWN_CRASHES.items() if sig in error), None)


def known_bug(mode: str, index, outcome: Outcome, problems: list, exposed_after_refusal: bool,
              out_path: str = "") -> str | None:
    """The name of the known bug a failure is an instance of, or None.
    None for now: the bugs this fuzzer found (companion files from the base
    unchecked in place or by size, kind confusion at *.safetensors paths,
    refusals after OUT was renamed) are fixed, each with a regression test
    in test_semantic_fuzz.py, so every such failure counts as wrong again."""
    return None
