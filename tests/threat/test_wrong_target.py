"""Threat model: silent acceptance of a wrong target. A bundle whose index
says an unchanged companion file (source "base") has another size than the
base's copy, with every digest recomputed to match (target fingerprint,
index digest, bundle id): no file of that size has that digest, so the
target the index describes cannot be built. wdiff must refuse such a bundle
(exit 4) instead of copying the base's file and reporting the target as
verified; a directory it leaves behind must be exactly the target's
fingerprint or untouched.

The bundle is rewritten here from the published format (man/wdiff-format.5:
footer, index, fingerprint), not with wdiff's own code.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import xxhash

from factory import mutate, rand, tree, write_ckpt
from threatlib import fingerprint, ok, read_chain, read_index, user_env, wdiff, write_chain, write_index

INTEGRITY = 4
VOCAB = b"hello world\n" * 10  # unchanged between A and B


@pytest.fixture
def world(tmp_path):
    rng = np.random.default_rng(1)
    a = {"w": rand(rng, "BF16", (64, 64)), "v": rand(rng, "F32", (32,))}
    b = dict(a, w=mutate(a["w"], 0.05, rng))
    A = Path(write_ckpt(tmp_path / "A", a, companions={"vocab.txt": VOCAB, "config.json": b'{"step": 1}'}))
    B = Path(write_ckpt(tmp_path / "B", b, companions={"vocab.txt": VOCAB, "config.json": b'{"step": 2}'}))
    user = user_env(tmp_path / "user")
    honest = tmp_path / "honest.wdb"
    ok(wdiff("pack", A, B, "-o", honest, "-q", env=user))
    lie = tmp_path / "lie.wdb"
    head, index = read_index(honest)
    (f,) = [f for f in index["target"]["files"] if f["path"] == "vocab.txt"]
    assert f["source"] == "base" and f["size"] == len(VOCAB)
    f["size"] += 7
    index["target"]["fingerprint"] = fingerprint(index["target"]["files"])
    lie_id = write_index(lie, head, index)
    # (today `wdiff info lie.wdb` says "all digests verified")
    return {"tmp": tmp_path, "A": A, "B": B, "user": user, "lie": lie, "lie_id": lie_id,
            "lie_target": index["target"]["fingerprint"]}


def test_apply_refuses_an_unchanged_companion_whose_indexed_size_is_wrong(world):
    w = world
    out = w["tmp"] / "out"
    r = wdiff("apply", w["lie"], w["A"], "-o", out, env=w["user"])
    assert r.rc == INTEGRITY, str(r)
    assert not out.exists()


def test_in_place_apply_refuses_an_unchanged_companion_whose_indexed_size_is_wrong(world):
    w = world
    d = w["tmp"] / "D"
    shutil.copytree(w["A"], d)
    r = wdiff("apply", w["lie"], d, "--in-place", env=w["user"])
    assert r.rc == INTEGRITY, str(r)
    assert tree(d) == tree(w["A"])


def test_pull_refuses_a_served_bundle_whose_companion_size_is_wrong(world):
    """The remote's storage serves the crafted bundle as the next version
    (chain entry and object written by hand, as its owner can)."""
    w = world
    remote = w["tmp"] / "remote"
    ok(wdiff("push", "--anchor", w["A"], remote, "-q", env=w["user"]))
    chain = read_chain(remote)
    data = w["lie"].read_bytes()
    bid = w["lie_id"]
    part = f"objects/{bid[:2]}/{bid}.wdb"
    (remote / part).parent.mkdir(parents=True, exist_ok=True)
    (remote / part).write_bytes(data)
    chain["entries"].append({
        "bundle": bid, "version": w["lie_target"], "parent": chain["head"], "label": None,
        "created": "2026-01-01T00:00:00Z", "size": len(data),
        "parts": [{"path": part, "size": len(data), "digest": xxhash.xxh3_128_hexdigest(data)}],
    })
    chain["head"] = w["lie_target"]
    write_chain(remote, chain)
    d = w["tmp"] / "D"
    shutil.copytree(w["A"], d)
    r = wdiff("pull", remote, d, env=w["user"])
    assert r.rc == INTEGRITY, str(r)
    assert tree(d) == tree(w["A"])
