"""Threat model, class 5 (cost per byte of input): a reader's work per
DELTA record is bounded by the format, not by the record count.

A ZSTD_BASE record names a window of the base file that the reader reads,
hashes and loads as a zstd dictionary. One-byte records each naming the
same 64 MiB window were a valid bundle costing over 1,000 s of CPU per MB
(issue 33). man/wdiff-format.5 ("Window budget") now requires the windows
of a file's records, up to any record R, to sum to at most 4 times R's hi;
the reader refuses a record that passes it, status 4, before reading its
window, and the writer never writes one. The bundles here are written by
hand from the published format (wdiff.bench.hostile, which the benchmark
of the same name measures); the assertions are on the refusal and on the
records, never on time. The CPU per MB of each record type is measured by
``python -m wdiff.bench.hostile``.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import kit.trees
import numpy as np
import pytest
from threatlib import ok, user_env, wdiff

from wdiff.bench.hostile import delta_bundle, zstd_base

MiB = 1 << 20
RECORD = struct.Struct("<4sBBBBIIQQQQQQ16s16s16s")


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (.wdiff/ too) but wdiff's own lock (an in-place apply keeps it)."""
    return {p: data for p, data in kit.trees.tree(root, skip=()).items() if p != ".wdiff/lock"}


def windows(bundle: Path) -> list[tuple[int, int, int, int]]:
    """(file, hi, dlo, dhi) of every ZSTD_BASE record, read from the bytes
    as man/wdiff-format.5 lays them out."""
    data = bundle.read_bytes()
    end = struct.unpack("<Q", data[-48:-40])[0]
    out, at = [], 16
    while at < end:
        _m, typ, codec, _w, _p, file, _r, _lo, hi, _c, l0, l1, l2, *_ = RECORD.unpack_from(data, at)
        at += RECORD.size
        if typ == 4 and codec == 16:
            out.append((file, hi, *struct.unpack_from("<QQ", data, at)))
        at += l0 + l1 + l2
    return out


def over_budget(bundle: Path) -> list[str]:
    """The records that break the window budget: per file, the windows up to
    a record sum to more than 4 times its hi."""
    spent: dict[int, int] = {}
    bad = []
    for file, hi, dlo, dhi in windows(bundle):
        spent[file] = spent.get(file, 0) + dhi - dlo
        if spent[file] > 4 * hi:
            bad.append(f"file {file}: {spent[file]} window bytes up to {hi}")
    return bad


def refused(env, bundle: Path, A: Path, tmp: Path, record: int) -> None:
    """apply -o and apply --in-place both refuse with status 4 at ``record``,
    before any output, and leave A as it was."""
    before = tree(A)
    r = wdiff("apply", bundle, A, "-o", tmp / "OUT", env=env)
    assert r.rc == 4, str(r)
    assert f"record {record}:" in r.stderr and "window" in r.stderr, r.stderr
    assert not (tmp / "OUT").exists()
    r = wdiff("apply", bundle, A, "--in-place", env=env)
    assert r.rc == 4, str(r)
    assert tree(A) == before


@pytest.mark.slow
def test_one_window_named_over_and_over_is_refused_before_it_is_read(tmp_path):
    """The issue's bundle: one-byte records, each naming the whole base file
    as its window. The first record already names 2 MiB for 1 byte."""
    rng = np.random.default_rng(1)

    def make(base, target):
        recs = []
        for j in range(200):
            target[j] = base[j] ^ 1
            recs.append(zstd_base(1, j, bytes(target[j : j + 1]), base, 0, len(base)))
        return recs

    A, _, bundle = delta_bundle(tmp_path, rng.bytes(2 * MiB), make)
    assert len(windows(bundle)) == 200 and over_budget(bundle)
    refused(user_env(tmp_path / "u"), bundle, A, tmp_path, record=0)


def _two_records(second_dlo: int):
    """One-byte records ending at 256 KiB and 512 KiB: the first names
    [0, 1 MiB) (4 x 256 KiB, the whole budget), the second [second_dlo, 2 MiB)."""
    def make(base, target):
        recs = []
        for hi, (dlo, dhi) in ((256 * 1024, (0, MiB)), (512 * 1024, (second_dlo, 2 * MiB))):
            target[hi - 1] = base[hi - 1] ^ 1
            recs.append(zstd_base(1, hi - 1, bytes(target[hi - 1 : hi]), base, dlo, dhi))
        return recs
    return make


@pytest.mark.slow
def test_window_budget_holds_to_the_byte(tmp_path):
    """Windows summing to exactly 4 x hi apply; one byte more is refused at
    the record that passes the budget, after the one before it was fine."""
    rng = np.random.default_rng(2)
    base = rng.bytes(2 * MiB)
    env = user_env(tmp_path / "u")
    (tmp_path / "ok").mkdir()
    A, B, bundle = delta_bundle(tmp_path / "ok", base, _two_records(MiB))
    assert over_budget(bundle) == []
    ok(wdiff("apply", bundle, A, "-o", tmp_path / "ok" / "OUT", env=env))
    assert tree(tmp_path / "ok" / "OUT") == tree(B)

    (tmp_path / "over").mkdir()
    A, _, bundle = delta_bundle(tmp_path / "over", base, _two_records(MiB - 1))
    assert len(over_budget(bundle)) == 1
    refused(env, bundle, A, tmp_path / "over", record=1)


@pytest.mark.slow
def test_windows_that_repeat_count_each_time(tmp_path):
    """A repeated window is no cheaper to name: records every 64 KiB, each
    naming the same 256 KiB window (4 x 64 KiB), keep the budget only while
    the window is new; the second use of it passes the budget."""
    rng = np.random.default_rng(3)

    def make(base, target):
        recs = []
        for hi in (256 * 1024, 320 * 1024):
            target[hi - 1] = base[hi - 1] ^ 1
            recs.append(zstd_base(1, hi - 1, bytes(target[hi - 1 : hi]), base, 0, MiB))
        return recs

    A, _, bundle = delta_bundle(tmp_path, rng.bytes(2 * MiB), make)
    refused(user_env(tmp_path / "u"), bundle, A, tmp_path, record=1)


# -- the writer keeps the budget -------------------------------------------------------


def _tokenizer(rng) -> tuple[bytes, bytes]:
    """A tokenizer.json-like file of 3 MiB, and an edit: a token added near
    its start (everything after it shifts)."""
    words = [f'"tok{k}_{rng.integers(1 << 30)}": {k}' for k in range(120000)]
    a = ('{"model": {"vocab": {' + ", ".join(words) + "}}}").encode()[: 3 * MiB]
    cut = 100 * 1024
    return a, a[:cut] + b'"<added_token>": 99999, ' + a[cut:]


def _bin(rng) -> tuple[bytes, bytes]:
    """A pytorch_model.bin-like file of 24 MiB of fp32: 1% of the words
    moved, and 4 KiB inserted at 5 MiB."""
    a = (rng.standard_normal(6 * MiB) * 0.02).astype(np.float32)
    b = a.copy()
    idx = rng.choice(a.size, a.size // 100, replace=False)
    b[idx] = np.nextafter(a[idx], np.float32(1))
    raw = b.tobytes()
    return a.tobytes(), raw[: 5 * MiB] + rng.bytes(4096) + raw[5 * MiB :]


def _near(rng) -> tuple[bytes, bytes]:
    """An 8 MiB file whose first 1 MiB is rewritten from base bytes 1 MiB on,
    every 16th byte changed (no 32-byte run the base index could find): the
    writer's default zstd window for [0, 1 MiB) was [0, 5 MiB), 5 x hi."""
    a = rng.bytes(8 * MiB)
    head = np.frombuffer(a[MiB : 2 * MiB], dtype=np.uint8).copy()
    head[::16] ^= 0x5A
    return a, head.tobytes() + a[MiB:]


def _scattered(rng) -> tuple[bytes, bytes]:
    """A 16 MiB file where every other 1 MiB block is rewritten as _near's
    block 0 is, from base bytes 3 MiB away: default windows of 9 MiB for
    every 2 MiB of file."""
    a = rng.bytes(16 * MiB)
    b = bytearray(a)
    for k in range(0, 16, 2):
        src = ((k + 3) % 16) * MiB
        blk = np.frombuffer(a[src : src + MiB], dtype=np.uint8).copy()
        blk[::16] ^= 0x5A
        b[k * MiB : (k + 1) * MiB] = blk.tobytes()
    return a, bytes(b)


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["tokenizer", "bin", "near", "scattered"])
def test_pack_keeps_the_window_budget(tmp_path, shape):
    rng = np.random.default_rng(4)
    a, b = {"tokenizer": _tokenizer, "bin": _bin, "near": _near, "scattered": _scattered}[shape](rng)
    for name, data in (("A", a), ("B", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "w.bin").write_bytes(data)
    env = user_env(tmp_path / "u")
    ok(wdiff("pack", tmp_path / "A", tmp_path / "B", "-o", tmp_path / "d.wdiff", env=env))
    assert over_budget(tmp_path / "d.wdiff") == []
    if shape in ("near", "scattered"):
        assert windows(tmp_path / "d.wdiff"), "the shape no longer makes zstd records: it tests nothing"
    ok(wdiff("apply", tmp_path / "d.wdiff", tmp_path / "A", "-o", tmp_path / "OUT", env=env))
    assert tree(tmp_path / "OUT") == tree(tmp_path / "B")
    shutil.rmtree(tmp_path / "OUT")


@pytest.mark.slow
def test_the_benchmark_measures_every_case(tmp_path, capsys):
    """``python -m wdiff.bench.hostile`` at a small size: a row per case,
    the issue's bundle refused (4), every other one applied (0)."""
    from wdiff.bench import hostile

    assert hostile.main(["--size", "2MiB", "--records", "50", "--tensors", "64", "--keep", str(tmp_path)]) == 0
    rows = [cells for cells in (line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines())
            if len(cells) == 9 and cells[4].strip().isdigit()]
    got = {r[0].strip(): int(r[4]) for r in rows}
    assert got == {c: 4 if c == "delta-same-window" else 0 for c in hostile.CASES}, got
