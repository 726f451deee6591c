"""Manifests of checkpoints: every file's digest and every tensor's block
digests, computed in parallel with bounded memory.

The data passes of diff, pack and apply produce most block digests as a by-
product; :class:`Digests` collects them, and :func:`complete` hashes only
what those passes did not read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from .blockio import FdCache, read_target, scratch, span_digests
from .checkpoint import KIND_TENSORS, Checkpoint, FileEntry, read_into
from .fsutil import write_all
from .hashing import BLOCK_SIZE, FileDigest, Manifest, block_digests, file_digest_from_blocks, n_blocks
from .parallel import ordered_map
from .plan import DEFAULT_CHUNK, Unit, pack_units
from .progress import SILENT, Reporter

READ_PIECE = 8 * BLOCK_SIZE


class Digests:
    """Block digests of one checkpoint's tensors and companion files, filled
    in as units are processed (in any order)."""

    def __init__(self) -> None:
        #: tensor name -> concatenated block digests: bytes when they came
        #: whole, a bytearray filled piece by piece for a tensor cut in units
        self.tensors: dict[str, bytes | bytearray] = {}
        self.files: dict[str, bytes] = {}

    def put_unit(self, unit: Unit, digests: list[bytes], *, base: bool = False) -> None:
        tensors = self.tensors
        for s, d in zip(unit.spans, digests):
            t = s.base.tensor if base else s.tensor
            if s.lo == 0 and s.hi == t.nbytes:  # a whole tensor: most of them, in a small-tensor checkpoint
                tensors[t.name] = d
                continue
            arr = tensors.get(t.name)
            if arr is None:
                arr = tensors[t.name] = bytearray(16 * n_blocks(t.nbytes))
            elif type(arr) is bytes:  # known whole before; a piece of it is updated now
                arr = tensors[t.name] = bytearray(arr)
            at = 16 * (s.lo // BLOCK_SIZE)
            arr[at : at + len(d)] = d

    def has_tensor(self, name: str) -> bool:
        return name in self.tensors

    def manifest(self, ckpt: Checkpoint) -> Manifest:
        """The manifest of ``ckpt``; every tensor and file must be present."""
        out = []
        for f in ckpt.files:
            if f.kind == KIND_TENSORS:
                blocks = [bytes(self.tensors.get(t.name, b"")) for t in f.header.tensors]
                header_raw = f.header.raw
            else:
                blocks = [self.files[f.path]]
                header_raw = None
            out.append(
                FileDigest(
                    f.path, f.kind, f.size, file_digest_from_blocks(f.kind, header_raw, blocks),
                    header_digest=_hdr(header_raw), blocks=tuple(blocks),
                )
            )
        return Manifest(tuple(out))


def _hdr(raw: bytes | None) -> bytes | None:
    if raw is None:
        return None
    import xxhash

    return xxhash.xxh3_128_digest(raw)


def hash_file(path: str, size: int, *, reporter: Reporter = SILENT, copy_to: int | None = None) -> bytes:
    """Block digests of a whole (companion) file, read in pieces; with
    ``copy_to`` (a file descriptor) each piece is also written there."""
    buf = scratch("file", READ_PIECE)
    parts = []
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        from .fsutil import io_error

        raise io_error(path, e) from None
    try:
        for off in range(0, size, READ_PIECE):
            n = min(READ_PIECE, size - off)
            read_into(fd, off, memoryview(buf[:n]), where=path)
            parts.append(block_digests(buf[:n]))
            if copy_to is not None:
                write_all(copy_to, buf[:n], off)
            reporter.advance(n)
    finally:
        os.close(fd)
    return b"".join(parts)


def _from_cache(ckpt: Checkpoint, digests: Digests) -> set[str]:
    """Fill ``digests`` from the manifest cache for files it lacks entirely;
    returns the paths served from the cache."""
    from . import cache

    served = set()
    for f in ckpt.files:
        if f.kind == KIND_TENSORS:
            if any(digests.has_tensor(t.name) for t in f.header.tensors if t.nbytes):
                continue
        elif f.path in digests.files:
            continue
        hit = cache.lookup(f)
        if hit is None:
            continue
        if f.kind == KIND_TENSORS:
            for t, b in zip(f.header.tensors, hit):
                digests.tensors[t.name] = b
        else:
            digests.files[f.path] = hit[0]
        served.add(f.path)
    return served


class Known(dict):
    """Block digests of tensors that the manifest cache holds (tensor name ->
    concatenated block digests), and the paths of the files they came from."""

    paths: frozenset[str] = frozenset()


def cached_tensors(ckpt: Checkpoint) -> Known:
    """What the manifest cache holds of the tensor files of ``ckpt``: a data
    pass can use these digests instead of hashing what it reads, skip
    reading blocks whose digests match on both sides, and need not store
    these files in the cache again (pass ``known.paths`` to
    :func:`complete`)."""
    from . import cache

    out = Known()
    paths = set()
    for f in ckpt.files:
        if f.kind != KIND_TENSORS:
            continue
        hit = cache.lookup(f)
        if hit is not None:
            out.update((t.name, b) for t, b in zip(f.header.tensors, hit))
            paths.add(f.path)
    out.paths = frozenset(paths)
    return out


def remember(ckpt: Checkpoint, digests: Digests, *, skip: set[str] = frozenset()) -> None:
    """Store in the manifest cache every file of ``ckpt`` that ``digests``
    covers completely (what a data pass or a hash pass just read)."""
    from . import cache

    for f in ckpt.files:
        if f.path in skip:
            continue
        if f.kind == KIND_TENSORS:
            blocks = [digests.tensors.get(t.name) for t in f.header.tensors]
            if any(b is None or len(b) != 16 * n_blocks(t.nbytes) for b, t in zip(blocks, f.header.tensors)):
                continue
            cache.store(f, [bytes(b) for b in blocks])
        elif f.path in digests.files:
            cache.store(f, [digests.files[f.path]])


def complete(
    ckpt: Checkpoint,
    digests: Digests,
    *,
    threads: int,
    reporter: Reporter = SILENT,
    use_cache: bool = True,
    cached: frozenset[str] = frozenset(),
) -> Manifest:
    """Hash whatever of ``ckpt`` is not in ``digests`` yet (unless the
    manifest cache has it and ``use_cache``); return the manifest. Files
    whose paths are in ``cached`` came from the cache and are not stored
    in it again."""
    served = (_from_cache(ckpt, digests) if use_cache else set()) | cached
    for f in ckpt.files:
        if f.kind != KIND_TENSORS and f.path not in digests.files:
            digests.files[f.path] = hash_file(f.abspath, f.size, reporter=reporter)
    work = [(f, u) for f in ckpt.files if f.kind == KIND_TENSORS for u in _missing_units(f, digests)]
    with FdCache() as fds:

        def run(item: tuple[FileEntry, Unit]):
            f, unit = item
            buf = scratch("b", unit.nbytes)
            read_target(fds, f, unit, buf)
            return unit, span_digests(unit, buf)

        for unit, ds in ordered_map(run, work, threads=threads):
            digests.put_unit(unit, ds)
            reporter.advance(unit.nbytes)
    # empty tensors have no units but a digest all the same
    for f in ckpt.files:
        if f.kind == KIND_TENSORS:
            for t in f.header.tensors:
                if t.nbytes == 0:
                    digests.tensors.setdefault(t.name, bytearray())
    remember(ckpt, digests, skip=served)
    return digests.manifest(ckpt)


def _missing_units(f: FileEntry, digests: Digests) -> Iterable[Unit]:
    if all(digests.has_tensor(t.name) for t in f.header.tensors if t.nbytes):
        return  # the usual case after a data pass: nothing to plan
    for unit in pack_units(f.header, {}, DEFAULT_CHUNK):
        if not all(digests.has_tensor(s.tensor.name) for s in unit.spans):
            yield unit


def compute(ckpt: Checkpoint, *, threads: int, reporter: Reporter = SILENT, use_cache: bool = True) -> Manifest:
    """Hash a whole checkpoint (or take its digests from the manifest cache)."""
    return complete(ckpt, Digests(), threads=threads, reporter=reporter, use_cache=use_cache)
