"""The skeleton diff and pack share: two checkpoints opened for one data
pass over B's units against A, with digest accumulators for both sides.
Every digest comes from bytes read in this run: the manifest cache is
written for the next run, never read here (its hits are guesses)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..format.versions import SCOPED_NAMES, VERSION
from ..progress import Reporter
from ..store import cache, manifest
from ..store.checkpoint import KIND_TENSORS, Checkpoint, FileEntry, is_file_arg, scan
from ..store.digests import Digests
from ..store.hashing import Manifest
from ..store.ignore import DEFAULT_RULES, Rules
from ..store.units import Unit, base_source, pack_units


@dataclass(frozen=True, slots=True)
class UnitWork:
    """One unit of B's tensor file ``file`` (index in ``B.files``) for a worker."""

    file: int
    entry: FileEntry
    unit: Unit


class Pair:
    """Checkpoint ``a`` (None: no base, an anchor) and ``b``, scanned once
    (B reuses A's parsed headers where they are the same bytes), their
    opaque files reported to ``reporter``. Either side may be given as a
    :class:`Checkpoint` already scanned (a staged part's base: the files of
    the base its target needs, see sync/stage.py)."""

    def __init__(self, a, b, *, reporter: Reporter, rules: Rules = DEFAULT_RULES) -> None:
        # two single files are two versions of one file, named as B is, so
        # that a bundle between them applies to the file whatever its name
        paths = not isinstance(a, Checkpoint) and not isinstance(b, Checkpoint)
        name = os.path.basename(os.fspath(b)) if paths and is_file_arg(a) and is_file_arg(b) else None
        self.A: Checkpoint | None = _scanned(a, rules=rules, name=name) if a is not None else None
        self.B: Checkpoint = _scanned(b, reuse=self.A, rules=rules)
        self.version = format_version(self.A, self.B)
        self.excluded = tuple(sorted({p for c in (self.A, self.B) if c for p in c.excluded}))
        if self.excluded:
            reporter.warn(excluded_message(self.excluded))
        self.warnings = tuple(
            f"{c.root}: {f.path}: handled as an opaque file: {f.note}"
            for c in (self.A, self.B) if c for f in c.files if f.note
        )
        for w in self.warnings:
            reporter.warn(w)
        self.da, self.db = Digests(), Digests()

    def base_tensors(self, path: str) -> dict:
        """What a tensor of B's file ``path`` may be patched from (its scope in A)."""
        return self.A.base_tensors_for(path) if self.A else {}

    def units(self, chunk: int) -> list[UnitWork]:
        """Every unit of B's tensor data, in file order, each matched with
        the base tensor of the same qualified name where there is one."""
        return [UnitWork(i, f, u) for i, f in enumerate(self.B.files) if f.kind == KIND_TENSORS
                for u in pack_units(f.header, self.base_tensors(f.path), chunk)]

    def record(self, unit: Unit, a_dig: list[bytes] | None, b_dig: list[bytes]) -> None:
        """Keep the block digests a worker computed."""
        self.db.put_unit(unit, b_dig)
        if a_dig is not None:
            self.da.put_unit(unit, a_dig, base=True)

    def complete_base(self, *, threads: int, reporter: Reporter) -> Manifest | None:
        """A's manifest: what the pass did not hash is hashed now."""
        if self.A is None:
            return None
        return manifest.complete(self.A, self.da, threads=threads, reporter=reporter)

    def complete_target(self, *, threads: int, reporter: Reporter) -> Manifest:
        return manifest.complete(self.B, self.db, threads=threads, reporter=reporter)

    def remember_target(self) -> None:
        """B is the next step's base: store its digests, known now, in the cache."""
        cache.remember(self.B, self.db)


def _scanned(c, **kw) -> Checkpoint:
    return c if isinstance(c, Checkpoint) else scan(c, **kw)


def format_version(A: Checkpoint | None, B: Checkpoint) -> int:
    """The lowest bundle format version whose rules give the bundle from A to
    B: version 1 unless tensor names repeat across directories, or some
    target tensor would find another base source by bare name across the
    whole checkpoint (version 1) than within its own directory (version 2).
    So the bundle of an ordinary checkpoint is what it always was."""
    if not B.unique_bare_names() or (A is not None and not A.unique_bare_names()):
        return SCOPED_NAMES
    if A is None:
        return VERSION
    for f in B.files:
        if f.kind != KIND_TENSORS:
            continue
        scoped, bare = A.base_tensors_for(f.path, True), A.base_tensors_for(f.path, False)
        for t in f.header.tensors:
            s2, s1 = base_source(t, scoped), base_source(t, bare)
            if (s1 is None) != (s2 is None) or (s1 is not None and (s1.file.path, s1.tensor.name) != (s2.file.path, s2.tensor.name)):
                return SCOPED_NAMES
    return VERSION


def excluded_message(paths) -> str:
    """One line naming what the ignore rules left out."""
    shown = ", ".join(paths[:6]) + (f" and {len(paths) - 6} more" if len(paths) > 6 else "")
    return f"left out (trainer state or ignore patterns): {shown}; --include PATTERN ships a file"
