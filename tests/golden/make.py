#!/usr/bin/env python3
"""(Re)generate the golden checkpoints and bundles in tests/golden/data/.

    python tests/golden/make.py           rewrite tests/golden/data/
    python tests/golden/make.py --check   exit 1 if regenerating would change
                                          any committed file (nothing written)

Why golden files: a bundle written by one release must be readable by the
next, and the writer must not change its bytes silently (the format page
promises the same inputs and options give the same bytes). The files here
were written by the wdiff named in data/README.md; tests/test_golden.py packs
the same checkpoints with today's code and compares bytes, and reads the
committed bundles with today's reader. When a change to the bytes is
intended (a new format version, another zstd, a version bump, which changes
the index's "writer" member), rerun this script and commit the result with a
note saying why.

Everything is deterministic: the checkpoints are made from SHAKE-256 streams
(numpy's Generator streams are not promised to stay the same across numpy
versions) with integer operations only, and the safetensors files are written
by hand. The bundles are made with the real command line (python -m wdiff),
with -j 1; every bundle is also packed with -j 4 and with WDIFF_NATIVE=0 (the
numpy kernels), and the script fails unless all three give the same bytes.

The signing key in data/keys/ is a TEST KEY, made once with `wdiff keygen`
and committed; it is kept as it is when the data is regenerated (it is
random, and a new one would change every signature). Never trust it.

Only the standard library, numpy and the wdiff command line are used: no
internal wdiff module is imported.
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DATA = HERE / "data"
KEY = "keys/test.key"

# ---------------------------------------------------------------------------
# deterministic bytes

def stream(label: str, n: int) -> np.ndarray:
    """n bytes, a pure function of label (SHAKE-256 of it)."""
    return np.frombuffer(hashlib.shake_256(b"wdiff-golden\0" + label.encode()).digest(n), dtype=np.uint8)


def words(label: str, n: int, dtype) -> np.ndarray:
    dt = np.dtype(dtype).newbyteorder("<")
    return stream(label, n * dt.itemsize).view(dt).copy()


def bf16(label: str, shape) -> np.ndarray:
    """bf16 bit patterns of weight-like values: random sign and mantissa,
    exponent 2^-10 to 2^-5 (|x| about 0.001 to 0.06)."""
    n = int(np.prod(shape, dtype=np.int64))
    r = words(label, n, np.uint16)
    sign = (r >> 15) << 15
    exp = (115 + (r >> 7 & 0xFF) % 6).astype(np.uint16) << 7
    return (sign | exp | (r & 0x7F)).astype("<u2").reshape(shape)


def f32(label: str, shape, lo_exp: int = 120, span: int = 7) -> np.ndarray:
    n = int(np.prod(shape, dtype=np.int64))
    r = words(label, n, np.uint32)
    sign = (r >> 31) << 31
    exp = (lo_exp + (r >> 23 & 0xFF) % span).astype(np.uint32) << 23
    return (sign | exp | (r & 0x7FFFFF)).astype("<u4").reshape(shape)


def bits_f32_to_bf16(a: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch does (no NaNs here)."""
    a = a.astype(np.uint64)
    r = ((a + 0x7FFF + ((a >> 16) & 1)) >> 16) & 0xFFFF
    return r.astype("<u2")


def sparse_change(label: str, a: np.ndarray, fraction: float) -> np.ndarray:
    """XOR max(1, round(fraction * n)) distinct words with a nonzero value in
    the low mantissa bits (a small step, as an optimizer makes)."""
    flat = a.reshape(-1).copy()
    n = flat.size
    k = max(1, int(round(fraction * n)))
    keys = words(label + "/pos", n, np.uint64)
    pos = np.argsort(keys, kind="stable")[:k]
    flip = (stream(label + "/val", k) % 0x7F + 1).astype(flat.dtype)
    flat[pos] ^= flip
    return flat.reshape(a.shape)


def adam_change(label: str, a: np.ndarray) -> np.ndarray:
    """A bf16 optimizer-like step on a base made by :func:`bf16`: a word
    moves by +-1 on its bit pattern (one ulp) with a probability that halves
    with every step of its exponent (the rounding step doubles), from 1/4 at
    exponent 115 down to 1/128; integer operations only."""
    flat = a.reshape(-1).copy()
    e = (flat >> 7 & 0xFF).astype(np.int64)
    r = words(label + "/adam", flat.size, np.uint16).astype(np.int64)
    moves = r < (0x4000 >> np.clip(e - 115, 0, 15))
    up = (stream(label + "/sign", flat.size) & 1).astype(bool)
    step = np.where(up, 1, 0xFFFF).astype(np.uint16)
    flat[moves] = flat[moves] + step[moves]
    return flat.reshape(a.shape)


def row_change(label: str, a: np.ndarray, k: int) -> np.ndarray:
    """An Adam step that touches k rows only (the embedding rows of the
    tokens a batch saw), rows picked by a SHAKE-256 stream: there a word
    moves by +-1 on its bit pattern with probability 3/4 (Adam's step is
    about the learning rate whatever the gradient, so most words of a row it
    touches cross a rounding boundary); the other rows keep their words."""
    b = a.copy()
    keys = words(label + "/rows", a.shape[0], np.uint64)
    rows = np.sort(np.argsort(keys, kind="stable")[:k])
    sub = b[rows].reshape(-1)
    r = stream(label + "/rowstep", sub.size)
    moves = (r & 3) != 0
    step = np.where(r & 4, 1, 0xFFFF).astype(np.uint16)
    sub[moves] = sub[moves] + step[moves]
    b[rows] = sub.reshape(k, a.shape[1])
    return b


def run_change(label: str, a: np.ndarray, cols: int) -> np.ndarray:
    """Change the first ``cols`` elements of every row (runs of changed words,
    as when some input features were updated; a bitmap codes them best)."""
    b = a.copy()
    flip = (stream(label + "/run", a.shape[0] * cols) % 0x7F + 1).astype(a.dtype).reshape(a.shape[0], cols)
    b[:, :cols] ^= flip
    return b


def dense_change(label: str, a: np.ndarray) -> np.ndarray:
    """XOR every word with 1, 2 or 3: every element changes."""
    flat = a.reshape(-1).copy()
    flip = (stream(label + "/dense", flat.size) % 3 + 1).astype(flat.dtype)
    return (flat ^ flip).reshape(a.shape)


# ---------------------------------------------------------------------------
# writing checkpoints

DT = {"BF16": "<u2", "F32": "<u4", "I64": "<i8", "I32": "<i4", "U8": "u1", "BOOL": "u1"}


def safetensors_bytes(tensors: dict[str, tuple[str, np.ndarray]]) -> bytes:
    """A safetensors file: 8-byte little-endian header length, JSON header
    (sorted keys, no spaces, padded with spaces to a multiple of 8 as the
    safetensors library does), then the tensors' bytes in name order."""
    header: dict = {"__metadata__": {"format": "pt"}}
    chunks, off = [], 0
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        raw = np.ascontiguousarray(arr, dtype=DT[dtype]).tobytes()
        header[name] = {"data_offsets": [off, off + len(raw)], "dtype": dtype, "shape": list(arr.shape)}
        chunks.append(raw)
        off += len(raw)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def json_file(obj) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=2) + "\n").encode()


def write_checkpoint(root: Path, shards: list[dict[str, tuple[str, np.ndarray]]], companions: dict[str, bytes]):
    root.mkdir(parents=True)
    n = len(shards)
    files = {}
    if n == 1:
        files["model.safetensors"] = safetensors_bytes(shards[0])
    else:
        weight_map, total = {}, 0
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            files[fname] = safetensors_bytes(shard)
            for name, (dtype, arr) in shard.items():
                weight_map[name] = fname
                total += arr.nbytes
        files["model.safetensors.index.json"] = json_file({"metadata": {"total_size": total}, "weight_map": weight_map})
    files.update(companions)
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def config(**over) -> bytes:
    cfg = {"architectures": ["GoldenForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
           "model_type": "golden", "num_hidden_layers": 1, "torch_dtype": "bfloat16", "vocab_size": 64}
    cfg.update(over)
    return json_file(cfg)


def checkpoints(out: Path):
    """base, and five targets: sparse (1% of bf16 words), dense (every
    element of every tensor), adam (an optimizer step on every bf16 word),
    rows (an optimizer step on a few rows of two bf16 matrices) and struct
    (tensors added, removed, retyped and reshaped, one changed in runs,
    companion files changed and added, shards re-split)."""
    base = {
        "model.embed_tokens.weight": ("BF16", bf16("embed", (64, 64))),
        "model.layers.0.input_layernorm.weight": ("F32", f32("ln0", (64,), 126, 2)),
        "model.layers.0.mlp.down_proj.weight": ("BF16", bf16("down", (64, 128))),
        "model.layers.0.self_attn.q_proj.weight": ("BF16", bf16("q", (64, 64))),
        "model.norm.weight": ("F32", f32("norm", (64,), 126, 2)),
        "model.position_ids": ("I64", np.arange(128, dtype="<i8").reshape(1, 128)),
        "model.token_type_ids": ("I32", (words("tt", 32, np.uint32) % 4).astype("<i4")),
        "model.rotary.inv_freq": ("F32", f32("rot", (16,), 115, 12)),
        "model.step": ("I64", np.array(1234, dtype="<i8")),
        "model.empty_bias": ("F32", np.zeros((0,), dtype="<u4")),
    }
    companions = {
        "config.json": config(),
        "tokenizer_config.json": json_file({"model_max_length": 128, "tokenizer_class": "GoldenTokenizer"}),
    }
    shard_of = {  # two shards
        "model.embed_tokens.weight": 0, "model.layers.0.input_layernorm.weight": 0,
        "model.layers.0.mlp.down_proj.weight": 0, "model.step": 0, "model.empty_bias": 0,
    }

    def split(tensors, where, n):
        shards = [{} for _ in range(n)]
        for name, t in tensors.items():
            shards[where.get(name, n - 1)][name] = t
        return shards

    write_checkpoint(out / "base", split(base, shard_of, 2), companions)

    sparse = {k: (d, sparse_change(k, a, 0.01) if d == "BF16" else a) for k, (d, a) in base.items()}
    write_checkpoint(out / "sparse", split(sparse, shard_of, 2), companions)

    dense = {k: (d, dense_change(k, a)) for k, (d, a) in base.items()}
    write_checkpoint(out / "dense", split(dense, shard_of, 2), companions)

    adam = {k: (d, adam_change(k, a) if d == "BF16" else a) for k, (d, a) in base.items()}
    write_checkpoint(out / "adam", split(adam, shard_of, 2), companions)

    rows = dict(base)
    for name, k in (("model.embed_tokens.weight", 4), ("model.layers.0.mlp.down_proj.weight", 3)):
        rows[name] = ("BF16", row_change(name, base[name][1], k))
    write_checkpoint(out / "rows", split(rows, shard_of, 2), companions)

    struct_t = dict(sparse)
    del struct_t["model.rotary.inv_freq"]                                      # removed
    struct_t["lm_head.weight"] = ("BF16", bf16("lm_head", (64, 64)))           # added
    struct_t["model.norm.weight"] = ("BF16", bits_f32_to_bf16(base["model.norm.weight"][1]))  # retyped
    struct_t["model.position_ids"] = ("I64", base["model.position_ids"][1].reshape(128))       # reshaped
    struct_t["model.layers.0.self_attn.q_proj.weight"] = base["model.layers.0.self_attn.q_proj.weight"]  # unchanged
    down = "model.layers.0.mlp.down_proj.weight"                              # a BITMAP record
    struct_t[down] = ("BF16", run_change(down, base[down][1], 16))
    where = {"model.embed_tokens.weight": 0, "lm_head.weight": 0, "model.step": 0,
             "model.layers.0.mlp.down_proj.weight": 1, "model.layers.0.input_layernorm.weight": 1}
    write_checkpoint(out / "struct", split(struct_t, where, 3), {
        **companions,
        "config.json": config(tie_word_embeddings=False),                       # changed
        "generation_config.json": json_file({"do_sample": True, "temperature": 0.7}),  # added
        "tokenizer/special_tokens_map.json": json_file({"eos_token": "</s>"}),  # added, in a subdirectory
    })


# ---------------------------------------------------------------------------
# bundles, with the real command line

def wdiff(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ, NO_COLOR="1", WDIFF_CACHE_DIR="none")
    for k in ("WDIFF_THREADS", "WDIFF_NATIVE", "WDIFF_DEBUG", "WDIFF_TRUSTED_KEYS"):
        e.pop(k, None)
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), e.get("PYTHONPATH")]))
    e.update(env or {})
    r = subprocess.run([sys.executable, "-m", "wdiff", *map(str, args)], cwd=cwd, env=e,
                       capture_output=True, timeout=300)
    if r.returncode != 0:
        sys.exit(f"make.py: wdiff {' '.join(map(str, args))} exited {r.returncode}\n"
                 f"{r.stdout.decode(errors='replace')}{r.stderr.decode(errors='replace')}")
    return r


#: bundle file -> pack arguments (paths relative to the data directory)
BUNDLES = {
    "anchor.wdb": ["--anchor", "ckpt/base"],
    "sparse.wdb": ["--format", "1", "ckpt/base", "ckpt/sparse"],
    "dense.wdb": ["--format", "1", "ckpt/base", "ckpt/dense"],
    "struct.wdb": ["--format", "1", "ckpt/base", "ckpt/struct"],
    "signed.wdb": ["--format", "1", "ckpt/base", "ckpt/sparse", "--sign", KEY],
    "v3-dense.wdb": ["ckpt/base", "ckpt/dense"],
    "v3-adam.wdb": ["ckpt/base", "ckpt/adam"],
    "v3-struct.wdb": ["ckpt/base", "ckpt/struct"],
    "v3-rows.wdb": ["ckpt/base", "ckpt/rows"],
}
#: corrupt copies: file -> (source bundle, what is done to it)
CORRUPT = {
    "corrupt/sparse-truncated.wdb": ("sparse.wdb", "truncate"),
    "corrupt/sparse-flipped.wdb": ("sparse.wdb", "flip"),
}


def corrupt(src: bytes, how: str) -> bytes:
    if how == "truncate":       # the footer and part of the index gone
        return src[: len(src) - 100]
    # one bit of the first record's payload (the first record starts at 16,
    # its payload at 16 + 112); the index and the footer are intact
    b = bytearray(src)
    b[16 + 112 + 20] ^= 0x01
    return bytes(b)


def bundles(out: Path):
    for name, args in BUNDLES.items():
        wdiff("pack", "-q", "-j", "1", *args, "-o", name, cwd=out)
    with tempfile.TemporaryDirectory(prefix="wdiff-golden-") as t:
        for label, extra, env in (("-j 4", ["-j", "4"], {}), ("WDIFF_NATIVE=0", ["-j", "1"], {"WDIFF_NATIVE": "0"})):
            for name, args in BUNDLES.items():
                alt = Path(t) / name
                wdiff("pack", "-q", *extra, *args, "-o", alt, cwd=out, env=env)
                for suffix in ("", ".minisig") if "--sign" in args else ("",):
                    if (out / (name + suffix)).read_bytes() != Path(str(alt) + suffix).read_bytes():
                        sys.exit(f"make.py: {name}{suffix} packed with {label} differs from -j 1: "
                                 "the writer is not deterministic")
                alt.unlink()
    for name, (src, how) in CORRUPT.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(corrupt((out / src).read_bytes(), how))


def version() -> str:
    return wdiff("--version", cwd=ROOT).stdout.decode().split()[1]


README = """\
# Golden checkpoints and bundles

Made by `tests/golden/make.py` with wdiff {version}; do not edit by hand.
`python tests/golden/make.py --check` says whether regenerating would change
anything; `python tests/golden/make.py` rewrites this directory.

| path | what |
|---|---|
| `ckpt/base/` | two shards + index, companion files; BF16, F32, I64, I32, a 0-d and an empty tensor |
| `ckpt/sparse/` | base with 1% of the BF16 elements changed (low mantissa bits) |
| `ckpt/dense/` | base with every element of every tensor changed |
| `ckpt/adam/` | base with its BF16 words moved by one ulp with a probability that halves with each step of their exponent (an optimizer step: small weights change more often) |
| `ckpt/rows/` | base with an Adam step in a few rows only of two BF16 matrices (4 of the 64 embedding rows, 3 of the 64 rows of `down_proj`): there three words in four move by one ulp, every other row is as it was |
| `ckpt/struct/` | sparse, but: one BF16 tensor back to its base value, one with runs of changes (12.5%) instead of 1%, a tensor added, one removed, one retyped (F32 to BF16), one reshaped, `config.json` changed, two companion files added (one in a subdirectory), three shards instead of two |
| `anchor.wdb` | `wdiff pack --anchor ckpt/base`: HEADER, FILE and RAW records |
| `sparse.wdb` | `wdiff pack --format 1 ckpt/base ckpt/sparse`: SPARSE records only |
| `dense.wdb` | `wdiff pack --format 1 ckpt/base ckpt/dense`: DENSE records |
| `struct.wdb` | `wdiff pack --format 1 ckpt/base ckpt/struct`: HEADER, FILE, RAW, SPARSE and BITMAP records |
| `signed.wdb`, `signed.wdb.minisig` | `wdiff pack --format 1 ckpt/base ckpt/sparse --sign keys/test.key` |
| `v3-dense.wdb` | `wdiff pack ckpt/base ckpt/dense`: format version 3, MDENSE records |
| `v3-adam.wdb` | `wdiff pack ckpt/base ckpt/adam`: format version 3, CSPARSE and MSPARSE records |
| `v3-rows.wdb` | `wdiff pack ckpt/base ckpt/rows`: format version 3, RSPARSE records (a row list, then CSPARSE over the rows that changed) |
| `v3-struct.wdb` | `wdiff pack ckpt/base ckpt/struct`: as `struct.wdb` but format version 3, its one sparse chunk MSPARSE (range-coded values are smaller there) |
| `corrupt/sparse-truncated.wdb` | `sparse.wdb` without its last 100 bytes |
| `corrupt/sparse-flipped.wdb` | `sparse.wdb` with one bit of its first record's payload flipped |
| `keys/test.key`, `keys/test.key.pub` | **a TEST signing key**, made once with `wdiff keygen` and published here on purpose: never trust it for anything |

Every bundle is packed with `-j 1`; make.py also packs each with `-j 4` and
with `WDIFF_NATIVE=0` and fails unless the bytes are the same.
"""


KEYS_README = """\
# TEST KEY: never trust it

`test.key` is an unencrypted Ed25519 secret key made once with
`wdiff keygen` for the golden signed bundle (`../signed.wdb.minisig`). It is
published in this repository on purpose, so anyone can sign anything with
it: never list `test.key.pub` as a trusted key outside the tests.
`tests/golden/make.py` keeps it as it is; delete both files and rerun
make.py only if a new test key is needed (every signature then changes).
"""


def generate(out: Path, keys_from: Path | None):
    out.mkdir(parents=True, exist_ok=True)
    checkpoints(out / "ckpt")
    (out / "keys").mkdir()
    if keys_from is not None and (keys_from / KEY).exists():
        for f in (KEY, KEY + ".pub"):
            shutil.copyfile(keys_from / f, out / f)
    else:
        wdiff("keygen", "-q", KEY, cwd=out)
    bundles(out)
    (out / "README.md").write_text(README.format(version=version()))
    (out / "keys" / "README.md").write_text(KEYS_README)


def tree(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


def compare(new: Path, old: Path) -> list[str]:
    a, b = tree(new), tree(old)
    out = [f"would add {k}" for k in sorted(a.keys() - b.keys())]
    out += [f"would remove {k}" for k in sorted(b.keys() - a.keys())]
    out += [f"would change {k}" for k in sorted(a.keys() & b.keys()) if not filecmp.cmp(a[k], b[k], shallow=False)]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if regenerating would change a committed file")
    ap.add_argument("--data", type=Path, default=DATA, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    data = opts.data.resolve()
    if opts.check and not (data / KEY).exists():
        print(f"make.py: {data / KEY} is missing; run make.py without --check", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="wdiff-golden-") as t:
        new = Path(t) / "data"
        generate(new, data if (data / KEY).exists() else None)
        changes = compare(new, data) if data.exists() else ["would create everything"]
        if opts.check:
            for c in changes:
                print(c)
            print("make.py --check: " + (f"{len(changes)} difference(s)" if changes else "up to date"),
                  file=sys.stderr)
            return 1 if changes else 0
        if data.exists():
            shutil.rmtree(data)
        shutil.copytree(new, data)
        if (data / KEY).exists():
            os.chmod(data / KEY, 0o600)
        for c in changes:
            print(c.replace("would ", ""))
        print(f"make.py: {data} " + ("rewritten" if changes else "unchanged"), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
