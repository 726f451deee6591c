"""Reading units of tensor bytes into reusable per-thread buffers, and their
block digests. Fresh arrays per chunk cost more in page faults than the work
itself, so each worker thread keeps its buffers for the whole run."""

from __future__ import annotations

import errno
import mmap
import os
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..fsutil import io_error, write_all
from .checkpoint import read_into
from .hashing import block_digests
from .units import Unit

_local = threading.local()


def scratch(name: str, nbytes: int) -> np.ndarray:
    """A uint8 buffer of at least ``nbytes`` owned by this thread; the same
    memory comes back on the next call with the same name.

    Buffers are page-aligned anonymous mappings: the kernel copies file data
    into a page-aligned destination several times faster than into malloc'd
    memory (measured here: 0.06 s vs 0.25-0.30 s for 470 MiB in 4 MiB reads)."""
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    buf = bufs.get(name)
    if buf is None or buf.size < nbytes:
        buf = bufs[name] = aligned(max(nbytes, 1))
    return buf[:nbytes]


#: the alignment of file offsets, lengths and memory that O_DIRECT writes
#: keep to (a page: enough for 512-byte and 4 KiB logical blocks)
DIRECT_ALIGN = mmap.PAGESIZE


def scratch_at(name: str, nbytes: int, offset: int) -> np.ndarray:
    """Like :func:`scratch`, but the view starts ``offset % DIRECT_ALIGN``
    bytes into the buffer: its address is congruent to file offset
    ``offset``, so that :func:`write_out` can hand its block-aligned middle to
    an O_DIRECT descriptor as it is."""
    pad = offset % DIRECT_ALIGN
    return scratch(name, nbytes + pad)[pad:]


def open_direct(path: str, fd: int) -> int:
    """A second, write-only O_DIRECT descriptor of ``fd``, the file just
    created at ``path``, or -1 where the system or the file system has none
    (``WDIFF_DIRECT=0`` turns it off). It is opened by path, so it must
    turn out to be the same file as ``fd`` (not a link or another file
    put there since), or it is not used."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag or os.environ.get("WDIFF_DIRECT", "1") == "0":
        return -1
    try:
        dfd = os.open(path, os.O_WRONLY | flag | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return -1
    try:
        a, b = os.fstat(fd), os.fstat(dfd)
        same = (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
    except OSError:
        same = False
    if not same:
        os.close(dfd)
        return -1
    return dfd


def write_out(fd: int, direct_fd: int, buf: np.ndarray, offset: int, *, write=write_all) -> None:
    """Write ``buf`` at ``offset`` of a file: the block-aligned middle
    through ``direct_fd`` (O_DIRECT: from this memory to the disk, no copy
    into the page cache, no dirty pages for the kernel to write back and
    throttle on, none to evict the base's cached pages), the unaligned ends
    (and everything, when ``direct_fd`` is -1, or the memory is not
    congruent to ``offset``, or the file system refuses) through ``fd``.
    Durability is the caller's fsync, as for any write. ``write``: the
    ``write_all`` every piece goes through."""
    n = buf.nbytes
    a0 = -(-offset // DIRECT_ALIGN) * DIRECT_ALIGN
    a1 = (offset + n) // DIRECT_ALIGN * DIRECT_ALIGN
    if direct_fd < 0 or a1 <= a0 or (buf.ctypes.data - offset) % DIRECT_ALIGN:
        write(fd, buf, offset)
        return
    mv = memoryview(buf).cast("B")
    try:
        write(direct_fd, mv[a0 - offset : a1 - offset], a0)
    except OSError as e:
        if e.errno != errno.EINVAL:  # EINVAL: this file refuses direct writes after all
            raise
        write(fd, mv[a0 - offset : a1 - offset], a0)
    if a0 > offset:
        write(fd, mv[: a0 - offset], offset)
    if offset + n > a1:
        write(fd, mv[a1 - offset :], a1)


#: writes in flight behind the workers. One 4 MiB O_DIRECT write at a time
#: leaves the disk idle between requests; measured here, 2 GB in 4 MiB
#: direct writes took 3.1-4.1 s one at a time, 2.0-3.0 s two at a time,
#: 1.9-2.1 s eight at a time (dd, medians of noisy runs)
WRITERS = 4


class Slot:
    """A buffer of :class:`WriteBehind`: ``view`` is the memory a unit is
    produced in, laid out as the file is at the unit's offset."""

    __slots__ = ("mem", "view")

    def __init__(self, mem: np.ndarray, view: np.ndarray) -> None:
        self.mem, self.view = mem, view


class WriteBehind:
    """Writes that run behind the work producing them. A worker takes a
    :class:`Slot`, produces a unit in it, hands it to :meth:`write` and goes
    on to its next unit while ``writers`` threads write: the disk sees
    several requests at once and the workers never wait on it, unless every
    buffer is being written. At most ``workers + writers`` buffers exist (a
    worker that wants one waits), so memory stays that many units.

    The first failed write is raised from the next :meth:`take` (so that
    the workers stop) and from :meth:`wait`. Leaving the ``with`` block
    waits for every write started; after an error, writes not yet started
    are dropped (their file is a temporary that is thrown away)."""

    def __init__(self, *, workers: int, writers: int = WRITERS) -> None:
        self._cond = threading.Condition()
        self._free: list[Slot] = []
        self._made = 0
        self._depth = max(1, workers) + writers
        self._pending: Counter[int] = Counter()
        self._error: BaseException | None = None
        self._pool = ThreadPoolExecutor(max_workers=writers, thread_name_prefix="wdiff-write")

    def take(self, nbytes: int, offset: int, direct: bool) -> Slot:
        """A buffer for ``nbytes`` bytes bound for file offset ``offset``;
        ``direct``: laid out for an O_DIRECT write (see :func:`scratch_at`)."""
        pad = offset % DIRECT_ALIGN if direct else 0
        with self._cond:
            while not self._free and self._made >= self._depth and self._error is None:
                self._cond.wait()
            self._raise()
            if self._free:
                mem = self._free.pop().mem
            else:
                mem, self._made = None, self._made + 1
        if mem is None or mem.size < nbytes + pad:
            mem = aligned(max(nbytes + pad, 1))
        return Slot(mem, mem[pad : pad + nbytes])

    def give(self, slot: Slot) -> None:
        """Return a slot that will not be written (its unit failed)."""
        with self._cond:
            self._free.append(slot)
            self._cond.notify_all()

    def write(self, fd: int, direct_fd: int, slot: Slot, offset: int, *, where: str, write=write_all) -> None:
        """Write ``slot.view`` at ``offset`` of ``fd`` (through
        :func:`write_out`), later; the slot is reused once it is written."""
        with self._cond:
            self._pending[fd] += 1
        try:
            self._pool.submit(self._write, fd, direct_fd, slot, offset, where, write)
        except BaseException:
            self._done(fd, slot, None)
            raise

    def _write(self, fd: int, direct_fd: int, slot: Slot, offset: int, where: str, write) -> None:
        err = None
        try:
            write_out(fd, direct_fd, slot.view, offset, write=write)
        except OSError as e:
            err = io_error(where, e)
        except BaseException as e:  # noqa: BLE001 - kept, raised in the thread that waits
            err = e
        self._done(fd, slot, err)

    def _done(self, fd: int, slot: Slot, err: BaseException | None) -> None:
        with self._cond:
            if err is not None and self._error is None:
                self._error = err
            self._pending[fd] -= 1
            self._free.append(slot)
            self._cond.notify_all()

    def wait(self, fd: int) -> None:
        """Return once every write to ``fd`` handed over so far is done;
        raise the first failed write, of any file."""
        with self._cond:
            while self._pending[fd] > 0 and self._error is None:
                self._cond.wait()
            self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def __enter__(self) -> WriteBehind:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        with self._cond:
            failed = exc_type is not None or self._error is not None
        self._pool.shutdown(wait=True, cancel_futures=failed)
        if exc_type is None:
            with self._cond:
                self._raise()


def aligned(nbytes: int) -> np.ndarray:
    """A writable, page-aligned uint8 array of ``nbytes`` (anonymous memory)."""
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)


class FdCache:
    """Read-only file descriptors, opened once, shared by threads (pread
    needs no shared position)."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            with self._lock:
                fd = self._fds.get(path)
                if fd is None:
                    try:
                        fd = os.open(path, os.O_RDONLY)
                    except OSError as e:
                        raise io_error(path, e) from None
                    _sequential(fd)
                    self._fds[path] = fd
        return fd

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __enter__(self) -> FdCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _sequential(fd: int) -> None:
    """Tell the kernel the file is read front to back (a data pass reads
    it so, in units, a few threads apart): a larger read-ahead window keeps
    the disk busy while the units already read are hashed and compared."""
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    except (AttributeError, OSError):  # not every system or file system has it
        pass


def read_target(fds: FdCache, entry, unit: Unit, buf: np.ndarray) -> None:
    """Read a unit's bytes from the target file ``entry`` (they are contiguous)."""
    read_into(fds.fd(entry.abspath), entry.header.data_start + unit.lo, memoryview(buf), where=entry.abspath)


def read_base(fds: FdCache, unit: Unit, buf: np.ndarray) -> None:
    """Read the base bytes of every span of a delta or copy unit into ``buf``,
    one read per run of spans that are contiguous in the same base file."""
    pos = 0
    run_file = None
    run_off = run_len = run_pos = 0
    for s in unit.spans:
        b = s.base
        off = b.file.header.data_start + b.tensor.start + s.lo
        if run_file is b.file and run_off + run_len == off:
            run_len += s.nbytes
        else:
            if run_len:
                _read(fds, run_file, run_off, buf[run_pos : run_pos + run_len])
            run_file, run_off, run_len, run_pos = b.file, off, s.nbytes, pos
        pos += s.nbytes
    if run_len:
        _read(fds, run_file, run_off, buf[run_pos : run_pos + run_len])


def _read(fds: FdCache, entry, offset: int, view: np.ndarray) -> None:
    read_into(fds.fd(entry.abspath), offset, memoryview(view), where=entry.abspath)


def span_digests(unit: Unit, buf: np.ndarray) -> list[bytes]:
    """Block digests of each span of ``unit`` whose bytes are in ``buf``."""
    out = []
    pos = 0
    for s in unit.spans:
        out.append(block_digests(buf[pos : pos + s.nbytes]))
        pos += s.nbytes
    return out
