"""The codecs of a chunk record, by number, and the primitives every codec
stands on: zstd compressors and the checked decompression, byte planes,
Rice-coded gaps. See man/wdiff-format.5; the encoder is :mod:`.chunk`,
the decoder :mod:`.decode`.
"""

from __future__ import annotations

import threading

import numpy as np
import zstandard

from ..errors import FormatError
from . import kernels
from .dtypes import uint_type

RAW, SPARSE, BITMAP, DENSE, ZSTD = 0, 1, 2, 3, 4
#: codec v2 (bundle format version 3): modular differences instead of XOR,
#: and positions conditioned on the base (see conditioned.py)
MSPARSE, MBITMAP, MDENSE, CSPARSE, CDENSE = 5, 6, 7, 8, 9
#: CSPARSE over the rows that hold a change (rows of the tensor's last dimension)
RSPARSE = 10
CODEC_NAMES = {
    RAW: "raw", SPARSE: "sparse", BITMAP: "bitmap", DENSE: "dense", ZSTD: "zstd",
    MSPARSE: "msparse", MBITMAP: "mbitmap", MDENSE: "mdense", CSPARSE: "csparse", CDENSE: "cdense",
    RSPARSE: "rsparse",
}
#: the codecs whose payload holds modular differences (new = old + D), not XOR
MODULAR = frozenset({MSPARSE, MBITMAP, MDENSE, CSPARSE, CDENSE, RSPARSE})
#: the codecs whose decoding reads one side of the delta (the bucket order)
CONDITIONED = frozenset({CSPARSE, CDENSE, RSPARSE})
#: the codecs that need bundle format version 3
V3_CODECS = MODULAR
#: the lowest bundle format version that may hold each codec
CODEC_VERSION = {c: (3 if c in V3_CODECS else 1) for c in CODEC_NAMES}
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


def decompress_exact(data, size: int, *, where: str, dctx: zstandard.ZstdDecompressor | None = None) -> bytes:
    """Decompress one zstd frame that must hold exactly ``size`` bytes. Never
    allocates more than ``size`` bytes, whatever the frame declares.
    ``dctx``: a decompressor of one's own (with a dictionary) instead of the
    shared one."""
    try:
        params = zstandard.get_frame_parameters(data)
    except zstandard.ZstdError:
        raise FormatError(f"{where}: not a zstd frame") from None
    if params.content_size != size:
        raise FormatError(f"{where}: compressed data declares {params.content_size} bytes, expected {size}")
    try:
        reader = (dctx or decompressor()).stream_reader(data, read_across_frames=True)
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
