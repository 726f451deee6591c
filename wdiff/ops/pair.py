"""The skeleton diff and pack share: two checkpoints opened for one data
pass over B's units against A, with digest accumulators for both sides.
Every digest comes from bytes read in this run: the manifest cache is
written for the next run, never read here (its hits are guesses)."""

from __future__ import annotations

from dataclasses import dataclass

from ..progress import Reporter
from ..store import cache, manifest
from ..store.checkpoint import KIND_TENSORS, Checkpoint, FileEntry, scan
from ..store.digests import Digests
from ..store.hashing import Manifest
from ..store.units import Unit, pack_units


@dataclass(frozen=True, slots=True)
class UnitWork:
    """One unit of B's tensor file ``file`` (index in ``B.files``) for a worker."""

    file: int
    entry: FileEntry
    unit: Unit


class Pair:
    """Checkpoint ``a`` (None: no base, an anchor) and ``b``, scanned once
    (B reuses A's parsed headers where they are the same bytes), their
    opaque files reported to ``reporter``."""

    def __init__(self, a, b, *, reporter: Reporter) -> None:
        self.A: Checkpoint | None = scan(a) if a is not None else None
        self.B: Checkpoint = scan(b, reuse=self.A)
        self.warnings = tuple(
            f"{c.root}: {f.path}: handled as an opaque file: {f.note}"
            for c in (self.A, self.B) if c for f in c.files if f.note
        )
        for w in self.warnings:
            reporter.warn(w)
        self.da, self.db = Digests(), Digests()

    @property
    def base_tensors(self) -> dict:
        return self.A.tensors if self.A else {}

    def units(self, chunk: int) -> list[UnitWork]:
        """Every unit of B's tensor data, in file order, each matched with
        the base tensor of the same name where there is one."""
        return [UnitWork(i, f, u) for i, f in enumerate(self.B.files) if f.kind == KIND_TENSORS
                for u in pack_units(f.header, self.base_tensors, chunk)]

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
