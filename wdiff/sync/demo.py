"""``wdiff demo``: the whole job on built-in sample data, verified: diff,
pack, push to a local directory remote, pull into an empty directory,
apply, and a byte-for-byte comparison of every result with the original."""

from __future__ import annotations

import os
import shutil
import tempfile
import zlib
from collections.abc import Callable

import numpy as np

from ..errors import IntegrityError, UsageError
from ..ops.apply import apply
from ..ops.diff import diff
from ..ops.pack import pack
from ..store import sample
from .pull.inplace import pull
from .push import push

ADDED = "model.extra_proj.weight"


def make_pair(root: str, *, size_mb: int = 8, density: float = 0.01) -> tuple[str, str, dict]:
    """Write sample checkpoints ``root/A`` and ``root/B``: B is one RL-like step
    from A (``density`` of elements moved by one ulp, the embeddings frozen,
    one tensor added, one companion file changed)."""
    specs = sample.llama_specs(size_mb * 1_000_000)
    hidden = specs[0].shape[1]
    shards = sample.shard(specs, 2)
    frozen = specs[0].name

    def seed(name: str) -> int:
        return zlib.crc32(name.encode())

    def a_data(s: sample.Spec) -> np.ndarray:
        return sample.bf16_normal(np.random.default_rng(seed(s.name)), s.nbytes // 2)

    def b_data(s: sample.Spec) -> np.ndarray:
        if s.name == ADDED:
            return sample.bf16_normal(np.random.default_rng(seed(s.name)), s.nbytes // 2)
        old = a_data(s)
        if s.name == frozen:
            return old
        return sample.rl_step(old, density, np.random.default_rng(seed(s.name) + 1))

    a, b = os.path.join(root, "A"), os.path.join(root, "B")
    sample.write_checkpoint(a, shards, a_data, companions=sample.companion_files(100))
    b_shards = [list(sh) for sh in shards]
    b_shards[-1].append(sample.Spec(ADDED, "BF16", (hidden, hidden // 4)))
    sample.write_checkpoint(b, b_shards, b_data, companions=sample.companion_files(101))
    facts = {"tensors": len(specs), "shards": len(shards), "frozen": frozen, "added": ADDED, "density": density}
    return a, b, facts


def same_tree(x: str, y: str) -> int:
    """Compare two directories file by file, byte by byte; return the count."""
    def files(root):
        out = set()
        for dirpath, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d != ".wdiff"]
            for n in names:
                out.add(os.path.relpath(os.path.join(dirpath, n), root))
        return out

    fx, fy = files(x), files(y)
    if fx != fy:
        raise IntegrityError(f"{x} and {y} hold different files: {sorted(fx ^ fy)[:3]}")
    for rel in sorted(fx):
        with open(os.path.join(x, rel), "rb") as f, open(os.path.join(y, rel), "rb") as g:
            while True:
                p, q = f.read(1 << 22), g.read(1 << 22)
                if p != q:
                    raise IntegrityError(f"{rel} differs between {x} and {y}")
                if not p:
                    break
    return len(fx)


def run_demo(directory=None, *, size_mb: int = 8, threads: int | None = None, log: Callable[[str], None] | None = None) -> dict:
    say = log or (lambda s: None)
    keep = directory is not None
    if keep:
        root = os.fspath(directory)
        if os.path.exists(root) and os.listdir(root):
            raise UsageError(f"{root}: exists and is not empty")
        os.makedirs(root, exist_ok=True)
    else:
        root = tempfile.mkdtemp(prefix="wdiff-demo-")
    try:
        say(f"wdiff demo in {root}")
        a, b, facts = make_pair(root, size_mb=size_mb)
        say(f"  A: sample bf16 checkpoint, {facts['shards']} shards, {facts['tensors']} tensors, companion files")
        say(f"  B: one RL-like step: {facts['density']:.0%} of elements moved, embeddings frozen, 1 tensor added")
        d = diff(a, b, threads=threads)
        t = d.totals
        say(f"diff    {t['modified']} modified, {t['added']} added, {t['unchanged']} unchanged tensors; "
            f"{t['changed_elements']:,} of {t['compared_elements']:,} elements changed ({t['changed_fraction']:.2%})")
        bundle = os.path.join(root, "A-to-B.wdb")
        p = pack(a, b, bundle, threads=threads)
        delta = [c for name, c in p.codecs.items() if name != "raw"]
        per = sum(c.bytes for c in delta) / max(1, sum(c.changed for c in delta))
        added = p.codecs["raw"].bytes if "raw" in p.codecs else 0
        say(f"pack    {os.path.basename(bundle)}: {p.bundle_bytes:,} bytes for a {p.target_bytes:,}-byte checkpoint "
            f"({p.ratio:.0f}x smaller): {per:.2f} bytes per changed element, {added:,} for the added tensor")
        remote = os.path.join(root, "remote")
        anchor = push(a, remote, anchor=True, label="step-100", threads=threads)
        delta = push(bundle, remote, label="step-101", threads=threads)
        say(f"push    A as an anchor ({anchor.bytes:,} bytes) and the delta ({delta.bytes:,} bytes) to {remote}")
        mirror = os.path.join(root, "mirror")
        got = pull(remote, mirror, threads=threads)
        say(f"pull    into an empty {mirror}: anchor + delta squashed and applied, {got.downloaded:,} bytes fetched")
        c = os.path.join(root, "C")
        r = apply(bundle, a, c, threads=threads)
        say(f"apply   rebuilt B from A and the bundle into {c} (every tensor checked against B's digests)")
        n = same_tree(b, c)
        same_tree(b, mirror)
        say(f"verify  C and the mirror are byte-identical to B ({n} files each)")
        return {
            "schema": "wdiff.demo/1",
            "directory": root if keep else None,
            "checkpoint_bytes": p.target_bytes,
            "bundle_bytes": p.bundle_bytes,
            "ratio": p.ratio,
            "bytes_per_changed_element": p.bytes_per_changed,
            "changed_elements": p.changed_elements,
            "changed_fraction": t["changed_fraction"],
            "target_fingerprint": r.target_fingerprint.hex(),
            "pulled_bytes": got.downloaded,
            "verified": True,
        }
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
