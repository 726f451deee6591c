"""``diff``: what changed between two checkpoints, tensor by tensor.

Tensors are matched by name, whatever shard holds them. Both sides are read
and hashed (never taken from the manifest cache); elements are compared only
inside blocks whose digests differ, and float statistics are computed only
for changed tensors.
"""

from __future__ import annotations

import json
import math
import operator
from dataclasses import dataclass, field

import numpy as np

from ..codec import kernels
from ..codec.dtypes import dtype_info, uint_type
from ..defaults import DEFAULT_CHUNK
from ..parallel import default_threads, ordered_map
from ..paths import PathLike
from ..progress import SILENT, Reporter
from ..store.blockio import FdCache, read_base, read_target, scratch, span_digests
from ..store.checkpoint import KIND_TENSORS, Checkpoint
from ..store.hashing import BLOCK_SIZE, hexd, n_blocks
from ..store.units import Unit
from ..store import ignore
from .pair import Pair

SCHEMA = "wdiff.diff/1"

UNCHANGED, MODIFIED, ADDED, REMOVED, RETYPED = "unchanged", "modified", "added", "removed", "retyped"


@dataclass(frozen=True)
class TensorDiff:
    name: str
    status: str  # unchanged, modified, added, removed, retyped (dtype or shape changed)
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    old_dtype: str | None = None  # retyped only
    old_shape: tuple[int, ...] | None = None
    blocks: int = 0
    blocks_changed: int = 0
    elements: int = 0  # codec words: one value, or one component / byte of packed types
    changed: int = 0
    max_abs: float | None = None
    rel_l2: float | None = None

    @property
    def fraction(self) -> float:
        return self.changed / self.elements if self.elements else 0.0

    def to_json(self) -> dict:
        d = {
            "name": self.name,
            "status": self.status,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "bytes": self.nbytes,
        }
        if self.status == RETYPED:
            d["old_dtype"] = self.old_dtype
            d["old_shape"] = list(self.old_shape or ())
        if self.status in (MODIFIED, UNCHANGED):
            d.update(
                blocks=self.blocks,
                blocks_changed=self.blocks_changed,
                elements=self.elements,
                changed_elements=self.changed,
                changed_fraction=self.fraction,
                max_abs_change=_finite(self.max_abs),
                relative_l2=_finite(self.rel_l2),
            )
        return d


def _finite(x: float | None):
    if x is None:
        return None
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf"
    return x


@dataclass(frozen=True)
class FileDiff:
    path: str
    status: str  # added, removed, changed
    old_size: int | None
    new_size: int | None
    note: str | None = None

    def to_json(self) -> dict:
        return {"path": self.path, "status": self.status, "old_size": self.old_size, "new_size": self.new_size}


@dataclass(frozen=True)
class DiffResult:
    """What :func:`diff` found: per tensor and per companion file, and totals."""

    a: str
    b: str
    a_fingerprint: bytes
    b_fingerprint: bytes
    tensors: tuple[TensorDiff, ...]  # target order, then removed tensors
    files: tuple[FileDiff, ...]  # companion files that differ
    metadata_changed: tuple[str, ...]  # tensor files whose __metadata__ differs
    layout_changed: bool  # tensors sit in other files or at other offsets
    a_tensor_files: int = 0
    b_tensor_files: int = 0
    warnings: tuple[str, ...] = field(default=())

    @property
    def identical(self) -> bool:
        return self.a_fingerprint == self.b_fingerprint

    @property
    def differs(self) -> bool:
        """True when tensors, companion files or metadata differ. A change of
        layout alone (re-sharding) is not a difference of content."""
        return bool(self.files or self.metadata_changed or any(t.status != UNCHANGED for t in self.tensors))

    def count(self, status: str) -> int:
        return sum(1 for t in self.tensors if t.status == status)

    @property
    def totals(self) -> dict:
        mod = [t for t in self.tensors if t.status in (MODIFIED, UNCHANGED)]
        elements = sum(t.elements for t in mod)
        changed = sum(t.changed for t in mod)
        return {
            "tensors": len(self.tensors),
            "unchanged": self.count(UNCHANGED),
            "modified": self.count(MODIFIED),
            "added": self.count(ADDED),
            "removed": self.count(REMOVED),
            "retyped": self.count(RETYPED),
            "files_changed": len(self.files),
            "compared_elements": elements,
            "changed_elements": changed,
            "changed_fraction": changed / elements if elements else 0.0,
            "changed_blocks": sum(t.blocks_changed for t in mod),
            "blocks": sum(t.blocks for t in mod),
        }

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "a": {"path": self.a, "fingerprint": hexd(self.a_fingerprint), "tensor_files": self.a_tensor_files},
            "b": {"path": self.b, "fingerprint": hexd(self.b_fingerprint), "tensor_files": self.b_tensor_files},
            "identical": self.identical,
            "differs": self.differs,
            "layout_changed": self.layout_changed,
            "metadata_changed": list(self.metadata_changed),
            "tensors": [t.to_json() for t in self.tensors],
            "files": [f.to_json() for f in self.files],
            "totals": self.totals,
            "warnings": list(self.warnings),
        }


class _Acc:
    """What the compared spans of one tensor found so far. (A plain class:
    a dataclass costs every diff ~0.6 ms to define, and this one needs
    nothing of one.)"""

    __slots__ = ("blocks_changed", "changed", "floats", "max_abs", "sum_a2", "sum_d2")

    def __init__(self) -> None:
        self.blocks_changed = self.changed = 0
        self.max_abs = self.sum_d2 = self.sum_a2 = 0.0
        self.floats = False

    def add(self, st: tuple) -> None:
        """Add what one span found: (blocks changed, words changed, max |d|,
        sum d^2, sum a^2), the float figures None for other dtypes."""
        self.blocks_changed += st[0]
        self.changed += st[1]
        if st[2] is not None:
            self.floats = True
            if not math.isnan(st[2]):
                self.max_abs = max(self.max_abs, st[2])
            self.sum_d2 += st[3]
            self.sum_a2 += st[4]


def diff(
    a: PathLike,
    b: PathLike,
    *,
    threads: int | None = None,
    reporter: Reporter = SILENT,
    exclude: tuple[str, ...] | list[str] = (),
    include: tuple[str, ...] | list[str] = (),
) -> DiffResult:
    """Compare checkpoint ``a`` with checkpoint ``b``, tensor by tensor.

    Returns a :class:`DiffResult`: per tensor its status (unchanged,
    modified, added, removed, retyped), the changed blocks and elements, the
    largest change and the relative L2 norm of the change; per companion
    file whether it changed; and totals. ``threads`` defaults to every core
    (or ``WDIFF_THREADS``). Either side may be a single ``.safetensors``
    file. Files matching the default trainer-state patterns, the
    checkpoint's ``.wdiffignore`` or ``exclude`` (gitignore syntax) are left
    out, unless a later ``include`` pattern matches.
    """
    threads = threads or default_threads()
    pair = Pair(a, b, reporter=reporter, rules=ignore.rules(exclude, include))
    acc: dict[str, _Acc] = {}
    work = pair.units(DEFAULT_CHUNK)
    reporter.phase("compare", sum(w.unit.nbytes for w in work))
    same_pieces: dict[str, list[Unit]] = {}  # unchanged pieces of tensors cut in units
    with FdCache() as fds:
        for unit, a_dig, b_dig, stats in ordered_map(lambda w: _diff_unit(fds, w.entry, w.unit), work, threads=threads):
            pair.record(unit, a_dig, b_dig)
            if stats is not None:
                for s, st in zip(unit.spans, stats):
                    if st is not None:
                        x = acc.get(s.tensor.name)
                        if x is None:
                            x = acc[s.tensor.name] = _Acc()
                        x.add(st)
                    elif s.lo or s.hi != s.tensor.nbytes:
                        same_pieces.setdefault(s.tensor.name, []).append(unit)
            reporter.advance(unit.nbytes)
        _add_unchanged_norms(fds, acc, same_pieces)
    reporter.phase("hash", None)
    ma = pair.complete_base(threads=threads, reporter=reporter)
    mb = pair.complete_target(threads=threads, reporter=reporter)
    return _result(pair.A, pair.B, ma, mb, acc, pair.warnings)


def _add_unchanged_norms(fds: FdCache, acc: dict, same_pieces: dict) -> None:
    """The relative L2 norm of a change is relative to all of A's tensor:
    the pieces of a modified tensor whose digests matched were not compared,
    so their sum of squares is added now (read again: only a tensor changed
    in some of its units, not in all, has any)."""
    for name, units in same_pieces.items():
        x = acc.get(name)
        if x is None or not x.floats:
            continue
        for unit in units:
            abuf = scratch("a", unit.nbytes)
            read_base(fds, unit, abuf)
            a = abuf.view(_UINT[unit.word])
            x.sum_a2 += kernels.diff_stats(a, a, unit.spans[0].tensor.dtype)[0][3]


def _diff_unit(fds: FdCache, f, unit: Unit) -> tuple:
    """One unit compared: ``(unit, A's block digests, B's, statistics)``,
    A's None for a unit with no base, and the statistics None there or a
    list with, per span, its statistics (None: unchanged). Both sides are
    read and hashed: a digest from the manifest cache could be stale (a
    write through a shared mmap leaves the file's stat as it was), and
    "unchanged" is an output."""
    bbuf = scratch("b", unit.nbytes)
    read_target(fds, f, unit, bbuf)
    b_dig = span_digests(unit, bbuf)
    if not unit.delta:
        return unit, None, b_dig, None
    abuf = scratch("a", unit.nbytes)
    read_base(fds, unit, abuf)
    a_dig = span_digests(unit, abuf)
    if a_dig == b_dig:
        return unit, a_dig, b_dig, [None] * len(unit.spans)
    ut = _UINT[unit.word]
    if len(unit.spans) == 1:  # a piece of one large tensor (most of the bytes): the whole unit
        changed, rows = [0], None
    else:
        bounds = np.cumsum([0] + [s.nbytes // unit.word for s in unit.spans])
        changed = [i for i in range(len(unit.spans)) if a_dig[i] != b_dig[i]]
        rows = np.stack([bounds[changed], bounds[np.array(changed) + 1]], axis=1)
    # one call for all changed spans: small tensors are batched in units
    found = kernels.diff_stats(abuf.view(ut), bbuf.view(ut), unit.spans[changed[0]].tensor.dtype, rows)
    stats: list = [None] * len(unit.spans)
    for i, (n, max_abs, sum_d2, sum_a2) in zip(changed, found):
        stats[i] = (_blocks_changed(a_dig[i], b_dig[i]), n, max_abs, sum_d2, sum_a2)
    return unit, a_dig, b_dig, stats


#: the unsigned numpy type of each word size
_UINT = {w: uint_type(w) for w in (1, 2, 4, 8)}


def _blocks_changed(a: bytes, b: bytes) -> int:
    if len(a) == 16:
        return int(a != b)
    if len(a) <= 16 * 8:  # a unit's piece of a tensor: a few blocks
        return sum(a[i : i + 16] != b[i : i + 16] for i in range(0, len(a), 16))
    x = np.frombuffer(a, dtype=np.uint8).reshape(-1, 16)
    y = np.frombuffer(b, dtype=np.uint8).reshape(-1, 16)
    return int((x != y).any(axis=1).sum())


def _result(A: Checkpoint, B: Checkpoint, ma, mb, acc: dict, warnings) -> DiffResult:
    meta, layout_changed = _layout(A, B)
    return DiffResult(
        a=A.root, b=B.root, a_fingerprint=ma.fingerprint, b_fingerprint=mb.fingerprint,
        tensors=_tensor_rows(A, B, ma, mb, acc), files=_file_rows(ma, mb), metadata_changed=meta,
        layout_changed=layout_changed,
        a_tensor_files=sum(1 for f in A.files if f.kind == KIND_TENSORS),
        b_tensor_files=sum(1 for f in B.files if f.kind == KIND_TENSORS),
        warnings=warnings,
    )


_NO_CHANGE = _Acc()


def _tensor_rows(A: Checkpoint, B: Checkpoint, ma, mb, acc: dict) -> tuple[TensorDiff, ...]:
    """A row per tensor of B, in B's order, then per tensor removed. Runs
    once per tensor, so it is written for speed."""
    a_tensors, b_tensors = A.tensors, B.tensors
    a_digest = _tensor_digests(A, ma)
    b_digest = _tensor_digests(B, mb)
    out: list[TensorDiff] = []
    add = out.append
    for f in B.files:
        if f.kind != KIND_TENSORS:
            continue
        for name, dtype, shape, _, _, nbytes in f.header.tensors:
            hit = a_tensors.get(name)
            if hit is None:
                add(TensorDiff(name, ADDED, dtype, shape, nbytes))
                continue
            bt = hit[1]
            if bt.dtype != dtype or bt.shape != shape or bt.nbytes != nbytes:
                add(TensorDiff(name, RETYPED, dtype, shape, nbytes, bt.dtype, bt.shape))
                continue
            info = dtype_info(dtype)
            same = a_digest[name] == b_digest[name]
            x = acc.get(name, _NO_CHANGE)
            if info.is_float and x.floats:
                max_abs, rel = x.max_abs, _rel(x)
            else:
                max_abs = rel = 0.0 if same and info.is_float else None
            add(TensorDiff(
                name, UNCHANGED if same else MODIFIED, dtype, shape, nbytes,
                blocks=n_blocks(nbytes), blocks_changed=x.blocks_changed,
                elements=nbytes // info.word, changed=x.changed, max_abs=max_abs, rel_l2=rel,
            ))
    for name, (_, t) in a_tensors.items():
        if name not in b_tensors:
            add(TensorDiff(name, REMOVED, t.dtype, t.shape, t.nbytes))
    return tuple(out)


def _file_rows(ma, mb) -> tuple[FileDiff, ...]:
    """The companion files that were added, changed or removed, by path."""
    files: list[FileDiff] = []
    adig = {d.path: d for d in ma.files}
    bdig = {d.path: d for d in mb.files}
    for d in mb.files:
        if d.kind == KIND_TENSORS:
            continue
        old = adig.get(d.path)
        if old is None or old.kind == KIND_TENSORS:
            files.append(FileDiff(d.path, "added", None, d.size))
        elif old.digest != d.digest:
            files.append(FileDiff(d.path, "changed", old.size, d.size))
    for d in ma.files:
        if d.kind != KIND_TENSORS and (d.path not in bdig or bdig[d.path].kind == KIND_TENSORS):
            files.append(FileDiff(d.path, "removed", d.size, None))
    files.sort(key=lambda x: x.path.encode("utf-8"))
    return tuple(files)


_NAME_AND_START = operator.itemgetter(0, 3)


def _layout(A: Checkpoint, B: Checkpoint) -> tuple[tuple[str, ...], bool]:
    """The tensor files of B whose __metadata__ differs from A's, and whether
    tensors sit in other files or at other offsets."""
    meta = []
    layout_changed = False
    a_meta = {_meta_key(f.header.metadata) for f in A.files if f.kind == KIND_TENSORS}
    for f in B.files:
        if f.kind != KIND_TENSORS:
            continue
        old = A.file(f.path)
        if old is None or old.kind != KIND_TENSORS:
            layout_changed = True
            if _meta_key(f.header.metadata) not in a_meta:  # re-sharded: compare with any of A's
                meta.append(f.path)
            continue
        if old.header.raw == f.header.raw:  # the usual case: the same header, byte for byte
            continue
        if old.header.metadata != f.header.metadata:
            meta.append(f.path)
        if list(map(_NAME_AND_START, old.header.tensors)) != list(map(_NAME_AND_START, f.header.tensors)):
            layout_changed = True
    if any(A.file(f.path) is None or B.file(f.path) is None for f in A.files if f.kind == KIND_TENSORS):
        layout_changed = True
    return tuple(meta), layout_changed


def _meta_key(metadata: dict | None) -> str:
    return json.dumps(metadata, sort_keys=True)


def _rel(x: _Acc) -> float:
    if x.sum_a2 > 0:
        return math.sqrt(x.sum_d2) / math.sqrt(x.sum_a2)
    return math.inf if x.sum_d2 > 0 else 0.0


def _tensor_digests(ckpt: Checkpoint, m) -> dict[str, bytes]:
    out = {}
    for f, d in zip(ckpt.files, m.files):
        if f.kind == KIND_TENSORS:
            for t, blocks in zip(f.header.tensors, d.blocks):
                out[t.name] = blocks
    return out


__all__ = ["diff", "DiffResult", "TensorDiff", "FileDiff", "BLOCK_SIZE"]
