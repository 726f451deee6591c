"""Measure a many-writer commit against `wdiff pack A B` (issue 33, item 1).

    .venv/bin/python tests/bench_stage.py [--wdiff-src DIR]...

A 4-shard bf16 pair, 1% of elements changed, shards of different sizes, a
12 MiB tensor cut into three 4 MiB units, the *.json files in the first
part, in three layouts: the same shards on both sides, two tensors that
move between shards (every writer has the whole base), and the same with
each writer holding only its own shards of the base. Four writer processes
stage one shard each, one commit publishes them; the table says the
committed bundle's bytes against pack's, whether they are the same bytes,
and whether apply onto A, pull into a directory at A and pull into an
empty directory give B exactly. Each --wdiff-src (a source tree; default:
this one) is measured in turn, so the fix can be set beside the code before
it. Not a test (pytest does not collect it)."""

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

SHARDS = [f"model-{k + 1:05d}-of-00004.safetensors" for k in range(4)]


def pair(root: Path, layout: str) -> tuple[Path, Path]:
    rng = np.random.default_rng(33)
    t = {"a.big": rand(rng, "BF16", (4096, 1536)), "a.s": rand(rng, "BF16", (64, 64)),
         "b.w": rand(rng, "BF16", (1024, 1024)), "b.n": rand(rng, "BF16", (1024,)),
         "c.w": rand(rng, "BF16", (512, 512)), "d.w": rand(rng, "BF16", (256, 256)), "d.e": rand(rng, "BF16", (32, 32))}
    ga = [["a.big", "a.s"], ["b.w", "b.n"], ["c.w"], ["d.w", "d.e"]]
    A = Path(write_ckpt(root / "A", t, groups=ga, companions={"config.json": b'{"step": 1}'}))
    t = {n: mutate(x, 0.01, rng) for n, x in t.items()}
    gb = ga if layout == "same shards" else [["a.big", "b.w"], ["a.s", "b.n"], ["c.w"], ["d.w", "d.e"]]
    B = Path(write_ckpt(root / "B", t, groups=gb, companions={"config.json": b'{"step": 2}'}))
    return A, B


def run(src: str, *args, ok=(0,)) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=src, WDIFF_THREADS="1", NO_COLOR="1")
    env.pop("WDIFF_TRUSTED_KEYS", None)
    # cwd outside any source tree, so that `-m wdiff` imports the one named
    r = subprocess.run([sys.executable, "-m", "wdiff", *map(str, args)], env=env, cwd="/", capture_output=True,
                       text=True, check=False)
    if r.returncode not in ok:
        raise SystemExit(f"{args}: exit {r.returncode}: {r.stderr}")
    return r


def measure(src: str, layout: str, root: Path) -> dict:
    A, B = pair(root, layout)
    remote = root / "r"
    run(src, "push", "--anchor", A, remote, "-q")
    for k in range(4):
        only = ["--only", SHARDS[k]] + (["--only", "*.json"] if k == 0 else [])
        sb, sa = B, A
        if layout == "own shards only":
            sb, sa = root / f"h{k}" / "B", root / f"h{k}" / "A"
            for side, whole in ((sb, B), (sa, A)):
                side.mkdir(parents=True)
                for f in [SHARDS[k]] + (["config.json", "model.safetensors.index.json"] if k == 0 else []):
                    shutil.copy(whole / f, side / f)
        run(src, "push", sb, remote, "--base", sa, *only, "--stage", "s1", "-q")
    c = run(src, "commit", remote, "--stage", "s1", "--expect", 4, ok=(0, 3, 4, 5))
    run(src, "pack", A, B, "-o", root / "whole.wdb", "-q")
    whole = (root / "whole.wdb").read_bytes()
    row = {"layout": layout, "commit": f"exit {c.returncode}", "pack": len(whole)}
    if c.returncode:
        return row | {"committed": "-", "same": "-", "apply": "-", "pull at A": "-", "pull empty": "-"}
    objs = sorted((remote / "objects").rglob("*.wdb"), key=lambda p: p.stat().st_mtime)
    got = objs[-1]
    row |= {"committed": got.stat().st_size, "same": got.read_bytes() == whole}
    r = run(src, "apply", got, A, "-o", root / "applied", "-q", ok=(0, 2, 4, 5))
    row["apply"] = "exact" if r.returncode == 0 and tree(root / "applied") == tree(B) else f"exit {r.returncode}"
    shutil.copytree(A, root / "at-a")
    r = run(src, "pull", remote, root / "at-a", "-q", ok=(0, 2, 4, 5))
    row["pull at A"] = "exact" if r.returncode == 0 and tree(root / "at-a") == tree(B) else f"exit {r.returncode}"
    r = run(src, "pull", remote, root / "empty", "-q", ok=(0, 2, 4, 5))
    row["pull empty"] = "exact" if r.returncode == 0 and tree(root / "empty") == tree(B) else f"exit {r.returncode}"
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wdiff-src", action="append", default=None)
    args = ap.parse_args()
    srcs = args.wdiff_src or [str(Path(__file__).resolve().parent.parent)]
    cols = ["code", "layout", "commit", "committed", "pack", "same", "apply", "pull at A", "pull empty"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for src in srcs:
        for layout in ("same shards", "tensors moved", "own shards only"):
            with tempfile.TemporaryDirectory() as tmp:
                row = measure(src, layout, Path(tmp)) | {"code": src}
            print("| " + " | ".join(str(row[c]) for c in cols) + " |", flush=True)


if __name__ == "__main__":
    main()
