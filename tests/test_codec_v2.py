"""Codec v2 (bundle format version 3): modular differences and positions
conditioned on the base. Round trips over every word width, bucket function,
density and shape; C kernels against their numpy twins; hostile records;
the writer's version rule; squash and reverse over v3 bundles."""

from __future__ import annotations

import json
import os
import random
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from kit.cli import run

from wdiff.codec import chunk, conditioned, kernels
from wdiff.codec.chunk import CDENSE, CSPARSE, MBITMAP, MDENSE, MODULAR, MSPARSE, RSPARSE
from wdiff.errors import FormatError

LEVEL = 3
ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "data"

#: (safetensors dtype, word bytes, bucket function or None)
DTYPES = [("BF16", 2, 1), ("F16", 2, 2), ("F32", 4, 3), ("F64", 8, 4), ("I16", 2, None), ("I32", 4, None),
          ("I64", 8, None), ("U8", 1, None), ("C64", 4, 3)]
DENSITIES = [0.0001, 0.005, 0.03, 0.2, 0.55, 0.9, 1.0]
SIZES = [1, 7, 1000, 70_000]  # the last one is sampled (SAMPLE_MIN_WORDS)


def floats(rng, n: int, w: int) -> np.ndarray:
    """Weight-like bit patterns: normal values of the word's float type."""
    ut = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[w]
    if w == 1:
        return rng.integers(0, 256, n, dtype=np.uint8)
    x = rng.standard_normal(n) * 0.02
    if w == 2:
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return x.astype({4: np.float32, 8: np.float64}[w]).view(ut)


def step(rng, old: np.ndarray, density: float, how: str) -> np.ndarray:
    """A change of about ``density`` of the words: small moves (most +-1),
    moves across an exponent boundary, or arbitrary new words."""
    new = old.copy()
    n = old.size
    k = max(1, min(n, int(round(density * n))))
    pos = rng.choice(n, size=k, replace=False)
    t = old.dtype.type
    if how == "ulp":
        d = rng.choice([1, 1, 1, 2, 3, 7], size=k).astype(old.dtype)
        neg = rng.random(k) < 0.5
        new[pos] = np.where(neg, old[pos] - d, old[pos] + d)
    elif how == "carry":  # all-ones mantissas moving up: every word changes bucket
        new[pos] = old[pos] | t((1 << (8 * old.dtype.itemsize - 9)) - 1) if old.dtype.itemsize > 1 else old[pos] + t(1)
        new[pos] += t(1)
    else:
        new[pos] = rng.integers(0, np.iinfo(old.dtype).max, k, dtype=old.dtype, endpoint=True)
    return new


def roundtrip(old, new, enc):
    buf = old.copy()
    chunk.decode_into(enc.codec, enc.param, enc.count, list(enc.parts), buf, where="t")
    assert np.array_equal(buf, new), chunk.CODEC_NAMES[enc.codec]
    if enc.codec == chunk.RAW:
        return
    # what squash and reverse do: the delta from either side, then combine
    for ref, is_base in ((old, True), (new, False)):
        d = chunk.delta_words(enc.codec, enc.param, enc.count, list(enc.parts), ref, ref_is_base=is_base, where="t")
        fwd = old.copy()
        chunk.combine(enc.codec, fwd, d)
        assert np.array_equal(fwd, new)
        back = new.copy()
        chunk.combine(enc.codec, back, d, inverse=True)
        assert np.array_equal(back, old)


@pytest.mark.slow
@pytest.mark.parametrize("dtype,w,fn", DTYPES, ids=[d[0] for d in DTYPES])
def test_every_codec_round_trips(dtype, w, fn):
    rng = np.random.default_rng(abs(hash(dtype)) % 2**32)
    for n in SIZES:
        for density in DENSITIES:
            for how in ("ulp", "carry", "random"):
                old = floats(rng, n, w)
                new = step(rng, old, density, how)
                k = int(np.count_nonzero(old != new))
                if not k:
                    continue
                codecs = set(chunk.candidates(k / n, 3, chunk.bucket_function(dtype, w))) | {MSPARSE, MDENSE}
                if fn is not None and chunk.bucket_function(dtype, w) == fn:
                    codecs |= {CSPARSE, CDENSE, RSPARSE}
                rows = (max(2, n // 7), n // 13 % max(2, n // 7)) if n > 2 else None
                for c in sorted(codecs):
                    if c == RSPARSE and rows is None:
                        continue
                    enc = chunk.encode_as(c, old, new, LEVEL, fn, rows)
                    assert enc.codec == c and enc.count == (0 if c == chunk.RAW else k)
                    roundtrip(old, new, enc)
                best = chunk.encode_delta(old, new, LEVEL, version=3, dtype=dtype)
                roundtrip(old, new, best)
                v1 = chunk.encode_delta(old, new, LEVEL, version=1, dtype=dtype)
                assert v1.codec not in MODULAR
                if n < chunk.SAMPLE_MIN_WORDS:  # picked on the whole unit: never bigger than v1
                    assert best.size <= v1.size
                    if best.codec in MODULAR:
                        assert best.size < v1.size
                assert chunk.encode_delta(old.copy(), new.copy(), LEVEL, version=3, dtype=dtype) == best


def test_modular_difference_is_exact_at_the_edges():
    for ut in (np.uint8, np.uint16, np.uint32, np.uint64):
        top = np.iinfo(ut).max
        vals = np.array([0, 1, 2, top, top - 1, top // 2, top // 2 + 1], dtype=ut)
        old, new = np.meshgrid(vals, vals)
        old, new = old.ravel(), new.ravel()
        z = conditioned.zigzag_diff(old, new)
        assert np.array_equal(old + conditioned.unzigzag(z), new)
        d = (new - old)[old != new]
        neg, mag = conditioned.sign_magnitude(d)
        back = conditioned.from_sign_magnitude(np.unpackbits(neg)[: d.size].astype(bool), mag)
        assert np.array_equal(back, d)
        d = new - old
        neg, mag = conditioned.dense_sign_magnitude(d)
        back = conditioned.from_dense_sign_magnitude(np.unpackbits(neg)[: d.size].astype(bool), mag)
        assert np.array_equal(back, d)
        # non-canonical: a sign on a zero, the top magnitude without its sign
        assert conditioned.from_dense_sign_magnitude(np.array([True]), np.zeros(1, ut)) is None
        assert conditioned.from_dense_sign_magnitude(np.array([False]), np.array([top // 2 + 1], ut)) is None


@pytest.mark.slow
def test_bucket_kernels_match_their_numpy_twins():
    if not kernels.available():
        pytest.skip("the C extension is not built") if not os.environ.get("CI") else pytest.fail("no C extension in CI")
    rng = np.random.default_rng(7)
    for fn, (_, w, shift, mask) in conditioned.BUCKETS.items():
        for n in (1, 5, 4099, 100_000):
            for density in (0.001, 0.1, 0.7):
                old = floats(rng, n, w)
                new = step(rng, old, density, rng.choice(["ulp", "carry", "random"]))
                pos = np.flatnonzero(old != new)
                if not pos.size:
                    continue
                res = {}
                for native in (True, False):
                    was = kernels.set_native(native)
                    try:
                        enc = chunk.encode_as(CSPARSE, old, new, LEVEL, fn)
                        got = [x.tolist() for x in kernels.bucket_ranks(old, new, shift, mask, pos)]
                        mv = pos[np.asarray(got[0]) == mask + 1]
                        counts = kernels.bucket_counts(old, shift, mask, mv).tolist()
                        buf = old.copy()
                        chunk.decode_into(enc.codec, enc.param, enc.count, list(enc.parts), buf, where="t")
                    finally:
                        kernels.set_native(was)
                    assert np.array_equal(buf, new)
                    res[native] = (enc, got, counts)
                assert res[True] == res[False]
    was = kernels.set_native(True)
    try:  # a bad mover list, a rank that is not there
        ref = floats(rng, 100, 2)
        assert kernels.bucket_counts(ref, 7, 0xFF, np.array([5, 5], dtype=np.uint32)) is None
        assert kernels.bucket_counts(ref, 7, 0xFF, np.array([100], dtype=np.uint32)) is None
        off = np.zeros(257, dtype=np.int64)
        off[1:] = 1
        assert kernels.bucket_select(ref, 7, 0xFF, np.zeros(0, np.uint32), np.array([100], np.uint32), off) is None
    finally:
        kernels.set_native(was)


def _both(fn, *args):
    """fn(*args) under the C kernels and under numpy: (result or the
    Malformed message) for each."""
    out = []
    for native in (True, False):
        was = kernels.set_native(native)
        try:
            out.append(fn(*args))
        except conditioned.Malformed as e:
            out.append(str(e))
        finally:
            kernels.set_native(was)
    return out


def _same(a, b) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return all(np.array_equal(np.asarray(x), np.asarray(y)) if not isinstance(x, (bytes, int)) else x == y
               for x, y in zip(a, b))


def _csparse_copied(fn, old, new, positions):
    """encode_csparse's sections, listed positions, runs, signs and planes
    (copied: the planes are scratch) and positions, as bytes and arrays."""
    table, bits, listed, runs, signs, planes, found = conditioned.encode_csparse(fn, old, new, positions)
    return table, bits, np.array(listed), np.array(runs), bytes(signs), np.array(planes), np.array(found)


def test_fused_csparse_kernels_match_the_numpy_path():
    """csparse_encode and csparse_select (C) against the numpy path of
    encode_positions and decode_positions: the same bytes and the same
    positions, from either side, over every bucket function, at densities
    that complement buckets (more than half changed) and with movers."""
    if not kernels.available():
        pytest.skip("the C extension is not built") if not os.environ.get("CI") else pytest.fail("no C extension in CI")
    rng = np.random.default_rng(17)
    for fn, (_, w, _shift, _mask) in conditioned.BUCKETS.items():
        for n in (1, 3, 1000, 70_000):
            for density in (0.0005, 0.01, 0.2, 0.6, 0.95, 1.0):
                old = floats(rng, n, w)
                if rng.random() < 0.3:  # few buckets, so that some are mostly changed
                    old = old & old.dtype.type((1 << (8 * w - 4)) - 1) | old.dtype.type(0x3 << (8 * w - 4))
                new = step(rng, old, density, "ulp")
                new = step(rng, new, 0.003, rng.choice(["carry", "random"]))
                pos = np.flatnonzero(old != new)
                if not pos.size:
                    continue
                enc = _both(conditioned.encode_positions, fn, old, new, pos)
                assert _same(*enc)
                for given in (pos, None):  # the values too, ranked or found in the same pass
                    assert _same(*_both(_csparse_copied, fn, old, new, given))
                table, bits, listed, runs = enc[1]
                assert np.array_equal(np.sort(np.asarray(listed)), pos)
                assert sum(runs) == pos.size and all(r > 0 for r in runs[1:])
                for ref in (old, new):
                    dec = _both(conditioned.decode_positions, fn, ref, table, bits, pos.size)
                    assert _same(*dec)
                    assert np.array_equal(np.asarray(dec[0][0]), np.asarray(listed))
                    assert dec[0][2] == runs


def test_vector_bucket_counts_match_the_portable_ones():
    """The encoder's scan and the decoder's pass count two-byte words
    sixteen buckets at a time (a window chosen on a sample) and the rest
    one by one: records where the window is most of the words, where it is
    none of them (buckets spread over all 256, or all above it), at the top
    of a 32-bucket function (the window ends at the last bucket), with
    movers, in chunks whose tiles hold more words than a byte lane counts
    (255 steps of 32) and that end inside a step; the same bytes and
    positions as numpy and the portable C code, decoded from either side."""
    if not kernels.available():
        pytest.skip("the C extension is not built") if not os.environ.get("CI") else pytest.fail("no C extension in CI")
    rng = np.random.default_rng(23)
    cases = []
    for n in (31, 33, 8_191, 70_001, 300_017):
        cases.append((1, floats(rng, n, 2)))  # bf16 weights: the window holds 99.99%
        cases.append((1, rng.integers(0, 1 << 16, n, dtype=np.uint16)))  # every bucket alike
        low = floats(rng, n, 2)
        far = rng.random(n) < 0.3  # a third far outside the window
        low[far] = (low[far] & np.uint16(0x807F)) | np.uint16(0x7F00)
        cases.append((1, low))
        top = rng.integers(0, 1 << 16, n, dtype=np.uint16)
        top = (top & np.uint16(0x83FF)) | (rng.integers(26, 32, n).astype(np.uint16) << np.uint16(10))
        cases.append((2, top))  # f16 buckets 26..31 of 0..31: the window is 16..31
    for fn, old in cases:
        for density in (0.004, 0.05, 0.7):
            new = step(rng, old, density, "ulp")
            pos = np.flatnonzero(old != new)
            if not pos.size:
                continue
            table, bits, listed, _ = _both(conditioned.encode_positions, fn, old, new, pos)[1]
            for simd in (2, 1, 0):  # the scan, which finds the positions itself: every vector path, AVX2, none
                was = kernels._native.use_simd(simd)
                try:
                    got = conditioned.encode_csparse(fn, old, new, None)
                finally:
                    kernels._native.use_simd(was)
                assert got[0] == table and got[1] == bits and np.array_equal(got[2], listed)
                assert np.array_equal(got[6], pos)
                # the values, taken in the scan: numpy's modular differences at the listed positions
                signs, planes = bytes(got[4]), bytes(got[5])
                was = kernels.set_native(False)
                try:
                    want = kernels.mod_values(old, new, listed)
                finally:
                    kernels.set_native(was)
                assert signs == bytes(want[0]) and planes == bytes(want[1])
            for ref in (old, new):
                got = []
                for simd in (2, 1, 0):  # every vector path (AVX-512BW too), AVX2 only, none
                    was = kernels._native.use_simd(simd)
                    try:
                        got.append(_both(conditioned.decode_positions, fn, ref, table, bits, pos.size))
                    finally:
                        kernels._native.use_simd(was)
                for dec in got:
                    assert _same(*dec)
                    assert np.array_equal(np.asarray(dec[0][0]), np.asarray(listed))


def test_bucket_entries_listing_more_words_than_the_chunk_are_refused_before_any_scratch():
    """256 complemented entries that each claim every word of a 64 MiB
    chunk: a 1.5 KB table. The buckets are disjoint, so the table is
    refused as such; the decoder's scratch, sized by the coded words, once
    asked for 32 GiB first (MemoryError instead of a FormatError)."""
    v = conditioned.varint
    n = 1 << 25
    table = v(0) + v(0) + v(0) + v(256) + (v(0) + v(n) + v(1)) * 256 + v(0)
    with pytest.raises(FormatError, match="more words than the chunk"):
        chunk.decode_into(CSPARSE, 1, n, [table, b"", b""], np.zeros(n, dtype=np.uint16), where="h")


def test_movers_packed_into_every_tile_cost_no_more_than_the_words():
    """A hostile record: 7/8 of every tile of the decoder's pass are movers,
    and every bucket codes its last word in each tile, so that every entry
    looks at its whole tile. Each block of sixteen words once looked
    through all of its tile's movers: 6.8 s for this 19 KB record on a
    256 KiB chunk (minutes at 4 MiB). A mask per block makes it the time
    of the words (milliseconds); 2 s leaves a wide margin for a slow
    machine and none for the old cost."""
    import time

    v, T, n = conditioned.varint, 8192, 8192 * 16  # 8192: the pass's tile for 256 entries
    ref = np.random.default_rng(0).integers(0, 1 << 16, n, dtype=np.uint16)  # words in every bucket
    mv = np.flatnonzero(np.arange(n) % T < T - 1024).astype(np.uint32)
    keep = np.ones(n, dtype=bool)
    keep[mv] = False
    bits, counts = [], []
    for b in range(256):  # each bucket: the rank of its last non-mover word in each tile
        p = np.flatnonzero(keep & (((ref >> 7) & 0xFF) == b))
        last = np.flatnonzero(np.diff(p // T, append=-1))
        counts.append(last.size)
        for g in np.diff(last, prepend=-1) - 1:
            bits += [0] * int(g) + [1]
    unary = np.packbits(np.array(bits, dtype=np.uint8)).tobytes()
    _, u_m, _ = kernels.rice_encode(mv)
    table = v(mv.size) + v(0) + v(len(u_m)) + v(256) + b"".join(v(0) + v(c) + v(0) for c in counts) + v(len(unary))
    t = time.perf_counter()
    with pytest.raises(FormatError):  # the values are not there: refused once the positions are listed
        chunk.decode_into(CSPARSE, 1, mv.size + sum(counts), [table, u_m + unary, b"\0" * 5], ref.copy(), where="h")
    assert time.perf_counter() - t < 2.0


@pytest.mark.slow
def test_tiles_where_many_entries_have_work_list_the_same_positions():
    """Words spread over every bucket (random 4- and 8-byte patterns: 256
    and 2,048 exponents), so that many entries have words in each tile of
    the decoder's pass and it lists the tile's words by bucket instead of
    looking at it block by block: the same positions as numpy, from
    either side, with movers, plain and complemented entries."""
    if not kernels.available():
        pytest.skip("the C extension is not built") if not os.environ.get("CI") else pytest.fail("no C extension in CI")
    rng = np.random.default_rng(41)
    for w, fn in ((4, 3), (8, 4), (2, 1)):
        ut = {2: np.uint16, 4: np.uint32, 8: np.uint64}[w]
        for n in (70_001, 200_003):
            old = rng.integers(0, np.iinfo(ut).max, n, dtype=ut, endpoint=True)
            for density in (0.02, 0.3, 0.8):
                new = step(rng, step(rng, old, density, "ulp"), 0.001, "carry")
                pos = np.flatnonzero(old != new)
                table, bits, listed, _ = _both(conditioned.encode_positions, fn, old, new, pos)[1]
                for ref in (old, new):
                    native, numpy_ = _both(conditioned.decode_positions, fn, ref, table, bits, pos.size)
                    assert _same(native, numpy_)
                    assert np.array_equal(np.asarray(native[0]), np.asarray(listed))


def test_every_f64_bucket_coding_a_word_in_every_tile_costs_no_more_than_the_words():
    """A hostile f64 record: every one of 2,048 buckets codes its last word
    in each 65,536-word tile, so each entry would look at every tile from
    its start (1.7 s for this 16 MiB chunk, from a 0.3 MB record); the
    tile's words listed by bucket once make it milliseconds."""
    import time

    _, _, shift, mask = conditioned.BUCKETS[4]
    T, n = 1 << 16, 32 << 16
    ref = np.random.default_rng(5).integers(0, np.iinfo(np.uint64).max, n, dtype=np.uint64, endpoint=True)
    b = ((ref >> np.uint64(shift)) & np.uint64(mask)).astype(np.int64)
    v = conditioned.varint
    order = np.argsort(b, kind="stable")
    starts = np.searchsorted(b[order], np.arange(mask + 2))
    table, unary, count, entries, prev = b"", [], 0, 0, -1
    for bk in range(mask + 1):
        p = order[starts[bk]:starts[bk + 1]]  # the bucket's words, by position
        if not p.size:
            continue
        last = np.flatnonzero(np.diff(p // T, append=-1) != 0)  # its last word in each tile
        gaps = np.diff(last, prepend=-1) - 1
        q = np.zeros(int(gaps.sum()) + gaps.size, dtype=np.uint8)
        q[np.cumsum(gaps + 1) - 1] = 1
        unary.append(q)
        table += v(bk - prev - 1) + v(last.size) + v(0)
        prev, entries, count = bk, entries + 1, count + last.size
    ubytes = np.packbits(np.concatenate(unary)).tobytes()
    table = v(0) + v(0) + v(0) + v(entries) + table + v(len(ubytes))
    t = time.perf_counter()
    with pytest.raises(FormatError):  # the values are not there
        chunk.decode_into(CSPARSE, 4, count, [table, ubytes, b"\0" * 5], ref.copy(), where="h")
    assert time.perf_counter() - t < 0.8


def test_fused_csparse_decoder_refuses_what_numpy_refuses():
    """Mutated tables and position streams: the C decoder gives the numpy
    path's answer, the same positions or the same refusal, and never
    crashes or writes out of bounds."""
    if not kernels.available():
        pytest.skip("the C extension is not built") if not os.environ.get("CI") else pytest.fail("no C extension in CI")
    rng = np.random.default_rng(19)
    rnd = random.Random(19)
    for density in (0.01, 0.3, 0.8):
        old = floats(rng, 4000, 2)
        old[:1500] = old[:1500] & 0x807F | 0x3C00  # one big bucket: complemented at 0.8
        new = step(rng, old, density, "ulp")
        new = step(rng, new, 0.003, "carry")
        pos = np.flatnonzero(old != new)
        table, bits, _, _ = conditioned.encode_positions(1, old, new, pos)
        for t, b in _mutants([table, bits], rnd, 300):
            for count in (pos.size, pos.size - 1):
                got = _both(conditioned.decode_positions, 1, old, t, b, count)
                assert _same(*got), got
    # the kernel's own checks: entries it is handed that break the rules are refused
    ref = floats(rng, 100, 2)
    counts = kernels.bucket_counts(ref, 7, 0xFF, np.zeros(0, np.uint32))
    b0 = int(np.argmax(counts[:256]))
    bad = [[(b0, int(counts[b0]) + 1, 0)], [(b0, 1, 0), (b0, 1, 0)], [(300, 1, 0)], [(b0, 0, 0)],
           [(b0, int(counts[b0]), 1)], [(b0, 1, 2 * 41)]]
    was = kernels.set_native(True)
    try:
        for rows in bad:
            with pytest.raises(ValueError):
                kernels.csparse_select(ref, 7, 0xFF, np.zeros(0, np.uint32), np.array(rows, np.int64), counts,
                                       b"\x80", b"", 1)
        # counts that lie about ref: an error code, no write past the entry's share
        lying = counts.copy()
        lying[b0] += 5
        got = kernels.csparse_select(ref, 7, 0xFF, np.zeros(0, np.uint32), np.array([(b0, 0, 1)], np.int64),
                                     lying, b"", b"", int(lying[b0]))
        assert got[0] == kernels.CS_OUT_OF_RANGE
        lying[b0] -= 10
        got = kernels.csparse_select(ref, 7, 0xFF, np.zeros(0, np.uint32), np.array([(b0, 0, 1)], np.int64),
                                     lying, b"", b"", int(lying[b0]))
        assert got[0] == kernels.CS_OUT_OF_RANGE
        # fused (counts not given): the pass counts the buckets as bucket_counts does
        old = floats(rng, 5000, 2)
        new = step(rng, old, 0.02, "ulp")
        new = step(rng, new, 0.002, "carry")
        pos = np.flatnonzero(old != new)
        movers = conditioned.movers_of(1, old, new)
        want = kernels.bucket_counts(old, 7, 0xFF, movers)
        rows = np.array([(b0, 1, 0)], np.int64)
        got = kernels.csparse_select(old, 7, 0xFF, movers, rows, None, b"\x80", b"", 1)
        assert got[1].tolist() == want.tolist() and got[0].tolist() == [pos_of_rank(old, movers, b0, 0)]
        # complemented entries without the counts: staged, then put in place
        b0, b1 = (int(b) for b in np.argsort(want[:256], kind="stable")[-2:])
        rows = np.array(sorted([(b0, 0, 1), (b1, 1, 1)]), np.int64)
        n0, n1 = int(want[b0]), int(want[b1])
        got = kernels.csparse_select(old, 7, 0xFF, movers, rows, None, b"\x80", b"", n0 + n1 - 1)
        every = {b: [pos_of_rank(old, movers, b, j) for j in range(int(want[b]))] for b in (b0, b1)}
        expect = [p for b in sorted((b0, b1)) for p in (every[b] if b == b0 else every[b][1:])]
        assert got[0].tolist() == expect
        for listed in (n0 + n1 - 2, n0 + n1):  # a count that does not match: refused, nothing past out
            assert kernels.csparse_select(old, 7, 0xFF, movers, rows, None, b"\x80", b"", listed)[0] == kernels.CS_OUT_OF_RANGE
        rows = np.array([(b0, 1, 0)], np.int64)
        bad = movers[::-1].copy()
        if bad.size > 1:
            assert kernels.csparse_select(old, 7, 0xFF, bad, rows, None, b"\x80", b"", 1)[0] == kernels.CS_BAD_MOVERS
    finally:
        kernels.set_native(was)


def _magnitudes(rng, k: int, w: int, kind: int) -> np.ndarray:
    bits = 8 * w
    if kind == 0:  # an optimizer step: mostly 0 and 1
        mag = rng.geometric(0.6, k).astype(np.uint64) - np.uint64(1)
    elif kind == 1:  # anything a word can hold
        mag = rng.integers(0, 1 << (bits - 1), k, dtype=np.uint64)
    else:  # every bit length, the longest included
        mag = rng.integers(0, 4, k).astype(np.uint64) << rng.integers(0, bits - 2, k).astype(np.uint64)
    mag[: min(k, 2)] = (1 << (bits - 1)) - 1
    return np.minimum(mag, np.uint64((1 << (bits - 1)) - 1)).astype(f"<u{w}")


def test_value_coder_matches_its_python_twin_and_refuses_what_it_cannot_have_written():
    """rc_values_encode / rc_values_decode (C) against wdiff/codec/rangecoder.py:
    the same bytes for every word width, alphabet and split into runs
    (empty runs included), the values back exactly; a stream cut short,
    with a byte more or with another first byte is refused; random bytes
    get the same answer from both, never a crash."""
    from wdiff.codec import rangecoder

    assert rangecoder.LIMIT == kernels.RC_LIMIT  # the C side's is checked at import (kernels.CONTRACT)
    if not kernels.available():
        pytest.skip("the C extension is not built") if not os.environ.get("CI") else pytest.fail("no C extension in CI")
    rng = np.random.default_rng(23)
    was = kernels.set_native(True)
    try:
        for w in (1, 2, 4, 8):
            for trial in range(24):
                k = int(rng.integers(1, 300))
                mag = _magnitudes(rng, k, w, trial % 3)
                neg = rng.integers(0, 2, k).astype(np.uint8)
                signs = np.packbits(neg).tobytes()
                mplanes = kernels.planes(mag.copy()).copy()
                cuts = sorted(rng.integers(0, k + 1, 3).tolist())
                runs = [cuts[0], cuts[1] - cuts[0], cuts[2] - cuts[1], k - cuts[2]]
                data = kernels.rc_values_encode(signs, mplanes, w, runs)
                assert data == rangecoder.encode_values(neg, mag, 8 * w, runs)
                for native in (True, False):
                    kernels.set_native(native)
                    got = kernels.rc_values_decode(data, k, w, runs)
                    assert not isinstance(got, int)
                    assert got[0] == signs and bytes(got[1]) == bytes(mplanes)
                    for bad in (data[:-1], data + b"\0", b"\1" + data[1:], data[:4]):
                        assert kernels.rc_values_decode(bad, k, w, runs) == kernels.RC_BAD_STREAM
                kernels.set_native(True)
                with pytest.raises(ValueError):
                    kernels.rc_values_encode(signs, mplanes, w, [k + 1])
        # random bytes: the C decoder and the twin agree, value for value or refusal for refusal
        for _ in range(200):
            k = int(rng.integers(1, 50))
            data = b"\0" + rng.integers(0, 256, int(rng.integers(4, 40)), dtype=np.uint8).tobytes()
            kernels.set_native(True)
            c = kernels.rc_values_decode(data, k, 2, [k])
            c = c if isinstance(c, int) else (c[0], bytes(c[1]))
            kernels.set_native(False)
            p = kernels.rc_values_decode(data, k, 2, [k])
            p = p if isinstance(p, int) else (p[0], bytes(p[1]))
            assert c == p
    finally:
        kernels.set_native(was)


def _steered(k: int, w: int, runs: list[int], choose) -> tuple[np.ndarray, np.ndarray]:
    """Signs and magnitudes of k words of w bytes whose every coded bit is
    choose(p, bound, at): the coder's own arithmetic (rangecoder.py) walked
    down the binarization, with at the offset of a point that started
    halfway up the coder's first interval (it moves with the interval)."""
    from wdiff.codec import rangecoder

    bits, state = 8 * w, {"range": 0xFFFFFFFF, "at": 1 << 31}

    def bit(m) -> int:
        p = m.p if m is not None else 32768
        bound = (state["range"] >> 16) * p
        b = choose(p, bound, state["at"])
        if b:
            state["at"] -= bound
            state["range"] -= bound
        else:
            state["range"] = bound
        while state["range"] < 1 << 24:
            state["range"] <<= 8
            state["at"] <<= 8
        if m is not None:
            m.adapt(b)
        return b

    neg, mag, sign = [], [], rangecoder._Bit()
    for size in runs:
        m = rangecoder._Model()
        for _ in range(size):
            neg.append(bit(sign))
            if not bit(m.zero):
                mag.append(0)
            elif not bit(m.one):
                mag.append(1)
            else:
                L = 2
                while L < bits - 1 and bit(m.len[L]):
                    L += 1
                v = 2 | bit(m.lead[L])
                for _ in range(L - 2):
                    v = v << 1 | bit(None)
                mag.append(v)
    return np.array(neg, np.uint8), np.array(mag, f"<u{w}")


def _coded_both_ways(neg: np.ndarray, mag: np.ndarray, w: int, runs: list[int]) -> bytes:
    """The C stream of these words: the twin's bytes, and the words back."""
    from wdiff.codec import rangecoder

    signs, mplanes = np.packbits(neg).tobytes(), kernels.planes(mag.copy()).copy()
    data = kernels.rc_values_encode(signs, mplanes, w, runs)
    assert data == rangecoder.encode_values(neg, mag, 8 * w, runs)
    got = kernels.rc_values_decode(data, mag.size, w, runs)
    assert not isinstance(got, int) and got[0] == signs and bytes(got[1]) == bytes(mplanes)
    for bad in (data[:-1], data + b"\0"):
        assert kernels.rc_values_decode(bad, mag.size, w, runs) == kernels.RC_BAD_STREAM
    return data


def test_value_coder_agrees_with_its_twin_on_long_runs_and_hostile_bit_patterns():
    """The C loops against rangecoder.py where short streams do not go:
    runs long enough that every model of the common words reaches its
    slowest rate, every bit length up to the longest, a carry through a
    long run of held-back 0xff bytes, bits that each cost about one bit,
    and streams that outgrow their first buffer."""
    if not kernels.available():
        pytest.skip("the C extension is not built") if not os.environ.get("CI") else pytest.fail("no C extension in CI")
    rng = np.random.default_rng(31)
    was = kernels.set_native(True)
    try:
        for w in (1, 2, 4, 8):
            k = 3000
            mag = (rng.geometric(0.55, k) - 1).astype(np.uint64)
            tail = np.flatnonzero(rng.random(k) < 0.1)  # every bit length, the longest included
            lead = np.uint64(1) << (rng.permutation(tail.size) % (8 * w - 2) + 1).astype(np.uint64)
            mag[tail] = lead | (rng.integers(0, 1 << 63, tail.size, dtype=np.uint64) & (lead - np.uint64(1)))
            mag[:3] = (1 << (8 * w - 1)) - 1
            mag = np.minimum(mag, np.uint64((1 << (8 * w - 1)) - 1)).astype(f"<u{w}")
            assert {int(v).bit_length() for v in mag} >= set(range(8 * w))
            neg = rng.integers(0, 2, k).astype(np.uint8)
            _coded_both_ways(neg, mag, w, [0, 700, 2, 0, 1500, k - 2202])

        # the coder's interval kept around one point for 3,000 bits, then past
        # it: the first byte held back, 0x7f, and all the 0xff after it carry
        def around(seen):
            def choose(p, bound, at):
                seen["bits"] += 1
                if seen["past"]:
                    return int(p < 32768)
                seen["past"] = seen["bits"] >= 3000 and at < bound
                return int(at >= bound or seen["past"])

            return choose

        for w in (1, 2):
            seen = {"bits": 0, "past": False}
            neg, mag = _steered(1500, w, [1500], around(seen))
            data = _coded_both_ways(neg, mag, w, [1500])
            assert seen["past"] and data[:16] == b"\0\x80" + bytes(14)

        # every bit the less likely one, each model kept near a coin toss
        neg, mag = _steered(3000, 2, [1000, 2000], lambda p, bound, at: int(p >= 32768))
        _coded_both_ways(neg, mag, 2, [1000, 2000])

        # words that do not compress: the stream outgrows its first buffer
        # (the planes' size and 64 bytes, with 256 kept free for a word)
        for w in (1, 8):
            mag = rng.integers(0, 1 << (8 * w - 1), 3000, dtype=np.uint64).astype(f"<u{w}")
            data = _coded_both_ways(rng.integers(0, 2, 3000).astype(np.uint8), mag, w, [3000])
            assert len(data) > mag.nbytes + 64 - 256
    finally:
        kernels.set_native(was)


def test_value_coder_reaches_the_entropy_of_a_skewed_alphabet():
    """What the coder is for: magnitudes of an optimizer step (geometric,
    mostly 0) and near-random signs cost within 3% of their order-0 entropy,
    where zstd of the planes cannot code a symbol in under a bit."""
    rng = np.random.default_rng(29)
    k = 50_000
    mag = (rng.geometric(0.8, k) - 1).astype("<u2")
    neg = rng.integers(0, 2, k).astype(np.uint8)
    data = kernels.rc_values_encode(np.packbits(neg).tobytes(), kernels.planes(mag.copy()).copy(), 2, [k])
    h = np.bincount(mag)
    p = h[h > 0] / k
    entropy = k * (1.0 + float(-(p * np.log2(p)).sum()))
    assert len(data) * 8 <= 1.03 * entropy
    zstd_planes = len(chunk.plane_compressor(3).compress(kernels.planes(mag.copy()).tobytes()))
    assert len(data) * 8 < k + zstd_planes * 8


def test_value_section_kernels_match_their_numpy_twins():
    """mod_values (encode) and mod_apply (decode, check, add in place) in C
    against numpy: the same bytes, the same verdict on bad magnitudes and
    on words in the wrong bucket, and a refused section leaves the buffer
    as it was."""
    if not kernels.available():
        pytest.skip("the C extension is not built") if not os.environ.get("CI") else pytest.fail("no C extension in CI")
    rng = np.random.default_rng(23)
    for w in (1, 2, 4, 8):
        for n in (1, 9, 5000):
            for density in (0.001, 0.1, 1.0):
                old = floats(rng, n, w)
                new = step(rng, old, density, rng.choice(["ulp", "carry", "random"]))
                pos = np.flatnonzero(old != new)
                if not pos.size:
                    continue
                for dense in (False, True):
                    at = np.arange(n) if dense else pos
                    got = _twins(_values_copied, old, new, at, dense)
                    assert got[0] == got[1]
                fns = [(0, 0, 0)] + [(fn, b[2], b[3]) for fn, b in conditioned.BUCKETS.items() if b[1] == w]
                for fn, shift, mask in fns:
                    movers = np.flatnonzero(((old[pos] >> old.dtype.type(shift)) & old.dtype.type(mask))
                                            != ((new[pos] >> old.dtype.type(shift)) & old.dtype.type(mask))) if mask else []
                    order = np.concatenate([pos[movers], np.delete(pos, movers)]).astype(np.uint32) if mask else pos
                    s2, p2 = kernels.mod_values(old, new, order)
                    variants = [(bytes(s2), bytes(p2), len(movers), 0)]
                    bad = bytearray(p2)
                    bad[0] |= 0x80  # the first word's magnitude >= 2^(8w-1)
                    variants.append((bytes(s2), bytes(bad), len(movers), kernels.MV_BAD_MAGNITUDE))
                    if mask:
                        variants.append((bytes(s2), bytes(p2), len(movers) + 1 if len(movers) < order.size else 0, kernels.MV_WRONG_BUCKET))
                    for sg, pl, km, want in variants:
                        res = []
                        for native in (True, False):
                            was = kernels.set_native(native)
                            try:
                                buf = old.copy()
                                code = kernels.mod_apply(buf, order, sg, pl, shift, mask, km)
                            finally:
                                kernels.set_native(was)
                            res.append((code, buf.tobytes()))
                        assert res[0] == res[1]
                        if want == 0:
                            assert res[0][0] == 0 and res[0][1] == new.tobytes()
                        else:
                            assert res[0] == (want, old.tobytes())
    was = kernels.set_native(True)
    try:  # a position outside the buffer: refused before any write
        buf = floats(rng, 10, 2)
        keep = buf.copy()
        assert kernels.mod_apply(buf, np.array([3, 10], np.uint32), b"\x00", b"\x00" * 4, 0, 0, 0) == kernels.MV_OUT_OF_RANGE
        assert np.array_equal(buf, keep)
    finally:
        kernels.set_native(was)


def _values_copied(*args):
    signs, mplanes = kernels.mod_values(*args)
    return signs, bytes(mplanes)  # the planes are scratch: copied before the other twin runs


def _twins(fn, *args):
    out = []
    for native in (True, False):
        was = kernels.set_native(native)
        try:
            out.append(fn(*args))
        finally:
            kernels.set_native(was)
    return out


def pos_of_rank(ref, movers, b, j):
    """The position of the word of rank j among the non-mover words of bucket b (slowly)."""
    bk = (ref >> 7) & 0xFF
    ok = np.ones(ref.size, bool)
    ok[movers] = False
    return int(np.flatnonzero((bk == b) & ok)[j])


def test_conditioned_positions_pay_on_an_optimizer_like_step():
    """The physics the codec is for: an fp32 master moved by about lr,
    cast to bf16, changes small weights more often. CSPARSE must be picked
    and be well below v1 (the benchmark measures how far)."""
    rng = np.random.default_rng(3)
    n = 1 << 18
    master = (rng.standard_normal(n) * 0.02).astype(np.float32)
    bf = lambda x: ((x.view(np.uint32).astype(np.uint64) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) >> 16).astype(np.uint16)  # noqa: E731
    lr = np.float32(3e-7) * np.where(rng.random(n) < 0.5, -1, 1).astype(np.float32)
    old, new = bf(master), bf(master + lr)
    v2 = chunk.encode_delta(old, new, LEVEL, version=3, dtype="BF16")
    v1 = chunk.encode_delta(old, new, LEVEL, version=1, dtype="BF16")
    assert v2.codec == CSPARSE and v2.size < 0.75 * v1.size
    roundtrip(old, new, v2)



def _encoded_codecs(monkeypatch, old, new):
    """(what encode_delta chose, the codecs it encoded on the whole chunk,
    those it tried on the sample)."""
    whole, sampled = set(), set()
    real = chunk._Trial._encode

    def spy(self, codec):
        (whole if self.new.size == new.size else sampled).add(codec)
        return real(self, codec)

    monkeypatch.setattr(chunk._Trial, "_encode", spy)
    got = chunk.encode_delta(old, new, LEVEL, version=3, dtype="BF16")
    monkeypatch.setattr(chunk._Trial, "_encode", real)
    return got, whole, sampled


def test_conditioned_codecs_are_spent_where_the_buckets_pay(monkeypatch):
    """CSPARSE and CDENSE cost several times their counterparts (MSPARSE,
    MDENSE): where the base's buckets say nothing of the change (uniform
    moves at random positions, every word moved by one to three ulps, an
    unrelated target), they are not encoded in full, and above
    LOOK_DENSITY not even on the sample; on an optimizer-like step, where
    small weights change more often, CSPARSE is encoded and chosen. Each
    pick is within the sample margin of the best of every candidate
    encoded in full."""
    rng = np.random.default_rng(31)
    n = 1 << 18
    old = floats(rng, n, 2)
    master = (rng.standard_normal(n) * 0.02).astype(np.float32)
    bf = lambda x: ((x.view(np.uint32).astype(np.uint64) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) >> 16).astype(np.uint16)
    lr = np.float32(1e-6) * np.where(rng.random(n) < 0.5, -1, 1).astype(np.float32)
    dense = (old.astype(np.int32) + rng.integers(1, 4, n) * np.where(rng.random(n) < 0.5, 1, -1)).astype(np.uint16)
    cases = {
        "uniform 1%": (old, step(rng, old, 0.01, "ulp"), None, {CSPARSE}, set()),
        "uniform 30%": (old, step(rng, old, 0.3, "ulp"), None, {CSPARSE, CDENSE}, {CSPARSE, CDENSE}),
        "dense": (old, dense, chunk.MDENSE, {CDENSE}, {CDENSE}),
        "unrelated": (old, floats(rng, n, 2), chunk.RAW, {CDENSE}, {CDENSE}),
        "optimizer step": (bf(master), bf(master + lr), CSPARSE, set(), set()),
    }
    for name, (a, b, want, not_whole, not_sampled) in cases.items():
        got, whole, sampled = _encoded_codecs(monkeypatch, a, b)
        assert not (whole & not_whole) and not (sampled & not_sampled), (name, whole, sampled)
        if want is not None:
            assert got.codec == want, name
        every = [chunk.encode_as(c, a, b, LEVEL, bucket=chunk.bucket_function("BF16", 2))
                 for c in chunk.candidates(np.count_nonzero(a != b) / n, 3, chunk.bucket_function("BF16", 2))]
        assert got.size <= min(e.size for e in every) * chunk.SAMPLE_MARGIN * 1.01, name
        roundtrip(a, b, got)


# -- hostile records ----------------------------------------------------------------


def _mutants(parts, rnd: random.Random, count: int):
    for _ in range(count):
        p = [bytearray(x) for x in parts]
        i = rnd.randrange(len(p))
        how = rnd.randrange(4)
        if how == 0 and p[i]:
            p[i][rnd.randrange(len(p[i]))] ^= 1 << rnd.randrange(8)
        elif how == 1 and p[i]:
            del p[i][rnd.randrange(len(p[i])):]
        elif how == 2:
            p[i] += bytes([rnd.randrange(256)])
        else:
            p[i][0:0] = b"\xff" * rnd.randrange(1, 12)
        yield [bytes(x) for x in p]


@pytest.mark.parametrize("codec", [CSPARSE, CDENSE, MSPARSE, MBITMAP, MDENSE, RSPARSE], ids=lambda c: chunk.CODEC_NAMES[c])
def test_hostile_records_give_a_format_error_and_nothing_else(codec):
    rng = np.random.default_rng(11)
    rnd = random.Random(codec)
    old = floats(rng, 5000, 2)
    new = step(rng, old, 0.6 if codec in (MDENSE, CDENSE) else 0.05, "ulp")
    new = step(rng, new, 0.002, "carry")  # some movers
    if codec == RSPARSE:  # changes in a few rows of 100 words
        keep = (np.arange(old.size) // 100) % 7 != 3
        new[keep] = old[keep]
    enc = chunk.encode_as(codec, old, new, LEVEL, 1, (100, 30))
    for parts in _mutants(enc.parts, rnd, 150):
        for param, count in ((enc.param, enc.count), (enc.param, enc.count + 1),
                             (9 if codec in (CSPARSE, CDENSE, RSPARSE) else 1, enc.count)):
            buf = old.copy()
            try:
                chunk.decode_into(codec, param, count, parts, buf, where="h")
            except FormatError:
                continue
            # accepted: it must be a valid record, so its result is exact on a second decode
            again = old.copy()
            chunk.decode_into(codec, param, count, parts, again, where="h")
            assert np.array_equal(buf, again)
    # wrong word width for the bucket function, count out of range, unused section
    for param, count, parts in ((3, enc.count, enc.parts), (enc.param, 0, enc.parts), (enc.param, 10**9, enc.parts)):
        with pytest.raises(FormatError):
            chunk.decode_into(codec, param, count, list(parts), old.copy(), where="h")
    with pytest.raises(FormatError):
        chunk.decode_into(codec, enc.param, enc.count, list(enc.parts) + [b"x"] * (4 - len(enc.parts)), old.copy(), where="h")


def _rows_step(rng, n: int, R: int, o: int, row_fraction: float, density: float):
    """A step that changes words in a fraction of the rows only (embedding
    rows of the tokens a step saw)."""
    old = floats(rng, n, 2)
    new = step(rng, old, density, "ulp")
    row = conditioned.rows_of(np.arange(n), R, o)
    hot = rng.random(int(row[-1]) + 1) < row_fraction
    cold = ~hot[row]
    new[cold] = old[cold]
    return old, new


def test_rsparse_round_trips_from_either_side_and_wins_where_few_rows_change():
    """RSPARSE over every row layout (a partial first row or none, rows longer
    than the chunk refused by the encoder's caller, one row): decoded from
    the base and from the target (a reverse), the same words; and where few
    rows change, encode_delta keeps it because it is smaller than CSPARSE."""
    rng = np.random.default_rng(31)
    for n, R, o in ((1000, 10, 0), (1000, 10, 7), (4096, 384, 100), (777, 1, 0), (5000, 4999, 3), (70_000, 384, 5)):
        old, new = _rows_step(rng, n, R, o, 0.1, 0.05)
        if not (old != new).any():
            continue
        enc = chunk.encode_as(RSPARSE, old, new, LEVEL, 1, (R, o))
        roundtrip(old, new, enc)
        d = chunk.delta_words(RSPARSE, enc.param, enc.count, list(enc.parts), new, ref_is_base=False, where="t")
        assert np.array_equal(new - d, old)
    old, new = _rows_step(rng, 1 << 18, 384, 17, 0.03, 0.05)
    best = chunk.encode_delta(old, new, LEVEL, version=3, dtype="BF16", rows=(384, 17))
    plain = chunk.encode_delta(old, new, LEVEL, version=3, dtype="BF16")
    assert best.codec == RSPARSE and best.size < 0.8 * plain.size
    roundtrip(old, new, best)
    # every row changed: RSPARSE is not even tried
    old, new = _rows_step(rng, 1 << 17, 384, 0, 1.0, 0.05)
    assert chunk.encode_delta(old, new, LEVEL, version=3, dtype="BF16", rows=(384, 0)).codec != RSPARSE


def test_rsparse_refuses_a_row_without_a_change_and_bad_row_heads():
    rng = np.random.default_rng(37)
    old, new = _rows_step(rng, 2000, 50, 20, 0.2, 0.1)
    new[-200:] = old[-200:]
    enc = chunk.encode_as(RSPARSE, old, new, LEVEL, 1, (50, 20))
    R, o, rows, at = conditioned.read_row_head(enc.parts[0], old.size)
    assert (R, o) == (50, 20)
    after = np.arange(int(rows[-1]) + 1, conditioned.row_count(old.size, R, o))
    assert after.size  # a row after the last one listed: its words come last in every bucket
    extra = after[-1:]
    bad_heads = [
        conditioned.row_head(R, o, np.sort(np.concatenate([rows, extra]))),  # a row with no change listed
        conditioned.row_head(old.size + 1, 0, rows),  # rows longer than the chunk
        conditioned.row_head(R, R, rows),  # offset not below the row length
    ]
    for head in bad_heads:
        buf = old.copy()
        with pytest.raises(FormatError):
            chunk.decode_into(RSPARSE, enc.param, enc.count, [head + enc.parts[0][at:], *enc.parts[1:]], buf,
                              where="t")
        assert np.array_equal(buf, old)


def test_csparse_refuses_a_listed_word_in_the_wrong_bucket():
    """A mover that does not move (or a non-mover that does) would make the
    record undecodable from the target: the reader refuses it."""
    old = np.array([0x3F00, 0x3F7F, 0x3E00, 0x3F10] * 4, dtype=np.uint16)
    new = old.copy()
    new[1] += 1  # 0x3F7F -> 0x3F80: exponent 0x7E -> 0x7F, a mover
    new[5] += 1
    enc = chunk.encode_as(CSPARSE, old, new, LEVEL, 1)
    roundtrip(old, new, enc)
    other = old.copy()
    other[1] -= 1  # now the same record moves word 1 within its bucket: refused
    with pytest.raises(FormatError, match="wrong bucket"):
        chunk.decode_into(CSPARSE, enc.param, enc.count, list(enc.parts), other, where="h")


# -- bundles ------------------------------------------------------------------------


#: the command line, output as bytes, without the manifest cache
wdiff = partial(run, text=False, env={"WDIFF_CACHE_DIR": "none"})


@pytest.mark.slow
def test_pack_format_option_and_versions(tmp_path):
    base, adam = GOLDEN / "ckpt" / "base", GOLDEN / "ckpt" / "adam"
    r = wdiff("pack", "--json", "--format", "1", base, adam, "-o", tmp_path / "v1.wdb")
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout)["codecs"]) <= {"sparse", "bitmap", "dense", "raw"}
    assert (tmp_path / "v1.wdb").read_bytes()[8] == 1
    r = wdiff("pack", "--json", base, adam, "-o", tmp_path / "v3.wdb")
    assert r.returncode == 0 and (tmp_path / "v3.wdb").read_bytes()[8] == 3
    assert (tmp_path / "v3.wdb").stat().st_size < (tmp_path / "v1.wdb").stat().st_size
    for bad in ("0", "4"):
        r = wdiff("pack", "--format", bad, base, adam, "-o", tmp_path / "x.wdb")
        assert r.returncode == 2 and not (tmp_path / "x.wdb").exists()
    for name in ("v1.wdb", "v3.wdb"):
        out = tmp_path / f"out-{name}"
        r = wdiff("apply", "-q", tmp_path / name, base, "-o", out)
        assert r.returncode == 0, r.stderr
        assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in adam.iterdir()}


def test_a_v2_codec_in_a_version_1_bundle_is_refused(tmp_path):
    import specbundle as sb

    b = sb.parse((GOLDEN / "sparse.wdb").read_bytes())
    k = next(i for i, r in enumerate(b.records) if r.type == 1)
    b.records[k].codec = MSPARSE  # same sections as SPARSE, but the values are not a value section
    (tmp_path / "v1-with-v2-codec.wdb").write_bytes(sb.serialize(b))
    r = wdiff("apply", tmp_path / "v1-with-v2-codec.wdb", GOLDEN / "ckpt" / "base", "-o", tmp_path / "o1")
    assert r.returncode == 4 and b"format version 1 does not have" in r.stderr, r.stderr
    assert not (tmp_path / "o1").exists()


def _write_ckpt(root: Path, tensors: dict[str, np.ndarray], dtype: str) -> None:
    import specbundle as sb

    root.mkdir(parents=True)
    (root / "model.safetensors").write_bytes(sb.write_st([(k, dtype, list(v.shape), v.tobytes()) for k, v in tensors.items()]))


@pytest.mark.slow
def test_squash_and_reverse_over_v3_bundles_stay_bit_exact(tmp_path):
    rng = np.random.default_rng(5)
    n = 300_000
    master = (rng.standard_normal(n) * 0.02).astype(np.float32)
    bf = lambda x: ((x.view(np.uint32).astype(np.uint64) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) >> 16).astype(np.uint16)  # noqa: E731
    versions = []
    emb = (rng.standard_normal(33_000 * 64) * 0.02).astype(np.float32)  # past one 4 MiB unit: units of its own
    for _ in range(3):
        versions.append({"w": bf(master).reshape(600, 500), "v": bf(master[:1000] * 3), "e": bf(emb).reshape(33_000, 64)})
        master = master + np.float32(4e-7) * np.where(rng.random(n) < 0.5, -1, 1).astype(np.float32)
        seen = np.repeat(rng.random(33_000) < 0.03, 64)  # an embedding: the rows of the tokens a step saw
        emb = emb + np.float32(3e-4) * seen * np.where(rng.random(emb.size) < 0.5, -1, 1).astype(np.float32)
    dirs = []
    for i, t in enumerate(versions):
        _write_ckpt(tmp_path / f"v{i}", t, "BF16")
        dirs.append(tmp_path / f"v{i}")
    for i in (0, 1):
        r = wdiff("pack", "--json", dirs[i], dirs[i + 1], "-o", tmp_path / f"s{i}.wdb")
        assert r.returncode == 0, r.stderr
        assert {"csparse", "rsparse"} <= set(json.loads(r.stdout)["codecs"])
    r = wdiff("squash", tmp_path / "s0.wdb", tmp_path / "s1.wdb", "--base", dirs[0], "-o", tmp_path / "sq.wdb")
    assert r.returncode == 0, r.stderr
    r = wdiff("apply", "-q", tmp_path / "sq.wdb", dirs[0], "-o", tmp_path / "sq-out")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "sq-out" / "model.safetensors").read_bytes() == (dirs[2] / "model.safetensors").read_bytes()

    from wdiff.ops.reverse import build_inverse

    res = build_inverse(tmp_path / "s1.wdb", dirs[2], tmp_path / "inv.wdb")
    assert res.bundle_bytes > 0
    r = wdiff("apply", "-q", tmp_path / "inv.wdb", dirs[2], "-o", tmp_path / "inv-out")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "inv-out" / "model.safetensors").read_bytes() == (dirs[1] / "model.safetensors").read_bytes()


# -- test vectors -------------------------------------------------------------------


def test_the_spec_examples_are_what_the_encoder_writes():
    """man/wdiff-format.5, CSPARSE: both worked examples, byte for byte."""
    old = np.array([0x3F00, 0x3F7F, 0x3E00, 0x3F10] * 2, dtype=np.uint16)
    new = old.copy()
    new[1] += 1
    new[5] += 1
    new[4] -= 1
    enc = chunk.encode_as(CSPARSE, old, new, LEVEL, 1)
    assert (enc.param, enc.count, enc.parts[0].hex(), enc.parts[1].hex()) == (1, 3, "0300010000", "4c")
    assert enc.parts[2].hex() == "002fff4000"
    new = old.copy()
    new[1] += 1
    new[2] += 1
    new[6] += 2
    enc = chunk.encode_as(CSPARSE, old, new, LEVEL, 1)
    assert (enc.parts[0].hex(), enc.parts[1].hex(), enc.parts[2].hex()) == ("010001017c000100", "40", "000eff4000")


def _vector_input(label: str, n: int, w: int):
    """Deterministic words (SHAKE-256, integer operations only): float-like
    bit patterns and a step of small modular moves, some across buckets."""
    import hashlib

    ut = {2: np.uint16, 4: np.uint32, 8: np.uint64}[w]
    raw = np.frombuffer(hashlib.shake_256(f"wdiff-v2/{label}".encode()).digest(3 * n * w), dtype=ut)
    old = raw[:n].copy()
    exp_shift = {2: 7, 4: 23, 8: 52}[w]
    old &= ut(~(0x7 << (exp_shift + 4)) & ((1 << (8 * w)) - 1))  # exponents in a narrow band
    sel = raw[n : 2 * n] % ut(16) == 0
    step = (raw[2 * n :] % ut(5)).astype(ut) + ut(1)
    neg = (raw[2 * n :] >> ut(8 * w - 1)).astype(bool)
    new = old.copy()
    new[sel] = np.where(neg[sel], old[sel] - step[sel], old[sel] + step[sel])
    return old, new


#: sha256 of the parts of each codec's encoding of _vector_input at level 3:
#: a change to these is a change to the format or to the writer's bytes
VECTORS = {
    2: {"cdense": (1, 250, "22fb29d599ba0159"), "csparse": (1, 250, "984499fb62fd88a8"),
        "mbitmap": (0, 250, "83c38fb21188147a"), "mdense": (0, 250, "b1c39868291df4e5"),
        "msparse": (3, 250, "dad4b71bdf902a08")},
    4: {"cdense": (3, 262, "97ce70c5304ad217"), "csparse": (3, 262, "08de8240df20761b"),
        "mbitmap": (0, 262, "1720ddf62e3b7ddb"), "mdense": (0, 262, "a505ee957e064eb9"),
        "msparse": (3, 262, "fb0087d7458f5304")},
    8: {"cdense": (4, 259, "b95eb672ac381389"), "csparse": (4, 259, "585ead3cefd27834"),
        "mbitmap": (0, 259, "41d4ea855718e2bc"), "mdense": (0, 259, "bd789055f2d1328c"),
        "msparse": (3, 259, "aef677cf3185c63a")},
}


@pytest.mark.parametrize("w,fn", [(2, 1), (4, 3), (8, 4)])
def test_codec_vectors_are_stable(w, fn):
    import hashlib

    old, new = _vector_input(f"w{w}", 4096, w)
    got = {}
    for c in (MSPARSE, MBITMAP, MDENSE, CSPARSE, CDENSE):
        enc = chunk.encode_as(c, old, new, LEVEL, fn)
        roundtrip(old, new, enc)
        got[chunk.CODEC_NAMES[c]] = (enc.param, enc.count, hashlib.sha256(b"|".join(enc.parts)).hexdigest()[:16])
    assert got == VECTORS[w], got
