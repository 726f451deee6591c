"""Tensors read from the host's copy into private memory, each checked
against its digest as it is read (:class:`Staged`). No torch, no vLLM."""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
from collections.abc import Iterable

from ...errors import IntegrityError
from ...fsutil import io_error
from ...paths import printable
from ...store.checkpoint import read_into
from ...store.hashing import block_digests, tree
from .tables import Row, Table

#: staged tensors above this many bytes go to an unlinked file in the cache
#: folder (the page cache keeps it fast), not to anonymous memory
STAGE_IN_MEMORY = 1 << 30
PIECE = 16 * 1024 * 1024


class Staged:
    """Tensors read and verified, held where no other process can change
    them (anonymous memory, or an unlinked file): ``view(name)`` is a
    memoryview of one tensor's bytes."""

    def __init__(self, buf: mmap.mmap, where: dict[str, tuple[int, Row]]) -> None:
        self.buf = buf
        self.where = where
        #: where :meth:`close` hands the buffer for the next update (its pages are then
        #: in memory already: 105 MB of fresh pages cost 0.25 s to touch and unmap)
        self.give_back = None

    @property
    def names(self) -> list[str]:
        return list(self.where)

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for _, r in self.where.values())

    def view(self, name: str) -> memoryview:
        off, r = self.where[name]
        return memoryview(self.buf)[off : off + r.nbytes]

    def row(self, name: str) -> Row:
        return self.where[name][1]

    def close(self) -> None:
        # kept for the next update only if nothing still uses its memory: a loader that kept a
        # view of a tensor handed to it (instead of copying it) must never see it overwritten
        if self.give_back is not None and len(self.buf) <= STAGE_IN_MEMORY and not _exported(self.buf):
            self.give_back(self.buf)
            return
        with contextlib.suppress(BufferError):  # views still held: the mapping goes with them
            self.buf.close()

    @classmethod
    def read(cls, root: str, table: Table, names: list[str], *, spill_dir: str, threads: int,
             spare: mmap.mmap | None = None) -> Staged:
        from ...parallel import ordered_map

        where: dict[str, tuple[int, Row]] = {}
        total = 0
        for n in names:
            r = table.rows[n]
            where[n] = (total, r)
            total += -(-r.nbytes // 64) * 64  # aligned for any dtype
        buf = spare if spare is not None and total <= len(spare) <= STAGE_IN_MEMORY else _buffer(total, spill_dir)
        try:
            dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise io_error(root, e) from None
        fds: dict[str, int] = {}
        try:
            for n in names:
                path = where[n][1].path
                if path not in fds:
                    fds[path] = _open_file(dfd, path, root)

            def one(batch: list[str]) -> None:
                for n in batch:
                    off, r = where[n]
                    view = memoryview(buf)[off : off + r.nbytes]
                    for lo in range(0, r.nbytes, PIECE):
                        hi = min(r.nbytes, lo + PIECE)
                        read_into(fds[r.path], r.offset + lo, view[lo:hi], where=os.path.join(root, r.path))
                    got = tree(block_digests(view))
                    view.release()
                    if got != r.digest:
                        raise IntegrityError(f"{os.path.join(root, r.path)}: tensor {printable(n)} does not hold "
                                             "the bytes its version names (changed on disk?); the engine was not "
                                             "touched")

            # in checkpoint order (sequential reads), a few MB a task: 20,000 expert tensors of
            # a few kB are a few dozen tasks, not 20,000
            for _ in ordered_map(one, _batches(names, where), threads=threads, window=max(2, 2 * threads)):
                pass
        except BaseException:
            with contextlib.suppress(BufferError):
                buf.close()
            raise
        finally:
            for fd in fds.values():
                os.close(fd)
            os.close(dfd)
        return cls(buf, where)


def _batches(names: list[str], where: dict, size: int = 4 * PIECE // 16) -> Iterable[list[str]]:
    batch: list[str] = []
    n = 0
    for name in names:
        batch.append(name)
        n += where[name][1].nbytes
        if n >= size:
            yield batch
            batch, n = [], 0
    if batch:
        yield batch


def _open_file(dfd: int, path: str, root: str) -> int:
    """A top-level file of the copy, never through a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise IntegrityError(f"{os.path.join(root, path)}: a symbolic link in wdiff's copy") from None
        raise io_error(os.path.join(root, path), e) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IntegrityError(f"{os.path.join(root, path)}: not a regular file")
    return fd


def _exported(buf: mmap.mmap) -> bool:
    """Whether any buffer (a memoryview, a tensor made from one) still
    shares ``buf``'s memory: an mmap refuses to resize then."""
    try:
        buf.resize(len(buf))
    except BufferError:
        return True
    except (OSError, SystemError):  # cannot tell: do not reuse it
        return True
    return False


def _buffer(total: int, spill_dir: str) -> mmap.mmap:
    if total <= STAGE_IN_MEMORY:
        return mmap.mmap(-1, max(total, 1))
    import tempfile

    with tempfile.TemporaryFile(dir=spill_dir, prefix="stage-") as f:
        f.truncate(total)
        return mmap.mmap(f.fileno(), total)
