"""wdiff.live in one process: publishing from memory (the bundle is the one
pack writes from the same checkpoint on disk; the mirror is a loadable
checkpoint that `wdiff pull` reproduces), apply_into's checks and its undo,
iter_patches, many small tensors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from kit.cli import ok
from kit.digests import tensor_bytes as raw
from safetensors.torch import load_file

import wdiff
from wdiff.errors import BaseMismatchError, IntegrityError, UsageError, WdiffError
from wdiff.live import Publisher, apply_into, iter_patches
from wdiff.sync.fetch import download, read_chain
from wdiff.progress import SILENT
from wdiff.remotes import open_remote

sys.path.insert(0, os.path.dirname(__file__))
import specbundle as sb  # noqa: E402


def bf16_state(seed: int, n_big: int = 3, n_small: int = 300) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sd = {f"model.layers.{i}.weight": torch.randn(257, 300, generator=g).to(torch.bfloat16) for i in range(n_big)}
    sd.update({f"model.small.{i}.bias": torch.randn(31, generator=g).to(torch.bfloat16) for i in range(n_small)})
    sd["model.norm.weight"] = torch.randn(64, generator=g)  # fp32 beside bf16
    sd["model.step"] = torch.tensor(3, dtype=torch.int64)  # a 0-dim tensor
    return sd


def step(sd: dict, seed: int, density: float = 0.01) -> None:
    """An optimizer-like step: ~density of the elements move by a few ULPs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for k, t in sd.items():
            if t.dtype == torch.int64:
                t += 1
                continue
            m = torch.rand(t.shape, generator=g) < density
            t[m] = (t[m].float() * 1.01 + 1e-3).to(t.dtype)


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(raw(a[k]) == raw(b[k]) for k in a)


def head_bundle(remote, tmp_path) -> str:
    store = open_remote(str(remote))
    e = read_chain(store).entries[-1]
    work = tmp_path / f"dl-{e.bundle.hex()[:8]}"
    work.mkdir(exist_ok=True)
    return download(store, e, str(work), SILENT)[0]


@pytest.mark.slow
def test_publish_writes_the_bundle_pack_writes_and_a_loadable_mirror(tmp_path):
    sd = bf16_state(0)
    remote, mirror = tmp_path / "remote", tmp_path / "mirror"
    pub = Publisher(remote, mirror, files={"config.json": b'{"model_type": "test"}\n'})
    first = pub.publish(sd, label="step-0")
    assert first.anchor and first.parent is None and first.uploaded
    for s in range(1, 3):
        before = tmp_path / f"before{s}"
        shutil.copytree(mirror, before, ignore=shutil.ignore_patterns(".wdiff"))
        step(sd, s)
        res = pub.publish(sd, label=f"step-{s}")
        assert not res.anchor and res.parent is not None and res.changed_elements > 0
        # the mirror is the new version, as a safetensors reader sees it
        got = load_file(str(mirror / "model.safetensors"))
        assert got.keys() == sd.keys()
        for k, t in sd.items():
            assert raw(got[k]) == raw(t), k
        # and the bundle is byte for byte the one pack writes between the two checkpoints on disk
        packed = wdiff.pack(before, mirror, tmp_path / f"disk{s}.wdb")
        assert packed.bundle_id.hex() == res.bundle_id
        assert res.bundle_bytes < sum(t.numel() * t.element_size() for t in sd.values()) / 10
    assert sorted(os.listdir(mirror)) == [".wdiff", "config.json", "model.safetensors"]
    log = ok("log", remote, "--json")
    assert [e["label"] for e in json.loads(log.stdout)["entries"]][:3] == ["step-2", "step-1", "step-0"]
    # any other machine pulls exactly the mirror
    ok("pull", remote, tmp_path / "pulled")
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "pulled" / name).read_bytes() == (mirror / name).read_bytes()


def test_sharded_layout_and_tied_weights(tmp_path):
    sd = bf16_state(1, n_big=4, n_small=10)
    sd["lm_head.weight"] = sd["model.layers.0.weight"]  # tied: written once, as save_pretrained does
    pub = Publisher(tmp_path / "remote", tmp_path / "mirror", max_shard_size=300_000)
    pub.publish(sd)
    step(sd, 9)
    pub.publish(sd)
    names = sorted(p for p in os.listdir(tmp_path / "mirror") if not p.startswith("."))
    assert names[-1] == "model.safetensors.index.json" and names[0] == "model-00001-of-00004.safetensors"
    index = json.loads((tmp_path / "mirror" / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" not in index["weight_map"]
    total = 0
    for shard in sorted(set(index["weight_map"].values())):
        got = load_file(str(tmp_path / "mirror" / shard))
        for k, v in got.items():
            assert index["weight_map"][k] == shard and raw(v) == raw(sd[k])
            total += v.nbytes
    assert index["metadata"]["total_size"] == total
    # a follower with the same tied model: the alias follows its memory
    fol = {k: torch.zeros_like(v) for k, v in sd.items() if k != "lm_head.weight"}
    fol["lm_head.weight"] = fol["model.layers.0.weight"]
    for b in (0, 1):
        store = open_remote(str(tmp_path / "remote"))
        e = read_chain(store).entries[b]
        path = download(store, e, str(tmp_path), SILENT)[0]
        apply_into(path, fol)
    assert same(fol, sd)


def test_apply_into_follows_and_refuses_other_bases(tmp_path):
    sd = bf16_state(2)
    remote = tmp_path / "remote"
    pub = Publisher(remote, tmp_path / "mirror")
    v0 = pub.publish(sd).version
    fol = {k: torch.zeros_like(v) for k, v in sd.items()}
    res = apply_into(head_bundle(remote, tmp_path), fol)  # the anchor loads every tensor
    assert same(fol, sd) and res.version == v0
    step(sd, 1)
    v1 = pub.publish(sd).version
    b1 = head_bundle(remote, tmp_path)
    old = {k: v.clone() for k, v in fol.items()}
    with pytest.raises(BaseMismatchError):
        apply_into(b1, fol, base_version=v1)  # the receiver says it holds another version
    assert same(fol, old)
    # tensors that are not the base: the chunk's base digest refuses them before anything is written
    fol["model.layers.2.weight"].view(torch.int16)[5, 5] ^= 1
    with pytest.raises(BaseMismatchError):
        apply_into(b1, fol, base_version=v0)
    fol["model.layers.2.weight"].view(torch.int16)[5, 5] ^= 1
    assert same(fol, old)
    res = apply_into(b1, fol, base_version=v0)
    assert same(fol, sd) and res.version == v1 and res.changed_elements > 0
    with pytest.raises(WdiffError):
        apply_into(b1, fol, base_version=v1)  # never twice, never out of order
    # a live apply cannot change a shape
    bad = dict(fol)
    bad["model.layers.0.weight"] = torch.zeros(257, 299, dtype=torch.bfloat16)
    with pytest.raises(WdiffError):
        apply_into(head_bundle(remote, tmp_path), bad)


@pytest.mark.parametrize("budget", [1 << 28, 0])
def test_failed_apply_puts_every_tensor_back(tmp_path, budget):
    """Two live tensors that share memory (views of one buffer) while the
    publisher's do not are refused before a byte is written; a record that
    fails its read-back check after others were written puts every word
    written back (the undo entries in memory, or with budget 0 in a
    temporary file)."""
    g = torch.Generator().manual_seed(4)
    sd = {"a": torch.randn(4000, generator=g).to(torch.bfloat16)}
    sd["b"] = sd["a"][2000:].clone()
    sd["c"] = torch.randn(3000, generator=g).to(torch.bfloat16)
    remote = tmp_path / "remote"
    pub = Publisher(remote, tmp_path / "mirror")
    pub.publish(sd)
    anchor = head_bundle(remote, tmp_path)
    buf = torch.zeros(4000, dtype=torch.bfloat16)
    shared = {"a": buf, "b": buf[2000:], "c": torch.zeros(3000, dtype=torch.bfloat16)}
    fol = {k: torch.zeros_like(v) for k, v in shared.items()}
    apply_into(anchor, fol)
    assert same(fol, sd)
    with torch.no_grad():
        sd["a"][2100] += 1  # a changes in b's memory on the follower
        sd["b"][10] += 1
        sd["c"][7] += 1
    pub.publish(sd)
    before = {k: v.clone() for k, v in fol.items()}
    # views of one buffer under two names are refused before a byte is
    # written (patching one would change the other)
    with pytest.raises(UsageError, match="share memory"):
        apply_into(head_bundle(remote, tmp_path), shared, undo_budget=budget)
    assert torch.equal(buf, torch.zeros_like(buf))
    # a record whose target digest its words do not give, after others were
    # written: every word written goes back
    good = Path(head_bundle(remote, tmp_path))
    b = sb.parse(good.read_bytes())
    last = b.records[[i for i, r in enumerate(b.records) if r.type == 1 and r.codec != 0][-1]]
    last.target = bytes([last.target[0] ^ 1]) + last.target[1:]
    bad = tmp_path / "bad.wdb"
    bad.write_bytes(sb.serialize(b, fix_index=False))
    fol = {k: v.clone() for k, v in fol.items()}
    with pytest.raises(IntegrityError, match="put back"):
        apply_into(bad, fol, undo_budget=budget)
    assert same(fol, before)


def test_iter_patches_against_mirror_and_tensors(tmp_path):
    sd = bf16_state(5)
    remote, mirror = tmp_path / "remote", tmp_path / "mirror"
    pub = Publisher(remote, mirror)
    pub.publish(sd)
    base = {k: v.clone() for k, v in sd.items()}
    shutil.copytree(mirror, tmp_path / "base", ignore=shutil.ignore_patterns(".wdiff"))
    step(sd, 3)
    pub.publish(sd)
    bundle = head_bundle(remote, tmp_path)
    for src in (base, str(tmp_path / "base")):
        out = {k: v.clone() for k, v in base.items()}
        seen = set()
        for name, idx, values, shape in iter_patches(bundle, base=src):
            assert tuple(shape) == tuple(sd[name].shape) and idx.dtype == np.int32
            seen.add(name)
            flat = out[name].reshape(-1)
            if isinstance(values, torch.Tensor):
                assert values.dtype == sd[name].dtype
                flat[torch.from_numpy(idx).long()] = values
            else:  # numpy: bf16 as raw 16-bit words
                w = flat.view(torch.int16) if values.dtype.itemsize == 2 else flat.view(torch.int32 if values.dtype.itemsize == 4 else torch.int64)
                w[torch.from_numpy(idx).long()] = torch.from_numpy(values.view(f"i{values.dtype.itemsize}").copy())
        assert same(out, sd)
        assert "model.layers.0.weight" in seen and "model.step" in seen
    with pytest.raises(UsageError):
        list(iter_patches(bundle))  # a delta needs its base


@pytest.mark.slow
def test_numpy_tensors_and_20000_small_tensors(tmp_path):
    rng = np.random.default_rng(0)
    sd = {f"experts.{i}.w": rng.integers(0, 1 << 16, 48, dtype=np.uint16) for i in range(20_000)}
    sd["f32"] = rng.standard_normal(1000).astype(np.float32)
    remote = tmp_path / "remote"
    pub = Publisher(remote, tmp_path / "mirror")
    pub.publish(sd)
    fol = {k: np.zeros_like(v) for k, v in sd.items()}
    apply_into(head_bundle(remote, tmp_path), fol)
    for k in list(sd)[::7]:
        sd[k][rng.integers(0, sd[k].size)] ^= 3
    pub.publish(sd)
    t = time.perf_counter()
    res = apply_into(head_bundle(remote, tmp_path), fol)
    took = time.perf_counter() - t
    assert all(np.array_equal(fol[k], sd[k]) for k in sd)
    assert res.tensors_changed == len(list(sd)[::7])
    print(f"apply_into: {res.tensors_changed} of 20,001 tensors changed, {took * 1000:.0f} ms")


def test_background_publish_overlaps_the_next_step(tmp_path):
    """background=True: publish returns once packed (the tensors may change
    right away); the push and mirror update finish before the next publish,
    and every version on the remote is the tensors as they were then."""
    sd = bf16_state(6)
    remote = tmp_path / "remote"
    pub = Publisher(remote, tmp_path / "mirror", background=True)
    fol = {k: torch.zeros_like(v) for k, v in sd.items()}
    want = []
    for s in range(4):
        res = pub.publish(sd, label=f"step-{s}")
        assert res.uploaded is None
        want.append({k: v.clone() for k, v in sd.items()})
        step(sd, s + 20)  # the trainer goes on while the push runs
    done = pub.close()
    assert done.uploaded and done.label == "step-3"
    store = open_remote(str(remote))
    for s, e in enumerate(read_chain(store).entries):
        apply_into(download(store, e, str(tmp_path), SILENT)[0], fol)
        assert same(fol, want[s]), s
    got = load_file(str(tmp_path / "mirror" / "model.safetensors"))
    assert all(raw(got[k]) == raw(v) for k, v in want[-1].items())


STATE = """
import numpy as np

def numpy_state(steps):
    # the tensors of a trainer after `steps` steps (deterministic)
    rng = np.random.default_rng(0)
    sd = {f"w{i}": rng.integers(0, 1 << 16, (512, 1024), dtype=np.uint16) for i in range(16)}
    for s in range(steps):
        r = np.random.default_rng(s + 1)
        for v in sd.values():
            flat = v.reshape(-1)
            flat[r.integers(0, flat.size, flat.size // 100)] ^= 1
    return sd
"""
exec(STATE)

PUBLISHER = STATE + """
import sys, time
from wdiff.ops.apply import patch as patching
from wdiff.live import Publisher
patching.BATCH_BYTES = 1
real = patching.write_all
def slow(fd, data, off):
    time.sleep(0.02)
    real(fd, data, off)
patching.write_all = slow
remote, mirror, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
Publisher(remote, mirror, chunk=1 << 20).publish(numpy_state(steps), label=f"step-{steps}")
"""


@pytest.mark.slow
def test_publisher_killed_at_any_moment_recovers(tmp_path):
    """SIGKILL a publishing process at random moments (pack, push, the
    mirror's in-place update): the next publish finishes what was left
    (pushes the pending bundle, completes the mirror), and every version on
    the remote is a trainer state while the mirror is the head."""
    import signal

    remote, mirror = tmp_path / "remote", tmp_path / "mirror"
    Publisher(remote, mirror, chunk=1 << 20).publish(numpy_state(0), label="step-0")
    rng = np.random.default_rng(5)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", PUBLISHER, str(remote), str(mirror), "1"], check=True)
    probe = time.perf_counter() - t  # one whole publish, slowed
    for s in range(2, 7):
        p = subprocess.Popen([sys.executable, "-c", PUBLISHER, str(remote), str(mirror), str(s)])
        time.sleep(float(rng.uniform(0.3 * probe, 1.1 * probe)))
        p.send_signal(signal.SIGKILL)
        p.wait()
        left = [n for n, f in (("pending bundle", mirror / ".wdiff" / "live" / "pending.wdb"),
                               ("mirror mid-update", mirror / ".wdiff" / "txn" / "journal.json")) if f.exists()]
        print(f"killed {s}:", ", ".join(left) or "nothing pending")
    res = Publisher(remote, mirror, chunk=1 << 20).publish(numpy_state(7), label="step-7")
    store = open_remote(str(remote))
    chain = read_chain(store)
    assert chain.head.hex() == res.version
    states = [numpy_state(s) for s in range(8)]
    fol = {k: np.zeros_like(v) for k, v in states[0].items()}
    for e in chain.entries:  # each version is the trainer's at some step, in order
        apply_into(download(store, e, str(tmp_path), SILENT)[0], fol)
        assert any(all(np.array_equal(fol[k], st[k]) for k in fol) for st in states), e.label
    assert all(np.array_equal(fol[k], states[7][k]) for k in fol)
    got = load_file(str(mirror / "model.safetensors"))
    assert all(raw(got[k]) == states[7][k].tobytes() for k in fol)


def test_damaged_bundle_is_refused_before_anything_is_written(tmp_path):
    sd = bf16_state(8)
    remote = tmp_path / "remote"
    pub = Publisher(remote, tmp_path / "mirror")
    v0 = pub.publish(sd).version
    fol = {k: v.clone() for k, v in sd.items()}
    step(sd, 1)
    pub.publish(sd)
    good = head_bundle(remote, tmp_path)
    data = bytearray(open(good, "rb").read())
    for at in (200, len(data) // 2, len(data) - 100):  # records, payload, index
        bad = tmp_path / f"bad{at}.wdb"
        flipped = bytearray(data)
        flipped[at] ^= 0x10
        bad.write_bytes(flipped)
        before = {k: v.clone() for k, v in fol.items()}
        try:
            apply_into(bad, fol, base_version=v0)
        except WdiffError:
            pass
        else:  # a flip the format does not look at must still give the target
            assert same(fol, sd), at
            continue
        assert same(fol, before), at
    if not same(fol, sd):
        apply_into(good, fol, base_version=v0)
    assert same(fol, sd)


def test_signed_publish_and_a_follower_that_trusts_only_its_key(tmp_path):
    from wdiff.format import signature as signing
    from wdiff.live import Follower

    signing.generate(str(tmp_path / "k"))
    signing.generate(str(tmp_path / "other"))
    sd = bf16_state(9, n_small=20)
    remote = tmp_path / "remote"
    pub = Publisher(remote, tmp_path / "mirror", sign_key=tmp_path / "k")
    pub.publish(sd)
    step(sd, 2)
    pub.publish(sd)
    fol = {k: torch.zeros_like(v) for k, v in sd.items()}
    f = Follower(remote, fol, tmp_path / "f", trusted_keys=[str(tmp_path / "k.pub")])
    assert f.poll().bundles == 2 and same(fol, sd)
    with pytest.raises(WdiffError):
        Follower(remote, {k: torch.zeros_like(v) for k, v in sd.items()}, tmp_path / "g",
                 trusted_keys=[str(tmp_path / "other.pub")]).poll()
    # apply_into with trusted keys wants the bundle's own signature beside it
    with pytest.raises(WdiffError, match="minisig|signature|signed"):
        apply_into(head_bundle(remote, tmp_path), fol, trusted_keys=[str(tmp_path / "k.pub")])


def test_follower_far_behind_restarts_from_an_anchor_under_its_hook(tmp_path):
    import contextlib

    from wdiff.live import Follower

    sd = bf16_state(10, n_small=20)
    remote = tmp_path / "remote"
    pub = Publisher(remote, tmp_path / "mirror", anchor_every=4)
    fol = {k: torch.zeros_like(v) for k, v in sd.items()}
    paused = []

    @contextlib.contextmanager
    def pause():  # what an engine does: stop serving, resume after
        paused.append("in")
        yield
        paused.append("out")

    f = Follower(remote, fol, tmp_path / "f", hook=pause, max_behind=2)
    pub.publish(sd)
    assert f.poll().anchor and same(fol, sd) and paused == ["in", "out"]
    for s in range(5):  # publishes 2..6; the 4th also pushes an anchor of its version
        step(sd, 40 + s)
        pub.publish(sd)
    res = f.poll()  # 5 behind (> max_behind): from the newest anchor and the 2 deltas after it
    assert res.anchor and res.bundles == 3 and res.squashed and same(fol, sd)
    assert paused == ["in", "out"] * 2 and res.pause_seconds <= res.seconds
    step(sd, 50)
    pub.publish(sd)
    res = f.poll()
    assert not res.anchor and res.bundles == 1 and same(fol, sd)
