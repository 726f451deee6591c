"""Codec v2 (bundle format version 3): deltas coded with what the receiver
already holds, the base. Pure functions on numpy arrays; see
man/wdiff-format.5, CODECS, for the bit-for-bit definitions.

Modular differences
    ``D = (new - old) mod 2^(8w)`` on the words' bit patterns (integer
    arithmetic, never float), stored zigzagged, ``Z = (D << 1) ^ -(D >> (8w-1))``,
    so that a move of +-1 ulp is the symbol 2 or 1. Exact, invertible,
    and ``old + D`` undoes ``new - D``: a chain of them never drifts.

Base-conditioned positions
    Each word of the chunk falls into a *bucket*, a pure function of its
    base word (the exponent field of a float dtype, see :data:`BUCKETS`).
    An optimizer step changes small weights far more often than large ones
    (the rounding step grows with 2^exponent), so the change probability
    differs by orders of magnitude between buckets: the positions are coded
    per bucket, as Rice-coded gaps within the bucket's own subsequence of
    words, each bucket with its own Rice parameter (or, where more than
    half of a bucket changed, the unchanged words instead).

Entropy coding: the values of CSPARSE, RSPARSE, MSPARSE and MBITMAP go
through the adaptive binary range coder of rangecoder.py (the C kernels'
rc_values_encode and rc_values_decode), with fresh models per bucket:
zstd's Huffman stage cannot code a symbol in under one bit, and an
optimizer step's magnitudes given the bucket carry about a third of one
(see rangecoder.py). A static rANS of whole planes was measured before
that coder and lost to zstd's per-block tables (csparse at 0.5%: 965
bytes of magnitudes against 583). CDENSE's byte planes, near-dense,
stay zstd's: rANS with a table per 65,536 symbols saved 3% there at five
times the CPU time.
"""

from __future__ import annotations

import math

import numpy as np

from . import kernels

#: bucket functions, by the id a record stores in its ``param`` field:
#: (name, word bytes, right shift, mask) -- bucket = (base >> shift) & mask
BUCKETS = {
    1: ("bf16", 2, 7, 0xFF),
    2: ("f16", 2, 10, 0x1F),
    3: ("f32", 4, 23, 0xFF),
    4: ("f64", 8, 52, 0x7FF),
}
#: the bucket function of each safetensors dtype that has one
DTYPE_BUCKETS = {"BF16": 1, "F16": 2, "F32": 3, "C64": 3, "F64": 4}
MAX_RICE = kernels.MAX_RICE


class Malformed(ValueError):
    """A conditioned record that breaks a rule of the format (the caller
    turns it into a FormatError naming the record)."""


# -- modular differences ----------------------------------------------------------


def zigzag_diff(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``zigzag((new - old) mod 2^(8w))`` word by word (a fresh array)."""
    bits = new.dtype.itemsize * 8
    d = new - old  # unsigned: wraps mod 2^bits
    return (d << new.dtype.type(1)) ^ (np.zeros_like(d) - (d >> new.dtype.type(bits - 1)))


def unzigzag(z: np.ndarray) -> np.ndarray:
    """Inverse of the zigzag: ``D`` such that ``new = old + D`` (mod 2^(8w))."""
    one = z.dtype.type(1)
    return (z >> one) ^ (np.zeros_like(z) - (z & one))


def sign_magnitude(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nonzero modular differences as (sign bits, packed MSB first; the
    magnitudes less one, ``M = |D| - 1``), where ``D`` is read as a two's
    complement integer. ``M`` is below 2^(8w-1) for every nonzero ``D``."""
    bits = d.dtype.itemsize * 8
    neg = (d >> d.dtype.type(bits - 1)).astype(bool)
    mag = np.where(neg, np.zeros_like(d) - d, d) - d.dtype.type(1)
    return np.packbits(neg), mag


def from_sign_magnitude(neg: np.ndarray, mag: np.ndarray) -> np.ndarray | None:
    """Inverse of :func:`sign_magnitude` (``neg`` unpacked, as bools); None
    when some magnitude is out of range (the record is malformed)."""
    bits = mag.dtype.itemsize * 8
    if (mag >> mag.dtype.type(bits - 1)).any():
        return None
    d = mag + mag.dtype.type(1)
    return np.where(neg, np.zeros_like(d) - d, d)


def add_at(buf: np.ndarray, positions: np.ndarray, d: np.ndarray) -> None:
    """``buf[positions] += d`` mod 2^(8w); positions distinct and in range."""
    buf[positions] += d


# -- buckets ------------------------------------------------------------------------


def buckets_of(fn: int, base: np.ndarray) -> np.ndarray:
    """The bucket of every word of ``base`` under bucket function ``fn`` (uint16)."""
    _, w, shift, mask = BUCKETS[fn]
    t = base.dtype.type
    return ((base >> t(shift)) & t(mask)).astype(np.uint16)


def bucket_order(fn: int, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, starts): the word positions sorted by bucket, increasing
    within each bucket, and where each bucket's run begins in ``order``
    (``starts[b]`` to ``starts[b + 1]``)."""
    return _order(fn, buckets_of(fn, base))


def _order(fn: int, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(b, kind="stable")
    counts = np.bincount(b, minlength=BUCKETS[fn][3] + 2)
    starts = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    return order, starts


# -- varints ----------------------------------------------------------------------


def _varint(v: int, out: bytearray) -> None:
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def varint(v: int) -> bytes:
    out = bytearray()
    _varint(v, out)
    return bytes(out)


def read_varint(data: bytes, at: int = 0) -> tuple[int, int]:
    """(value, offset after it) of the LEB128 varint at ``at``; Malformed
    when truncated, longer than 64 bits or not minimal."""
    return _read_varint(data, at)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise Malformed("truncated or overlong varint")
        byte = data[at]
        at += 1
        v |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and shift:
                raise Malformed("non-minimal varint")
            if v >> 64:
                raise Malformed("varint above 64 bits")
            return v, at
        shift += 7


def _rice_head(data: bytes, at: int) -> tuple[int, int, int, int]:
    """The head of a Rice-coded position list, three varints: (k, r, the
    unary stream's length in bytes, the offset after them)."""
    k, at = _read_varint(data, at)
    r, at = _read_varint(data, at)
    u, at = _read_varint(data, at)
    return k, r, u, at


def _rice_list(r: int, k: int, n: int, data: bytes, at: int, u: int, what: str) -> tuple[np.ndarray, int]:
    """The ``k`` positions below ``n`` (int64) of a Rice-coded list whose
    unary stream, ``u`` bytes, starts at ``data[at]`` and is followed by its
    remainder stream, and the offset after both (the caller has checked
    the head, and that ``data`` holds both streams); Malformed "``what``
    list: ..." when they do not decode."""
    rlen = (k * r + 7) // 8
    if not k:
        return np.zeros(0, dtype=np.int64), at + u + rlen
    got = kernels.rice_decode(r, data[at : at + u], data[at + u : at + u + rlen], k, n)
    if isinstance(got, str):
        raise Malformed(f"{what} list: {got}")
    return got.astype(np.int64), at + u + rlen


# -- Rice-coded gaps, several parameters in one pair of streams -----------------------


def _bits_of(values: np.ndarray, r: int) -> np.ndarray:
    """The low r bits of each value, MSB first, as a flat 0/1 uint8 array."""
    width = 8 if r <= 8 else 16 if r <= 16 else 32 if r <= 32 else 64
    be = (values & np.int64((1 << r) - 1)).astype(np.dtype(f">u{width // 8}"))
    return np.unpackbits(be.view(np.uint8).reshape(-1, width // 8), axis=1)[:, width - r :].reshape(-1)


def encode_positions(
    fn: int, old: np.ndarray, new: np.ndarray, positions: np.ndarray
) -> tuple[bytes, bytes, np.ndarray, list[int]]:
    """Code the ``positions`` where ``old`` and ``new`` differ (strictly
    increasing): (table, bits, positions in the order the decoder lists
    them, which is the order the values are stored in, and the runs of that
    list the value coder starts fresh models on: the movers, then each
    bucket). First the *movers*, the changed words whose bucket differs
    between old and new, as Rice-coded gaps over the chunk; then, bucket by
    bucket, the changed words among the others (whose bucket is the same
    on both sides, so that either side can list them)."""
    return encode_csparse(fn, old, new, positions)[:4]


def encode_csparse(
    fn: int, old: np.ndarray, new: np.ndarray, positions: np.ndarray | None = None
) -> tuple[bytes, bytes, np.ndarray, list[int], bytes, np.ndarray, np.ndarray]:
    """What :func:`encode_positions` gives, then the sign bits and the
    magnitude planes of the modular differences at the listed positions
    (:func:`kernels.mod_values`): what the value coder takes; and the
    changed positions (``positions``; None: found here, the C kernel in
    the same pass over the words as all the rest)."""
    _, _, shift, mask = BUCKETS[fn]
    fused = kernels.csparse_encode(old, new, shift, mask, positions)
    if fused is not None:
        return fused
    if positions is None:
        positions = np.flatnonzero(old != new)
    table, bits, listed = _encode_positions(fn, old, new, positions)
    k_m, _ = _read_varint(table, 0)
    b = buckets_of(fn, old[listed[k_m:]])
    cuts = np.flatnonzero(np.diff(b)) + 1
    runs = np.diff(np.concatenate(([0], cuts, [b.size]))) if b.size else np.zeros(0, dtype=np.int64)
    return (table, bits, listed, [k_m, *runs.tolist()], *kernels.mod_values(old, new, listed), positions)


def _encode_positions(fn: int, old: np.ndarray, new: np.ndarray, positions: np.ndarray) -> tuple[bytes, bytes, np.ndarray]:
    _, _, shift, mask = BUCKETS[fn]
    nb = mask + 1
    bk, rank, counts = kernels.bucket_ranks(old, new, shift, mask, positions)
    positions = positions.astype(np.int64, copy=False)
    mv = bk == nb
    movers = positions[mv]
    table = bytearray()
    r_m, u_m, rem_m = kernels.rice_encode(movers) if movers.size else (0, b"", b"")
    _varint(movers.size, table)
    _varint(r_m, table)
    _varint(len(u_m), table)
    keep = ~mv
    kb, kr, kp = bk[keep], rank[keep], positions[keep]
    o = np.argsort(kb, kind="stable")
    kb, kr, kp = kb[o], kr[o], kp[o]
    cuts = np.flatnonzero(np.diff(kb)) + 1
    bounds = np.concatenate(([0], cuts, [kb.size])) if kb.size else np.zeros(1, dtype=np.int64)
    unary_parts, rem_parts, entries, prev = [], [], [], -1
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        b = int(kb[lo])
        local = kr[lo:hi]
        n_b = int(counts[b])
        complement = 2 * local.size > n_b
        if complement:
            f = np.ones(n_b, dtype=bool)
            f[local] = False
            coded = np.flatnonzero(f)
        else:
            coded = local
        c = coded.size
        r = 0
        if c:
            gaps = np.diff(coded, prepend=-1) - 1
            r = kernels.rice_param(gaps)
            q = gaps >> r
            bits = np.zeros(int(q.sum()) + c, dtype=np.uint8)
            bits[np.cumsum(q + 1) - 1] = 1
            unary_parts.append(bits)
            if r:
                rem_parts.append(_bits_of(gaps, r))
        entries.append((b - prev - 1, c, 2 * r + complement))
        prev = b
    _varint(len(entries), table)
    for delta, c, mode in entries:
        _varint(delta, table)
        _varint(c, table)
        _varint(mode, table)
    unary = np.packbits(np.concatenate(unary_parts)).tobytes() if unary_parts else b""
    rem = np.packbits(np.concatenate(rem_parts)).tobytes() if rem_parts else b""
    _varint(len(unary), table)
    return bytes(table), u_m + rem_m + unary + rem, np.concatenate([movers, kp])


_CS_ERRORS = {
    kernels.CS_BAD_UNARY: "unary stream does not hold the listed gaps",
    kernels.CS_BAD_REMAINDER_LENGTH: "remainder stream has the wrong length",
    kernels.CS_BAD_PADDING: "nonzero padding in the remainder stream",
    kernels.CS_OUT_OF_RANGE: "position out of range",
    kernels.CS_BAD_MOVERS: "mover list out of order",
}


def decode_positions(fn: int, ref: np.ndarray, table: bytes, bits: bytes, count: int) -> tuple[np.ndarray, int, list[int]]:
    """Inverse of :func:`encode_positions`, given either side of the delta
    (``ref``, the base or the target: the buckets of the words that are not
    movers are the same on both): the changed positions in the order they
    are listed, and how many of them, first, are movers. Checks every rule:
    entries in increasing bucket order within range, counts within each
    bucket's size, exact stream lengths, zero padding, positions in range;
    the listed total must be ``count``; and the runs of the value coder
    (see :func:`encode_positions`). (That the movers move and the others do
    not is checked by the caller, once the values are known.)"""
    n = ref.size
    _, _, shift, mask = BUCKETS[fn]
    nbuckets = mask + 1
    k_m, r_m, ulen_m, at = _rice_head(table, 0)
    if k_m > min(count, n) or r_m > MAX_RICE or (k_m == 0 and (r_m or ulen_m)):
        raise Malformed("bad mover list")
    if ulen_m + (k_m * r_m + 7) // 8 > len(bits):
        raise Malformed("mover streams longer than the position section")
    movers, end = _rice_list(r_m, k_m, n, bits, 0, ulen_m, "mover")
    bits = bits[end:]
    n_entries, at = _read_varint(table, at)
    if n_entries > nbuckets:
        raise Malformed("more bucket entries than buckets")
    entries, b = [], -1
    for _ in range(n_entries):
        delta, at = _read_varint(table, at)
        c, at = _read_varint(table, at)
        mode, at = _read_varint(table, at)
        b += delta + 1
        r, complement = mode >> 1, mode & 1
        if b >= nbuckets or r > MAX_RICE or mode > 2 * MAX_RICE + 1 or (c == 0 and (not complement or r)):
            raise Malformed("bad bucket entry")
        if c > n:  # no bucket holds more words than the chunk (checked here, before any kernel sees c)
            raise Malformed("bucket entry lists more words than its bucket holds")
        entries.append((b, c, r, complement))
    if sum(e[1] for e in entries) > n - k_m:
        # the buckets are disjoint, their words at most the chunk's less the
        # movers: checked before any kernel sizes its scratch by them
        raise Malformed("bucket entries list more words than the chunk holds")
    ulen, at = _read_varint(table, at)
    if at != len(table):
        raise Malformed("trailing bytes in the bucket table")
    if ulen > len(bits):
        raise Malformed("unary stream longer than the position section")
    rows = np.array([(b, c, 2 * r + x) for b, c, r, x in entries], dtype=np.int64).reshape(-1, 3)
    fused = None
    if count - k_m >= sum(e[1] for e in entries if not e[3]):
        # one pass lists the positions and counts the buckets; what needs
        # the counts is checked below, in the same order as without it
        fused = kernels.csparse_select(ref, shift, mask, movers, rows, None, bits[:ulen], bits[ulen:], count - k_m)
    if fused is not None and not isinstance(fused[0], int):
        counts = fused[1]
    else:
        counts = kernels.bucket_counts(ref, shift, mask, movers)
        if counts is None:
            raise Malformed("mover list out of order")
    total, runs = k_m, [k_m]
    for b, c, _, complement in entries:
        n_b = int(counts[b])
        if c > n_b or (complement and c == n_b):
            raise Malformed("bucket entry lists more words than its bucket holds")
        runs.append(n_b - c if complement else c)
        total += runs[-1]
    if total != count:
        raise Malformed(f"bucket table does not list {count} changed words")
    coded = sum(e[1] for e in entries)
    if fused is None:
        fused = kernels.csparse_select(ref, shift, mask, movers, rows, counts, bits[:ulen], bits[ulen:], total - k_m)
    if fused is not None:
        if isinstance(fused[0], int):
            raise Malformed(_CS_ERRORS[fused[0]])
        return np.concatenate([movers.astype(np.uint32), fused[0]]), k_m, runs
    unary = np.frombuffer(bits, dtype=np.uint8, count=ulen)
    ones = np.flatnonzero(np.unpackbits(unary))
    if ones.size != coded or (coded and ulen != int(ones[-1]) // 8 + 1) or (not coded and ulen):
        raise Malformed("unary stream does not hold the listed gaps")
    q = np.diff(ones, prepend=-1) - 1
    rbits_total = sum(c * r for _, c, r, _ in entries)
    rem = np.frombuffer(bits, dtype=np.uint8, offset=ulen)
    if rem.size != (rbits_total + 7) // 8:
        raise Malformed("remainder stream has the wrong length")
    rbits = np.unpackbits(rem)
    if rbits[rbits_total:].any():
        raise Malformed("nonzero padding in the remainder stream")
    want, offsets, qi, ri = [], np.zeros(nbuckets + 1, dtype=np.int64), 0, 0
    for b, c, r, complement in entries:
        n_b = int(counts[b])
        if c:
            qb = q[qi : qi + c]
            qi += c
            if int(qb.max()) > (n_b >> r):
                raise Malformed("position out of range")
            gaps = qb.astype(np.int64) << r
            if r:
                rb = rbits[ri : ri + c * r].reshape(c, r).astype(np.int64)
                ri += c * r
                gaps |= rb @ (np.int64(1) << np.arange(r - 1, -1, -1, dtype=np.int64))
            local = np.cumsum(gaps + 1) - 1
            if int(local[-1]) >= n_b:
                raise Malformed("position out of range")
        else:
            local = np.zeros(0, dtype=np.int64)
        if complement:
            f = np.ones(n_b, dtype=bool)
            f[local] = False
            local = np.flatnonzero(f)
        want.append(local)
        offsets[b + 1] = local.size
    np.cumsum(offsets, out=offsets)
    want_all = np.concatenate(want) if want else np.zeros(0, dtype=np.int64)
    got = kernels.bucket_select(ref, shift, mask, movers, want_all, offsets)
    if got is None:
        raise Malformed("position out of range")
    return np.concatenate([movers, got]), k_m, runs


# -- rows (RSPARSE) -------------------------------------------------------------------


def row_count(n: int, R: int, o: int) -> int:
    """How many rows ``n`` words fall into when rows are ``R`` words long and
    the first full row starts at word ``o`` (0 <= o < R): the words before
    ``o`` are a row of their own."""
    return (n + (R - o) % R + R - 1) // R


def rows_of(positions: np.ndarray, R: int, o: int) -> np.ndarray:
    """The row of each word position (int64)."""
    return (positions.astype(np.int64, copy=False) + (R - o) % R) // R


def row_words(rows: np.ndarray, n: int, R: int, o: int) -> np.ndarray:
    """The positions of every word of ``rows`` (increasing, distinct), in
    order: the words the CSPARSE part of an RSPARSE record covers (int64)."""
    c0 = (R - o) % R
    rows = rows.astype(np.int64, copy=False)
    lo = np.maximum(rows * R - c0, 0)
    hi = np.minimum(rows * R - c0 + R, n)
    lengths = hi - lo
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    starts = np.zeros(rows.size, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return np.arange(total, dtype=np.int64) + np.repeat(lo - starts, lengths)


def row_head(R: int, o: int, rows: np.ndarray) -> bytes:
    """RSPARSE's row list, the start of its section 0: varints R, o, k_r,
    r_r, u_r, then the Rice streams of the listed rows (as SPARSE codes
    positions)."""
    r, u, rem = kernels.rice_encode(rows) if rows.size else (0, b"", b"")
    return varint(R) + varint(o) + varint(rows.size) + varint(r) + varint(len(u)) + u + rem


def read_row_head(data: bytes, n: int) -> tuple[int, int, np.ndarray, int]:
    """Inverse of :func:`row_head`: (R, o, rows, the offset after it);
    Malformed unless 1 <= R <= n, o < R, 1 <= k_r <= the row count, and
    the streams are exactly as long as their bits need."""
    R, at = _read_varint(data, 0)
    o, at = _read_varint(data, at)
    k_r, r, u, at = _rice_head(data, at)
    if not 1 <= R <= n or o >= R:
        raise Malformed("bad row length or offset")
    n_r = row_count(n, R, o)
    if not 1 <= k_r <= n_r or r > MAX_RICE:
        raise Malformed("bad row list")
    if at + u + (k_r * r + 7) // 8 > len(data):
        raise Malformed("row streams longer than section 0")
    rows, end = _rice_list(r, k_r, n_r, data, at, u, "row")
    return R, o, rows, end


def movers_of(fn: int, old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """The positions whose bucket differs between old and new (int64)."""
    _, _, shift, mask = BUCKETS[fn]
    t = old.dtype.type
    return np.flatnonzero(((old >> t(shift)) & t(mask)) != ((new >> t(shift)) & t(mask)))


def dense_order(fn: int, ref: np.ndarray, movers: np.ndarray) -> np.ndarray | None:
    """Every position of the chunk in CDENSE's listed order: the movers,
    then bucket by bucket the subsequences S_c (None: bad mover list)."""
    _, _, shift, mask = BUCKETS[fn]
    counts = kernels.bucket_counts(ref, shift, mask, movers)
    if counts is None:
        return None
    counts = counts[: mask + 1]
    offsets = np.zeros(mask + 2, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    # uint32 throughout (positions are below 2^32): a 4 MiB chunk of bf16
    # holds 2M words, and every array here is one entry per word
    want = np.arange(int(offsets[-1]), dtype=np.uint32)
    want -= np.repeat(offsets[:-1].astype(np.uint32), counts)
    got = kernels.bucket_select(ref, shift, mask, movers, want, offsets)
    return None if got is None else np.concatenate([movers.astype(got.dtype), got])


def mover_head(movers: np.ndarray) -> bytes:
    """CDENSE's section 0: varints k_m, r_m, u_m, then the movers' unary
    and remainder streams (as SPARSE codes positions)."""
    r, u, rem = kernels.rice_encode(movers) if movers.size else (0, b"", b"")
    return varint(movers.size) + varint(r) + varint(len(u)) + u + rem


def read_mover_head(data: bytes, n: int) -> np.ndarray:
    k_m, r_m, u_m, at = _rice_head(data, 0)
    if k_m > n or r_m > MAX_RICE or (k_m == 0 and (r_m or u_m)):
        raise Malformed("bad mover list")
    if at + u_m + (k_m * r_m + 7) // 8 != len(data):
        raise Malformed("mover streams do not fill section 0")
    return _rice_list(r_m, k_m, n, data, at, u_m, "mover")[0]


def dense_sign_magnitude(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Any modular differences, zero included: (sign bits packed, |d|)."""
    bits = d.dtype.itemsize * 8
    neg = (d >> d.dtype.type(bits - 1)).astype(bool)
    return np.packbits(neg), np.where(neg, np.zeros_like(d) - d, d)


def from_dense_sign_magnitude(neg: np.ndarray, mag: np.ndarray) -> np.ndarray | None:
    """Inverse of :func:`dense_sign_magnitude`; None unless canonical: a
    magnitude at most 2^(8w-1), set there exactly when the sign is, and
    never a sign on a zero."""
    bits = mag.dtype.itemsize * 8
    top = mag.dtype.type(1 << (bits - 1))
    if (mag > top).any() or (neg & (mag == 0)).any() or ((mag == top) & ~neg).any():
        return None
    return np.where(neg, np.zeros_like(mag) - mag, mag)


# -- measurement ----------------------------------------------------------------------


def conditional_entropy(fn: int | None, old: np.ndarray, new: np.ndarray) -> tuple[float, float]:
    """The order-0 information of a delta, in bits, conditioned on the base's
    bucket: (positions, values). Positions: the sum over buckets of
    ``n_b H(k_b / n_b)``. Values: the zigzagged modular differences of the
    changed words, byte plane by byte plane, each plane's order-0 entropy
    within each bucket (a floor for any coder of planes given the bucket).
    ``fn`` None: one bucket (the unconditioned figures)."""
    changed = old != new
    b = buckets_of(fn, old) if fn else np.zeros(old.size, dtype=np.uint16)
    nb = np.bincount(b)
    kb = np.bincount(b[changed], minlength=nb.size)
    pos = 0.0
    for n_, k_ in zip(nb.tolist(), kb.tolist()):
        if 0 < k_ < n_:
            p = k_ / n_
            pos += n_ * -(p * math.log2(p) + (1 - p) * math.log2(1 - p))
    z = zigzag_diff(old[changed], new[changed])
    bc = b[changed].astype(np.int64)
    val = 0.0
    planes = z.view(np.uint8).reshape(-1, z.dtype.itemsize)
    for j in range(planes.shape[1]):
        t = np.bincount(bc * 256 + planes[:, j], minlength=256 * (int(bc.max(initial=0)) + 1)).reshape(-1, 256).astype(np.float64)
        rows = t.sum(axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            val += float(-np.nansum(t * np.log2(t / rows)))
    return pos, val


__all__ = [
    "BUCKETS", "DTYPE_BUCKETS", "Malformed", "add_at", "bucket_order", "buckets_of", "conditional_entropy",
    "decode_positions", "dense_order", "dense_sign_magnitude", "encode_csparse", "encode_positions", "from_dense_sign_magnitude",
    "from_sign_magnitude", "mover_head", "movers_of", "read_mover_head", "read_row_head", "read_varint", "row_count",
    "row_head", "row_words", "rows_of", "sign_magnitude",
    "unzigzag", "varint", "zigzag_diff",
]
