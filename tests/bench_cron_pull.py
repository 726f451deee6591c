"""What a cron pull leaves in DIR/.wdiff over time (issue 33, item 6).

    PYTHONPATH=. .venv/bin/python tests/bench_cron_pull.py [--pulls 100] [--shape 256x256]

Pushes a new version of a small bf16 checkpoint (4 tensors, 5% of the words
changed each step) to a directory remote, then runs ``wdiff pull -q REMOTE
DIR`` on the command line, as cron would, ``--pulls`` times. Prints the
bytes of DIR/.wdiff (and what it holds) after 1, 10 and 100 pulls, beside
the largest bundle pushed. Not a test (pytest does not collect it)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np
from factory import mutate, rand, tree, write_ckpt

import wdiff


def du(path: Path) -> int:
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, fs in os.walk(path) for f in fs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pulls", type=int, default=100)
    ap.add_argument("--shape", default="256x256")
    args = ap.parse_args()
    shape = tuple(int(x) for x in args.shape.split("x"))
    with tempfile.TemporaryDirectory(prefix="wdiff-cron-") as tmp:
        root = Path(tmp)
        os.environ.update(WDIFF_CACHE_DIR=str(root / "cache"), WDIFF_STATE_DIR=str(root / "state"), NO_COLOR="1")
        rng = np.random.default_rng(0)
        t = {f"layer.{i}.w": rand(rng, "BF16", shape) for i in range(4)}
        prev = write_ckpt(root / "v0", t)
        remote, d = root / "remote", root / "d"
        largest = wdiff.push(prev, remote, anchor=True).bytes
        rows = []
        for n in range(1, args.pulls + 1):
            t = {k: mutate(x, 0.05, rng) for k, x in t.items()}
            cur = write_ckpt(root / f"v{n}", t)
            largest = max(largest, wdiff.push(cur, remote, base=prev).bytes)
            shutil.rmtree(prev)
            prev = cur
            r = subprocess.run([sys.executable, "-m", "wdiff", "pull", "-q", str(remote), str(d)],
                               capture_output=True, text=True, check=False)
            assert r.returncode == 0, r.stderr
            if n in (1, 10, 100, args.pulls) and n not in (r[0] for r in rows):
                assert tree(d) == tree(cur)
                rows.append((n, du(d / ".wdiff"), sorted(os.listdir(d / ".wdiff"))))
        size = sum(len(b) for b in tree(prev).values())
        print(f"checkpoint {size} B, anchor and deltas up to {largest} B (largest bundle)")
        print(f"{'pulls':>6} {'DIR/.wdiff bytes':>17}  holds")
        for n, b, names in rows:
            print(f"{n:>6} {b:>17}  {', '.join(names)}")


if __name__ == "__main__":
    main()
