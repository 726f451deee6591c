"""Threat model: chains at their documented limits. wdiff/chain.py accepts
an index of up to MAX_CHAIN_BYTES (32 MiB) with up to MAX_ENTRIES (50,000)
entries; a remote may serve any such index, so everything wdiff does with
one must be linear in it. Required: path finding linear in the chain, with
memory proportional to it (peak RSS under 256 MiB at the limits), and
status/pull on a 50,000-entry chain under 2 s.

The chains are generated here, valid by every rule chain.py checks. The
measured process is wdiff itself (os.wait4 gives its own peak RSS), run under
an address-space limit so that today's blow-up (5 GB) fails fast instead of
swapping the machine.

Timing on a noisy machine: decoding a 50,000-entry index alone takes
about 0.7-0.9 s on the 2-core machine these tests were written on, and
that machine was shared (load average 5), so wall time swung 2x between two
runs of the same command. The tests therefore compare CPU time (user +
system, from the process's own rusage), which waiting for a core does not
inflate, against a baseline measured beside it: the same command on the
same index, asking for a version one entry from the start, which decodes
everything and finds a trivial path (for pull: the same index with the
synthetic entries made too big to explore, so only the search differs). Path finding must add under
PATH_BUDGET_S (1 s of CPU) to that baseline: a linear search over 50,000
entries needs about 0.1 s; today's adds 1.7 s on a plain line, and on the
line with leaves runs out of memory. The wall time of the whole command is
held to the spec's 2 s times TIME_MARGIN, 3 by default as the margin
for noisy CI (WDIFF_THREAT_TIME_MARGIN=1 holds a quiet machine to the letter
of the spec). Memory is not noisy: 256 MiB is asserted as is.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import os

import numpy as np
import pytest

from factory import rand, tree, write_ckpt
from threatlib import Run, canonical, ok, user_env, wdiff

#: chains at their limits (50,000 entries) and the budgets they must keep
pytestmark = pytest.mark.slow

MAX_ENTRIES = 50_000
SPEC_S = 2.0
TIME_MARGIN = float(os.environ.get("WDIFF_THREAT_TIME_MARGIN", "3"))
PATH_BUDGET_S = 1.0
RSS_LIMIT_KIB = 256 * 1024
ADDRESS_SPACE = 1024**3  # a safety net against today's blow-up; wdiff runs these in under 768 MiB of address space
TIMEOUT_S = 60


def hx(tag: int, i: int) -> str:
    return f"{tag:02x}{i:030x}"


def entry(k: int, parent: str | None, version: str, size: int) -> dict:
    b = hx(0xB0, k)
    return {"bundle": b, "created": "2026-01-01T00:00:00Z", "label": None, "parent": parent,
            "parts": [{"digest": hx(0xD0, k), "path": f"objects/{b[:2]}/{b}.wdb", "size": size}],
            "size": size, "version": version}


def line(n: int, *, size: int, first: int = 0, leaves: int = 0, leaf_size: int = 0) -> tuple[list, str]:
    """An anchor and n-1 deltas in a line; after each of the first ``leaves``
    versions, a dead-end delta of ``leaf_size`` bytes (pushed and abandoned)."""
    out, prev, k = [], None, first
    for i in range(n):
        v = hx(0xA0, first + i)
        out.append(entry(k, prev, v, size))
        k += 1
        if i < leaves:
            out.append(entry(k, v, hx(0xC0, first + i), leaf_size))
            k += 1
        prev = v
    return out, prev


def write_remote(root: Path, entries: list, head: str) -> int:
    assert len(entries) <= MAX_ENTRIES
    raw = canonical({"format": "wdiff-chain", "version": 1, "head": head, "entries": entries}) + b"\n"
    assert len(raw) <= 32 * 1024 * 1024 and raw.count(b"{") <= 3 * MAX_ENTRIES + 1
    root.mkdir(parents=True, exist_ok=True)
    (root / "chain.json").write_bytes(raw)
    return len(raw)


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    return user_env(tmp_path_factory.mktemp("limits-user"))


def measure(*args, env) -> Run:
    return wdiff(*args, env=env, timeout=TIMEOUT_S, max_address_space=ADDRESS_SPACE)


def check_budget(run, baseline) -> None:
    assert run.rc == 0, str(run)
    assert baseline.rc == 0, str(baseline)
    assert run.maxrss_kib < RSS_LIMIT_KIB, f"peak RSS {run.maxrss_kib // 1024} MiB (limit 256)\n{run}"
    extra = run.cpu_s - baseline.cpu_s
    assert extra < PATH_BUDGET_S, (
        f"path finding took {extra:.2f} s of CPU beyond the baseline ({baseline.cpu_s:.2f} s for the same index)\n{run}")
    assert run.elapsed < SPEC_S * TIME_MARGIN, f"{run.elapsed:.2f} s (spec {SPEC_S} s, margin {TIME_MARGIN}x)\n{run}"


def test_status_on_a_plain_line_of_max_entries(tmp_path, user):
    entries, head = line(MAX_ENTRIES, size=1000)
    remote = tmp_path / "remote"
    write_remote(remote, entries, head)
    nodir = tmp_path / "empty"  # an empty directory: the path starts from nothing, through the anchor
    nodir.mkdir()
    baseline = measure("status", nodir, remote, "--json", "--to", hx(0xA0, 0), env=user)
    run = measure("status", nodir, remote, "--json", env=user)
    check_budget(run, baseline)
    got = json.loads(run.stdout)
    assert (got["behind"], got["download_bytes"], got["target"]) == (MAX_ENTRIES, MAX_ENTRIES * 1000, head)


def test_status_on_a_line_with_abandoned_leaves_at_the_limits(tmp_path, user):
    """25,000 entries in a line plus 25,000 dead-end leaves, each a big
    bundle (a 15 MiB index): the leaves stay queued while the search walks
    the line, which is where per-candidate copies of the path cost 5 GB."""
    n = MAX_ENTRIES // 2
    entries, head = line(n, size=1000, leaves=n, leaf_size=10**9)
    remote = tmp_path / "remote"
    size = write_remote(remote, entries, head)
    assert size > 15 * 10**6 and len(entries) == MAX_ENTRIES
    nodir = tmp_path / "empty"
    nodir.mkdir()
    baseline = measure("status", nodir, remote, "--json", "--to", hx(0xA0, 0), env=user)
    run = measure("status", nodir, remote, "--json", env=user)
    check_budget(run, baseline)
    got = json.loads(run.stdout)
    assert (got["behind"], got["download_bytes"], got["target"]) == (n, n * 1000, head)


@pytest.fixture(scope="module")
def real_anchor(tmp_path_factory, user):
    """A real 4.5 MiB checkpoint (incompressible) pushed as an anchor: its
    chain entry and its object."""
    root = tmp_path_factory.mktemp("anchor")
    rng = np.random.default_rng(5)
    ckpt = Path(write_ckpt(root / "ckpt", {"w": rand(rng, "U8", (4 * 1024 * 1024 + 512 * 1024,))},
                           companions={"config.json": b"{}"}))
    remote = root / "remote"
    ok(wdiff("push", "--anchor", ckpt, remote, "-q", env=user))
    (e,) = json.loads((remote / "chain.json").read_bytes())["entries"]
    return ckpt, remote, e


def pull_remote(root: Path, real: tuple, synthetic_size: int) -> Path:
    """49,999 synthetic entries in a line from their own anchor, then the real
    anchor as the head. With tiny synthetic entries (64 bytes, the smallest
    bundle) the cheapest-first search must walk the whole line before it
    reaches the real anchor (3.2 MB of line < 4.7 MB of anchor); with huge
    ones it reaches the real anchor at once (the baseline)."""
    ckpt, src, e = real
    entries, _ = line(MAX_ENTRIES - 1, size=synthetic_size)
    entries.append(e)
    write_remote(root, entries, e["version"])
    for p in e["parts"]:
        dest = root / p["path"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / p["path"], dest)
    return root


def test_pull_on_a_chain_of_max_entries(tmp_path, user, real_anchor):
    ckpt, _, e = real_anchor
    assert e["size"] > 64 * (MAX_ENTRIES - 1)
    hostile = pull_remote(tmp_path / "hostile", real_anchor, 64)
    easy = pull_remote(tmp_path / "easy", real_anchor, 10**12)
    baseline = measure("pull", easy, tmp_path / "d0", "-q", "-j", "2", env=user)
    run = measure("pull", hostile, tmp_path / "d1", "-q", "-j", "2", env=user)
    check_budget(run, baseline)
    assert tree(tmp_path / "d1") == tree(ckpt)
