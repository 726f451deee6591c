"""Benchmark wdiff.live: publish from memory against save_pretrained-style
saving + `wdiff push`, apply_into against a dense copy_, 20,000 small
tensors, and the follower's pause.

    .venv/bin/python scripts/bench_live.py --gb 1 --steps 3

Prints a markdown table of medians over the steps (and the ratios). The
publisher's extra memory is the peak RSS during publish above the RSS
before it (the kernel's high-water mark, reset first through
/proc/self/clear_refs), so it counts every scratch buffer, batch and undo
entry, and nothing of the page cache.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time

import torch
from safetensors.torch import save_file

import wdiff
from wdiff.live import Follower, Publisher, apply_into, prepare
from wdiff.sync.fetch import download, read_chain
from wdiff.progress import SILENT
from wdiff.remotes import open_remote

MiB = 1024 * 1024


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def model(gb: float, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = max(1, int(gb * 1024**3 / (4096 * 4096 * 2)))
    return {f"model.layers.{i}.mlp.weight": (torch.randn(4096, 4096, generator=g) * 0.02).to(torch.bfloat16)
            for i in range(n)}


def small_model(count: int, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"model.layers.{i // 128}.experts.{i % 128}.w": (torch.randn(1024, generator=g) * 0.02).to(torch.bfloat16)
            for i in range(count)}


def rl_step(sd: dict, density: float, g: torch.Generator) -> None:
    """~density of the elements move by one bf16 ULP (their bits +-1)."""
    with torch.no_grad():
        for t in sd.values():
            w = t.view(torch.int16).reshape(-1)
            k = max(1, int(w.numel() * density))
            idx = torch.randint(0, w.numel(), (k,), generator=g)
            w[idx] += torch.randint(0, 2, (k,), generator=g, dtype=torch.int16) * 2 - 1


def head_bundle(remote: str, work: str) -> str:
    store = open_remote(remote)
    return download(store, read_chain(store).entries[-1], work, SILENT)[0]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--small", type=int, default=20_000)
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-live-", dir=a.dir)
    g = torch.Generator().manual_seed(7)
    rows = []
    try:
        sd = model(a.gb)
        size = sum(t.numel() * t.element_size() for t in sd.values())
        remote = os.path.join(root, "remote")
        pub = Publisher(remote, os.path.join(root, "mirror"))
        t = time.perf_counter()
        pub.publish(sd, label="anchor")
        anchor_s = time.perf_counter() - t
        fol_sd = {k: torch.zeros_like(v) for k, v in sd.items()}
        apply_into(head_bundle(remote, root), fol_sd)
        # baseline: what a pipeline does today, save_pretrained (safetensors) then wdiff push --base
        base_remote = os.path.join(root, "remote-baseline")
        prev = os.path.join(root, "ckpt-0")
        os.makedirs(prev)
        save_file(sd, os.path.join(prev, "model.safetensors"), metadata={"format": "pt"})
        wdiff.push(prev, base_remote, anchor=True)
        pub_s, pub_mem, base_s, save_s, bundle_b, apply_s, copy_s = [], [], [], [], [], [], []
        split = {"pack": [], "push": [], "mirror": []}
        for s in range(1, a.steps + 1):
            rl_step(sd, a.density, g)
            before = rss()
            ok = reset_peak()
            t = time.perf_counter()
            res = pub.publish(sd, label=f"step-{s}")
            pub_s.append(time.perf_counter() - t)
            pub_mem.append(peak() - before if ok else float("nan"))
            bundle_b.append(res.bundle_bytes)
            split["pack"].append(res.pack_seconds)
            split["push"].append(res.push_seconds)
            split["mirror"].append(res.mirror_seconds)
            cur = os.path.join(root, f"ckpt-{s}")
            os.makedirs(cur)
            t = time.perf_counter()
            save_file(sd, os.path.join(cur, "model.safetensors"), metadata={"format": "pt"})
            t1 = time.perf_counter()
            wdiff.push(cur, base_remote, base=prev)
            base_s.append(time.perf_counter() - t)
            save_s.append(t1 - t)
            shutil.rmtree(prev)
            prev = cur
            b = head_bundle(remote, root)
            t = time.perf_counter()
            apply_into(b, fol_sd, base_version=res.parent)  # as a Follower does: the version it recorded
            apply_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            with torch.no_grad():
                for k, v in sd.items():
                    fol_sd[k].copy_(v)
            copy_s.append(time.perf_counter() - t)
        gbs = f"{size / 1024**3:.2f} GiB bf16, {len(sd)} tensors, {a.density:.0%} changed"
        rows.append((f"publish ({gbs})", med(pub_s), "save_file + wdiff push --base", med(base_s)))
        rows.append(("  of which pack from memory / push / mirror update",
                     float("nan"), " / ".join(f"{med(split[k]):.3f}" for k in ("pack", "push", "mirror")), float("nan")))
        rows.append(("  save_file alone (the baseline's first half)", med(save_s), "", float("nan")))
        # background=True: what the training loop waits for (the pack); push and mirror overlap the next step
        bpub = Publisher(remote, os.path.join(root, "mirror"), background=True)
        blocked = []
        for s in range(a.steps):
            rl_step(sd, a.density, g)
            t = time.perf_counter()
            bpub.publish(sd, label=f"bg-{s}")
            blocked.append(time.perf_counter() - t)
            bpub.wait()
        bpub.close()
        rows.append(("publish, background=True: time the loop is blocked", med(blocked),
                     "save_file + wdiff push --base", med(base_s)))
        rows.append((f"apply_into ({gbs})", med(apply_s), "dense copy_ of the same tensors", med(copy_s)))
        extra = max(pub_mem)

        # 20,000 small tensors
        small = small_model(a.small)
        sremote = os.path.join(root, "remote-small")
        spub = Publisher(sremote, os.path.join(root, "mirror-small"))
        spub.publish(small)
        sfol = {k: torch.zeros_like(v) for k, v in small.items()}
        apply_into(head_bundle(sremote, root), sfol)
        s_apply, s_prep, s_copy, s_pub = [], [], [], []
        sprep = prepare(sfol)
        for s in range(a.steps):
            rl_step(small, a.density * 10, g)  # ~10 changed elements in each 1024-element tensor
            t = time.perf_counter()
            sres = spub.publish(small)
            s_pub.append(time.perf_counter() - t)
            b = head_bundle(sremote, root)
            t = time.perf_counter()
            apply_into(b, sfol if s % 2 == 0 else sprep, base_version=sres.parent)
            (s_apply if s % 2 == 0 else s_prep).append(time.perf_counter() - t)
            t = time.perf_counter()
            with torch.no_grad():
                for k, v in small.items():
                    sfol[k].copy_(v)
            s_copy.append(time.perf_counter() - t)
        rows.append((f"apply_into ({a.small:,} tensors of 1024 bf16, 10% changed)", med(s_apply),
                     "dense copy_ of the same tensors", med(s_copy)))
        rows.append(("  the same into prepare()d tensors (what a Follower passes)", med(s_prep),
                     "dense copy_ of the same tensors", med(s_copy)))
        rows.append((f"publish ({a.small:,} small tensors)", med(s_pub), "", float("nan")))

        # follower pause, on the big model
        lock = threading.Lock()
        fsd = {k: torch.zeros_like(v) for k, v in sd.items()}
        fol = Follower(remote, fsd, os.path.join(root, "follower"), hook=lock)
        fol.poll()
        pauses, polls = [], []
        for s in range(a.steps):
            rl_step(sd, a.density, g)
            pub.publish(sd)
            r = fol.poll()
            pauses.append(r.pause_seconds)
            polls.append(r.seconds)
        rows.append(("follower pause (apply_into under the hook)", med(pauses), "whole poll (fetch, apply, disk copy)",
                     med(polls)))

        print(f"\n{gbs}; anchor publish {anchor_s:.2f} s; bundle {med(bundle_b) / MiB:.1f} MiB per step; "
              f"publisher extra RSS (peak during publish - before, the largest of the steps) {extra / MiB:.0f} MiB; "
              f"times: medians of {a.steps} steps\n")
        print("| measured | wdiff.live (s) | against | that (s) | ratio |")
        print("|---|---:|---|---:|---:|")
        for name, x, other, y in rows:
            ratio = f"{y / x:.1f}x" if y == y and x == x and x else ""
            ys = f"{y:.3f}" if y == y else ""
            xs = f"{x:.3f}" if x == x else ""
            print(f"| {name} | {xs} | {other} | {ys} | {ratio} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
