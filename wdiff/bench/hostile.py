"""Cost of hostile bundles, record type by record type:
``python -m wdiff.bench.hostile [--size 64MiB] [--case NAME ...]``.

Each case builds a checkpoint A, a *valid* bundle over it (one that
``wdiff apply`` accepts, or that the format's rules make it refuse early)
chosen to cost a reader the most per byte of bundle within the format's
limits, and runs ``wdiff apply BUNDLE A -o OUT`` as a separate process. It
prints, per case: the records, the bundle and output sizes, the exit
status, the CPU time of the apply process (user + system, from wait4, all
its threads), that CPU per MB of bundle and per GB of output, and the
process's peak RSS. Output bytes legitimately cost time (a tiny bundle that
rebuilds a file of zeros the user asked for is fine); what must not grow is
the CPU per GB of output, or the CPU per MB of bundle where the output is
small.

The DELTA bundles are written by hand from the published format
(man/wdiff-format.5: record header, record digest, chain digest, index
summary), over the index of an honest pack of A and B, so that any record
list can be tried; the others are what ``wdiff pack`` writes for hostile
*checkpoints* (the shapes that cost most per byte).

Cases:
  delta-same-window   one-byte ZSTD_BASE records, each naming the same
                      64 MiB window of the base file (issue 33: over 1,000 s
                      of CPU per MB before the window budget; now refused
                      at the first record, status 4)
  delta-budget        the most window bytes the budget allows: one-byte
                      records every 16 MiB, each naming a 64 MiB window
                      (4 times the bytes up to it; smaller files: the whole
                      file, every quarter of it)
  delta-tiny-zstd     one-byte ZSTD_BASE records every 64 bytes, each with
                      a 256-byte window (per-record cost)
  delta-tiny-xor      one-byte word-codec records every 64 bytes
  file-zeros          a companion file of --size zeros, stored whole (a FILE
                      record of a few hundred bytes)
  chunk-per-tensor    --tensors one-element tensors, every one changed, one
                      RAW CHUNK record each (written by hand: per-record cost)
  header-tensors      a new tensor file of --tensors one-element zero
                      tensors with short names (a HEADER record, the index's
                      tensor digests all alike: per-tensor cost)
  chunk-tiny-tensors  --tensors one-element tensors, every one changed (what
                      pack writes: CHUNK records over many tiny tensors)
  chunk-sparse        one fp32 tensor of --size bytes, one element changed
                      per MiB (sparse CHUNK records covering 64 MiB each)
  chunk-dense         the same tensor, every element changed (dense CHUNK
                      records: the bundle is as large as the output)
  codec-NAME          a --size F32 tensor, one ulp moved at 10% of its words,
                      as 4 MiB CHUNK records of one codec each (sparse,
                      bitmap, dense, msparse, mbitmap, mdense, csparse,
                      cdense, rsparse; written by hand: every codec's decode)

A measurement tool, not a test (tests/threat/test_record_costs.py is).
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash
import zstandard

MiB = 1 << 20
RECORD = struct.Struct("<4sBBBBIIQQQQQQ16s16s")  # the record header less its digest (96 bytes)
DELTA, ZSTD_BASE = 4, 16


def H(data) -> bytes:
    return xxhash.xxh3_128_digest(data)


# -- writing bundles by hand, from the published format ------------------------------


@dataclass
class Rec:
    """One record: the header fields a writer chooses, and its payload sections."""

    type: int
    codec: int
    word: int
    param: int
    file: int
    lo: int
    hi: int
    count: int
    base: bytes
    target: bytes
    parts: tuple[bytes, bytes, bytes]


def _footer_index(data: bytes) -> tuple[int, dict]:
    offset, length, raw_len = struct.unpack("<QQQ", data[-48:-24])
    raw = zstandard.ZstdDecompressor().decompress(data[offset : offset + length], max_output_size=raw_len)
    return offset, json.loads(raw)


def reseal(honest: Path, out: Path, records: list[Rec], version: int | None = None) -> dict:
    """Write ``out``: ``honest``'s preamble and index with ``records`` in
    place of its records (and ``version``, when given, as the bundle's),
    every digest resealed as a writer would (record digests, the chain
    digest and the index's record summary, the index digest and the
    footer). Returns the index."""
    data = honest.read_bytes()
    _, index = _footer_index(data)
    body = bytearray(data[:16])
    if version is not None:
        index["version"] = version
        body[8:12] = struct.pack("<I", version)
    chain = xxhash.xxh3_128()
    for r in records:
        lens = tuple(len(p) for p in r.parts)
        head = RECORD.pack(b"WREC", r.type, r.codec, r.word, r.param, r.file, 0, r.lo, r.hi, r.count, *lens,
                           r.base, r.target)
        payload = b"".join(r.parts)
        dig = H(payload + head)
        body += head + dig + payload
        chain.update(dig)
    index["records"] = {"count": len(records), "bytes": len(body) - 16, "digest": chain.hexdigest()}
    raw = json.dumps(index, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    packed = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(raw)
    footer = struct.pack("<QQQ", len(body), len(packed), len(raw)) + H(packed) + b"WDIFFEND"
    out.write_bytes(bytes(body) + packed + footer)
    return index


def zstd_base(file: int, lo: int, new: bytes, base: bytes, dlo: int, dhi: int) -> Rec:
    """A ZSTD_BASE record producing ``new`` at [lo, ...) with the window
    [dlo, dhi) of ``base`` (the frame does not refer to the window: any
    frame decodes against any dictionary)."""
    frame = zstandard.ZstdCompressor(level=1, write_content_size=True, write_checksum=False).compress(new)
    return Rec(DELTA, ZSTD_BASE, 1, 0, file, lo, lo + len(new), 0, H(base[dlo:dhi]), H(new),
               (struct.pack("<QQ", dlo, dhi), frame, b""))


def delta_records(case: str, base: bytes, target: bytearray, file: int, n: int) -> list[Rec]:
    """The records of a DELTA case; ``target`` is changed to what they rebuild."""
    size = len(base)
    out: list[Rec] = []
    if case == "delta-same-window":
        w = min(size, 64 * MiB)
        for j in range(min(n, 200)):  # 200 records: 15-40 s of CPU before the budget
            target[j] = base[j] ^ 1
            out.append(zstd_base(file, j, bytes(target[j : j + 1]), base, 0, w))
    elif case == "delta-budget":
        w = min(size, 64 * MiB)  # the largest window, every w/4 bytes: 4 x hi in all
        step = -(-w // 4)
        for hi in range(step, size + 1, step):
            target[hi - 1] = base[hi - 1] ^ 1
            dhi = max(w, hi)
            out.append(zstd_base(file, hi - 1, bytes(target[hi - 1 : hi]), base, dhi - w, dhi))
    elif case == "delta-tiny-zstd":
        for j in range(4, n + 4):
            hi = 64 * j
            if hi > size:
                break
            target[hi - 1] = base[hi - 1] ^ 1
            out.append(zstd_base(file, hi - 1, bytes(target[hi - 1 : hi]), base, hi - 256, hi))
    elif case == "delta-tiny-xor":
        from ..codec.filedelta import encode_xor  # the word codecs' sections (see CODECS in the spec)

        for j in range(1, n + 1):
            hi = 64 * j
            if hi > size:
                break
            target[hi - 1] = base[hi - 1] ^ 1
            old, new = base[hi - 1 : hi], bytes(target[hi - 1 : hi])
            word, enc = encode_xor(np.frombuffer(old, np.uint8), np.frombuffer(new, np.uint8), 3)
            parts = tuple(enc.parts) + (b"",) * (3 - len(enc.parts))
            out.append(Rec(DELTA, enc.codec, word, enc.param, file, hi - 1, hi, enc.count, H(old), H(new), parts))
    else:
        raise ValueError(case)
    return out


def delta_bundle(root: Path, base: bytes, make, name: str = "hostile.wdiff") -> tuple[Path, Path, Path]:
    """(A, B, bundle): checkpoint A holds ``base`` as w.bin (at least 1 MiB,
    so that it goes as DELTA records), B the bytes ``make(base, target)``
    rebuilds (it edits ``target``, a copy of ``base``, and returns the
    records of file 1), and the bundle holds those records over the index
    of an honest pack of A and B."""
    target = bytearray(base)
    recs = make(base, target)
    A = _write(root / "A", {"w.bin": base})
    B = _write(root / "B", {"w.bin": bytes(target)})
    wdiff("pack", A, B, "-o", root / "honest.wdiff")
    index = reseal(root / "honest.wdiff", root / name, recs)
    # the files sort config.json, w.bin: w.bin is file 1
    assert [(f["path"], f.get("source")) for f in index["target"]["files"]][1] == ("w.bin", "delta"), index
    return A, B, root / name


# -- checkpoints ---------------------------------------------------------------------


def safetensors(tensors: dict[str, np.ndarray]) -> bytes:
    """A safetensors file of little-endian F32 tensors, in the order given."""
    head, off = {}, 0
    for name, a in tensors.items():
        head[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(a.astype("<f4").tobytes() for a in tensors.values())


def _write(root: Path, files: dict[str, bytes]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text('{"model_type": "hostile"}\n')
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


def wdiff(*args, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "wdiff", *map(str, args)], capture_output=True, text=True, check=False)
    if check and r.returncode:
        raise RuntimeError(f"wdiff {' '.join(map(str, args))}: exit {r.returncode}\n{r.stderr}")
    return r


DELTA_CASES = ("delta-same-window", "delta-budget", "delta-tiny-zstd", "delta-tiny-xor")
PACK_CASES = ("file-zeros", "header-tensors", "chunk-tiny-tensors", "chunk-sparse", "chunk-dense")
#: the tensor codecs, each measured on its own: (name, codec number)
CHUNK_CODECS = (("sparse", 1), ("bitmap", 2), ("dense", 3), ("msparse", 5), ("mbitmap", 6), ("mdense", 7),
                ("csparse", 8), ("cdense", 9), ("rsparse", 10))
CODEC_CASES = tuple(f"codec-{c}" for c, _ in CHUNK_CODECS)
CASES = DELTA_CASES + ("chunk-per-tensor",) + PACK_CASES + CODEC_CASES


def per_tensor_records(va: np.ndarray, vb: np.ndarray, file: int) -> list[Rec]:
    """One RAW CHUNK record per one-element F32 tensor (tensor k at data
    bytes [4k, 4k + 4)): the most records a tensor file can have."""
    from ..codec.chunk import encode_raw  # RAW's section (byte planes, zstd; see CODECS in the spec)

    out = []
    for k in range(va.size):
        old, new = va[k : k + 1].astype("<f4"), vb[k : k + 1].astype("<f4")
        enc = encode_raw(new.view("<u4"), 3)
        out.append(Rec(1, enc.codec, 4, 0, file, 4 * k, 4 * k + 4, 0, H(H(old.tobytes())), H(H(new.tobytes())),
                       (enc.parts[0], b"", b"")))
    return out


PIECE = 4 * MiB


def chunk_digest(x: bytes) -> bytes:
    """The chunk digest of a block-aligned piece of one tensor: H of its
    block digests (blocks counted from the tensor's first byte)."""
    return H(b"".join(H(x[i : i + MiB]) for i in range(0, len(x), MiB)))


def codec_records(codec: int, va: np.ndarray, vb: np.ndarray, cols: int, file: int) -> list[Rec]:
    """One tensor (F32, ``cols`` columns) as CHUNK records of ``codec``, one
    per 4 MiB block-aligned piece (RSPARSE with the tensor's rows, CSPARSE,
    CDENSE and RSPARSE with F32's bucket function)."""
    from ..codec.chunk import bucket_function, encode_as, rows_of_tensor  # the codecs' sections (see CODECS)

    old, new = va.astype("<f4").view("<u4"), vb.astype("<f4").view("<u4")
    out = []
    for lo in range(0, old.nbytes, PIECE):
        a, b = lo // 4, min(old.size, (lo + PIECE) // 4)
        rows = rows_of_tensor((old.size // cols, cols), 1, a) if codec == 10 else None
        enc = encode_as(codec, old[a:b], new[a:b], 3, bucket_function("F32", 4), rows)
        parts = tuple(enc.parts) + (b"",) * (3 - len(enc.parts))
        ob, nb = old[a:b].tobytes(), new[a:b].tobytes()
        out.append(Rec(1, enc.codec, 4, enc.param, file, lo, lo + len(nb), enc.count, chunk_digest(ob),
                       chunk_digest(nb), parts))
    return out


def build(case: str, root: Path, size: int, n: int = 20000, tensors: int = 1 << 17) -> tuple[Path, Path, int]:
    """(A, the hostile bundle, the bytes apply writes) for ``case``."""
    rng = np.random.default_rng(33)
    bundle = root / f"{case}.wdiff"
    if case in DELTA_CASES:
        A, _, bundle = delta_bundle(root, rng.bytes(size), lambda b, t: delta_records(case, b, t, 1, n),
                                    name=f"{case}.wdiff")
        return A, bundle, size
    a = {}
    b = {}
    if case == "file-zeros":
        b["zeros.bin"] = bytes(size)
    elif case == "header-tensors":
        # short names, every tensor zero: the header and the index's tensor
        # digests compress as well as they can
        b["model.safetensors"] = safetensors({f"t{k}": np.zeros(1, np.float32) for k in range(tensors)})
    elif case in ("chunk-tiny-tensors", "chunk-per-tensor"):
        va = rng.standard_normal(tensors).astype(np.float32)
        vb = va + np.float32(1)
        a["model.safetensors"] = safetensors({f"layers.{k}.w": va[k : k + 1] for k in range(tensors)})
        b["model.safetensors"] = safetensors({f"layers.{k}.w": vb[k : k + 1] for k in range(tensors)})
    else:
        va = rng.standard_normal(size // 4).astype(np.float32)
        vb = va.copy()
        if case == "chunk-sparse":
            vb[:: MiB // 4] += np.float32(1)
        else:
            vb = rng.standard_normal(size // 4).astype(np.float32)
        a["model.safetensors"] = safetensors({"w": va})
        b["model.safetensors"] = safetensors({"w": vb})
    if case in CODEC_CASES:
        # one ulp moved at 10% of the words, at random: every codec has work in every word's bucket
        cols = 1024
        va = rng.standard_normal(size // 4 // cols * cols).astype(np.float32)
        vb = va.copy()
        idx = rng.choice(va.size, va.size // 10, replace=False)
        vb[idx] = np.nextafter(va[idx], np.float32(np.inf))
        a["model.safetensors"] = safetensors({"w": va.reshape(-1, cols)})
        b["model.safetensors"] = safetensors({"w": vb.reshape(-1, cols)})
    A = _write(root / "A", a)
    B = _write(root / "B", b)
    if case in CODEC_CASES:
        wdiff("pack", A, B, "-o", root / "honest.wdiff")
        codec = dict(CHUNK_CODECS)[case.removeprefix("codec-")]
        index = reseal(root / "honest.wdiff", bundle, codec_records(codec, va, vb, cols, 1),
                       version=3 if codec >= 5 else None)
        assert index["target"]["files"][1]["path"] == "model.safetensors"
    elif case == "chunk-per-tensor":
        wdiff("pack", A, B, "-o", root / "honest.wdiff")
        index = reseal(root / "honest.wdiff", bundle, per_tensor_records(va, vb, 1))
        assert index["target"]["files"][1]["path"] == "model.safetensors"
    else:
        wdiff("pack", A, B, "-o", bundle)
    out = sum(p.stat().st_size for p in B.iterdir())
    return A, bundle, out


# -- measuring -----------------------------------------------------------------------

#: forks ``python -m wdiff ARGS`` and prints its own rusage: measured from a
#: small launcher, not from this process (Linux carries a process's peak
#: RSS across fork, and this one held the checkpoints it built)
_LAUNCHER = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execv(sys.executable, [sys.executable, '-m', 'wdiff', *sys.argv[1:]])\n"
    "_, status, ru = os.wait4(pid, 0)\n"
    "print(os.waitstatus_to_exitcode(status), ru.ru_utime + ru.ru_stime, ru.ru_maxrss, file=sys.stderr)\n"
)


def measure(*args) -> tuple[int, float, float, str]:
    """(exit status, CPU seconds, peak RSS in MiB, stderr) of one wdiff command."""
    r = subprocess.run([sys.executable, "-c", _LAUNCHER, *map(str, args)], capture_output=True, text=True,
                       check=False)
    lines = r.stderr.strip().splitlines()
    rc, cpu, rss = lines[-1].split()
    return int(rc), float(cpu), int(rss) / 1024, "\n".join(lines[:-1])


def records_of(bundle: Path) -> int:
    _, index = _footer_index(bundle.read_bytes())
    return index["records"]["count"]


def _size(s: str) -> int:
    s = s.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": MiB, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s.rstrip("KMG")) * mult)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wdiff.bench.hostile", description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="64MiB", help="the companion file / tensor size (default 64MiB)")
    ap.add_argument("--records", type=int, default=20000, help="records of the per-record cases (default 20000)")
    ap.add_argument("--tensors", type=int, default=1 << 17,
                    help="tensors of the tensor-count cases (default 131072)")
    ap.add_argument("--case", action="append", choices=CASES, help="run only these cases")
    ap.add_argument("--keep", type=Path, help="build in this directory and keep it")
    a = ap.parse_args(argv)
    size = _size(a.size)
    cols = ("case", "records", "bundle MB", "output MB", "exit", "CPU s", "CPU s/MB bundle", "CPU s/GB out",
            "peak RSS MiB")
    # the interpreter's and wdiff's start-up, left out of the per-MB figures
    start = min(measure("--version")[1] for _ in range(3))
    print(f"start-up (wdiff --version): {start:.2f} s CPU, left out of the per-MB and per-GB columns")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for case in a.case or CASES:
        root = Path(tempfile.mkdtemp(prefix=f"wdiff-hostile-{case}-", dir=a.keep))
        try:
            A, bundle, out = build(case, root, size, a.records, a.tensors)
            rc, cpu, rss, err = measure("apply", bundle, A, "-o", root / "OUT", "--quiet")
            mb = bundle.stat().st_size / 1e6
            work = max(0.0, cpu - start)
            row = (case, records_of(bundle), f"{mb:.3f}", f"{out / 1e6:.1f}", rc, f"{cpu:.2f}", f"{work / mb:.1f}",
                   f"{work / (out / 1e9):.1f}" if out else "-", f"{rss:.0f}")
            print("| " + " | ".join(map(str, row)) + " |", flush=True)
            if rc:
                print(f"|   {err.strip().splitlines()[-1][:150] if err.strip() else ''}", flush=True)
        finally:
            if a.keep is None:
                shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
