"""``pack``: write the bundle that turns checkpoint A into checkpoint B.

One pass over both checkpoints: each unit of B is read and hashed, and, when
its digest differs from the same bytes of A, encoded element by element.
Unchanged units cost nothing but their digests in the index.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


from . import format as fmt
from . import manifest
from .blockio import FdCache, known_digests, read_base, read_target, scratch, span_digests
from .bundle import ZERO, BundleWriter
from .checkpoint import KIND_TENSORS, Checkpoint, FileEntry, scan
from .codecs import CODEC_NAMES, DEFAULT_LEVEL, ZSTD, compressor, encode_delta, encode_raw
from .dtypes import uint_type
from .errors import UsageError
from .fsutil import io_error
from .hashing import hexd, tree
from .parallel import default_threads, ordered_map
from .plan import DEFAULT_CHUNK, Unit, pack_units
from .progress import SILENT, Reporter

SCHEMA = "wdiff.pack/1"
WRITER = "wdiff 0.1.0"


@dataclass(frozen=True)
class CodecStat:
    records: int = 0
    changed: int = 0  # changed words
    bytes: int = 0  # payload bytes

    def add(self, changed: int, nbytes: int) -> CodecStat:
        return CodecStat(self.records + 1, self.changed + changed, self.bytes + nbytes)


@dataclass(frozen=True)
class PackResult:
    bundle: str
    bundle_id: bytes
    base_fingerprint: bytes | None
    target_fingerprint: bytes
    bundle_bytes: int
    target_bytes: int  # size of checkpoint B
    tensors: int
    tensors_changed: int  # modified, added or retyped
    files_stored: int  # companion files and headers stored in the bundle
    changed_elements: int
    codecs: dict[str, CodecStat] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def ratio(self) -> float:
        return self.target_bytes / self.bundle_bytes if self.bundle_bytes else float("inf")

    @property
    def bytes_per_changed(self) -> float | None:
        return self.bundle_bytes / self.changed_elements if self.changed_elements else None

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "bundle": self.bundle,
            "bundle_id": hexd(self.bundle_id),
            "base_fingerprint": hexd(self.base_fingerprint) if self.base_fingerprint else None,
            "target_fingerprint": hexd(self.target_fingerprint),
            "bundle_bytes": self.bundle_bytes,
            "target_bytes": self.target_bytes,
            "ratio": self.ratio,
            "tensors": self.tensors,
            "tensors_changed": self.tensors_changed,
            "files_stored": self.files_stored,
            "changed_elements": self.changed_elements,
            "bytes_per_changed_element": self.bytes_per_changed,
            "codecs": {k: {"records": v.records, "changed_elements": v.changed, "bytes": v.bytes} for k, v in self.codecs.items()},
            "warnings": list(self.warnings),
        }


def pack(
    a,
    b,
    out,
    *,
    level: int = DEFAULT_LEVEL,
    threads: int | None = None,
    chunk: int = DEFAULT_CHUNK,
    reporter: Reporter = SILENT,
) -> PackResult:
    """Write to ``out`` a bundle that turns checkpoint ``a`` into ``b``.
    With ``a=None`` the bundle is a full anchor that builds ``b`` from nothing."""
    if not 1 <= level <= 22:
        raise UsageError(f"compression level {level} is out of range (1..22)")
    threads = threads or default_threads()
    A = scan(a) if a is not None else None
    B = scan(b, reuse=A)
    if os.path.abspath(os.fspath(out)).startswith(os.path.abspath(B.root) + os.sep):
        raise UsageError("the bundle must not be written inside the target checkpoint")
    warnings = tuple(
        f"{c.root}: {f.path}: handled as an opaque file: {f.note}" for c in (A, B) if c for f in c.files if f.note
    )
    for w in warnings:
        reporter.warn(w)
    base_tensors = A.tensors if A else {}
    da, db = manifest.Digests(), manifest.Digests()
    stats: dict[str, CodecStat] = {}
    changed_tensors: set[str] = set()
    changed_elements = 0
    files_stored = 0
    targets: list[fmt.TargetFile] = []
    work = [(i, f, u) for i, f in enumerate(B.files) if f.kind == KIND_TENSORS for u in pack_units(f.header, base_tensors, chunk)]
    reporter.phase("pack", sum(u.nbytes for _, _, u in work) + sum(f.size for f in B.files if f.kind != KIND_TENSORS))
    with BundleWriter(out, level=level) as w, FdCache() as fds:
        known = (manifest.cached_tensors(A) if A else manifest.Known(), manifest.cached_tensors(B))
        results = ordered_map(lambda it: _pack_unit(fds, level, known, *it), work, threads=threads)
        pending = next(results, None)
        for i, f in enumerate(B.files):
            if f.kind != KIND_TENSORS:
                targets.append(_companion(w, i, f, A, da, db, reporter))
                files_stored += targets[-1].source == "bundle"
                continue
            old = A.file(f.path) if A else None
            from_base = old is not None and old.header is not None and old.header.raw == f.header.raw
            if not from_base:
                w.add(_header_record(i, f), (compressor(level).compress(f.header.raw),))
                files_stored += 1
            while pending is not None and pending[0] == i:
                _, unit, a_dig, b_dig, enc = pending
                db.put_unit(unit, b_dig)
                if a_dig is not None:
                    da.put_unit(unit, a_dig, base=True)
                if enc is not None:
                    rh = w.add(_chunk_record(i, unit, a_dig, b_dig, enc), enc.parts)
                    name = CODEC_NAMES[enc.codec]
                    stats[name] = stats.get(name, CodecStat()).add(enc.count, rh.payload_len + fmt.RECORD.size)
                    changed_elements += enc.count
                    changed_tensors.update(_changed_spans(unit, a_dig, b_dig))
                reporter.advance(unit.nbytes)
                pending = next(results, None)
            db.tensors.update({t.name: bytearray() for t in f.header.tensors if t.nbytes == 0})
            targets.append(_tensor_target(i, f, db, from_base))
        reporter.phase("hash base", None)
        base_fp, base_rows = None, ()
        if A is not None:
            mA = manifest.complete(A, da, threads=threads, reporter=reporter, cached=known[0].paths)
            base_fp = mA.fingerprint
            base_rows = tuple(fmt.FileRow(d.path, d.kind, d.size, d.digest) for d in mA.files)
        mB = db.manifest(B)
        index = fmt.Index(
            writer=WRITER,
            base_fingerprint=base_fp,
            base_files=base_rows,
            target_fingerprint=mB.fingerprint,
            files=tuple(targets),
            records_count=w.count,
            records_bytes=w.records_bytes,
            records_digest=w.records_digest,
        )
        bundle_id = w.finish(index)
    manifest.remember(B, db, skip=known[1].paths)  # B is the next step's base: its digests are known now
    reporter.done()
    return PackResult(
        bundle=os.fspath(out),
        bundle_id=bundle_id,
        base_fingerprint=base_fp,
        target_fingerprint=mB.fingerprint,
        bundle_bytes=os.path.getsize(out),
        target_bytes=B.total_bytes,
        tensors=len(B.tensors),
        tensors_changed=len(changed_tensors),
        files_stored=files_stored,
        changed_elements=changed_elements,
        codecs=dict(sorted(stats.items())),
        warnings=warnings,
    )


def _pack_unit(fds: FdCache, level: int, known: tuple[dict, dict], i: int, f: FileEntry, unit: Unit):
    known_a, known_b = known
    b_dig = known_digests(unit, known_b)
    a_dig = known_digests(unit, known_a, base=True) if unit.delta else None
    if a_dig is not None and a_dig == b_dig:  # unchanged by digests the manifest cache holds: nothing to read
        return i, unit, a_dig, b_dig, None
    bbuf = scratch("b", unit.nbytes)
    read_target(fds, f, unit, bbuf)
    return encode_unit(fds, level, i, unit, bbuf, b_dig=b_dig, a_dig=a_dig)


def encode_unit(fds: FdCache, level: int, i: int, unit: Unit, bbuf, *, b_dig=None, a_dig=None):
    """Encode the target bytes ``bbuf`` of a unit against its base bytes
    (read here): (file index, unit, base digests, target digests, Encoded
    or None when nothing changed). Shared by pack and squash. Digests
    already known (``b_dig``, ``a_dig``: from the manifest cache) are not
    computed again."""
    if b_dig is None:
        b_dig = span_digests(unit, bbuf)
    ut = uint_type(unit.word)
    if not unit.delta:
        return i, unit, None, b_dig, encode_raw(bbuf.view(ut), level)
    if a_dig == b_dig:
        return i, unit, a_dig, b_dig, None
    abuf = scratch("a", unit.nbytes)
    read_base(fds, unit, abuf)
    if a_dig is None:
        a_dig = span_digests(unit, abuf)
        if a_dig == b_dig:
            return i, unit, a_dig, b_dig, None
    return i, unit, a_dig, b_dig, encode_delta(abuf.view(ut), bbuf.view(ut), level)


def _changed_spans(unit: Unit, a_dig, b_dig):
    for k, s in enumerate(unit.spans):
        if a_dig is None or a_dig[k] != b_dig[k]:
            yield s.tensor.name


def _chunk_record(i: int, unit: Unit, a_dig, b_dig, enc) -> fmt.RecordHeader:
    return fmt.RecordHeader(
        type=fmt.CHUNK, codec=enc.codec, word=unit.word, param=enc.param, file=i,
        lo=unit.lo, hi=unit.hi, count=enc.count, lens=(0, 0, 0),
        base=tree(b"".join(a_dig)) if a_dig is not None else ZERO,
        target=tree(b"".join(b_dig)),
    )


def _header_record(i: int, f: FileEntry) -> fmt.RecordHeader:
    import xxhash

    return fmt.RecordHeader(
        type=fmt.HEADER, codec=ZSTD, word=1, param=0, file=i, lo=0, hi=len(f.header.raw), count=0,
        lens=(0, 0, 0), base=ZERO, target=xxhash.xxh3_128_digest(f.header.raw),
    )


def _tensor_target(i: int, f: FileEntry, db: manifest.Digests, from_base: bool) -> fmt.TargetFile:
    import xxhash

    from .hashing import tensor_file_digest

    hd = xxhash.xxh3_128_digest(f.header.raw)
    tds = tuple(tree(bytes(db.tensors[t.name])) for t in f.header.tensors)
    return fmt.TargetFile(
        f.path, KIND_TENSORS, f.size, tensor_file_digest(hd, list(tds)),
        "base" if from_base else "bundle", hd, len(f.header.raw), tds,
    )


def _companion(w: BundleWriter, i: int, f: FileEntry, A: Checkpoint | None, da, db, reporter) -> fmt.TargetFile:
    blocks = manifest.hash_file(f.abspath, f.size)
    db.files[f.path] = blocks
    digest = tree(blocks)
    old = A.file(f.path) if A else None
    if old is not None and old.kind != KIND_TENSORS:
        if old.path not in da.files:
            da.files[old.path] = manifest.hash_file(old.abspath, old.size)
        if tree(da.files[old.path]) == digest and old.size == f.size:
            reporter.advance(f.size)
            return fmt.TargetFile(f.path, "file", f.size, digest, "base")
    rh = fmt.RecordHeader(
        type=fmt.FILE, codec=ZSTD, word=1, param=0, file=i, lo=0, hi=f.size, count=0,
        lens=(0, 0, 0), base=ZERO, target=digest,
    )
    try:
        with open(f.abspath, "rb") as src:
            w.add_stream(rh, src, f.size)
    except OSError as e:
        raise io_error(f.abspath, e) from None
    reporter.advance(f.size)
    return fmt.TargetFile(f.path, "file", f.size, digest, "bundle")

