"""Safetensors element types: sizes, the codec's word width, and exact
conversion to float for the statistics that ``diff`` prints.

wdiff never does float arithmetic on the bytes it ships (deltas are XOR or
overwrite), so an unknown dtype is still handled exactly, as plain bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    bits: int | None  # bits per element; None when unknown to this version
    word: int  # bytes per codec word: positions and values are counted in words
    kind: str  # "float", "int", "bool", "complex", "packed", "unknown"

    @property
    def is_float(self) -> bool:
        return self.kind in ("float", "complex")


_TABLE = {
    "BOOL": (8, 1, "bool"),
    "U8": (8, 1, "int"),
    "I8": (8, 1, "int"),
    "F8_E4M3": (8, 1, "float"),
    "F8_E5M2": (8, 1, "float"),
    "F8_E4M3FNUZ": (8, 1, "float"),
    "F8_E5M2FNUZ": (8, 1, "float"),
    "F8_E8M0": (8, 1, "float"),
    "I16": (16, 2, "int"),
    "U16": (16, 2, "int"),
    "F16": (16, 2, "float"),
    "BF16": (16, 2, "float"),
    "I32": (32, 4, "int"),
    "U32": (32, 4, "int"),
    "F32": (32, 4, "float"),
    "I64": (64, 8, "int"),
    "U64": (64, 8, "int"),
    "F64": (64, 8, "float"),
    "C64": (64, 4, "complex"),  # two float32: one word per component
    "F4": (4, 1, "packed"),
    "F6_E2M3": (6, 1, "packed"),
    "F6_E3M2": (6, 1, "packed"),
}

KNOWN_DTYPES = frozenset(_TABLE)


@lru_cache(maxsize=None)
def dtype_info(name: str) -> DType:
    """Facts about a safetensors dtype; unknown names are treated as bytes."""
    row = _TABLE.get(name)
    if row is None:
        return DType(name, None, 1, "unknown")
    return DType(name, *row)


def uint_type(word: int) -> np.dtype:
    """The unsigned integer numpy type of a codec word."""
    return np.dtype({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[word])


def _fp8_table(exp_bits: int, man_bits: int, bias: int, fnuz: bool, ieee: bool) -> np.ndarray:
    out = np.empty(256, dtype=np.float64)
    for v in range(256):
        sign = -1.0 if v & 0x80 else 1.0
        e = (v >> man_bits) & ((1 << exp_bits) - 1)
        m = v & ((1 << man_bits) - 1)
        if fnuz and v == 0x80:
            out[v] = np.nan
            continue
        if ieee and e == (1 << exp_bits) - 1:
            out[v] = sign * np.inf if m == 0 else np.nan
            continue
        if not ieee and not fnuz and e == (1 << exp_bits) - 1 and m == (1 << man_bits) - 1:
            out[v] = np.nan  # E4M3FN: only S.1111.111 is NaN, no infinities
            continue
        if e == 0:
            out[v] = sign * (m / (1 << man_bits)) * 2.0 ** (1 - bias)
        else:
            out[v] = sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
    return out


@lru_cache(maxsize=None)
def fp8_table(name: str) -> np.ndarray:
    """The float64 value of each of the 256 codes of an 8-bit float type."""
    if name == "F8_E4M3":
        return _fp8_table(4, 3, 7, fnuz=False, ieee=False)
    if name == "F8_E5M2":
        return _fp8_table(5, 2, 15, fnuz=False, ieee=True)
    if name == "F8_E4M3FNUZ":
        return _fp8_table(4, 3, 8, fnuz=True, ieee=False)
    if name == "F8_E5M2FNUZ":
        return _fp8_table(5, 2, 16, fnuz=True, ieee=False)
    if name == "F8_E8M0":
        t = 2.0 ** (np.arange(256, dtype=np.float64) - 127)
        t[255] = np.nan
        return t
    raise KeyError(name)


def to_float(words: np.ndarray, name: str) -> np.ndarray | None:
    """Decode raw words (the codec's unsigned view) of a float dtype to float32
    or float64 values; ``None`` for dtypes that have no float meaning."""
    if name == "BF16":
        return (words.astype(np.uint32) << 16).view(np.float32)
    if name == "F16":
        return words.view(np.float16).astype(np.float32)
    if name in ("F32", "C64"):
        return words.view(np.float32)
    if name == "F64":
        return words.view(np.float64)
    if name.startswith("F8_"):
        return fp8_table(name)[words]
    return None


SUMSQ_TILE = 64 * 1024  # words per step: the float copy stays in cache


def sum_squares(words: np.ndarray, name: str, scratch: np.ndarray) -> float | None:
    """Sum of squares of the finite values of ``words`` (the codec's uint
    view of a float dtype), converting a cache-sized tile at a time into
    ``scratch`` (uint8, at least 4 bytes per tile word) instead of building
    a float array of the whole input; ``None`` for non-float dtypes."""
    if name in ("F32", "C64"):
        return _dot_finite(words.view(np.float32))
    if name == "F64":
        return _dot_finite(words.view(np.float64))
    if name != "BF16" and name != "F16" and not name.startswith("F8_"):
        return None
    total = 0.0
    for i in range(0, words.size, SUMSQ_TILE):
        w = words[i : i + SUMSQ_TILE]
        buf = scratch[: 4 * w.size]
        if name == "BF16":
            u = buf.view(np.uint32)
            np.copyto(u, w)
            np.left_shift(u, 16, out=u)
            f = u.view(np.float32)
        elif name == "F16":
            f = buf.view(np.float32)
            np.copyto(f, w.view(np.float16))
        else:
            f = buf.view(np.float32)
            np.take(_lut32(name), w, out=f)
        total += _dot_finite(f)
    return total


def _dot_finite(f: np.ndarray) -> float:
    total = float(np.dot(f, f))
    if not np.isfinite(total):
        ok = f[np.isfinite(f)].astype(np.float64)
        total = float(np.dot(ok, ok))
    return total


@lru_cache(maxsize=None)
def _lut32(name: str) -> np.ndarray:
    return fp8_table(name).astype(np.float32)
