"""The changed words of one chunk record over live tensors, checked (see
:mod:`.apply`): :func:`fast_changes` for a record that lists its changed
words (SPARSE, BITMAP and codec v2's MSPARSE, MBITMAP, CSPARSE, RSPARSE)
over CPU tensors, hashing and reading them in place; :func:`buffered_changes`
for any record, through a buffer of the chunk (a mirror on disk, device
tensors, an anchor). Both check the chunk's base digest before decoding;
:func:`buffered_changes` checks its target digest before it returns,
:func:`fast_changes` leaves that to the caller (apply_into's read-back after
the scatter, undone on a mismatch), as it never holds the patched chunk.
"""

from __future__ import annotations

import numpy as np

from ..codec.chunk import (
    BITMAP,
    CSPARSE,
    MBITMAP,
    MSPARSE,
    RSPARSE,
    SPARSE,
    decode_into,
    decompress_exact,
    modular_changes,
    rice_decode,
    unplanes,
)
from ..codec.dtypes import uint_type
from ..errors import BaseMismatchError, FormatError, IntegrityError
from ..format.bundle import ZERO, BundleReader
from ..paths import printable
from ..store.blockio import span_digests
from ..store.hashing import block_digests, tree
from ..store.units import Unit

#: the codecs whose records list their changed words
LISTED = frozenset({SPARSE, BITMAP, MSPARSE, MBITMAP, CSPARSE, RSPARSE})


def _where(reader: BundleReader, rec, unit: Unit) -> str:
    return f"{reader.path}: record {rec.index} ({printable(unit.spans[0].tensor.name)})"


def _base_check(got: bytes, h, where: str) -> None:
    if h.base != ZERO and got != h.base:
        raise BaseMismatchError(f"{where}: the tensors' bytes are not the bundle's base",
                                hint="the tensors do not hold the version this bundle starts from")


def _decode(reader: BundleReader, rec, unit: Unit, base, buf: np.ndarray, old: np.ndarray) -> bool:
    """Read the chunk's base bytes into ``buf`` (a copy in ``old``), check
    them, decode the record into ``buf`` and check the result. Returns
    whether ``old`` holds the base bytes (not for a chunk without a base)."""
    h = rec.header
    where = _where(reader, rec, unit)
    based = unit.spans[0].base is not None
    if based:
        base.read(unit, buf)
        _base_check(tree(b"".join(span_digests(unit, buf))), h, where)
        old[:] = buf
    else:
        buf[:] = 0
        old[:] = 0
    decode_into(h.codec, h.param, h.count, list(rec.payload), buf.view(uint_type(unit.word)), where=where)
    if tree(b"".join(span_digests(unit, buf))) != h.target:
        raise IntegrityError(f"{where}: rebuilt bytes do not match the target digest")
    return based


def _listed(h, parts, words: np.ndarray, where: str):
    """(positions, new words) of a record that lists its changed words
    (SPARSE, BITMAP, MSPARSE, MBITMAP, CSPARSE), from the chunk's base
    ``words``, with the checks decode_into makes; None for other codecs
    (decoded whole instead). Only the listed words of ``words`` are read,
    but for CSPARSE, whose positions depend on every base word."""
    if h.codec not in LISTED:
        return None
    if h.codec in (SPARSE, BITMAP):
        pos, xor = _sparse(h, parts, words.size, words.dtype.itemsize, where)
        return pos, words[pos] ^ xor
    pos, new = modular_changes(h.codec, h.param, h.count, list(parts), words, where=where)
    pos = pos.astype(np.int64, copy=False)
    if pos.size > 1 and not (pos[1:] > pos[:-1]).all():
        order = np.argsort(pos, kind="stable")  # CSPARSE and RSPARSE list positions by bucket
        pos, new = pos[order], new[order]
    return pos, new


def _sparse(h, parts, n: int, w: int, where: str):
    """Positions and XOR words of a SPARSE or BITMAP record, with the checks
    decode_into makes."""
    used = 3 if h.codec == SPARSE else 2
    if any(len(p) for p in parts[used:]):
        raise FormatError(f"{where}: malformed record (unused payload section)")
    parts = list(parts[:used]) + [b""] * (used - len(parts))
    if not 0 < h.count <= n:
        raise FormatError(f"{where}: changed-word count {h.count} out of range")
    if h.codec == SPARSE:
        pos = rice_decode(h.param, parts[0], parts[1], h.count, n, where=where)
        values = parts[2]
    else:
        if h.param != 0:
            raise FormatError(f"{where}: malformed bitmap record")
        bits = np.unpackbits(np.frombuffer(decompress_exact(parts[0], (n + 7) // 8, where=where), dtype=np.uint8))
        if bits[n:].any():
            raise FormatError(f"{where}: nonzero padding in bitmap")
        pos = np.flatnonzero(bits[:n])
        if pos.size != h.count:
            raise FormatError(f"{where}: bitmap does not hold {h.count} positions")
        values = parts[1]
    xor = unplanes(decompress_exact(values, h.count * w, where=where), h.count, w)
    if not xor.all():
        raise FormatError(f"{where}: a listed position does not change")
    return pos, xor


def span_digest(unit: Unit) -> bytes:
    """The tree digest of a unit's bytes, hashed in place in CPU tensors."""
    return tree(b"".join(block_digests(s.base.file.u8[s.lo : s.hi]) for s in unit.spans))


def _gather(unit: Unit, pos: np.ndarray) -> np.ndarray:
    """The words at unit word positions ``pos`` (sorted), from the tensors."""
    w = unit.word
    ut = uint_type(w)
    out = np.empty(pos.size, dtype=ut)
    bounds = np.cumsum([0] + [(s.hi - s.lo) // w for s in unit.spans])
    cuts = np.searchsorted(pos, bounds)
    for k, s in enumerate(unit.spans):
        a, b = cuts[k], cuts[k + 1]
        if a < b:
            words = s.base.file.u8.view(ut)
            out[a:b] = words[pos[a:b] - bounds[k] + s.lo // w]
    return out


class _Lazy:
    """A unit's base words spread over CPU tensors, as the 1-D array that
    modular_changes reads (size, dtype, fancy indexing): only the listed
    words are gathered, never the chunk."""

    def __init__(self, unit: Unit) -> None:
        self.unit = unit
        self.dtype = np.dtype(uint_type(unit.word))
        self.size = unit.nbytes // unit.word

    def __getitem__(self, pos):
        return _gather(self.unit, np.asarray(pos))


def _base_words(unit: Unit, need_all: bool):
    """The unit's base words in the CPU tensors: a view for one span, else
    a copy of the chunk (``need_all``, CSPARSE reads every word) or a lazy
    gatherer of listed words."""
    ut = uint_type(unit.word)
    if len(unit.spans) == 1:
        s = unit.spans[0]
        return s.base.file.u8[s.lo : s.hi].view(ut)
    if need_all:
        return np.concatenate([s.base.file.u8[s.lo : s.hi] for s in unit.spans]).view(ut)
    return _Lazy(unit)


def fast_changes(reader: BundleReader, rec, unit: Unit):
    """(positions, old words, new words) of a record that lists its changed
    words (SPARSE, BITMAP and codec v2's MSPARSE, MBITMAP, CSPARSE) over
    CPU tensors, without copying or comparing whole chunks: the base digest
    is hashed in the tensors' own memory, and only the listed words are
    read (CSPARSE reads the chunk, whose words place its positions). None
    where this does not apply (other codecs, device tensors)."""
    h = rec.header
    if h.base == ZERO or h.codec not in LISTED:
        return None
    if any(s.base.file.device is not None or s.base.file.u8 is None for s in unit.spans):
        return None
    where = _where(reader, rec, unit)
    _base_check(span_digest(unit), h, where)
    words = _base_words(unit, need_all=h.codec in (CSPARSE, RSPARSE))
    pos, new = _listed(h, rec.payload, words, where)
    return pos, words[pos], new


def buffered_changes(reader: BundleReader, rec, unit: Unit, base):
    """(positions, old words, new words, whole) of any record, from the
    chunk's base read into a buffer (a mirror on disk, device tensors, or no
    base at all for an anchor): checked against the base digest, patched in
    the buffer (a listed record: its positions only; any other: decoded
    whole) and checked against the target digest before anything is
    returned. ``whole``: the record rewrites every word (no base)."""
    h = rec.header
    if unit.spans[0].base is None or h.base == ZERO or h.codec not in LISTED:
        buf = np.empty(unit.nbytes, dtype=np.uint8)
        old = np.empty(unit.nbytes, dtype=np.uint8)
        based = _decode(reader, rec, unit, base, buf, old)
        pos, ov, nv = _changed(unit, buf, old, whole=not based)
        return pos, ov, nv, not based
    where = _where(reader, rec, unit)
    buf = np.empty(unit.nbytes, dtype=np.uint8)
    base.read(unit, buf)
    _base_check(tree(b"".join(span_digests(unit, buf))), h, where)
    words = buf.view(uint_type(unit.word))
    pos, new = _listed(h, rec.payload, words, where)
    old = words[pos]
    words[pos] = new
    if tree(b"".join(span_digests(unit, buf))) != h.target:
        raise IntegrityError(f"{where}: rebuilt bytes do not match the target digest")
    return pos, old, new, False


def _changed(unit: Unit, buf: np.ndarray, old: np.ndarray, *, whole: bool):
    ut = uint_type(unit.word)
    nw, ow = buf.view(ut), old.view(ut)
    pos = np.arange(nw.size, dtype=np.int64) if whole else np.flatnonzero(nw != ow)
    return pos, ow[pos], nw[pos]


__all__ = ["LISTED", "buffered_changes", "fast_changes", "span_digest"]
