"""The engine that both apply modes run: walk the bundle's records in order,
rebuild each unit of the target from the base and its record, check it
against the base and target chunk digests, and write it."""

from __future__ import annotations

import errno
import os
import stat
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ...codec.chunk import RAW, decode_into
from ...codec.dtypes import uint_type
from ...defaults import DEFAULT_CHUNK
from ...errors import BaseMismatchError, FormatError, IntegrityError, WdiffError
from ...format import records as fmt
from ...format.bundle import ZERO, BundleReader, Record
from ...fsutil import io_error, write_all
from ...parallel import ordered_map
from ...paths import printable
from ...progress import Reporter
from ...store import cache, manifest
from ...store.blockio import (
    FdCache,
    WriteBehind,
    open_direct,
    read_base,
    scratch,
    span_digests,
)
from ...store.checkpoint import KIND_TENSORS, Checkpoint, known_checkpoint, read_header
from ...store.digests import Digests, hash_file
from ...store.hashing import hexd, tree
from ...store.header import Header, HeaderError
from ...store.units import FileLayout, Unit
from ..companions import FileRebuild
from .checks import check_target_digests, judge_base_mismatch


@dataclass(frozen=True, slots=True)
class OpenFile:
    """The data pass reached tensor file ``file``: create it and write its header."""

    file: int


@dataclass(frozen=True, slots=True)
class UnitWork:
    """One unit of tensor file ``file`` to produce: base bytes, patched by
    ``record`` (None: copied from the base as they are)."""

    file: int
    layout: FileLayout
    unit: Unit
    record: Record | None


@dataclass(frozen=True, slots=True)
class UnitDone:
    """A unit produced and checked, with its block digests (base digests are
    None for a unit that has no base)."""

    file: int
    unit: Unit
    base_digests: list[bytes] | None
    target_digests: list[bytes]


class _Walk:
    """The data pass in bundle order: OpenFile and UnitWork items for tensor
    data, with the gaps between records filled from the base. Companion
    files stream from the bundle, so ``on_file`` handles them inline."""

    def __init__(self, reader: BundleReader, headers: dict[int, Header], A: Checkpoint | None, on_file,
                 on_delta=None) -> None:
        self.reader, self.index, self.headers = reader, reader.index, headers
        self.A = A
        self.scoped = reader.index.version >= fmt.SCOPED_NAMES
        self.on_file = on_file
        #: companion files with source "delta": on_delta(i, record), then
        #: on_delta(i, None) once the walk leaves the file
        self.on_delta = on_delta
        self.layouts: dict[int, FileLayout] = {}
        self.done_upto: dict[int, int] = {}
        self.current = -1

    def gaps(self, i: int, upto: int) -> Iterator[UnitWork]:
        lay = self.layouts[i]
        start = self.done_upto.get(i, 0)
        if upto > start:
            where = self.index.files[i].path
            yield from (UnitWork(i, lay, u, None) for u in lay.gap_units(start, upto, DEFAULT_CHUNK, where=where))
        self.done_upto[i] = upto

    def finish_current(self) -> Iterator[UnitWork]:
        c = self.current
        if c >= 0 and self.index.files[c].kind == KIND_TENSORS:
            yield from self.gaps(c, self.index.files[c].data_len)
        elif c >= 0 and self.index.files[c].source == "delta":
            self.on_delta(c, None)

    def advance_to(self, i: int) -> Iterator[OpenFile | UnitWork]:
        while self.current < i:
            yield from self.finish_current()
            self.current += 1
            f = self.index.files[self.current]
            if f.kind == KIND_TENSORS:
                base = self.A.base_tensors_for(f.path, self.scoped) if self.A else {}
                self.layouts[self.current] = FileLayout(self.headers[self.current], base)
                yield OpenFile(self.current)
            elif f.source == "base":
                self.on_file(self.current, None)

    def chunk(self, rec: Record) -> Iterator[UnitWork]:
        h = rec.header
        where = f"{self.reader.path}: record {rec.index}"
        yield from self.gaps(h.file, h.lo)
        unit = self.layouts[h.file].record_unit(h.lo, h.hi, h.word, delta=h.codec != RAW, where=where)
        based = {s.base is not None for s in unit.spans}
        if len(based) != 1 or (h.base != ZERO) != (True in based):
            raise FormatError(f"{where}: base digest does not match the tensors the chunk covers")
        self.done_upto[h.file] = h.hi
        yield UnitWork(h.file, self.layouts[h.file], unit, rec)

    def __iter__(self) -> Iterator[OpenFile | UnitWork]:
        for rec in self.reader.records():
            yield from self.advance_to(rec.header.file)
            if rec.header.type == fmt.FILE:
                self.on_file(rec.header.file, rec)
            elif rec.header.type == fmt.DELTA:
                self.on_delta(rec.header.file, rec)
            elif rec.header.type == fmt.CHUNK:
                yield from self.chunk(rec)
        yield from self.advance_to(len(self.index.files) - 1)
        yield from self.finish_current()


def apply_unit(
    fds: FdCache, out_fd: int, data_start: int, unit: Unit, rec: Record | None, *, where: str,
    file: int = -1, direct_fd: int = -1, writer: WriteBehind | None = None,
) -> UnitDone:
    """Produce one unit of the target: base bytes, patched by ``rec`` if any;
    check base and target chunk digests; write at its offset in ``out_fd``
    through ``writer`` (the write is then still running when this returns;
    ``direct_fd``: the file's O_DIRECT descriptor, or -1), or nowhere when
    ``out_fd`` is negative (no writer needed). The base bytes are hashed as
    they are read (a base unit is never taken as matching on the manifest
    cache's word), and every byte written is hashed."""
    if out_fd < 0:
        return _produce(fds, unit, rec, scratch("b", unit.nbytes), where=where, file=file)
    at = data_start + unit.lo
    # for a direct write, the memory is laid out as the file is; the words
    # stay aligned to 8 bytes (any other layout is written through the cache)
    slot = writer.take(unit.nbytes, at, direct_fd >= 0 and at % 8 == 0)
    try:
        done = _produce(fds, unit, rec, slot.view, where=where, file=file)
    except BaseException:
        writer.give(slot)
        raise
    writer.write(out_fd, direct_fd, slot, at, where=where, write=write_all)
    return done


def _produce(fds: FdCache, unit: Unit, rec: Record | None, buf: np.ndarray, *, where: str, file: int) -> UnitDone:
    """The unit's bytes in ``buf``, checked, and their digests."""
    a_dig = None
    if unit.spans[0].base is not None:
        read_base(fds, unit, buf)
        a_dig = span_digests(unit, buf)
    if rec is None:
        t_dig = a_dig
    else:
        h = rec.header
        if a_dig is not None and tree(b"".join(a_dig)) != h.base:
            raise BaseMismatchError(
                f"{where}: base bytes of {printable(unit.spans[0].tensor.name)} differ from the bundle's base"
            )
        decode_into(h.codec, h.param, h.count, list(rec.payload), buf.view(uint_type(unit.word)), where=where)
        t_dig = span_digests(unit, buf)
        if tree(b"".join(t_dig)) != h.target:
            raise IntegrityError(f"{where}: rebuilt bytes of {printable(unit.spans[0].tensor.name)} do not match the target digest")
    return UnitDone(file, unit, a_dig, t_dig)


class _FingerprintMismatch(BaseMismatchError):
    """The base's fingerprint, measured, is not base.fingerprint: another base (5)."""


class _TargetMismatch(IntegrityError):
    """A rebuilt file or tensor is not the target, and some of its bytes came
    from the base as they were (bytes no record covers, which no record's
    base digest checks): the bundle is wrong (4) only if the base is its
    base; otherwise the base is another version (5). Judged by
    :func:`_judge_target`."""


class _Builder:
    """The state of one ``build``: output descriptors, digests, bytes written."""

    def __init__(self, reader: BundleReader, A: Checkpoint | None, headers, outputs: dict[int, str], reporter) -> None:
        self.reader, self.index, self.A, self.headers = reader, reader.index, A, headers
        self.outputs, self.reporter = outputs, reporter
        self.da, self.dt = Digests(), Digests()
        self.out_fds: dict[int, int] = {}
        #: a second, O_DIRECT descriptor of each tensor file, where there is one
        self.direct_fds: dict[int, int] = {}
        self.written = 0
        self._modes: dict[str, int] | None = None
        self._delta: tuple[int, int, int, FileRebuild] | None = None  # file, out fd, base fd, rebuild

    def open_out(self, i: int) -> int:
        path = self.outputs[i]
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            mode = self.mode_of(self.index.files[i].path)
            if mode is not None:
                os.fchmod(fd, mode)
            return fd
        except OSError as e:
            raise io_error(path, e) from None

    def mode_of(self, path: str) -> int | None:
        """The permission bits of a rebuilt file: those of the base's file at
        the same path, else the ones most of the base's files have (None:
        no base, the umask decides)."""
        if self.A is None or not self.A.files:
            return None
        if self._modes is None:
            self._modes = {}
            for f in self.A.files:
                try:
                    self._modes[f.path] = stat.S_IMODE(os.stat(f.abspath).st_mode) & 0o777
                except OSError:
                    pass
        if path in self._modes:
            return self._modes[path]
        counts = Counter(self._modes.values())
        return counts.most_common(1)[0][0] if counts else None

    def on_file(self, i: int, rec: Record | None) -> None:
        """Write companion file ``i``: copied from the base, or streamed from ``rec``."""
        if i not in self.outputs:
            return
        f = self.index.files[i]
        fd = self.open_out(i)
        try:
            if rec is None:
                old = self.A.file(f.path) if self.A else None
                if old is None or old.kind == KIND_TENSORS:
                    raise BaseMismatchError(f"{printable(f.path)}: the base lacks this file")
                if old.size != f.size:  # decode_index refuses this; the written size is the target's
                    raise IntegrityError(f"{printable(f.path)}: the base's copy is {old.size} bytes, "
                                         f"the target's {f.size}")
                blocks = hash_file(old.abspath, old.size, reporter=self.reporter, copy_to=fd)
                self.da.files[f.path] = blocks
            else:
                blocks = _write_stream(self.reader.file_payload(rec), fd, self.reporter)
            self.dt.files[f.path] = blocks
            if tree(blocks) != f.digest:
                raise (IntegrityError if rec is not None else _TargetMismatch)(
                    f"{printable(f.path)}: content does not match the target digest")
            if os.fstat(fd).st_size != f.size:
                raise IntegrityError(f"{printable(f.path)}: {os.fstat(fd).st_size} bytes written, "
                                     f"the target has {f.size}")
            if rec is not None:
                _check_companion_kind(self.outputs[i], f)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.written += f.size

    def on_delta(self, i: int, rec: Record | None) -> None:
        """Companion file ``i``, rebuilt from the base's file at its path and
        its DELTA records: each record as it comes, then (``rec`` None) the
        rest from the base and the whole file's digest."""
        if i not in self.outputs:
            return
        f = self.index.files[i]
        if self._delta is None or self._delta[0] != i:
            old = self.A.file(f.path) if self.A else None
            if old is None or old.kind == KIND_TENSORS:
                raise BaseMismatchError(f"{printable(f.path)}: the base lacks this file")
            out = self.open_out(i)
            try:
                bfd = os.open(old.abspath, os.O_RDONLY)
            except OSError as e:
                os.close(out)
                raise io_error(old.abspath, e) from None
            self._delta = (i, out, bfd, FileRebuild(bfd, old.size, f.size, out, where=printable(f.path),
                                                    reporter=self.reporter))
        _, out, bfd, rb = self._delta
        try:
            if rec is not None:
                rb.record(rec.header, rec.payload, where=f"{self.reader.path}: record {rec.index}")
                return
            blocks = rb.finish()
            self.dt.files[f.path] = blocks
            if tree(blocks) != f.digest or rb.pos != f.size:
                raise _TargetMismatch(f"{printable(f.path)}: content does not match the target digest")
            _check_companion_kind(self.outputs[i], f)
            os.fsync(out)
        except BaseException:
            self.close_delta()
            raise
        self.close_delta()
        self.written += f.size

    def close_delta(self) -> None:
        if self._delta is not None:
            os.close(self._delta[1])
            os.close(self._delta[2])
            self._delta = None

    def items(self) -> Iterator[OpenFile | UnitWork]:
        """The walk's items for the files to write; opens each tensor file and
        writes its header as the walk reaches it."""
        for item in _Walk(self.reader, self.headers, self.A, self.on_file, self.on_delta):
            if item.file not in self.outputs:
                continue
            if isinstance(item, OpenFile):
                i = item.file
                fd = self.out_fds[i] = self.open_out(i)
                _preallocate(fd, self.index.files[i].size, self.index.files[i].path)
                write_all(fd, self.headers[i].raw, 0)
                self.direct_fds[i] = open_direct(self.outputs[i], fd)
            yield item

    def close(self) -> None:
        self.close_delta()
        for fd in (*self.out_fds.values(), *self.direct_fds.values()):
            if fd >= 0:
                os.close(fd)


def build(
    reader: BundleReader,
    A: Checkpoint | None,
    headers: dict[int, Header],
    outputs: dict[int, str],
    *,
    threads: int,
    reporter: Reporter,
    check_base: bool = True,
) -> tuple[int, Digests]:
    """Write the target files named in ``outputs`` (file index -> path) and
    verify each against the target digests; with ``check_base``, also check
    the base against the bundle's base fingerprint. Returns the bytes written
    and the block digests of what was written."""
    index = reader.index
    b = _Builder(reader, A, headers, outputs, reporter)
    reporter.phase("apply", sum(index.files[i].size for i in outputs))
    with FdCache() as fds:

        def work(item: OpenFile | UnitWork) -> OpenFile | UnitDone:
            if isinstance(item, OpenFile):
                return item
            where = f"{reader.path}: {printable(index.files[item.file].path)}"
            return apply_unit(fds, b.out_fds[item.file], item.layout.header.data_start, item.unit, item.record,
                              where=where, file=item.file, direct_fd=b.direct_fds.get(item.file, -1), writer=writer)

        try:
            # leaving: the workers stop first, then the writes behind them,
            # and only then are the descriptors they use closed
            with WriteBehind(workers=threads) as writer, \
                    closing(ordered_map(work, b.items(), threads=threads)) as results:
                _collect(b, results, writer)
        finally:
            b.close()
    b.written += sum(index.files[i].size for i in b.out_fds)
    try:
        check_target_digests(index, headers, b.dt, only=outputs)
    except IntegrityError as e:  # the bytes between records are the base's, unchecked by any record
        raise _TargetMismatch(e.message, hint=e.hint) from None
    if A is not None and check_base:
        reporter.phase("check base", None)
        fp = manifest.complete(A, b.da, threads=threads).fingerprint
        if fp != index.base_fingerprint:
            raise _FingerprintMismatch(
                f"{A.root}: fingerprint {hexd(fp)[:16]} is not the bundle's base {hexd(index.base_fingerprint)[:16]}"
            )
    return b.written, b.dt


def build_checked(reader: BundleReader, A: Checkpoint | None, headers: dict[int, Header], outputs: dict[int, str],
                  *, threads: int, reporter: Reporter, base_fingerprint: bytes | None = None) -> tuple[int, Digests]:
    """:func:`build`, checking the base; a base check that fails within the
    data pass (a chunk's base digest) is judged by the base's fingerprint:
    5 when the base is another version, 4 when the bundle is inconsistent
    with its own base. ``base_fingerprint``: the base's, known already."""
    try:
        return build(reader, A, headers, outputs, threads=threads, reporter=reporter,
                     check_base=base_fingerprint is None)
    except _FingerprintMismatch:
        raise  # measured: another base
    except BaseMismatchError as e:
        raise judge_base_mismatch(e, reader.index, A, threads=threads, fingerprint=base_fingerprint) from None
    except _TargetMismatch as e:
        raise _judge_target(e, reader.index, A, threads=threads, fingerprint=base_fingerprint) from None


def _judge_target(e: _TargetMismatch, index: fmt.Index, A: Checkpoint | None, *, threads: int,
                  fingerprint: bytes | None) -> WdiffError:
    """A target digest that failed: the bundle's fault (4) when the base is
    its base or there is none, else the base is another version (5), as
    the fingerprint check after the data pass would have said had the pass
    got that far. Hashes the whole base, on this refusal path only."""
    if A is None or index.base_fingerprint is None:
        return e
    if not fingerprint:
        try:
            fingerprint = manifest.compute(A, threads=threads).fingerprint
        except WdiffError:
            return BaseMismatchError(f"{A.root}: cannot be read as it was scanned: not the bundle's base ({e.message})")
    if fingerprint == index.base_fingerprint:
        return e
    return BaseMismatchError(
        f"{A.root}: fingerprint {hexd(fingerprint)[:16]} is not the bundle's base "
        f"{hexd(index.base_fingerprint)[:16]} ({e.message})",
        hint="apply the bundle to the checkpoint it was made from",
    )


def _collect(b: _Builder, results, writer: WriteBehind) -> None:
    """Record each unit's digests as results arrive, in file order: once file
    i's successor shows up, file i is complete and its fsync (once its
    writes are done) can overlap the remaining work."""

    def sync(i: int) -> None:
        fd = b.out_fds[i]
        writer.wait(fd)
        try:
            os.fsync(fd)
        except OSError as e:
            raise io_error(b.outputs[i], e) from None

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="wdiff-sync") as syncer:
        synced: list = []
        current = None
        for res in results:
            if current is not None and res.file != current:
                synced.append(syncer.submit(sync, current))
            current = res.file
            if isinstance(res, OpenFile):
                continue
            if res.base_digests is not None:
                b.da.put_unit(res.unit, res.base_digests, base=True)
            b.dt.put_unit(res.unit, res.target_digests)
            b.reporter.advance(res.unit.nbytes)
        if current is not None:
            synced.append(syncer.submit(sync, current))
        for f in synced:
            f.result()


def remember_output(root: str, index: fmt.Index, headers: dict[int, Header], digests: Digests) -> None:
    """Put the block digests of the target just written at ``root`` into
    the manifest cache, so the next step's base is hashed already. An
    optimisation after the output is in place: it never refuses and never
    fails (the files are described from the verified index, not scanned
    again, and any error is ignored)."""
    try:
        ckpt = known_checkpoint(root, [(f.path, f.kind, headers.get(i)) for i, f in enumerate(index.files)])
        cache.remember(ckpt, digests)
    except (OSError, WdiffError):
        pass


def _check_companion_kind(path: str, f: fmt.TargetFile) -> None:
    """A companion file at a path that ends in .safetensors must break a
    strict safetensors rule: the kind of a file follows from its path and
    bytes, and a scan of the output would take a strict tensor file for a
    tensor file, so the result would not have the target's fingerprint.
    (A file copied from the base is a companion file there already.)"""
    if not f.path.endswith(".safetensors"):
        return
    try:
        read_header(path, f.size, where=printable(f.path))
    except HeaderError:
        return  # not a strict tensor file: a companion file, as the index says
    raise IntegrityError(f"{printable(f.path)}: the bundle gives it as a companion file, "
                         "but its bytes are a valid safetensors file")


def _preallocate(fd: int, size: int, path: str) -> None:
    """Reserve the space now, so a full disk fails before any work is done."""
    try:
        os.posix_fallocate(fd, 0, size) if size else None
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # the file system cannot: truncate instead
            os.ftruncate(fd, size)
        else:
            raise io_error(path, e) from None


def _write_stream(pieces, fd: int, reporter: Reporter) -> bytes:
    """Write decompressed pieces and return the block digests of the whole."""
    from ...store.hashing import BLOCK_SIZE, block_digests

    parts = []
    pending = b""
    off = 0
    for piece in pieces:
        write_all(fd, piece, off)
        off += len(piece)
        reporter.advance(len(piece))
        data = pending + piece
        whole = len(data) - len(data) % BLOCK_SIZE
        parts.append(block_digests(data[:whole]))
        pending = data[whole:]
    if pending:
        parts.append(block_digests(pending))
    return b"".join(parts)
