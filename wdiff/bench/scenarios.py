"""The benchmark's scenarios (see the package's docstring): the generated
checkpoints A and, per scenario, B, and the information in their delta.
Apart from the benchmark's command line so that importing ``wdiff.bench``
imports no numpy: ``python -m wdiff.bench.floor`` starts as wdiff's console
script does, and that only works before numpy's first import (see floor.py).
The children of generated.in_child run the ``_child_*`` functions here."""

from __future__ import annotations

import math
import zlib

import numpy as np

from ..store import sample

ADAM = {"adam0.5": 0.005, "adam1": 0.01, "adam3": 0.03, "adam6": 0.06, "adam20": 0.20}
SCENARIOS = (*ADAM, "adam-f32", "rl1", "rl3", "frozen", "dense", "new")
#: scenarios with a base of their own (not A)
OWN_BASE = {"adam-f32": "A32"}


def _seed(name: str, salt: int) -> int:
    return zlib.crc32(name.encode()) * 7919 + salt


def specs_for(size: int, tensors: int | None) -> list[sample.Spec]:
    """A llama-like layout, or ``tensors`` equal bf16 tensors of ``size`` in all."""
    if not tensors:
        return sample.llama_specs(size)
    per = max(1, size // tensors // 2)
    return [sample.Spec(f"t.{i:06d}", "BF16", (per,)) for i in range(tensors)]


def make_base(root: str, size: int, shards: int, tensors: int | None = None) -> list[list[sample.Spec]]:
    specs = specs_for(size, tensors)
    layout = sample.shard(specs, shards)
    sample.write_checkpoint(
        root, layout, lambda s: sample.bf16_normal(np.random.default_rng(_seed(s.name, 0)), s.nbytes // 2),
        companions=sample.companion_files(0),
    )
    return layout


def _master(old: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An fp32 master whose bf16 rounding is ``old``: its bit pattern plus an
    offset below half a bf16 ulp, in bit space (exact by construction)."""
    j = rng.integers(-0x7F00, 0x7F01, old.size, dtype=np.int64)
    bits = old.astype(np.int64) << 16
    j = np.where((bits & 0x7FFF0000) == 0, np.abs(j), j)  # no wrap below a zero
    return (bits + j).astype(np.uint32).view(np.float32)


def _bf16(x: np.ndarray) -> np.ndarray:
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _adam_lr(density: float) -> float:
    """The lr at which about ``density`` of bf16 N(0, 0.02) weights change:
    P(change) = E min(1, 2 lr / ulp) on a fixed reference sample."""
    ref = sample.bf16_normal(np.random.default_rng(12345), 1 << 18)
    ulp = np.ldexp(1.0, ((ref.astype(np.int64) >> 7) & 0xFF) - 127 - 7)
    lo, hi = 1e-12, 1.0
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if float(np.minimum(1.0, mid / ulp).mean()) < density:
            lo = mid
        else:
            hi = mid
    return lo


def _adam_step(n: int, lr: float, rng: np.random.Generator) -> np.ndarray:
    """About lr per element, random sign, magnitude 0.5 to 1.5 lr."""
    sign = np.where(rng.random(n, dtype=np.float32) < 0.5, np.float32(-1), np.float32(1))
    return (sign * (np.float32(0.5) + rng.random(n, dtype=np.float32)) * np.float32(lr)).astype(np.float32)


def make_base32(root: str, size: int, shards: int) -> list[list[sample.Spec]]:
    """The fp32 master of the adam scenarios as a checkpoint of its own."""
    layout = f32_layout(size, shards)

    def data(s: sample.Spec) -> np.ndarray:
        n = s.nbytes // 4
        old = sample.bf16_normal(np.random.default_rng(_seed(s.name, 0)), n)
        return _master(old, np.random.default_rng(_seed(s.name, 2)))

    sample.write_checkpoint(root, layout, data, companions=sample.companion_files(0))
    return layout


def f32_layout(size: int, shards: int) -> list[list[sample.Spec]]:
    specs = [sample.Spec(s.name, "F32", s.shape) for s in specs_for(size // 2, None)]
    return sample.shard(specs, shards)


def make_variant(root: str, layout, scenario: str) -> None:
    names = [s.name for sh in layout for s in sh]
    layers = sorted({int(n.split(".")[2]) for n in names if n.startswith("model.layers.")}) or [0]
    hot = {f"model.layers.{i}." for i in layers[-2:]}

    def data(s: sample.Spec) -> np.ndarray:
        wide = s.dtype == "F32"
        old = sample.bf16_normal(np.random.default_rng(_seed(s.name, 0)), s.nbytes // (4 if wide else 2))
        rng = np.random.default_rng(_seed(s.name, 1))
        if scenario in ADAM or scenario == "adam-f32":
            master = _master(old, np.random.default_rng(_seed(s.name, 2)))
            new = master + _adam_step(old.size, _adam_lr(ADAM.get(scenario, 0.01)), rng)
            return new if wide else _bf16(new)
        if scenario == "rl1":
            return sample.rl_step(old, 0.01, rng)
        if scenario == "rl3":
            return sample.rl_step(old, 0.03, rng)
        if scenario == "frozen":
            if s.name == "lm_head.weight" or any(s.name.startswith(h) for h in hot):
                return sample.rl_step(old, 0.5, rng)
            return old
        if scenario == "dense":
            step = rng.integers(1, 4, old.size, dtype=np.int32) * np.where(rng.random(old.size) < 0.5, 1, -1)
            return (old.astype(np.int32) + step).astype(np.uint16)
        if scenario == "new":
            return sample.bf16_normal(rng, old.size)
        raise ValueError(scenario)

    sample.write_checkpoint(root, layout, data, companions=sample.companion_files(1))


def information_floor(a_dir: str, b_dir: str) -> tuple[int, float]:
    """(changed elements, floor in bytes): per tensor, the entropy of the
    positions of changed elements (n H(p)), plus the empirical entropy of
    the changed values' XOR with the old ones, over the whole checkpoint."""
    from ..store.checkpoint import scan

    A, B = scan(a_dir), scan(b_dir)
    bits = 0.0
    k_total = 0
    hist = np.zeros(1 << 16, dtype=np.int64)
    for name, (fb, tb) in B.tensors.items():
        fa, ta = A.tensors[name]
        n = tb.nbytes // 2
        k = 0
        for off in range(0, n, 1 << 24):
            m = min(1 << 24, n - off)
            a = np.fromfile(fa.abspath, dtype=np.uint16, count=m, offset=fa.header.data_start + ta.start + 2 * off)
            b = np.fromfile(fb.abspath, dtype=np.uint16, count=m, offset=fb.header.data_start + tb.start + 2 * off)
            x = a ^ b
            x = x[x != 0]
            k += x.size
            hist += np.bincount(x, minlength=1 << 16)
        if 0 < k < n:
            p = k / n
            bits += n * -(p * math.log2(p) + (1 - p) * math.log2(1 - p))
        k_total += k
    if k_total:
        pr = hist[hist > 0] / k_total
        bits += k_total * float(-(pr * np.log2(pr)).sum())
    return k_total, bits / 8


def changed_chunks(a_dir: str, b_dir: str, chunk: int, *, same_shape: bool = False):
    """The chunks of ``chunk`` bytes of each tensor that B and A both hold,
    with the same dtype and size (``same_shape``: and shape), where a word
    changed: (dtype, bucket function or None, A's words, B's words, the
    changed words' count), tensor by tensor in B's order. The yardstick of
    the entropies here and of wdiff.bench.sections."""
    from ..codec.chunk import bucket_function
    from ..codec.dtypes import dtype_info, uint_type
    from ..store.checkpoint import scan

    A, B = scan(a_dir), scan(b_dir)
    for name, (fb, tb) in B.tensors.items():
        if name not in A.tensors:
            continue
        fa, ta = A.tensors[name]
        if (ta.dtype, ta.nbytes) != (tb.dtype, tb.nbytes) or (same_shape and ta.shape != tb.shape):
            continue
        w = dtype_info(tb.dtype).word
        ut = uint_type(w)
        fn = bucket_function(tb.dtype, w)
        n, step = tb.nbytes // w, chunk // w
        for off in range(0, n, step):
            m = min(step, n - off)
            a = np.fromfile(fa.abspath, dtype=ut, count=m, offset=fa.header.data_start + ta.start + w * off)
            b = np.fromfile(fb.abspath, dtype=ut, count=m, offset=fb.header.data_start + tb.start + w * off)
            k = int(np.count_nonzero(a != b))
            if k:
                yield tb.dtype, fn, a, b, k


def delta_entropy(a_dir: str, b_dir: str) -> tuple[int, float, float]:
    """(changed elements, bytes given the base, bytes with no context): the
    order-0 information of the delta chunk by chunk (see the package's doc).
    A tensor of B that A lacks, or holds with another dtype or size (a
    given pair's may), has no delta: it is left out."""
    from ..codec.conditioned import conditional_entropy
    from ..defaults import DEFAULT_CHUNK

    k_total, given, free = 0, 0.0, 0.0
    for _, fn, a, b, k in changed_chunks(a_dir, b_dir, DEFAULT_CHUNK):
        k_total += k
        given += sum(conditional_entropy(fn, a, b)) if fn else sum(conditional_entropy(None, a, b))
        free += sum(conditional_entropy(None, a, b))
    return k_total, given / 8, free / 8


def _child_delta_entropy(a: str, b: str):
    return delta_entropy(a, b)


def _child_make_base32(root: str, size: int, shards: int) -> None:
    make_base32(root, size, shards)


def _child_make_base(root: str, size: int, shards: int, tensors: int | None) -> None:
    make_base(root, size, shards, tensors)


def _child_make_variant(root: str, size: int, shards: int, scenario: str, tensors: int | None) -> None:
    layout = f32_layout(size, shards) if scenario in OWN_BASE else sample.shard(specs_for(size, tensors), shards)
    make_variant(root, layout, scenario)


def _child_information_floor(a: str, b: str):
    return information_floor(a, b)
