"""Tensor names scoped by their file's directory (format version 2), and
version 1 kept for every bundle whose base sources the scoping does not
change: two models in one tree, a tensor that moves between directories,
chains and squashes across both versions, in copy and in-place mode."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

import wdiff
from factory import mutate, rand, tree, write_ckpt
from wdiff.errors import FormatError
from wdiff.format.bundle import BundleReader


def _version(bundle) -> int:
    with open(bundle, "rb") as f:
        pre = f.read(16)
    with BundleReader(bundle) as r:
        assert r.index.version == struct.unpack_from("<I", pre, 8)[0]
        return r.index.version


def _two_models(root, policy, ref):
    write_ckpt(os.path.join(root, "policy"), policy, shards=2, companions={"config.json": b'{"r":"p"}'})
    write_ckpt(os.path.join(root, "ref"), ref, companions={"config.json": b'{"r":"r"}'})
    return root


@pytest.fixture
def models(tmp_path):
    rng = np.random.default_rng(11)
    names = ["model.embed", "model.norm", "lm_head"]
    policy = {n: rand(rng, "BF16", (64, 32)) for n in names}
    ref = {n: rand(rng, "BF16", (64, 32)) for n in names}
    p2 = dict(policy, **{"model.embed": mutate(policy["model.embed"], 0.05, rng)})
    p3 = dict(p2, **{"lm_head": mutate(p2["lm_head"], 0.05, rng)})
    return [_two_models(str(tmp_path / f"v{i}"), p, ref) for i, p in enumerate((policy, p2, p3), 1)]


def test_two_models_diff_with_qualified_names(models):
    d = wdiff.diff(models[0], models[1])
    changed = {t.name for t in d.tensors if t.status != "unchanged"}
    assert changed == {"policy/model.embed"}
    assert {t.name for t in d.tensors} == {f"{m}/{n}" for m in ("policy", "ref") for n in ("model.embed", "model.norm", "lm_head")}


@pytest.mark.parametrize("in_place", [False, True])
def test_two_models_pack_and_apply_exactly(models, tmp_path, in_place):
    a, b = models[0], models[1]
    r = wdiff.pack(a, b, tmp_path / "d.wdb")
    assert _version(tmp_path / "d.wdb") == 2
    assert r.changed_elements > 0 and r.codecs and "raw" not in r.codecs  # matched within each model, as deltas
    if in_place:
        import shutil

        live = tmp_path / "live"
        shutil.copytree(a, live)
        wdiff.apply(tmp_path / "d.wdb", live, in_place=True)
        assert tree(live) == tree(b)
    else:
        wdiff.apply(tmp_path / "d.wdb", a, tmp_path / "out")
        assert tree(tmp_path / "out") == tree(b)


def test_squash_of_version_2_bundles(models, tmp_path):
    wdiff.pack(models[0], models[1], tmp_path / "1.wdb")
    wdiff.pack(models[1], models[2], tmp_path / "2.wdb")
    wdiff.squash([tmp_path / "1.wdb", tmp_path / "2.wdb"], models[0], tmp_path / "s.wdb")
    assert _version(tmp_path / "s.wdb") == 2
    wdiff.apply(tmp_path / "s.wdb", models[0], tmp_path / "out")
    assert tree(tmp_path / "out") == tree(models[2])


def test_a_tensor_moving_between_directories(tmp_path):
    """Version 1 would patch it from its old directory; version 2 ships it
    whole, so the writer says version 2 and the result is exact."""
    rng = np.random.default_rng(12)
    w = rand(rng, "F32", (32, 32))
    a = write_ckpt(tmp_path / "a" / "old", {"w": w})
    b = write_ckpt(tmp_path / "b" / "new", {"w": mutate(w, 0.01, rng)})
    a, b = os.path.dirname(a), os.path.dirname(b)
    wdiff.pack(a, b, tmp_path / "d.wdb")
    assert _version(tmp_path / "d.wdb") == 2
    wdiff.apply(tmp_path / "d.wdb", a, tmp_path / "out")
    assert tree(tmp_path / "out") == tree(b)


def test_ordinary_and_distinct_name_trees_stay_version_1(tmp_path):
    """A model in a subdirectory, or a root model beside an adapter with
    other names: version 1, as before."""
    rng = np.random.default_rng(13)
    base = {"x": rand(rng, "BF16", (64, 64))}
    lora = {"lora.A": rand(rng, "F32", (8, 64))}
    for v, mut in (("a", 0.0), ("b", 0.05)):
        write_ckpt(tmp_path / v, {"x": mutate(base["x"], mut, rng)})
        write_ckpt(tmp_path / v / "adapter", {"lora.A": mutate(lora["lora.A"], mut, rng)})
        write_ckpt(tmp_path / f"sub-{v}" / "model", {"x": mutate(base["x"], mut, rng)})
    for a, b in (("a", "b"), ("sub-a", "sub-b")):
        wdiff.pack(tmp_path / a, tmp_path / b, tmp_path / f"{a}.wdb")
        assert _version(tmp_path / f"{a}.wdb") == 1
        wdiff.apply(tmp_path / f"{a}.wdb", tmp_path / a, tmp_path / f"out-{a}")
        assert tree(tmp_path / f"out-{a}") == tree(tmp_path / b)


def test_same_qualified_name_in_two_scopes_is_refused(tmp_path):
    rng = np.random.default_rng(14)
    write_ckpt(tmp_path / "a", {"p/x": rand(rng, "F32", (4,))})
    write_ckpt(tmp_path / "a" / "p", {"x": rand(rng, "F32", (4,))})
    with pytest.raises(FormatError, match="appears in both"):
        wdiff.diff(tmp_path / "a", tmp_path / "a")
