"""The independent reader (tests/specbundle.py, written from the format page
alone) against wdiff on format version 3: codec v2 CHUNK records (MSPARSE,
MBITMAP, MDENSE, CSPARSE, CDENSE, RSPARSE) and DELTA records (word codecs at every
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
from kit.trees import tree, write_tree
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


def _cross_check(bundle: Path, base: str, tmp: Path) -> set:
    """Apply with wdiff and with the spec reader; equal bytes. Returns the
    (type, codec) pairs of the bundle's records."""
    data = bundle.read_bytes()
    got = sb.read(data, sb.scan(base))
    out = tmp / ("OUT-" + bundle.stem)
    wdiff.apply(str(bundle), base, str(out))
    assert tree(out) == got
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
    A = write_tree(tmp / "A", {"model.safetensors": _st(base), "opt.bin": b"PK" + opt.tobytes(), "w.gguf": gg,
                          "flips.bin": bytes(raw), "config.json": b'{"a": 1}'})
    B = write_tree(tmp / "B", {"model.safetensors": _st(tgt), "opt.bin": b"PK" + opt2.tobytes(), "w.gguf": gg2,
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
    # RSPARSE (rows of a 2-D tensor) has its own world below
    assert set(sb.V2_CODECS) - {sb.RSPARSE} <= chunk_codecs, sorted(chunk_codecs)
    assert sb.ZSTD_BASE in delta_codecs and delta_codecs & set(sb.V1_CODECS), sorted(delta_codecs)
    assert tree(tmp / ("OUT-" + bundle.stem)) == tree(B)


@pytest.mark.parametrize("name,base", [("v3-dense.wdb", "ckpt/base"), ("v3-adam.wdb", "ckpt/base"),
                                       ("v3-struct.wdb", "ckpt/base"), ("v3-rows.wdb", "ckpt/base")])
def test_spec_reader_equals_wdiff_apply_on_golden_v3(name, base, tmp_path):
    _cross_check(GOLDEN / name, str(GOLDEN / base), tmp_path)


#: the embedding's rows and the rows an optimizer step touches: row 5461
#: straddles the boundary of the tensor's 4 MiB units (words 2097024 to
#: 2097408, the unit boundary at 2097152), so the second unit starts with a
#: partial row (o = 256) that holds a change; the last row changes too
EMB_ROWS, EMB_DIM = 8192, 384
EMB_HIT = [0, 7, 8, 9, 500, 1234, 3000, 5460, 5461, 6000, 6001, 8191]


@pytest.fixture(scope="module")
def rows_world(tmp_path_factory):
    """Embedding-like tensors where an Adam-like step changes a few rows
    only (the tokens a batch saw): wdiff packs them as RSPARSE."""
    tmp = tmp_path_factory.mktemp("specrows")
    rng = np.random.default_rng(11)

    def step(master, rows, lr):
        upd = master.copy()
        upd[rows] += np.float32(lr) * np.where(rng.random((len(rows), master.shape[1])) < 0.5, -1, 1).astype(np.float32)
        return upd

    emb = (rng.standard_normal((EMB_ROWS, EMB_DIM)) * 0.02).astype(np.float32)
    proj = (rng.standard_normal((700, 96)) * 0.02).astype(np.float32)
    f32 = (rng.standard_normal((2000, 64)) * 0.02).astype(np.float32)
    emb2 = step(emb, EMB_HIT + rng.choice(np.arange(10, 5400), 30, replace=False).tolist(), 3e-4)
    proj2 = step(proj, rng.choice(700, 15, replace=False), 4e-5)
    f322 = step(f32, rng.choice(2000, 20, replace=False), 1e-6)
    base = [("emb", "BF16", _bf16(emb)), ("f32", "F32", f32.view(np.uint32)), ("proj", "BF16", _bf16(proj))]
    tgt = [("emb", "BF16", _bf16(emb2)), ("f32", "F32", f322.view(np.uint32)), ("proj", "BF16", _bf16(proj2))]
    A = write_tree(tmp / "A", {"model.safetensors": _st(base), "config.json": b'{"a": 1}'})
    B = write_tree(tmp / "B", {"model.safetensors": _st(tgt), "config.json": b'{"a": 1}'})
    bundle = tmp / "rows.wdb"
    wdiff.pack(A, B, str(bundle), threads=2)
    return tmp, A, B, bundle


def test_spec_reader_equals_wdiff_apply_on_rsparse(rows_world):
    """wdiff packs the embedding-like tensors as RSPARSE (its info says so),
    rows of the tensor's last dimension, one unit starting inside a row; the
    spec reader rebuilds what wdiff apply writes."""
    import json
    import subprocess
    import sys

    tmp, A, B, bundle = rows_world
    kinds = _cross_check(bundle, A, tmp)
    assert (sb.CHUNK, sb.RSPARSE) in kinds, sorted(kinds)
    assert tree(tmp / ("OUT-" + bundle.stem)) == tree(B)
    recs = [r for r in sb.parse(bundle.read_bytes()).records if r.type == sb.CHUNK and r.codec == sb.RSPARSE]
    lists = [sb.rsparse_rows(r, (r.hi - r.lo) // r.word) for r in recs]
    assert len(recs) == 4, [(r.lo, r.hi, r.word) for r in recs]  # emb in two units, f32, proj
    assert {(rl.R, r.word) for r, rl in zip(recs, lists)} == {(EMB_DIM, 2), (64, 4), (96, 2)}
    assert {rl.o for rl in lists} == {0, 256}  # the second unit of emb starts with a partial row
    second = next(rl for rl in lists if rl.o == 256)
    assert second.rows[0] == 0 and len(second.rows) == len([h for h in EMB_HIT if h >= 5461])
    wdiff_cli = os.path.join(os.path.dirname(sys.executable), "wdiff")
    info = json.loads(subprocess.run([wdiff_cli, "info", "--json", str(bundle)], capture_output=True, text=True,
                                     check=True).stdout)
    assert info["records"]["rsparse"]["records"] == 4, info["records"]


@pytest.mark.parametrize("seed", range(2))
def test_wdiff_reads_spec_written_rsparse(rows_world, seed):
    """The spec's writer re-encodes every CHUNK of wdiff's bundle as RSPARSE
    with rows wdiff never picks (R = 1, R = n, any R and o, any Rice
    parameter of the rows, any complement rule) as well as the tensor's own:
    the spec reader and wdiff both rebuild the target."""
    import random

    tmp, A, B, bundle = rows_world
    base, target = sb.scan(A), sb.scan(B)
    b = sb.parse(bundle.read_bytes())
    rng = random.Random(seed)
    bf = base.by_path()["model.safetensors"]
    region = bf.data[bf.header.size:]
    tensors = sb.scan(B).by_path()["model.safetensors"].header.tensors
    chunks = [r for r in b.records if r.type == sb.CHUNK]
    assert len(chunks) == 4
    for i, r in enumerate(chunks):
        n = (r.hi - r.lo) // r.word
        old = region[r.lo:r.hi]
        new = sb.decode_chunk(r, old, n)
        cov = [t for t in tensors if t.begin < r.hi and r.lo < t.end]
        # every choice on some chunk, for each seed
        rows = [sb.rows_of(cov, r.lo, r.hi, r.word, rng), {"R": 1, "o": 0}, {"R": n, "o": rng.randrange(n)},
                {"R": rng.randint(2, 1000), "rr": rng.choice([0, 40])}][(i + seed) % 4]
        rows.setdefault("o", rng.randrange(rows["R"]))
        fn = {2: (1, 2)[(i + seed) % 2], 4: 3}[r.word]  # any function of the word size (Buckets: a writer MAY)
        r.param, r.count, r.sections = sb.encode_v2(sb.RSPARSE, old, new, r.word, fn=fn,
                                                     complement=rng.choice([0.0, 0.5, 2.0]), **rows)
        r.codec, r.lens = sb.RSPARSE, None
    data = sb.serialize(b, level=3)
    want = {f.path: f.data for f in target.files}
    assert sb.read(data, base) == want
    path = tmp / f"spec-rows{seed}.wdb"
    path.write_bytes(data)
    out = tmp / f"OUT-spec-rows{seed}"
    wdiff.apply(str(path), A, str(out))
    assert tree(out) == want


@pytest.mark.slow
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
    """CSPARSE (8), the two examples: the bytes the spec gives (table,
    position bits, section 2) decode with the spec reader to the values and
    the new words it states, and the spec writer writes exactly them."""
    old = np.array([0x3f00, 0x3f7f, 0x3e00, 0x3f10] * 2, np.uint16)
    # example 1: words 1 and 5 plus 1, word 4 minus 1, all movers (R = 1)
    new = old.copy()
    new[1] += 1
    new[5] += 1
    new[4] -= 1
    s0, s1, s2 = bytes.fromhex("0300010000"), bytes.fromhex("4c"), bytes.fromhex("002fff4000")
    assert sb.value_decode_sm(s2, 3, 2, "t", [3]) == ([0, 1, 0], [0, 0, 0])  # signs 0 1 0, every M = 0
    assert sb.value_decode(s2, 3, 2, "t", [3]).tolist() == [1, 0xFFFF, 1]  # +1, -1, +1
    rec = sb.Rec(sb.CHUNK, sb.CSPARSE, 2, 1, 0, 0, 16, 3, sb.ZERO, sb.ZERO, [s0, s1, s2])
    assert sb.value_layout(rec, old.tobytes(), 8) == (2, 3, [3], [1, 4, 5])
    assert sb.decode_chunk(rec, old.tobytes(), 8) == new.tobytes()
    assert sb.encode_v2(sb.CSPARSE, old.tobytes(), new.tobytes(), 2, fn=1) == (1, 3, [s0, s1, s2])
    # example 2: word 1 plus 1 (a mover), words 2 and 6 plus 1 and plus 2
    # within bucket 7c: runs of 1 (the mover) and 2 (the entry, complemented)
    new = old.copy()
    new[1] += 1
    new[2] += 1
    new[6] += 2
    s0, s1, s2 = bytes.fromhex("010001017c000100"), bytes.fromhex("40"), bytes.fromhex("000eff4000")
    assert sb.value_decode_sm(s2, 3, 2, "t", [1, 2]) == ([0, 0, 0], [0, 0, 1])  # M = 0; M = 0, then 1
    assert sb.value_decode(s2, 3, 2, "t", [1, 2]).tolist() == [1, 1, 2]
    rec = sb.Rec(sb.CHUNK, sb.CSPARSE, 2, 1, 0, 0, 16, 3, sb.ZERO, sb.ZERO, [s0, s1, s2])
    assert sb.value_layout(rec, old.tobytes(), 8) == (2, 3, [1, 2], [1, 2, 6])
    assert sb.decode_chunk(rec, old.tobytes(), 8) == new.tobytes()
    assert sb.encode_v2(sb.CSPARSE, old.tobytes(), new.tobytes(), 2, fn=1, rm=0) == (1, 3, [s0, s1, s2])
    # the runs matter: the same bytes as one run are other values (the one
    # model is fresh for the entry's M = 1, not shared with the mover's run)
    assert sb.value_decode_sm(s2, 3, 2, "t", [3]) != ([0, 0, 0], [0, 0, 1])


def test_spec_rsparse_example(tmp_path):
    """RSPARSE (10), the example: the bytes the spec gives decode with the
    spec reader to the words it states, the spec writer writes exactly them,
    and wdiff applies a bundle whose one CHUNK record is that example."""
    import random

    old = np.array([0x3f00, 0x3f7f, 0x3e00, 0x3f10] * 2, np.uint16)
    new = old.copy()
    new[6] += 1
    new[7] -= 1
    # the row list (R 3, o 1, k_r 2, r_r 0, u_r 1, unary 30), then the table
    # (k_m r_m u_m 0 0 0, E 2, entries 7c 00 01 and 01 01 00, u 1)
    s0 = bytes.fromhex("03 01 02 00 01 30") + bytes.fromhex("00 00 00 02 7c 00 01 01 01 00 01")
    s1, s2 = bytes.fromhex("20"), bytes.fromhex("002fff4000")
    rec = sb.Rec(sb.CHUNK, sb.RSPARSE, 2, 1, 0, 0, 16, 2, sb.ZERO, sb.ZERO, [s0, s1, s2])
    rl = sb.rsparse_rows(rec, 8)
    assert (rl.R, rl.o, rl.c0, rl.Nr, rl.rows, rl.pos.tolist()) == (3, 1, 2, 4, [2, 3], [4, 5, 6, 7])
    assert sb.value_layout(rec, old.tobytes(), 8) == (2, 2, [0, 1, 1], [6, 7])
    assert sb.value_decode(s2, 2, 2, "t", [0, 1, 1]).tolist() == [1, 0xFFFF]
    assert sb.decode_chunk(rec, old.tobytes(), 8) == new.tobytes()
    assert sb.encode_v2(sb.RSPARSE, old.tobytes(), new.tobytes(), 2, fn=1, R=3, o=1, rr=0) == (1, 2, [s0, s1, s2])
    A = write_tree(tmp_path / "A", {"model.safetensors": _st([("e", "BF16", old.reshape(2, 4))])})
    B = write_tree(tmp_path / "B", {"model.safetensors": _st([("e", "BF16", new.reshape(2, 4))])})
    b = sb.pack(sb.scan(A), sb.scan(B), random.Random(0), version=3)
    (chunk,) = [r for r in b.records if r.type == sb.CHUNK]
    chunk.codec, chunk.param, chunk.count, chunk.sections, chunk.lens = sb.RSPARSE, 1, 2, [s0, s1, s2], None
    data = sb.serialize(b)
    want = {"model.safetensors": (Path(B) / "model.safetensors").read_bytes()}
    assert sb.read(data, sb.scan(A)) == want
    (tmp_path / "ex.wdb").write_bytes(data)
    wdiff.apply(str(tmp_path / "ex.wdb"), A, str(tmp_path / "out"))
    assert tree(tmp_path / "out") == want


@pytest.mark.slow
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
    assert tree(out) == want
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
    A = write_tree(tmp_path / "A", {"m.safetensors": bad})
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


def _wdiff_values(data: bytes, k: int, w: int, runs: list):
    """wdiff's value decoder (its kernels, as apply calls them): (signs,
    magnitudes) or None for a refused stream."""
    from wdiff.codec import chunk, kernels

    got = kernels.rc_values_decode(data, k, w, runs)
    if isinstance(got, int):
        return None
    signs, planes = got
    neg = np.unpackbits(np.frombuffer(signs, np.uint8))[:k].tolist()
    return neg, chunk.unplanes(bytes(planes), k, w).tolist()


def _spec_values(data: bytes, k: int, w: int, runs: list):
    try:
        return sb.value_decode_sm(data, k, w, "values", runs)
    except sb.SpecError:
        return None


def _refused(data: bytes, k: int, w: int, runs: list) -> str:
    with pytest.raises(sb.SpecError) as e:
        sb.value_decode_sm(data, k, w, "values", runs)
    return str(e.value)


def _bump_tail(data: bytes, x: int) -> bytes | None:
    """The stream with x added to its last four bytes (big-endian)."""
    v = int.from_bytes(data[-4:], "big") + x
    return data[:-4] + v.to_bytes(4, "big") if v < 1 << 32 else None


def test_spec_value_coder_refusals():
    """Value section, each refusal of the spec on a stream the spec's writer
    wrote and then broke, with wdiff refusing the same streams; and what a
    reader accepts: an encoder leaves code = 0, so any code below the final
    range decodes to the same values."""
    rng = np.random.default_rng(11)
    signs = rng.integers(0, 2, 40).tolist()
    mags = [0, 1, 2, 3, 100, 0, 0, 1] * 5
    runs = [0, 10, 30]
    data = sb.value_encode_sm(signs, mags, 2, runs)
    assert len(data) > 6 and data[0] == 0
    assert sb.value_decode_sm(data, 40, 2, "values", runs) == (signs, mags)
    cases = {
        "shorter than 5 bytes": [data[:n] for n in range(5)],
        "first byte is not 0": [b"\x01" + data[1:], b"\xff" + data[1:]],
        "reads past the end": [data[:-1], data[:6]],
        "bytes remain unread": [data + b"\x00", data + data],
    }
    s, m, dec = sb.value_decode_sm(data, 40, 2, "values", runs, end=False)
    assert (s, m, dec.code) == (signs, mags, 0)
    # code starts at or above range only from bytes 1 to 4 ff ff ff ff; it
    # stays there (every bit 1, so D = 2^(8w-1)) while the bytes that follow
    # keep it from wrapping: here zeros
    top = b"\0\xff\xff\xff\xff" + bytes(100)
    s, m, dec = sb.value_decode_sm(top, 40, 2, "values", runs, end=False)
    assert s == [1] * 40 and m == [(1 << 15) - 1] * 40 and dec.code >= dec.range
    cases["code >= range"] = [top[:dec.pos]]
    for why, streams in cases.items():
        for bad in streams:
            assert why in _refused(bad, 40, 2, runs), (why, bad.hex())
            assert _wdiff_values(bad, 40, 2, runs) is None, (why, bad.hex())
    # every code below the final range is the same values, for both readers
    for x in (1, dec.range - 1):
        ok = _bump_tail(data, x)
        assert _spec_values(ok, 40, 2, runs) == (signs, mags) == _wdiff_values(ok, 40, 2, runs)
    # no value section is empty: MSPARSE and MBITMAP have k >= 1 (the
    # stream of no value at all is five zero bytes)
    assert sb.value_encode_sm([], [], 2, [0]) == bytes(5)


@pytest.mark.slow
def test_spec_value_coder_equals_wdiff():
    """The spec's value coder against wdiff's (its C kernels and its Python
    twin): the same bytes for every word width, alphabet and split into
    runs, empty runs included; and on streams broken at random (cut, grown,
    flipped, another first byte, a bumped tail, random bytes) the same
    verdict: the same values or both refusing."""
    import random

    from wdiff.codec import chunk, kernels

    rng = random.Random(5)
    was = kernels.set_native(True)
    try:
        for trial in range(160):
            kernels.set_native(trial % 2 == 0)
            w = (1, 2, 4, 8)[trial % 4]
            top = 8 * w - 1
            k = rng.randrange(1, 50)
            scale = (1, 3, 1000, 1 << top)[trial // 4 % 4]
            mags = [min((1 << top) - 1, int(rng.expovariate(1 / scale))) for _ in range(k)]
            mags[0] = (1 << top) - 1 if trial % 5 == 0 else mags[0]  # the longest bit length
            signs = [rng.randrange(2) for _ in range(k)]
            cuts = sorted(rng.randrange(k + 1) for _ in range(rng.randrange(4)))
            runs = [b - a for a, b in zip([0] + cuts, cuts + [k])]
            data = sb.value_encode_sm(signs, mags, w, runs)
            t = sb._UINT[w]
            planes = kernels.planes(np.array(mags, t), kernels.scratch("spec-test", k * w))
            packed = np.packbits(np.array(signs, np.uint8)).tobytes()
            assert kernels.rc_values_encode(packed, bytes(planes), w, runs) == data, (w, k, runs)
            assert _wdiff_values(data, k, w, runs) == (signs, mags) == _spec_values(data, k, w, runs)
            D = sb.value_decode(data, k, w, "values", runs)
            if not any(s == 0 and m == (1 << top) - 1 for s, m in zip(signs, mags)):
                assert sb.value_encode(D, w, runs) == data
            for _ in range(12):
                c = rng.randrange(7)
                bad = bytearray(data)
                if c == 0:
                    bad = bad[:rng.randrange(len(bad))]
                elif c == 1:
                    bad.append(rng.randrange(256))
                elif c == 2:
                    bad[rng.randrange(1, len(bad))] ^= 1 << rng.randrange(8)
                elif c == 3:
                    bad[0] = rng.randrange(1, 256)
                elif c == 4:
                    bad = bytearray(_bump_tail(data, rng.randrange(1, 1 << 31)) or data)
                elif c == 5:
                    bad = bytearray(b"\0" + rng.randbytes(rng.randrange(4, 2 * len(data))))
                else:  # code >= range at the start; the bytes after it may wrap it below
                    bad = bytearray(b"\0\xff\xff\xff\xff" + rng.randbytes(rng.randrange(0, 2 * len(data))))
                bad = bytes(bad)
                assert _spec_values(bad, k, w, runs) == _wdiff_values(bad, k, w, runs), (c, w, k, runs, bad.hex())
    finally:
        kernels.set_native(was)
    del chunk
