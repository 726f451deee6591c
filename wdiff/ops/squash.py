"""Squash: compose a run of bundles v0 -> v1 -> ... -> vk into one bundle
v0 -> vk, exactly, without writing any intermediate checkpoint.

XOR deltas compose exactly, but a bundle's records are cut to its own target
layout, and tensors can be added, retyped or removed along the way, so the
composition works on bytes: for each unit of vk (cut as pack cuts it), the
bytes of v0 are read from the base directory, each bundle's records over that
tensor range are applied in turn (XOR, or overwrite for raw records), and the
result is encoded against v0 exactly as pack would. What comes out is
checked against vk's tensor digests and v0's fingerprint before the bundle
is renamed into place.

With no base (a run that starts with an anchor), v0 is empty.

A companion file that a step rebuilt with DELTA records (format version 3)
is rebuilt here too, step by step into temp files beside the output, from
its nearest whole copy (the base directory's file or a FILE record); the
last one is encoded against v0's file as pack would encode it (DELTA
records, or whole), after its digest is checked against vk's.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import xxhash

from ..codec.chunk import CONDITIONED, RAW, combine, decode_into, delta_words
from ..codec.dtypes import uint_type
from ..defaults import DEFAULT_CHUNK, DEFAULT_LEVEL
from ..errors import BaseMismatchError, FormatError, IntegrityError, UsageError
from ..format import records as fmt
from ..format.bundle import ZERO, BundleReader, BundleWriter, Record
from ..fsutil import check_output
from ..parallel import default_threads, ordered_map
from ..paths import PathLike, printable
from ..progress import SILENT, Reporter
from ..store import manifest
from ..store.blockio import FdCache
from ..store.checkpoint import KIND_TENSORS, Checkpoint, FileEntry, bare_name
from ..store.digests import Digests
from ..store.hashing import tree
from ..store.header import Header, TensorInfo
from ..store.units import pack_units
from .apply.checks import check_base_listing, verify_bundle
from .companions import rebuild_file
from .pack import WRITER, PackResult, Tally, companion_from, encode_unit
from .pair import format_version

CACHE_BYTES = 256 * 1024 * 1024


@dataclass
class _File:
    """A file of an intermediate version, as ``verify_bundle`` needs it."""

    path: str
    kind: str
    header: Header | None


@dataclass
class _Version:
    """What is known of version v_j: its files' headers and, per companion
    file, which (step, FILE record) holds its bytes (step 0: the base dir)."""

    files: dict[str, _File] = field(default_factory=dict)
    tensors: dict[str, tuple[int, TensorInfo]] = field(default_factory=dict)  # name -> (file index, info)
    origin: dict[str, tuple[int, Record | None]] = field(default_factory=dict)
    #: bare name -> qualified name, for the steps of format version 1
    bare: dict[str, str] = field(default_factory=dict)

    def file(self, path: str) -> _File | None:
        return self.files.get(path)


class Step:
    """One bundle of the run, with random access to its CHUNK records."""

    def __init__(self, path: str, reader: BundleReader) -> None:
        self.path = path
        self.reader = reader
        self.fd = os.open(path, os.O_RDONLY)
        self.chunks: dict[int, tuple[list[int], list[Record]]] = {}
        self.files: dict[int, Record] = {}
        #: file -> its DELTA records, in order (companion files, version 3)
        self.deltas: dict[int, list[Record]] = {}

    def index_records(self, records: list[Record]) -> None:
        by_file: dict[int, list[Record]] = {}
        for r in records:
            if r.header.type == fmt.CHUNK:
                by_file.setdefault(r.header.file, []).append(r)
            elif r.header.type == fmt.FILE:
                self.files[r.header.file] = r
            elif r.header.type == fmt.DELTA:
                self.deltas.setdefault(r.header.file, []).append(r)
        for i, rs in by_file.items():
            self.chunks[i] = ([r.header.lo for r in rs], rs)

    def overlapping(self, file: int, lo: int, hi: int) -> list[Record]:
        los, rs = self.chunks.get(file, ([], []))
        k = max(bisect.bisect_right(los, lo) - 1, 0)
        out = []
        while k < len(rs) and rs[k].header.lo < hi:
            if rs[k].header.hi > lo:
                out.append(rs[k])
            k += 1
        return out

    def raw_payload(self, rec: Record) -> bytes:
        """The record's payload, re-read and re-checked against its digest."""
        h = rec.header
        data = os.pread(self.fd, h.payload_len, rec.offset)
        hasher = xxhash.xxh3_128()
        hasher.update(data)
        if len(data) != h.payload_len or fmt.record_digest(hasher, h) != h.digest:
            raise IntegrityError(f"{self.path}: record {rec.index} changed while it was being read")
        return data

    def payload(self, rec: Record) -> tuple[bytes, bytes, bytes]:
        """The record's payload sections, re-read and re-checked."""
        h = rec.header
        data = self.raw_payload(rec)
        a, b = h.lens[0], h.lens[0] + h.lens[1]
        return data[:a], data[a:b], data[b:]

    def close(self) -> None:
        os.close(self.fd)
        self.reader.close()


class DecodedCache:
    """Decoded records (the XOR, or the new bytes of a raw record), cached
    within a byte budget and shared by the worker threads."""

    def __init__(self, budget: int = CACHE_BYTES) -> None:
        self.budget = budget
        self.used = 0
        self.items: OrderedDict = OrderedDict()
        self.lock = threading.Lock()

    def get(self, step: Step, j: int, rec: Record, ref=None, ref_is_base: bool = True) -> np.ndarray:
        """The decoded record: the XOR, the modular difference, or raw bytes.
        ``ref`` gives the bytes of one side of the record's range (its base,
        or its target when not ``ref_is_base``): a CSPARSE or CDENSE record's
        positions depend on them."""
        key = (j, rec.index)
        with self.lock:
            hit = self.items.get(key)
            if hit is not None:
                self.items.move_to_end(key)
                return hit
        h = rec.header
        where = f"{step.path}: record {rec.index}"
        if h.codec in CONDITIONED:
            if ref is None:
                raise FormatError(f"{where}: a csparse record where its base is not known")
            words = delta_words(h.codec, h.param, h.count, list(step.payload(rec)), ref().view(uint_type(h.word)),
                                ref_is_base=ref_is_base, where=where)
        else:
            words = np.zeros((h.hi - h.lo) // h.word, dtype=uint_type(h.word))
            decode_into(h.codec, h.param, h.count, list(step.payload(rec)), words, where=where)
        out = words.view(np.uint8)
        with self.lock:
            self.items[key] = out
            self.used += out.nbytes
            while self.used > self.budget and len(self.items) > 1:
                _, old = self.items.popitem(last=False)
                self.used -= old.nbytes
        return out


def squash(
    bundles: list[PathLike],
    base: PathLike | None = None,
    out: PathLike | None = None,
    *,
    level: int = DEFAULT_LEVEL,
    threads: int | None = None,
    reporter: Reporter = SILENT,
    overwrite: bool = False,
) -> PackResult:
    """Compose a run of ``bundles`` (each one's target the next one's base)
    into one bundle ``out`` from the first base to the last target, exactly.
    ``base`` is the first bundle's base checkpoint (None when it is an
    anchor); ``level`` is zstd's. An existing ``out`` is refused unless
    ``overwrite``; an ``out`` that is a bundle, or is or lies inside the
    base, always is. Returns a :class:`~wdiff.ops.pack.PackResult`."""
    return squash_from(bundles, base, out, level=level, threads=threads, reporter=reporter, overwrite=overwrite)


def squash_from(
    bundles: list,
    base=None,
    out=None,
    *,
    level: int = DEFAULT_LEVEL,
    threads: int | None = None,
    reporter: Reporter = SILENT,
    base_fingerprint: bytes | None = None,
    overwrite: bool = False,
    check_out: bool = True,
    rules=None,
) -> PackResult:
    """Compose ``bundles`` (each one's base the previous one's target) into one
    bundle written to ``out``. ``base`` is the checkpoint directory the first
    bundle applies to (None when it is an anchor); its fingerprint is checked
    first, unless the caller just computed it (by reading) and passes it in.
    An existing ``out`` is refused unless ``overwrite``; an ``out`` that is a
    bundle, or is or lies inside the base, always is (``check_out=False``:
    pull's own work file in the base's .wdiff/, which is no part of it).
    ``rules``: which files of ``base`` are its checkpoint (pull narrows it to
    the version DIR's record names)."""
    if not bundles:
        raise UsageError("squash needs at least one bundle")
    if out is None:
        raise UsageError("squash needs an output file (-o FILE)")
    if check_out:
        check_output(out, [("the bundle", b) for b in bundles] + [("the base checkpoint", base)], overwrite=overwrite)
    threads = threads or default_threads()
    steps: list[Step] = []
    try:
        for b in bundles:
            steps.append(Step(os.fspath(b), BundleReader(b)))
        for prev, nxt in zip(steps, steps[1:]):
            if nxt.reader.index.base_fingerprint != prev.reader.index.target_fingerprint:
                raise BaseMismatchError(f"{nxt.path} does not follow {prev.path}: its base is another version")
        first = steps[0].reader.index
        A = check_base_listing(first, base) if rules is None else check_base_listing(first, base, rules=rules)
        if A is not None:
            if base_fingerprint is None:
                reporter.phase("check base", A.total_bytes)  # its own bar (and time), not the download's
            fp = base_fingerprint or manifest.compute(A, threads=threads, reporter=reporter).fingerprint
            if fp != first.base_fingerprint:
                raise BaseMismatchError(f"{A.root}: is not the first bundle's base (fingerprint {fp.hex()[:16]})")
        versions = [_base_version(A)]
        for j, st in enumerate(steps, 1):
            records: list[Record] = []
            # coverage is squash's own affair: a step's gaps come from earlier steps, not from a base directory
            headers = verify_bundle(st.reader, versions[-1], reporter=reporter, records=records, coverage=False)
            st.index_records(records)
            versions.append(_next_version(versions[-1], j, st, headers))
        return _write(steps, versions, A, os.fspath(out), level=level, threads=threads, reporter=reporter)
    finally:
        for st in steps:
            st.close()


def _base_version(A: Checkpoint | None) -> _Version:
    v = _Version()
    if A is None:
        return v
    for f in A.files:
        v.files[f.path] = _File(f.path, f.kind, f.header)
        if f.kind != KIND_TENSORS:
            v.origin[f.path] = (0, None)
    for name, (f, t) in A.tensors.items():
        v.tensors[name] = (-1, t)
        v.bare.setdefault(bare_name(f.path, name), name)
    return v


def _next_version(prev: _Version, j: int, st: Step, headers: dict[int, Header]) -> _Version:
    v = _Version()
    for i, f in enumerate(st.reader.index.files):
        if f.kind == KIND_TENSORS:
            v.files[f.path] = _File(f.path, f.kind, headers[i])
            for t in headers[i].tensors:
                v.tensors[t.name] = (i, t)
                v.bare.setdefault(bare_name(f.path, t.name), t.name)
        else:
            v.files[f.path] = _File(f.path, f.kind, None)
            if f.source == "bundle":
                v.origin[f.path] = (j, st.files[i])
            elif f.source == "delta":
                if f.path not in prev.origin:
                    raise FormatError(f"{st.path}: rebuilds {printable(f.path)} from a base that lacks it")
                v.origin[f.path] = (j, _DeltaOrigin(prev.origin[f.path], st.deltas.get(i, []), f.size, f.digest))
            else:
                if f.path not in prev.origin:
                    raise FormatError(f"{st.path}: takes {printable(f.path)} from a base that lacks it")
                v.origin[f.path] = prev.origin[f.path]
    return v


@dataclass(frozen=True)
class _DeltaOrigin:
    """A companion file of step j: ``prev`` (the origin of the file in
    version j-1) with step j's DELTA records applied."""

    prev: tuple
    records: list
    size: int
    digest: bytes


class _Scratch:
    """Temp files beside the output for companion files rebuilt from deltas."""

    def __init__(self, out: str) -> None:
        self.dir = os.path.dirname(os.path.abspath(out))
        self.paths: list[str] = []

    def new(self) -> tuple[str, int]:
        import tempfile

        fdesc, path = tempfile.mkstemp(prefix=".wdiff-squash-", dir=self.dir)
        self.paths.append(path)
        return path, fdesc

    def close(self) -> None:
        for p in self.paths:
            try:
                os.unlink(p)
            except OSError:
                pass


def _materialize(origin: tuple, path: str, steps, A, scratch: _Scratch) -> str:
    """The path of a file holding the companion file ``path`` as ``origin``
    gives it: the base directory's, a FILE record's content, or a delta
    rebuilt on the file of its own origin (recursively), each checked."""
    from ..store.hashing import tree as _tree
    from .apply.engine import _write_stream

    j, rec = origin
    if j == 0:
        old = A.file(path) if A is not None else None
        if old is None or old.kind == KIND_TENSORS:
            raise FormatError(f"squash: {printable(path)} should come from the base, which lacks it")
        return old.abspath
    st = steps[j - 1]
    out, fdesc = scratch.new()
    try:
        if isinstance(rec, _DeltaOrigin):
            base = _materialize(rec.prev, path, steps, A, scratch)
            pieces = ((r.header, st.payload(r)) for r in rec.records)
            blocks = rebuild_file(base, os.path.getsize(base), rec.size, pieces, fdesc, where=f"{st.path}: {printable(path)}")
            want = rec.digest
        else:
            blocks = _write_stream(st.reader.file_payload(rec), fdesc, SILENT)
            want = rec.header.target
        if _tree(blocks) != want:
            raise IntegrityError(f"squash: {printable(path)} of bundle {st.path} does not match its digest")
    finally:
        os.close(fdesc)
    return out


def _same_type(a: TensorInfo, b: TensorInfo) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.nbytes == b.nbytes


def _bytes_of(j: int, name: str, lo: int, hi: int, steps, versions, fds, A, cache: DecodedCache) -> np.ndarray:
    """Bytes [lo, hi) of tensor ``name`` as version j holds it."""
    if j == 0:
        f, t = A.tensors[name]
        buf = np.empty(hi - lo, dtype=np.uint8)
        from ..store.checkpoint import read_into

        read_into(fds.fd(f.abspath), f.header.data_start + t.start + lo, memoryview(buf), where=f.abspath)
        return buf
    st = steps[j - 1]
    fi, t = versions[j].tensors[name]
    # the base source by this step's rule: the same qualified name (version
    # 2), or the same bare name anywhere (version 1)
    src = name
    if st.reader.index.version < fmt.SCOPED_NAMES:
        src = versions[j - 1].bare.get(bare_name(st.reader.index.files[fi].path, name), "")
    prev = versions[j - 1].tensors.get(src)
    based = prev is not None and _same_type(prev[1], t)
    buf = _bytes_of(j - 1, src, lo, hi, steps, versions, fds, A, cache) if based else np.zeros(hi - lo, dtype=np.uint8)
    covered = 0
    a0 = t.start + lo
    for rec in st.overlapping(fi, a0, t.start + hi):
        h = rec.header
        ref = None
        if h.codec in CONDITIONED:
            def ref(h=h):  # the base of the whole record: its positions depend on it
                return _record_base(j, fi, h, steps, versions, fds, A, cache)
        content = cache.get(st, j, rec, ref)
        a, b = max(h.lo, a0), min(h.hi, t.start + hi)
        piece = content[a - h.lo : b - h.lo]
        dst = buf[a - a0 : b - a0]
        if h.codec == RAW:
            dst[:] = piece
        else:
            if not based:
                raise FormatError(f"{st.path}: delta record for tensor {printable(name)}, which has no base")
            combine(h.codec, dst.view(uint_type(h.word)), piece.view(uint_type(h.word)))
        covered += b - a
    if not based and covered != hi - lo:
        raise FormatError(f"{st.path}: no data for tensor {printable(name)}")
    return buf


def _record_base(j: int, fi: int, h, steps, versions, fds, A, cache: DecodedCache) -> np.ndarray:
    """The bytes of version j - 1 under the whole range of a delta record of
    step j (file ``fi`` of version j), tensor by tensor, each from its base
    source by the step's rule."""
    st = steps[j - 1]
    out = np.empty(h.hi - h.lo, dtype=np.uint8)
    covered = 0
    for name, (f2, t2) in versions[j].tensors.items():
        if f2 != fi or t2.start + t2.nbytes <= h.lo or t2.start >= h.hi:
            continue
        src = name
        if st.reader.index.version < fmt.SCOPED_NAMES:
            src = versions[j - 1].bare.get(bare_name(st.reader.index.files[fi].path, name), "")
        prev = versions[j - 1].tensors.get(src)
        if prev is None or not _same_type(prev[1], t2):
            raise FormatError(f"{st.path}: delta record for tensor {printable(name)}, which has no base")
        a, b = max(h.lo, t2.start), min(h.hi, t2.start + t2.nbytes)
        out[a - h.lo : b - h.lo] = _bytes_of(j - 1, src, a - t2.start, b - t2.start, steps, versions, fds, A, cache)
        covered += b - a
    if covered != h.hi - h.lo:
        raise FormatError(f"{st.path}: a delta record covers bytes of no tensor")
    return out


def _write(steps, versions, A, out: str, *, level: int, threads: int, reporter: Reporter) -> PackResult:
    last = steps[-1].reader.index
    first = steps[0].reader.index
    vk = versions[-1]
    # the composed bundle's version is chosen as pack chooses it, from its
    # base and its target alone
    target = Checkpoint("", tuple(
        FileEntry(f.path, "", f.size, f.kind, vk.files[f.path].header, (0, 0, 0, 0, 0)) for f in last.files
    ))
    version = format_version(A, target)
    scoped = version >= fmt.SCOPED_NAMES
    cache = DecodedCache()
    k = len(steps)
    work = [
        (i, u)
        for i, f in enumerate(last.files)
        if f.kind == KIND_TENSORS
        for u in pack_units(vk.files[f.path].header, A.base_tensors_for(f.path, scoped) if A is not None else {}, DEFAULT_CHUNK)
    ]
    reporter.phase("squash", sum(u.nbytes for _, u in work))
    scratch = _Scratch(out)
    with BundleWriter(out, level=level, version=version) as w, FdCache() as fds:
        tally = Tally(w, level)
        tally.file_deltas = True  # only a companion file some step rebuilt from deltas can need them
        tally.scratch = scratch
        tally.threads = threads

        def run(item):
            i, unit = item
            bbuf = np.empty(unit.nbytes, dtype=np.uint8)
            pos = 0
            for s in unit.spans:
                bbuf[pos : pos + s.nbytes] = _bytes_of(k, s.tensor.name, s.lo, s.hi, steps, versions, fds, A, cache)
                pos += s.nbytes
            return encode_unit(fds, level, i, unit, bbuf)

        results = ordered_map(run, work, threads=threads)
        try:
            targets = _write_records(steps, versions, A, w, tally, results, reporter)
        finally:
            scratch.close()
        base_fp, base_rows = first.base_fingerprint, first.base_files
        index = fmt.Index(
            version=w.version, writer=WRITER, base_fingerprint=base_fp, base_files=base_rows,
            target_fingerprint=last.target_fingerprint, files=tuple(targets),
            records_count=w.count, records_bytes=w.records_bytes, records_digest=w.records_digest,
        )
        bundle_id = w.finish(index)
    reporter.done()
    return PackResult(
        bundle=out, bundle_id=bundle_id, base_fingerprint=base_fp, target_fingerprint=last.target_fingerprint,
        bundle_bytes=os.path.getsize(out), target_bytes=sum(f.size for f in last.files),
        tensors=len(vk.tensors), tensors_changed=len(tally.changed_tensors), files_stored=tally.files_stored,
        changed_elements=tally.changed_elements, codecs=dict(sorted(tally.stats.items())),
    )


def _write_records(steps, versions, A, w: BundleWriter, tally: Tally, results, reporter: Reporter) -> list[fmt.TargetFile]:
    """Write the last version's files in order, each tensor file checked
    against the last bundle's digests as its units arrive; returns the
    index's target rows."""
    last, vk = steps[-1].reader.index, versions[-1]
    dt = Digests()
    targets: list[fmt.TargetFile] = []
    pending = next(results, None)
    for i, f in enumerate(last.files):
        if f.kind != KIND_TENSORS:
            targets.append(_companion(w, i, f, steps, versions, A, tally))
            tally.files_stored += targets[-1].source != "base"
            continue
        header = vk.files[f.path].header
        old = A.file(f.path) if A is not None else None
        from_base = old is not None and old.header is not None and old.header.raw == header.raw
        if not from_base:
            tally.header(i, header.raw)
        while pending is not None and pending.file == i:
            dt.put_unit(pending.unit, pending.target_digests)
            tally.chunk(pending)
            reporter.advance(pending.unit.nbytes)
            pending = next(results, None)
        for t, want in zip(header.tensors, f.tensor_digests):
            got = tree(bytes(dt.tensors.get(t.name, b""))) if t.nbytes else tree(b"")
            if got != want:
                raise IntegrityError(f"squash: tensor {printable(t.name)} does not come out as the last bundle says")
        targets.append(fmt.TargetFile(
            f.path, KIND_TENSORS, f.size, f.digest, "base" if from_base else "bundle",
            f.header_digest, f.header_size, f.tensor_digests,
        ))
    return targets


def _companion(w: BundleWriter, i: int, f: fmt.TargetFile, steps, versions, A, tally: Tally) -> fmt.TargetFile:
    j, rec = versions[-1].origin[f.path]
    old = A.file(f.path) if A is not None else None
    if j == 0:
        if old is None or old.kind == KIND_TENSORS or old.size != f.size:
            raise FormatError(f"squash: {printable(f.path)} should come from the base, which lacks it")
        return fmt.TargetFile(f.path, "file", f.size, f.digest, "base")
    if isinstance(rec, _DeltaOrigin):
        if rec.digest != f.digest or rec.size != f.size:
            raise IntegrityError(f"squash: {printable(f.path)} of the last step is not the last bundle's")
        built = _materialize((j, rec), f.path, steps, A, tally.scratch)
        base = old if old is not None and old.kind != KIND_TENSORS else None
        t = companion_from(w, tally, i, f.path, built, f.size, base.abspath if base else None, base.size if base else 0)
        if t.digest != f.digest:
            raise IntegrityError(f"squash: {printable(f.path)} does not come out as the last bundle says")
        return t
    # copy the compressed bytes as they are, under this bundle's file index
    st = steps[j - 1]
    h = rec.header
    data = st.raw_payload(rec)
    if h.target != f.digest:
        raise IntegrityError(f"squash: {printable(f.path)} of bundle {st.path} is not the last bundle's")
    hdr = fmt.RecordHeader(
        type=fmt.FILE, codec=h.codec, word=1, param=0, file=i, lo=0, hi=h.hi, count=0,
        lens=(0, 0, 0), base=ZERO, target=h.target,
    )
    w.add(hdr, (data,))
    return fmt.TargetFile(f.path, "file", f.size, f.digest, "bundle")

