"""Benchmark: ``python -m wdiff.bench [--size 2GB] [--scenario ...] [--threads 1,2,all]``.

Generates a synthetic llama-like bf16 checkpoint and, per scenario, a second
version (or, with ``--pair A B``, takes two given checkpoint directories);
runs ``wdiff diff``, ``pack`` and ``apply`` on them as separate processes
and prints one table: wall seconds (median of --runs), CPU seconds and CPU
seconds per GB, peak RSS of the process, bundle size, bytes per changed
element, compression ratio, the bundle's distance from the information
floor, and the bytes per changed element of each encoding chosen. Beside
them, in the same run: the time to read A and B (``cat``), to copy A (``cp
-r``, and ``cp -r`` then ``sync``: apply fsyncs what it writes), wdiff's
fixed start-up cost (``wdiff --version``), what diff and pack cannot skip
(reading and hashing A and B with wdiff's own reader:
``wdiff.bench.floor``), and, where installed, ``zstd -3`` of B (one
thread), ``zstd -1`` of B on every core (compressing B once, the work that
a pack of a dense or unrelated change cannot avoid) and ``zstd
--patch-from`` per file. wdiff's modules are compiled to bytecode first, as
``pip install`` does, so that no timed command compiles them.

Every timed command runs in the same environment: the benchmark's own with
OPENBLAS_NUM_THREADS=1 unless it is set, as wdiff's console script sets it
for itself (the floor sets it, and the collector's pace, as wdiff does).

CPU is user + system time of the process and of the children it waited
for (a ``sh -c`` pipeline counts its commands), from wait4, median over
--runs (``zstd --patch-from``: one run, summed over the files). Work the
kernel does on its own threads (writeback of a page-cache copy) is nobody's.
CPU per GB (and GB/s) counts, in 1e9 bytes: A and B read for cat, the
floor, diff and pack; A read and B written for apply; A copied for the
copies; B read for ``zstd`` of B; A and B for ``--patch-from``
(``bytes`` in --json). "CPU vs" is a row's CPU over its reference row's, in
the same scenario at the same thread count (a row that runs once serves
every count): the floor over cat; diff and ``pack --format 1`` over the
floor; ``pack`` (codec v2) over ``pack --format 1``; ``apply (v1 bundle)``
over ``cp -r; sync``; ``apply`` (codec v2) over ``apply (v1 bundle)``.
"vs" is the same for wall time, against cat and ``cp -r; sync`` (and a
pack's over v1's).

``--threads``: a comma list of thread counts (``all``: wdiff's default,
wdiff.parallel.default_threads()), deduplicated and sorted [1,2,all]. The
floor, diff, both packs and both applies run at each count (``--threads N``
to wdiff and to the floor); cat, the copies, the start-up and zstd run
once. "speedup" is an operation's wall time at 1 thread over its time at
the row's count (none where 1 is not in the list). The bundles a pack
writes at each count must be byte-identical (bundles are reproducible at
any thread count): where they are not, the benchmark stops with a message
naming them.

After the table: CPU per byte at 1 thread (or the fewest measured) per
scenario, with pack over pack v1 and diff over the floor; and, for two
thread counts or more, each swept operation's wall time at each count and
its speedup at the most.

``--pair A B`` measures two checkpoint directories (real fine-tuning
checkpoints, say) instead of generated scenarios, under B's folder name:
nothing is generated, nothing of them written or deleted (the bundle and
apply's output go to the work directory). The files directly in A and B
are read (a folder in them is refused). The entropies are computed unless
--no-entropy; the information floor is not (it assumes bf16 words in both).

``python -m wdiff.bench fanout`` measures one push and 16 pullers at once
instead (directory and S3 remotes): see wdiff/bench/fanout.py.
``python -m wdiff.bench.paired A B`` measures the CPU of the floor, diff,
pack and apply in interleaved rounds, for ratios that the minutes between
this table's rows do not blur: see wdiff/bench/paired.py.

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
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from ..parallel import default_threads
from .generated import compile_package, files_of, generated, in_child, stamp, unstamp

# Nothing imported here imports numpy (the scenarios' data is in scenarios.py):
# see floor.py

CAT = "read A+B (cat)"
COPY = "copy A (cp -r)"
COPY_SYNC = "copy A durably (cp -r; sync)"
STARTUP = "wdiff startup (--version)"
FLOOR = "read + hash A+B (wdiff's reader)"
DIFF = "wdiff diff"
PACK1 = "wdiff pack --format 1"
APPLY1 = "wdiff apply (v1 bundle)"
PACK = "wdiff pack"
APPLY = "wdiff apply"
#: the rows run once per thread count of --threads
SWEPT = (FLOOR, DIFF, PACK1, APPLY1, PACK, APPLY)


# -- measuring -------------------------------------------------------------------------


@dataclass
class Timing:
    """One timed command: medians of its runs."""

    seconds: float  #: wall
    cpu: float  #: user + system, of the child and the children it waited for
    rss: int  #: peak RSS, the largest of the runs
    last: subprocess.CompletedProcess | None = None


class Runner:
    """Runs a command --runs times in ``env`` and reports its wall time, its
    CPU time and its peak RSS, from wait4 on the child: the kernel's figures
    for the child and for every child of its own that it waited for (a
    ``sh -c`` pipeline counts its commands). A command that fails stops the
    benchmark: a failure timed is no measurement."""

    def __init__(self, runs: int, env: dict[str, str]) -> None:
        self.runs = runs
        self.env = env

    def __call__(self, cmd: list[str], before=None, ok=(0,)) -> Timing:
        times, cpus, rss = [], [], 0
        last = None
        for _ in range(self.runs):
            if before:
                before()
            t0 = time.perf_counter()
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env)
            out = p.stdout.read()
            err = p.stderr.read()
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            times.append(time.perf_counter() - t0)
            cpus.append(usage.ru_utime + usage.ru_stime)
            rss = max(rss, usage.ru_maxrss * 1024)
            last = subprocess.CompletedProcess(cmd, p.returncode, out, err)
            if p.returncode not in ok:
                raise SystemExit(f"{' '.join(cmd)}: exit status {p.returncode}\n{err.decode(errors='replace')}")
        return Timing(statistics.median(times), statistics.median(cpus), rss, last)


def thread_counts(text: str) -> list[int]:
    """``--threads``: a comma list of counts and ``all`` (wdiff's default
    count, wdiff.parallel.default_threads()), deduplicated and sorted."""
    counts = set()
    for part in text.split(","):
        part = part.strip()
        if part == "all":
            counts.add(default_threads())
            continue
        try:
            n = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is no thread count (a number or 'all')") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"{n} threads: at least 1")
        counts.add(n)
    return sorted(counts)


def file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def check_reproducible(what: str, digests: dict[int, str]) -> None:
    """Bundles are byte-reproducible at any thread count: the bundles that
    ``what`` wrote at each count (their digests, by count) must be one."""
    if len(set(digests.values())) > 1:
        each = ", ".join(f"{n} threads: {d[:16]}" for n, d in sorted(digests.items()))
        raise SystemExit(f"{what}: the bundles differ between thread counts ({each}); "
                         "a bundle must be byte-identical at any thread count")


def regular_files(d: str) -> list[str]:
    """The files a pair's rows read: those directly in ``d``, as the floor
    reads them; a folder in it is refused, since cat and the floor would
    leave it out where diff and pack read it."""
    if not os.path.isdir(d):
        raise SystemExit(f"--pair: {d} is not a directory")
    out = []
    for p in files_of(d):
        if not os.path.isfile(p):
            raise SystemExit(f"--pair: {p} is not a regular file: the benchmark reads the files directly in A and B")
        out.append(p)
    return out


@dataclass
class Case:
    """A scenario's pair: A, B, their sizes, and the delta's information
    (None with --no-entropy): changed elements and the floor in bytes."""

    scenario: str
    a: str
    b: str
    a_bytes: int
    b_bytes: int
    changed: int | None = None
    floor: float | None = None

    def row(self, op: str, t: Timing | None, nbytes: int, *, threads: int | None = None,
            bundle_bytes: int | None = None, note: str = "") -> dict:
        """A row of the table: ``nbytes`` is what its GB/s and CPU per GB
        count (see the module doc)."""
        secs = t.seconds if t else None
        cpu = t.cpu if t else None
        k = self.changed
        return {
            "scenario": self.scenario, "op": op, "threads": threads, "seconds": secs,
            "cpu_seconds": cpu, "bytes": nbytes or None,
            "gbps": nbytes / secs / 1e9 if (nbytes and secs) else None,
            "cpu_per_gb": cpu / (nbytes / 1e9) if (nbytes and cpu is not None) else None,
            "peak_rss": t.rss if t else 0, "bundle_bytes": bundle_bytes,
            "bytes_per_changed": bundle_bytes / k if (bundle_bytes and k) else None,
            "ratio": self.a_bytes / bundle_bytes if bundle_bytes else None,
            "vs_floor": bundle_bytes / self.floor if (bundle_bytes and self.floor) else None,
            "changed": k, "note": note,
        }


def _generated_cases(work: str, size: int, args, scenarios: list[str]):
    """(scenario, A, B, True: B is the benchmark's own) per scenario, each
    checkpoint generated unless --dir holds it from an earlier run."""
    from .scenarios import OWN_BASE

    base_a = os.path.join(work, "A")
    if not generated(base_a, size, args.shards, args.tensors, "base"):
        print(f"generating A: {size / 1e9:.2f} GB bf16, {args.shards} shards in {work}", file=sys.stderr)
        unstamp(base_a)
        in_child("make_base", base_a, size, args.shards, args.tensors)
        stamp(base_a, size, args.shards, args.tensors, "base")
    for sc in scenarios:
        a = base_a
        if sc in OWN_BASE:
            a = os.path.join(work, OWN_BASE[sc])
            if not generated(a, size, args.shards, None, OWN_BASE[sc]):
                print(f"generating {OWN_BASE[sc]}", file=sys.stderr)
                unstamp(a)
                in_child("make_base32", a, size, args.shards)
                stamp(a, size, args.shards, None, OWN_BASE[sc])
        b = os.path.join(work, f"B-{sc}")
        if not generated(b, size, args.shards, args.tensors, sc):
            print(f"generating B ({sc})", file=sys.stderr)
            unstamp(b)
            in_child("make_variant", b, size, args.shards, sc, args.tensors)
            stamp(b, size, args.shards, args.tensors, sc)
        yield sc, a, b, True


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
    ap.add_argument("--pair", nargs=2, metavar=("A", "B"), default=None,
                    help="measure these two checkpoint directories instead of generated scenarios "
                         "(nothing generated, nothing of theirs deleted)")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--tensors", type=int, default=None,
                    help="N equal bf16 tensors instead of a llama-like layout (e.g. 20000 vs 200)")
    ap.add_argument("--runs", type=int, default=3, help="runs per timing; the median is shown [3]")
    ap.add_argument("--threads", type=thread_counts, default="1,2,all",
                    help="wdiff --threads of the swept rows: a comma list, 'all' being wdiff's default "
                         "(e.g. 1,2,4,8,16) [1,2,all]")
    ap.add_argument("--dir", default=None,
                    help="work directory, kept: the data generated there is reused by the next run with the same "
                         "--size, --shards and --tensors [a temporary one]")
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    ap.add_argument("--no-peers", action="store_true", help="skip zstd")
    ap.add_argument("--no-entropy", action="store_true",
                    help="skip the information floor and the entropies (minutes at 8 GB): timings only")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    if args.pair and (args.scenario or args.tensors):
        ap.error("--pair measures the given pair: no --scenario or --tensors with it")

    from ..cli.output import parse_size
    from ..format.records import RECORD

    size = parse_size(args.size)
    work = args.dir or tempfile.mkdtemp(prefix="wdiff-bench-")
    os.makedirs(work, exist_ok=True)
    # every timed child runs in this environment, set up as wdiff's console
    # script sets up its own process (the floor does the same for itself)
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    run = Runner(args.runs, env)
    wd = [sys.executable, "-m", "wdiff"]
    if not compile_package():
        print("note: wdiff's bytecode could not be written: each wdiff row includes compiling it",
              file=sys.stderr)
    counts = args.threads
    zstd = None if args.no_peers else shutil.which("zstd")
    rows: list[dict] = []
    a0_bytes = 0
    try:
        if args.pair:
            a, b = (os.path.abspath(d) for d in args.pair)
            cases = [(os.path.basename(b) or "pair", a, b, False)]
        else:
            cases = _generated_cases(work, size, args, args.scenario or list(SCENARIOS))
        for sc, a, b, made_b in cases:
            fa, fb = (regular_files(a), regular_files(b)) if args.pair else (files_of(a), files_of(b))
            case = Case(sc, a, b, sum(map(os.path.getsize, fa)), sum(map(os.path.getsize, fb)))
            a0_bytes = a0_bytes or case.a_bytes
            ab = case.a_bytes + case.b_bytes
            given = free = None
            if not args.no_entropy:
                if not args.pair and sc not in OWN_BASE:  # bf16 words alike in A and B
                    case.changed, case.floor = in_child("information_floor", a, b)
                case.changed, given, free = in_child("delta_entropy", a, b)
            bundle = os.path.join(work, f"{sc}.wdb")
            out = os.path.join(work, f"C-{sc}")

            def rm_out(out=out):
                shutil.rmtree(out, ignore_errors=True)

            def rm_out_synced(out=out):
                shutil.rmtree(out, ignore_errors=True)
                os.sync()

            subprocess.run(["cat", *fa, *fb], check=False, stdout=subprocess.DEVNULL, env=env)  # warm the cache
            rows.append(case.row(CAT, run(["sh", "-c", 'cat "$@" > /dev/null', "cat", *fa, *fb]), ab))
            rows.append(case.row(COPY, run(["cp", "-r", a, out], before=rm_out), case.a_bytes))
            t = run(["sh", "-c", 'cp -r "$1" "$2" && sync', "cp", a, out], before=rm_out_synced)
            rows.append(case.row(COPY_SYNC, t, case.a_bytes, note="apply fsyncs too"))
            rm_out()
            rows.append(case.row(STARTUP, run([*wd, "--version"]), 0, note="fixed cost in every row below"))
            for n in counts:
                t = run([sys.executable, "-m", "wdiff.bench.floor", "--threads", str(n), a, b])
                rows.append(case.row(FLOOR, t, ab, threads=n, note="what diff and pack cannot skip: wdiff.bench.floor"))
            for n in counts:
                t = run([*wd, "diff", "--json", "--threads", str(n), a, b], ok=(0, 1))
                rows.append(case.row(DIFF, t, ab, threads=n))
            if given is not None:
                rows.append(case.row("entropy given the base", None, 0, bundle_bytes=int(given),
                                     note="order 0, per chunk: positions | bucket + values | bucket"))
                rows.append(case.row("entropy, no context", None, 0, bundle_bytes=int(free), note="order 0, per chunk"))
            for (pack_op, apply_op), fmt_args in (((PACK1, APPLY1), ["--format", "1"]), ((PACK, APPLY), [])):
                digests = {}
                for n in counts:
                    t = run([*wd, "pack", "--json", "--force", *fmt_args, "--threads", str(n), a, b, "-o", bundle])
                    digests[n] = file_digest(bundle)
                    doc = json.loads(t.last.stdout)
                    # the records' payloads alone: what the codecs wrote, without the
                    # 112-byte record headers (digests, offsets) and the index
                    payload = sum(c["bytes"] - RECORD.size * c["records"] for c in doc["codecs"].values())
                    vs = f"{doc['bundle_bytes'] / given:.3f}x entropy ({payload / given:.3f}x in payloads); " if given else ""
                    rows.append(case.row(pack_op, t, ab, threads=n, bundle_bytes=doc["bundle_bytes"],
                                         note=vs + _codec_note(doc["codecs"])))
                check_reproducible(pack_op, digests)
                for n in counts:  # the bundle: the same at every count, as just checked
                    t = run([*wd, "apply", "-q", "--threads", str(n), bundle, a, "-o", out], before=rm_out)
                    rows.append(case.row(apply_op, t, ab, threads=n, note="verified"))
                rm_out()
            if zstd:
                t = run(["sh", "-c", f'cat "$@" | {zstd} -3 -q -c -T1 | wc -c', "zstd", *fb])
                rows.append(case.row("zstd -3 of B", t, case.b_bytes, bundle_bytes=int(t.last.stdout.strip() or 0)))
                # a pack of a dense or unrelated change compresses all of B
                # once: zstd's fastest standard level on every core does that
                t = run(["sh", "-c", f'cat "$@" | {zstd} -1 -q -c -T0 | wc -c', "zstd", *fb])
                rows.append(case.row("zstd -1 -T0 of B", t, case.b_bytes, bundle_bytes=int(t.last.stdout.strip() or 0),
                                     note="all cores"))
                t, total, refused = _patch_from(zstd, fa, fb, os.path.join(work, "patch.zst"), env)
                rows.append(case.row("zstd --patch-from", t, ab, bundle_bytes=total or None,
                                     note=f"{refused} files refused or not in A" if refused else "per file, once"))
            if made_b and not args.dir:  # a --dir keeps the data for the next run
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
        print_cpu_summary(rows, counts)
        print_scaling(rows, counts)
    return 0


def _patch_from(zstd: str, fa: list[str], fb: list[str], dst: str, env: dict) -> tuple[Timing, int, int]:
    """``zstd --patch-from`` of each file of B from its namesake in A, once:
    (time and CPU summed over the files, bytes written, files refused or
    with no namesake). The CPU is this process's waited-for children's,
    before and after each file."""
    total, secs, cpu, refused = 0, 0.0, 0.0, 0
    in_a = {os.path.basename(p): p for p in fa}
    for b in fb:
        a = in_a.get(os.path.basename(b))
        if a is None:
            refused += 1
            continue
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run([zstd, "-3", "-q", "-f", "-T1", f"--patch-from={a}", b, "-o", dst],
                           check=False, capture_output=True, env=env)
        secs += time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu += (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        if p.returncode != 0:
            refused += 1
            continue
        total += os.path.getsize(dst)
    if os.path.exists(dst):
        os.unlink(dst)
    return Timing(secs, cpu, 0), total, refused


def _codec_note(codecs: dict) -> str:
    """Per encoding chosen: chunks, and bytes per changed element."""
    out = []
    for name, c in codecs.items():
        per = f" {c['bytes'] / c['changed_elements']:.3f} B/changed" if c["changed_elements"] else ""
        out.append(f"{name}: {c['records']} chunks{per}")
    return "; ".join(out)


#: the reference row each timed wdiff row's wall time is judged against
#: (issue bars: diff and pack against reading A and B, apply against a
#: durable copy)
REFERENCE = {"read + hash": (CAT, "cat"),
             DIFF: (CAT, "cat"), PACK: (CAT, "cat"),
             APPLY: (COPY_SYNC, "cp+sync")}

#: the reference row of each row's CPU time (``cpu_vs``): what it adds to
#: the work below it. Rows that run once (cat, cp) serve every thread count.
CPU_REFERENCE = {FLOOR: (CAT, "cat"), DIFF: (FLOOR, "floor"), PACK1: (FLOOR, "floor"), PACK: (PACK1, "v1"),
                 APPLY1: (COPY_SYNC, "cp+sync"), APPLY: (APPLY1, "v1")}


def add_ratios(rows: list[dict]) -> None:
    """Give each wdiff row ``vs``: its median over its reference row's median
    in the same scenario (and, for a pack, over the ``--format 1`` pack's
    time at the same thread count), as text for the table and as numbers
    (``vs_ref``, ``vs_v1``); ``cpu_vs`` and ``cpu_ref``: its CPU over its
    CPU reference's (CPU_REFERENCE) at the same thread count; ``speedup``:
    its op's wall time at one thread over its own."""
    by = {(r["scenario"], r["op"], r["threads"]): r for r in rows}
    for r in rows:
        sc, n = r["scenario"], r["threads"]
        r["vs"], r["vs_ref"], r["vs_v1"] = "", None, None
        for prefix, (ref_op, label) in REFERENCE.items():
            ref = by.get((sc, ref_op, None))
            if r["op"].startswith(prefix) and ref and ref["seconds"] and r["seconds"]:
                r["vs_ref"] = r["seconds"] / ref["seconds"]
                r["vs"] = f"{r['vs_ref']:.2f}x {label}"
        v1 = by.get((sc, PACK1, n))
        if r["op"] == PACK and v1 and v1["seconds"]:
            r["vs_v1"] = r["seconds"] / v1["seconds"]
            r["vs"] += f", {r['vs_v1']:.2f}x v1"
        r["cpu_vs"], r["cpu_ref"], r["speedup"] = None, None, None
        ref_op, _ = CPU_REFERENCE.get(r["op"], (None, None))
        ref = by.get((sc, ref_op, n)) or by.get((sc, ref_op, None))
        if ref and ref["cpu_seconds"] and r["cpu_seconds"] is not None:
            r["cpu_vs"], r["cpu_ref"] = r["cpu_seconds"] / ref["cpu_seconds"], ref_op
        one = by.get((sc, r["op"], 1))
        if n is not None and one and r["seconds"]:
            r["speedup"] = one["seconds"] / r["seconds"]


def print_table(rows: list[dict], a_bytes: int) -> None:
    from ..cli.output import size, table

    print(f"checkpoint A: {size(a_bytes)}; medians; seconds: wall; vs: over the reference row's (cat, cp+sync) "
          "and over v1's pack; ratio: checkpoint / bundle")
    print("CPU: user + system, per GB of A and B read (apply: A read and B written; cp: A copied; zstd: B read); "
          "CPU vs: over its reference row's CPU; speedup: wall at 1 thread over wall")
    labels = {ref: label for ref, label in CPU_REFERENCE.values()}
    out = [["scenario", "operation", "threads", "seconds", "vs", "CPU s", "CPU s/GB", "CPU vs", "speedup", "peak RSS",
            "bundle", "B/changed", "ratio", "vs floor", "note"]]
    for r in rows:
        out.append([
            r["scenario"], r["op"], str(r["threads"] or ""), _num(r["seconds"]), r["vs"], _num(r["cpu_seconds"]),
            _num(r["cpu_per_gb"]), f"{r['cpu_vs']:.2f}x {labels[r['cpu_ref']]}" if r["cpu_vs"] else "",
            _num(r["speedup"], "x"), size(r["peak_rss"]) if r["peak_rss"] else "",
            size(r["bundle_bytes"]) if r["bundle_bytes"] else "",
            f"{r['bytes_per_changed']:.3f}" if r["bytes_per_changed"] else "",
            f"{r['ratio']:.1f}x" if r["ratio"] else "", f"{r['vs_floor']:.3f}" if r["vs_floor"] else "", r["note"],
        ])
    for line in table(out, right={2, 3, 5, 6, 8, 9, 10, 11, 12, 13}):
        print(line)


def _num(x: float | None, unit: str = "") -> str:
    return "" if x is None else f"{x:.2f}{unit}"


def print_cpu_summary(rows: list[dict], counts: list[int]) -> None:
    """Per scenario, CPU seconds per GB of each swept row at one thread (or
    at the fewest threads measured), and two ratios of them."""
    from ..cli.output import table

    n = 1 if 1 in counts else counts[0]
    by = {(r["scenario"], r["op"]): r for r in rows if r["threads"] == n}
    ops = (FLOOR, DIFF, PACK1, PACK, APPLY1, APPLY)
    print()
    print(f"CPU per byte at {n} thread{'s' if n > 1 else ''}: CPU s per GB of A+B read (apply: A read, B written)")
    out = [["scenario", "read + hash", "diff", "pack v1", "pack", "apply (v1 bundle)", "apply", "pack / pack v1",
            "diff / floor"]]
    for sc in dict.fromkeys(r["scenario"] for r in rows):
        cells = [by.get((sc, op), {}).get("cpu_per_gb") for op in ops]
        fl, di, p1, p2 = cells[:4]
        out.append([sc, *(_num(c) for c in cells), _num(p2 / p1 if (p1 and p2) else None, "x"),
                    _num(di / fl if (fl and di) else None, "x")])
    for line in table(out, right=set(range(1, 9))):
        print(line)


def print_scaling(rows: list[dict], counts: list[int]) -> None:
    """Per scenario and swept row, wall seconds at each thread count and
    the speedup at the most threads (over one thread)."""
    from ..cli.output import table

    if len(counts) < 2:
        return
    by = {(r["scenario"], r["op"], r["threads"]): r for r in rows}
    print()
    print("thread scaling: wall seconds (medians) at each thread count")
    out = [["scenario", "operation", *(f"{n} thr" for n in counts), f"speedup at {counts[-1]}"]]
    for sc in dict.fromkeys(r["scenario"] for r in rows):
        for op in SWEPT:
            if (sc, op, counts[0]) not in by:
                continue
            out.append([sc, op, *(_num(by[sc, op, n]["seconds"]) for n in counts),
                        _num(by[sc, op, counts[-1]]["speedup"], "x")])
    for line in table(out, right=set(range(2, len(counts) + 3))):
        print(line)
