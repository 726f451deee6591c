"""Apply a bundle into live tensors (:func:`apply_into`), or hand its patches
to an engine that applies them itself (:func:`iter_patches`).

``apply_into`` is all or nothing:

1. *check*: the signature (where trusted keys are configured), the bundle's
   base against the version the receiver says its tensors hold, every
   record's digest; that the bundle's target holds exactly the tensors
   given, by name (count first, then every target header as it is known:
   :class:`~.cover.Cover`); then every chunk it patches is checked against
   the chunk's base digest (hashed in the tensors' own memory on the CPU)
   and decoded: a record that lists its changed words (SPARSE, BITMAP, and
   codec v2's MSPARSE, MBITMAP, CSPARSE, RSPARSE) to its positions and new
   words (only those words are read; CSPARSE and RSPARSE read the chunk's
   base words, which place their positions; over CPU tensors its target
   digest is checked in step 3, over device tensors at once), any other
   (DENSE, RAW, MDENSE, CDENSE) to the whole chunk, which is checked
   against its target digest at once. Nothing has been written yet.
2. *patch*: per chunk, one scatter of the changed words into each tensor
   the chunk covers (a chunk batches small tensors, so 20,000 small tensors
   are a few hundred chunks); the old words of each position are kept as
   the chunk's undo entry (in memory up to a budget, then in a temporary
   file: bounded memory whatever the bundle).
3. *verify*: every patched chunk is hashed again in the tensors and checked
   against its target digest.

Any failure in 2 or 3 (or an interrupt) puts every patched word back from
the undo entries (XOR and overwrite undo exactly), so the tensors are the
old version again, and raises. Unchanged chunks are not read: the base
check of the tensors as a whole is their names, dtypes and shapes (the
base's headers, rebuilt from them, against the bundle's digests), each
patched chunk's base digest, and, for the bytes of the chunks not patched,
the receiver's recorded version (``base_version``), which the library
takes on trust.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..codec.chunk import RAW
from ..errors import BaseMismatchError, IntegrityError, UsageError
from ..format import records as fmt
from ..format import signature as signing
from ..format.bundle import BundleReader, decode_header_record
from ..ops.signing import open_signed_bundle
from ..parallel import default_threads, ordered_map
from ..paths import printable
from ..store.blockio import span_digests
from ..store.checkpoint import KIND_TENSORS, scan, scope_of
from ..store.hashing import hexd, tree
from ..store.header import Header
from ..store.units import FileLayout, Unit
from ._tensors import Live, is_torch, prepared_aliased
from .bases import HEADERS as _HEADERS
from .bases import DirBase as _DirBase
from .bases import LiveBase as _LiveBase
from .bases import header as _header
from .changes import buffered_changes, fast_changes, span_digest
from .cover import Cover, verify_base

#: undo entries kept in memory before they go to a temporary file
UNDO_BUDGET = 256 * 1024 * 1024


@dataclass(frozen=True)
class ApplyIntoResult:
    bundle_id: str
    base_version: str | None
    version: str  # the target fingerprint: what the tensors hold now
    chunks: int  # chunks patched
    changed_elements: int
    tensors_changed: int
    seconds: float


def _open(bundle, trusted_keys, require_signature: bool) -> BundleReader:
    if isinstance(bundle, BundleReader):
        return bundle
    keys = signing.required_keys(trusted_keys, require_signature)
    path = os.fspath(bundle)
    return open_signed_bundle(path, keys) if keys else BundleReader(path)


def _fp(v) -> bytes | None:
    if v is None:
        return None
    if isinstance(v, bytes):
        return v
    try:
        return bytes.fromhex(str(v))
    except ValueError:
        raise UsageError(f"base_version {v!r} is not a version fingerprint (hex)") from None


@dataclass(slots=True)
class _Chunk:
    """One checked chunk: its unit and the words it changes (positions in
    the unit's words, old and new words), or None once spilled/streamed."""

    target: bytes
    unit: Unit
    pos: np.ndarray | None
    old: np.ndarray | None
    new: np.ndarray | None


def _check_base(reader: BundleReader, base, lives: list[Live], want: bytes | None, threads: int) -> None:
    """A delta's base against the tensors: the version the caller says they
    hold (``want``) must be the bundle's base; with none, every tensor is
    hashed against the base's listing (:func:`~.cover.verify_base`)."""
    ix = reader.index
    if ix.base_fingerprint is None:
        return
    if want is not None and ix.base_fingerprint != want:
        raise BaseMismatchError(
            f"{reader.path}: starts from version {hexd(ix.base_fingerprint)[:12]}, "
            f"but the tensors hold {hexd(want)[:12]}",
            hint="apply the bundles in order from the tensors' version, or an anchor",
        )
    if want is None:
        try:
            verify_base(ix, _base_headers(reader, base), lives, reader.path, threads, base.aliases)
        except UsageError:  # a header changed: refuse tensors that are not the target's as that
            for _ in _chunks(reader, base, need_base=False, cover=Cover(lives, ix, reader.path, base.aliases),
                             headers_only=True):
                pass
            raise


def _base_headers(reader: BundleReader, base) -> dict[int, Header]:
    """The checked headers of the target's tensor files taken from the base."""
    index = reader.index
    wanted = [i for i, f in enumerate(index.files) if f.kind == KIND_TENSORS and f.source == "base"]
    known = all((index.files[i].header_digest, index.files[i].size, scope_of(index.files[i].path)) in _HEADERS
                for i in wanted)
    raws = {} if known else base.headers(index)
    return {i: _header(raws.get(i), index.files[i], f"{reader.path}: {printable(index.files[i].path)}")
            for i in wanted}


def _chunks(reader: BundleReader, base, *, need_base: bool, cover: Cover | None = None,
            headers_only: bool = False) -> Iterator[tuple[object, Unit]]:
    """(record, unit) for every CHUNK record, in bundle order, each unit's
    spans matched with the base tensors they patch. With ``cover``, every
    target header is checked against the tensors as it becomes known, and
    the whole once the records end (so before a caller that consumes every
    item writes anything). ``headers_only``: no chunk is looked at."""
    index = reader.index
    scoped = index.version >= fmt.SCOPED_NAMES
    known = all((f.header_digest, f.size, scope_of(f.path)) in _HEADERS
                for f in index.files if f.kind == KIND_TENSORS and f.source == "base")
    raws = {} if known else base.headers(index)
    layouts: dict[int, FileLayout] = {}
    if headers_only and all(f.source == "base" or (f.header_digest, f.size, scope_of(f.path)) in _HEADERS
                            for f in index.files if f.kind == KIND_TENSORS):
        records = iter(())  # every header is known without reading a record
    else:
        records = reader.records()

    def layout(i: int) -> FileLayout:
        lay = layouts.get(i)
        if lay is None:
            f = index.files[i]
            header = _header(raws.get(i), f, f"{reader.path}: {printable(f.path)}")
            if cover is not None:
                cover.file(header)
            lay = layouts[i] = FileLayout(header, base.base_tensors(f.path, scoped))
        return lay

    for rec in records:
        h = rec.header
        where = f"{reader.path}: record {rec.index}"
        if h.type == fmt.HEADER:
            raws[h.file] = decode_header_record(rec, where=where)
            continue
        if h.type != fmt.CHUNK or headers_only:
            continue
        lay = layout(h.file)
        unit = lay.record_unit(h.lo, h.hi, h.word, delta=h.codec != RAW, where=where)
        if need_base:
            for s in unit.spans:
                if s.base is None:
                    raise UsageError(
                        f"{where}: tensor {printable(s.tensor.name)} of the new version is not among the tensors "
                        "given with that dtype and shape; a live apply cannot add tensors or change their shapes",
                        hint="reload the model from the new version's checkpoint (wdiff pull)",
                    )
        yield rec, unit
    if cover is not None:
        for i, f in enumerate(index.files):
            if f.kind == KIND_TENSORS:
                layout(i)
        cover.done()


#: codecs whose records list their changed positions: patched with one
#: scatter per tensor per chunk, never decoded whole
class _Undo:
    """Undo entries: (chunk, positions, old words), in memory up to a budget,
    then in an unlinked temporary file."""

    def __init__(self, budget: int) -> None:
        self.budget, self.used = budget, 0
        self.items: list = []
        self.file = None

    def add(self, unit: Unit, pos: np.ndarray, old: np.ndarray) -> None:
        n = pos.nbytes + old.nbytes
        if self.used + n <= self.budget:
            self.items.append((unit, pos, old))
            self.used += n
            return
        if self.file is None:
            self.file = tempfile.TemporaryFile(prefix="wdiff-undo-")
        off = self.file.seek(0, os.SEEK_END)
        self.file.write(pos.astype(np.int64, copy=False).tobytes())
        self.file.write(old.tobytes())
        self.items.append((unit, off, pos.size, old.dtype))

    def restore(self, lives_scatter) -> None:
        for item in reversed(self.items):
            if len(item) == 3:
                unit, pos, old = item
            else:
                unit, off, k, dt = item
                self.file.seek(off)
                pos = np.frombuffer(self.file.read(8 * k), dtype=np.int64)
                old = np.frombuffer(self.file.read(k * dt.itemsize), dtype=dt)
            lives_scatter(unit, pos, old)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _scatter(unit: Unit, pos: np.ndarray, vals: np.ndarray) -> set:
    """Write ``vals`` at word positions ``pos`` of the unit: one call per
    tensor the unit covers (a unit of small tensors splits its sorted
    positions by tensor with one searchsorted). On a device, the unit's
    positions and values cross to it in one copy each, then each tensor
    takes its slice (views, no copies)."""
    w = unit.word
    touched = set()
    if len(unit.spans) == 1:
        s = unit.spans[0]
        s.base.file.scatter(s.lo // w, pos, vals)
        touched.add(s.base.file)
        return touched
    bounds = np.cumsum([0] + [(s.hi - s.lo) // w for s in unit.spans])
    cuts = np.searchsorted(pos, bounds)
    first = unit.spans[0].base.file
    if first.device is not None and all(s.base.file.device == first.device for s in unit.spans):
        # word index inside each tensor, for every position at once
        k = np.repeat(np.arange(len(unit.spans)), np.diff(cuts))
        starts = np.array([s.lo // w for s in unit.spans], dtype=np.int64)
        rel = pos.astype(np.int64) - bounds[:-1][k] + starts[k]
        rel_d, vals_d = first.to_device(rel, vals)
        for i, s in enumerate(unit.spans):
            a, b = cuts[i], cuts[i + 1]
            if a < b:
                s.base.file.scatter_device(rel_d[a:b], vals_d[a:b])
                touched.add(s.base.file)
        return touched
    for i, s in enumerate(unit.spans):
        a, b = cuts[i], cuts[i + 1]
        if a < b:
            s.base.file.scatter(s.lo // w, pos[a:b] - bounds[i], vals[a:b])
            touched.add(s.base.file)
    return touched


def apply_into(bundle, tensors, *, base_version=None, trusted_keys=None, require_signature: bool = False,
               undo_budget: int = UNDO_BUDGET, threads: int | None = None) -> ApplyIntoResult:
    """Patch ``tensors`` (a state dict or (name, tensor) pairs: torch CPU or
    CUDA tensors, numpy arrays; or :func:`prepare`'s wrapping of them, for
    many applies into the same tensors) in place from the version ``bundle``
    starts from to the one it ends at, and return that version.

    Tensors are matched by name: any order works (a ``state_dict``,
    ``safetensors.torch.load_file``'s sorted dict, a dict built by hand).
    The bundle's target must hold exactly the tensors given, the same
    names, dtypes and shapes, none missing and none extra (a tied alias
    counts as the tensor whose memory it shares); anything else is refused
    with BaseMismatchError before a byte is written: an anchor of some of
    the tensors, a part of a many-writer version, a bundle of another
    model, a version that adds, drops or reshapes a tensor.

    What is verified and what is the caller's word:

    * verified: the signature (with ``trusted_keys``), the bundle's own
      digests, the names, dtypes and shapes of every tensor (the base's
      headers rebuilt from the tensors must have the digests the bundle
      names), the bytes of every chunk the bundle patches (its base digest
      before, its target digest after), and that the tensors given are the
      target's whole set;
    * the caller's word: ``base_version``, the version the caller recorded
      for these tensors (hex or bytes). A delta made for another version
      is refused before anything is read. The chunks the bundle does not
      patch are not read (hashing a whole model per step is what this
      avoids), so whether they hold the base version is what
      ``base_version`` asserts. With ``base_version=None`` nothing is taken
      on trust: every tensor is hashed and the base's tensor files must
      have the digests the bundle lists (a delta that changes a file's
      header then needs ``base_version``). An anchor needs neither: it
      writes every byte.

    Raises a WdiffError subclass on refusal; on any failure the tensors are
    the old version again (see the module doc)."""
    return _apply_into(bundle, tensors, base_version=base_version, trusted_keys=trusted_keys,
                       require_signature=require_signature, undo_budget=undo_budget, threads=threads)


def _apply_into(bundle, tensors, *, base_version=None, trusted_keys=None, require_signature: bool = False,
                undo_budget: int = UNDO_BUDGET, threads: int | None = None,
                layout: str | None = None) -> ApplyIntoResult:
    """:func:`apply_into`; ``layout``: a checkpoint of the base version (a
    Follower's own) whose headers are used where they have the digests the
    bundle names, so that a layout no dict order gives (a multi-rank
    version's) needs no particular order either."""
    t0 = time.perf_counter()
    want = _fp(base_version)
    lives, aliases = prepared_aliased(tensors)
    for t in lives:
        t.writable()
    base = _LiveBase(lives, layout, aliases)
    reader = _open(bundle, trusted_keys, require_signature)
    try:
        ix = reader.index
        cover = Cover(lives, ix, reader.path, aliases)
        threads = threads or default_threads()
        _check_base(reader, base, lives, want, threads)
        return _apply(reader, base, cover, undo_budget, t0, threads)
    finally:
        if not isinstance(bundle, BundleReader):
            reader.close()


def _check(reader: BundleReader, base):
    """Step 1 for one chunk, on a worker thread: (target digest, unit,
    (positions, old words, new words))."""

    def one(item):
        rec, unit = item
        fast = fast_changes(reader, rec, unit)
        if fast is None:
            fast = buffered_changes(reader, rec, unit, base)[:3]
        return rec.header.target, unit, fast

    return one


def _apply(reader: BundleReader, base: _LiveBase, cover: Cover, undo_budget: int, t0: float,
           threads: int) -> ApplyIntoResult:
    ix = reader.index
    kept: list[_Chunk] = []
    used = 0
    streamed = False
    # 1. check everything (the tensors against the target's headers, every
    # chunk); keep the decoded changes while they fit the budget
    for target, unit, (pos, ov, nv) in ordered_map(_check(reader, base),
                                                   _chunks(reader, base, need_base=True, cover=cover),
                                                   threads=threads):
        if streamed:
            continue
        used += pos.nbytes // 2 + ov.nbytes + nv.nbytes
        if used > undo_budget:
            streamed, kept = True, []  # too much to keep: decode again in step 2
            continue
        kept.append(_Chunk(target, unit, pos.astype(np.int32), ov, nv))
    # 2. patch, keeping undo entries; 3. read back and check
    undo = _Undo(undo_budget)
    touched: set = set()
    changed = chunks = 0
    names: set[str] = set()
    try:
        if streamed:
            source = ((t, u, *c) for t, u, c in ordered_map(_check(reader, base), _chunks(reader, base, need_base=True),
                                                            threads=threads))
        else:
            source = ((c.target, c.unit, c.pos, c.old, c.new) for c in kept)
        done: list[tuple[Unit, bytes]] = []
        for target, unit, pos, ov, nv in source:
            undo.add(unit, pos, ov)
            hit = _scatter(unit, pos, nv)
            touched |= hit
            done.append((unit, target))
            changed += int(pos.size)
            chunks += 1
            names.update(t.name for t in hit)
        for t in touched:
            t.sync()
        _verify(base, done, threads)
    except BaseException:
        undo.restore(lambda unit, pos, old: _scatter(unit, pos, old))
        for t in touched:
            t.sync()
        raise
    finally:
        undo.close()
    return ApplyIntoResult(
        bundle_id=hexd(reader.id), base_version=hexd(ix.base_fingerprint) if ix.base_fingerprint else None,
        version=hexd(ix.target_fingerprint), chunks=chunks, changed_elements=changed, tensors_changed=len(names),
        seconds=time.perf_counter() - t0,
    )


def _verify(base, units: list[tuple[Unit, bytes]], threads: int) -> None:
    """Read every patched chunk back from the tensors: it must be the target."""

    def digest(item):
        unit, target = item
        if all(s.base.file.device is None and s.base.file.u8 is not None for s in unit.spans):
            return unit, target, span_digest(unit)
        buf = np.empty(unit.nbytes, dtype=np.uint8)
        base.read(unit, buf)
        return unit, target, tree(b"".join(span_digests(unit, buf)))

    for unit, target, got in ordered_map(digest, units, threads=threads):
        if got != target:
            raise IntegrityError(f"{printable(unit.spans[0].tensor.name)}: the tensor does not hold the target "
                                 "bytes after the patch (changed meanwhile?); every tensor was put back")


def iter_patches(bundle, *, base=None, base_version=None, trusted_keys=None, require_signature: bool = False,
                 threads: int | None = None):
    """Yield ``(name, indices, values, shape)`` for every tensor the bundle
    changes, in checkpoint coordinates: int32 flat element indices (int64
    for tensors over 2**31 elements), the new values at them, and the
    tensor's full shape. ``base``: the mirror (a checkpoint directory of the
    bundle's base version) or the live tensors (a state dict, any order:
    tensors are matched by name); each chunk is read from it and checked
    against its base digest before its patches are yielded (an anchor needs
    no base). With torch tensors as the base the values are CPU torch
    tensors of the tensor's dtype; otherwise numpy arrays (bf16 and other
    dtypes numpy lacks: their raw unsigned words).

    With live tensors as ``base``, the bundle's target must hold exactly
    those tensors (names, dtypes, shapes; see :func:`apply_into`), checked
    before the first patch is yielded: for a bundle that carries headers
    (an anchor, a version that changed one) that costs one more read of the
    bundle. And a delta's base is checked as :func:`apply_into` checks it:
    ``base_version`` (the version the engine recorded) must be the
    bundle's, and the chunks not patched are taken on its word; without
    it every tensor is hashed against the base's digests first. With a
    mirror, or with no base, checking that the target is the whole of what
    the engine holds is the engine's (every target tensor's name and shape
    come with its patches; an anchor yields every tensor).
    Each chunk is verified before it is yielded (a record that lists its
    changed words is patched into a copy of the chunk's base at those
    positions only, never decoded whole); all-or-nothing is
    :func:`apply_into`'s."""
    torch_out = False
    lives = None
    if base is None:
        src = _LiveBase([])
    elif isinstance(base, (str, os.PathLike)):
        src = _DirBase(scan(os.fspath(base)))
    else:
        lives, aliases = prepared_aliased(base)
        torch_out = any(is_torch(t.obj) for t in lives)
        src = _LiveBase(lives, aliases=aliases)
    reader = _open(bundle, trusted_keys, require_signature)
    try:
        if base is None and reader.index.base_fingerprint is not None:
            raise UsageError("this bundle patches a base: give base= (the mirror directory or the tensors)")
        ix = reader.index
        if lives is not None:
            cover = Cover(lives, ix, reader.path, src.aliases)
            _check_base(reader, src, lives, _fp(base_version), threads or default_threads())
            for _ in _chunks(reader, src, need_base=False, cover=cover, headers_only=True):
                pass
        for rec, unit in _chunks(reader, src, need_base=False):
            pos, _ov, nv, _whole = buffered_changes(reader, rec, unit, src)
            yield from _per_tensor(unit, pos, nv, torch_out)
    finally:
        if isinstance(src, _DirBase):
            src.fds.close()
        if not isinstance(bundle, BundleReader):
            reader.close()


def _per_tensor(unit: Unit, pos: np.ndarray, vals: np.ndarray, torch_out: bool):
    w = unit.word
    bounds = np.cumsum([0] + [(s.hi - s.lo) // w for s in unit.spans])
    cuts = np.searchsorted(pos, bounds)
    for k, s in enumerate(unit.spans):
        a, b = cuts[k], cuts[k + 1]
        if a == b:
            continue
        t = s.tensor
        n = t.nbytes // w
        idx = pos[a:b] - bounds[k] + s.lo // w
        idx = idx.astype(np.int32 if n < 2**31 else np.int64)
        yield t.name, idx, _values(t.dtype, vals[a:b], torch_out), t.shape


_NP = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
       "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8,
       "BOOL": np.bool_}


def _values(dtype: str, words: np.ndarray, torch_out: bool):
    words = np.ascontiguousarray(words)
    if torch_out:
        import torch

        from ._tensors import _SIGNED, _TORCH

        tdt = next(getattr(torch, k.split(".")[1]) for k, v in _TORCH.items() if v == dtype)
        return torch.from_numpy(words.view(_SIGNED[words.dtype.itemsize])).view(tdt)
    dt = _NP.get(dtype)
    return words.view(dt) if dt is not None else words
