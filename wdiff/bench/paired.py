"""``python -m wdiff.bench.paired A B [--rounds 10] [--threads 1]``: the CPU
bars of diff, pack and apply, measured in pairs.

On a shared machine a command's system time moves by a third from minute
to minute, so rows timed one after the other (the benchmark's table) can
disagree by more than the differences they are meant to show. This runs
the read-and-hash floor (``python -m wdiff.bench.floor``), ``diff``,
``pack --format 1``, ``pack``, and ``apply`` of each of the two bundles,
one after the other, round after round, as separate processes on the
checkpoint directories A and B (the benchmark keeps the ones it generates
with ``--dir D``: D/A and D/B-adam1, ...), and prints each command's
median CPU (user + system, from wait4) per GB of A and B read (apply: of A
read and B written) and the medians of the ratios within each round:
diff over the floor, pack over ``pack --format 1``, apply over the apply
of the version 1 bundle. Nothing in A or B is written; the bundles and
apply's output go to a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from .generated import compile_package, files_of

#: the commands, in the order each round runs them
COMMANDS = ("read + hash (floor)", "diff", "pack --format 1", "pack", "apply of the v1 bundle", "apply")
RATIOS = (("diff", "read + hash (floor)"), ("pack", "pack --format 1"), ("apply", "apply of the v1 bundle"))


def commands(a: str, b: str, work: str, threads: int) -> dict[str, list[str]]:
    py, t = [sys.executable], ["--threads", str(threads)]
    v1, v2, out = (os.path.join(work, x) for x in ("v1.wdb", "v2.wdb", "out"))
    return {
        COMMANDS[0]: [*py, "-m", "wdiff.bench.floor", *t, a, b],
        COMMANDS[1]: [*py, "-m", "wdiff", "diff", "--json", *t, a, b],
        COMMANDS[2]: [*py, "-m", "wdiff", "pack", "--format", "1", "--force", *t, a, b, "-o", v1],
        COMMANDS[3]: [*py, "-m", "wdiff", "pack", "--force", *t, a, b, "-o", v2],
        COMMANDS[4]: [*py, "-m", "wdiff", "apply", "-q", *t, v1, a, "-o", out],
        COMMANDS[5]: [*py, "-m", "wdiff", "apply", "-q", *t, v2, a, "-o", out],
    }


def cpu_of(cmd: list[str]) -> float:
    """User + system CPU seconds of ``cmd`` run to its end; SystemExit when it fails."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed: {err.decode(errors='replace')}")
    return usage.ru_utime + usage.ru_stime


def measure(a: str, b: str, rounds: int, threads: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="wdiff-paired-") as work:
        cmds = commands(a, b, work, threads)
        cpu: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(rounds):
            for k, cmd in cmds.items():
                shutil.rmtree(os.path.join(work, "out"), ignore_errors=True)
                cpu[k].append(cpu_of(cmd))
        return cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wdiff.bench.paired", description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="base checkpoint directory")
    ap.add_argument("b", help="target checkpoint directory")
    ap.add_argument("--rounds", type=int, default=10, help="rounds of the six commands [10]")
    ap.add_argument("--threads", type=int, default=1, help="wdiff --threads [1]")
    args = ap.parse_args(argv)
    compile_package()
    # what every command reads, or apply reads (A) and writes (B, as large as the target)
    gb = sum(os.path.getsize(f) for d in (args.a, args.b) for f in files_of(d)) / 1e9
    cpu = measure(args.a, args.b, args.rounds, args.threads)
    print(f"{args.rounds} rounds, --threads {args.threads}; CPU: user + system, medians; per GB of A and B "
          f"({gb:.2f} GB; apply: A read and B written)")
    print("| command | CPU s | CPU s/GB | ratio (median of the rounds') |")
    print("|---|---|---|---|")
    over = {x: y for x, y in RATIOS}
    for k, v in cpu.items():
        per = statistics.median(v) / gb
        r = ""
        if k in over:
            r = f"{statistics.median([x / y for x, y in zip(v, cpu[over[k]])]):.2f}x {over[k]}"
        print(f"| {k} | {statistics.median(v):.3f} | {per:.3f} | {r} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
