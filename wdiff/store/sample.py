"""Synthetic checkpoints for the demo, the tests and the benchmark.

Writes safetensors files directly (numpy has no bfloat16), tensor by tensor,
so multi-gigabyte samples never sit in memory. The "RL step" model follows
what measurements of RL post-training show: at learning rates around 1e-6
most bf16 weights do not move at all, and those that move change by one unit
in the last place, at scattered positions.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from ..codec.dtypes import dtype_info


@dataclass(frozen=True)
class Spec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * dtype_info(self.dtype).bits // 8


def write_safetensors(path: str, specs: list[Spec], data: Callable[[Spec], np.ndarray], metadata: dict | None = None) -> None:
    """Write a safetensors file; ``data(spec)`` returns each tensor's bytes
    (any numpy array of the right size) when it is written."""
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    for s in specs:
        header[s.name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [off, off + s.nbytes]}
        off += s.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for s in specs:
            arr = np.ascontiguousarray(data(s))
            if arr.nbytes != s.nbytes:
                raise ValueError(f"{s.name}: {arr.nbytes} bytes, expected {s.nbytes}")
            f.write(arr.tobytes() if arr.nbytes < (1 << 20) else memoryview(arr).cast("B"))
    os.replace(tmp, path)


def bf16_normal(rng: np.random.Generator, n: int, scale: float = 0.02) -> np.ndarray:
    """bf16 bit patterns (uint16) of normal samples, rounded to nearest even."""
    u = (rng.standard_normal(n, dtype=np.float32) * np.float32(scale)).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def llama_specs(total_bytes: int, *, hidden: int | None = None, vocab: int | None = None) -> list[Spec]:
    """A llama-like bf16 layout of about ``total_bytes``: embeddings, then per
    layer attention and MLP projections and norms, then the final norm and head."""
    hidden = hidden or _pick_hidden(total_bytes)
    vocab = vocab or 8 * hidden
    inter = (8 * hidden // 3 + 63) // 64 * 64
    per_layer = 2 * (4 * hidden * hidden + 3 * hidden * inter + 2 * hidden)
    fixed = 2 * (2 * vocab * hidden + hidden)
    layers = max(1, round((total_bytes - fixed) / per_layer))
    specs = [Spec("model.embed_tokens.weight", "BF16", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        specs += [
            Spec(p + "input_layernorm.weight", "BF16", (hidden,)),
            Spec(p + "self_attn.q_proj.weight", "BF16", (hidden, hidden)),
            Spec(p + "self_attn.k_proj.weight", "BF16", (hidden, hidden)),
            Spec(p + "self_attn.v_proj.weight", "BF16", (hidden, hidden)),
            Spec(p + "self_attn.o_proj.weight", "BF16", (hidden, hidden)),
            Spec(p + "post_attention_layernorm.weight", "BF16", (hidden,)),
            Spec(p + "mlp.gate_proj.weight", "BF16", (inter, hidden)),
            Spec(p + "mlp.up_proj.weight", "BF16", (inter, hidden)),
            Spec(p + "mlp.down_proj.weight", "BF16", (hidden, inter)),
        ]
    specs += [Spec("model.norm.weight", "BF16", (hidden,)), Spec("lm_head.weight", "BF16", (vocab, hidden))]
    return specs


def _pick_hidden(total_bytes: int) -> int:
    for h in (4096, 2048, 1024, 512, 256, 128):
        if 2 * 40 * h * h <= total_bytes:
            return h
    return 64


def shard(specs: list[Spec], n: int) -> list[list[Spec]]:
    """Split into ``n`` shards of about equal bytes, keeping the order."""
    total = sum(s.nbytes for s in specs)
    out: list[list[Spec]] = [[] for _ in range(n)]
    acc = 0
    for s in specs:
        k = min(n - 1, acc * n // max(total, 1))
        out[k].append(s)
        acc += s.nbytes
    return [x for x in out if x]


def write_checkpoint(
    root: str,
    shards: list[list[Spec]],
    data: Callable[[Spec], np.ndarray],
    *,
    companions: dict[str, bytes] | None = None,
) -> None:
    """A Hugging Face style directory: model-0000k-of-0000n.safetensors, the
    index with its weight map, and companion files."""
    os.makedirs(root, exist_ok=True)
    n = len(shards)
    weight_map = {}
    total = 0
    for k, specs in enumerate(shards):
        fn = f"model-{k + 1:05d}-of-{n:05d}.safetensors" if n > 1 else "model.safetensors"
        write_safetensors(os.path.join(root, fn), specs, data, metadata={"format": "pt"})
        for s in specs:
            weight_map[s.name] = fn
            total += s.nbytes
    files = dict(companions or {})
    if n > 1:
        files["model.safetensors.index.json"] = (
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True) + "\n"
        ).encode()
    for name, content in files.items():
        with open(os.path.join(root, name), "wb") as f:
            f.write(content)


def rl_step(words: np.ndarray, density: float, rng: np.random.Generator) -> np.ndarray:
    """A copy of bf16 ``words`` where a ``density`` fraction of elements, at
    random positions, moved by one unit in the last place."""
    out = words.copy()
    k = int(round(density * words.size))
    if k:
        pos = rng.choice(words.size, size=k, replace=False) if k < words.size // 4 else np.flatnonzero(rng.random(words.size) < density)
        step = np.where(rng.random(pos.size) < 0.5, 1, -1).astype(np.int32)
        out[pos] = (out[pos].astype(np.int32) + step).astype(np.uint16)
    return out


def companion_files(step: int = 0) -> dict[str, bytes]:
    return {
        "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"}, indent=2).encode(),
        "generation_config.json": json.dumps({"do_sample": True, "temperature": 0.7, "wdiff_sample_step": step}, indent=2).encode(),
        "tokenizer_config.json": json.dumps({"model_max_length": 4096}, indent=2).encode(),
    }


def all_names(shards: Iterable[list[Spec]]) -> list[str]:
    return [s.name for sh in shards for s in sh]
