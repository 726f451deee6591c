"""Element-level encodings of one chunk. Pure functions on numpy arrays.

A chunk is ``n`` words of ``w`` bytes (w in 1, 2, 4, 8). A delta says which
words changed and the XOR of their old and new bytes; XOR is exact for every
dtype and composes exactly, so chained deltas never drift. Four codecs:

``sparse``  positions as Rice-coded gaps (split into a unary and a remainder
            stream), values as XOR byte planes, zstd
``bitmap``  positions as a bit per word, zstd; values as in ``sparse``
``dense``   the XOR of every word, as byte planes, zstd
``raw``     the new words as byte planes, zstd (no base needed)

"Byte planes" means all most-significant bytes first, then the next byte of
every word, and so on: exponent bytes, which compress well, then mantissa
bytes, which do not. The encoder tries the codecs that can win at the chunk's
density and keeps the smallest; the choice depends only on the data, so the
output never depends on thread count or timing. See man/wdiff-format.5.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import zstandard

from .dtypes import uint_type
from .errors import FormatError

RAW, SPARSE, BITMAP, DENSE, ZSTD = 0, 1, 2, 3, 4
#: zstd's level 1 is, on byte planes of weights, both the fastest and the
#: smallest: higher levels find short matches in near-random mantissa bytes
#: that cost more than the literals they replace (bench: 10.9 vs 11.4 bits per
#: bf16 element of new weights, 3.8 vs 4.2 bits per changed element of a
#: dense step, at a fifth of the time)
DEFAULT_LEVEL = 1
CODEC_NAMES = {RAW: "raw", SPARSE: "sparse", BITMAP: "bitmap", DENSE: "dense", ZSTD: "zstd"}
MAX_RICE = 40

_local = threading.local()


def compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "cctx", None)
    if cache is None:
        cache = _local.cctx = {}
    c = cache.get(level)
    if c is None:
        c = cache[level] = zstandard.ZstdCompressor(
            level=level, write_content_size=True, write_checksum=False
        )
    return c


def decompressor() -> zstandard.ZstdDecompressor:
    """This thread's zstd decompressor."""
    d = getattr(_local, "dctx", None)
    if d is None:
        d = _local.dctx = zstandard.ZstdDecompressor()
    return d


def decompress_exact(data, size: int, *, where: str) -> bytes:
    """Decompress one zstd frame that must hold exactly ``size`` bytes. Never
    allocates more than ``size`` bytes, whatever the frame declares."""
    try:
        params = zstandard.get_frame_parameters(data)
    except zstandard.ZstdError:
        raise FormatError(f"{where}: not a zstd frame") from None
    if params.content_size != size:
        raise FormatError(f"{where}: compressed data declares {params.content_size} bytes, expected {size}")
    try:
        reader = decompressor().stream_reader(data, read_across_frames=True)
        out = reader.read(size) if size else b""
        extra = reader.read(1)
    except zstandard.ZstdError as e:
        raise FormatError(f"{where}: corrupt compressed data ({e})") from None
    if len(out) != size or extra:
        raise FormatError(f"{where}: compressed data does not hold exactly {size} bytes")
    return out


def planes(words: np.ndarray) -> bytes:
    """Byte planes of ``words``, most significant plane first."""
    w = words.dtype.itemsize
    if w == 1:
        return words.tobytes()
    return np.ascontiguousarray(words.view(np.uint8).reshape(-1, w)[:, ::-1].T).tobytes()


def unplanes(data: bytes, n: int, w: int) -> np.ndarray:
    raw = np.frombuffer(data, dtype=np.uint8)
    if w == 1:
        return raw
    return np.ascontiguousarray(raw.reshape(w, n)[::-1].T).view(uint_type(w)).reshape(n)


# -- Rice-coded gaps ----------------------------------------------------------


def _rice_param(gaps: np.ndarray) -> int:
    """The Rice parameter that codes ``gaps`` in the fewest bits: near
    log2(mean * ln 2) for geometric gaps; the neighbours are tried exactly."""
    k = gaps.size
    mean = float(gaps.sum(dtype=np.float64)) / k
    guess = min(MAX_RICE, int(np.floor(np.log2(max(mean * 0.69, 1.0)))))
    best = None
    for r in range(max(0, guess - 1), min(MAX_RICE, guess + 1) + 1):
        bits = k * (r + 1) + int((gaps >> r).sum(dtype=np.int64))
        if best is None or bits < best[0]:
            best = (bits, r)
    return best[1]


def rice_encode(positions: np.ndarray) -> tuple[int, bytes, bytes]:
    """Positions (strictly increasing int64) -> (r, unary stream, remainder stream)."""
    if positions.size == 0:
        return 0, b"", b""
    gaps = np.diff(positions, prepend=-1) - 1
    r = _rice_param(gaps)
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


def rice_decode(r: int, unary, remainder, k: int, n: int, *, where: str) -> np.ndarray:
    """Inverse of :func:`rice_encode`; validates every bound against ``n``."""
    if not 0 <= r <= MAX_RICE:
        raise FormatError(f"{where}: Rice parameter {r} out of range")
    ones = np.flatnonzero(np.unpackbits(np.frombuffer(unary, dtype=np.uint8)))
    if ones.size != k or (k and len(unary) != int(ones[-1]) // 8 + 1):
        raise FormatError(f"{where}: position stream does not hold {k} entries")
    q = np.diff(ones, prepend=-1) - 1
    if len(remainder) != (k * r + 7) // 8:
        raise FormatError(f"{where}: remainder stream has the wrong length")
    if k and int(q.max()) > (n >> r):
        raise FormatError(f"{where}: position out of range")
    gaps = q.astype(np.int64) << r
    if r:
        rbits = np.unpackbits(np.frombuffer(remainder, dtype=np.uint8))
        if rbits[k * r :].any():
            raise FormatError(f"{where}: nonzero padding in remainder stream")
        rb = rbits[: k * r].reshape(k, r).astype(np.int64)
        gaps |= rb @ (np.int64(1) << np.arange(r - 1, -1, -1, dtype=np.int64))
    positions = np.cumsum(gaps + 1) - 1
    if k and int(positions[-1]) >= n:
        raise FormatError(f"{where}: position out of range")
    return positions


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
    return Encoded(RAW, 0, 0, (compressor(level).compress(planes(new)),))


def encode_delta(old: np.ndarray, new: np.ndarray, level: int, mask: np.ndarray | None = None) -> Encoded | None:
    """Encode ``new`` against ``old`` (same length and word type); ``None``
    when they are equal. ``mask`` is an optional scratch bool array."""
    n = new.size
    if mask is None or mask.size < n:
        mask = np.empty(n, dtype=bool)
    mask = mask[:n]
    np.not_equal(old, new, out=mask)
    positions = np.flatnonzero(mask)
    k = positions.size
    if k == 0:
        return None
    cctx = compressor(level)
    density = k / n
    best: Encoded | None = None

    def consider(e: Encoded) -> None:
        nonlocal best
        if best is None or e.size < best.size:
            best = e

    if density <= 0.6:
        values = cctx.compress(planes(old[positions] ^ new[positions]))
        r, unary, rem = rice_encode(positions)
        consider(Encoded(SPARSE, r, k, (unary, rem, values)))
        if density >= 0.02:
            consider(Encoded(BITMAP, 0, k, (cctx.compress(np.packbits(mask).tobytes()), values)))
    if density >= 0.2:
        consider(Encoded(DENSE, 0, k, (cctx.compress(planes(old ^ new)),)))
    if density >= 0.5:
        consider(Encoded(RAW, 0, 0, (cctx.compress(planes(new)),)))
    return best


def decode_into(
    codec: int, param: int, count: int, parts: list[bytes], buf: np.ndarray, *, where: str
) -> None:
    """Apply an encoded chunk to ``buf`` (words of the base; for ``raw`` its
    contents are ignored). ``parts`` are the payload sections; sections a
    codec does not use must be empty. Every length and position is checked."""
    used = {RAW: 1, DENSE: 1, BITMAP: 2, SPARSE: 3}.get(codec)
    if used is None:
        raise FormatError(f"{where}: unknown codec {codec}")
    if any(len(p) for p in parts[used:]):
        raise FormatError(f"{where}: malformed record (unused payload section)")
    parts = list(parts[:used]) + [b""] * (used - len(parts))
    n = buf.size
    w = buf.dtype.itemsize
    if codec == RAW:
        if count != 0 or param != 0:
            raise FormatError(f"{where}: malformed raw record")
        buf[:] = unplanes(decompress_exact(parts[0], n * w, where=where), n, w)
        return
    if not 0 < count <= n:
        raise FormatError(f"{where}: changed-word count {count} out of range")
    if codec == SPARSE:
        positions = rice_decode(param, parts[0], parts[1], count, n, where=where)
        values = parts[2]
    elif codec == BITMAP:
        if param != 0:
            raise FormatError(f"{where}: malformed bitmap record")
        bits = np.unpackbits(np.frombuffer(decompress_exact(parts[0], (n + 7) // 8, where=where), dtype=np.uint8))
        if bits[n:].any():
            raise FormatError(f"{where}: nonzero padding in bitmap")
        positions = np.flatnonzero(bits[:n])
        if positions.size != count:
            raise FormatError(f"{where}: bitmap does not hold {count} positions")
        values = parts[1]
    elif codec == DENSE:
        if param != 0:
            raise FormatError(f"{where}: malformed dense record")
        xor = unplanes(decompress_exact(parts[0], n * w, where=where), n, w)
        if np.count_nonzero(xor) != count:
            raise FormatError(f"{where}: dense record does not change {count} words")
        buf ^= xor
        return
    xor = unplanes(decompress_exact(values, count * w, where=where), count, w)
    if not xor.all():
        raise FormatError(f"{where}: a listed position does not change")
    buf[positions] ^= xor
