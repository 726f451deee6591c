"""Device check for wdiff.live on a CUDA GPU (run where one exists; the test
suite runs without one):

    .venv/bin/python scripts/device_check_cuda.py [--mb 512] [--device cuda]

Publishes bf16 CUDA tensors (read a chunk at a time to the host), applies the
anchor and three 1% steps into other CUDA tensors with apply_into (scatter
on the device), checks them bit for bit against the trainer's, applies a
step through iter_patches with index_copy_ as an engine would, checks that
a refused bundle leaves the device tensors untouched, and prints timings.
Exits 0 when every check passes, 1 on a failed check, 2 without a device.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

from wdiff.errors import BaseMismatchError
from wdiff.live import Publisher, apply_into, iter_patches, prepare
from wdiff.sync.fetch import download, read_chain
from wdiff.progress import SILENT
from wdiff.remotes import open_remote


def head_bundle(remote: str, work: str) -> str:
    store = open_remote(remote)
    return download(store, read_chain(store).entries[-1], work, SILENT)[0]


def equal(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k].view(torch.int16) if a[k].dtype == torch.bfloat16 else a[k],
                           b[k].view(torch.int16) if b[k].dtype == torch.bfloat16 else b[k]) for k in a)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: nothing checked")
        return 2
    dev = torch.device(a.device)
    g = torch.Generator(device=dev).manual_seed(0)
    n = max(1, a.mb * 1024 * 1024 // (2048 * 2048 * 2))
    sd = {f"layers.{i}.weight": torch.randn(2048, 2048, device=dev, generator=g).to(torch.bfloat16) for i in range(n)}
    sd.update({f"experts.{i}.bias": torch.randn(512, device=dev, generator=g).to(torch.bfloat16) for i in range(2000)})
    sd["norm.weight"] = torch.randn(2048, device=dev, generator=g)  # fp32
    fol = {k: torch.zeros_like(v) for k, v in sd.items()}
    P = prepare(fol)
    failures = []
    with tempfile.TemporaryDirectory() as d:
        remote = os.path.join(d, "remote")
        pub = Publisher(remote, os.path.join(d, "mirror"))
        t = time.perf_counter()
        pub.publish(sd)
        print(f"anchor publish from {dev}: {time.perf_counter() - t:.2f} s")
        t = time.perf_counter()
        apply_into(head_bundle(remote, d), P)
        print(f"anchor apply_into on {dev}: {time.perf_counter() - t:.2f} s")
        if not equal(fol, sd):
            failures.append("anchor: follower tensors differ")
        prev = None
        for s in range(1, 4):
            with torch.no_grad():
                for v in sd.values():
                    m = torch.rand(v.shape, device=dev, generator=g) < 0.01
                    v[m] = (v[m].float() * 1.01 + 1e-3).to(v.dtype)
            t = time.perf_counter()
            res = pub.publish(sd, label=f"step-{s}")
            t1 = time.perf_counter()
            b = head_bundle(remote, d)
            t2 = time.perf_counter()
            r = apply_into(b, P, base_version=res.parent)
            torch.cuda.synchronize(dev) if dev.type == "cuda" else None
            t3 = time.perf_counter()
            print(f"step {s}: publish {t1 - t:.2f} s, bundle {res.bundle_bytes / 2**20:.1f} MiB, "
                  f"apply_into {t3 - t2:.3f} s ({r.changed_elements:,} elements, {r.tensors_changed} tensors)")
            if not equal(fol, sd):
                failures.append(f"step {s}: follower tensors differ")
            prev = b
        # a bundle from another version is refused, and nothing moves
        before = {k: v.clone() for k, v in fol.items()}
        try:
            apply_into(prev, P)
            failures.append("a bundle applied twice was not refused")
        except BaseMismatchError:
            pass
        if not equal(fol, before):
            failures.append("a refused apply changed device tensors")
        # iter_patches, applied by hand as an engine would (index_copy_ per tensor)
        with torch.no_grad():
            for v in sd.values():
                m = torch.rand(v.shape, device=dev, generator=g) < 0.01
                v[m] = (v[m].float() * 1.01 + 1e-3).to(v.dtype)
        pub.publish(sd)
        b = head_bundle(remote, d)
        t = time.perf_counter()
        for name, idx, values, shape in iter_patches(b, base=fol):
            assert tuple(shape) == tuple(fol[name].shape)
            flat = fol[name].view(-1)
            flat.index_copy_(0, torch.from_numpy(idx).long().to(dev), values.to(dev))
        print(f"iter_patches + index_copy_: {time.perf_counter() - t:.3f} s")
        if not equal(fol, sd):
            failures.append("iter_patches: follower tensors differ")
    for f in failures:
        print("FAILED:", f)
    print("device check:", "ok" if not failures else "FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
