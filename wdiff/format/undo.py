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
        parts = self.parts.load() if isinstance(self.parts, _Stored) else self.parts
        positions = rice_decode(self.r, parts[0], parts[1], self.count, n, where=where)
        old = unplanes(decompress_exact(parts[2], self.count * self.word, where=where), self.count, self.word)
        words[positions] = old


#: how much of an undo entry's body :meth:`UndoLog.load` reads at a time to check its digest
_PIECE = 1 << 20


class _File:
    """The undo log's descriptor, opened once (never through a link) and
    shared by the entries that :meth:`UndoLog.load` found in it, so that it
    outlives the state directory's own descriptor; closed with the last of them."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd, self.path = fd, path

    def pread(self, n: int, offset: int) -> bytes:
        out = bytearray()
        try:
            while len(out) < n:
                b = os.pread(self.fd, n - len(out), offset + len(out))
                if not b:
                    break
                out += b
        except OSError as e:
            raise io_error(self.path, e) from None
        return bytes(out)

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Stored:
    """The three parts of a loaded entry, left in the file until the entry is
    restored: loading an undo log reads every entry through once, to check
    it, and keeps only its header, so resuming or rolling back holds one
    entry's values at a time, not the log (which grows with the step)."""

    __slots__ = ("file", "offset", "lens", "head", "digest")

    def __init__(self, file: _File, offset: int, lens, head: bytes, digest: bytes) -> None:
        self.file, self.offset, self.lens, self.head, self.digest = file, offset, tuple(lens), head, digest

    def load(self) -> tuple[bytes, bytes, bytes]:
        body = self.file.pread(sum(self.lens), self.offset)
        if xxhash.xxh3_128_digest(self.head + body) != self.digest:
            raise FormatError(f"{self.file.path}: undo entry changed since it was loaded")
        a, b = self.lens[0], self.lens[0] + self.lens[1]
        return body[:a], body[a:b], body[b:]


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
        """The entries of the log, by (file, lo), each checked against its
        digest; their values stay in the file until restored (see _Stored)."""
        entries: dict[tuple[int, int], UndoEntry] = {}
        try:
            f = _File(self.dir.open_file(self.NAME), self.path)
        except FileNotFoundError:
            return entries
        except OSError as e:
            raise io_error(self.path, e) from None
        try:
            size = os.fstat(f.fd).st_size
        except OSError as e:
            raise io_error(self.path, e) from None
        pos = 0
        while pos + _UNDO.size <= size:
            head = f.pread(_UNDO.size, pos)
            if len(head) < _UNDO.size:
                break
            fields = _UNDO.unpack(head)
            if fields[0] != _UNDO_MAGIC:
                break
            lens = fields[9:12]
            end = pos + _UNDO.size + sum(lens)
            if end + 16 > size:
                break
            h = xxhash.xxh3_128(head)
            p = pos + _UNDO.size
            while p < end:
                piece = f.pread(min(_PIECE, end - p), p)
                if not piece:
                    break
                h.update(piece)
                p += len(piece)
            if p != end or h.digest() != f.pread(16, end):
                break
            _, file, lo, hi, word, count, base, target, r = fields[:9]
            if word not in (1, 2, 4, 8) or hi <= lo:
                raise FormatError(f"{self.path}: damaged undo entry")
            parts = _Stored(f, pos + _UNDO.size, lens, head, h.digest())
            entries[(file, lo)] = UndoEntry(file, lo, hi, word, count, base, target, r, parts)
            pos = end + 16
        if pos != size:
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
