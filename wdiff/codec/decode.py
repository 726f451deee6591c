"""Decoding one chunk record (:func:`decode_into`), or turning it into the
words of its delta (:func:`delta_words`, :func:`combine`: squash and
reverse) or its changed positions and new words (:func:`modular_changes`:
live sync). Every length, position and value is checked against the
format's rules (man/wdiff-format.5) before a word is written; a record
that breaks one raises FormatError. The encoder is :mod:`.chunk`.
"""

from __future__ import annotations

import numpy as np

from ..errors import FormatError
from . import conditioned, kernels
from .codecs import (
    BITMAP,
    CDENSE,
    CSPARSE,
    DENSE,
    MBITMAP,
    MDENSE,
    MODULAR,
    MSPARSE,
    RAW,
    RSPARSE,
    SPARSE,
    decompress_exact,
    rice_decode,
    unplanes,
)


def _value_stream(data, count: int, w: int, runs: list[int], *, where: str) -> tuple[bytes, np.ndarray]:
    """The sign bits and the magnitude planes of a range-coded value section."""
    got = kernels.rc_values_decode(bytes(data), count, w, runs)
    if isinstance(got, int):
        raise FormatError(f"{where}: value section is not a stream of {count} values")
    return got


def _read_mvalues(data, count: int, w: int, runs: list[int], *, where: str) -> np.ndarray:
    """The modular differences of a range-coded value section (see
    :func:`_mvalues_at`)."""
    signs, mplanes = _value_stream(data, count, w, runs, where=where)
    neg = np.unpackbits(np.frombuffer(signs, dtype=np.uint8))[:count].astype(bool)
    d = conditioned.from_sign_magnitude(neg, unplanes(mplanes, count, w))
    if d is None:  # the coder cannot write one; kept as the last line of defence
        raise FormatError(f"{where}: a value's magnitude is out of range")
    return d


def _read_dense_values(data, n: int, w: int, *, where: str) -> np.ndarray:
    """The modular differences of CDENSE's value section (see :func:`_dense_values`)."""
    data = bytes(data)
    try:
        slen, at = conditioned.read_varint(data)
    except conditioned.Malformed as e:
        raise FormatError(f"{where}: value section: {e}") from None
    if slen > len(data) - at:
        raise FormatError(f"{where}: value section: sign frame longer than the section")
    signs = decompress_exact(data[at : at + slen], (n + 7) // 8, where=where)
    if n % 8 and signs[-1] & (0xFF >> (n % 8)):
        raise FormatError(f"{where}: nonzero padding in the sign bits")
    mag = unplanes(decompress_exact(data[at + slen :], n * w, where=where), n, w)
    neg = np.unpackbits(np.frombuffer(signs, dtype=np.uint8))[:n].astype(bool)
    d = conditioned.from_dense_sign_magnitude(neg, mag)
    if d is None:
        raise FormatError(f"{where}: a value's magnitude is out of range")
    return d


def decode_into(
    codec: int, param: int, count: int, parts: list[bytes], buf: np.ndarray, *, where: str
) -> None:
    """Apply an encoded chunk to ``buf`` (words of the base; for ``raw`` its
    contents are ignored). ``parts`` are the payload sections; sections a
    codec does not use must be empty. Every length and position is checked."""
    if codec in MODULAR:
        positions, d = _modular(codec, param, count, parts, buf, True, where=where, into=True)
        if d is None:  # added already
            return
        if positions is None:
            buf += d
        else:
            conditioned.add_at(buf, positions, d)
        return
    _decode_v1(codec, param, count, parts, buf, where=where)


def delta_words(
    codec: int, param: int, count: int, parts: list[bytes], ref: np.ndarray, *, ref_is_base: bool, where: str
) -> np.ndarray:
    """What a delta record holds, as a fresh array of words: the XOR of old
    and new (v1 codecs) or the modular difference ``new - old`` (MODULAR
    codecs), zero where nothing changes. ``ref`` is one side of the delta,
    the base (``ref_is_base``) or the target, and is read only by CSPARSE,
    whose positions depend on it (either side gives the same answer, the
    format guarantees it). For composing deltas (squash) and inverting
    them (reverse); see :func:`combine`."""
    out = np.zeros(ref.size, dtype=ref.dtype)
    if codec not in MODULAR:
        _decode_v1(codec, param, count, parts, out, where=where)
        return out
    positions, d = _modular(codec, param, count, parts, ref, ref_is_base, where=where)
    if positions is None:
        out[:] = d
    else:
        out[positions] = d
    return out


def combine(codec: int, dst: np.ndarray, delta: np.ndarray, *, inverse: bool = False) -> None:
    """Apply what :func:`delta_words` gave for a record of ``codec`` to
    ``dst`` (words of its base; or of its target with ``inverse``, which
    turns them back into the base): XOR both ways, or ``+ D`` / ``- D``."""
    if codec not in MODULAR:
        dst ^= delta
    elif inverse:
        dst -= delta
    else:
        dst += delta


def _modular(codec, param, count, parts, ref, ref_is_base, *, where, into=False):
    """(positions or None for every word, modular differences) of a MODULAR
    record, checked; ``ref`` is a side of the delta (read by CSPARSE only,
    and by the mover check). With ``into`` (``ref`` the base), the sparse
    codecs add their differences to ``ref`` once all is checked, and give
    (positions, None)."""
    used = 1 if codec == MDENSE else 2 if codec in (MBITMAP, CDENSE) else 3
    if any(len(p) for p in parts[used:]):
        raise FormatError(f"{where}: malformed record (unused payload section)")
    parts = list(parts[:used]) + [b""] * (used - len(parts))
    n, w = ref.size, ref.dtype.itemsize
    if not 0 < count <= n:
        raise FormatError(f"{where}: changed-word count {count} out of range")
    if codec == RSPARSE:
        return _rsparse(param, count, parts, ref, ref_is_base, where=where, into=into)
    if codec == CDENSE:
        if param not in conditioned.BUCKETS or conditioned.BUCKETS[param][1] != w:
            raise FormatError(f"{where}: cdense record with bucket function {param} for {w}-byte words")
        try:
            movers = conditioned.read_mover_head(bytes(parts[0]), n)
        except conditioned.Malformed as e:
            raise FormatError(f"{where}: {e}") from None
        order = conditioned.dense_order(param, ref, movers)
        if order is None:
            raise FormatError(f"{where}: cdense mover list out of order")
        d = np.zeros(n, dtype=ref.dtype)
        d[order] = _read_dense_values(parts[1], n, w, where=where)
        if np.count_nonzero(d) != count:
            raise FormatError(f"{where}: cdense record does not change {count} words")
        other = ref + d if ref_is_base else ref - d
        moved = conditioned.movers_of(param, ref, other)
        if moved.size != movers.size or (moved != movers).any():
            raise FormatError(f"{where}: cdense record lists a word in the wrong bucket")
        return None, d
    if codec == MDENSE:
        if param != 0:
            raise FormatError(f"{where}: malformed mdense record")
        z = unplanes(decompress_exact(parts[0], n * w, where=where), n, w)
        if np.count_nonzero(z) != count:
            raise FormatError(f"{where}: mdense record does not change {count} words")
        return None, conditioned.unzigzag(z)
    runs = [count]
    if codec == MSPARSE:
        positions = rice_decode(param, parts[0], parts[1], count, n, where=where)
        values = parts[2]
    elif codec == MBITMAP:
        if param != 0:
            raise FormatError(f"{where}: malformed mbitmap record")
        positions = _bitmap_positions(parts[0], n, count, where=where)
        values = parts[1]
    else:  # CSPARSE
        if param not in conditioned.BUCKETS or conditioned.BUCKETS[param][1] != w:
            raise FormatError(f"{where}: csparse record with bucket function {param} for {w}-byte words")
        try:
            positions, movers, runs = conditioned.decode_positions(param, ref, bytes(parts[0]), bytes(parts[1]), count)
        except conditioned.Malformed as e:
            raise FormatError(f"{where}: {e}") from None
        values = parts[2]
    if into:
        signs, mplanes = _value_stream(values, count, w, runs, where=where)
        _, _, shift, mask = conditioned.BUCKETS[param] if codec == CSPARSE else (None, None, 0, 0)
        err = kernels.mod_apply(ref, positions, signs, mplanes, shift, mask, movers if codec == CSPARSE else 0)
        if err == kernels.MV_BAD_MAGNITUDE:
            raise FormatError(f"{where}: a value's magnitude is out of range")
        if err == kernels.MV_WRONG_BUCKET:
            raise FormatError(f"{where}: csparse record lists a word in the wrong bucket")
        if err:
            raise FormatError(f"{where}: position out of range")
        return positions, None
    d = _read_mvalues(values, count, w, runs, where=where)
    if codec == CSPARSE:
        # the movers, and only they, change bucket: what makes the positions
        # decodable from either side (a reverse lists them from the target)
        r = ref[positions]
        other = r + d if ref_is_base else r - d
        moved = conditioned.buckets_of(param, r) != conditioned.buckets_of(param, other)
        if moved[:movers].size != movers or not moved[:movers].all() or moved[movers:].any():
            raise FormatError(f"{where}: csparse record lists a word in the wrong bucket")
    return positions, d


def _rsparse(param, count, parts, ref, ref_is_base, *, where, into):
    """RSPARSE: the row list, then a CSPARSE record over the words of the
    listed rows; every listed row holds a change. ``parts``: three, and
    ``count`` within the chunk (checked by :func:`_modular`)."""
    n = ref.size
    try:
        R, o, rows, at = conditioned.read_row_head(bytes(parts[0]), n)
    except conditioned.Malformed as e:
        raise FormatError(f"{where}: {e}") from None
    words = conditioned.row_words(rows, n, R, o)
    if count > words.size:
        raise FormatError(f"{where}: changed-word count {count} out of range")
    sub = ref[words]
    sub_pos, d = _modular(CSPARSE, param, count, [bytes(parts[0])[at:], parts[1], parts[2]], sub, ref_is_base,
                          where=where, into=into)
    positions = words[sub_pos]
    if np.unique(conditioned.rows_of(positions, R, o)).size != rows.size:
        raise FormatError(f"{where}: rsparse record lists a row without a change")
    if into:
        ref[words] = sub
    return positions, d


def _bitmap_positions(data, n: int, count: int, *, where: str) -> np.ndarray:
    """The set bits of a BITMAP or MBITMAP record's bitmap, increasing. A
    bitmap up to its last set bit is the unary stream of its gaps at Rice
    parameter 0, which the C kernel lists as uint32: a byte per word
    (unpacked) and an int64 per change were 9 bytes a word, 576 MiB for a
    hostile 64 MiB U8 record that changes every word."""
    raw = decompress_exact(data, (n + 7) // 8, where=where)
    if n % 8 and raw[-1] & ((1 << (8 - n % 8)) - 1):
        raise FormatError(f"{where}: nonzero padding in bitmap")
    end = len(raw.rstrip(b"\0"))
    got = kernels.rice_decode(0, memoryview(raw)[:end], b"", count, n)
    if isinstance(got, str):
        raise FormatError(f"{where}: bitmap does not hold {count} positions")
    return got


def _decode_v1(
    codec: int, param: int, count: int, parts: list[bytes], buf: np.ndarray, *, where: str
) -> None:
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
        positions = _bitmap_positions(parts[0], n, count, where=where)
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


def modular_changes(
    codec: int, param: int, count: int, parts: list[bytes], base: np.ndarray, *, where: str
) -> tuple[np.ndarray, np.ndarray] | None:
    """(positions, new words) of the changed words of a MODULAR record that
    lists them (MSPARSE, MBITMAP, CSPARSE), from the chunk's base words,
    with every check :func:`decode_into` makes; None for any other codec
    (decode those whole). For receivers that patch live tensors with one
    scatter per chunk instead of rewriting it."""
    if codec not in MODULAR:
        return None
    positions, d = _modular(codec, param, count, parts, base, True, where=where)
    if positions is None:
        return None
    return positions, base[positions] + d
