"""Benchmark: ``python -m wdiff.bench [--size 2GB] [--scenario ...]``.

Generates a synthetic llama-like bf16 checkpoint and, per scenario, a second
version; runs ``wdiff diff``, ``pack`` and ``apply`` on them as separate
processes and prints one table: wall seconds (median of --runs), throughput,
peak RSS of the process, bundle size, bytes per changed element, compression
ratio, the bundle's distance from the information floor, and the bytes per
changed element of each encoding chosen. Beside them, in the same run: the
time to read A and B (``cat``), to copy A (``cp -r``, and ``cp -r`` then
``sync``: apply fsyncs what it writes), wdiff's fixed start-up cost
(``wdiff --version``), and, where installed, ``zstd -3`` of B (one
thread), ``zstd -1`` of B on every core (compressing B once, the work that
a pack of a dense or unrelated change cannot avoid) and ``zstd
--patch-from`` per shard.

``python -m wdiff.bench fanout`` measures one push and 16 pullers at once
instead (directory and S3 remotes): see wdiff/bench/fanout.py.

Scenarios:
  rl1     an RL step: 1% of elements moved by one ulp at random positions
  rl3     the same at 3%
  frozen  only the last two layers and the head change (50% of their elements)
  dense   every element moved by one to three ulps
  new     B unrelated to A (fresh random weights): the worst case

This is a measurement tool, not a test: machines are noisy, so it reports
medians, and the ratios matter more than the absolute times.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

from ..store import sample

SCENARIOS = ("rl1", "rl3", "frozen", "dense", "new")
#: bump when the generated data changes, so that --dir regenerates it
GENERATOR = 1


# -- data ------------------------------------------------------------------------------


def _seed(name: str, salt: int) -> int:
    return zlib.crc32(name.encode()) * 7919 + salt


def specs_for(size: int, tensors: int | None) -> list[sample.Spec]:
    """A llama-like layout, or ``tensors`` equal bf16 tensors of ``size`` in all."""
    if not tensors:
        return sample.llama_specs(size)
    per = max(1, size // tensors // 2)
    return [sample.Spec(f"t.{i:06d}", "BF16", (per,)) for i in range(tensors)]


def make_base(root: str, size: int, shards: int, tensors: int | None = None) -> list[list[sample.Spec]]:
    specs = specs_for(size, tensors)
    layout = sample.shard(specs, shards)
    sample.write_checkpoint(
        root, layout, lambda s: sample.bf16_normal(np.random.default_rng(_seed(s.name, 0)), s.nbytes // 2),
        companions=sample.companion_files(0),
    )
    return layout


def make_variant(root: str, layout, scenario: str) -> None:
    names = [s.name for sh in layout for s in sh]
    layers = sorted({int(n.split(".")[2]) for n in names if n.startswith("model.layers.")}) or [0]
    hot = {f"model.layers.{i}." for i in layers[-2:]}

    def data(s: sample.Spec) -> np.ndarray:
        old = sample.bf16_normal(np.random.default_rng(_seed(s.name, 0)), s.nbytes // 2)
        rng = np.random.default_rng(_seed(s.name, 1))
        if scenario == "rl1":
            return sample.rl_step(old, 0.01, rng)
        if scenario == "rl3":
            return sample.rl_step(old, 0.03, rng)
        if scenario == "frozen":
            if s.name == "lm_head.weight" or any(s.name.startswith(h) for h in hot):
                return sample.rl_step(old, 0.5, rng)
            return old
        if scenario == "dense":
            step = rng.integers(1, 4, old.size, dtype=np.int32) * np.where(rng.random(old.size) < 0.5, 1, -1)
            return (old.astype(np.int32) + step).astype(np.uint16)
        if scenario == "new":
            return sample.bf16_normal(rng, old.size)
        raise ValueError(scenario)

    sample.write_checkpoint(root, layout, data, companions=sample.companion_files(1))


def information_floor(a_dir: str, b_dir: str) -> tuple[int, float]:
    """(changed elements, floor in bytes): per tensor, the entropy of the
    positions of changed elements (n H(p)), plus the empirical entropy of
    the changed values' XOR with the old ones, over the whole checkpoint."""
    from ..store.checkpoint import scan

    A, B = scan(a_dir), scan(b_dir)
    bits = 0.0
    k_total = 0
    hist = np.zeros(1 << 16, dtype=np.int64)
    for name, (fb, tb) in B.tensors.items():
        fa, ta = A.tensors[name]
        n = tb.nbytes // 2
        k = 0
        for off in range(0, n, 1 << 24):
            m = min(1 << 24, n - off)
            a = np.fromfile(fa.abspath, dtype=np.uint16, count=m, offset=fa.header.data_start + ta.start + 2 * off)
            b = np.fromfile(fb.abspath, dtype=np.uint16, count=m, offset=fb.header.data_start + tb.start + 2 * off)
            x = a ^ b
            x = x[x != 0]
            k += x.size
            hist += np.bincount(x, minlength=1 << 16)
        if 0 < k < n:
            p = k / n
            bits += n * -(p * math.log2(p) + (1 - p) * math.log2(1 - p))
        k_total += k
    if k_total:
        pr = hist[hist > 0] / k_total
        bits += k_total * float(-(pr * np.log2(pr)).sum())
    return k_total, bits / 8


def _in_child(fn: str, *args):
    """Run a data step in a child process, so that this process stays small:
    a child's peak RSS as the kernel reports it includes what it inherited
    from us at fork time."""
    code = (
        "import json, sys; from wdiff import bench; "
        f"r = bench._child_{fn}(*json.loads(sys.argv[1])); print(json.dumps(r))"
    )
    p = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(p.stderr)
    return json.loads(p.stdout)


def _child_make_base(root: str, size: int, shards: int, tensors: int | None) -> None:
    make_base(root, size, shards, tensors)


def _child_make_variant(root: str, size: int, shards: int, scenario: str, tensors: int | None) -> None:
    make_variant(root, sample.shard(specs_for(size, tensors), shards), scenario)


def _child_information_floor(a: str, b: str):
    return information_floor(a, b)


# -- measuring -------------------------------------------------------------------------


class Runner:
    """Runs a command and reports its own peak RSS, via wait4 on the child."""

    def __init__(self, runs: int) -> None:
        self.runs = runs

    def __call__(self, cmd: list[str], before=None) -> tuple[float, int, subprocess.CompletedProcess]:
        times, rss = [], 0
        last = None
        for _ in range(self.runs):
            if before:
                before()
            t0 = time.perf_counter()
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out = p.stdout.read()
            err = p.stderr.read()
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            times.append(time.perf_counter() - t0)
            rss = max(rss, usage.ru_maxrss * 1024)
            last = subprocess.CompletedProcess(cmd, p.returncode, out, err)
            if p.returncode not in (0, 1):
                break
        return statistics.median(times), rss, last


def _stamp_path(root: str) -> str:
    return root.rstrip("/") + ".json"  # beside the checkpoint, not in it


def _unstamp(root: str) -> None:
    """Before generating into ``root``: nothing of an earlier run is left."""
    try:
        os.unlink(_stamp_path(root))
    except FileNotFoundError:
        pass
    shutil.rmtree(root, ignore_errors=True)


def _recipe(size: int, shards: int, tensors: int | None, what: str) -> dict:
    return {"size": size, "shards": shards, "tensors": tensors, "what": what, "generator": GENERATOR}


def _stamp(root: str, size: int, shards: int, tensors: int | None, what: str) -> None:
    """Record how a generated checkpoint was made, once it is complete, so
    that a --dir run can reuse it: generation is deterministic."""
    with open(_stamp_path(root), "w") as f:
        json.dump(_recipe(size, shards, tensors, what), f)


def _generated(root: str, size: int, shards: int, tensors: int | None, what: str) -> bool:
    try:
        with open(_stamp_path(root)) as f:
            stamp = json.load(f)
    except (OSError, ValueError):
        return False
    return stamp == _recipe(size, shards, tensors, what) and os.path.isdir(root)


def _files(d: str) -> list[str]:
    return sorted(os.path.join(d, f) for f in os.listdir(d) if not f.startswith("."))


# Longer than most functions, on purpose: the benchmark's script, one scenario
# after another, read top to bottom as the table it prints.
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["fanout"]:  # one push, many pullers: see fanout.py
        from .fanout import main as fanout

        return fanout(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m wdiff.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="2GB", help="checkpoint size (e.g. 256MB, 2GB, 16GB) [2GB]")
    ap.add_argument("--scenario", action="append", choices=SCENARIOS, help="repeatable [all]")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--tensors", type=int, default=None,
                    help="N equal bf16 tensors instead of a llama-like layout (e.g. 20000 vs 200)")
    ap.add_argument("--runs", type=int, default=3, help="runs per timing; the median is shown [3]")
    ap.add_argument("--threads", type=int, default=None, help="wdiff --threads [all cores]")
    ap.add_argument("--dir", default=None,
                    help="work directory, kept: the data generated there is reused by the next run with the same "
                         "--size, --shards and --tensors [a temporary one]")
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    ap.add_argument("--no-peers", action="store_true", help="skip zstd")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)

    from ..cli.output import parse_size

    size = parse_size(args.size)
    scenarios = args.scenario or list(SCENARIOS)
    work = args.dir or tempfile.mkdtemp(prefix="wdiff-bench-")
    os.makedirs(work, exist_ok=True)
    run = Runner(args.runs)
    wd = [sys.executable, "-m", "wdiff"]
    threads = ["--threads", str(args.threads)] if args.threads else []
    zstd = None if args.no_peers else shutil.which("zstd")
    rows: list[dict] = []
    try:
        a = os.path.join(work, "A")
        if not _generated(a, size, args.shards, args.tensors, "base"):
            print(f"generating A: {size / 1e9:.2f} GB bf16, {args.shards} shards in {work}", file=sys.stderr)
            _unstamp(a)
            _in_child("make_base", a, size, args.shards, args.tensors)
            _stamp(a, size, args.shards, args.tensors, "base")
        a_bytes = sum(os.path.getsize(f) for f in _files(a))
        for sc in scenarios:
            b = os.path.join(work, f"B-{sc}")
            if not _generated(b, size, args.shards, args.tensors, sc):
                print(f"generating B ({sc})", file=sys.stderr)
                _unstamp(b)
                _in_child("make_variant", b, size, args.shards, sc, args.tensors)
                _stamp(b, size, args.shards, args.tensors, sc)
            k, floor = _in_child("information_floor", a, b)
            bundle = os.path.join(work, f"{sc}.wdb")
            out = os.path.join(work, f"C-{sc}")

            def rm_out():
                shutil.rmtree(out, ignore_errors=True)

            def add(op, secs, rss, nbytes, bundle_bytes=None, note=""):
                rows.append({
                    "scenario": sc, "op": op, "seconds": secs, "gbps": nbytes / secs / 1e9 if secs else None,
                    "peak_rss": rss, "bundle_bytes": bundle_bytes,
                    "bytes_per_changed": bundle_bytes / k if (bundle_bytes and k) else None,
                    "ratio": a_bytes / bundle_bytes if bundle_bytes else None,
                    "vs_floor": bundle_bytes / floor if (bundle_bytes and floor) else None,
                    "changed": k, "note": note,
                })

            subprocess.run(["cat", *_files(a), *_files(b)], stdout=subprocess.DEVNULL)  # warm the cache
            t, rss, _ = run(["sh", "-c", 'cat "$@" > /dev/null', "cat", *_files(a), *_files(b)])
            add("read A+B (cat)", t, rss, 2 * a_bytes)
            t, rss, _ = run(["cp", "-r", a, out], before=rm_out)
            add("copy A (cp -r)", t, rss, a_bytes)

            def rm_out_synced():
                rm_out()
                os.sync()

            t, rss, _ = run(["sh", "-c", 'cp -r "$1" "$2" && sync', "cp", a, out], before=rm_out_synced)
            add("copy A durably (cp -r; sync)", t, rss, a_bytes, note="apply fsyncs too")
            rm_out()
            t, rss, _ = run([*wd, "--version"])
            add("wdiff startup (--version)", t, rss, 0, note="fixed cost in every row below")
            t, rss, r = run([*wd, "diff", "--json", *threads, a, b])
            add("wdiff diff", t, rss, 2 * a_bytes)
            t, rss, r = run([*wd, "pack", "--json", "--force", *threads, a, b, "-o", bundle])
            if r.returncode != 0:
                raise SystemExit(r.stderr.decode())
            doc = json.loads(r.stdout)
            add("wdiff pack", t, rss, 2 * a_bytes, doc["bundle_bytes"], note=_codec_note(doc["codecs"]))
            t, rss, r = run([*wd, "apply", "-q", *threads, bundle, a, "-o", out], before=rm_out)
            if r.returncode != 0:
                raise SystemExit(r.stderr.decode())
            add("wdiff apply", t, rss, a_bytes, note="verified")
            rm_out()
            if zstd:
                t, rss, r = run(["sh", "-c", f'cat "$@" | {zstd} -3 -q -c -T1 | wc -c', "zstd", *_files(b)])
                add("zstd -3 of B", t, rss, a_bytes, int(r.stdout.strip() or 0))
                # a pack of a dense or unrelated change compresses all of B
                # once: zstd's fastest standard level on every core does that
                t, rss, r = run(["sh", "-c", f'cat "$@" | {zstd} -1 -q -c -T0 | wc -c', "zstd", *_files(b)])
                add("zstd -1 -T0 of B", t, rss, a_bytes, int(r.stdout.strip() or 0), note="all cores")
                total, secs, refused = 0, 0.0, 0
                for fa, fb in zip(_files(a), _files(b)):
                    dst = os.path.join(work, "patch.zst")
                    t0 = time.perf_counter()
                    p = subprocess.run([zstd, "-3", "-q", "-f", "-T1", f"--patch-from={fa}", fb, "-o", dst],
                                       capture_output=True)
                    secs += time.perf_counter() - t0
                    if p.returncode != 0:
                        refused += 1
                        continue
                    total += os.path.getsize(dst)
                add("zstd --patch-from", secs, 0, a_bytes, total or None,
                    note=f"refused {refused} files" if refused else "per shard")
            if not args.dir:  # a --dir keeps the data for the next run
                shutil.rmtree(b, ignore_errors=True)
            if os.path.exists(bundle):
                os.unlink(bundle)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows, a_bytes)
    return 0


def _codec_note(codecs: dict) -> str:
    """Per encoding chosen: chunks, and bytes per changed element."""
    out = []
    for name, c in codecs.items():
        per = f" {c['bytes'] / c['changed_elements']:.3f} B/changed" if c["changed_elements"] else ""
        out.append(f"{name}: {c['records']} chunks{per}")
    return "; ".join(out)


def print_table(rows: list[dict], a_bytes: int) -> None:
    from ..cli.output import size, table

    print(f"checkpoint A: {size(a_bytes)}; medians; GB/s counts bytes read; ratio = checkpoint / bundle")
    out = [["scenario", "operation", "seconds", "GB/s", "peak RSS", "bundle", "B/changed", "ratio", "vs floor", "note"]]
    for r in rows:
        out.append([
            r["scenario"], r["op"], f"{r['seconds']:.2f}", f"{r['gbps']:.2f}" if r["gbps"] else "",
            size(r["peak_rss"]) if r["peak_rss"] else "", size(r["bundle_bytes"]) if r["bundle_bytes"] else "",
            f"{r['bytes_per_changed']:.3f}" if r["bytes_per_changed"] else "",
            f"{r['ratio']:.1f}x" if r["ratio"] else "", f"{r['vs_floor']:.3f}" if r["vs_floor"] else "", r["note"],
        ])
    for line in table(out, right={2, 3, 4, 5, 6, 7, 8}):
        print(line)

