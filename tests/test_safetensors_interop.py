"""What wdiff writes, read back by the reference implementation.

wdiff parses and writes safetensors files with its own code (a bounded
header parser for hostile input, byte ranges for the rest), so the files it
rebuilds are checked here by someone else's reader: ``safetensors`` itself.
The inputs are written by ``safetensors.numpy.save_file`` too, so its header
layout (ordering, padding, metadata) is the one being diffed and rebuilt.
bf16 is left out only because numpy has no such dtype; every other numpy
dtype the format names is in.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

import wdiff  # noqa: E402

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
          np.int64, np.uint64, np.bool_]


def _array(rng, dtype, shape) -> np.ndarray:
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def _step(rng, a: np.ndarray, density: float) -> np.ndarray:
    """``a`` with about ``density`` of its elements changed (at least one)."""
    b = a.copy()
    flat = b.reshape(-1)
    if flat.size == 0:
        return b
    idx = rng.choice(flat.size, size=max(1, int(flat.size * density)), replace=False)
    if b.dtype == np.bool_:
        flat[idx] = ~flat[idx]
    else:
        flat[idx] = _array(rng, b.dtype, (len(idx),))
        same = flat[idx] == a.reshape(-1)[idx]
        flat[idx[same]] = (flat[idx[same]] + 1) if b.dtype.kind in "iu" else flat[idx[same]] * 2 + 1
    return b


@pytest.fixture
def reference_pair(tmp_path):
    """A (two shards) and B: modified, unchanged, added, removed, retyped
    tensors of every dtype, 0-d and empty ones, both written by safetensors."""
    rng = np.random.default_rng(7)
    a, b = {}, {}
    for k, dt in enumerate(DTYPES):
        name = f"t{k:02d}.{np.dtype(dt).name}"
        a[name] = _array(rng, dt, (37, 11 + k))
        b[name] = _step(rng, a[name], 0.03)
    a["frozen"] = _array(rng, np.float32, (64, 8))
    b["frozen"] = a["frozen"].copy()
    a["scalar"] = np.array(3.5, dtype=np.float64)
    b["scalar"] = np.array(-1.25, dtype=np.float64)
    a["empty"] = np.zeros((0, 5), dtype=np.int32)
    b["empty"] = np.zeros((0, 5), dtype=np.int32)
    a["retyped"] = _array(rng, np.float32, (16, 4))
    b["retyped"] = a["retyped"].astype(np.float16)
    a["removed"] = _array(rng, np.int64, (9,))
    b["added"] = _array(rng, np.uint8, (3, 3, 3))
    A, B = tmp_path / "A", tmp_path / "B"
    A.mkdir()
    B.mkdir()
    names = sorted(a)
    save_file({n: a[n] for n in names[::2]}, str(A / "model-1.safetensors"), metadata={"format": "np"})
    save_file({n: a[n] for n in names[1::2]}, str(A / "model-2.safetensors"), metadata={"format": "np"})
    save_file(b, str(B / "model.safetensors"), metadata={"format": "np", "step": "2"})
    return A, B, b


def _same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = got[name]
        assert (g.dtype, g.shape) == (w.dtype, w.shape), name
        assert g.tobytes() == w.tobytes(), name  # bit for bit, NaN payloads and -0.0 included


@pytest.mark.parametrize("mode", ["copy", "in-place"])
def test_safetensors_reads_what_apply_writes(reference_pair, tmp_path, mode):
    A, B, want = reference_pair
    bundle = tmp_path / "step.wdb"
    wdiff.pack(A, B, bundle, threads=2)
    if mode == "copy":
        out = tmp_path / "OUT"
        wdiff.apply(bundle, A, out, threads=2)
    else:
        out = tmp_path / "live"
        shutil.copytree(A, out)
        wdiff.apply(bundle, out, in_place=True, threads=2)
    assert sorted(p for p in os.listdir(out) if not p.startswith(".")) == ["model.safetensors"]
    path = str(out / "model.safetensors")
    _same(load_file(path), want)
    with safe_open(path, framework="numpy") as f:
        assert f.metadata() == {"format": "np", "step": "2"}
        assert sorted(f.keys()) == sorted(want)
        for name in f.keys():
            assert f.get_tensor(name).tobytes() == want[name].tobytes(), name


def test_safetensors_reads_an_anchor_rebuilt_from_nothing(reference_pair, tmp_path):
    _, B, want = reference_pair
    anchor = tmp_path / "anchor.wdb"
    wdiff.pack(None, B, anchor, threads=2)
    wdiff.apply(anchor, None, tmp_path / "OUT", threads=2)
    _same(load_file(str(tmp_path / "OUT" / "model.safetensors")), want)
