"""``python -m wdiff.bench.vllm``: a vLLM engine's update through the
``wdiff`` weight-transfer backend against a full reload of the same engine.

It writes small models (no download: random bf16 weights, a word-level
tokenizer), pushes version 0 and a sparse version 1 of each to a directory
remote, starts one CPU engine per model on version 0 with the ``wdiff``
backend, and times, on that engine:

* update: ``start_weight_update``, ``update_weights({"version": V})``,
  ``finish_weight_update`` (pull of the delta, verification, reload of the
  changed layers), from version 0 to 1 and back to 0 by a later version;
* reload: vLLM's own ``reload_weights`` of the whole checkpoint from disk
  (what an engine that does not follow a remote does once the new
  checkpoint is on its disk: its download is not counted).

Models: ``llama`` (2 layers, 21 tensors), ``moe`` (a Mixtral with many
small experts: LAYERS x EXPERTS x 3 expert tensors). Also holds what the
engine tests share with it: the model writers and :func:`snapshot`, which
reads back every parameter's bytes from a running engine (a packed CPU
linear layer by feeding it an identity matrix).

This is a measurement tool, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from ..store.sample import Spec, write_safetensors

VOCAB = 512
ENGINE_ARGS = {"dtype": "bfloat16", "enforce_eager": True, "max_model_len": 128, "kv_cache_memory_bytes": 64 << 20}


# -- models ------------------------------------------------------------------------------


def llama_config(*, layers: int = 2, hidden: int = 256, heads: int = 4, kv_heads: int = 2, inter: int = 512,
                 experts: int = 0, expert_inter: int = 64, top_k: int = 2) -> dict:
    """A tiny Llama (head dim 64: the CPU attention backend refuses 16), or
    with ``experts`` a Mixtral of that many experts per layer."""
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads, "num_hidden_layers": layers, "vocab_size": VOCAB,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        "torch_dtype": "bfloat16", "attention_bias": False, "mlp_bias": False,
    }
    if experts:
        cfg.update({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": experts,
                    "num_experts_per_tok": top_k, "intermediate_size": expert_inter, "router_aux_loss_coef": 0.0})
    return cfg


def tensor_specs(cfg: dict) -> list[Spec]:
    h, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hd = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    specs = [Spec("model.embed_tokens.weight", "BF16", (V, h)), Spec("model.norm.weight", "BF16", (h,)),
             Spec("lm_head.weight", "BF16", (V, h))]
    for i in range(L):
        p = f"model.layers.{i}."
        specs += [Spec(p + "input_layernorm.weight", "BF16", (h,)),
                  Spec(p + "post_attention_layernorm.weight", "BF16", (h,)),
                  Spec(p + "self_attn.q_proj.weight", "BF16", (q, h)),
                  Spec(p + "self_attn.k_proj.weight", "BF16", (kv, h)),
                  Spec(p + "self_attn.v_proj.weight", "BF16", (kv, h)),
                  Spec(p + "self_attn.o_proj.weight", "BF16", (h, q))]
        E = cfg.get("num_local_experts", 0)
        f = cfg["intermediate_size"]
        if E:
            specs.append(Spec(p + "block_sparse_moe.gate.weight", "BF16", (E, h)))
            for e in range(E):
                x = f"{p}block_sparse_moe.experts.{e}."
                specs += [Spec(x + "w1.weight", "BF16", (f, h)), Spec(x + "w2.weight", "BF16", (h, f)),
                          Spec(x + "w3.weight", "BF16", (f, h))]
        else:
            specs += [Spec(p + "mlp.gate_proj.weight", "BF16", (f, h)), Spec(p + "mlp.up_proj.weight", "BF16", (f, h)),
                      Spec(p + "mlp.down_proj.weight", "BF16", (h, f))]
    return specs


def random_weights(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """bf16 words (uint16) per tensor: N(0, 0.02) for matrices, ones for norms."""
    rng = np.random.default_rng(seed)
    out = {}
    for s in tensor_specs(cfg):
        if s.name.endswith("norm.weight"):
            out[s.name] = np.full(s.shape, 0x3F80, dtype=np.uint16)  # 1.0
        else:
            f = (rng.standard_normal(s.shape, dtype=np.float32) * 0.02).view(np.uint32)
            out[s.name] = (f >> 16).astype(np.uint16)
    return out


def write_model(directory: str, cfg: dict, weights: dict[str, np.ndarray]) -> str:
    """A checkpoint directory vLLM loads: config, tokenizer, one safetensors file."""
    os.makedirs(directory, exist_ok=True)
    specs = tensor_specs(cfg)
    write_safetensors(os.path.join(directory, "model.safetensors"), specs,
                      lambda s: weights[s.name].reshape(-1).view(np.uint8), metadata={"format": "pt"})
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, cfg["vocab_size"])}}
    special = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                "special": True} for t, i in list(vocab.items())[:4]]
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": special, "normalizer": None,
                 "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
                 "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
    files = {
        "config.json": cfg,
        "generation_config.json": {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0},
        "tokenizer.json": tokenizer,
        "tokenizer_config.json": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
                                  "model_max_length": 256, "tokenizer_class": "PreTrainedTokenizerFast"},
    }
    for name, doc in files.items():
        with open(os.path.join(directory, name), "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
    return directory


def sparse_step(weights: dict[str, np.ndarray], *, density: float, seed: int, names=None,
                one: str | None = None) -> dict[str, np.ndarray]:
    """A new version: about ``density`` of the elements of ``names`` (default
    all) moved by one ulp, and exactly one element of ``one``."""
    rng = np.random.default_rng(seed)
    out = dict(weights)
    for n in (weights if names is None else names):
        w = weights[n].copy().reshape(-1)
        k = max(1, int(w.size * density))
        pos = rng.choice(w.size, size=k, replace=False)
        w[pos] ^= 1
        out[n] = w.reshape(weights[n].shape)
    if one is not None:
        w = out[one].copy().reshape(-1)
        w[w.size // 3] ^= 0x0004
        out[one] = w.reshape(weights[one].shape)
    return out


# -- what a running engine holds ---------------------------------------------------------


def snapshot(model) -> dict[str, bytes]:
    """Every parameter of ``model`` (run inside a vLLM worker through
    ``LLM.apply_model``) as bytes. vLLM's CPU build packs a linear layer's
    weight into a oneDNN handle and leaves the parameter empty: such a
    layer is read back as what it computes from an identity matrix, which
    is its weight, transposed, bit for bit (one non-zero product per
    output element)."""
    import torch

    out: dict[str, bytes] = {}
    with torch.no_grad():
        for mname, mod in model.named_modules():
            for pname, p in mod.named_parameters(recurse=False):
                name = f"{mname}.{pname}" if mname else pname
                if p.numel() > 0 and not p.is_meta:
                    out[name] = p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                elif pname == "weight" and hasattr(mod, "input_size_per_partition"):
                    n = mod.input_size_per_partition
                    y = mod(torch.eye(n, dtype=p.dtype))
                    y = y[0] if isinstance(y, tuple) else y
                    out[name + "@identity"] = y.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                else:
                    out[name + "@unreadable"] = repr((tuple(p.shape), str(p.dtype))).encode()
    return out


def differing(a: dict[str, bytes], b: dict[str, bytes]) -> list[str]:
    """The parameters whose bytes differ (or that only one side has)."""
    return sorted(n for n in a.keys() | b.keys() if a.get(n) != b.get(n))


# -- the benchmark -----------------------------------------------------------------------

MODELS = {
    "llama": {"layers": 2},
    "moe": {"layers": 8, "experts": 256, "expert_inter": 32},
}


def _push_versions(root: str, cfg: dict, runs: int, density: float) -> tuple[list[str], str, list[int]]:
    """v0 .. v<runs> (each a sparse step of every tensor from the one
    before) pushed to a directory remote; their directories and part sizes."""
    w = random_weights(cfg, seed=1)
    dirs, sizes = [], []
    remote = os.path.join(root, "remote")
    for k in range(runs + 1):
        if k:
            w = sparse_step(w, density=density, seed=100 + k)
        d = write_model(os.path.join(root, f"v{k}"), cfg, w)
        args = ["--anchor"] if k == 0 else ["--base", dirs[-1]]
        subprocess.run([sys.executable, "-m", "wdiff", "push", "-q", d, remote, "--label", f"v{k}", *args], check=True)
        dirs.append(d)
    with open(os.path.join(remote, "chain.json")) as f:
        sizes = [e["size"] for e in json.load(f)["entries"]]
    return dirs, remote, sizes


def _engine(args) -> dict:
    """(the engine process) time ``runs`` updates and ``runs`` reloads."""
    from vllm import LLM

    from wdiff.bench import vllm as named  # functions sent to the worker go by their module's name, not __main__

    work = json.loads(args.engine)
    dirs, remote = work["dirs"], work["remote"]
    t = time.perf_counter()
    llm = LLM(model=dirs[0], weight_transfer_config={"backend": "wdiff"}, **ENGINE_ARGS)
    start = time.perf_counter() - t
    llm.init_weight_transfer_engine({"init_info": {"remote": remote, "cache_dir": work["cache"]}})
    updates, parts, reloads = [], [], []
    for k in range(1, len(dirs)):
        t = time.perf_counter()
        llm.start_weight_update()
        llm.update_weights({"update_info": {"version": f"v{k}"}})
        llm.finish_weight_update(f"v{k}")
        updates.append(time.perf_counter() - t)
        parts.append(llm.collective_rpc(named._last_update)[0])
    for k in range(1, len(dirs)):
        t = time.perf_counter()
        llm.collective_rpc("reload_weights", kwargs={"weights_path": dirs[k]})
        reloads.append(time.perf_counter() - t)
    llm.llm_engine.engine_core.shutdown()
    return {"start": start, "updates": updates, "parts": parts, "reloads": reloads}


def _last_update(worker) -> dict:
    r = worker.weight_transfer_engine.last
    return {"tensors": r.tensors, "bytes": r.bytes, "seconds": r.seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wdiff.bench.vllm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama,moe", help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--runs", type=int, default=3, help="updates and reloads timed per model")
    ap.add_argument("--density", type=float, default=0.01, help="fraction of every tensor's elements a step moves")
    ap.add_argument("--layers", type=int, help="decoder layers (default: the model's)")
    ap.add_argument("--experts", type=int, help="experts per layer of the moe model")
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.engine:
        print("RESULT " + json.dumps(_engine(args)), flush=True)
        return 0
    rows = []
    for name in args.models.split(","):
        kw = dict(MODELS[name])
        if args.layers:
            kw["layers"] = args.layers
        if args.experts and "experts" in kw:
            kw["experts"] = args.experts
        cfg = llama_config(**kw)
        specs = tensor_specs(cfg)
        with tempfile.TemporaryDirectory(prefix="wdiff-bench-vllm-") as root:
            dirs, remote, sizes = _push_versions(root, cfg, args.runs, args.density)
            work = {"dirs": dirs, "remote": remote, "cache": os.path.join(root, "cache")}
            env = dict(os.environ, VLLM_ALLOW_INSECURE_SERIALIZATION="1", VLLM_LOGGING_LEVEL="WARNING")
            out = subprocess.run([sys.executable, "-m", "wdiff.bench.vllm", "--engine", json.dumps(work)],
                                 capture_output=True, text=True, env=env)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if out.returncode != 0 or not lines:
                sys.stderr.write(out.stderr[-6000:])
                return 2
            r = json.loads(lines[-1][len("RESULT "):])
        med = statistics.median
        rows.append({
            "model": name, "tensors": len(specs), "model_mb": sum(s.nbytes for s in specs) / 1e6,
            "delta_mb": med(sizes[1:]) / 1e6, "handed": med(p["tensors"] for p in r["parts"]),
            "update": med(r["updates"]), "pull": med(p["seconds"]["pull+verify"] for p in r["parts"]),
            "load": med(p["seconds"]["load"] for p in r["parts"]), "reload": med(r["reloads"]),
            "start": r["start"],
        })
    print(f"{'model':6} {'tensors':>8} {'model MB':>9} {'delta MB':>9} {'handed':>7} {'update s':>9} "
          f"{'pull+verify':>12} {'load':>7} {'reload s':>9} {'engine start s':>15}")
    for x in rows:
        print(f"{x['model']:6} {x['tensors']:>8} {x['model_mb']:>9.1f} {x['delta_mb']:>9.2f} {x['handed']:>7.0f} "
              f"{x['update']:>9.2f} {x['pull']:>12.2f} {x['load']:>7.2f} {x['reload']:>9.2f} {x['start']:>15.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
