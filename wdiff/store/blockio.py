"""Reading units of tensor bytes into reusable per-thread buffers, and their
block digests. Fresh arrays per chunk cost more in page faults than the work
itself, so each worker thread keeps its buffers for the whole run."""

from __future__ import annotations

import mmap
import os
import threading

import numpy as np

from ..fsutil import io_error
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
