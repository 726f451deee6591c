"""reverse: the bundle that undoes a bundle. Given the bundle A -> B and a
directory holding B, write an ordinary, valid bundle B -> A, which the
normal verified apply (in place, for a pull) then applies.

XOR deltas run both ways: where the forward bundle holds the XOR of A's and
B's words (SPARSE, BITMAP, DENSE), A's bytes are B's bytes XOR the same
words. Everything else A had and B does not is not in the forward bundle:
the bytes under its RAW records, the tensors B dropped, retyped or
reshaped, the safetensors headers and companion files it replaced. Those
come from an :class:`Older`, a bundle whose target is A (the anchor of A, or
the bundle of the run that produced it), read record by record: its HEADER
and FILE records as they are, its RAW records over the ranges needed. When
a piece is in neither, :class:`NotInvertible` says so, and the caller takes
another way (a pull: the anchor).

The inverse is cut and encoded as pack would encode A against B, unit by
unit, from A's bytes computed as above. Its index's target is A: paths,
kinds and sizes from the forward bundle's base listing, header digests of
the headers used, tensor digests of the bytes computed, and every file
digest so obtained must equal the forward bundle's digest of that file of A
(which its fingerprint, the chain's version, commits to) before the
inverse is written: a directory that is not B, or an Older that lies,
never yields a bundle. The apply then checks every chunk and the whole
result against these digests, as for any bundle.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import numpy as np
import xxhash

from ..codec.chunk import BITMAP, CONDITIONED, DENSE, RAW, SPARSE, combine, decode_into, decompress_exact
from ..codec.dtypes import uint_type
from ..defaults import DEFAULT_CHUNK, DEFAULT_LEVEL
from ..errors import BaseMismatchError, FormatError, IntegrityError, WdiffError
from ..format import records as fmt
from ..format.bundle import ZERO, BundleReader, BundleWriter, Located, Record, read_frame, read_payload, walk_headers
from ..fsutil import io_error
from ..parallel import default_threads, ordered_map
from ..paths import printable
from ..progress import SILENT, Reporter
from ..store.blockio import FdCache
from ..store.checkpoint import KIND_TENSORS, Checkpoint, FileEntry, read_into, scan, scope_of
from ..store.digests import Digests
from ..store.hashing import hexd, tensor_file_digest, tree
from ..store.header import Header, TensorInfo, parse_header
from ..store.units import base_source, pack_units
from .companions import FileRebuild
from .pack import WRITER, PackResult, Tally, companion_from, encode_unit

#: DELTA codecs that hold the XOR of A's and B's words, which runs both ways
XOR_ONLY = (SPARSE, BITMAP, DENSE)
from .pair import format_version
from .squash import DecodedCache, Step


class NotInvertible(WdiffError):
    """The inverse needs a piece of the older version that no source at hand
    holds (or that would cost more to fetch than the caller allows)."""


class Older:
    """Pieces of the older version A, from a bundle whose target is A, read
    through ``read_at(offset, n)``: its frame and every record header are
    read and checked first (the id against ``expect_id``, the chain of
    record digests against the index), then only the payloads asked for,
    each against its record digest. What this bundle takes from its own
    base unchanged (a header, a companion file) is asked of ``then``, the
    source of that base version, when there is one."""

    def __init__(self, read_at: Callable[[int, int], bytes], size: int, *, where: str,
                 expect_id: bytes | None = None, expect_target: bytes | None = None,
                 then: Callable[[], Older] | None = None) -> None:
        self.read_at, self.where = read_at, where
        self._then, self._then_open = then, None
        bid, self.index = read_frame(read_at, size, where=where)
        if expect_id is not None and bid != expect_id:
            raise IntegrityError(f"{where}: is not the bundle the chain names")
        if expect_target is not None and self.index.target_fingerprint != expect_target:
            raise IntegrityError(f"{where}: does not build the version it should")
        self.pos = {f.path: i for i, f in enumerate(self.index.files)}
        self.headers: dict[int, Located] = {}
        self.files: dict[int, Located] = {}
        self.chunks: dict[int, list[Located]] = {}
        for rec in walk_headers(read_at, self.index, where=where):
            h = rec.header
            if h.type == fmt.HEADER:
                self.headers[h.file] = rec
            elif h.type == fmt.FILE:
                self.files[h.file] = rec
            elif h.type == fmt.CHUNK:
                self.chunks.setdefault(h.file, []).append(rec)
        self._raw: dict[int, np.ndarray] = {}
        self.lock = threading.Lock()

    def _base(self, what: str) -> Older:
        """The source of this bundle's base version, for ``what`` it kept."""
        if self._then is None or self.index.base_fingerprint is None:
            raise NotInvertible(f"{what} is not in {self.where}")
        with self.lock:
            if self._then_open is None:
                self._then_open = self._then()
                if self._then_open.index.target_fingerprint != self.index.base_fingerprint:
                    raise IntegrityError(f"{self._then_open.where}: is not the base of {self.where}")
            return self._then_open

    def _file(self, path: str, kind: str) -> int:
        i = self.pos.get(path)
        if i is None or self.index.files[i].kind != kind:
            raise FormatError(f"{self.where}: lists {printable(path)} otherwise than the older version has it")
        return i

    def header(self, path: str) -> bytes:
        i = self._file(path, KIND_TENSORS)
        rec = self.headers.get(i)
        if rec is None:  # kept from this bundle's base, byte for byte (source "base")
            raw = self._base(f"the header of {printable(path)}").header(path)
            if xxhash.xxh3_128_digest(raw) != self.index.files[i].header_digest:
                raise IntegrityError(f"{self.where}: the header of {printable(path)} does not match its digest")
            return raw
        raw = decompress_exact(read_payload(self.read_at, rec, where=self.where)[0], rec.header.hi,
                               where=f"{self.where}: header of {printable(path)}")
        if xxhash.xxh3_128_digest(raw) != self.index.files[i].header_digest:
            raise IntegrityError(f"{self.where}: the header of {printable(path)} does not match its digest")
        return raw

    def companion(self, path: str) -> tuple[fmt.RecordHeader, bytes]:
        """The FILE record of a companion file: its header and compressed payload."""
        i = self._file(path, "file")
        if self.index.files[i].source == "delta":  # rebuilt from its own base: not whole here
            raise NotInvertible(f"{printable(path)} is a byte-level delta in {self.where}, not a whole file")
        rec = self.files.get(i)
        if rec is None:  # kept from this bundle's base (same digest, checked by the caller)
            return self._base(f"the content of {printable(path)}").companion(path)
        return rec.header, read_payload(self.read_at, rec, where=self.where)[0]

    def raw(self, path: str, lo: int, hi: int) -> np.ndarray:
        """Bytes [lo, hi) of the data region of tensor file ``path``, which
        RAW records of this bundle must cover."""
        i = self._file(path, KIND_TENSORS)
        out = np.empty(hi - lo, dtype=np.uint8)
        at = lo
        for rec in self.chunks.get(i, ()):
            h = rec.header
            if h.hi <= at:
                continue
            if h.lo > at or h.codec != RAW:
                break
            b = min(h.hi, hi)
            out[at - lo : b - lo] = self._decoded(rec)[at - h.lo : b - h.lo]
            at = b
            if at >= hi:
                return out
        raise NotInvertible(f"{printable(path)}: bytes {at} to {hi} of the older version are not in {self.where}")

    def _decoded(self, rec: Located) -> np.ndarray:
        with self.lock:
            hit = self._raw.get(rec.index)
            if hit is not None:
                return hit
            h = rec.header
            words = np.empty((h.hi - h.lo) // h.word, dtype=uint_type(h.word))
            decode_into(RAW, h.param, h.count, list(read_payload(self.read_at, rec, where=self.where)), words,
                        where=f"{self.where}: record {rec.index}")
            if len(self._raw) > 16:
                self._raw.clear()
            self._raw[rec.index] = out = words.view(np.uint8)
            return out


def local_older(path: str, *, expect_target: bytes, then: Callable[[], Older] | None = None) -> Callable[[], Older]:
    """An :class:`Older` over a bundle file on this machine (one the caller
    verified, downloaded or its own), opened when first needed."""

    def open_it() -> Older:
        f = BundleReader.open_file(path)
        fd = f.fileno()

        def read_at(offset: int, n: int) -> bytes:
            data = os.pread(fd, n, offset)
            if len(data) != n:
                raise FormatError(f"{path}: truncated bundle")
            return data

        older = Older(read_at, os.fstat(fd).st_size, where=path, expect_target=expect_target, then=then)
        older._keep = f  # noqa: SLF001 - the file lives as long as the reader
        return older

    return open_it


def build_inverse(bundle, directory, out, *, older: Callable[[], Older] | None = None, level: int = DEFAULT_LEVEL,
                  threads: int | None = None, reporter: Reporter = SILENT) -> PackResult:
    """Write to ``out`` the bundle that turns ``directory``, which holds the
    target of ``bundle`` (A -> B), back into A. ``older`` opens the source
    of what the forward bundle lacks (see module doc); it is called only
    when something is needed, at most once."""
    threads = threads or default_threads()
    with BundleReader(bundle) as reader:
        F = reader.index
        if F.base_fingerprint is None:
            raise NotInvertible(f"{bundle}: is an anchor; there is no older version to go back to")
        records: list[Record] = []
        for rec in reader.records():  # every digest, the order and the chain, before anything is used
            records.append(rec)
    step = Step(os.fspath(bundle), BundleReader(bundle))
    try:
        step.index_records(records)
        del records
        return _Inverse(F, step, os.fspath(directory), older, level, threads, reporter).write(os.fspath(out))
    finally:
        step.close()


class _Inverse:
    def __init__(self, F: fmt.Index, step: Step, directory: str, older, level: int, threads: int,
                 reporter: Reporter) -> None:
        self.F, self.step, self.level, self.threads, self.reporter = F, step, level, threads, reporter
        self._open_older, self._older = older, None
        self.lock = threading.Lock()
        self.B = _check_newer(F, directory)
        self.fpos = {f.path: i for i, f in enumerate(F.files)}
        self.cache = DecodedCache()
        self.f_scoped = F.version >= fmt.SCOPED_NAMES

    def older(self) -> Older:
        with self.lock:
            if self._older is None:
                if self._open_older is None:
                    raise NotInvertible("no bundle of the older version is at hand")
                self._older = self._open_older()
            return self._older

    def _headers(self) -> dict[str, Header]:
        """A's header of every tensor file: B's own where the forward bundle
        kept it, else the older source's."""
        out = {}
        for row in self.F.base_files:
            if row.kind != KIND_TENSORS:
                continue
            tf = self.F.files[self.fpos[row.path]] if row.path in self.fpos else None
            if tf is not None and tf.kind == KIND_TENSORS and tf.source == "base":
                raw = self.B.file(row.path).header.raw
            else:
                raw = self.older().header(row.path)
            out[row.path] = parse_header(raw, row.size, where=f"older {printable(row.path)}").scoped(scope_of(row.path))
        return out

    def _a_bytes(self, fds: FdCache, path: str, t: TensorInfo, lo: int, hi: int) -> np.ndarray:
        """Bytes [lo, hi) of tensor ``t`` of A's file ``path``."""
        ref = base_source(t, self.B.base_tensors_for(path, self.f_scoped))
        if ref is None:
            return self.older().raw(path, t.start + lo, t.start + hi)
        fe, bt = ref.file, ref.tensor
        buf = np.empty(hi - lo, dtype=np.uint8)
        a0, a1 = bt.start + lo, bt.start + hi
        read_into(fds.fd(fe.abspath), fe.header.data_start + a0, memoryview(buf), where=fe.abspath)
        for rec in self.step.overlapping(self.fpos[fe.path], a0, a1):
            h = rec.header
            a, b = max(h.lo, a0), min(h.hi, a1)
            if h.codec == RAW:  # B's words: A's are elsewhere
                buf[a - a0 : b - a0] = self.older().raw(path, t.start + a - bt.start, t.start + b - bt.start)
            else:  # the XOR of A's and B's words, or B - D, turns B back into A
                ref = None
                if h.codec in CONDITIONED:
                    def ref(h=h, fe=fe):  # B's bytes of the whole record: its positions are listed from them
                        out = np.empty(h.hi - h.lo, dtype=np.uint8)
                        read_into(fds.fd(fe.abspath), fe.header.data_start + h.lo, memoryview(out), where=fe.abspath)
                        return out
                content = self.cache.get(self.step, 1, rec, ref, ref_is_base=False)[a - h.lo : b - h.lo]
                ut = uint_type(h.word)
                combine(h.codec, buf[a - a0 : b - a0].view(ut), content.view(ut), inverse=True)
        return buf

    def write(self, out: str) -> PackResult:
        F, B = self.F, self.B
        headers = self._headers()
        A = Checkpoint("", tuple(
            FileEntry(r.path, "", r.size, r.kind, headers.get(r.path), (0, 0, 0, 0, 0)) for r in F.base_files
        ))
        version = format_version(B, A)
        scoped = version >= fmt.SCOPED_NAMES
        work = [
            (i, f.path, u)
            for i, f in enumerate(A.files)
            if f.kind == KIND_TENSORS
            for u in pack_units(f.header, B.base_tensors_for(f.path, scoped), DEFAULT_CHUNK)
        ]
        self.reporter.phase("invert", sum(u.nbytes for _, _, u in work))
        with BundleWriter(out, level=self.level, version=version) as w, FdCache() as fds:
            tally = Tally(w, self.level)

            def run(item):
                i, path, unit = item
                abuf = np.empty(unit.nbytes, dtype=np.uint8)
                pos = 0
                for s in unit.spans:
                    abuf[pos : pos + s.nbytes] = self._a_bytes(fds, path, s.tensor, s.lo, s.hi)
                    pos += s.nbytes
                return encode_unit(fds, self.level, i, unit, abuf)

            results = ordered_map(run, [(i, p, u) for i, p, u in work], threads=self.threads)
            targets = self._records(w, tally, A, results)
            index = fmt.Index(
                version=w.version, writer=WRITER, base_fingerprint=F.target_fingerprint,
                base_files=tuple(fmt.FileRow(f.path, f.kind, f.size, f.digest) for f in F.files),
                target_fingerprint=F.base_fingerprint, files=tuple(targets),
                records_count=w.count, records_bytes=w.records_bytes, records_digest=w.records_digest,
            )
            bundle_id = w.finish(index)
        self.reporter.done()
        return PackResult(
            bundle=out, bundle_id=bundle_id, base_fingerprint=F.target_fingerprint,
            target_fingerprint=F.base_fingerprint, bundle_bytes=os.path.getsize(out),
            target_bytes=sum(r.size for r in F.base_files), tensors=len(A.tensors),
            tensors_changed=len(tally.changed_tensors), files_stored=tally.files_stored,
            changed_elements=tally.changed_elements, codecs=dict(sorted(tally.stats.items())),
        )

    def _records(self, w: BundleWriter, tally: Tally, A: Checkpoint, results) -> list[fmt.TargetFile]:
        """A's files in order, each checked against the forward bundle's
        digest of that file before the next one is written."""
        dt = Digests()
        targets: list[fmt.TargetFile] = []
        pending = next(results, None)
        for i, (row, f) in enumerate(zip(self.F.base_files, A.files)):
            if f.kind != KIND_TENSORS:
                targets.append(self._companion(w, i, row, tally))
                tally.files_stored += targets[-1].source != "base"
                continue
            header = f.header
            now = self.B.file(f.path)
            from_base = now is not None and now.header is not None and now.header.raw == header.raw
            if not from_base:
                tally.header(i, header.raw)
            while pending is not None and pending.file == i:
                dt.put_unit(pending.unit, pending.target_digests)
                tally.chunk(pending)
                self.reporter.advance(pending.unit.nbytes)
                pending = next(results, None)
            hd = xxhash.xxh3_128_digest(header.raw)
            tds = tuple(tree(bytes(dt.tensors[t.name])) if t.nbytes else tree(b"") for t in header.tensors)
            if tensor_file_digest(hd, list(tds)) != row.digest or header.file_size != row.size:
                raise IntegrityError(
                    f"{printable(f.path)}: going back does not give the older version's file "
                    f"(digest {hexd(row.digest)[:12]}); the directory or a bundle is not what it should be"
                )
            targets.append(fmt.TargetFile(f.path, KIND_TENSORS, row.size, row.digest,
                                          "base" if from_base else "bundle", hd, len(header.raw), tds))
        return targets

    def _xor_only(self, j: int, row: fmt.FileRow) -> bool:
        """Does the forward bundle hold A's file ``row`` as B's file XOR its
        DELTA records? (XOR word codecs only, and the same size: every byte
        of A is then B's, XOR a record's words or as it is.)"""
        recs = self.step.deltas.get(j, [])
        return row.size == self.F.files[j].size and all(r.header.codec in XOR_ONLY for r in recs)

    def _companion_back(self, w: BundleWriter, tally: Tally, i: int, j: int, row: fmt.FileRow) -> fmt.TargetFile:
        """A's companion file from B's (in the directory) and the forward
        bundle's XOR records, rebuilt into a temp file beside the output,
        checked against A's digest, and encoded against B's file."""
        import tempfile

        b_path = self.B.file(row.path).abspath
        fdesc, tmp = tempfile.mkstemp(prefix=".wdiff-reverse-", dir=os.path.dirname(os.path.abspath(w.path)))
        try:
            try:
                bfd = os.open(b_path, os.O_RDONLY)
            except OSError as e:
                raise io_error(b_path, e) from None
            try:
                rb = FileRebuild(bfd, row.size, row.size, fdesc, where=printable(row.path))
                for rec in self.step.deltas.get(j, []):
                    h = rec.header
                    # the XOR runs backwards: B's bytes are the record's target, A's its base
                    back = fmt.RecordHeader(type=h.type, codec=h.codec, word=h.word, param=h.param, file=h.file,
                                            lo=h.lo, hi=h.hi, count=h.count, lens=h.lens, base=h.target,
                                            target=h.base)
                    rb.record(back, self.step.payload(rec), where=f"{self.step.path}: record {rec.index}")
                blocks = rb.finish()
            finally:
                os.close(bfd)
            os.close(fdesc)
            fdesc = -1
            if tree(blocks) != row.digest:
                raise IntegrityError(f"{printable(row.path)}: going back does not give the older version's file "
                                     f"(digest {hexd(row.digest)[:12]}); the directory or a bundle is not what it should be")
            tally.file_deltas, tally.threads = True, self.threads
            return companion_from(w, tally, i, row.path, tmp, row.size, b_path, self.F.files[j].size)
        except BaseMismatchError as e:  # B's bytes are not the records' targets: the directory is not B
            raise IntegrityError(f"{printable(row.path)}: {e.message}") from None
        finally:
            if fdesc >= 0:
                os.close(fdesc)
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _companion(self, w: BundleWriter, i: int, row: fmt.FileRow, tally: Tally | None = None) -> fmt.TargetFile:
        j = self.fpos.get(row.path)
        now = self.F.files[j] if j is not None else None
        if now is not None and now.kind == "file" and now.digest == row.digest and now.size == row.size:
            return fmt.TargetFile(row.path, "file", row.size, row.digest, "base")
        if now is not None and now.source == "delta" and self._xor_only(j, row):
            return self._companion_back(w, tally, i, j, row)
        h, data = self.older().companion(row.path)
        if h.target != row.digest or h.hi != row.size:
            raise IntegrityError(f"{printable(row.path)}: the older bundle's copy is not the older version's")
        w.add(fmt.RecordHeader(type=fmt.FILE, codec=h.codec, word=1, param=0, file=i, lo=0, hi=h.hi, count=0,
                               lens=(0, 0, 0), base=ZERO, target=h.target), (data,))
        return fmt.TargetFile(row.path, "file", row.size, row.digest, "bundle")


def _check_newer(F: fmt.Index, directory: str) -> Checkpoint:
    """The directory, which must list the forward bundle's target files
    (paths, kinds, sizes, header digests): a cheap first refusal. Its bytes
    are proved by the digests of what is computed from them."""
    B = scan(directory, keep=frozenset(f.path for f in F.files))
    have = {f.path: f for f in B.files}
    if set(have) != {f.path for f in F.files}:
        raise BaseMismatchError(f"{directory}: does not hold the files of version {hexd(F.target_fingerprint)[:16]}")
    for f in F.files:
        e = have[f.path]
        if e.kind != f.kind or e.size != f.size or (
            f.kind == KIND_TENSORS and xxhash.xxh3_128_digest(e.header.raw) != f.header_digest
        ):
            raise BaseMismatchError(f"{directory}: {printable(f.path)} is not that of version "
                                    f"{hexd(F.target_fingerprint)[:16]}")
    return B
