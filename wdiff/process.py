"""How a wdiff process starts: settings for the process as a whole.

The console script (:func:`wdiff.cli.run`) applies them before it imports
anything else, and so does the benchmark's floor (``python -m
wdiff.bench.floor``), which stands for what every command cannot skip.
Importing the library applies none of them: a trainer or an inference
server that imports wdiff keeps its own.
"""

from __future__ import annotations

import gc
import os
import sys

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: allocations up to this size come from the heap, and freed ones stay
#: there for the next chunk: a command allocates its buffers per 4 MiB
#: chunk, tens to hundreds of megabytes in all, and by default each of them
#: (above 128 KiB, a threshold that then moves) was a fresh mapping,
#: zeroed by the kernel page by page and unmapped when freed, or heap the
#: allocator gave back to the kernel on the next free
MMAP_THRESHOLD = 32 << 20
#: the free heap kept before any is given back
TRIM_THRESHOLD = 64 << 20


def setup() -> None:
    """Apply the settings of a wdiff process; call it first, before numpy
    is imported."""
    # wdiff's own threads do the work and it makes no BLAS calls that need
    # more than one; the pool OpenBLAS starts at numpy's import, a thread
    # per core, only spins beside them (0.05-0.1 s of CPU per command)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # A checkpoint of 20,000 tensors puts a few hundred thousand small
    # objects in memory for the whole command, and the cyclic collector's
    # default pace (every 700 allocations) walks them again and again:
    # 0.1-0.3 s of a diff. wdiff makes few cycles; collecting every 50,000
    # allocations still bounds what they can hold.
    gc.set_threshold(50_000, 10, 10)
    keep_freed_memory()


def keep_freed_memory() -> bool:
    """Have glibc's allocator keep freed buffers for reuse instead of
    unmapping them (see :data:`MMAP_THRESHOLD`): pack of the benchmark's
    adam3 step at 512 MB, one thread, spent 0.33 s of system time, 0.20
    with it (page faults and zeroing), for the same output. Peak memory is
    what was allocated at once, as before; what stays mapped after a peak
    is at most :data:`TRIM_THRESHOLD` more. Returns whether it applied
    (False off glibc, where the allocator is another)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):
            return False  # musl and others: their own allocator
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    except (OSError, AttributeError):
        return False
