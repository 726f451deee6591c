"""Byte-level deltas of companion (opaque) files: one byte range of the new
file against the base's file at the same path. Pure functions on bytes.

Two families of codecs, the encoder keeps the smaller (see man/wdiff-format.5,
DELTA records):

Word codecs (RAW, SPARSE, BITMAP, DENSE of :mod:`wdiff.codec.chunk`)
    the range [lo, hi) against the base's bytes at the same offsets, as
    words of a width guessed from the data (1, 2, 4 or 8 bytes: the width
    whose encoding of a sample is smallest). In-place edits of arrays of
    numbers (pytorch_model.bin, GGUF, optimizer state) are element-sparse:
    these codecs reach what tensor chunks reach.
``ZSTD_BASE`` (16)
    one zstd frame of the new range, compressed with a window of the base's
    bytes [dlo, dhi) as a raw-content dictionary: it finds insertions,
    deletions and shifts within the window, as ``zstd --patch-from`` does.

The choice depends only on the bytes, never on threads or timing.
"""

from __future__ import annotations

import struct

import numpy as np
import xxhash
import zstandard

from ..errors import FormatError
from .chunk import BITMAP, DENSE, RAW, SPARSE, Encoded, decode_into, decompress_exact, encode_delta
from .dtypes import uint_type

ZSTD_BASE = 16
#: the word codecs: the range against the base's bytes at the same offsets
#: (RAW: the new words alone, as byte planes, when that is smaller)
XOR_CODECS = (RAW, SPARSE, BITMAP, DENSE)
CODECS = XOR_CODECS + (ZSTD_BASE,)
CODEC_NAMES = {RAW: "file-raw", SPARSE: "file-sparse", BITMAP: "file-bitmap", DENSE: "file-dense",
               ZSTD_BASE: "file-zstd-base"}

#: the encoder's ranges: at most this many bytes (the format allows 64 MiB)
RANGE_BYTES = 8 * 1024 * 1024
#: the base window a ZSTD_BASE range takes: this much on each side of the
#: range's own offsets. zstandard indexes at most 16 MiB of a dictionary
#: (measured with python-zstandard 0.25: the start of a larger one is never
#: matched), so range + 2 * window stays at 16 MiB
WINDOW_BYTES = 4 * 1024 * 1024
#: the most base bytes a ZSTD_BASE record may name as its dictionary
MAX_DICT_BYTES = 64 * 1024 * 1024
#: the largest zstd window a ZSTD_BASE frame may declare (decoder memory)
MAX_WINDOW_LOG = 28
#: the window budget of a file: the windows of its ZSTD_BASE records, from
#: the first record up to any record, sum to at most WINDOW_FACTOR times
#: that record's hi. A reader reads, hashes and loads every window byte once,
#: so this bounds its work by the file's size, whatever the record count
#: (one-byte records each naming the same 64 MiB window cost 1,000 s of CPU
#: per MB of bundle before)
WINDOW_FACTOR = 4
DICT_RANGE = struct.Struct("<QQ")
#: the width guess looks at this many bytes of the range, in 8 runs
SAMPLE_BYTES = 1 << 20
WIDTHS = (1, 2, 4, 8)


def digest(data) -> bytes:
    """The digest a DELTA record gives of a byte range: XXH3-128 of the bytes."""
    return xxhash.xxh3_128_digest(data)


def _sample(data: np.ndarray) -> np.ndarray:
    n = data.size
    if n <= SAMPLE_BYTES:
        return data
    run = (SAMPLE_BYTES // 8) & ~7
    step = (n // 8) & ~7
    return np.concatenate([data[i * step : i * step + run] for i in range(8)])


def guess_width(old: np.ndarray, new: np.ndarray, level: int) -> int:
    """The word width (1, 2, 4 or 8) whose XOR encoding of a sample of the
    range is smallest; the narrowest on a tie. ``old`` and ``new`` are uint8
    arrays of one length."""
    so, sn = _sample(old), _sample(new)
    best, best_size = 1, None
    for w in WIDTHS:
        if old.size % w or so.size % w:
            continue
        enc = encode_delta(so.view(uint_type(w)), sn.view(uint_type(w)), level)
        size = 0 if enc is None else enc.size
        if best_size is None or size < best_size:
            best, best_size = w, size
    return best


def encode_xor(old: np.ndarray, new: np.ndarray, level: int) -> tuple[int, Encoded] | None:
    """The XOR encoding of ``new`` against ``old`` (uint8 arrays, one length)
    at the guessed width: (width, encoded); None when they are equal."""
    w = guess_width(old, new, level)
    enc = encode_delta(old.view(uint_type(w)), new.view(uint_type(w)), level)
    return None if enc is None else (w, enc)


def _window_log(n: int) -> int:
    return max(10, min(MAX_WINDOW_LOG, (max(n, 1) - 1).bit_length()))


def _params(level: int, dict_len: int, n: int) -> zstandard.ZstdCompressionParameters:
    # the hash and chain tables must reach the whole dictionary (zstd indexes
    # only the last 8 << max(hashLog, chainLog) bytes of a loaded one)
    base = zstandard.ZstdCompressionParameters.from_level(level, source_size=n + dict_len)
    reach = max(base.hash_log, base.chain_log, (max(dict_len, 1) - 1).bit_length() - 3, 0)
    return zstandard.ZstdCompressionParameters.from_level(
        level, source_size=n + dict_len, window_log=_window_log(dict_len + n),
        hash_log=min(reach, 24), chain_log=min(reach, 24),
        write_content_size=True, write_checksum=False, write_dict_id=False,
    )


def encode_zstd_base(window: bytes, dlo: int, new: bytes, level: int) -> Encoded:
    """``new`` as one zstd frame against ``window``, the base's bytes from
    offset ``dlo``, as a raw-content dictionary."""
    d = zstandard.ZstdCompressionDict(window, dict_type=zstandard.DICT_TYPE_RAWCONTENT) if window else None
    cctx = zstandard.ZstdCompressor(dict_data=d, compression_params=_params(level, len(window), len(new)))
    return Encoded(ZSTD_BASE, 0, 0, (DICT_RANGE.pack(dlo, dlo + len(window)), cctx.compress(new)))


def dict_range(part: bytes, base_size: int, *, where: str) -> tuple[int, int]:
    """The base window [dlo, dhi) a ZSTD_BASE record names, checked."""
    if len(part) != DICT_RANGE.size:
        raise FormatError(f"{where}: malformed file delta record (dictionary range)")
    dlo, dhi = DICT_RANGE.unpack(part)
    if not dlo <= dhi <= base_size or dhi - dlo > MAX_DICT_BYTES:
        raise FormatError(f"{where}: file delta dictionary [{dlo}, {dhi}) lies outside the base's file")
    return dlo, dhi


def window_budget(hi: int) -> int:
    """The most window bytes a file's ZSTD_BASE records up to one whose
    range ends at ``hi`` may name in all (see WINDOW_FACTOR)."""
    return WINDOW_FACTOR * hi


def decode_zstd_base(window: bytes, frame: bytes, size: int, *, where: str) -> bytes:
    """Exactly ``size`` bytes from a ZSTD_BASE frame; never allocates more,
    whatever the frame declares."""
    d = zstandard.ZstdCompressionDict(window, dict_type=zstandard.DICT_TYPE_RAWCONTENT) if window else None
    try:
        dctx = zstandard.ZstdDecompressor(dict_data=d, max_window_size=1 << MAX_WINDOW_LOG)
    except zstandard.ZstdError as e:
        raise FormatError(f"{where}: corrupt compressed data ({e})") from None
    return decompress_exact(frame, size, where=where, dctx=dctx)


def decode_xor(codec: int, word: int, param: int, count: int, parts, old: bytes, *, where: str) -> bytes:
    """The new bytes of an XOR record from the base's bytes ``old``."""
    if codec not in XOR_CODECS or len(old) % word:
        raise FormatError(f"{where}: unknown or malformed file delta codec {codec}")
    buf = np.frombuffer(bytearray(old), dtype=np.uint8)
    decode_into(codec, param, count, list(parts), buf.view(uint_type(word)), where=where)
    return buf.tobytes()


# -- finding where a target's bytes lie in the base file --------------------
#: the bytes a content key covers, and its multiplier (odd: invertible mod 2^64)
KEY_BYTES = 32
_P = 0x9E3779B97F4A7C15
_PINV = pow(_P, -1, 1 << 64)


def _powers(x: int, n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.uint64)
    out[0] = 1
    out[1:] = np.uint64(x)
    with np.errstate(over="ignore"):
        return np.cumprod(out, dtype=np.uint64)


_POW_CACHE: list[tuple[np.ndarray, np.ndarray]] = []


def _pows(n: int) -> tuple[np.ndarray, np.ndarray]:
    """P^i and P^-i for i < n (the longest asked for so far is kept)."""
    got = _POW_CACHE[-1] if _POW_CACHE else None
    if got is None or got[0].size < n:
        got = (_powers(_P, n), _powers(_PINV, n))
        _POW_CACHE[:] = [got]
    return got[0][:n], got[1][:n]


def keys_at(rows: np.ndarray) -> np.ndarray:
    """The content key of each row of a (k, KEY_BYTES) uint8 array: the
    polynomial sum(x[i] P^(KEY_BYTES-1-i)) mod 2^64 (as rolling_keys gives)."""
    pw = _pows(KEY_BYTES)[0][::-1]
    with np.errstate(over="ignore"):
        return (rows.astype(np.uint64) * pw).sum(axis=1, dtype=np.uint64)


def rolling_keys(x: np.ndarray) -> np.ndarray:
    """The content key of every KEY_BYTES-byte window of ``x`` (uint8):
    element j is the key of x[j : j + KEY_BYTES]."""
    n = x.size
    if n < KEY_BYTES:
        return np.empty(0, dtype=np.uint64)
    pw, pv = _pows(n)
    with np.errstate(over="ignore"):
        q = np.empty(n + 1, dtype=np.uint64)
        q[0] = 0
        np.cumsum(x.astype(np.uint64) * pv, dtype=np.uint64, out=q[1:])
        return (q[KEY_BYTES:] - q[: n + 1 - KEY_BYTES]) * pw[KEY_BYTES - 1 :]


def constant_rows(rows: np.ndarray) -> np.ndarray:
    """True where a (k, KEY_BYTES) row holds one byte value only (zeros,
    padding: such content matches anywhere and is not worth locating)."""
    return (rows == rows[:, :1]).all(axis=1)


__all__ = [
    "CODECS",
    "CODEC_NAMES",
    "KEY_BYTES",
    "MAX_DICT_BYTES",
    "RANGE_BYTES",
    "WINDOW_BYTES",
    "WINDOW_FACTOR",
    "XOR_CODECS",
    "ZSTD_BASE",
    "constant_rows",
    "decode_xor",
    "decode_zstd_base",
    "dict_range",
    "digest",
    "encode_xor",
    "encode_zstd_base",
    "guess_width",
    "keys_at",
    "rolling_keys",
    "window_budget",
]
