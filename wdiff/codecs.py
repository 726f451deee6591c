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

from . import kernels
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
MAX_RICE = kernels.MAX_RICE

_local = threading.local()


def compressor(level: int) -> zstandard.ZstdCompressor:
    """This thread's zstd compressor at ``level``, for general data."""
    return _cached(("general", level), lambda: dict(level=level))


#: Byte planes of weights are near-random symbols with a skewed histogram:
#: what pays is entropy coding, and short LZ matches cost more than the
#: literals they replace. At the fast levels, a tiny hash table and a minimum
#: match of 7 bytes leave them as literals (bench, 4 MiB chunks: XOR values
#: of a +-1 ulp step 2.62 -> 2.24 bits per value, entropy 1.98; new weights
#: 10.95 -> 10.72 bits per element; in less time). From level 10 on, zstd's
#: own parsers weigh literals against matches, and are left alone.
PLANE_TUNING = dict(hash_log=6, min_match=7)


def plane_compressor(level: int) -> zstandard.ZstdCompressor:
    """This thread's zstd compressor at ``level``, for byte planes of weights."""
    extra = PLANE_TUNING if level < 10 else {}
    return _cached(
        ("planes", level),
        lambda: dict(
            compression_params=zstandard.ZstdCompressionParameters.from_level(
                level, write_content_size=True, write_checksum=False, **extra
            )
        ),
    )


def _cached(key, make) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "cctx", None)
    if cache is None:
        cache = _local.cctx = {}
    c = cache.get(key)
    if c is None:
        kw = make()
        if "compression_params" not in kw:
            kw.update(write_content_size=True, write_checksum=False)
        c = cache[key] = zstandard.ZstdCompressor(**kw)
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


def planes(words: np.ndarray) -> np.ndarray:
    """Byte planes of ``words``, most significant plane first (uint8 array)."""
    return kernels.planes(words)


def unplanes(data, n: int, w: int) -> np.ndarray:
    """``n`` words of ``w`` bytes from their byte planes."""
    return kernels.unplanes(data, n, uint_type(w))


# -- Rice-coded gaps ----------------------------------------------------------

rice_encode = kernels.rice_encode


def rice_decode(r: int, unary, remainder, k: int, n: int, *, where: str) -> np.ndarray:
    """Inverse of :func:`rice_encode`; validates every bound against ``n``."""
    if not 0 <= r <= MAX_RICE:
        raise FormatError(f"{where}: Rice parameter {r} out of range")
    positions = kernels.rice_decode(r, unary, remainder, k, n)
    if isinstance(positions, str):
        raise FormatError(f"{where}: {positions}")
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
    return Encoded(RAW, 0, 0, (plane_compressor(level).compress(planes(new)),))


def encode_delta(old: np.ndarray, new: np.ndarray, level: int) -> Encoded | None:
    """Encode ``new`` against ``old`` (same length and word type); ``None``
    when they are equal."""
    n = new.size
    positions, xor = kernels.delta_scan(old, new)
    k = positions.size
    if k == 0:
        return None
    cctx = plane_compressor(level)
    density = k / n
    best: Encoded | None = None

    def consider(e: Encoded) -> None:
        nonlocal best
        if best is None or e.size < best.size:
            best = e

    if density <= 0.6:
        values = cctx.compress(kernels.planes(xor))
        r, unary, rem = rice_encode(positions)
        consider(Encoded(SPARSE, r, k, (unary, rem, values)))
        if density >= 0.02:
            consider(Encoded(BITMAP, 0, k, (cctx.compress(kernels.bitmap(positions, n)), values)))
    if density >= 0.2:
        consider(Encoded(DENSE, 0, k, (cctx.compress(kernels.xor_planes(old, new)),)))
    if density >= 0.5:
        consider(Encoded(RAW, 0, 0, (cctx.compress(kernels.planes(new)),)))
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
    kernels.scatter_xor(buf, positions, xor)
