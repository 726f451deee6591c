"""Going back along a chain: the inverse of a bundle (wdiff/ops/reverse.py)
turns its target back into its base bit for bit, through the ordinary
verified apply, and a pull --to an older version takes that way when it is
cheaper than an anchor (wdiff/sync/rollback.py).

Property: for random chains A -> B -> C over several dtypes and densities
(XOR-only steps, dense steps that pack as raw records, dropped, added and
retyped tensors, changed companion files, re-sharding), C goes back to B
and then to A through inverses, exactly; a corrupted inverse, or a
directory that is not the forward bundle's target, is refused."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from factory import mutate, rand, tree, write_ckpt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdiff
from wdiff.errors import BaseMismatchError, IntegrityError, WdiffError
from wdiff.ops.reverse import NotInvertible, build_inverse, local_older

DTYPES = ["BF16", "F16", "F32", "F64", "I64", "U8", "F8_E4M3", "BOOL"]
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def steps(draw):
    """(seed, tensors, per-step edits): a small checkpoint and two steps of change."""
    n = draw(st.integers(2, 5))
    tensors = [(draw(st.sampled_from(DTYPES)), draw(st.sampled_from([(0,), (), (7,), (33, 5), (300, 40)])))
               for _ in range(n)]
    edits = []
    for _ in range(2):
        edits.append({
            "density": draw(st.sampled_from([0.0, 0.001, 0.05, 0.3, 1.0])),
            "drop": draw(st.booleans()),
            "add": draw(st.booleans()),
            "retype": draw(st.booleans()),
            "config": draw(st.booleans()),
            "shards": draw(st.sampled_from([1, 2])),
        })
    return draw(st.integers(0, 2**16)), tensors, edits


def _chain(root: Path, recipe):
    seed, specs, edits = recipe
    rng = np.random.default_rng(seed)
    w = {f"t{i}": rand(rng, dt, shape) for i, (dt, shape) in enumerate(specs)}
    config = b'{"step": 0}'
    dirs = [write_ckpt(root / "v0", w, companions={"config.json": config})]
    for k, e in enumerate(edits, 1):
        w = {name: mutate(t, e["density"], rng) for name, t in w.items()}
        if e["drop"] and len(w) > 1:
            del w[sorted(w)[0]]
        if e["add"]:
            w[f"new{k}"] = rand(rng, "F32", (16, 3))
        if e["retype"]:
            name = sorted(w)[-1]
            w[name] = rand(rng, "BF16", (5, 4))
        if e["config"]:
            config = b'{"step": %d}' % k
        dirs.append(write_ckpt(root / f"v{k}", w, shards=e["shards"], companions={"config.json": config}))
    return dirs


def _inverse(fwd: str, producer: str, at: str, out: str, older_target: bytes):
    return build_inverse(fwd, at, out, older=local_older(producer, expect_target=older_target), threads=2)


@pytest.mark.slow
@SETTINGS
@given(steps())
def test_going_back_through_inverses_is_exact(recipe):
    root = Path(tempfile.mkdtemp())
    try:
        a, b, c = _chain(root, recipe)
        anchor = wdiff.pack(None, a, root / "a.wdb")
        ab = wdiff.pack(a, b, root / "ab.wdb")
        bc = wdiff.pack(b, c, root / "bc.wdb")
        live = root / "live"
        shutil.copytree(c, live)
        # C -> B: what bc lacks comes from ab, the bundle that produced B, or,
        # when ab took it from A (a header or file it kept), from B's anchor
        try:
            inv = _inverse(bc.bundle, ab.bundle, live, root / "cb.wdb", ab.target_fingerprint)
        except NotInvertible:
            assert not os.path.exists(root / "cb.wdb")
            b_anchor = wdiff.pack(None, b, root / "b.wdb")
            inv = _inverse(bc.bundle, b_anchor.bundle, live, root / "cb.wdb", ab.target_fingerprint)
        assert inv.base_fingerprint == bc.target_fingerprint and inv.target_fingerprint == bc.base_fingerprint
        wdiff.apply(inv.bundle, live, in_place=True)
        assert tree(live) == tree(b)
        # B -> A: what ab lacks comes from A's anchor
        inv = _inverse(ab.bundle, anchor.bundle, live, root / "ba.wdb", anchor.target_fingerprint)
        # a corrupted inverse is refused and leaves the directory as it was
        bad = root / "bad.wdb"
        data = bytearray(Path(inv.bundle).read_bytes())
        data[len(data) // 2] ^= 0x40
        bad.write_bytes(bytes(data))
        with pytest.raises(WdiffError) as err:
            wdiff.apply(bad, live, in_place=True)
        assert err.value.exit_code in (4, 5)
        assert tree(live) == tree(b)
        wdiff.apply(inv.bundle, live, in_place=True)
        assert tree(live) == tree(a)
        # a directory that is not the forward bundle's target yields no
        # inverse (what the builder computes from it fails A's digests), or
        # one that the apply refuses (the base fingerprint), leaving it as it was
        if ab.base_fingerprint != ab.target_fingerprint:
            try:
                wrong = _inverse(ab.bundle, anchor.bundle, live, root / "no.wdb", anchor.target_fingerprint)
            except (BaseMismatchError, IntegrityError):
                assert not os.path.exists(root / "no.wdb")
            else:
                with pytest.raises(BaseMismatchError):
                    wdiff.apply(wrong.bundle, live, in_place=True)
            assert tree(live) == tree(a)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _xor_step(root: Path):
    rng = np.random.default_rng(11)
    w = {"embed": rand(rng, "BF16", (256, 64)), "norm": rand(rng, "F32", (64,))}
    a = write_ckpt(root / "a", w, companions={"config.json": b"{}"})
    b = write_ckpt(root / "b", dict(w, embed=mutate(w["embed"], 0.01, rng)), companions={"config.json": b"{}"})
    return a, b


def test_an_rl_step_inverts_from_its_own_bundle_alone(tmp_path):
    """XOR records only, same layout: nothing else is needed, nor read."""
    a, b = _xor_step(tmp_path)
    ab = wdiff.pack(a, b, tmp_path / "ab.wdb")
    live = tmp_path / "live"
    shutil.copytree(b, live)
    inv = build_inverse(ab.bundle, live, tmp_path / "ba.wdb", older=None, threads=2)
    wdiff.apply(inv.bundle, live, in_place=True)
    assert tree(live) == tree(a)


def test_what_the_forward_bundle_lacks_is_asked_for(tmp_path):
    """A companion file the step replaced is not in the forward bundle: with
    no older source at hand the builder says so and writes nothing."""
    rng = np.random.default_rng(12)
    w = {"x": rand(rng, "F32", (64,))}
    a = write_ckpt(tmp_path / "a", w, companions={"config.json": b"1"})
    b = write_ckpt(tmp_path / "b", w, companions={"config.json": b"2"})
    ab = wdiff.pack(a, b, tmp_path / "ab.wdb")
    with pytest.raises(NotInvertible):
        build_inverse(ab.bundle, b, tmp_path / "ba.wdb", older=None, threads=2)
    assert not os.path.exists(tmp_path / "ba.wdb")


def _three_versions(tmp_path, *, gone: bool):
    rng = np.random.default_rng(13)
    w = {"embed": rand(rng, "BF16", (512, 256)), "norm": rand(rng, "F32", (64,))}
    if gone:
        w["gone"] = rand(rng, "F16", (8, 8))
    v = [w, dict(w, embed=mutate(w["embed"], 0.01, rng))]
    v.append({"embed": mutate(v[1]["embed"], 0.01, rng), "norm": w["norm"], "new": rand(rng, "F32", (8,))})
    dirs = [write_ckpt(tmp_path / f"v{k}", x, companions={"config.json": b'{"k": %d}' % k}) for k, x in enumerate(v)]
    remote = tmp_path / "remote"
    wdiff.push(dirs[0], remote, anchor=True, label="v0")
    wdiff.push(dirs[1], remote, base=dirs[0], label="v1")
    wdiff.push(dirs[2], remote, base=dirs[1], label="v2")
    live = tmp_path / "live"
    wdiff.pull(remote, live)
    return dirs, remote, live, {e.label: e.size for e in wdiff.log(remote).entries}


def test_pull_back_two_steps_costs_deltas(tmp_path):
    """HEAD~2 from the head: two inverses (a tensor added, a header and a
    companion file replaced on the way), pieces of the anchor, far less than
    the anchor; then forward again as usual."""
    dirs, remote, live, sizes = _three_versions(tmp_path, gone=False)
    res = wdiff.pull(remote, live, to="HEAD~2")
    assert tree(live) == tree(dirs[0])
    assert res.stepped_back and not res.from_anchor and len(res.bundles) == 2
    assert res.downloaded < sizes["v0"] // 4, (res.downloaded, sizes)
    res = wdiff.pull(remote, live)
    assert tree(live) == tree(dirs[2]) and not res.stepped_back


def test_pull_back_takes_the_anchor_when_a_step_cannot_be_undone(tmp_path):
    """v2 drops a tensor that v1 kept from v0 unchanged: its bytes are in no
    bundle of v1 but v0's anchor, two steps back, which reverse.py does not
    search for tensor bytes. The pull says so and rebuilds from the anchor,
    exactly."""
    dirs, remote, live, sizes = _three_versions(tmp_path, gone=True)
    res = wdiff.pull(remote, live, to="v1")
    assert tree(live) == tree(dirs[1])
    assert res.from_anchor and not res.stepped_back
