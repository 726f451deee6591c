"""Replaying deltas of the layout onto a checkpoint's tensors, away from
the checkpoint: every frame is applied to a private copy of its tensor (a
stage file, or a private directory being built) and the result checked
against the version's checksum before anything else happens. The user's
directory is then brought to the result by wdiff's own in-place apply
(journal, undo log, verified against the target's digests).

:class:`Overlay` is that result as a pack target: the checkpoint's files
with the staged tensors in place of their old bytes (read on demand, a unit
at a time), so that ``pack_memory`` writes the one bundle that turns the
directory into the new version.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import numpy as np

from ...errors import IntegrityError
from ...fsutil import io_error
from ...paths import printable
from ...progress import SILENT, Reporter
from ...store.checkpoint import Checkpoint, FileEntry
from .frames import CHUNK, apply_frame, pread_exact
from .layout import Frame, hasher


def _region(path: str, offset: int, n: int) -> np.ndarray:
    """The ``n`` bytes at ``offset`` of file ``path``, writable in place."""
    if n == 0:
        return np.empty(0, np.uint8)
    try:
        return np.memmap(path, dtype=np.uint8, mode="r+", offset=offset, shape=(n,))
    except OSError as e:
        raise io_error(path, e) from None


def fresh_file(path: str, flags: int) -> int:
    """A new, empty private file at ``path``: whatever was there (a link, a
    hard link to a file elsewhere, a file of a killed run) is removed first,
    never written through."""
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise io_error(path, e) from None


def checksum_of(fmt: str, region: np.ndarray) -> str:
    h = hasher(fmt)
    for off in range(0, len(region), CHUNK):
        h.update(memoryview(region[off : off + CHUNK]))
    return h.hexdigest()


class Staged:
    """Tensors copied out of a checkpoint into one private file, where
    deltas patch them."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = fresh_file(path, os.O_RDWR)
        self.size = 0
        self.at: dict[str, tuple[int, int]] = {}  # name -> (offset in the stage file, nbytes)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Staged:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def region(self, name: str, base: Checkpoint) -> np.ndarray:
        """The staged bytes of tensor ``name``, copied from ``base`` the first time."""
        if name not in self.at:
            f, t = base.tensors[name]
            src = f.header.data_start + t.start
            try:
                with open(f.abspath, "rb") as inp:
                    done = 0
                    while done < t.nbytes:
                        piece = pread_exact(inp.fileno(), min(CHUNK, t.nbytes - done), src + done, where=f.abspath)
                        os.pwrite(self.fd, piece, self.size + done)
                        done += len(piece)
            except OSError as e:
                raise io_error(self.path, e) from None
            self.at[name] = (self.size, t.nbytes)
            self.size += t.nbytes
        off, n = self.at[name]
        return _region(self.path, off, n)

    def read(self, name: str, lo: int, hi: int, out: np.ndarray) -> None:
        off, _ = self.at[name]
        out[:] = np.frombuffer(pread_exact(self.fd, hi - lo, off + lo, where=self.path), np.uint8)


class InPlace:
    """Tensors patched where they lie, in a private directory being built."""

    def __init__(self) -> None:
        self.touched: set[str] = set()

    def region(self, name: str, base: Checkpoint) -> np.ndarray:
        f, t = base.tensors[name]
        self.touched.add(f.abspath)
        return _region(f.abspath, f.header.data_start + t.start, t.nbytes)

    def sync(self) -> None:
        for path in sorted(self.touched):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as e:
                raise io_error(path, e) from None


@dataclass(frozen=True)
class Delta:
    """A delta version downloaded and checked: its index, and for each
    changed tensor the shard file (local) and the frame in it."""

    where: str  # for messages: the source and the version's directory
    encoding: str
    checksum: str
    frames: dict[str, tuple[str, Frame]]


def replay(delta: Delta, base: Checkpoint, into, *, reporter: Reporter = SILENT) -> None:
    """Apply ``delta`` to the tensors of ``base`` through ``into`` (a
    :class:`Staged` or an :class:`InPlace`), checking each result against
    the checksum the version gives. A tensor the delta names that ``base``
    lacks, or holds in another size, is refused (IntegrityError)."""
    tensors = base.tensors
    with contextlib.ExitStack() as stack:
        fds: dict[str, int] = {}
        for name in sorted(delta.frames):
            shard, fr = delta.frames[name]
            if name not in tensors:
                raise IntegrityError(f"{delta.where}: changes tensor {printable(name, 120)}, which the checkpoint "
                                     "it applies to does not have")
            if shard not in fds:
                fds[shard] = stack.enter_context(open(shard, "rb")).fileno()
            region = into.region(name, base)
            where = f"{delta.where}: tensor {printable(name, 120)}"
            apply_frame(region, delta.encoding, fds[shard], fr.offset, fr.length, where=where)
            got = checksum_of(delta.checksum, region)
            del region  # unmapped; the pages are the file's (InPlace.sync makes them durable where needed)
            if got != fr.checksum:
                raise IntegrityError(f"{where}: {delta.checksum} checksum mismatch (the version says {fr.checksum}, "
                                     f"the rebuilt tensor is {got}): not this version's base, or a damaged delta")
            reporter.advance(fr.length)


class Overlay:
    """``base`` with the tensors of ``staged`` in place of their bytes, as a
    target ``pack_memory`` reads (its ``checkpoint`` and ``read_unit``)."""

    def __init__(self, base: Checkpoint, staged: Staged) -> None:
        self.base, self.staged = base, staged
        files = tuple(FileEntry(f.path, f.abspath, f.size, f.kind, f.header, (0, 0, 0, 0, 0)) for f in base.files)
        self.checkpoint = Checkpoint(root=base.root, files=files)
        # opened up front: read_unit runs in several threads at once
        self._fds: dict[str, int] = {}
        try:
            for f in base.files:
                if f.header is not None:
                    self._fds[f.abspath] = os.open(f.abspath, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            self.close()
            raise io_error(f.abspath, e) from None

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def read_unit(self, unit, buf: np.ndarray) -> None:
        pos = 0
        tensors = self.base.tensors
        for s in unit.spans:
            n = s.hi - s.lo
            name = s.tensor.name
            if name in self.staged.at:
                self.staged.read(name, s.lo, s.hi, buf[pos : pos + n])
            else:
                f, t = tensors[name]
                at = f.header.data_start + t.start + s.lo
                buf[pos : pos + n] = np.frombuffer(pread_exact(self._fds[f.abspath], n, at, where=f.abspath), np.uint8)
            pos += n
