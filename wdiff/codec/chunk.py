"""Element-level encodings of one chunk. Pure functions on numpy arrays.

A chunk is ``n`` words of ``w`` bytes (w in 1, 2, 4, 8). A delta says which
words changed and the XOR of their old and new bytes; XOR is exact for every
dtype and composes exactly, so chained deltas never drift. Four codecs:

``sparse``  positions as Rice-coded gaps (split into a unary and a remainder
            stream), values as XOR byte planes, zstd
``bitmap``  positions as a bit per word, zstd; values as in ``sparse``
``dense``   the XOR of every word, as byte planes, zstd
``raw``     the new words as byte planes, zstd (no base needed)

and, from bundle format version 3 on (codec v2, see conditioned.py), the
same with modular differences instead of XOR (``msparse``, ``mbitmap``,
``mdense``), and two that read the base to order the words by the
exponent bucket of their base value: ``csparse`` (positions per bucket)
and ``cdense`` (every word, bucket by bucket). They are tried after the
version 1 codecs and kept only when strictly smaller.

"Byte planes" means all most-significant bytes first, then the next byte of
every word, and so on: exponent bytes, which compress well, then mantissa
bytes, which do not. The encoder tries the codecs that can win at the chunk's
density and keeps the smallest; a large chunk tries in full only those that
came close to the best on a sample of its words, and the conditioned codecs
only where the base's buckets say something of the delta
(:func:`bucket_information`). The choice depends only on the data, so the
output never depends on thread count or timing. See
man/wdiff-format.5. This module encodes; the decoder is :mod:`.decode`, the
codec numbers and primitives are :mod:`.codecs`, and both are re-exported
here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import zstandard

from . import conditioned, kernels
from .codecs import (
    BITMAP,
    CDENSE,
    CODEC_NAMES,
    CODEC_VERSION,
    CONDITIONED,
    CSPARSE,
    DENSE,
    MAX_RICE,
    MBITMAP,
    MDENSE,
    MODULAR,
    MSPARSE,
    RAW,
    RSPARSE,
    SPARSE,
    V3_CODECS,
    ZSTD,
    compressor,
    decompress_exact,
    decompressor,
    plane_compressor,
    planes,
    rice_decode,
    rice_encode,
    unplanes,
)
from .decode import combine, decode_into, delta_words, modular_changes

# -- chunk encodings -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Encoded:
    codec: int
    param: int  # Rice parameter (sparse); 0 otherwise
    count: int  # changed words (delta codecs); 0 for raw
    parts: tuple[bytes, ...]  # payload sections, concatenated on disk

    @property
    def size(self) -> int:
        return sum(len(p) for p in self.parts)


def encode_raw(new: np.ndarray, level: int) -> Encoded:
    return Encoded(RAW, 0, 0, (_compress_planes(plane_compressor(level), new),))


def _compress_planes(cctx: zstandard.ZstdCompressor, words: np.ndarray) -> bytes:
    # the planes go to a buffer of this thread's: a fresh one per unit
    # costs more in page faults than building the planes
    return cctx.compress(kernels.planes(words, kernels.scratch("planes", words.nbytes)))


#: a unit of at least this many words picks its codecs on a sample of them
SAMPLE_MIN_WORDS = 1 << 16
#: the sample: 1/16 of the words, in 8 runs spread evenly over the unit
SAMPLE_SHIFT, SAMPLE_RUNS = 4, 8
#: codecs whose size on the sample is within this factor of the smallest are
#: encoded in full and the smallest kept; the others are not tried
SAMPLE_MARGIN = 1.02


def candidates(density: float, version: int = 1, bucket: int | None = None) -> tuple[int, ...]:
    """The codecs that can win at a density of changed words, in the order
    that breaks ties: those of bundle format version 1 first, so that a
    version 3 codec is chosen only when it is strictly smaller. ``version``:
    the newest format the bundle may use; ``bucket``: the bucket function
    of the unit's dtype (None: it has none)."""
    out = []
    if density <= 0.6:
        out.append(SPARSE)
        if density >= 0.02:
            out.append(BITMAP)
    if density >= 0.2:
        out.append(DENSE)
    if density >= 0.5:
        out.append(RAW)
    if version >= 3:
        if density <= 0.6:
            if bucket is not None:
                out.append(CSPARSE)
            out.append(MSPARSE)
            if density >= 0.02:
                out.append(MBITMAP)
        if density >= 0.2:
            out.append(MDENSE)
            if bucket is not None:
                out.append(CDENSE)
    return tuple(out)


def sample(words: np.ndarray) -> np.ndarray:
    """The words that a unit of ``words`` picks its codecs on (a copy)."""
    n = words.size
    run, step = (n >> SAMPLE_SHIFT) // SAMPLE_RUNS, n // SAMPLE_RUNS
    return np.concatenate([words[i * step : i * step + run] for i in range(SAMPLE_RUNS)])


class _Trial:
    """Each codec's encoding of one pair of word runs, built on demand. The
    streams two codecs share are built once, and the size of a SPARSE
    record is known without writing its Rice streams."""

    def __init__(self, old: np.ndarray, new: np.ndarray, cctx: zstandard.ZstdCompressor, bucket: int | None = None,
                 rows: tuple[int, int] | None = None) -> None:
        self.old, self.new, self.cctx, self.bucket, self.rows = old, new, cctx, bucket, rows
        self._scan = self._values = self._bitmap = self._rice = self._mvalues = self._cs = None
        self._k: int | None = None
        self._done: dict[int, Encoded] = {}

    @property
    def count(self) -> int:
        """How many words differ."""
        if self._k is None:
            self._k = self.positions().size
        return self._k

    def scan(self):
        """Positions and XOR of the changed words: this thread's scratch,
        valid until the next trial scans (a unit's sample is done with
        before the unit is scanned)."""
        if self._scan is None:
            self._scan = kernels.delta_scan(self.old, self.new)
        return self._scan

    def positions(self) -> np.ndarray:
        """The positions of the changed words: the scan's, or CSPARSE's,
        whose encoder finds them in its own pass over the words (with
        ``csparse``, that encoding is made here unless there is a scan:
        for a unit where CSPARSE is a candidate, one pass over the words
        instead of two, a 4 MiB bf16 chunk at 1%: see the commit)."""
        if self._scan is not None:
            return self._scan[0]
        if self._cs is not None:
            return self._cs[-1]
        return self.scan()[0]

    def csparse(self) -> tuple[bytes, bytes, bytes, np.ndarray]:
        """CSPARSE's three sections and the positions, made once."""
        if self._cs is None:
            self._cs = _csparse(self.bucket, self.old, self.new, None if self._scan is None else self._scan[0])
            if self._k is None:
                self._k = self._cs[-1].size
        return self._cs

    def values(self) -> bytes:
        if self._values is None:
            self._values = _compress_planes(self.cctx, self.scan()[1])
        return self._values

    def mvalues(self) -> bytes:
        """The zigzagged modular differences of the changed words, as byte
        planes, in position order."""
        if self._mvalues is None:
            self._mvalues = _mvalues_at(self.old, self.new, self.scan()[0])
        return self._mvalues

    def bitmap(self) -> bytes:
        if self._bitmap is None:
            self._bitmap = kernels.change_bitmap(self.old, self.new)
        return self._bitmap

    def rice(self) -> tuple[int, int, int]:
        """The Rice parameter and the sizes of the two streams."""
        if self._rice is None:
            self._rice = kernels.rice_size(self.scan()[0])
        return self._rice

    def size(self, codec: int) -> int:
        if codec in (SPARSE, MSPARSE):
            _, unary, rem = self.rice()
            return unary + rem + len(self.values() if codec == SPARSE else self.mvalues())
        return self.encode(codec).size

    def estimate(self, codec: int) -> float:
        """What the size on a sample says of the size on the whole unit, in
        the sample's units: CSPARSE's bucket table does not grow with the
        words it covers (the whole unit has about the buckets a sample
        has), so it counts 1/2^SAMPLE_SHIFT of its length here; on a small
        tensor the table would otherwise hide a codec 30% smaller (real
        model, 384x384 projections at 1.3%)."""
        size = self.size(codec)
        if codec == CSPARSE:
            table = len(self.encode(codec).parts[0])
            size -= table - table / (1 << SAMPLE_SHIFT)
        return size

    def encode(self, codec: int) -> Encoded:
        e = self._done.get(codec)
        if e is None:
            e = self._done[codec] = self._encode(codec)
        return e

    def _encode(self, codec: int) -> Encoded:
        if codec == SPARSE:
            r, ulen, _ = self.rice()
            if r == 0:
                # gap zeros then a one, for every position: the unary stream
                # is the bitmap, up to the last position
                return Encoded(SPARSE, 0, self.count, (self.bitmap()[:ulen], b"", self.values()))
            r, unary, rem = rice_encode(self.scan()[0])
            return Encoded(SPARSE, r, self.count, (unary, rem, self.values()))
        if codec == MSPARSE:
            r, ulen, _ = self.rice()
            if r == 0:
                return Encoded(MSPARSE, 0, self.count, (self.bitmap()[:ulen], b"", self.mvalues()))
            r, unary, rem = rice_encode(self.scan()[0])
            return Encoded(MSPARSE, r, self.count, (unary, rem, self.mvalues()))
        if codec == BITMAP:
            return Encoded(BITMAP, 0, self.count, (self.cctx.compress(self.bitmap()), self.values()))
        if codec == MBITMAP:
            return Encoded(MBITMAP, 0, self.count, (self.cctx.compress(self.bitmap()), self.mvalues()))
        if codec == MDENSE:
            z = conditioned.zigzag_diff(self.old, self.new)
            self._k = int(np.count_nonzero(z))
            return Encoded(MDENSE, 0, self._k, (_compress_planes(self.cctx, z),))
        if codec == CDENSE:
            movers = conditioned.movers_of(self.bucket, self.old, self.new)
            order = conditioned.dense_order(self.bucket, self.old, movers)
            d = self.new[order] - self.old[order]
            self._k = int(np.count_nonzero(d))
            return Encoded(CDENSE, self.bucket, self._k, (conditioned.mover_head(movers), _dense_values(self.cctx, d)))
        if codec == CSPARSE:
            table, bits, values, _ = self.csparse()
            return Encoded(CSPARSE, self.bucket, self.count, (table, bits, values))
        if codec == RSPARSE:
            R, o = self.rows
            pos = self.positions().astype(np.int64)
            row = conditioned.rows_of(pos, R, o)
            rows = row[np.flatnonzero(np.diff(row, prepend=-1))]
            words = conditioned.row_words(rows, self.new.size, R, o)
            sub_old, sub_new = self.old[words], self.new[words]
            sub_pos = np.searchsorted(words, pos)
            table, bits, values, _ = _csparse(self.bucket, sub_old, sub_new, sub_pos)
            return Encoded(RSPARSE, self.bucket, self.count, (conditioned.row_head(R, o, rows) + table, bits, values))
        if codec == DENSE:
            data, k = kernels.xor_planes(self.old, self.new, kernels.scratch("planes", self.new.nbytes))
            self._k = k
            return Encoded(DENSE, 0, k, (self.cctx.compress(data),))
        return Encoded(RAW, 0, 0, (_compress_planes(self.cctx, self.new),))

    def smallest(self, codecs: tuple[int, ...]) -> Encoded:
        """The smallest encoding by one of ``codecs``, the earliest on a tie."""
        if len(codecs) == 1:
            return self.encode(codecs[0])
        sizes = [self.size(c) for c in codecs]
        return self.encode(codecs[sizes.index(min(sizes))])


def _mvalues_at(old: np.ndarray, new: np.ndarray, positions: np.ndarray) -> bytes:
    """The value section of MSPARSE and MBITMAP: the modular differences
    ``new - old`` at ``positions``, range-coded in one run, without
    gathering them first (the C kernels: one pass for the planes of the
    magnitudes, one for the coder). CSPARSE's: :func:`_csparse`."""
    signs, mplanes = kernels.mod_values(old, new, positions)
    return kernels.rc_values_encode(signs, mplanes, new.dtype.itemsize, [positions.size])


def _csparse(fn: int, old: np.ndarray, new: np.ndarray, positions: np.ndarray | None):
    """The three sections of a CSPARSE record (table, position bits,
    values) and the changed positions (``positions``, or found)."""
    table, bits, _, runs, signs, mplanes, positions = conditioned.encode_csparse(fn, old, new, positions)
    return table, bits, kernels.rc_values_encode(signs, mplanes, new.dtype.itemsize, runs), positions


def _dense_values(cctx: zstandard.ZstdCompressor, d: np.ndarray) -> bytes:
    """The value section of CDENSE, V0: varint length of the sign frame, the
    sign frame (zstd of the sign bits), the magnitude frame (zstd of the
    byte planes of |D|, zero allowed)."""
    neg, mag = conditioned.dense_sign_magnitude(d)
    signs = cctx.compress(neg.tobytes())
    return conditioned.varint(len(signs)) + signs + _compress_planes(cctx, mag)


def encode_as(codec: int, old: np.ndarray, new: np.ndarray, level: int, bucket: int | None = None,
              rows: tuple[int, int] | None = None) -> Encoded:
    """Encode ``new`` against ``old`` with one given codec (``old`` is not
    read for RAW; a delta codec needs at least one changed word; CSPARSE
    needs ``bucket``, RSPARSE ``bucket`` and ``rows``)."""
    return _Trial(old, new, plane_compressor(level), bucket, rows).encode(codec)


def bucket_function(dtype: str | None, word: int) -> int | None:
    """The bucket function of CSPARSE for a unit of safetensors ``dtype``
    (None: the dtype has none, or the word width does not match)."""
    fn = conditioned.DTYPE_BUCKETS.get(dtype or "")
    return fn if fn is not None and conditioned.BUCKETS[fn][1] == word else None


#: RSPARSE is tried when at most this fraction of the rows hold a change
ROWS_MAX_FRACTION = 0.5


def rows_of_tensor(shape: tuple[int, ...], elem_words: int, first_word: int) -> tuple[int, int] | None:
    """RSPARSE's rows for a unit that is one piece of one tensor: the row
    length in words (the last dimension) and where the unit's first full row
    starts (``first_word``: the unit's first word within the tensor); None
    for a tensor of fewer than two dimensions or rows of one word."""
    if len(shape) < 2 or shape[-1] * elem_words < 2:
        return None
    R = shape[-1] * elem_words
    return R, (R - first_word % R) % R


def encode_delta(
    old: np.ndarray, new: np.ndarray, level: int, *, version: int = 1, dtype: str | None = None,
    rows: tuple[int, int] | None = None,
) -> Encoded | None:
    """Encode ``new`` against ``old`` (same length and word type); ``None``
    when they are equal.

    The codecs that can win at the unit's density of changed words are
    tried and the smallest kept, the earliest of :func:`candidates` on a
    tie. A large unit takes that density from a sample of its words,
    encodes the sample with each of them, and tries in full only those
    that came within :data:`SAMPLE_MARGIN` of the best: on a dense change
    this is one compression instead of four. The choice depends only on the
    data, never on timing or threads.

    ``rows`` (row length, offset of the first full row: see
    :func:`rows_of_tensor`): where CSPARSE is a candidate and at most
    :data:`ROWS_MAX_FRACTION` of the rows hold a change (embedding rows of
    tokens a step did not see), RSPARSE is tried as well."""
    cctx = plane_compressor(level)
    bucket = bucket_function(dtype, new.dtype.itemsize) if version >= 3 else None
    rows = rows if bucket is not None and rows is not None and rows[0] < new.size else None
    full = _Trial(old, new, cctx, bucket, rows)
    if new.size >= SAMPLE_MIN_WORDS:
        trial = _Trial(sample(old), sample(new), cctx, bucket)
        if trial.count:
            codecs = candidates(trial.count / trial.new.size, version, bucket)
            if len(codecs) > 1:
                codecs = _worth_encoding(trial, codecs)
            return full.smallest(_with_rows(full, codecs))
        # no change in the sample: a sparse one, picked on the whole unit
    if full.count == 0:
        return None
    return full.smallest(_with_rows(full, candidates(full.count / new.size, version, bucket)))


#: the codec whose encoding a conditioned codec reorders by the base's
#: buckets: the same binarization of the same values, without the buckets
COUNTERPART = {CSPARSE: MSPARSE, CDENSE: MDENSE}
#: from this density of changed words on, a conditioned codec is tried on
#: the sample only where the buckets say it may pay (its trial costs more
#: than its counterpart's there: a 4 MiB bf16 chunk at 50%, 2.7 ms of
#: CSPARSE and 2.3 of CDENSE on the sample, against 4.9 ms for the whole
#: of a version 1 pack's encoding)
LOOK_DENSITY = 0.05
#: a conditioned codec is tried when what its counterpart costs on the
#: sample, less what the buckets say of the delta, is within this factor
#: of the best of the others. The look tends to promise more than the
#: codec saves (order 0 per bucket, no table: 12% of MDENSE's size where
#: CDENSE saves 6%, on the fp32 master of an optimizer step), so no slack
LOOK_SLACK = 1.0
#: where a conditioned codec and its counterpart come within the margin of
#: each other on the sample, the conditioned one is encoded in full too
#: only when the buckets say at least this fraction of the counterpart's
#: size. Where they say nothing the look still finds a little, the noise of
#: counting on a sample: at most 0.29% of MSPARSE's or MDENSE's size over
#: every chunk of the benchmark's uniform changes (rl1, rl3, dense, the
#: frozen layers), 0.02-0.1% on most; where CDENSE won by 0.6%, an fp32
#: tensor scaled by 0.999, 0.57%; an optimizer step, tens of percent
LOOK_NOTHING = 0.004
#: the look counts at most about this many changed words of the sample
#: (every n-th word where it holds more: 1.8 ms instead of 0.3 for a
#: sample of a dense 4 MiB bf16 chunk)
LOOK_WORDS = 16384


def _worth_encoding(trial: _Trial, codecs: tuple[int, ...]) -> tuple[int, ...]:
    """The candidates worth encoding in full, from their sizes on the
    sample (``trial``): those within :data:`SAMPLE_MARGIN` of the smallest.
    A conditioned codec (CSPARSE, CDENSE) costs several times its
    counterpart, so it is spent only where the base's buckets can pay for
    it: above :data:`LOOK_DENSITY` it is tried on the sample only where
    :func:`bucket_information` says it may come within
    :data:`LOOK_SLACK` of the best; and where it comes within the margin
    of its counterpart, it is encoded in full only where the buckets say something
    (:data:`LOOK_NOTHING`): with uniform changes CSPARSE and MSPARSE come
    within 1% of each other, and encoding both took two thirds of pack's
    time. Depends only on the data."""
    sizes = {c: trial.estimate(c) for c in codecs if c not in COUNTERPART}
    best = min(sizes.values())
    look = None
    for c in codecs:
        if c not in COUNTERPART:
            continue
        if trial.count / trial.new.size >= LOOK_DENSITY:
            look = bucket_information(trial) if look is None else look
            u = sizes[COUNTERPART[c]]
            if look < LOOK_NOTHING * u or u - look > best * LOOK_SLACK:
                continue  # the buckets say nothing, or not enough to come close: not tried
        sizes[c] = trial.estimate(c)
    low = min(sizes.values())
    keep = [c for c in codecs if c in sizes and sizes[c] <= low * SAMPLE_MARGIN]
    for c, u in COUNTERPART.items():
        if c in keep and u in keep:  # within the margin of each other: do the buckets say anything?
            look = bucket_information(trial) if look is None else look
            if look < LOOK_NOTHING * sizes[u]:
                keep.remove(c)
    return tuple(keep)


def bucket_information(trial: _Trial) -> float:
    """What the base's bucket says of a delta, in bytes, order 0, on the
    words of ``trial``: how much less information the changed positions
    and the bit lengths of the modular differences hold given each word's
    bucket than without it (positions: ``n H(k/n) - sum n_b H(k_b/n_b)``;
    bit lengths likewise, over the changed words). What a conditioned
    codec can save over its counterpart, less its table and what it gains
    from ordering values within a bucket."""
    old, new = trial.old, trial.new
    pos = trial.positions()
    step = -(-pos.size // LOOK_WORDS)
    if step > 1:  # every step-th word: the same figures, in proportion
        old, new = np.ascontiguousarray(old[::step]), np.ascontiguousarray(new[::step])
        pos = np.flatnonzero(old != new)
    _, _, shift, mask = conditioned.BUCKETS[trial.bucket]
    nb = kernels.bucket_counts(old, shift, mask, np.zeros(0, dtype=np.uint32))[:-1].astype(np.float64)
    a = old[pos]
    b = conditioned.buckets_of(trial.bucket, a).astype(np.int64)
    kb = np.bincount(b, minlength=nb.size).astype(np.float64)
    d = new[pos] - a
    top = old.dtype.type(1 << (8 * old.dtype.itemsize - 1))
    mag = np.where(d >= top, -d, d)  # |new - old| modulo 2^bits
    length = np.frexp(mag.astype(np.float64))[1]  # bit length of each magnitude
    joint = np.bincount(b * 66 + length, minlength=nb.size * 66).reshape(-1, 66).astype(np.float64)
    return step * (_gain(np.stack([kb, nb - kb], axis=1)) + _gain(joint)) / 8


def _gain(t: np.ndarray) -> float:
    """What knowing the row (the bucket) saves in coding the columns of
    the counts ``t``, in bits, order 0: the information of the column
    totals less that of each row (changed or not: ``n H(k/n) - sum n_b
    H(k_b/n_b)``)."""
    return _rows_bits(t.sum(axis=0, keepdims=True)) - _rows_bits(t)


def _rows_bits(t: np.ndarray) -> float:
    """The order-0 information of the counts in each row of ``t``, summed."""
    rows = t.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(-np.nansum(t * np.log2(t / rows)))


def _with_rows(full: _Trial, codecs: tuple[int, ...]) -> tuple[int, ...]:
    """``codecs`` and RSPARSE after them, when it may pay: CSPARSE is among
    them and few enough rows hold a change (counted on the whole unit; the
    sample's runs of words say nothing of rows)."""
    if full.rows is None or CSPARSE not in codecs:
        return codecs
    # CSPARSE is encoded in any case, and the positions come with it (both
    # callers know that the unit has a change: its count is not asked for
    # first, which would scan)
    full.csparse()
    R, o = full.rows
    row = conditioned.rows_of(full.positions(), R, o)
    changed = 1 + int(np.count_nonzero(np.diff(row)))
    if changed > ROWS_MAX_FRACTION * conditioned.row_count(full.new.size, R, o):
        return codecs
    return (*codecs, RSPARSE)


#: this module's own names, and the codec numbers, primitives and decoders
#: it re-exports: the one place the rest of wdiff imports a codec from
__all__ = [
    "BITMAP", "CDENSE", "CODEC_NAMES", "CODEC_VERSION", "CONDITIONED", "CSPARSE", "DENSE", "MAX_RICE", "MBITMAP",
    "MDENSE", "MODULAR", "MSPARSE", "RAW", "ROWS_MAX_FRACTION", "RSPARSE", "SAMPLE_MARGIN", "SAMPLE_MIN_WORDS",
    "SPARSE", "V3_CODECS", "ZSTD", "Encoded", "bucket_function", "bucket_information", "candidates", "combine", "compressor",
    "decode_into", "decompress_exact", "decompressor", "delta_words", "encode_as", "encode_delta", "encode_raw",
    "modular_changes", "plane_compressor", "planes", "rice_decode", "rice_encode", "rows_of_tensor", "sample",
    "unplanes",
]
