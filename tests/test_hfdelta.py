"""The field's delta layout, from outside: ``wdiff export`` of a real chain
replayed by a receiver written from the layout's description
(tests/hfdelta_ref.py, the strictest reader's rules), and ``wdiff pull
--layout hf-delta`` following a source that a writer written the same way
filled (slime-style, and ModelExpress-style opaque names). Every check is
bit for bit against the checkpoints the versions were made from."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy
import xxhash
import zstandard
from factory import mutate, rand, tree, write_ckpt
from hfdelta_ref import INDEX, Receiver, load_full, st_read, write_delta, write_full
from kit.cli import run as kit_run

WD = [sys.executable, "-m", "wdiff"]


def wd(*args, check: bool = True, env=None) -> subprocess.CompletedProcess:
    return kit_run(*args, env={"WDIFF_THREADS": "2", **(env or {})}, timeout=600, want=0 if check else None)


def snapshot(root) -> dict:
    """Every entry under ``root``: bytes of files, targets of links, folders; with inode numbers."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                out[rel] = ("dir",)
            else:
                with open(p, "rb") as f:
                    out[rel] = ("file", st.st_ino, f.read())
    return out


def ckpt_tensors(d) -> dict:
    """The tensors of a checkpoint folder, by the reference reader."""
    return load_full(str(d))


def steps(rng):
    """Five versions of a small model: sparse steps, a dense one, one that adds a tensor (not a delta)."""
    t = {"embed": rand(rng, "BF16", (512, 256)), "layer.0.w": rand(rng, "BF16", (256, 256)),
         "layer.1.w": rand(rng, "F32", (128, 64)), "norm": rand(rng, "F32", (256,)), "empty": rand(rng, "F32", (0, 3)),
         "scale": rand(rng, "F8_E4M3", (64,))}
    out = [dict(t)]
    t["layer.0.w"], t["norm"] = mutate(t["layer.0.w"], 0.01, rng), mutate(t["norm"], 0.5, rng)
    out.append(dict(t))
    t["embed"], t["scale"] = mutate(t["embed"], 0.3, rng), mutate(t["scale"], 0.1, rng)
    out.append(dict(t))
    t["extra"] = rand(rng, "F32", (16,))
    out.append(dict(t))
    t["layer.1.w"] = mutate(t["layer.1.w"], 0.02, rng)
    out.append(dict(t))
    return out


@pytest.fixture
def versions(tmp_path):
    dirs = []
    for i, t in enumerate(steps(np.random.default_rng(32))):
        dirs.append(write_ckpt(tmp_path / f"v{i}", t, shards=2, companions={"config.json": b'{"model": "tiny"}'}))
    return dirs


def push_all(remote, dirs) -> None:
    wd("push", "--anchor", dirs[0], remote, "-q")
    for prev, d in zip(dirs, dirs[1:]):
        wd("push", d, remote, "--base", prev, "-q")


def test_export_replays_exactly_and_grows_one_version_at_a_time(tmp_path, versions):
    R, OUT = tmp_path / "R", tmp_path / "OUT"
    push_all(R, versions[:4])
    doc = json.loads(wd("export", R, OUT, "--layout", "hf-delta", "--json").stdout)
    assert [(w["name"], w["full"]) for w in doc["written"]] == [
        ("weight_v000000", True), ("weight_v000001", False), ("weight_v000002", False), ("weight_v000003", True)]
    assert sorted(os.listdir(OUT)) == [".wdiff"] + [f"weight_v{i:06d}" for i in range(4)]
    # the full version is the checkpoint, file for file (and wdiff's ledger, where readers never look)
    assert tree(OUT / "weight_v000000") == tree(versions[0])
    # a receiver written from the layout's description replays every version exactly
    rx = Receiver(str(OUT), str(tmp_path / "engine"))
    for i in range(4):
        assert rx.pull(i) == i
        assert rx.tensors == ckpt_tensors(versions[i]), i
    # and so does wdiff's own pull: the directory is the checkpoint, byte for byte
    for i in (0, 2, 1, 3):
        wd("pull", OUT, tmp_path / "D", "--layout", "hf-delta", "--to", str(i), "-q")
        assert tree(tmp_path / "D") == tree(versions[i]), i
    # a second export writes nothing; a fifth push and a third export add one folder and change none
    before = snapshot(OUT)
    assert json.loads(wd("export", R, OUT, "--json").stdout)["up_to_date"] is True
    assert snapshot(OUT) == before
    wd("push", versions[4], R, "--base", versions[3], "-q")
    doc = json.loads(wd("export", R, OUT, "--json").stdout)
    assert [(w["name"], w["full"], w["tensors"]) for w in doc["written"]] == [("weight_v000004", False, 1)]
    after = snapshot(OUT)
    assert {k: v for k, v in after.items() if not k.startswith("weight_v000004")} == \
        {k: v for k, v in before.items()}
    assert rx.pull() == 4 and rx.tensors == ckpt_tensors(versions[4])


def test_deltas_list_exactly_what_changed_as_the_strictest_reader_reads_them(tmp_path, versions):
    R, OUT = tmp_path / "R", tmp_path / "OUT"
    push_all(R, versions[:3])
    wd("export", R, OUT, "-q")
    for i in (1, 2):
        d = OUT / f"weight_v{i:06d}"
        ix = json.loads((d / INDEX).read_bytes())
        meta = ix["metadata"]
        assert {k: meta[k] for k in ("version", "base_version", "delta_encoding", "compression_format",
                                     "checksum_format")} == {
            "version": f"{i:06d}", "base_version": f"{i - 1:06d}", "delta_encoding": meta["delta_encoding"],
            "compression_format": "zstd", "checksum_format": "xxh3-128"}
        assert meta["delta_encoding"] in ("xor", "overwrite")
        old, new = ckpt_tensors(versions[i - 1]), ckpt_tensors(versions[i])
        assert set(ix["weight_map"]) == {k for k in new if new[k] != old[k]}
        assert sorted(os.listdir(d)) == sorted([".wdiff", INDEX, *set(ix["weight_map"].values())])
        for shard in set(ix["weight_map"].values()):
            assert shard.startswith("model-") and shard.endswith(".safetensors")
            entries, sums = st_read((d / shard).read_bytes())
            assert set(entries) == {k for k, s in ix["weight_map"].items() if s == shard}
            lib = safetensors.numpy.load_file(d / shard)  # the reference library reads it too
            assert {k: v.tobytes() for k, v in lib.items()} == {k: e[2] for k, e in entries.items()}
            assert all(v.dtype == np.uint8 and v.ndim == 1 for v in lib.values())
            for name, (dtype, shape, blob) in entries.items():
                assert dtype == "U8" and shape == (len(blob),)
                params = zstandard.get_frame_parameters(blob)
                assert params.content_size != zstandard.CONTENTSIZE_UNKNOWN
                assert sums[name] == xxhash.xxh3_128_hexdigest(new[name][2])


def test_an_overwrite_export_round_trips(tmp_path, versions, monkeypatch):
    """Forced to the overwrite encoding (u32 count, positions, new bytes)."""
    from wdiff.interop.hfdelta import export as mod

    R, OUT = tmp_path / "R", tmp_path / "OUT"
    push_all(R, versions[:3])
    monkeypatch.setattr(mod, "encodings", lambda changed: ["overwrite"])
    res = mod.export(str(R), str(OUT))
    assert [w.encoding for w in res.written] == [None, "overwrite", "overwrite"]
    rx = Receiver(str(OUT), str(tmp_path / "engine"))
    for i in range(3):
        rx.pull(i)
        assert rx.tensors == ckpt_tensors(versions[i])


def test_an_output_of_another_history_is_refused_and_left_alone(tmp_path, versions):
    R1, R2, OUT = tmp_path / "R1", tmp_path / "R2", tmp_path / "OUT"
    push_all(R1, versions[:2])
    wd("push", "--anchor", versions[2], R2, "-q")
    wd("push", versions[3], R2, "--base", versions[2], "-q")
    wd("export", R1, OUT, "-q")
    before = snapshot(OUT)
    r = wd("export", R2, OUT, check=False)
    assert r.returncode == 5 and "another history" in r.stderr and r.stdout == ""
    assert snapshot(OUT) == before
    r = wd("export", R1, OUT, "--from", "HEAD~0", check=False)
    assert r.returncode == 2 and "--from" in r.stderr


def test_a_version_that_fails_its_check_never_becomes_visible(tmp_path, versions, monkeypatch):
    from wdiff.errors import IntegrityError
    from wdiff.interop.hfdelta import export as mod
    from wdiff.interop.hfdelta import writer

    R, OUT = tmp_path / "R", tmp_path / "OUT"
    push_all(R, versions[:2])
    real = writer.encode

    def flipped(changed, encoding, spool):
        spans = real(changed, encoding, spool)
        with open(spool, "r+b") as f:  # one bit of the last frame's payload
            off, n = spans[-1]
            f.seek(off + n - 5)
            b = f.read(1)
            f.seek(off + n - 5)
            f.write(bytes([b[0] ^ 1]))
        return spans

    monkeypatch.setattr(mod, "encode", flipped)
    with pytest.raises(IntegrityError):
        mod.export(str(R), str(OUT))
    assert sorted(os.listdir(OUT)) == [".wdiff", "weight_v000000"]  # no weight_v000001, no temporary


def test_pull_follows_a_slime_writer(tmp_path):
    """xor and overwrite, several writers, adler32, an empty version, a new full version; pulled one
    version at a time, by jumps, and backwards."""
    rng = np.random.default_rng(7)
    S = str(tmp_path / "S")
    os.makedirs(S)
    t = {f"w{i}": ("BF16", (64, 64), rand(rng, "BF16", (64, 64)).data) for i in range(6)}
    t["bias"] = ("F32", (64,), rand(rng, "F32", (64,)).data)
    truth = [dict(t)]
    write_full(S, 0, t, {"config.json": b"{}"})

    def step(density, names):
        new = dict(truth[-1])
        for k in names:
            dt, shape, raw = new[k]
            a = np.frombuffer(raw, np.uint8).copy()
            idx = rng.choice(a.size, max(1, int(density * a.size)), replace=False)
            a[idx] ^= rng.integers(1, 255, idx.size, dtype=np.uint8)
            new[k] = (dt, shape, a.tobytes())
        truth.append(new)
        return new

    write_delta(S, 1, truth[0], step(0.01, ["w0", "w1"]))
    write_delta(S, 2, truth[1], step(0.02, ["w2", "w3", "bias"]), encoding="overwrite", writers=2)
    truth.append(dict(truth[2]))
    write_delta(S, 3, truth[2], truth[3])  # nothing changed: an empty weight map
    write_delta(S, 4, truth[3], step(0.3, ["w4"]), checksum_format="adler32", writers=3)
    step(0.05, ["w5", "w0"])
    write_full(S, 5, truth[5], {"config.json": b"{}"})
    write_delta(S, 6, truth[5], step(0.01, ["w1"]), encoding="overwrite")
    D = tmp_path / "D"

    def check(i):
        assert load_full(str(D)) == {k: v for k, v in truth[i].items()}, i
        assert json.loads((D / ".wdiff" / "hfdelta.json").read_bytes())["version"] == f"{i:06d}"

    for i in range(5):
        doc = json.loads(wd("pull", S, D, "--layout", "hf-delta", "--to", str(i), "--json").stdout)
        assert doc["after"] == f"{i:06d}" and doc["seeded_from"] == ("000000" if i == 0 else None)
        check(i)
    doc = json.loads(wd("pull", S, D, "--layout", "hf-delta", "--json").stdout)  # the newest: 6, from the full 5
    assert (doc["seeded_from"], doc["deltas"]) == ("000005", ["000006"])
    check(6)
    wd("pull", S, D, "--layout", "hf-delta", "--to", "weight_v000002", "-q")  # back: from the full 0
    check(2)
    wd("pull", S, tmp_path / "E", "--layout", "hf-delta", "--to", "000004", "-q")
    assert load_full(str(tmp_path / "E")) == truth[4]


def test_pull_follows_opaque_version_names(tmp_path):
    """ModelExpress's variant: {prefix}/{version}/ with opaque names chained by base_version."""
    rng = np.random.default_rng(8)
    S = str(tmp_path / "S")
    os.makedirs(S)
    a = {"w": ("F32", (32, 32), rand(rng, "F32", (32, 32)).data)}
    b = {"w": ("F32", (32, 32), bytes(x ^ (i % 3 == 0) for i, x in enumerate(a["w"][2])))}
    c = {"w": ("F32", (32, 32), bytes(x ^ (i % 5 == 0) for i, x in enumerate(b["w"][2])))}
    write_full(S, 0, a, dirname="base-7f3a")
    write_delta(S, 0, a, b, version="step-b1", base="base-7f3a", checksum_format="adler32", dirname="step-b1")
    write_delta(S, 0, b, c, version="step-c9", base="step-b1", checksum_format="adler32", dirname="step-c9")
    doc = json.loads(wd("pull", S, tmp_path / "D", "--layout", "hf-delta", "--json").stdout)
    assert (doc["after"], doc["seeded_from"], doc["deltas"]) == ("step-c9", "base-7f3a", ["step-b1", "step-c9"])
    assert load_full(str(tmp_path / "D")) == c
    wd("pull", S, tmp_path / "D", "--layout", "hf-delta", "--to", "step-b1", "-q")
    assert load_full(str(tmp_path / "D")) == b


def test_export_keeps_the_smaller_encoding_of_a_very_sparse_step(tmp_path):
    from hfdelta_ref import encode

    rng = np.random.default_rng(3)
    a = {"w": rand(rng, "BF16", (512, 512)), "v": rand(rng, "BF16", (512, 512))}
    b = dict(a)
    raw = bytearray(a["w"].data)
    for i in (10, 9000, 300000):
        raw[i] ^= 1
    b["w"] = type(a["w"])(a["w"].dtype, a["w"].shape, bytes(raw))
    A, B = write_ckpt(tmp_path / "A", a), write_ckpt(tmp_path / "B", b)
    push_all(tmp_path / "R", [A, B])
    doc = json.loads(wd("export", tmp_path / "R", tmp_path / "OUT", "--json").stdout)
    chosen = doc["written"][1]["encoding"]
    sizes = {enc: len(encode(enc, a["w"].data, b["w"].data)) for enc in ("xor", "overwrite")}
    assert sizes[chosen] == min(sizes.values()), (chosen, sizes)
    rx = Receiver(str(tmp_path / "OUT"), str(tmp_path / "engine"))
    rx.pull()
    assert rx.tensors == ckpt_tensors(B)


def test_killed_at_any_moment_an_export_leaves_whole_versions_only(tmp_path):
    """SIGKILL at moments drawn over an uninterrupted export: OUT holds
    only whole versions (each replays exactly), the next export continues
    and leaves no temporary in OUT nor in the temporary directory."""
    import random
    import signal
    import time

    rng = np.random.default_rng(11)
    t = {f"layer.{i}.w": rand(rng, "BF16", (512, 1024)) for i in range(6)}
    dirs = []
    for i in range(4):
        dirs.append(write_ckpt(tmp_path / f"v{i}", t, shards=2))
        t = {k: mutate(v, 0.02, rng) for k, v in t.items()}
    R = tmp_path / "R"
    push_all(R, dirs)
    tmp = tmp_path / "tmp"
    os.makedirs(tmp)
    env = dict(os.environ, TMPDIR=str(tmp), NO_COLOR="1", WDIFF_THREADS="2")
    t0 = time.monotonic()
    wd("export", R, tmp_path / "probe", "-q", env=env)
    took = time.monotonic() - t0
    OUT = tmp_path / "OUT"
    pick = random.Random(32)
    seen = set()
    for _ in range(5):
        shutil.rmtree(OUT, ignore_errors=True)
        p = subprocess.Popen([*WD, "export", str(R), str(OUT), "-q"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        try:
            p.wait(timeout=pick.uniform(0.1, 1.0) * took)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            p.wait()
        held = sorted(n for n in os.listdir(OUT) if n.startswith("weight_v")) if OUT.exists() else []
        assert held == [f"weight_v{i:06d}" for i in range(len(held))]
        seen.add(len(held))
        shutil.rmtree(tmp_path / "engine", ignore_errors=True)  # a fresh receiver: it remembers its version
        rx = Receiver(str(OUT), str(tmp_path / "engine"))
        for i in range(len(held)):
            rx.pull(i)
            assert rx.tensors == ckpt_tensors(dirs[i])
        wd("export", R, OUT, "-q", env=env)  # goes on from there
        assert sorted(os.listdir(OUT)) == [".wdiff"] + [f"weight_v{i:06d}" for i in range(4)]
        assert tree(OUT) == tree(tmp_path / "probe")
    assert seen & {1, 2, 3}, seen  # some kills landed between two versions
    assert os.listdir(tmp) == []


def test_an_output_wdiff_did_not_write_is_refused(tmp_path, versions):
    """OUT is input: its folders, links and ledgers steer the numbering only
    once they check out; each planted one is refused and nothing written."""
    R, OUT = tmp_path / "R", tmp_path / "OUT"
    push_all(R, versions[:3])
    wd("export", R, OUT, "--to", "HEAD~1", "-q")
    base = snapshot(OUT)

    def refused(code: int, why: str) -> None:
        before = snapshot(OUT)
        r = wd("export", R, OUT, check=False)
        assert r.returncode == code and why in r.stderr, (r.returncode, r.stderr)
        assert snapshot(OUT) == before

    ledger = OUT / "weight_v000001" / ".wdiff" / "export.json"
    good = ledger.read_bytes()
    ledger.write_bytes(good.replace(b'"000001"', b'"x"'))
    refused(4, "not a number")
    doc = json.loads(good)
    doc["fingerprint"] = "0" * 32
    ledger.write_bytes(json.dumps(doc).encode())
    refused(5, "another history")
    ledger.write_bytes(good)
    os.symlink(OUT / "weight_v000001", OUT / "weight_v000002")
    refused(4, "not a folder")
    os.unlink(OUT / "weight_v000002")
    os.makedirs(OUT / "weight_v000003")
    refused(4, "weight_v000002 is missing")
    os.rmdir(OUT / "weight_v000003")
    os.rename(ledger, tmp_path / "moved")
    os.symlink(tmp_path / "moved", ledger)
    refused(4, "a symbolic link")
    os.unlink(ledger)
    os.rename(tmp_path / "moved", ledger)
    assert snapshot(OUT) == base
    wd("export", R, OUT, "-q")
    assert sorted(os.listdir(OUT)) == [".wdiff", "weight_v000000", "weight_v000001", "weight_v000002"]
    # a refused first export leaves no OUT behind
    assert wd("export", tmp_path / "R-empty-missing", tmp_path / "NEW", check=False).returncode == 3
    assert not (tmp_path / "NEW").exists()
