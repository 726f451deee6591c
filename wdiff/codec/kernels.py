"""The hot loops of diff, pack and apply, each in two implementations that
give the same results: single-pass C in the optional extension
``wdiff.codec._native`` (built by ``pip install`` where a C compiler is present),
and numpy, which is always there.

numpy spends one trip through memory per operation (compare, nonzero,
gather, convert, square, sum, transpose); the C kernels read each byte once,
skip runs of unchanged words sixteen at a time, and release the GIL so that
``--threads`` workers run them side by side. ``WDIFF_NATIVE=0`` selects the
numpy twins, and ``wdiff --version`` says which are in use.

Every function takes and returns numpy arrays of the codec's unsigned word
type (see :func:`wdiff.codec.dtypes.uint_type`). Positions are uint32 from the C
kernels and int64 from numpy; both index arrays alike. Pure: no I/O.
"""

from __future__ import annotations

import math
import os
import threading
from functools import lru_cache

import numpy as np

from .dtypes import SUMSQ_TILE, fp8_table, sum_squares, to_float

#: the float kinds of the statistics kernel
_KIND_NONE, _KIND_BF16, _KIND_F32, _KIND_F64, _KIND_LUT = 0, 1, 2, 3, 4
#: the largest Rice parameter either side writes or accepts (the format's limit)
MAX_RICE = 40
#: word counts and positions the C kernels take: below 2^32 - 1 (positions are uint32)
MAX_WORDS = 0xFFFFFFFF
#: the most buckets a bucket function of codec v2 may have (f64: 11 exponent bits)
MAX_BUCKETS = 2048
#: what :func:`csparse_select` reports, by error code (conditioned.py words them)
CS_BAD_UNARY, CS_BAD_REMAINDER_LENGTH, CS_BAD_PADDING, CS_OUT_OF_RANGE, CS_BAD_MOVERS = 1, 2, 3, 4, 5
#: what :func:`mod_apply` reports, by error code
MV_BAD_MAGNITUDE, MV_WRONG_BUCKET, MV_OUT_OF_RANGE = 1, 2, 3
#: what :func:`rc_values_decode` reports; the value coder's slowest rate (rangecoder.LIMIT)
RC_BAD_STREAM, RC_LIMIT = 1, 256
#: what :func:`rice_decode` reports, by error code
RICE_BAD_COUNT, RICE_BAD_REMAINDER_LENGTH, RICE_OUT_OF_RANGE, RICE_BAD_PADDING = 1, 2, 3, 4
RICE_ERRORS = {
    RICE_BAD_COUNT: "position stream does not hold {k} entries",
    RICE_BAD_REMAINDER_LENGTH: "remainder stream has the wrong length",
    RICE_OUT_OF_RANGE: "position out of range",
    RICE_BAD_PADDING: "nonzero padding in remainder stream",
}

#: every constant shared with the C extension, checked against the values it exports
CONTRACT = {
    "MAX_RICE": MAX_RICE, "MAX_WORDS": MAX_WORDS, "F_NONE": _KIND_NONE, "F_BF16": _KIND_BF16,
    "F_F32": _KIND_F32, "F_F64": _KIND_F64, "F_LUT": _KIND_LUT, "RICE_BAD_COUNT": RICE_BAD_COUNT,
    "RICE_BAD_REMAINDER_LENGTH": RICE_BAD_REMAINDER_LENGTH, "RICE_OUT_OF_RANGE": RICE_OUT_OF_RANGE,
    "RICE_BAD_PADDING": RICE_BAD_PADDING, "MAX_BUCKETS": MAX_BUCKETS, "CS_BAD_UNARY": CS_BAD_UNARY,
    "CS_BAD_REMAINDER_LENGTH": CS_BAD_REMAINDER_LENGTH, "CS_BAD_PADDING": CS_BAD_PADDING,
    "CS_OUT_OF_RANGE": CS_OUT_OF_RANGE, "CS_BAD_MOVERS": CS_BAD_MOVERS, "MV_BAD_MAGNITUDE": MV_BAD_MAGNITUDE,
    "MV_WRONG_BUCKET": MV_WRONG_BUCKET, "MV_OUT_OF_RANGE": MV_OUT_OF_RANGE,
    "RC_BAD_STREAM": RC_BAD_STREAM, "RC_LIMIT": RC_LIMIT,
}


def contract_mismatch(module) -> str | None:
    """What differs between this module's constants and ``module``'s (the C
    extension), or None when they agree."""
    bad = [f"{k}: C {getattr(module, k, None)!r}, Python {v!r}" for k, v in CONTRACT.items() if getattr(module, k, None) != v]
    return "; ".join(bad) or None


try:
    from . import _native
except ImportError:  # no compiler at install time: numpy does the work
    _native = None
    #: why the C kernels are not in use, for ``wdiff --version``
    UNAVAILABLE = "the C extension is not built"
else:
    UNAVAILABLE = contract_mismatch(_native)
    if UNAVAILABLE is not None:  # a stale build of another version: never mix its constants with ours
        UNAVAILABLE = f"the C extension does not match this wdiff ({UNAVAILABLE}); reinstall it"
        _native = None

_use_native = _native is not None and os.environ.get("WDIFF_NATIVE", "1") != "0"
_local = threading.local()


def available() -> bool:
    """True when the C extension is built."""
    return _native is not None


def native() -> bool:
    """True when the C kernels are in use."""
    return _use_native


def features() -> str:
    """Which kernels run, in words, for ``wdiff --version``."""
    if _native is None:
        return f"numpy kernels: {UNAVAILABLE}"
    if not _use_native:
        return "numpy kernels: WDIFF_NATIVE=0"
    built = _native.FEATURES.split()
    text = "C kernels: " + (", ".join(built) if built else "portable C, no vector lanes")
    tier = getattr(_native, "CPU", None)  # what this CPU runs of them, chosen at import
    if "avx2-dispatch" in built and tier in _CPU_TIERS:
        text += "; this CPU: " + _CPU_TIERS[tier]
    return text


#: the vector kernels a CPU runs, by the tier the extension found at import
_CPU_TIERS = {"avx512bw": "AVX2 and AVX-512BW", "avx2": "AVX2", "": "portable loops (no AVX2)"}


def set_native(on: bool) -> bool:
    """Select the C kernels (when built) or the numpy twins; returns the
    previous setting. For tests and measurements."""
    global _use_native
    old = _use_native
    _use_native = bool(on) and _native is not None
    return old


def scratch(name: str, nbytes: int) -> np.ndarray:
    """A uint8 buffer of this thread's, reused by the next call with the same name."""
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    buf = bufs.get(name)
    if buf is None or buf.size < nbytes:
        buf = bufs[name] = np.empty(max(nbytes, 64), dtype=np.uint8)
    return buf[:nbytes]


# -- diff statistics -----------------------------------------------------------


@lru_cache(maxsize=None)
def _float_kind(name: str) -> tuple[int, np.ndarray | None]:
    if name == "BF16":
        return _KIND_BF16, None
    if name in ("F32", "C64"):
        return _KIND_F32, None
    if name == "F64":
        return _KIND_F64, None
    if name == "F16":
        return _KIND_LUT, np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)
    if name.startswith("F8_"):
        return _KIND_LUT, fp8_table(name)
    return _KIND_NONE, None


def diff_stats(a: np.ndarray, b: np.ndarray, dtype: str, spans: np.ndarray | None = None) -> list[tuple]:
    """Compare two runs of words of safetensors type ``dtype``, over each
    span (an int64 array of (first word, end word) rows; ``None`` for the
    whole run): ``(changed words, max |b - a|, sum (b - a)^2, sum a^2)`` per
    span. The float figures count finite values only and are ``None, 0, 0``
    for dtypes with no float meaning; ``max`` is NaN when no changed pair has
    a finite difference. Differences of BF16 values are taken in float32
    (exact unless the two exponents lie more than 15 apart), of every other
    dtype in float64."""
    kind, lut = _float_kind(dtype)
    if _use_native:
        if spans is not None:
            spans = np.ascontiguousarray(spans, dtype=np.int64)
        out = _native.diff_stats(a, b, a.dtype.itemsize, kind, lut, spans)
    else:
        rows = [(0, a.size)] if spans is None else spans.tolist()
        out = [_diff_stats_numpy(a[lo:hi], b[lo:hi], dtype) for lo, hi in rows]
    if kind == _KIND_NONE:
        return [(c[0], None, 0.0, 0.0) for c in out]
    return out


def _diff_stats_numpy(a: np.ndarray, b: np.ndarray, dtype: str):
    p = np.flatnonzero(a != b)
    fa = to_float(a[p], dtype)
    if fa is None:
        return p.size, None, 0.0, 0.0
    with np.errstate(all="ignore"):  # NaN and inf values are data, not errors
        if dtype == "BF16":  # in float32, as the C kernel takes it
            d = (to_float(b[p], dtype) - fa).astype(np.float64)
        else:
            d = to_float(b[p], dtype).astype(np.float64) - fa.astype(np.float64)
        d = d[np.isfinite(d)]
        max_abs = float(np.abs(d).max()) if d.size else math.nan
        sum_a2 = sum_squares(a, dtype, scratch("f32", 4 * SUMSQ_TILE))
        return p.size, max_abs, float(np.dot(d, d)), sum_a2


# -- changed words ---------------------------------------------------------------


def delta_scan(old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions of the words that differ, increasing, and the XOR of old
    and new there. The arrays are this thread's scratch: they are valid until
    its next call."""
    n = new.size
    w = new.dtype.itemsize
    if _use_native and n < MAX_WORDS:
        pos = scratch("pos", 4 * n).view(np.uint32)
        val = scratch("val", w * n).view(new.dtype)
        k = _native.delta_scan(old, new, w, pos, val)
        return pos[:k], val[:k]
    positions = np.flatnonzero(old != new)
    return positions, old[positions] ^ new[positions]


def change_bitmap(old: np.ndarray, new: np.ndarray) -> bytes:
    """A bit per word, MSB first, set where ``old`` and ``new`` differ."""
    if _use_native:
        return _native.change_bitmap(old, new, old.dtype.itemsize)
    return np.packbits(old != new).tobytes()


# -- byte planes ----------------------------------------------------------------


def planes(words: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The byte planes of ``words`` as a uint8 array: every word's most
    significant byte first, then the next byte of every word, and so on.
    Written into ``out`` (uint8, exactly ``words.nbytes``) when given."""
    w = words.dtype.itemsize
    if w == 1:
        return words.view(np.uint8)
    if out is None:
        out = np.empty(words.nbytes, dtype=np.uint8)
    if _use_native:
        _native.planes(words, w, out)
        return out
    out.reshape(w, -1)[:] = words.view(np.uint8).reshape(-1, w)[:, ::-1].T
    return out


def xor_planes(old: np.ndarray, new: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """The byte planes of ``old ^ new`` (into ``out`` when given, as for
    :func:`planes`), and how many words differ."""
    if out is None:
        out = np.empty(old.nbytes, dtype=np.uint8)
    if _use_native and old.dtype.itemsize > 1:
        return out, _native.xor_planes(old, new, old.dtype.itemsize, out)
    x = old ^ new
    return planes(x, out), int(np.count_nonzero(x))


def unplanes(data, n: int, word: np.dtype) -> np.ndarray:
    """Inverse of :func:`planes`: ``n`` words of type ``word`` from ``n * w``
    bytes of planes (a fresh array)."""
    word = np.dtype(word)
    w = word.itemsize
    raw = np.frombuffer(data, dtype=np.uint8)
    if w == 1:
        return raw
    if _use_native:
        out = np.empty(n, dtype=word)
        _native.unplanes(raw, w, out, False)
        return out
    return np.ascontiguousarray(raw.reshape(w, n)[::-1].T).view(word).reshape(n)


def scatter_xor(buf: np.ndarray, positions: np.ndarray, values: np.ndarray) -> None:
    """``buf[positions] ^= values``; positions must be in range and increasing."""
    if _use_native and positions.dtype == np.uint32:
        _native.scatter_xor(buf, buf.dtype.itemsize, positions, values)
        return
    buf[positions] ^= values


# -- Rice-coded gaps --------------------------------------------------------------


def rice_param(gaps: np.ndarray) -> int:
    """The Rice parameter that codes ``gaps`` in the fewest bits: near
    log2(mean * ln 2) for geometric gaps, its neighbours tried exactly.
    floor(log2 x) is taken from the float's exponent, so that it is exact."""
    k = gaps.size
    mean = float(gaps.sum(dtype=np.float64)) / k
    guess = min(MAX_RICE, math.frexp(max(mean * 0.69, 1.0))[1] - 1)
    best = None
    for r in range(max(0, guess - 1), min(MAX_RICE, guess + 1) + 1):
        bits = k * (r + 1) + int((gaps >> r).sum(dtype=np.int64))
        if best is None or bits < best[0]:
            best = (bits, r)
    return best[1]


def rice_size(positions: np.ndarray) -> tuple[int, int, int]:
    """What :func:`rice_encode` makes of strictly increasing ``positions``
    (at least one), without making it: (r, unary bytes, remainder bytes)."""
    if _use_native and (positions.dtype == np.uint32 or int(positions[-1]) < MAX_WORDS):
        return _native.rice_size(np.ascontiguousarray(positions, dtype=np.uint32))
    gaps = np.diff(positions.astype(np.int64, copy=False), prepend=-1) - 1
    r = rice_param(gaps)
    ubits = gaps.size + int((gaps >> r).sum(dtype=np.int64))
    return r, (ubits + 7) // 8, (gaps.size * r + 7) // 8


def rice_encode(positions: np.ndarray) -> tuple[int, bytes, bytes]:
    """Strictly increasing positions -> (r, unary stream, remainder stream)."""
    if positions.size == 0:
        return 0, b"", b""
    if _use_native and (positions.dtype == np.uint32 or int(positions[-1]) < MAX_WORDS):
        return _native.rice_encode(np.ascontiguousarray(positions, dtype=np.uint32))
    positions = positions.astype(np.int64, copy=False)
    gaps = np.diff(positions, prepend=-1) - 1
    r = rice_param(gaps)
    q = gaps >> r
    ones = np.cumsum(q + 1) - 1
    bits = np.zeros(int(ones[-1]) + 1, dtype=np.uint8)
    bits[ones] = 1
    unary = np.packbits(bits).tobytes()
    if r == 0:
        return 0, unary, b""
    # the low r bits of each gap, MSB first: unpack big-endian bytes, keep r columns
    width = 8 if r <= 8 else 16 if r <= 16 else 32 if r <= 32 else 64
    big_endian = (gaps & ((1 << r) - 1)).astype(np.dtype(f">u{width // 8}"))
    rbits = np.unpackbits(big_endian.view(np.uint8).reshape(-1, width // 8), axis=1)[:, width - r :]
    return r, unary, np.packbits(rbits).tobytes()


def rice_decode(r: int, unary, remainder, k: int, n: int) -> np.ndarray | str:
    """Inverse of :func:`rice_encode` for ``k`` positions below ``n``: the
    positions, or the reason the streams are malformed. Every bound is
    checked; ``r`` must already be within 0..MAX_RICE."""
    if _use_native and n < MAX_WORDS:
        out = np.empty(k, dtype=np.uint32)
        err = _native.rice_decode(r, unary, remainder, k, n, out)
        return RICE_ERRORS[err].format(k=k) if err else out
    ones = np.flatnonzero(np.unpackbits(np.frombuffer(unary, dtype=np.uint8)))
    if ones.size != k or (k and len(unary) != int(ones[-1]) // 8 + 1):
        return RICE_ERRORS[RICE_BAD_COUNT].format(k=k)
    q = np.diff(ones, prepend=-1) - 1
    if len(remainder) != (k * r + 7) // 8:
        return RICE_ERRORS[RICE_BAD_REMAINDER_LENGTH]
    if k and int(q.max()) > (n >> r):
        return RICE_ERRORS[RICE_OUT_OF_RANGE]
    gaps = q.astype(np.int64) << r
    if r:
        rbits = np.unpackbits(np.frombuffer(remainder, dtype=np.uint8))
        if rbits[k * r :].any():
            return RICE_ERRORS[RICE_BAD_PADDING]
        rb = rbits[: k * r].reshape(k, r).astype(np.int64)
        gaps |= rb @ (np.int64(1) << np.arange(r - 1, -1, -1, dtype=np.int64))
    positions = np.cumsum(gaps + 1) - 1
    if k and int(positions[-1]) >= n:
        return RICE_ERRORS[RICE_OUT_OF_RANGE]
    return positions


# -- buckets of base words (codec v2) -------------------------------------------------
#
# bucket(word) = (word >> shift) & mask. The *movers* are the changed words
# whose bucket differs between old and new: they belong to no bucket.


def _buckets(words: np.ndarray, shift: int, mask: int) -> np.ndarray:
    t = words.dtype.type
    return ((words >> t(shift)) & t(mask)).astype(np.int64)


def bucket_ranks(old: np.ndarray, new: np.ndarray, shift: int, mask: int, positions: np.ndarray):
    """For the changed ``positions`` (strictly increasing): (bucket of each
    as uint16, ``mask + 1`` for a mover; rank of each among the non-mover words of its
    bucket before it, or among the movers; the count of non-mover words of
    every bucket, then of the movers)."""
    nb = mask + 1
    if _use_native and old.size < MAX_WORDS:
        pos = np.ascontiguousarray(positions, dtype=np.uint32)
        k = pos.size
        ob = np.empty(k, dtype=np.uint16)
        orank = np.empty(k, dtype=np.uint32)
        cnt = np.zeros(4 * nb + 1, dtype=np.uint32)
        if _native.bucket_ranks(old, new, old.dtype.itemsize, shift, mask, pos, ob, orank, cnt):
            raise ValueError("bucket_ranks: positions not increasing")
        return ob, orank.astype(np.int64), cnt[: nb + 1].astype(np.int64)
    positions = positions.astype(np.int64, copy=False)
    bk = _buckets(old, shift, mask)
    mv = positions[bk[positions] != _buckets(new[positions], shift, mask)]
    bk[mv] = nb
    order = np.argsort(bk, kind="stable")
    counts = np.bincount(bk, minlength=nb + 1)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rank = np.empty(bk.size, dtype=np.int64)
    rank[order] = np.arange(bk.size, dtype=np.int64) - starts[bk[order]]
    return bk[positions].astype(np.uint16), rank[positions], counts


def bucket_counts(ref: np.ndarray, shift: int, mask: int, movers: np.ndarray) -> np.ndarray | None:
    """The count of non-mover words of every bucket of ``ref``, then of the
    movers; None when ``movers`` is not strictly increasing below its size."""
    nb = mask + 1
    if _use_native and ref.size < MAX_WORDS:
        cnt = np.zeros(4 * nb + 1, dtype=np.uint32)
        if _native.bucket_counts(ref, ref.dtype.itemsize, shift, mask, np.ascontiguousarray(movers, dtype=np.uint32), cnt):
            return None
        return cnt[: nb + 1].astype(np.int64)
    movers = movers.astype(np.int64, copy=False)
    if movers.size and (movers[0] < 0 or movers[-1] >= ref.size or (np.diff(movers) <= 0).any()):
        return None
    bk = _buckets(ref, shift, mask)
    bk[movers] = nb
    return np.bincount(bk, minlength=nb + 1)


def bucket_select(ref: np.ndarray, shift: int, mask: int, movers: np.ndarray, want: np.ndarray,
                  offsets: np.ndarray) -> np.ndarray | None:
    """The positions of the words of ranks ``want[offsets[b]:offsets[b+1]]``
    (increasing) among the non-mover words of bucket ``b`` of ``ref``, in the
    order of ``want`` (uint32 from the C kernel, int64 from numpy); None
    when a rank is not there."""
    nb = mask + 1
    if _use_native and ref.size < MAX_WORDS:
        out = np.empty(want.size, dtype=np.uint32)
        err = _native.bucket_select(ref, ref.dtype.itemsize, shift, mask, np.ascontiguousarray(movers, dtype=np.uint32),
                                    np.ascontiguousarray(want, dtype=np.uint32),
                                    np.ascontiguousarray(offsets, dtype=np.int64), out)
        return None if err else out
    bk = _buckets(ref, shift, mask)
    bk[movers.astype(np.int64, copy=False)] = nb
    order = np.argsort(bk, kind="stable")
    counts = np.bincount(bk, minlength=nb + 1)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    seg = np.repeat(np.arange(nb, dtype=np.int64), np.diff(offsets))
    want = want.astype(np.int64, copy=False)
    if want.size and (want >= counts[seg]).any():
        return None
    return order[starts[seg] + want]


# -- CSPARSE positions, fused (codec v2) ---------------------------------------------
#
# The numpy twins are conditioned.encode_positions and decode_positions
# themselves: these return None when the C kernels are not in use, and the
# caller takes the numpy path.


def csparse_encode(old: np.ndarray, new: np.ndarray, shift: int, mask: int, positions: np.ndarray | None):
    """(table, bits, listed positions as uint32, runs, signs, magnitude
    planes, positions) of a CSPARSE record for the changed ``positions``
    (strictly increasing; None: found in the same pass, then returned
    last), in one pass over ``old`` and one over the changed words; None
    when the C kernels are not in use. The same bytes as the numpy path of
    :func:`conditioned.encode_positions` and, for the signs and planes,
    :func:`mod_values` at the listed positions (the planes are this
    thread's scratch, as there)."""
    if not _use_native or old.size >= MAX_WORDS:
        return None
    w = new.dtype.itemsize
    if positions is None:
        # the kernel sizes what it returns by the words it found
        table, bits, runs, pos, listed, signs, mplanes = _native.csparse_encode(old, new, w, shift, mask,
                                                                              None, None, None, None)
        pos, listed = np.frombuffer(pos, dtype=np.uint32), np.frombuffer(listed, dtype=np.uint32)
        return table, bits, listed, runs, signs, np.frombuffer(mplanes, dtype=np.uint8), pos
    pos = np.ascontiguousarray(positions, dtype=np.uint32)
    k = pos.size
    listed = np.empty(k, dtype=np.uint32)
    signs, mplanes = bytearray((k + 7) // 8), scratch("mplanes", k * w)
    table, bits, runs = _native.csparse_encode(old, new, w, shift, mask, pos, listed, signs, mplanes)
    return table, bits, listed, runs, bytes(signs), mplanes, pos


def csparse_select(ref: np.ndarray, shift: int, mask: int, movers: np.ndarray, entries: np.ndarray,
                   counts: np.ndarray | None, unary, remainder, listed: int):
    """The ``listed`` positions that CSPARSE's bucket entries code (rows of
    (bucket, c, mode)), in the listed order, as uint32, in one pass over
    ``ref``: (positions, or an error code ``CS_*`` when the streams are
    malformed; the count of non-mover words of every bucket, then of the
    movers, as the pass saw them). ``counts``: those counts, when known
    (the entries are then checked against them); None when not: the pass
    counts them, and what needs them is checked after it. None when the C kernels are not
    in use. Without ``counts``, ``listed`` is what the record says it lists
    (the words of complemented entries are then staged there): at least the
    sum of the uncomplemented entries' c."""
    if not _use_native or ref.size >= MAX_WORDS:
        return None
    out = np.empty(listed, dtype=np.uint32)
    seen = np.zeros(mask + 2, dtype=np.int64)
    given = np.zeros(0, np.int64) if counts is None else np.ascontiguousarray(counts[: mask + 1], dtype=np.int64)
    err = _native.csparse_select(ref, ref.dtype.itemsize, shift, mask, np.ascontiguousarray(movers, dtype=np.uint32),
                                 np.ascontiguousarray(entries, dtype=np.int64).reshape(-1), given, unary, remainder,
                                 out, seen)
    return (err or out), seen


# -- modular value sections (codec v2) -------------------------------------------------


def mod_values(old: np.ndarray, new: np.ndarray, positions: np.ndarray, dense: bool = False):
    """The sign bits (packed MSB first, bytes) and the byte planes (uint8,
    this thread's scratch) of the modular differences ``new - old`` at
    ``positions``, as a value section stores them: magnitudes less one
    (``dense``: the magnitudes, zero allowed). One pass, no gathered copy;
    the numpy twin is conditioned.sign_magnitude (dense_sign_magnitude) and
    :func:`planes`."""
    k, w = positions.size, new.dtype.itemsize
    if _use_native and new.size < MAX_WORDS:
        signs = bytearray((k + 7) // 8)
        out = scratch("mplanes", k * w)
        _native.mod_values(old, new, w, np.ascontiguousarray(positions, dtype=np.uint32), dense, signs, out)
        return bytes(signs), out
    d = new[positions] - old[positions]
    bits = w * 8
    neg = (d >> d.dtype.type(bits - 1)).astype(bool)
    mag = np.where(neg, np.zeros_like(d) - d, d)
    if not dense:
        mag -= d.dtype.type(1)
    return np.packbits(neg).tobytes(), planes(mag, scratch("mplanes", k * w))


def mod_apply(buf: np.ndarray, positions: np.ndarray, signs: bytes, mplanes, shift: int, mask: int,
              movers: int) -> int:
    """Add the modular differences of a value section (sign bits, magnitude
    planes: see :func:`mod_values`) to ``buf``'s words at ``positions``
    (distinct), after checking every magnitude (below 2^(8w-1)) and, with a
    ``mask``, that exactly the first ``movers`` positions change bucket
    (``(word >> shift) & mask``). 0, or an ``MV_*`` code and ``buf``
    untouched."""
    k, w = positions.size, buf.dtype.itemsize
    if _use_native and buf.size < MAX_WORDS:
        return _native.mod_apply(buf, w, np.ascontiguousarray(positions, dtype=np.uint32), signs, mplanes, shift, mask,
                                 movers)
    positions = positions.astype(np.int64, copy=False)
    if k and (positions.min() < 0 or positions.max() >= buf.size):
        return MV_OUT_OF_RANGE
    mag = unplanes(mplanes, k, buf.dtype)
    t = buf.dtype.type
    if (mag >> t(8 * w - 1)).any():
        return MV_BAD_MAGNITUDE
    neg = np.unpackbits(np.frombuffer(signs, dtype=np.uint8), count=k).astype(bool)
    d = mag + t(1)
    d = np.where(neg, np.zeros_like(d) - d, d)
    if mask:
        r = buf[positions]
        moved = ((r >> t(shift)) & t(mask)) != (((r + d) >> t(shift)) & t(mask))
        if not moved[:movers].all() or moved[movers:].any():
            return MV_WRONG_BUCKET
    buf[positions] += d
    return 0


# -- the value coder of codec v2 ------------------------------------------------------



def rc_values_encode(signs: bytes, mplanes, w: int, runs: list[int]) -> bytes:
    """The range-coded value stream of k words of ``w`` bytes from their
    sign bits (packed MSB first) and the byte planes of their magnitudes
    (as :func:`mod_values` gives them), the words in ``runs`` (sizes that
    add up to k, each run with fresh models). See rangecoder.py."""
    k = len(mplanes) // w
    r = np.asarray(runs, dtype=np.uint64)
    if _use_native:
        return _native.rc_values_encode(signs, mplanes, w, r)
    from . import rangecoder

    neg = np.unpackbits(np.frombuffer(signs, dtype=np.uint8))[:k]
    mag = unplanes(mplanes, k, np.dtype(f"<u{w}"))
    if int(r.sum()) != k:
        raise ValueError("value coder: runs do not add up to the word count")
    return rangecoder.encode_values(neg, mag, 8 * w, [int(x) for x in r])


def rc_values_decode(data: bytes, k: int, w: int, runs: list[int]) -> tuple[bytes, np.ndarray] | int:
    """Inverse of :func:`rc_values_encode`: (sign bits, magnitude planes,
    this thread's scratch), or :data:`RC_BAD_STREAM` for a stream the
    coder cannot have written (it must start with a 0 byte and be read
    exactly to its end)."""
    r = np.asarray(runs, dtype=np.uint64)
    if int(r.sum()) != k:
        raise ValueError("value coder: runs do not add up to the word count")
    out = scratch("rcplanes", k * w)
    if _use_native:
        signs = bytearray((k + 7) // 8)
        err = _native.rc_values_decode(data, w, r, signs, out)
        return err if err else (bytes(signs), out)
    from . import rangecoder

    try:
        neg, mag = rangecoder.decode_values(bytes(data), 8 * w, [int(x) for x in r])
    except rangecoder.Bad:
        return RC_BAD_STREAM
    words = np.array(mag, dtype=np.uint64).astype(np.dtype(f"<u{w}"))
    return np.packbits(np.array(neg, dtype=np.uint8)).tobytes(), planes(words, out)
