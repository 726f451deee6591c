"""Benchmark: ``python -m wdiff.bench [--size 2GB] [--scenario ...]``.

Generates a synthetic llama-like bf16 checkpoint and, per scenario, a second
version; runs ``wdiff diff``, ``pack`` and ``apply`` on them as separate
processes and prints one table: wall seconds (median of --runs), throughput,
peak RSS of the process, bundle size, bytes per changed element, compression
ratio, the bundle's distance from the information floor, and the bytes per
changed element of each encoding chosen. Beside them, in the same run: the
time to read A and B (``cat``), to copy A (``cp -r``, and ``cp -r`` then
``sync``: apply fsyncs what it writes), wdiff's fixed start-up cost
(``wdiff --version``), what diff and pack cannot skip (reading and
hashing A and B with wdiff's own reader: ``wdiff.bench.floor``), and,
where installed, ``zstd -3`` of B (one thread), ``zstd -1`` of B on every
core (compressing B once, the work that a pack of a dense or unrelated
change cannot avoid) and ``zstd --patch-from`` per shard. wdiff's modules
are compiled to bytecode first, as ``pip install`` does, so that no timed
command compiles them.

``python -m wdiff.bench fanout`` measures one push and 16 pullers at once
instead (directory and S3 remotes): see wdiff/bench/fanout.py.

Scenarios:
  adam0.5 .. adam20  an optimizer step: an fp32 master (A's bf16 values plus
          a sub-ulp offset) moved by about lr per element (Adam normalises
          the step), cast to bf16; lr set so that 0.5% .. 20% of the bf16
          elements change. Small weights change more often than large ones
          (the rounding step grows with 2^exponent), as in real training
  adam-f32  the fp32 master of adam1 before and after the same step (its
          own A, F32, about the same bytes): every element changes
  rl1     uniform one-ulp moves at 1% of random positions (no structure: a
          synthetic that does not stand for a training step)
  rl3     the same at 3%
  frozen  only the last two layers and the head change (50% of their elements)
  dense   every element moved by one to three ulps
  new     B unrelated to A (fresh random weights): the worst case

Per scenario it also prints the order-0 information of the delta, chunk by
chunk (the codec's unit): "given the base" counts the positions per
exponent bucket of the base word (sum of n_b H(k_b/n_b)) and the values
(modular differences) byte plane by byte plane within each bucket; "no
context" counts positions and values over the whole chunk. Packs run with
``--format 1`` (codec v1: XOR values, positions context-free) and with the
default (codec v2), and each bundle is applied.

``zstd --patch-from`` needs the zstd binary (``apt-get install zstd``).

This is a measurement tool, not a test: machines are noisy, so it reports
medians, and the ratios matter more than the absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from .generated import compile_package, files_of, generated, in_child, stamp, unstamp

# Nothing imported here imports numpy (the scenarios' data is in scenarios.py):
# see floor.py


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


# Longer than most functions, on purpose: the benchmark's script, one scenario
# after another, read top to bottom as the table it prints.
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["fanout"]:  # one push, many pullers: see fanout.py
        from .fanout import main as fanout

        return fanout(argv[1:])
    from .scenarios import OWN_BASE, SCENARIOS

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
    ap.add_argument("--no-entropy", action="store_true",
                    help="skip the information floor and the entropies (minutes at 8 GB): timings only")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)

    from ..cli.output import parse_size
    from ..format.records import RECORD

    size = parse_size(args.size)
    scenarios = args.scenario or list(SCENARIOS)
    work = args.dir or tempfile.mkdtemp(prefix="wdiff-bench-")
    os.makedirs(work, exist_ok=True)
    run = Runner(args.runs)
    wd = [sys.executable, "-m", "wdiff"]
    if not compile_package():
        print("note: wdiff's bytecode could not be written: each wdiff row includes compiling it",
              file=sys.stderr)
    threads = ["--threads", str(args.threads)] if args.threads else []
    zstd = None if args.no_peers else shutil.which("zstd")
    rows: list[dict] = []
    a0_bytes = 0
    try:
        a = os.path.join(work, "A")
        if not generated(a, size, args.shards, args.tensors, "base"):
            print(f"generating A: {size / 1e9:.2f} GB bf16, {args.shards} shards in {work}", file=sys.stderr)
            unstamp(a)
            in_child("make_base", a, size, args.shards, args.tensors)
            stamp(a, size, args.shards, args.tensors, "base")
        base_a = a
        a0_bytes = sum(os.path.getsize(f) for f in files_of(a))
        for sc in scenarios:
            a = base_a
            if sc in OWN_BASE:
                a = os.path.join(work, OWN_BASE[sc])
                if not generated(a, size, args.shards, None, OWN_BASE[sc]):
                    print(f"generating {OWN_BASE[sc]}", file=sys.stderr)
                    unstamp(a)
                    in_child("make_base32", a, size, args.shards)
                    stamp(a, size, args.shards, None, OWN_BASE[sc])
            a_bytes = sum(os.path.getsize(f) for f in files_of(a))
            b = os.path.join(work, f"B-{sc}")
            if not generated(b, size, args.shards, args.tensors, sc):
                print(f"generating B ({sc})", file=sys.stderr)
                unstamp(b)
                in_child("make_variant", b, size, args.shards, sc, args.tensors)
                stamp(b, size, args.shards, args.tensors, sc)
            if args.no_entropy:
                k, floor, given, free = None, None, None, None
            else:
                k, floor = in_child("information_floor", a, b) if sc not in OWN_BASE else (None, None)
                k, given, free = in_child("delta_entropy", a, b)
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

            subprocess.run(["cat", *files_of(a), *files_of(b)], stdout=subprocess.DEVNULL)  # warm the cache
            t, rss, _ = run(["sh", "-c", 'cat "$@" > /dev/null', "cat", *files_of(a), *files_of(b)])
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
            t, rss, _ = run([sys.executable, "-m", "wdiff.bench.floor", *threads, a, b])
            add("read + hash A+B (wdiff's reader)", t, rss, 2 * a_bytes,
                note="what diff and pack cannot skip: wdiff.bench.floor")
            t, rss, r = run([*wd, "diff", "--json", *threads, a, b])
            add("wdiff diff", t, rss, 2 * a_bytes)
            if given is not None:
                add("entropy given the base", 0, 0, 0, int(given), note="order 0, per chunk: positions | bucket + values | bucket")
                add("entropy, no context", 0, 0, 0, int(free), note="order 0, per chunk")
            for label, fmt_args in (("wdiff pack --format 1", ["--format", "1"]), ("wdiff pack", [])):
                t, rss, r = run([*wd, "pack", "--json", "--force", *fmt_args, *threads, a, b, "-o", bundle])
                if r.returncode != 0:
                    raise SystemExit(r.stderr.decode())
                doc = json.loads(r.stdout)
                # the records' payloads alone: what the codecs wrote, without the
                # 112-byte record headers (digests, offsets) and the index
                payload = sum(c["bytes"] - RECORD.size * c["records"] for c in doc["codecs"].values())
                vs = f"{doc['bundle_bytes'] / given:.3f}x entropy ({payload / given:.3f}x in payloads); " if given else ""
                add(label, t, rss, 2 * a_bytes, doc["bundle_bytes"], note=vs + _codec_note(doc["codecs"]))
                t, rss, r = run([*wd, "apply", "-q", *threads, bundle, a, "-o", out], before=rm_out)
                if r.returncode != 0:
                    raise SystemExit(r.stderr.decode())
                add("wdiff apply" + (" (v1 bundle)" if fmt_args else ""), t, rss, a_bytes, note="verified")
                rm_out()
            if zstd:
                t, rss, r = run(["sh", "-c", f'cat "$@" | {zstd} -3 -q -c -T1 | wc -c', "zstd", *files_of(b)])
                add("zstd -3 of B", t, rss, a_bytes, int(r.stdout.strip() or 0))
                # a pack of a dense or unrelated change compresses all of B
                # once: zstd's fastest standard level on every core does that
                t, rss, r = run(["sh", "-c", f'cat "$@" | {zstd} -1 -q -c -T0 | wc -c', "zstd", *files_of(b)])
                add("zstd -1 -T0 of B", t, rss, a_bytes, int(r.stdout.strip() or 0), note="all cores")
                total, secs, refused = 0, 0.0, 0
                for fa, fb in zip(files_of(a), files_of(b)):
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
    add_ratios(rows)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows, a0_bytes)
    return 0


def _codec_note(codecs: dict) -> str:
    """Per encoding chosen: chunks, and bytes per changed element."""
    out = []
    for name, c in codecs.items():
        per = f" {c['bytes'] / c['changed_elements']:.3f} B/changed" if c["changed_elements"] else ""
        out.append(f"{name}: {c['records']} chunks{per}")
    return "; ".join(out)


#: the reference row each timed wdiff row is judged against (issue bars:
#: diff and pack against reading A and B, apply against a durable copy)
REFERENCE = {"read + hash": ("read A+B (cat)", "cat"),
             "wdiff diff": ("read A+B (cat)", "cat"), "wdiff pack": ("read A+B (cat)", "cat"),
             "wdiff apply": ("copy A durably (cp -r; sync)", "cp+sync")}


def add_ratios(rows: list[dict]) -> None:
    """Give each wdiff row ``vs``: its median over its reference row's median
    in the same scenario (and, for a pack, over the ``--format 1`` pack's
    time), as text for the table and as numbers (``vs_ref``, ``vs_v1``)."""
    by = {(r["scenario"], r["op"]): r for r in rows}
    for r in rows:
        r["vs"], r["vs_ref"], r["vs_v1"] = "", None, None
        for prefix, (ref_op, label) in REFERENCE.items():
            ref = by.get((r["scenario"], ref_op))
            if r["op"].startswith(prefix) and ref and ref["seconds"] and r["seconds"]:
                r["vs_ref"] = r["seconds"] / ref["seconds"]
                r["vs"] = f"{r['vs_ref']:.2f}x {label}"
        v1 = by.get((r["scenario"], "wdiff pack --format 1"))
        if r["op"] == "wdiff pack" and v1 and v1["seconds"]:
            r["vs_v1"] = r["seconds"] / v1["seconds"]
            r["vs"] += f", {r['vs_v1']:.2f}x v1"


def print_table(rows: list[dict], a_bytes: int) -> None:
    from ..cli.output import size, table

    print(f"checkpoint A: {size(a_bytes)}; medians; vs = median over the reference row's (cat, cp+sync) and "
          "over v1's pack; GB/s counts bytes read; ratio = checkpoint / bundle")
    out = [["scenario", "operation", "seconds", "vs", "GB/s", "peak RSS", "bundle", "B/changed", "ratio", "vs floor",
            "note"]]
    for r in rows:
        out.append([
            r["scenario"], r["op"], f"{r['seconds']:.2f}", r.get("vs", ""), f"{r['gbps']:.2f}" if r["gbps"] else "",
            size(r["peak_rss"]) if r["peak_rss"] else "", size(r["bundle_bytes"]) if r["bundle_bytes"] else "",
            f"{r['bytes_per_changed']:.3f}" if r["bytes_per_changed"] else "",
            f"{r['ratio']:.1f}x" if r["ratio"] else "", f"{r['vs_floor']:.3f}" if r["vs_floor"] else "", r["note"],
        ])
    for line in table(out, right={2, 4, 5, 6, 7, 8, 9}):
        print(line)

