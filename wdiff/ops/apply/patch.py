"""The patch phase of an in-place apply: every chunk of a tensor file whose
header is unchanged is rewritten where it lies, in batches whose undo
entries are durable before their bytes are written."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np

from ...codec.chunk import RAW, decode_into
from ...codec.dtypes import uint_type
from ...errors import IntegrityError
from ...format import records as fmt
from ...format.bundle import BundleReader, Record
from ...format.undo import UndoEntry, UndoLog
from ...fsutil import io_error, write_all
from ...parallel import ordered_map
from ...paths import printable
from ...progress import Reporter
from ...statedir import StateDir
from ...store.blockio import span_digests
from ...store.checkpoint import Checkpoint, FileEntry, read_into
from ...store.digests import Digests
from ...store.hashing import tree
from ...store.units import FileLayout, Unit

BATCH_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PatchItem:
    """One chunk to patch: the bundle's record and where it lies in the base."""

    file: int
    entry: FileEntry
    unit: Unit
    record: Record


@dataclass(frozen=True, slots=True)
class Patched:
    """A chunk decoded and checked, not yet written: its new bytes at
    ``offset`` of ``fd``, and the undo entry that restores the old ones."""

    fd: int
    offset: int
    data: np.ndarray
    undo: UndoEntry
    unit: Unit
    digests: list[bytes]  # the target's block digests of each span


def patch_items(reader: BundleReader, A: Checkpoint, headers, patch: set[int]):
    """The CHUNK records of the files in ``patch``, in bundle order."""
    index = reader.index
    layouts: dict[int, FileLayout] = {}
    for rec in reader.records():
        h = rec.header
        if h.type != fmt.CHUNK or h.file not in patch:
            continue
        lay = layouts.get(h.file)
        if lay is None:
            base = A.base_tensors_for(index.files[h.file].path, index.version >= fmt.SCOPED_NAMES)
            lay = layouts[h.file] = FileLayout(headers[h.file], base)
        where = f"{reader.path}: record {rec.index}"
        unit = lay.record_unit(h.lo, h.hi, h.word, delta=h.codec != RAW, where=where)
        yield PatchItem(h.file, A.file(index.files[h.file].path), unit, rec)


class _Files:
    """Read-write descriptors of the files being patched, shared by threads."""

    def __init__(self) -> None:
        self.fds: dict[str, int] = {}
        self.lock = threading.Lock()

    def fd(self, entry: FileEntry) -> int:
        with self.lock:
            fd = self.fds.get(entry.abspath)
            if fd is None:
                try:
                    fd = self.fds[entry.abspath] = os.open(entry.abspath, os.O_RDWR | os.O_NOFOLLOW)
                except OSError as e:
                    raise io_error(entry.abspath, e) from None
            return fd

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)


def _decode(item: PatchItem, files: _Files, undone: dict) -> Patched | tuple[Unit, list[bytes]]:
    """Read one chunk as it is now and decode its patch; (unit, its block
    digests) when it is the target already (a rerun after a crash). A torn
    chunk is restored from its undo entry first."""
    h, unit, entry = item.record.header, item.unit, item.entry
    where = f"{printable(entry.path)}: tensor {printable(unit.spans[0].tensor.name)}"
    fd = files.fd(entry)
    buf = np.empty(unit.nbytes, dtype=np.uint8)
    read_into(fd, entry.header.data_start + unit.lo, memoryview(buf), where=entry.abspath)
    cur_dig = span_digests(unit, buf)
    cur = tree(b"".join(cur_dig))
    if cur == h.target:
        return unit, cur_dig
    words = buf.view(uint_type(unit.word))
    if cur != h.base:
        e = undone.get((item.file, unit.lo))
        if e is None:
            raise IntegrityError(
                f"{where}: bytes are neither the base nor the target version; "
                "the checkpoint was changed while an apply was unfinished"
            )
        e.restore(words)
        if tree(b"".join(span_digests(unit, buf))) != h.base:
            raise IntegrityError(f"{where}: undo log does not restore the base bytes")
    old = words.copy()
    decode_into(h.codec, h.param, h.count, list(item.record.payload), words, where=where)
    t_dig = span_digests(unit, buf)
    if tree(b"".join(t_dig)) != h.target:
        raise IntegrityError(f"{where}: rebuilt bytes do not match the target digest")
    undo = UndoEntry.make(item.file, unit.lo, unit.hi, old, words, h.base, h.target)
    return Patched(fd, entry.header.data_start + unit.lo, buf, undo, unit, t_dig)


def patch_files(reader: BundleReader, A: Checkpoint, headers, files: set[int], txn: StateDir, *, threads: int,
                reporter: Reporter, digests: Digests | None = None) -> int:
    """Patch every chunk of ``files`` in place; returns the bytes written.
    ``digests``: receives the target's block digests of every chunk patched
    (hashed from the bytes written), for a caller that checks the result
    against the target's tensor digests without reading it again."""
    undo = UndoLog(txn)
    undone = undo.load()
    open_files = _Files()
    written = 0
    try:
        batch: list[Patched] = []
        batch_bytes = 0
        reporter.phase("patch", None)
        work = lambda item: _decode(item, open_files, undone)  # noqa: E731
        for res in ordered_map(work, patch_items(reader, A, headers, files), threads=threads):
            if not isinstance(res, Patched):
                if digests is not None:
                    digests.put_unit(*res)
                continue
            if digests is not None:
                digests.put_unit(res.unit, res.digests)
            batch.append(res)
            batch_bytes += len(res.data)
            if batch_bytes >= BATCH_BYTES:
                written += _flush(undo, batch, reporter)
                batch, batch_bytes = [], 0
        written += _flush(undo, batch, reporter)
    finally:
        open_files.close()
        undo.close()
    return written


def _flush(undo: UndoLog, batch: list[Patched], reporter: Reporter) -> int:
    """Make a batch durable: undo entries first, then the new bytes."""
    if not batch:
        return 0
    undo.append([b.undo for b in batch])
    touched = set()
    n = 0
    for b in batch:
        try:
            write_all(b.fd, b.data, b.offset)
        except OSError as e:
            raise io_error("in-place write", e) from None
        touched.add(b.fd)
        n += len(b.data)
        reporter.advance(len(b.data))
    try:
        for fd in touched:
            os.fsync(fd)
    except OSError as e:
        raise io_error("in-place write", e) from None
    return n
