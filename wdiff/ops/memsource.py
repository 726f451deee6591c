"""A target checkpoint held in memory: pack's target side read from live
tensors instead of a directory, so that a trainer can publish a step
without writing a full checkpoint first.

A :class:`MemoryTarget` is the checkpoint ``save_pretrained`` would write
(tensor files with their headers, companion files), described by headers
built here from each tensor's name, dtype and shape; the tensor bytes are
read on demand, unit by unit, through a callable per tensor. Packing it
runs the same record writer, encoders and digests as :func:`pack.pack`
(``encode_unit``, ``Tally``, ``_write_records``): only where B's bytes come
from differs, so the bundle is byte for byte the one ``pack`` would write
from the same checkpoint on disk.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import xxhash

from ..codec.dtypes import dtype_info
from ..defaults import DEFAULT_CHUNK, DEFAULT_LEVEL
from ..errors import UsageError
from ..format import records as fmt
from ..format.bundle import BundleWriter
from ..parallel import default_threads, ordered_map
from ..paths import printable
from ..progress import SILENT, Reporter
from ..store.blockio import FdCache, scratch
from ..store.checkpoint import KIND_FILE, KIND_TENSORS, Checkpoint, FileEntry, path_sort_key
from ..store.digests import Digests
from ..store.header import Header, parse_header
from .pack import WRITER, PackResult, Tally, _write_records, encode_unit
from .pair import Pair, UnitWork, format_version

#: fills ``out`` (uint8) with bytes [lo, hi) of one tensor's data
ReadFn = Callable[[int, int, np.ndarray], None]


@dataclass(frozen=True, slots=True)
class MemTensor:
    name: str
    dtype: str  # safetensors dtype name ("BF16", "F32", ...)
    shape: tuple[int, ...]
    read: ReadFn

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * dtype_info(self.dtype).word


def build_header(tensors: list[MemTensor], metadata: dict[str, str] | None = None) -> bytes:
    """The raw safetensors header (length prefix and JSON, padded with spaces
    to 8 bytes) of a file holding ``tensors`` in this order, back to back."""
    doc: dict = {}
    if metadata is not None:
        doc["__metadata__"] = dict(metadata)
    off = 0
    for t in tensors:
        if t.name in doc:
            raise UsageError(f"tensor {printable(t.name)} is given twice")
        doc[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    js = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js


#: headers parsed before, by their bytes: a trainer publishes the same layout
#: every step, and parsing a header of 20,000 tensors takes ~0.3 s
_PARSED: dict[tuple[bytes, int, str], Header] = {}


def _parsed(raw: bytes, size: int, path: str) -> Header:
    key = (xxhash.xxh3_128_digest(raw), size, path)
    hit = _PARSED.get(key)
    if hit is not None and hit.raw == raw:
        return hit
    header = parse_header(raw, size, where=printable(path))
    if len(_PARSED) >= 16:
        _PARSED.pop(next(iter(_PARSED)))
    _PARSED[key] = header
    return header


class MemoryTarget:
    """Tensor files (path, tensors in data order) and companion files (path,
    file on disk) as one checkpoint whose tensor bytes live in memory."""

    def __init__(self, tensor_files: list[tuple[str, list[MemTensor]]], companions: dict[str, str] | None = None,
                 *, metadata: dict[str, str] | None = None) -> None:
        self.readers: dict[str, ReadFn] = {}
        entries: list[FileEntry] = []
        for path, tensors in tensor_files:
            raw = build_header(tensors, metadata)
            size = len(raw) + sum(t.nbytes for t in tensors)
            header = _parsed(raw, size, path)
            entries.append(FileEntry(path, f"<memory>/{path}", size, KIND_TENSORS, header, (0, 0, 0, 0, 0)))
            for t in tensors:
                if t.name in self.readers:
                    raise UsageError(f"tensor {printable(t.name)} is given twice")
                self.readers[t.name] = t.read
        for path, abspath in (companions or {}).items():
            size = os.path.getsize(abspath)
            entries.append(FileEntry(path, abspath, size, KIND_FILE, None, (0, 0, 0, 0, 0)))
        entries.sort(key=lambda f: path_sort_key(f.path))
        self.checkpoint = Checkpoint(root="<memory>", files=tuple(entries))
        self.checkpoint.tensors  # noqa: B018 - refuses a name held twice

    def headers(self) -> dict[str, Header]:
        return {f.path: f.header for f in self.checkpoint.files if f.header is not None}

    def read_unit(self, unit, buf: np.ndarray) -> None:
        """Fill ``buf`` with the bytes of every span of ``unit``, in order."""
        pos = 0
        for s in unit.spans:
            n = s.hi - s.lo
            self.readers[s.tensor.name](s.lo, s.hi, buf[pos : pos + n])
            pos += n


class _MemoryPair(Pair):
    """A :class:`Pair` whose target is a :class:`MemoryTarget` (never cached:
    its stat keys are no identity)."""

    def __init__(self, A: Checkpoint | None, target: MemoryTarget,  # noqa: D107 - no super(): no scan
                 da: Digests | None = None) -> None:
        self.A, self.B = A, target.checkpoint
        self.version = format_version(self.A, self.B)
        self.excluded = ()
        self.warnings = ()
        self.da, self.db = (da if da is not None else Digests()), Digests()

    def remember_target(self) -> None:
        pass


def pack_memory(
    A: Checkpoint | None,
    target: MemoryTarget,
    out: str,
    *,
    level: int = DEFAULT_LEVEL,
    threads: int | None = None,
    chunk: int = DEFAULT_CHUNK,
    reporter: Reporter = SILENT,
    base_digests: Digests | None = None,
) -> PackResult:
    """Write to ``out`` the bundle that turns checkpoint ``A`` (scanned; None:
    an anchor) into ``target``. Memory: a unit of each side per worker
    thread; every byte of the target is read from memory once, every base
    unit with a target unit of the same name once, as :func:`pack.pack` does.
    ``base_digests``: an empty Digests that receives the block digests of
    every file of ``A``, hashed from the bytes read here (the base
    fingerprint is the result's): what an in-place update of ``A`` may
    then trust (wdiff.ops.apply.inplace.TrustedBase)."""
    threads = threads or default_threads()
    pair = _MemoryPair(A, target, base_digests)
    B = pair.B
    work = pair.units(chunk)
    reporter.phase("pack", sum(x.unit.nbytes for x in work))

    def one(fds: FdCache, x: UnitWork):
        bbuf = scratch("b", x.unit.nbytes)
        target.read_unit(x.unit, bbuf)
        return encode_unit(fds, level, x.file, x.unit, bbuf)

    with BundleWriter(out, level=level, version=pair.version) as w, FdCache() as fds:
        tally = Tally(w, level)
        results = ordered_map(lambda x: one(fds, x), work, threads=threads)
        targets = _write_records(pair, w, tally, results, reporter)
        mA = pair.complete_base(threads=threads, reporter=reporter)
        base_fp = mA.fingerprint if mA else None
        base_rows = tuple(fmt.FileRow(d.path, d.kind, d.size, d.digest) for d in mA.files) if mA else ()
        mB = pair.db.manifest(B)
        index = fmt.Index(
            version=w.version, writer=WRITER, base_fingerprint=base_fp, base_files=base_rows,
            target_fingerprint=mB.fingerprint, files=tuple(targets), records_count=w.count,
            records_bytes=w.records_bytes, records_digest=w.records_digest,
        )
        bundle_id = w.finish(index)
    reporter.done()
    return PackResult(
        bundle=os.fspath(out), bundle_id=bundle_id, base_fingerprint=base_fp, target_fingerprint=mB.fingerprint,
        bundle_bytes=os.path.getsize(out), target_bytes=B.total_bytes, tensors=len(B.tensors),
        tensors_changed=len(tally.changed_tensors), files_stored=tally.files_stored,
        changed_elements=tally.changed_elements, codecs=dict(sorted(tally.stats.items())),
    )
