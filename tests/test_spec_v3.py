"""The independent reader (tests/specbundle.py, written from the format page
alone) against wdiff on format version 3: codec v2 CHUNK records (MSPARSE,
MBITMAP, MDENSE, CSPARSE, CDENSE) and DELTA records (word codecs at every
width and ZSTD_BASE). For bundles wdiff packs on data where each of them wins,
and for the committed golden v3 bundles, the reader's output equals what
``wdiff apply`` writes, byte for byte, and the codecs the test is about were
actually written. The spec's own CSPARSE examples are decoded too."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import specbundle as sb
import wdiff

GOLDEN = Path(__file__).parent / "golden" / "data"
MiB = 1 << 20


def _st(tensors) -> bytes:
    return sb.write_st([(n, dt, a.shape, a.tobytes()) for n, dt, a in tensors])


def _ulp(rng, a: np.ndarray, density: float) -> np.ndarray:
    """Most changed words move by one or a few units in the last place."""
    b = a.copy()
    k = max(1, int(density * a.size))
    pos = rng.choice(a.size, size=k, replace=False)
    d = rng.choice([1, 1, 1, 2, 3], size=k).astype(a.dtype)
    neg = rng.random(k) < 0.5
    b[pos] = np.where(neg, a[pos] - d, a[pos] + d)
    return b


def _bf16(x: np.ndarray) -> np.ndarray:
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _tree(root: Path, files: dict) -> str:
    for p, c in files.items():
        fp = root / p
        fp.parent.mkdir(parents=True, exist_ok=True)
        fp.write_bytes(c)
    return str(root)


def _read_tree(root) -> dict:
    out = {}
    for dp, _, fns in os.walk(root):
        for fn in fns:
            p = os.path.join(dp, fn)
            r = os.path.relpath(p, root)
            if r.split(os.sep)[0] == ".wdiff":
                continue
            out[r.replace(os.sep, "/")] = Path(p).read_bytes()
    return out


def _cross_check(bundle: Path, base: str, tmp: Path) -> set:
    """Apply with wdiff and with the spec reader; equal bytes. Returns the
    (type, codec) pairs of the bundle's records."""
    data = bundle.read_bytes()
    got = sb.read(data, sb.scan(base))
    out = tmp / ("OUT-" + bundle.stem)
    wdiff.apply(str(bundle), base, str(out))
    assert _read_tree(out) == got
    return {(r.type, r.codec) for r in sb.parse(data).records}


@pytest.fixture(scope="module")
def v3_world(tmp_path_factory):
    """A base and a target where every codec v2 and every DELTA codec wins
    somewhere (the test below checks that they did)."""
    tmp = tmp_path_factory.mktemp("specv3")
    rng = np.random.default_rng(7)
    n = 1 << 16
    ints16 = rng.integers(0, 1 << 15, n, dtype=np.int16).view(np.uint16)
    ints32 = rng.integers(0, 1 << 30, n, dtype=np.int32).view(np.uint32)
    ints64 = rng.integers(0, 1 << 40, n // 4, dtype=np.int64).view(np.uint64)
    master = (rng.standard_normal(1 << 18) * 0.02).astype(np.float32)
    lr = np.float32(3e-7) * np.where(rng.random(master.size) < 0.5, -1, 1).astype(np.float32)
    f32 = (rng.standard_normal(n) * 0.02).astype(np.float32)
    f32b = (f32 * np.float32(0.999) + np.float32(1e-7)).astype(np.float32)  # every element moves a little
    f64 = (rng.standard_normal(n // 4) * 0.02).astype(np.float64)
    f16 = (rng.standard_normal(n) * 0.02).astype(np.float16)
    u8 = rng.integers(0, 255, n, dtype=np.uint8)
    u8b = u8.copy()
    u8b[rng.choice(n, int(0.4 * n), replace=False)] += np.uint8(1)  # MBITMAP
    base = [("u8m", "U8", u8), ("i16s", "I16", ints16), ("i32b", "I32", ints32), ("i64d", "I64", ints64),
            ("bf", "BF16", _bf16(master)), ("f32d", "F32", f32), ("f64", "F64", f64), ("f16", "F16", f16)]
    tgt = [("u8m", "U8", u8b), ("i16s", "I16", _ulp(rng, ints16, 0.002)), ("i32b", "I32", _ulp(rng, ints32, 0.1)),
           ("i64d", "I64", _ulp(rng, ints64, 0.9)), ("bf", "BF16", _bf16(master + lr)), ("f32d", "F32", f32b),
           ("f64", "F64", _ulp(rng, f64.view(np.uint64), 0.95).view(np.float64)),
           ("f16", "F16", _ulp(rng, f16.view(np.uint16), 0.01).view(np.float16))]
    # companion files of 1 MiB and more: changed in place (word codecs),
    # grown and shifted (ZSTD_BASE), byte flips (width 1)
    opt = (np.abs(rng.standard_normal(400_000)) * 1e-3).astype(np.float32)
    opt2 = opt.copy()
    idx = rng.choice(opt.size, 3000, replace=False)
    opt2[idx] = np.nextafter(opt[idx], np.float32(np.inf))
    gg = rng.integers(0, 16, 3 * MiB, dtype=np.uint8).tobytes()
    gg2 = gg[:MiB + 123] + rng.bytes(40_000) + gg[MiB + 123:]
    raw = bytearray(rng.bytes(2 * MiB))
    raw2 = bytearray(raw)
    for k in rng.choice(len(raw), 500, replace=False):
        raw2[k] ^= 0x5A
    A = _tree(tmp / "A", {"model.safetensors": _st(base), "opt.bin": b"PK" + opt.tobytes(), "w.gguf": gg,
                          "flips.bin": bytes(raw), "config.json": b'{"a": 1}'})
    B = _tree(tmp / "B", {"model.safetensors": _st(tgt), "opt.bin": b"PK" + opt2.tobytes(), "w.gguf": gg2,
                          "flips.bin": bytes(raw2), "config.json": b'{"a": 2}'})
    bundle = tmp / "v3.wdb"
    wdiff.pack(A, B, str(bundle), threads=2)
    return tmp, A, B, bundle


def test_spec_reader_equals_wdiff_apply_on_v3_codecs(v3_world):
    tmp, A, B, bundle = v3_world
    kinds = _cross_check(bundle, A, tmp)
    assert sb.parse(bundle.read_bytes()).version == 3
    chunk_codecs = {c for t, c in kinds if t == sb.CHUNK}
    delta_codecs = {c for t, c in kinds if t == sb.DELTA}
    assert set(sb.V2_CODECS) <= chunk_codecs, sorted(chunk_codecs)
    assert sb.ZSTD_BASE in delta_codecs and delta_codecs & set(sb.V1_CODECS), sorted(delta_codecs)
    assert _read_tree(tmp / ("OUT-" + bundle.stem)) == _read_tree(B)


@pytest.mark.parametrize("name,base", [("v3-dense.wdb", "ckpt/base"), ("v3-adam.wdb", "ckpt/base"),
                                       ("v3-struct.wdb", "ckpt/base")])
def test_spec_reader_equals_wdiff_apply_on_golden_v3(name, base, tmp_path):
    _cross_check(GOLDEN / name, str(GOLDEN / base), tmp_path)


def test_spec_writer_v2_codecs_round_trip_and_wdiff_reads_them(v3_world):
    """The spec's own encoder (sb.encode_v2) for every codec v2, decoded by
    the spec reader; CSPARSE at every complement choice."""
    rng = np.random.default_rng(3)
    for w, fn in ((2, 1), (2, 2), (4, 3), (8, 4)):
        t = sb._UINT[w]
        old = rng.integers(0, np.iinfo(t).max, 5000, dtype=t, endpoint=True)
        for density in (0.001, 0.05, 0.5, 1.0):
            new = _ulp(rng, old, density)
            new[:3] += t(1 << BUCKETS_S[fn])  # movers
            for codec in sb.V2_CODECS:
                for comp in ((0.0, 0.5, 2.0) if codec == sb.CSPARSE else (0.5,)):
                    param, count, secs = sb.encode_v2(codec, old.tobytes(), new.tobytes(), w, fn=fn,
                                                      complement=comp)
                    rec = sb.Rec(sb.CHUNK, codec, w, param, 0, 0, old.nbytes, count, sb.ZERO, sb.ZERO, secs)
                    assert sb.decode_chunk(rec, old.tobytes(), old.size) == new.tobytes(), (codec, w, density)


BUCKETS_S = {fn: s for fn, (w, s, e) in sb.BUCKETS.items()}


def test_spec_csparse_examples():
    """CSPARSE (8), the two examples, encoded and decoded here."""
    old = np.array([0x3f00, 0x3f7f, 0x3e00, 0x3f10] * 2, np.uint16)
    new = old.copy()
    new[1] += 1
    new[5] += 1
    new[4] -= 1
    param, count, (s0, s1, s2) = sb.encode_v2(sb.CSPARSE, old.tobytes(), new.tobytes(), 2, fn=1)
    assert (param, count, s0.hex(), s1.hex(), s2[:1].hex()) == (1, 3, "0300010000", "4c", "0a")
    assert sb.value_decode(s2, 3, 2, "t").tolist() == [1, 0xFFFF, 1]
    rec = sb.Rec(sb.CHUNK, sb.CSPARSE, 2, param, 0, 0, 16, count, sb.ZERO, sb.ZERO, [s0, s1, s2])
    assert sb.decode_chunk(rec, old.tobytes(), 8) == new.tobytes()
    new = old.copy()
    new[1] += 1
    new[2] += 1
    new[6] += 2
    param, count, (s0, s1, s2) = sb.encode_v2(sb.CSPARSE, old.tobytes(), new.tobytes(), 2, fn=1, rm=0)
    assert (s0.hex(), s1.hex()) == ("010001017c000100", "40")
    rec = sb.Rec(sb.CHUNK, sb.CSPARSE, 2, param, 0, 0, 16, count, sb.ZERO, sb.ZERO, [s0, s1, s2])
    assert sb.decode_chunk(rec, old.tobytes(), 8) == new.tobytes()


@pytest.mark.parametrize("seed", range(3))
def test_wdiff_applies_spec_written_v3_bundles(v3_world, seed):
    """The spec's writer (random codec v2 chunks, any bucket function of the
    word size, DELTA records of random ranges, widths and windows): the spec
    reader and wdiff both rebuild the target."""
    import random

    tmp, A, B, _ = v3_world
    base, target = sb.scan(A), sb.scan(B)
    bnd = sb.pack(base, target, random.Random(seed), version=3, level=1)
    data = sb.serialize(bnd, level=3)
    want = {f.path: f.data for f in target.files}
    assert sb.read(data, base) == want
    path = tmp / f"spec{seed}.wdb"
    path.write_bytes(data)
    out = tmp / f"OUT-spec{seed}"
    wdiff.apply(str(path), A, str(out))
    assert _read_tree(out) == want
    kinds = {(r.type, r.codec) for r in bnd.records}
    assert any(t == sb.DELTA for t, _ in kinds) and any(c in sb.V2_CODECS for t, c in kinds if t == sb.CHUNK)


def test_delta_rebuilt_companion_that_is_a_tensor_file_is_refused(tmp_path):
    """READING A BUNDLE step 7 refuses a companion file taken from a FILE
    record at a *.safetensors path whose bytes are a strict tensor file (the
    result would not have the target fingerprint). A file of source delta can
    become one the same way: the base's file at that path is a companion (not
    strict), the DELTA records make it strict. Both readers must refuse."""
    import random

    bad = sb.write_st([("x", "U8", (4,), b"abcd")])
    bad = bad[:8] + bad[8:].replace(b"[0,4]", b"[1,5]") + b"z"  # a gap: not strict, a companion
    good = sb.write_st([("x", "U8", (5,), b"abcde")])
    assert len(good) == len(bad) and sb.strict_header("m.safetensors", bad) is None
    A = _tree(tmp_path / "A", {"m.safetensors": bad})
    base = sb.scan(A)
    entry = {"path": "m.safetensors", "kind": "file", "size": len(good), "digest": sb.D(good).hex(),
             "source": "delta"}
    rec = sb.delta_record(0, bad, good, 0, len(good), random.Random(0), codec=sb.RAW, word=1)
    index = {"base": {"fingerprint": base.fingerprint.hex(),
                      "files": [[f.path, f.kind, f.size, f.digest.hex()] for f in base.files]},
             "block_size": sb.B, "format": "wdiff-bundle",
             "records": {"bytes": 0, "count": 0, "digest": sb.H(b"").hex()},
             "target": {"fingerprint": "", "files": [entry]}, "version": 3, "writer": "t"}
    data = sb.serialize(sb.Bundle([rec], index, version=3))
    with pytest.raises(sb.SpecError, match="strict tensor file"):
        sb.read(data, base)
    (tmp_path / "b.wdb").write_bytes(data)
    with pytest.raises(wdiff.WdiffError) as e:
        wdiff.apply(str(tmp_path / "b.wdb"), A, str(tmp_path / "OUT"))
    assert e.value.exit_code == 4
    assert not (tmp_path / "OUT").exists()
