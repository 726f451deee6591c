"""The C kernels (wdiff._native) and their numpy twins (wdiff.kernels) must
agree byte for byte: bundles must not depend on whether the extension was
built. Every test runs a kernel both ways on the same input and compares."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wdiff.codec import kernels
from wdiff.codec.dtypes import uint_type

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the C extension is not built")


WORDS = [1, 2, 4, 8]
FLOAT_DTYPES = {1: ["U8", "F8_E4M3", "F8_E5M2", "F8_E8M0"], 2: ["BF16", "F16", "I16"], 4: ["F32", "C64", "U32"], 8: ["F64", "I64"]}


def both(fn, *args):
    """(numpy result, C result) of ``fn(*args)``."""
    old = kernels.set_native(False)
    try:
        slow = fn(*args)
    finally:
        kernels.set_native(True)
    try:
        fast = fn(*args)
    finally:
        kernels.set_native(old)
    return slow, fast


@st.composite
def pairs(draw, words=WORDS):
    """Two equal-length word arrays that differ at a drawn density, with
    clustered, edge and random positions."""
    w = draw(st.sampled_from(words))
    n = draw(st.integers(0, 3000))
    seed = draw(st.integers(0, 2**32 - 1))
    density = draw(st.sampled_from([0.0, 0.001, 0.01, 0.1, 0.5, 0.9, 1.0]))
    rng = np.random.default_rng(seed)
    t = uint_type(w)
    a = rng.integers(0, np.iinfo(t).max, size=n, dtype=t, endpoint=True)
    b = a.copy()
    mask = rng.random(n) < density
    if n and draw(st.booleans()):
        mask[[0, n - 1]] = True
    flip = rng.integers(1, np.iinfo(t).max, size=n, dtype=t, endpoint=True)
    b[mask] ^= flip[mask]
    return a, b


@settings(max_examples=200, deadline=None)
@given(pairs(), st.booleans())
def test_delta_scan_agrees(ab, simd):
    """With the AVX2 scans (where the CPU has them) and the portable ones."""
    a, b = ab
    was = kernels._native.use_simd(simd)
    try:
        (p0, v0), (p1, v1) = both(lambda x, y: tuple(z.copy() for z in kernels.delta_scan(x, y)), a, b)
    finally:
        kernels._native.use_simd(was)
    assert np.array_equal(p0, p1) and np.array_equal(v0, v1)
    assert np.array_equal(p0, np.flatnonzero(a != b))


@settings(max_examples=200, deadline=None)
@given(pairs())
def test_planes_agree(ab):
    a, b = ab
    s, f = both(lambda x: kernels.planes(x).tobytes(), a)
    assert s == f
    s2, f2 = both(lambda x, y: (lambda pk: (pk[0].tobytes(), pk[1]))(kernels.xor_planes(x, y)), a, b)
    assert s2 == f2 and s2[1] == int(np.count_nonzero(a != b))
    assert s2[0] == kernels.planes(a ^ b).tobytes()
    out = np.full(a.nbytes, 0xA5, dtype=np.uint8)  # into a caller's buffer
    s3, f3 = both(lambda x: kernels.planes(x, out).tobytes(), a)
    assert s3 == f3 == s
    back_s, back_f = both(lambda d: kernels.unplanes(d, a.size, a.dtype).copy(), s)
    assert np.array_equal(back_s, a) and np.array_equal(back_f, a)


@settings(max_examples=200, deadline=None)
@given(pairs())
def test_scatter_xor_agrees(ab):
    a, b = ab
    pos = np.flatnonzero(a != b)
    xor = a[pos] ^ b[pos]

    def run(p):
        buf = a.copy()
        kernels.scatter_xor(buf, p, xor)
        return buf

    assert np.array_equal(run(pos), b)
    assert np.array_equal(run(pos.astype(np.uint32)), b)


@st.composite
def positions(draw):
    n = draw(st.integers(1, 1 << 22))
    k = draw(st.integers(1, min(n, 2000)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    style = draw(st.sampled_from(["uniform", "clustered", "far", "dense"]))
    if style == "dense":
        p = np.arange(n - min(n, k), n)
    elif style == "far":
        p = np.unique(np.concatenate([[0, n - 1], rng.integers(0, n, size=min(k, 3))]))
    elif style == "clustered":
        start = int(rng.integers(0, n))
        p = np.unique(np.clip(start + rng.integers(0, 64, size=k), 0, n - 1))
    else:
        p = np.unique(rng.integers(0, n, size=k))
    return p.astype(np.int64), n


@settings(max_examples=300, deadline=None)
@given(positions())
def test_rice_agrees_and_round_trips(pn):
    p, n = pn
    slow, fast = both(kernels.rice_encode, p)
    assert slow == fast
    fast32 = kernels.rice_encode(p.astype(np.uint32))
    assert fast32 == slow
    r, unary, rem = slow
    assert both(kernels.rice_size, p) == ((r, len(unary), len(rem)),) * 2
    ds, df = both(kernels.rice_decode, r, unary, rem, p.size, n)
    assert np.array_equal(ds, p) and np.array_equal(df, p)


@settings(max_examples=200, deadline=None)
@given(pairs(), st.booleans())
def test_change_bitmap_agrees(ab, simd):
    a, b = ab
    was = kernels._native.use_simd(simd)
    try:
        slow, fast = both(kernels.change_bitmap, a, b)
    finally:
        kernels._native.use_simd(was)
    assert slow == fast == np.packbits(a != b).tobytes()


@settings(max_examples=300, deadline=None)
@given(positions(), st.data())
def test_rice_decode_rejects_alike(pn, data):
    """Damaged streams are refused with the same reason by both decoders,
    and whatever either accepts, the other accepts with the same result."""
    p, n = pn
    r, unary, rem = kernels.rice_encode(p)
    k = p.size
    which = data.draw(st.sampled_from(["unary", "rem", "k", "n", "r"]))
    if which == "unary" and unary:
        b = bytearray(unary)
        i = data.draw(st.integers(0, len(b) - 1))
        b[i] ^= 1 << data.draw(st.integers(0, 7))
        unary = bytes(b) + (b"\0" if data.draw(st.booleans()) else b"")
    elif which == "rem":
        b = bytearray(rem) + (b"\x01" if not rem or data.draw(st.booleans()) else b"")
        if rem:
            b[data.draw(st.integers(0, len(rem) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        rem = bytes(b)
    elif which == "k":
        k = max(0, k + data.draw(st.sampled_from([-1, 1])))
    elif which == "n":
        n = data.draw(st.integers(1, max(1, int(p[-1]))))
    else:
        r = data.draw(st.integers(0, kernels.MAX_RICE))
    slow, fast = both(kernels.rice_decode, r, unary, rem, k, n)
    if isinstance(slow, str) or isinstance(fast, str):
        assert slow == fast
    else:
        assert np.array_equal(slow, fast)


@settings(max_examples=200, deadline=None)
@given(pairs(), st.data())
def test_diff_stats_agree(ab, data):
    a, b = ab
    dtype = data.draw(st.sampled_from(FLOAT_DTYPES[a.dtype.itemsize]))
    cuts = sorted(data.draw(st.lists(st.integers(0, a.size), max_size=6)))
    spans = np.array(list(zip([0] + cuts, cuts + [a.size])), dtype=np.int64)
    whole_s, whole_f = both(kernels.diff_stats, a, b, dtype)
    many_s, many_f = both(kernels.diff_stats, a, b, dtype, spans)
    assert len(whole_s) == len(whole_f) == 1 and len(many_s) == len(many_f) == len(spans)
    for (lo, hi), s, f in zip([(0, a.size)] + spans.tolist(), whole_s + many_s, whole_f + many_f):
        c0, m0, d0, s0 = s
        c1, m1, d1, s1 = f
        assert c0 == c1 == int(np.count_nonzero(a[lo:hi] != b[lo:hi]))
        if m0 is None:
            assert m1 is None and d0 == d1 == s0 == s1 == 0
            continue
        assert (math.isnan(m0) and math.isnan(m1)) or m0 == m1
        for x, y in ((d0, d1), (s0, s1)):
            assert math.isfinite(x) == math.isfinite(y)
            assert x == pytest.approx(y, rel=1e-5, abs=1e-30)


@st.composite
def weight_pairs(draw):
    """Two runs of bf16 or f32 weights of realistic magnitude (the vector
    path of the C kernel), nudged by a few ulps at a drawn density, with the
    odd zero, signed zero, huge value, infinity or NaN (its fallback)."""
    dtype = draw(st.sampled_from(["BF16", "F32"]))
    n = draw(st.integers(0, 2000))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    f = (rng.standard_normal(n) * draw(st.sampled_from([1e-10, 0.02, 1.0, 1e18]))).astype(np.float32)
    a = f.view(np.uint32) >> 16 if dtype == "BF16" else f.view(np.uint32)
    a = a.astype(np.uint16 if dtype == "BF16" else np.uint32)
    b = a.copy()
    mask = rng.random(n) < draw(st.sampled_from([0.0, 0.01, 0.3, 1.0]))
    b[mask] += rng.integers(1, 4, int(mask.sum())).astype(a.dtype)
    specials = np.array([0, 0x8000, 0x7F7F, 0x7F80, 0x7FC0, 0xFF80] if dtype == "BF16" else
                        [0, 0x80000000, 0x7F7FFFFF, 0x7F800000, 0x7FC00000, 0x00000001], dtype=a.dtype)
    for _ in range(draw(st.integers(0, 3))):
        if n:
            side = draw(st.sampled_from([a, b]))
            side[draw(st.integers(0, n - 1))] = specials[draw(st.integers(0, len(specials) - 1))]
    return dtype, a, b


@settings(max_examples=300, deadline=None)
@given(weight_pairs())
def test_diff_stats_agree_on_weights(pair):
    dtype, a, b = pair
    [slow], [fast] = both(kernels.diff_stats, a, b, dtype)
    assert slow[0] == fast[0] == int(np.count_nonzero(a != b))
    assert (math.isnan(slow[1]) and math.isnan(fast[1])) or slow[1] == fast[1]
    for x, y in zip(slow[2:], fast[2:]):
        assert math.isfinite(x) == math.isfinite(y)
        assert x == pytest.approx(y, rel=1e-5, abs=1e-30)


@settings(max_examples=200, deadline=None)
@given(weight_pairs(), st.integers(0, 700), st.integers(0, 20_000), st.integers(0, 3000))
def test_bf16_statistics_bit_for_bit_at_every_simd_level(pair, extra, start, dense):
    """The bf16 statistics of the AVX-512BW kernel (where the CPU has it)
    and of the vector clones below it (use_simd(1)) are the same floats,
    bit for bit, not only within the twin's tolerance: a diff's output does
    not depend on the CPU. The weights are repeated (``extra``) to make runs
    of several vector groups, and every word of ``dense`` of them from
    ``start`` is changed: the kernel takes groups with few changes in two
    passes and the others in one, and goes from one way to the other."""
    dtype, a, b = pair
    if dtype != "BF16":
        return
    a, b = np.tile(a, 1 + extra // 100), np.tile(b, 1 + extra // 100)
    a, b = np.concatenate([a, a[:extra]]), np.concatenate([b, b[:extra]])
    b[start : start + dense] = a[start : start + dense] ^ 1
    spans = np.array([[0, a.size // 3], [a.size // 3, a.size]], dtype=np.int64)
    got = []
    for level in (2, 1):
        was = kernels._native.use_simd(level)
        try:
            got.append(kernels.diff_stats(a, b, "BF16") + kernels.diff_stats(a, b, "BF16", spans))
        finally:
            kernels._native.use_simd(was)
    assert repr(got[0]) == repr(got[1])  # repr: NaN equals NaN, and -0.0 is not 0.0


def test_bf16_difference_is_taken_in_float32():
    """A relative change of 2^16 or more is not exact in float32: both
    kernels round it the same way."""
    a = np.array([0x3F80] * 70, dtype=np.uint16)  # 1.0
    b = a.copy()
    b[5] = 0x3780  # 2^-16: 1 - 2^-16 needs 17 bits
    [slow], [fast] = both(kernels.diff_stats, a, b, "BF16")
    assert slow[1] == fast[1] == float(np.float32(1.0) - np.float32(2.0**-16))


def test_bf16_sum_of_squares_survives_huge_values():
    """Squares of bf16 values past 2^64 overflow a float: the kernel sums
    those runs in double, and skips infinities and NaNs like the numpy twin."""
    big = np.array([0x7F00, 0x3F80, 0x7F80, 0x7FC0, 0xFF00] * 40, dtype=np.uint16)
    other = big.copy()
    other[1] ^= 1
    [slow], [fast] = both(kernels.diff_stats, big, other, "BF16")
    assert math.isfinite(fast[3]) and fast[3] == pytest.approx(slow[3], rel=1e-6)


def test_native_switch_is_reported():
    old = kernels.set_native(False)
    try:
        assert not kernels.native()
    finally:
        kernels.set_native(old)
    assert kernels.native() == old


@pytest.mark.parametrize("density", [0.01, 0.3, 0.9])
def test_same_bundle_and_result_without_the_extension(tmp_path, density, monkeypatch):
    """End to end: pack writes the same bytes with either kernels, apply with
    either rebuilds the target, and diff reports the same changes."""
    from factory import simple_pair, tree

    import wdiff

    monkeypatch.setenv("WDIFF_CACHE_DIR", "none")  # both runs do all the work
    A, B = simple_pair(tmp_path, density=density)
    bundles, diffs = [], []
    for on in (True, False):
        was = kernels.set_native(on)
        try:
            out = tmp_path / f"b-{on}.wdb"
            wdiff.pack(A, B, out)
            bundles.append(out.read_bytes())
            wdiff.apply(out, A, tmp_path / f"C-{on}")
            assert tree(tmp_path / f"C-{on}") == tree(B)
            diffs.append(wdiff.diff(A, B).to_json())
        finally:
            kernels.set_native(was)
    assert bundles[0] == bundles[1]
    for x, y in zip(diffs[0]["tensors"], diffs[1]["tensors"]):
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], float):
                assert x[key] == pytest.approx(y[key], rel=1e-5), (x["name"], key)
            else:
                assert x[key] == y[key], (x["name"], key)


# -- CSPARSE, fused (codec v2) -------------------------------------------------------


@st.composite
def csparse_pairs(draw):
    """Weight-like words of a bucket function's width, changed at a drawn
    density by +-1 ulp moves, with movers (exponent carries) and, drawn,
    few buckets (so that some are complemented), sized across the select
    pass's tiles (512 words) and blocks (16)."""
    from wdiff.codec import conditioned

    fn = draw(st.sampled_from(sorted(conditioned.BUCKETS)))
    _, w, shift, mask = conditioned.BUCKETS[fn]
    n = draw(st.sampled_from([1, 15, 16, 17, 511, 512, 513, 1024, 1500, 5000]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    t = np.dtype(uint_type(w)).type
    x = rng.standard_normal(n) * 0.02
    old = (x.astype(np.float32).view(np.uint32) >> 16).astype(t) if w == 2 else x.astype(
        {4: np.float32, 8: np.float64}[w]).view(t)
    if draw(st.booleans()):  # two or three buckets only
        keep = t((1 << shift) - 1)
        old = (old & keep) | (t(draw(st.integers(100, 102)) & mask) + (rng.random(n) < 0.3).astype(t)) << t(shift)
    new = old.copy()
    ch = rng.random(n) < draw(st.sampled_from([0.002, 0.02, 0.3, 0.8, 1.0]))
    if n and draw(st.booleans()):
        ch[[0, n - 1]] = True
    d = rng.integers(1, 4, n).astype(t)
    new[ch] = np.where(rng.random(n) < 0.5, old - d, old + d)[ch]
    carry = rng.random(n) < draw(st.sampled_from([0.0, 0.01, 0.2]))  # a move out of the bucket
    new[carry] = (old[carry] | t((1 << shift) - 1)) + t(1)
    pos = np.flatnonzero(old != new)
    return fn, old, new, pos


@settings(max_examples=150, deadline=None)
@given(csparse_pairs(), st.sampled_from([2, 1, 0]))
def test_csparse_kernels_agree(case, simd):
    """csparse_encode (table, bits, listed order, runs, and the value
    coder's signs and planes; given the positions or finding them) and csparse_select (positions and counts,
    from either side) against the numpy path, with every vector kernel the
    CPU has (AVX-512BW blocks of 64 words), with AVX2 alone (32) and with
    none."""
    from wdiff.codec import conditioned

    fn, old, new, pos = case
    if not pos.size:
        return
    was = kernels._native.use_simd(simd)
    try:
        slow, fast = both(lambda: [np.asarray(x).copy() if isinstance(x, np.ndarray) else x
                                   for x in conditioned.encode_csparse(fn, old, new, pos)])
        assert [bytes(x) if isinstance(x, np.ndarray) else x for x in slow[:2]] == list(fast[:2])
        for a, b in zip(slow[2:], fast[2:]):
            assert np.array_equal(np.asarray(a), np.asarray(b)) if isinstance(a, np.ndarray) else list(a) == list(b)
        scanned = both(lambda: [np.asarray(x).copy() if isinstance(x, np.ndarray) else x
                                for x in conditioned.encode_csparse(fn, old, new)])
        for got in scanned:  # the positions found in the same pass
            assert list(got[:2]) == list(fast[:2]) and got[3] == fast[3] and got[4] == fast[4]
            for a, b in ((got[2], fast[2]), (got[5], fast[5]), (got[6], pos)):
                assert np.array_equal(np.asarray(a), np.asarray(b))
        table, bits, listed, runs = fast[:4]
        for ref in (old, new):
            d0, d1 = both(lambda: conditioned.decode_positions(fn, ref, table, bits, pos.size))
            assert np.array_equal(np.asarray(d0[0]), np.asarray(d1[0])) and d0[1:] == d1[1:]
            assert np.array_equal(np.asarray(d1[0]), listed) and d1[2] == runs
    finally:
        kernels._native.use_simd(was)
