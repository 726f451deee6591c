"""The host's half of the vLLM backend (wdiff.integrations.vllm.mirror): no
vLLM and no torch needed. What an update hands a model, and the attacks on
the host's cache (shared/THREATS.md), driven through the real pulls of a
directory remote."""

import json
import os
import threading

import numpy as np
import pytest

import wdiff
from wdiff.bench import vllm as bv
from wdiff.errors import BaseMismatchError, IntegrityError
from wdiff.format import signature as signing
from wdiff.integrations.vllm.mirror import Mirror
from wdiff.integrations.vllm.tables import group_of, hash_table, plan

CFG = bv.llama_config(hidden=64, heads=1, kv_heads=1, inter=128)
LAYER0 = ["model.layers.0.self_attn.q_proj.weight"]
ONE = "model.layers.1.self_attn.o_proj.weight"


@pytest.fixture
def chain(tmp_path):
    """v0 (anchor), v1 (1% of layer 0's q_proj, one element of layer 1's
    o_proj), v2 (layer 1's up_proj) on a directory remote."""
    w0 = bv.random_weights(CFG, seed=1)
    w1 = bv.sparse_step(w0, density=0.01, seed=2, names=LAYER0, one=ONE)
    w2 = bv.sparse_step(w1, density=0.01, seed=3, names=["model.layers.1.mlp.up_proj.weight"])
    d = {k: bv.write_model(str(tmp_path / k), CFG, w) for k, w in (("v0", w0), ("v1", w1), ("v2", w2))}
    remote = str(tmp_path / "remote")
    wdiff.push(d["v0"], remote, anchor=True, label="v0")
    wdiff.push(d["v1"], remote, base=d["v0"], label="v1")
    wdiff.push(d["v2"], remote, base=d["v1"], label="v2")
    return d, remote, {"v0": w0, "v1": w1, "v2": w2}


def _mirror(remote, tmp_path, **kw):
    return Mirror(remote, cache_dir=str(tmp_path / "cache"), threads=2, **kw)


def _update(m, d, held, version):
    goal = m.resolve(version)
    return m.update(goal, held, seed=(d["v0"], hash_table(d["v0"], threads=2).version))


def _names_of_layers(*layers):
    return [s.name for s in bv.tensor_specs(CFG) if group_of(s.name) in layers]


def test_an_update_hands_every_tensor_of_each_changed_layer_verified(tmp_path, chain):
    d, remote, w = chain
    m = _mirror(remote, tmp_path)
    held = hash_table(d["v0"], threads=2)
    target, staged = _update(m, d, held, "v1")
    # layer 0 changed in one tensor, layer 1 in one element: every tensor of both layers
    assert sorted(staged.names) == sorted(_names_of_layers("model.layers.0", "model.layers.1"))
    assert "model.embed_tokens.weight" not in staged.names
    for n in staged.names:
        assert bytes(staged.view(n)) == w["v1"][n].tobytes(), n
    assert target.version == hash_table(d["v1"], threads=2).version
    staged.close()
    # seeded from the engine's own checkpoint: the anchor was never downloaded, and the
    # copy is a copy (patched in place), never a link to the engine's files
    copy = os.path.join(m.ckpt, "model.safetensors")
    assert os.stat(copy).st_ino != os.stat(os.path.join(d["v0"], "model.safetensors")).st_ino
    assert hash_table(d["v0"], threads=2).version == held.version  # the engine's checkpoint is untouched
    # nothing to hand when the versions hold the same bytes
    assert plan(target, target) == []


def test_a_version_of_another_model_is_refused_before_anything_is_read(tmp_path, chain):
    d, remote, w = chain
    held = hash_table(d["v0"], threads=2)
    other = bv.llama_config(hidden=64, heads=1, kv_heads=1, inter=96)
    wo = bv.random_weights(other, seed=5)
    bv.write_model(str(tmp_path / "o"), other, wo)
    wdiff.push(str(tmp_path / "o"), remote, base=d["v2"], label="other")
    m = _mirror(remote, tmp_path)
    with pytest.raises(BaseMismatchError, match="not a version of the engine's model"):
        _update(m, d, held, "other")
    # a part of the model (one tensor fewer): the same
    part = dict(w["v2"])
    del part["lm_head.weight"]
    os.makedirs(tmp_path / "p")
    specs = [s for s in bv.tensor_specs(CFG) if s.name in part]
    from wdiff.store.sample import write_safetensors

    write_safetensors(str(tmp_path / "p" / "model.safetensors"), specs, lambda s: part[s.name].view(np.uint8))
    wdiff.push(str(tmp_path / "p"), remote, base=str(tmp_path / "o"), label="part")
    with pytest.raises(BaseMismatchError, match="lm_head.weight"):
        _update(m, d, held, "part")


def test_a_corrupt_part_raises_and_the_copy_stays_at_its_version(tmp_path, chain):
    d, remote, w = chain
    held = hash_table(d["v0"], threads=2)
    m = _mirror(remote, tmp_path)
    _update(m, d, held, "v1")[1].close()
    with open(os.path.join(remote, "chain.json")) as f:
        v2 = next(e for e in json.load(f)["entries"] if e["label"] == "v2")
    part = os.path.join(remote, v2["parts"][0]["path"])
    data = bytearray(open(part, "rb").read())
    data[len(data) // 2] ^= 0x40
    open(part, "wb").write(bytes(data))
    with pytest.raises(IntegrityError, match="damaged"):
        _update(m, d, held, "v2")
    assert m._recorded() == hash_table(d["v1"], threads=2).version
    assert hash_table(m.ckpt, threads=2).version == hash_table(d["v1"], threads=2).version


def test_a_copy_changed_on_disk_is_restored_before_a_byte_is_handed(tmp_path, chain):
    """Class 1 and 3: the copy's record says v1 and the manifest cache may
    still vouch for the file (size and times put back); what is handed on
    is v1's bytes all the same."""
    d, remote, w = chain
    held = hash_table(d["v0"], threads=2)
    m = _mirror(remote, tmp_path)
    before, staged = _update(m, d, held, "v1")
    staged.close()
    f = os.path.join(m.ckpt, "model.safetensors")
    st = os.stat(f)
    with open(f, "r+b") as fh:  # in place, as an mmap writer would
        fh.seek(st.st_size - 10)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 1]))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    # the tensors are checked as they are read, whatever said the copy was v1
    with m.locked(), pytest.raises(IntegrityError, match="does not hold the bytes its version names"):
        m.stage(before, list(before.rows))
    target, staged = _update(m, d, held, "v1")
    for n in staged.names:
        assert bytes(staged.view(n)) == w["v1"][n].tobytes(), n
    assert hash_table(m.ckpt, threads=2).version == target.version


def test_links_planted_in_the_cache_are_refused(tmp_path, chain):
    d, remote, w = chain
    held = hash_table(d["v0"], threads=2)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_bytes(b"mine")
    m = _mirror(remote, tmp_path)
    os.makedirs(m.root, mode=0o700)
    os.symlink(victim, m.ckpt)  # the copy, a link to someone's directory
    with pytest.raises(IntegrityError, match="not a directory"):
        _update(m, d, held, "v1")
    assert sorted(os.listdir(victim)) == ["keep"] and (victim / "keep").read_bytes() == b"mine"
    os.unlink(m.ckpt)
    os.unlink(os.path.join(m.root, "lock"))
    os.symlink(victim / "lockfile", os.path.join(m.root, "lock"))  # the lock, a dangling link
    with pytest.raises(IntegrityError, match="symbolic link"):
        _update(m, d, held, "v1")
    assert sorted(os.listdir(victim)) == ["keep"]
    os.unlink(os.path.join(m.root, "lock"))
    os.rmdir(m.root)
    os.symlink(victim, m.root)  # the remote's folder itself
    with pytest.raises(IntegrityError, match="symbolic link"):
        _update(m, d, held, "v1")
    assert sorted(os.listdir(victim)) == ["keep"]


def test_a_signed_remote_is_followed_only_with_its_key(tmp_path):
    signing.generate(str(tmp_path / "key"))
    signing.generate(str(tmp_path / "other"))
    w0 = bv.random_weights(CFG, seed=1)
    w1 = bv.sparse_step(w0, density=0.01, seed=2, names=LAYER0)
    d = {k: bv.write_model(str(tmp_path / k), CFG, v) for k, v in (("v0", w0), ("v1", w1))}
    remote = str(tmp_path / "remote")
    wdiff.push(d["v0"], remote, anchor=True, sign_key=tmp_path / "key")
    wdiff.push(d["v1"], remote, base=d["v0"], sign_key=tmp_path / "key", label="v1")
    held = hash_table(d["v0"], threads=2)
    with pytest.raises(IntegrityError):
        _mirror(remote, tmp_path, trusted_keys=[str(tmp_path / "other.pub")]).resolve("v1")
    m = _mirror(remote, tmp_path, trusted_keys=[str(tmp_path / "key.pub")])
    target, staged = _update(m, d, held, "v1")
    assert bytes(staged.view(LAYER0[0])) == w1[LAYER0[0]].tobytes()


def test_the_workers_of_a_host_share_one_copy(tmp_path, chain):
    """Class 7: several workers (threads here, processes in vLLM: the same
    lock) update at once; each gets v1's bytes, one copy is kept."""
    d, remote, w = chain
    held = hash_table(d["v0"], threads=2)
    out, errors = [], []

    def worker():
        try:
            t, s = _update(_mirror(remote, tmp_path), d, held, "v1")
            out.append({n: bytes(s.view(n)) for n in s.names})
            s.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(out) == 4 and all(o == out[0] for o in out)
    assert all(out[0][n] == w["v1"][n].tobytes() for n in out[0])
    cache = tmp_path / "cache"
    assert len(os.listdir(cache)) == 1  # one folder for this remote


def test_the_cache_does_not_grow_over_updates(tmp_path, chain):
    """Class 8: what the host keeps stays the same over many updates."""
    d, remote, w = chain
    m = _mirror(remote, tmp_path)
    held = hash_table(d["v0"], threads=2)
    sizes = []
    for version in ["v1", "v2", "v1", "v2", "v0", "v2"] * 2:
        t, s = _update(m, d, held, version)
        s.close()
        held = t
        files = [os.path.join(dp, f) for dp, _, fs in os.walk(tmp_path / "cache") for f in fs]
        sizes.append((len(files), sum(os.path.getsize(f) for f in files)))
    assert len(set(sizes[2:])) == 1, sizes


def test_a_staging_buffer_still_in_use_is_never_reused(tmp_path, chain):
    """A loader that keeps a view of what it was handed (rather than a
    copy) must not see it overwritten by the next update."""
    d, remote, w = chain
    m = _mirror(remote, tmp_path)
    held = hash_table(d["v0"], threads=2)
    t1, s1 = _update(m, d, held, "v1")
    kept = s1.view(ONE)  # a view that outlives the update
    s1.close()
    t2, s2 = _update(m, d, t1, "v2")
    assert s2.buf is not s1.buf and bytes(kept) == w["v1"][ONE].tobytes()
    del kept
    s2.close()
    t3, s3 = _update(m, d, t2, "v1")
    assert s3.buf is s2.buf  # nothing held it: reused
