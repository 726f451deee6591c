"""Many writers, one version: 8 real writer processes stage their shards,
one commit publishes them, and a reader polling the chain meanwhile never
sees a partial version."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from factory import mutate, rand, tree, write_ckpt
from kit.cli import argv, environment
from test_gc import GC_ENV, cli

import wdiff
from wdiff.format.chain import Chain

#: eight real writer processes and a polling reader
pytestmark = pytest.mark.slow

N = 8


def shard(k: int) -> str:
    return f"model-{k + 1:05d}-of-{N:05d}.safetensors"


def versions(tmp_path: Path) -> list[Path]:
    rng = np.random.default_rng(8)
    t = {f"layer.{i}.w": rand(rng, "BF16", (64, 32)) for i in range(N)}
    out = []
    for k in range(2):
        out.append(Path(write_ckpt(tmp_path / f"v{k}", t, shards=N, companions={"config.json": f'{{"v": {k}}}'.encode()})))
        t = {n: mutate(x, 0.02, rng) for n, x in t.items()}
    return out


def writers(src: Path, base: Path, remote: Path, stage: str, hosts) -> list[subprocess.CompletedProcess]:
    procs = []
    for k in hosts:
        only = ["--only", shard(k)] + (["--only", "*.json"] if k == 0 else [])
        procs.append(subprocess.Popen(argv("push", src, remote, "--base", base, *only, "--stage", stage, "--json"),
                                      env=environment(GC_ENV), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    done = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


def test_eight_writers_one_version_and_a_reader_never_sees_part_of_it(tmp_path):
    v0, v1 = versions(tmp_path)
    remote = tmp_path / "remote"
    cli("push", "--anchor", v0, remote, "--label", "v0", "-q")
    before = (remote / "chain.json").read_bytes()
    stop = threading.Event()
    seen: list[tuple[bytes | None, int]] = []
    errors: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                c = Chain.decode((remote / "chain.json").read_bytes(), where="reader")
                seen.append((c.head, len(c.entries)))
                for e in c.entries:  # whatever the chain names is there, whole
                    for p in e.parts:
                        assert (remote / p.path).stat().st_size == p.size
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        # a host dies: 7 of 8 parts are staged, and nothing is visible
        done = writers(v1, v0, remote, "s1", range(N - 1))
        assert all(r.returncode == 0 for r in done), [r.stderr for r in done]
        docs = [json.loads(r.stdout) for r in done]
        assert {d["head"] for d in docs} == {wdiff.log(str(remote)).head.hex()}
        assert (remote / "chain.json").read_bytes() == before
        r = cli("commit", remote, "--stage", "s1", "--expect", N, want=3)
        assert "7 part(s)" in r.stderr
        assert (remote / "chain.json").read_bytes() == before
        # the dead host's rerun, and a second run of host 3, then the commit
        done = writers(v1, v0, remote, "s1", [N - 1, 3])
        assert all(r.returncode == 0 for r in done), [r.stderr for r in done]
        assert json.loads(done[1].stdout)["uploaded"] is False  # the same part again
        doc = json.loads(cli("commit", remote, "--stage", "s1", "--expect", N, "--label", "v1", "--json").stdout)
    finally:
        stop.set()
        t.join(timeout=30)
    assert not errors, errors
    assert doc["merged"] == N and doc["uploaded"] and doc["label"] == "v1"
    # the merged bundle is byte for byte the one a single host holding everything packs
    assert doc["bundle_id"] == wdiff.pack(v0, v1, tmp_path / "whole.wdb").bundle_id.hex()
    heads = {h for h, _ in seen}
    log = wdiff.log(str(remote))
    assert len(log.entries) == 2 and log.head.hex() == doc["version"]
    assert heads <= {log.entries[1].version, log.head}  # never anything but the old and the whole new version
    assert not (remote / "stage" / "s1").exists() or not any((remote / "stage" / "s1").iterdir())
    # the committed version is exactly v1: from the anchor and as a delta from v0
    cli("pull", remote, tmp_path / "fresh", "-q")
    assert tree(tmp_path / "fresh") == tree(v1)
    cli("pull", remote, tmp_path / "old", "--to", "v0", "-q")
    pulled = json.loads(cli("pull", remote, tmp_path / "old", "--json").stdout)
    assert not pulled["from_anchor"] and pulled["bundles"] == [doc["bundle_id"]]
    assert tree(tmp_path / "old") == tree(v1)
    # committing again changes nothing
    assert cli("commit", remote, "--stage", "s1", "--expect", N, want=3).returncode == 3


def test_overlapping_parts_and_a_stale_stage(tmp_path):
    v0, v1 = versions(tmp_path)
    remote = tmp_path / "remote"
    cli("push", "--anchor", v0, remote, "-q")
    cli("push", v1, remote, "--base", v0, "--only", "model-0000[1-5]-*", "--only", "*.json", "--stage", "x", "-q")
    cli("push", v1, remote, "--base", v0, "--only", "model-0000[5-8]-*", "--stage", "x", "-q")
    r = cli("commit", remote, "--stage", "x", "--expect", 2, want=5)
    assert "in two parts" in r.stderr
    # parts that miss a file of the base do not add up to the head
    cli("push", v1, remote, "--base", v0, "--only", "model-0000[1-4]-*", "--stage", "y", "-q")
    cli("push", v1, remote, "--base", v0, "--only", "model-0000[5-8]-*", "--stage", "y", "-q")
    r = cli("commit", remote, "--stage", "y", "--expect", 2, want=5)
    assert "not the head" in r.stderr
    assert len(wdiff.log(str(remote)).entries) == 1
    # a new shard that no writer holds: the sharded index the version carries names it
    rng = np.random.default_rng(9)
    t = {f"layer.{i}.w": rand(rng, "BF16", (64, 32)) for i in range(N + 1)}
    v2 = Path(write_ckpt(tmp_path / "v2", t, shards=N + 1, companions={"config.json": b"{}"}))
    cli("push", v2, remote, "--base", v0, "--only", "*.json", "--stage", "z", "-q")
    cli("push", v2, remote, "--base", v0, "--only", "model-*-of-00009.safetensors", "--only", "!model-00009-*",
        "--stage", "z", "-q")
    r = cli("commit", remote, "--stage", "z", "--expect", 2, want=3)
    assert "model-00009-of-00009.safetensors" in r.stderr and "no part holds" in r.stderr
    # a stage no commit finished is garbage for gc, deleted after the grace period
    g = json.loads(cli("gc", remote, "--keep-last", "1", "--json").stdout)
    assert g["pending"]["objects"] == 12 and g["deleted"]["objects"] == 0
    g = json.loads(cli("gc", remote, "--keep-last", "1", "--grace", "0", "--json").stdout)
    assert g["deleted"]["objects"] == 12
    assert not [p for p in (remote / "stage").rglob("*") if p.is_file()]
    assert cli("push", v1, remote, "--only", "x", "--base", v0, want=2).returncode == 2  # --only needs --stage
