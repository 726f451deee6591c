"""``python -m wdiff.bench.floor [--threads N] DIR [DIR ...]``: the work that
``wdiff diff`` and ``wdiff pack`` cannot skip, alone.

Both print or record the fingerprints of both checkpoints, and nothing is
taken from a cache (see wdiff.ops.diff), so every byte of A and of B is read
and hashed. This process does exactly that with wdiff's own reader: it
starts Python with numpy (which every command imports) as wdiff's console
script starts (one OpenBLAS thread, the cyclic collector at wdiff's pace),
reads each file of the directories in wdiff's 4 MiB units into per-thread
page-aligned buffers on wdiff's thread pool, takes each 1 MiB block's
XXH3-128, and exits as wdiff does, without the interpreter's teardown.
Nothing else: no headers parsed, no comparison, no statistics, no encoding.

The benchmark times it beside ``cat`` of the same files: the ratio says how
much of a bar such as "diff within 1.5x of reading A and B" the reading and
hashing already take on the machine at hand (on two cores, about 1.2x).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .. import process

if __name__ == "__main__":
    # Started as a command, the floor starts as wdiff's console script does
    # (wdiff/cli/__init__.py: run(), wdiff/process.py), before numpy's
    # import: no OpenBLAS thread pool spinning beside the work (measured:
    # 0.06 s of CPU of the floor's 0.19 at 8 MB), the cyclic collector at
    # wdiff's pace, the allocator keeping freed buffers. The package
    # wdiff.bench, imported before this module, imports no numpy.
    process.setup()

importlib.import_module("numpy")  # for its start-up cost: every wdiff command imports it

from ..defaults import DEFAULT_CHUNK
from ..parallel import default_threads, ordered_map
from ..store.blockio import FdCache, scratch
from ..store.checkpoint import read_into
from ..store.hashing import block_digests


def read_and_hash(dirs: list[str], threads: int) -> int:
    """Read and hash every regular file directly in ``dirs``; returns the
    bytes hashed."""
    with FdCache() as fds:  # opened as diff and pack open them, closed on any error
        units = []
        for d in dirs:
            for name in sorted(os.listdir(d)):
                path = os.path.join(d, name)
                if not os.path.isfile(path):
                    continue
                fd = fds.fd(path)
                size = os.fstat(fd).st_size
                units += [(fd, path, off, min(DEFAULT_CHUNK, size - off)) for off in range(0, size, DEFAULT_CHUNK)]

        def unit(u) -> int:
            fd, path, off, n = u
            buf = scratch("floor", n)
            read_into(fd, off, memoryview(buf), where=path)
            block_digests(buf)
            return n

        return sum(ordered_map(unit, units, threads=threads))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wdiff.bench.floor", description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", help="checkpoint directories")
    ap.add_argument("--threads", type=int, default=None, help="threads [all cores, as wdiff]")
    args = ap.parse_args(argv)
    n = read_and_hash(args.dirs, args.threads or default_threads())
    print(f"read and hashed {n} bytes")
    return 0


if __name__ == "__main__":
    code = main()
    # and it ends as wdiff's does: output flushed, no interpreter teardown
    # (wdiff skips it; here 0.01-0.03 s of CPU that no command pays)
    sys.stdout.flush()
    os._exit(code)
