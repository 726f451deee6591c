"""Small checkpoints made in code, for the tests. Nothing is downloaded."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
from kit import trees

from wdiff.codec.dtypes import dtype_info
from wdiff.store.sample import Spec, write_safetensors

#: every dtype the tests exercise, with a shape-compatible element size
DTYPES = ["BF16", "F16", "F32", "F64", "I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64", "BOOL",
          "F8_E4M3", "F8_E5M2", "C64"]


@dataclass(frozen=True)
class T:
    """A tensor as raw little-endian bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    @property
    def nbytes(self) -> int:
        return len(self.data)


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def rand(rng: np.random.Generator, dtype: str, shape) -> T:
    shape = tuple(shape)
    info = dtype_info(dtype)
    nbytes = numel(shape) * info.bits // 8
    if dtype == "BOOL":
        data = (rng.random(nbytes) < 0.5).astype(np.uint8).tobytes()
    elif dtype == "BF16":
        f = (rng.standard_normal(nbytes // 2).astype(np.float32) * 0.02).view(np.uint32)
        data = (f >> 16).astype(np.uint16).tobytes()
    elif dtype in ("F16", "F32", "F64", "C64"):
        np_t = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "C64": np.float32}[dtype]
        data = rng.standard_normal(nbytes // np.dtype(np_t).itemsize).astype(np_t).tobytes()
    else:
        data = rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    return T(dtype, shape, data)


def mutate(t: T, density: float, rng: np.random.Generator) -> T:
    """Change about ``density`` of the words of ``t`` (XOR with nonzero noise),
    at least one word when density > 0 and the tensor is not empty."""
    w = dtype_info(t.dtype).word
    n = len(t.data) // w
    if n == 0 or density <= 0:
        return t
    words = np.frombuffer(t.data, dtype={1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[w]).copy()
    k = max(1, int(round(density * n)))
    pos = rng.choice(n, size=min(k, n), replace=False)
    noise = rng.integers(1, 2 ** (8 * w) - 1, size=pos.size, dtype=words.dtype, endpoint=True)
    words[pos] ^= noise
    if t.dtype == "BOOL":
        words[pos] = 1 - (np.frombuffer(t.data, dtype=np.uint8)[pos] & 1)
    return T(t.dtype, t.shape, words.tobytes())


def write_ckpt(root, tensors: dict[str, T], *, shards: int = 1, companions: dict[str, bytes] | None = None,
               metadata: dict | None = None, groups: list[list[str]] | None = None) -> str:
    """Write a checkpoint directory; tensors are dealt round-robin to shards
    (in name order), or placed as ``groups`` says (one list of names per
    shard, in file order), with an index file when there is more than one."""
    root = os.fspath(root)
    os.makedirs(root, exist_ok=True)
    names = sorted(tensors)
    if groups is None:
        groups = [names[i::shards] for i in range(shards)] if shards > 1 else [names]
    shards = len(groups)
    weight_map = {}
    for k, group in enumerate(groups):
        fn = "model.safetensors" if shards == 1 else f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        specs = [Spec(n, tensors[n].dtype, tensors[n].shape) for n in group]
        write_safetensors(os.path.join(root, fn), specs, lambda s: np.frombuffer(tensors[s.name].data, dtype=np.uint8),
                          metadata=metadata if metadata is not None else {"format": "pt"})
        for n in group:
            weight_map[n] = fn
    files = dict(companions or {})
    if shards > 1:
        files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}, sort_keys=True).encode()
    trees.write_tree(root, files)
    return root


#: every file under a root (but .wdiff/) by relative path: kit.trees.tree,
#: by the name the tests have always imported it under
tree = trees.tree


def simple_pair(tmp_path, *, seed: int = 0, density: float = 0.01):
    """A small sharded pair: modified, frozen, added, removed, retyped tensors
    and a changed companion file. Returns (A, B) paths."""
    rng = np.random.default_rng(seed)
    a = {
        "embed": rand(rng, "BF16", (512, 256)),
        "layer.0.w": rand(rng, "BF16", (256, 256)),
        "layer.1.w": rand(rng, "F32", (128, 64)),
        "norm": rand(rng, "F32", (256,)),
        "scale": rand(rng, "F8_E4M3", (64,)),
        "gone": rand(rng, "F16", (10, 10)),
        "retype": rand(rng, "F32", (4, 4)),
        "scalar": rand(rng, "I64", ()),
        "empty": rand(rng, "F32", (0, 3)),
    }
    b = dict(a)
    del b["gone"]
    b["layer.0.w"] = mutate(a["layer.0.w"], density, rng)
    b["layer.1.w"] = mutate(a["layer.1.w"], density, rng)
    b["scale"] = mutate(a["scale"], 0.1, rng)
    b["retype"] = rand(rng, "BF16", (4, 4))
    b["new"] = rand(rng, "F32", (32, 8))
    A = write_ckpt(tmp_path / "A", a, shards=2, companions={"config.json": b'{"step": 1}'})
    B = write_ckpt(tmp_path / "B", b, shards=2, companions={"config.json": b'{"step": 2}', "tokenizer.json": b"{}"})
    return A, B
