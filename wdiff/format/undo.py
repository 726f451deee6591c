"""The undo log of an in-place apply: for every chunk patched in place, the
positions and old values of the words it changes, so that an interrupted
apply can be rolled back. Layout: man/wdiff-format.5, "UNDO LOG"."""

from __future__ import annotations

import os
import struct

import numpy as np
import xxhash

from ..codec.chunk import decompress_exact, plane_compressor, planes, rice_decode, rice_encode, unplanes
from ..errors import FormatError
from ..fsutil import io_error
from ..statedir import StateDir

_UNDO = struct.Struct("<4sIQQB3xQ16s16sB3xQQQ")
_UNDO_MAGIC = b"WUND"


class UndoEntry:
    """The old values of the words a patch changes in one chunk."""

    __slots__ = ("file", "lo", "hi", "word", "count", "base", "target", "r", "parts")

    def __init__(self, file, lo, hi, word, count, base, target, r, parts):
        self.file, self.lo, self.hi, self.word, self.count = file, lo, hi, word, count
        self.base, self.target, self.r, self.parts = base, target, r, parts

    @classmethod
    def make(cls, file: int, lo: int, hi: int, old: np.ndarray, new: np.ndarray, base: bytes, target: bytes) -> UndoEntry:
        positions = np.flatnonzero(old != new)
        r, unary, rem = rice_encode(positions)
        values = plane_compressor(1).compress(planes(old[positions]))
        return cls(file, lo, hi, old.dtype.itemsize, positions.size, base, target, r, (unary, rem, values))

    def pack(self) -> bytes:
        head = _UNDO.pack(
            _UNDO_MAGIC, self.file, self.lo, self.hi, self.word, self.count, self.base, self.target, self.r,
            *(len(p) for p in self.parts),
        )
        body = head + b"".join(self.parts)
        return body + xxhash.xxh3_128_digest(body)

    def restore(self, words: np.ndarray) -> None:
        """Write the old values back: the chunk becomes its base bytes, whatever
        mix of old and new it held."""
        n = words.size
        where = "undo log"
        positions = rice_decode(self.r, self.parts[0], self.parts[1], self.count, n, where=where)
        old = unplanes(decompress_exact(self.parts[2], self.count * self.word, where=where), self.count, self.word)
        words[positions] = old


class UndoLog:
    """Append-only, fsynced undo entries; a torn tail is dropped on load (its
    chunks were never written, since data follows the entries' fsync). The
    file is reached through the transaction's :class:`StateDir`, never
    through a link."""

    NAME = "undo.log"

    def __init__(self, txn: StateDir) -> None:
        self.dir = txn
        self.path = txn.where(self.NAME)
        self.fd = -1

    def _open(self, flags: int) -> int:
        try:
            return self.dir.open_file(self.NAME, flags, 0o600)
        except OSError as e:
            raise io_error(self.path, e) from None

    def load(self) -> dict[tuple[int, int], UndoEntry]:
        entries: dict[tuple[int, int], UndoEntry] = {}
        data = self.dir.read(self.NAME, limit=1 << 40)
        if data is None:
            return entries
        pos = 0
        while pos + _UNDO.size <= len(data):
            fields = _UNDO.unpack_from(data, pos)
            if fields[0] != _UNDO_MAGIC:
                break
            lens = fields[9:12]
            end = pos + _UNDO.size + sum(lens)
            if end + 16 > len(data) or xxhash.xxh3_128_digest(data[pos:end]) != data[end : end + 16]:
                break
            parts, p = [], pos + _UNDO.size
            for ln in lens:
                parts.append(data[p : p + ln])
                p += ln
            _, file, lo, hi, word, count, base, target, r = fields[:9]
            if word not in (1, 2, 4, 8) or hi <= lo:
                raise FormatError(f"{self.path}: damaged undo entry")
            entries[(file, lo)] = UndoEntry(file, lo, hi, word, count, base, target, r, tuple(parts))
            pos = end + 16
        if pos != len(data):
            fd = self._open(os.O_RDWR)
            try:
                os.ftruncate(fd, pos)
                os.fsync(fd)
            except OSError as e:
                raise io_error(self.path, e) from None
            finally:
                os.close(fd)
        self._size = pos
        return entries

    def append(self, entries: list[UndoEntry]) -> None:
        if self.fd < 0:
            self.fd = self._open(os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        data = memoryview(b"".join(e.pack() for e in entries))
        try:
            while data:
                data = data[os.write(self.fd, data) :]
            os.fsync(self.fd)
        except OSError as e:
            raise io_error(self.path, e) from None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
