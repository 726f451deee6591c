"""Manifests of checkpoints: every file's digest and every tensor's block
digests, computed in parallel with bounded memory.

The data passes of diff, pack and apply produce most block digests as a by-
product (:class:`~wdiff.store.digests.Digests` collects them);
:func:`complete` hashes only what is left. The manifest cache is consulted
only when a caller asks for it (``use_cache=True``): its hits are guesses
(see :mod:`wdiff.store.cache`), fit for a hint and for nothing an output
depends on.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..defaults import DEFAULT_CHUNK
from ..parallel import ordered_map
from ..progress import SILENT, Reporter
from . import cache
from .blockio import FdCache, read_target, scratch, span_digests
from .checkpoint import KIND_TENSORS, Checkpoint, FileEntry
from .digests import Digests, hash_file
from .hashing import Manifest
from .units import Unit, pack_units


def complete(
    ckpt: Checkpoint,
    digests: Digests,
    *,
    threads: int,
    reporter: Reporter = SILENT,
    use_cache: bool = False,
) -> Manifest:
    """Hash whatever of ``ckpt`` is not in ``digests`` yet; return the
    manifest, and remember it in the manifest cache. With ``use_cache``,
    digests the cache holds are taken instead of reading: the manifest is
    then a guess, not a measurement."""
    served = cache.fill(ckpt, digests) if use_cache else set()
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
    cache.remember(ckpt, digests, skip=served)
    return digests.manifest(ckpt)


def _missing_units(f: FileEntry, digests: Digests) -> Iterable[Unit]:
    if all(digests.has_tensor(t.name) for t in f.header.tensors if t.nbytes):
        return  # the usual case after a data pass: nothing to plan
    for unit in pack_units(f.header, {}, DEFAULT_CHUNK):
        if not all(digests.has_tensor(s.tensor.name) for s in unit.spans):
            yield unit


def compute(ckpt: Checkpoint, *, threads: int, reporter: Reporter = SILENT, use_cache: bool = False) -> Manifest:
    """Hash a whole checkpoint (with ``use_cache``, guess its digests from
    the manifest cache where it has them)."""
    return complete(ckpt, Digests(), threads=threads, reporter=reporter, use_cache=use_cache)
