"""Measure gc on a 200-version chain and an 8-writer staged commit (issue 14).

    .venv/bin/python tests/bench_retention.py [--runs 3]

Prints two tables (medians over the runs): what gc keeps, drops, deletes and
frees, and what a fresh pull of a kept version costs before and after; and the
time of 8 writers staging one version against one host pushing it whole.
Not a test (pytest does not collect it): numbers go in the README, not in
assertions."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np
from factory import mutate, rand, write_ckpt
from test_gc import make_chain, objects

ENV = dict(os.environ, WDIFF_THREADS="1", NO_COLOR="1")


def cli(*args) -> tuple[float, dict]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "wdiff", *map(str, args), "--json"], capture_output=True, text=True,
                       env=ENV, check=False)
    assert r.returncode == 0, r.stderr
    return time.perf_counter() - t, json.loads(r.stdout)


def gc_run(root: Path) -> dict:
    remote, _ = make_chain(root, 200)
    before = objects(remote)
    keep = ("--keep-last", "5", "--keep", "step-50", "--keep", "step-120")
    out = {"bytes_before": sum(before.values()), "files_before": len(before)}
    out["pull_before"] = cli("pull", remote, root / "pb", "--to", "step-120")
    out["dry"] = cli("gc", remote, *keep, "--dry-run")
    out["phase1"] = cli("gc", remote, *keep)
    out["phase2"] = cli("gc", remote, *keep, "--grace", "0")
    after = objects(remote)
    out["bytes_after"], out["files_after"] = sum(after.values()), len(after)
    out["pull_after"] = cli("pull", remote, root / "pa", "--to", "step-120")
    return out


def stage_run(root: Path, n: int = 8) -> dict:
    rng = np.random.default_rng(8)
    t = {f"layer.{i}.w": rand(rng, "BF16", (2048, 1024)) for i in range(n)}  # 4 MiB a shard
    v0 = write_ckpt(root / "v0", t, shards=n)
    t = {k: mutate(x, 0.01, rng) for k, x in t.items()}
    v1 = write_ckpt(root / "v1", t, shards=n)
    remote, whole = root / "remote", root / "whole"
    for r in (remote, whole):
        cli("push", "--anchor", v0, r)
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "wdiff", "push", v1, str(remote), "--base", v0, "--only",
                               f"model-{k + 1:05d}-of-{n:05d}.safetensors", *(["--only", "*.json"] if k == 0 else []),
                               "--stage", "s", "-q"], env=ENV) for k in range(n)]
    assert all(p.wait() == 0 for p in procs)
    staged = time.perf_counter() - t0
    commit_s, doc = cli("commit", remote, "--stage", "s", "--expect", n)
    single_s, single = cli("push", v1, whole, "--base", v0)
    return {"staged": staged, "commit": commit_s, "single": single_s, "bytes": doc["bytes"],
            "same": doc["bundle_id"] == single["bundle_id"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    runs = ap.parse_args().runs
    med = statistics.median
    gcs, sts = [], []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as d:
            gcs.append(gc_run(Path(d) / "gc"))
            sts.append(stage_run(Path(d) / "st"))
    g = gcs[0]
    print(f"gc on a 200-version chain (keep the last 5, step-50, step-120), median of {runs}:\n")
    print("| step | wall s | bridges | dropped | deleted objects | freed bytes |\n|---|---|---|---|---|---|")
    for name, key in (("gc --dry-run", "dry"), ("gc (phase 1; grace 24h)", "phase1"), ("gc --grace 0 (phase 2)", "phase2")):
        d = g[key][1]
        print(f"| {name} | {med(x[key][0] for x in gcs):.2f} | {len(d['bridges'])} | {len(d['dropped'])} | "
              f"{d['deleted']['objects']} | {d['deleted']['bytes']} |")
    pb, pa = g["pull_before"][1], g["pull_after"][1]
    print(f"\n| remote | files | bytes |\n|---|---|---|\n| before | {g['files_before']} | {g['bytes_before']} |"
          f"\n| after | {g['files_after']} | {g['bytes_after']} |")
    print(f"\n| fresh pull --to step-120 | bundles | downloaded bytes | wall s |\n|---|---|---|---|"
          f"\n| before gc | {len(pb['bundles'])} | {pb['downloaded_bytes']} | {med(x['pull_before'][0] for x in gcs):.2f} |"
          f"\n| after gc | {len(pa['bundles'])} | {pa['downloaded_bytes']} | {med(x['pull_after'][0] for x in gcs):.2f} |")
    s = sts[0]
    print(f"\n8 writers, one version (8 shards of 4 MiB bf16, 1% changed), median of {runs}:\n")
    print("| what | wall s | ratio |\n|---|---|---|")
    single = med(x["single"] for x in sts)
    for name, v in (("one host pushes the whole delta", single), ("8 writer processes stage their parts", med(x["staged"] for x in sts)),
                    ("commit: check, merge, publish", med(x["commit"] for x in sts))):
        print(f"| {name} | {v:.2f} | {v / single:.2f}x |")
    print(f"\nmerged bundle: {s['bytes']} bytes, byte-identical to the single host's: {all(x['same'] for x in sts)}")


if __name__ == "__main__":
    main()
