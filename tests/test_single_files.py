"""A single .safetensors file where a checkpoint is accepted: diff, pack
and apply of two versions of one file, whatever their names."""

from __future__ import annotations

import os

import numpy as np
import pytest

import wdiff
from factory import mutate, rand, write_ckpt
from wdiff.errors import BaseMismatchError, UsageError


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(31)
    w = {"lora_A": rand(rng, "F32", (16, 64)), "lora_B": rand(rng, "BF16", (64, 16))}
    a = write_ckpt(tmp_path / "a", w)
    b = write_ckpt(tmp_path / "b", dict(w, lora_A=mutate(w["lora_A"], 0.1, rng)))
    fa, fb = tmp_path / "adapter-step1.safetensors", tmp_path / "adapter-step2.safetensors"
    os.rename(os.path.join(a, "model.safetensors"), fa)
    os.rename(os.path.join(b, "model.safetensors"), fb)
    return fa, fb


def test_diff_two_files(files):
    fa, fb = files
    d = wdiff.diff(fa, fb)
    assert [t.name for t in d.tensors if t.status == "modified"] == ["lora_A"]
    assert not d.files and not d.layout_changed  # the names differ: two versions of one file
    assert not wdiff.diff(fa, fa).differs


def test_pack_and_apply_files(files, tmp_path):
    fa, fb = files
    r = wdiff.pack(fa, fb, tmp_path / "d.wdb")
    assert r.changed_elements > 0 and "raw" not in r.codecs
    copy = tmp_path / "renamed.safetensors"
    copy.write_bytes(fa.read_bytes())
    wdiff.apply(tmp_path / "d.wdb", copy, tmp_path / "new.safetensors")
    assert (tmp_path / "new.safetensors").read_bytes() == fb.read_bytes()
    with pytest.raises(UsageError):  # the result is a new file
        wdiff.apply(tmp_path / "d.wdb", copy, tmp_path / "new.safetensors")
    with pytest.raises(UsageError):
        wdiff.apply(tmp_path / "d.wdb", copy, in_place=True)
    with pytest.raises(BaseMismatchError):  # another file is not the base
        wdiff.apply(tmp_path / "d.wdb", fb, tmp_path / "x.safetensors")
    assert not os.path.exists(tmp_path / "x.safetensors")
    assert sorted(os.listdir(tmp_path)) == sorted(["a", "b", "adapter-step1.safetensors", "adapter-step2.safetensors",
                                                   "d.wdb", "renamed.safetensors", "new.safetensors"])
