"""``python -m wdiff.bench.floor``: the benchmark's row of what diff and pack
cannot skip reads and hashes every byte of every file it is given, and
nothing else (a file shorter than it was found is an error, as in wdiff)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from wdiff.bench import floor


def _files(root, sizes):
    root.mkdir()
    for i, n in enumerate(sizes):
        (root / f"f{i}").write_bytes(os.urandom(n))
    return root


def test_every_byte_of_every_file_is_read_and_hashed(tmp_path, monkeypatch):
    a = _files(tmp_path / "A", [0, 1, (4 << 20) + 3, 9 << 20])
    b = _files(tmp_path / "B", [5 << 20])
    (b / "sub").mkdir()  # a directory is no file to read
    seen = []
    real = floor.block_digests
    monkeypatch.setattr(floor, "block_digests", lambda buf: seen.append(bytes(buf)) or real(buf))
    n = floor.read_and_hash([str(a), str(b)], threads=2)
    assert n == 1 + (4 << 20) + 3 + (9 << 20) + (5 << 20)
    want = []
    for f in [*(a / f"f{i}" for i in range(4)), b / "f0"]:  # each file in 4 MiB units
        data = f.read_bytes()
        want += [data[off : off + (4 << 20)] for off in range(0, len(data), 4 << 20)]
    assert sorted(seen) == sorted(want)


def test_the_command_line_and_a_file_that_shrank(tmp_path):
    a = _files(tmp_path / "A", [3 << 20])
    p = subprocess.run([sys.executable, "-m", "wdiff.bench.floor", "--threads", "1", str(a)],
                       check=False, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout == f"read and hashed {3 << 20} bytes\n"

    class Shrinks:  # the file loses its tail between the listing and the read
        def __init__(self):
            self.real = os.fstat

        def __call__(self, fd):
            st = self.real(fd)
            os.truncate(a / "f0", 1 << 20)
            return st

    with pytest.MonkeyPatch.context() as m:
        m.setattr(floor.os, "fstat", Shrinks())
        with pytest.raises(Exception, match="ended early"):
            floor.read_and_hash([str(a)], threads=1)


# Run as ``python -m wdiff.bench.floor`` runs it (runpy imports the package
# first, then the module as __main__), and report at the floor's last step.
_STARTED = """
import gc, os, runpy, sys
os.environ.pop("OPENBLAS_NUM_THREADS", None)
import wdiff.bench
before = "numpy" in sys.modules

def report(code):
    tasks = len(os.listdir("/proc/self/task"))
    print(before, os.environ.get("OPENBLAS_NUM_THREADS"), gc.get_threshold(), tasks, code)
    sys.stdout.flush()
    real_exit(code)

real_exit, os._exit = os._exit, report
sys.argv = ["floor", "--threads", "1", sys.argv[1]]
runpy.run_module("wdiff.bench.floor", run_name="__main__", alter_sys=True)
"""


def test_the_command_starts_as_wdiffs_console_script_does(tmp_path):
    """No numpy before the floor's own setup, which then is wdiff's: one
    OpenBLAS thread (no pool of one per core spinning beside the reads: the
    process has its main thread alone, the floor reading on it), the
    collector at wdiff's pace, and an exit without the interpreter's
    teardown, as wdiff's run() does."""
    a = _files(tmp_path / "A", [1 << 20])
    p = subprocess.run([sys.executable, "-c", _STARTED, str(a)], check=False, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [f"read and hashed {1 << 20} bytes", "False 1 (50000, 10, 10) 1 0"]
