"""wdiff/process.py: the settings of a wdiff process, applied by the
console script and the benchmark's floor, never by importing the library.

Measured from outside, in fresh processes: buffers of a few megabytes
allocated and freed chunk after chunk fault their pages in once, not once
per chunk (glibc's allocator keeps them: see keep_freed_memory)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

_CHUNKS = """
import resource, sys
{setup}
import numpy as np
def cycle(i):
    # a buffer a little larger each chunk, as a chunk's temporaries vary:
    # by default each is above the size glibc last saw freed, so mapped anew
    a = np.ones((8 << 20) + (i << 16), dtype=np.uint8)
    return int(a[-1])
cycle(0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(1, 21):
    cycle(i)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(setup: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _CHUNKS.format(setup=setup)], capture_output=True, text=True,
                         env=env, check=True)
    return int(out.stdout)


@pytest.mark.skipif(not (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"),
                    reason="glibc's allocator only")
def test_freed_chunk_buffers_are_reused_without_page_faults():
    pages = (8 << 20) // os.sysconf("SC_PAGE_SIZE")  # what one cycle touches
    plain = _faults("")
    kept = _faults("from wdiff import process; assert process.keep_freed_memory()")
    assert plain > 4 * pages  # the default: fresh pages, cycle after cycle
    assert kept < pages  # set up: the same pages again, and the few more each cycle asks


def test_setup_sets_what_a_command_runs_with_and_importing_wdiff_sets_nothing():
    code = """
import gc, os, sys
import wdiff, wdiff.codec.chunk
untouched = (gc.get_threshold()[0], os.environ.get("OPENBLAS_NUM_THREADS"))
from wdiff import process
process.setup()
print(untouched, gc.get_threshold()[0], os.environ["OPENBLAS_NUM_THREADS"])
"""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split("\n")[0] == "(700, None) 50000 1"
