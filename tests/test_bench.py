"""``python -m wdiff.bench``: CPU per byte and the thread sweep (issue 31).
Each wdiff row runs at every count of --threads and reports its CPU (from
wait4) per GB of what it reads and writes; the bundles of every count are
byte-identical, or the benchmark stops; ``--pair`` measures two given
checkpoints and leaves them as they were."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from kit.trees import snapshot

from wdiff.bench import APPLY, APPLY1, DIFF, FLOOR, PACK, PACK1, SWEPT, check_reproducible, file_digest, thread_counts
from wdiff.parallel import default_threads


def _bench(*args: str) -> list[dict]:
    p = subprocess.run([sys.executable, "-m", "wdiff.bench", "--runs", "1", "--no-peers", "--json", *args],
                       check=False, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def _bytes(d) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if not f.startswith("."))


@pytest.mark.slow
def test_cpu_per_byte_and_the_thread_sweep(tmp_path):
    work = tmp_path / "work"
    rows = _bench("--size", "8MB", "--shards", "2", "--scenario", "rl1", "--no-entropy", "--threads", "1,2",
                  "--dir", str(work))
    ab = _bytes(work / "A") + _bytes(work / "B-rl1")
    swept = [r for r in rows if r["op"] in SWEPT]
    assert sorted((r["op"], r["threads"]) for r in swept) == sorted((op, n) for op in SWEPT for n in (1, 2))
    assert all(r["threads"] is None for r in rows if r["op"] not in SWEPT)  # run once
    by = {(r["op"], r["threads"]): r for r in rows}
    for r in swept:
        assert r["cpu_seconds"] > 0, r
        # A and B read (apply: A read, B written), in GB of 1e9 bytes
        assert r["bytes"] == ab, r
        assert r["cpu_per_gb"] == pytest.approx(r["cpu_seconds"] / (ab / 1e9)), r
        one = by[r["op"], 1]
        assert r["speedup"] == (1.0 if r["threads"] == 1 else pytest.approx(one["seconds"] / r["seconds"])), r
    for op, ref in ((DIFF, FLOOR), (PACK1, FLOOR), (PACK, PACK1), (APPLY, APPLY1)):
        for n in (1, 2):
            r = by[op, n]
            assert r["cpu_ref"] == ref and r["cpu_vs"] == pytest.approx(r["cpu_seconds"] / by[ref, n]["cpu_seconds"])
    for op in (PACK1, PACK):
        assert by[op, 1]["bundle_bytes"] == by[op, 2]["bundle_bytes"] > 0
    startup = by["wdiff startup (--version)", None]
    assert startup["cpu_seconds"] > 0 and startup["cpu_per_gb"] is None and startup["speedup"] is None


@pytest.mark.slow
def test_a_given_pair_is_read_and_left_as_it_was(tmp_path):
    from wdiff.bench.scenarios import make_base, make_variant

    a, b = tmp_path / "pair" / "base", tmp_path / "pair" / "step-1"
    layout = make_base(str(a), 4 << 20, 2)
    make_variant(str(b), layout, "rl1")
    before = {d: snapshot(d, modes=True) for d in (a, b)}
    listing = sorted(os.listdir(tmp_path / "pair"))
    work = tmp_path / "work"
    rows = _bench("--pair", str(a), str(b), "--threads", "1", "--dir", str(work))
    assert {d: snapshot(d, modes=True) for d in (a, b)} == before
    assert sorted(os.listdir(tmp_path / "pair")) == listing
    assert not [f for f in os.listdir(work) if f in ("A", "A32") or f.startswith("B-")]  # nothing generated
    assert {r["scenario"] for r in rows} == {"step-1"}
    by = {r["op"]: r for r in rows}
    assert by[DIFF]["bytes"] == by[APPLY]["bytes"] == _bytes(a) + _bytes(b)
    given = by["entropy given the base"]
    assert given["changed"] > 0 and given["bundle_bytes"] > 0
    assert 0 < by[PACK]["bundle_bytes"] < _bytes(b) / 10
    assert by[PACK]["vs_floor"] is None  # the floor of bf16 words is not assumed of a given pair


def test_bundles_that_differ_between_thread_counts_stop_the_benchmark(tmp_path):
    one, other = tmp_path / "one.wdb", tmp_path / "other.wdb"
    one.write_bytes(b"WDB bundle" * 1000)
    other.write_bytes(b"WDB bundle" * 999 + b"WDB bundlf")
    check_reproducible(PACK, {1: file_digest(str(one)), 2: file_digest(str(one)), 4: file_digest(str(one))})
    with pytest.raises(SystemExit, match="wdiff pack: the bundles differ between thread counts"):
        check_reproducible(PACK, {1: file_digest(str(one)), 2: file_digest(str(other))})


def test_thread_counts():
    assert thread_counts("16,2,1,2") == [1, 2, 16]
    assert thread_counts("1,2,all") == sorted({1, 2, default_threads()})
    for bad in ("0", "two", "1,,2"):
        with pytest.raises(Exception, match="thread count|at least 1"):
            thread_counts(bad)


@pytest.mark.slow
def test_paired_rounds_give_each_command_and_the_three_ratios(tmp_path):
    """``python -m wdiff.bench.paired A B``: the six commands in turn, each
    one's CPU per GB and the bars' ratios, A and B left as they were."""
    from wdiff.bench.scenarios import make_base, make_variant

    a, b = tmp_path / "A", tmp_path / "B"
    make_variant(str(b), make_base(str(a), 4 << 20, 2), "rl1")
    before = {d: snapshot(d, modes=True) for d in (a, b)}
    p = subprocess.run([sys.executable, "-m", "wdiff.bench.paired", str(a), str(b), "--rounds", "2"],
                       check=False, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [line.split(" | ") for line in p.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r[0].strip("| ") for r in rows] == ["read + hash (floor)", "diff", "pack --format 1", "pack",
                                               "apply of the v1 bundle", "apply"]
    gb = (_bytes(a) + _bytes(b)) / 1e9
    for r in rows:
        assert float(r[1]) > 0 and float(r[2]) == pytest.approx(float(r[1]) / gb, rel=0.01, abs=0.002)
    ratios = {r[0].strip("| "): r[3].strip(" |") for r in rows}
    assert ratios["diff"].endswith("x read + hash (floor)") and ratios["pack"].endswith("x pack --format 1")
    assert ratios["apply"].endswith("x apply of the v1 bundle") and not ratios["read + hash (floor)"]
    assert {d: snapshot(d, modes=True) for d in (a, b)} == before


def test_paired_stops_at_a_command_that_fails(tmp_path):
    from wdiff.bench import paired

    with pytest.raises(SystemExit, match="failed: .*no-such"):
        paired.cpu_of([sys.executable, "-c", "import sys; sys.stderr.write('no-such thing'); sys.exit(2)"])
