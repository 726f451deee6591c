"""``pack``: write the bundle that turns checkpoint A into checkpoint B.

One pass over both checkpoints: each unit of B is read and hashed, and, when
its digest differs from the same bytes of A (read and hashed too), encoded
element by element. Unchanged units cost nothing but their digests in the
index. Nothing is taken from the manifest cache: what is encoded, and every
digest written, is what is on disk now.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import xxhash

from ..codec.chunk import CODEC_NAMES, CODEC_VERSION, ZSTD, Encoded, compressor, encode_delta, encode_raw, rows_of_tensor
from ..codec.dtypes import dtype_info, uint_type
from ..defaults import DEFAULT_CHUNK, DEFAULT_LEVEL, __version__
from ..errors import UsageError
from ..format import records as fmt
from ..format.bundle import ZERO, BundleWriter
from ..fsutil import check_output, io_error
from ..parallel import default_threads, ordered_map
from ..paths import PathLike
from ..progress import SILENT, Reporter
from ..store import ignore
from ..store.blockio import FdCache, read_base, read_target, scratch, span_digests
from ..store.checkpoint import KIND_TENSORS, Checkpoint, FileEntry
from ..store.digests import Digests, hash_file
from ..store.hashing import hexd, tensor_file_digest, tree
from ..store.units import Unit
from .companions import write_file_delta
from .pair import Pair, UnitWork

SCHEMA = "wdiff.pack/1"
WRITER = f"wdiff {__version__}"


@dataclass(frozen=True)
class CodecStat:
    records: int = 0
    changed: int = 0  # changed words
    bytes: int = 0  # payload bytes

    def add(self, changed: int, nbytes: int) -> CodecStat:
        return CodecStat(self.records + 1, self.changed + changed, self.bytes + nbytes)


@dataclass(frozen=True)
class PackResult:
    """The bundle :func:`pack` (or :func:`wdiff.squash`) wrote: its sizes and what it holds."""

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
    #: files the ignore rules left out of either checkpoint
    excluded: tuple[str, ...] = ()

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
            "excluded": list(self.excluded),
        }


def pack(
    a: PathLike | None,
    b: PathLike,
    out: PathLike,
    *,
    level: int = DEFAULT_LEVEL,
    threads: int | None = None,
    chunk: int = DEFAULT_CHUNK,
    reporter: Reporter = SILENT,
    overwrite: bool = False,
    exclude: tuple[str, ...] | list[str] = (),
    include: tuple[str, ...] | list[str] = (),
    format_version: int | None = None,
) -> PackResult:
    """Write to ``out`` the bundle that turns checkpoint ``a`` into ``b``.

    With ``a=None`` the bundle is an anchor: ``b`` whole, needing no base.
    ``level`` is zstd's; ``chunk`` the bytes one record covers at most. The
    same inputs and options always give the same bytes, whatever
    ``threads``. An existing ``out`` is refused unless ``overwrite``; an
    ``out`` that is, or lies inside, ``a`` or ``b`` always is. ``exclude``
    and ``include`` are as for :func:`wdiff.diff`.
    ``format_version`` is the newest bundle format version the bundle may
    use (default: the newest this wdiff writes; 1 or 2 for readers that
    predate codec v2); the bundle has the lowest version its contents need,
    and below version 3 changed companion files are stored whole. Returns a
    :class:`PackResult`.
    """
    if not 1 <= level <= 22:
        raise UsageError(f"compression level {level} is out of range (1..22)")
    cap = fmt.MAX_VERSION if format_version is None else format_version
    if not fmt.VERSION <= cap <= fmt.MAX_VERSION:
        raise UsageError(f"bundle format version {cap} is not one this wdiff writes ({fmt.VERSION} to {fmt.MAX_VERSION})")
    check_output(out, [("the base checkpoint", a), ("the target checkpoint", b)], overwrite=overwrite)
    pair = Pair(a, b, reporter=reporter, rules=ignore.rules(exclude, include))
    return pack_pair(pair, out, level=level, threads=threads, chunk=chunk, reporter=reporter, cap=cap)


def pack_pair(pair: Pair, out, *, level: int = DEFAULT_LEVEL, threads: int | None = None, chunk: int = DEFAULT_CHUNK,
              reporter: Reporter = SILENT, cap: int = fmt.MAX_VERSION) -> PackResult:
    """:func:`pack` of a pair already scanned (a staged part packs its
    files against the base files they need: see sync/stage.py)."""
    threads = threads or default_threads()
    if pair.version > cap:
        raise UsageError(
            f"these checkpoints need bundle format version {pair.version} (tensor names repeat across "
            f"directories), above --format {cap}"
        )
    B = pair.B
    work = pair.units(chunk)
    reporter.phase("pack", sum(x.unit.nbytes for x in work) + sum(f.size for f in B.files if f.kind != KIND_TENSORS))
    with BundleWriter(out, level=level, version=pair.version) as w, FdCache() as fds:
        tally = Tally(w, level)
        tally.file_deltas = cap >= fmt.FILE_DELTAS
        tally.threads = threads
        results = ordered_map(lambda x: _pack_unit(fds, level, x, cap), work, threads=threads)
        targets = _write_records(pair, w, tally, results, reporter)
        reporter.phase("hash base", None)
        mA = pair.complete_base(threads=threads, reporter=reporter)
        base_fp = mA.fingerprint if mA else None
        base_rows = tuple(fmt.FileRow(d.path, d.kind, d.size, d.digest) for d in mA.files) if mA else ()
        mB = pair.db.manifest(B)
        index = fmt.Index(
            version=w.version,
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
    pair.remember_target()
    reporter.done()
    return PackResult(
        bundle=os.fspath(out),
        bundle_id=bundle_id,
        base_fingerprint=base_fp,
        target_fingerprint=mB.fingerprint,
        bundle_bytes=os.path.getsize(out),
        target_bytes=B.total_bytes,
        tensors=len(B.tensors),
        tensors_changed=len(tally.changed_tensors),
        files_stored=tally.files_stored,
        changed_elements=tally.changed_elements,
        codecs=dict(sorted(tally.stats.items())),
        warnings=pair.warnings,
        excluded=pair.excluded,
    )


def _write_records(pair: Pair, w: BundleWriter, tally: Tally, results, reporter: Reporter) -> list[fmt.TargetFile]:
    """Write B's files in order: each companion file, each tensor file's new
    header (when it is not the base's) and the records of its encoded units
    as they arrive; returns the index's target rows."""
    A, B = pair.A, pair.B
    targets: list[fmt.TargetFile] = []
    pending = next(results, None)
    for i, f in enumerate(B.files):
        if f.kind != KIND_TENSORS:
            targets.append(_companion(w, i, f, A, pair.da, pair.db, reporter, tally))
            tally.files_stored += targets[-1].source != "base"
            continue
        old = A.file(f.path) if A else None
        from_base = old is not None and old.header is not None and old.header.raw == f.header.raw
        if not from_base:
            tally.header(i, f.header.raw)
        while pending is not None and pending.file == i:
            pair.record(pending.unit, pending.base_digests, pending.target_digests)
            tally.chunk(pending)
            reporter.advance(pending.unit.nbytes)
            pending = next(results, None)
        pair.db.tensors.update({t.name: bytearray() for t in f.header.tensors if t.nbytes == 0})
        targets.append(_tensor_target(i, f, pair.db, from_base))
    return targets


@dataclass(frozen=True, slots=True)
class EncodedUnit:
    """One unit of the target encoded: its block digests on both sides (base
    None for a unit with no base) and its record's payload (None: unchanged)."""

    file: int
    unit: Unit
    base_digests: list[bytes] | None
    target_digests: list[bytes]
    encoded: Encoded | None


class Tally:
    """Writes the HEADER and CHUNK records of pack and squash, and counts
    what they hold for the result."""

    def __init__(self, writer: BundleWriter, level: int) -> None:
        self.w, self.level = writer, level
        self.stats: dict[str, CodecStat] = {}
        self.changed_tensors: set[str] = set()
        self.changed_elements = 0
        self.files_stored = 0
        #: may a changed companion file with a base be written as DELTA records?
        self.file_deltas = False
        self.threads = 1  # for the ranges of one companion file

    def file_stats(self, stats: dict[str, tuple[int, int]]) -> None:
        """Count the DELTA records of one companion file."""
        for name, (n, nbytes) in stats.items():
            st = self.stats.get(name, CodecStat())
            self.stats[name] = CodecStat(st.records + n, st.changed, st.bytes + nbytes)

    def header(self, i: int, raw: bytes) -> None:
        """The new safetensors header of target file ``i``."""
        self.w.add(header_record(i, raw), (compressor(self.level).compress(raw),))
        self.files_stored += 1

    def chunk(self, res: EncodedUnit) -> None:
        enc = res.encoded
        if enc is None:
            return
        rh = self.w.add(chunk_record(res.file, res.unit, res.base_digests, res.target_digests, enc), enc.parts)
        name = CODEC_NAMES[enc.codec]
        self.w.raise_version(CODEC_VERSION[enc.codec])  # a codec v2 record needs version 3
        self.stats[name] = self.stats.get(name, CodecStat()).add(enc.count, rh.payload_len + fmt.RECORD.size)
        self.changed_elements += enc.count
        self.changed_tensors.update(_changed_spans(res.unit, res.base_digests, res.target_digests))


def _pack_unit(fds: FdCache, level: int, x: UnitWork, version: int) -> EncodedUnit:
    """B's bytes are read and hashed for every unit, A's for every unit with
    a base: a bundle encodes what is on disk now, and its digests are of the
    bytes encoded (never the manifest cache's, which may be stale)."""
    bbuf = scratch("b", x.unit.nbytes)
    read_target(fds, x.entry, x.unit, bbuf)
    return encode_unit(fds, level, x.file, x.unit, bbuf, version)


def unit_dtype(unit: Unit) -> str | None:
    """The safetensors dtype of every tensor of ``unit``, or None when they differ."""
    d = unit.spans[0].tensor.dtype
    return d if all(s.tensor.dtype == d for s in unit.spans) else None


def encode_unit(fds: FdCache, level: int, i: int, unit: Unit, bbuf, version: int = fmt.MAX_VERSION) -> EncodedUnit:
    """Encode the target bytes ``bbuf`` of a unit of file ``i`` against its
    base bytes (read here); both sides' digests are of these bytes. Shared
    by pack, squash and reverse; ``version``: the newest format version
    whose codecs may be used."""
    b_dig = span_digests(unit, bbuf)
    ut = uint_type(unit.word)
    if not unit.delta:
        return EncodedUnit(i, unit, None, b_dig, encode_raw(bbuf.view(ut), level))
    abuf = scratch("a", unit.nbytes)
    read_base(fds, unit, abuf)
    a_dig = span_digests(unit, abuf)
    if a_dig == b_dig:
        return EncodedUnit(i, unit, a_dig, b_dig, None)
    enc = encode_delta(abuf.view(ut), bbuf.view(ut), level, version=version, dtype=unit_dtype(unit),
                       rows=unit_rows(unit))
    return EncodedUnit(i, unit, a_dig, b_dig, enc)


def unit_rows(unit: Unit) -> tuple[int, int] | None:
    """The rows of a unit that is a piece of one tensor (see rows_of_tensor)."""
    if len(unit.spans) != 1:
        return None
    s = unit.spans[0]
    bits = dtype_info(s.tensor.dtype).bits
    if not bits or bits % (8 * unit.word):
        return None
    return rows_of_tensor(s.tensor.shape, bits // (8 * unit.word), s.lo // unit.word)


def _changed_spans(unit: Unit, a_dig, b_dig):
    for k, s in enumerate(unit.spans):
        if a_dig is None or a_dig[k] != b_dig[k]:
            yield s.tensor.name


def chunk_record(i: int, unit: Unit, a_dig, b_dig, enc) -> fmt.RecordHeader:
    """The header of the record that carries ``enc``, a unit of target file ``i``."""
    return fmt.RecordHeader(
        type=fmt.CHUNK, codec=enc.codec, word=unit.word, param=enc.param, file=i,
        lo=unit.lo, hi=unit.hi, count=enc.count, lens=(0, 0, 0),
        base=tree(b"".join(a_dig)) if a_dig is not None else ZERO,
        target=tree(b"".join(b_dig)),
    )


def header_record(i: int, raw: bytes) -> fmt.RecordHeader:
    """The record that carries ``raw``, the safetensors header of target file ``i``."""
    return fmt.RecordHeader(
        type=fmt.HEADER, codec=ZSTD, word=1, param=0, file=i, lo=0, hi=len(raw), count=0,
        lens=(0, 0, 0), base=ZERO, target=xxhash.xxh3_128_digest(raw),
    )


def _tensor_target(i: int, f: FileEntry, db: Digests, from_base: bool) -> fmt.TargetFile:
    hd = xxhash.xxh3_128_digest(f.header.raw)
    tds = tuple(tree(bytes(db.tensors[t.name])) for t in f.header.tensors)
    return fmt.TargetFile(
        f.path, KIND_TENSORS, f.size, tensor_file_digest(hd, list(tds)),
        "base" if from_base else "bundle", hd, len(f.header.raw), tds,
    )


def _companion(w: BundleWriter, i: int, f: FileEntry, A: Checkpoint | None, da, db, reporter,
               tally: Tally | None = None) -> fmt.TargetFile:
    blocks = hash_file(f.abspath, f.size)
    db.files[f.path] = blocks
    digest = tree(blocks)
    old = A.file(f.path) if A else None
    if old is not None and old.kind != KIND_TENSORS:
        if old.path not in da.files:
            da.files[old.path] = hash_file(old.abspath, old.size)
        if tree(da.files[old.path]) == digest and old.size == f.size:
            reporter.advance(f.size)
            return fmt.TargetFile(f.path, "file", f.size, digest, "base")
        if tally is not None and tally.file_deltas and min(old.size, f.size) >= FILE_DELTA_MIN:
            return companion_delta(w, tally, i, f.path, old.abspath, old.size, da.files[old.path],
                                   f.abspath, f.size, blocks, reporter)
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


def companion_from(w: BundleWriter, tally: Tally, i: int, path: str, target_path: str, target_size: int,
                   base_path: str | None, base_size: int) -> fmt.TargetFile:
    """Target file ``i``, a companion file whose bytes are in the file at
    ``target_path`` (a temp file squash or reverse rebuilt): taken from the
    base when ``base_path`` holds the same bytes, else encoded against it as
    pack would, else stored whole. Shared by squash and reverse."""
    blocks = hash_file(target_path, target_size)
    if base_path is not None:
        base_blocks = hash_file(base_path, base_size)
        if base_size == target_size and base_blocks == blocks:
            return fmt.TargetFile(path, "file", target_size, tree(blocks), "base")
        if tally.file_deltas and min(base_size, target_size) >= FILE_DELTA_MIN:
            return companion_delta(w, tally, i, path, base_path, base_size, base_blocks, target_path, target_size,
                                   blocks, SILENT)
    rh = fmt.RecordHeader(
        type=fmt.FILE, codec=ZSTD, word=1, param=0, file=i, lo=0, hi=target_size, count=0,
        lens=(0, 0, 0), base=ZERO, target=tree(blocks),
    )
    try:
        with open(target_path, "rb") as src:
            w.add_stream(rh, src, target_size)
    except OSError as e:
        raise io_error(target_path, e) from None
    return fmt.TargetFile(path, "file", target_size, tree(blocks), "bundle")


#: a companion file smaller than this (on either side) is stored whole: what
#: a delta could save on it is little, and the bundles of small edits to
#: config files stay what they were before format version 3
FILE_DELTA_MIN = 1 << 20


def companion_delta(w: BundleWriter, tally: Tally, i: int, path: str, base_path: str, base_size: int,
                    base_blocks: bytes, target_path: str, target_size: int, target_blocks: bytes,
                    reporter: Reporter) -> fmt.TargetFile:
    """Target file ``i``, a companion file that changed, as DELTA records
    against the base's file at the same path (format version 3). Shared by
    pack, squash and reverse."""
    w.raise_version(fmt.FILE_DELTAS)
    stats = write_file_delta(w, i, base_path, base_size, base_blocks, target_path, target_size, target_blocks,
                             tally.level, threads=tally.threads)
    tally.file_stats(stats)
    reporter.advance(target_size)
    return fmt.TargetFile(path, "file", target_size, tree(target_blocks), "delta")

