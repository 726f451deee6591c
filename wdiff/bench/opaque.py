"""Benchmark of opaque (companion) files: ``python -m wdiff.bench.opaque``.

Each case writes a checkpoint directory A holding one opaque file (a
pytorch_model.bin-like zip of fp32 or bf16 arrays, a GGUF-like file, an
optimizer state) and a version B of it, then prints, side by side from the
same run: the bundle wdiff wrote before format version 3 (the changed file
stored whole as one zstd frame: ``pack --format 2``), the bundle it writes
now (DELTA records), ``zstd --patch-from=A --long`` of the file (the real
zstd binary, default level 3, when installed: the table says when it is
absent), and wdiff's size over zstd's. Every bundle is applied and the
result compared byte for byte with B.

Cases:
  bin-fp32-1%    36 MB of fp32 arrays, 1% of the values moved (an RL or SFT step)
  bin-fp32-30%   the same at 30%
  bin-bf16-1%    bf16 arrays, 1% moved
  optim-dense    fp32 Adam moments, every value moved a little
  gguf-insert    a GGUF-like file with 64 KiB of metadata inserted near its start
  gguf-insert-6M the same with 6 MiB inserted (past the dictionary window)
  append         2 MiB appended to the file
  truncate       the last 3 MiB cut off, 1% moved in what is left
  reorder        two of the eight arrays swapped (a re-save in another key order)
  reorder-many   256 arrays of the file shuffled (many small moves)
  torch-resave   48 arrays of varied sizes re-saved in another order (the
                 zip headers renumbered with them)
  resave-1%      the same re-save, with 1% of the values moved too
  far-move       a 140 MiB file whose first and last 16 MiB of arrays swap
                 places (moved 108 MiB, past any nearby window; zeros between)
  unrelated      B has nothing in common with A (the worst case)

A measurement tool, not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

CASES = ("bin-fp32-1%", "bin-fp32-30%", "bin-bf16-1%", "optim-dense", "gguf-insert", "gguf-insert-6M",
         "append", "truncate", "reorder", "reorder-many", "torch-resave", "resave-1%", "far-move", "unrelated")


def _zip_like(arrays: list[bytes], rng) -> bytes:
    """A pytorch_model.bin-like container: a local header before each array's
    bytes (64-byte aligned, as torch.save aligns them), a directory at the end."""
    out = bytearray()
    for k, a in enumerate(arrays):
        name = f"archive/data/{k}".encode()
        hdr = b"PK\x03\x04" + struct.pack("<HHHHHIIIHH", 20, 0, 0, 0, 0, 0, len(a), len(a), len(name), 0) + name
        pad = (-(len(out) + len(hdr) + 4)) % 64
        out += hdr + struct.pack("<HH", 0xCAFE, pad) + b"\0" * pad + a
    out += b"PK\x05\x06" + rng.bytes(60)
    return bytes(out)


def _weights(rng, n: int) -> np.ndarray:
    return (rng.standard_normal(n) * 0.02).astype(np.float32)


def _moved(rng, a: np.ndarray, frac: float, rel: float = 1e-3) -> np.ndarray:
    b = a.copy()
    k = int(a.size * frac)
    idx = rng.choice(a.size, k, replace=False) if frac < 1 else np.arange(a.size)
    step = (rng.standard_normal(idx.size) * rel).astype(np.float32)
    b[idx] = (b[idx] * (1 + step)).astype(np.float32)
    if frac < 1:  # a move smaller than an ulp leaves a value as it was: force a change
        same = b[idx] == a[idx]
        b[idx[same]] = np.nextafter(a[idx[same]], np.float32(np.inf))
    return b


def _bf16(x: np.ndarray) -> np.ndarray:
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def _gguf_like(rng, size: int) -> tuple[bytes, bytes]:
    """Header + metadata (key/value strings) + quantized blocks (scale + 4-bit nibbles)."""
    meta = b"".join(struct.pack("<Q", 12) + f"general.k{k:03d}".encode() + struct.pack("<I", k) for k in range(300))
    blocks = bytearray()
    nb = size // 18
    scales = (rng.standard_normal(nb) * 0.01).astype(np.float16).view(np.uint8).reshape(nb, 2)
    nibbles = rng.integers(0, 256, size=(nb, 16), dtype=np.uint8)
    blocks = np.concatenate([scales, nibbles], axis=1).tobytes()
    return b"GGUF" + struct.pack("<IQQ", 3, 200, 300) + meta, blocks


def make_case(case: str, size: int, seed: int = 7) -> tuple[str, bytes, bytes]:
    rng = np.random.default_rng(seed)
    n = size // 4
    if case.startswith("bin-fp32") or case in ("append", "truncate", "reorder"):
        parts = [_weights(rng, n // 8) for _ in range(8)]
        a = _zip_like([p.tobytes() for p in parts], rng)
        if case == "reorder":
            order = [0, 6, 2, 3, 4, 5, 1, 7]
            return "pytorch_model.bin", a, _zip_like([parts[k].tobytes() for k in order], np.random.default_rng(seed))
        if case == "append":
            return "pytorch_model.bin", a, a + rng.bytes(2 << 20)
        frac = 0.30 if case.endswith("30%") else 0.01
        b = _zip_like([_moved(rng, p, frac).tobytes() for p in parts], rng)
        if case == "truncate":
            b = b[: len(b) - (3 << 20)]
        return "pytorch_model.bin", a, b
    if case == "bin-bf16-1%":
        parts = [_weights(rng, n // 4) for _ in range(8)]  # as many bytes as the fp32 cases
        a = _zip_like([_bf16(p).tobytes() for p in parts], rng)
        b = _zip_like([_bf16(_moved(rng, p, 0.01, rel=2e-2)).tobytes() for p in parts], rng)
        return "pytorch_model.bin", a, b
    if case == "optim-dense":
        parts = [np.abs(_weights(rng, n // 8)) for _ in range(8)]
        a = _zip_like([p.tobytes() for p in parts], rng)
        b = _zip_like([_moved(rng, p, 1.0, rel=1e-4).tobytes() for p in parts], rng)
        return "optimizer.pt", a, b
    if case.startswith("gguf-insert"):
        head, blocks = _gguf_like(rng, size)
        extra = rng.bytes(6 << 20) if case.endswith("6M") else rng.bytes(64 << 10)
        return "model.gguf", head + blocks, head + extra + blocks
    if case == "reorder-many":
        parts = [_weights(rng, n // 256).tobytes() for _ in range(256)]
        order = rng.permutation(256)
        return "pytorch_model.bin", _zip_like(parts, rng), _zip_like([parts[k] for k in order], np.random.default_rng(seed))
    if case in ("torch-resave", "resave-1%"):
        sizes = rng.integers(1, 64, size=48)
        parts = [_weights(rng, int(n * k // sizes.sum())) for k in sizes]
        order = rng.permutation(48)
        moved = [_moved(rng, p, 0.01) if case == "resave-1%" else p for p in parts]
        return ("pytorch_model.bin", _zip_like([p.tobytes() for p in parts], rng),
                _zip_like([moved[k].tobytes() for k in order], np.random.default_rng(seed)))
    if case == "far-move":
        x, y = _weights(rng, 4 << 20).tobytes(), _weights(rng, 4 << 20).tobytes()
        gap = bytes(108 << 20)
        return "model.gguf", x + gap + y, y + gap + x
    if case == "unrelated":
        return "model.gguf", _weights(rng, n).tobytes(), _weights(rng, n).tobytes()
    raise ValueError(case)


def _zstd_patch_from(a: str, b: str, out: str) -> int | None:
    zstd = shutil.which("zstd")
    if zstd is None:
        return None
    size = max(os.path.getsize(a), os.path.getsize(b))
    long = max(27, min(31, (size - 1).bit_length() + 1))
    subprocess.run([zstd, "-q", "-f", f"--long={long}", f"--patch-from={a}", b, "-o", out], check=True)
    return os.path.getsize(out)


def run_case(case: str, size: int, work: str, threads: int) -> dict:
    import wdiff  # the package under test, imported here: the module docstring is usable alone

    name, a, b = make_case(case, size)
    A, B = os.path.join(work, "A"), os.path.join(work, "B")
    for d, data in ((A, a), (B, b)):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    row = {"case": case, "file": name, "bytes": len(b)}
    old = os.path.join(work, "v2.wdiff")
    wdiff.pack(A, B, old, threads=threads, overwrite=True, format_version=2, include=[name])
    row["whole"] = os.path.getsize(old)
    new = os.path.join(work, "v3.wdiff")
    t = time.perf_counter()
    res = wdiff.pack(A, B, new, threads=threads, overwrite=True, include=[name])
    row["pack_s"] = time.perf_counter() - t
    row["wdiff"] = os.path.getsize(new)
    row["codecs"] = ",".join(f"{k}x{v.records}" for k, v in res.codecs.items())
    out = os.path.join(work, "OUT")
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    wdiff.apply(new, A, out, threads=threads, include=[name])
    row["apply_s"] = time.perf_counter() - t
    with open(os.path.join(out, name), "rb") as f:
        row["exact"] = f.read() == b
    t = time.perf_counter()
    row["zstd"] = _zstd_patch_from(os.path.join(A, name), os.path.join(B, name), os.path.join(work, "B.zst"))
    row["zstd_s"] = time.perf_counter() - t
    return row


def _mb(n) -> str:
    return "-" if n is None else f"{n / 1e6:.3f}"


def print_table(rows: list[dict]) -> None:
    print(f"{'case':<15} {'file MB':>8} {'whole MB':>9} {'wdiff MB':>9} {'zstd-pf MB':>10} "
          f"{'wdiff/zstd':>10} {'pack s':>7} {'apply s':>7} {'zstd s':>7}  exact  records")
    for r in rows:
        ratio = "-" if r["zstd"] is None else f"{r['wdiff'] / r['zstd']:.3f}"
        print(f"{r['case']:<15} {_mb(r['bytes']):>8} {_mb(r['whole']):>9} {_mb(r['wdiff']):>9} {_mb(r['zstd']):>10} "
              f"{ratio:>10} {r['pack_s']:>7.2f} {r['apply_s']:>7.2f} {r['zstd_s']:>7.2f}  {r['exact']!s:<5}  {r['codecs']}")
    if any(r["zstd"] is None for r in rows):
        print("zstd is not installed: the zstd --patch-from column is empty (apt-get install zstd)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wdiff.bench.opaque", description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=36_000_000, help="bytes of each opaque file [36000000]")
    ap.add_argument("--case", action="append", choices=CASES, help="repeatable [all]")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="wdiff-bench-opaque-") as work:
        for case in args.case or CASES:
            rows.append(run_case(case, args.size, work, args.threads))
            print(f"  {case} done", file=sys.stderr)
    print_table(rows)
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
