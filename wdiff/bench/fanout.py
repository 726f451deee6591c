"""Fan-out: ``python -m wdiff.bench fanout [--size 32MB] [--pullers 16]``.

One push, many pullers. Generates a llama-like bf16 checkpoint A and an RL
step B (1% of elements moved), pushes A as an anchor and B as a delta to a
remote, then starts --pullers ``wdiff pull`` processes at once, each in a
directory holding A, and waits for all: every puller must end exact (wdiff
verifies B's digests; the benchmark compares every file's xxh3 with B's
too). Beside it, the same number of processes download the full checkpoint
B (its files stored as plain objects on the same remote) at once, which is
what a fleet without deltas does, and, for a late joiner, as many pulls into
empty directories (the anchor, then the delta). Per row: wall time until
the last process is done, bytes fetched per process, and the total.

Remotes: a directory (``dir``), and S3 (``s3``): moto's S3 server started
on 127.0.0.1 for the run (``pip install 'moto[server]' s3fs``, the test
extra), or a real bucket when ``--s3-url`` names one (credentials from the
usual AWS variables).

A measurement, not a test: the machine is shared and noisy; the ratio of the
two rows (delta pull vs full download) is what matters.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import xxhash

from .generated import compile_package, files_of, generated, in_child, stamp, unstamp


def _digests(d: str) -> dict[str, bytes]:
    out = {}
    for f in files_of(d):
        h = xxhash.xxh3_128()
        with open(f, "rb") as fh:
            while piece := fh.read(8 << 20):
                h.update(piece)
        out[os.path.basename(f)] = h.digest()
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Moto:
    """moto's S3 server as a child process on 127.0.0.1."""

    def __enter__(self):
        port = _free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1).read()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("moto's server did not start: pip install 'moto[server]' s3fs") from None
                time.sleep(0.2)

    def bucket(self, name: str) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{name}", method="PUT"), timeout=10).read()

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def _wave(cmds: list[list[str]], env: dict) -> tuple[float, list[subprocess.CompletedProcess]]:
    """Start every command at once; the wall time until the last ends."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for c in cmds]
    outs = [p.communicate() for p in procs]
    secs = time.perf_counter() - t0
    return secs, [subprocess.CompletedProcess(c, p.returncode, o, e) for c, p, (o, e) in zip(cmds, procs, outs)]


def _child_fetch_full(url: str, dest: str, objects: list) -> int:
    """Download whole objects (path, size) into ``dest``, as a fleet without
    deltas would: through the same store code as wdiff's pulls."""
    from ..remotes import open_remote

    store = open_remote(url)
    os.makedirs(dest, exist_ok=True)
    for path, size in objects:
        store.fetch(path, os.path.join(dest, os.path.basename(path)), size=size)
    return sum(s for _, s in objects)


def run_remote(kind: str, url: str, work: str, a: str, b: str, pullers: int, env: dict) -> list[dict]:
    wd = [sys.executable, "-m", "wdiff"]
    want = _digests(b)
    rows = []
    for args in (["push", "-q", "--anchor", a, url, "--label", "A"], ["push", "-q", b, url, "--base", a, "--label", "B"]):
        p = subprocess.run([*wd, *args], capture_output=True, env=env)
        if p.returncode != 0:
            raise SystemExit(p.stderr.decode())
    # the full checkpoint as plain objects beside the chain
    from ..remotes import Upload, open_remote

    os.environ.update(env)
    store = open_remote(url)
    full = [(f"full/{os.path.basename(f)}", os.path.getsize(f)) for f in files_of(b)]
    if kind == "dir":  # as plain files (LocalStore.store comes with the many-writers work)
        os.makedirs(os.path.join(url, "full"), exist_ok=True)
        for p, _ in full:
            shutil.copyfile(os.path.join(b, os.path.basename(p)), os.path.join(url, p))
    else:
        store.store([Upload(p, os.path.join(b, os.path.basename(p)), 0, s) for p, s in full])
    b_bytes = sum(s for _, s in full)

    def exact(d: str) -> bool:
        return _digests(d) == want

    def pull_wave(label: str, seed: str | None) -> None:
        dirs = [os.path.join(work, f"{kind}-{label}-{k}") for k in range(pullers)]
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
            if seed:
                shutil.copytree(seed, d)
        secs, res = _wave([[*wd, "pull", "--json", url, d] for d in dirs], env)
        fetched, ok = [], 0
        for r, d in zip(res, dirs):
            if r.returncode != 0:
                raise SystemExit(f"{kind}: a puller failed: {r.stderr.decode()}")
            fetched.append(json.loads(r.stdout)["downloaded_bytes"])
            ok += exact(d)
            shutil.rmtree(d, ignore_errors=True)
        rows.append({"remote": kind, "what": label, "processes": pullers, "seconds": secs,
                     "per_process": statistics.median(fetched), "total": sum(fetched), "exact": ok,
                     "vs_full": statistics.median(fetched) / b_bytes})

    # the fixed cost in every row: as many interpreters starting at once on this machine
    secs, _ = _wave([[*wd, "--version"] for _ in range(pullers)], env)
    rows.append({"remote": kind, "what": "start-up only (--version)", "processes": pullers, "seconds": secs,
                 "per_process": 0, "total": 0, "exact": pullers, "vs_full": 0.0})
    pull_wave("pull delta (dir at A)", a)
    code = "import json, sys; from wdiff.bench import fanout; print(fanout._child_fetch_full(*json.loads(sys.argv[1])))"
    dests = [os.path.join(work, f"{kind}-full-{k}") for k in range(pullers)]
    for d in dests:
        shutil.rmtree(d, ignore_errors=True)
    secs, res = _wave([[sys.executable, "-c", code, json.dumps([url, d, full])] for d in dests], env)
    ok = 0
    for r, d in zip(res, dests):
        if r.returncode != 0:
            raise SystemExit(f"{kind}: a full download failed: {r.stderr.decode()}")
        ok += exact(d)
        shutil.rmtree(d, ignore_errors=True)
    rows.append({"remote": kind, "what": "download full B", "processes": pullers, "seconds": secs,
                 "per_process": b_bytes, "total": b_bytes * pullers, "exact": ok, "vs_full": 1.0})
    pull_wave("pull into empty dir", None)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wdiff.bench fanout", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="32MB", help="checkpoint size [32MB]")
    ap.add_argument("--pullers", type=int, default=16, help="processes at once [16]")
    ap.add_argument("--remote", action="append", choices=("dir", "s3"), help="repeatable [dir and s3]")
    ap.add_argument("--s3-url", default=None, help="a real s3://BUCKET/PREFIX instead of moto's server")
    ap.add_argument("--dir", default=None, help="work directory (generated A and B are reused) [a temporary one]")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)

    from ..cli.output import parse_size

    size = parse_size(args.size)
    compile_package()  # as pip install does: no puller compiles wdiff's modules
    work = args.dir or tempfile.mkdtemp(prefix="wdiff-fanout-")
    os.makedirs(work, exist_ok=True)
    kinds = args.remote or ["dir", "s3"]
    rows: list[dict] = []
    env = dict(os.environ)
    try:
        a, b = os.path.join(work, "A"), os.path.join(work, "B-rl1")
        if not generated(a, size, 4, None, "base"):
            print(f"generating A: {size / 1e6:.0f} MB bf16 in {work}", file=sys.stderr)
            unstamp(a)
            in_child("make_base", a, size, 4, None)
            stamp(a, size, 4, None, "base")
        if not generated(b, size, 4, None, "rl1"):
            unstamp(b)
            in_child("make_variant", b, size, 4, "rl1", None)
            stamp(b, size, 4, None, "rl1")
        for kind in kinds:
            if kind == "dir":
                remote = os.path.join(work, "remote")
                shutil.rmtree(remote, ignore_errors=True)
                rows += run_remote(kind, remote, work, a, b, args.pullers, env)
                shutil.rmtree(remote, ignore_errors=True)
            elif args.s3_url:
                rows += run_remote(kind, args.s3_url, work, a, b, args.pullers, env)
            else:
                with _Moto() as moto:
                    moto.bucket("wdiff-fanout")
                    s3env = dict(env, AWS_ENDPOINT_URL=moto.endpoint, AWS_ACCESS_KEY_ID="bench",
                                 AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                                 AWS_EC2_METADATA_DISABLED="true")
                    rows += run_remote("s3 (moto)", "s3://wdiff-fanout/run", work, a, b, args.pullers, s3env)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows, size)
    return 0


def print_table(rows: list[dict], size: int) -> None:
    from ..cli.output import size as human
    from ..cli.output import table

    print(f"checkpoint: {human(size)} bf16, RL step at 1%; processes start at once; seconds until the last is done")
    out = [["remote", "what", "processes", "seconds", "fetched/process", "total fetched", "vs full", "exact"]]
    for r in rows:
        out.append([r["remote"], r["what"], str(r["processes"]), f"{r['seconds']:.2f}", human(r["per_process"]),
                    human(r["total"]), f"{r['vs_full']:.3f}", f"{r['exact']}/{r['processes']}"])
    for line in table(out, right={2, 3, 4, 5, 6}):
        print(line)
