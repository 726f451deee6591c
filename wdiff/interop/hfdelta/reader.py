"""Reading a source of the layout: a directory or an object store (any
store wdiff's remotes reach: ``s3://``, ``gs://``, ...) holding one
directory per version. Everything is read through wdiff.remotes, which
never follows a link inside a directory source and checks every size.

:meth:`Source.plan` finds the run a receiver replays from the version it
holds (or from nothing) to the one wanted, as SGLang's receiver does: seed
from the newest full version above what it holds (at or below the goal),
then the deltas after it, each against the version before it. Every index
on the way is read and checked before anything is downloaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ...errors import BaseMismatchError, FormatError, IntegrityError, NotFoundError, UsageError
from ...fsutil import scratch_dir
from ...paths import printable, validate_relpath
from ...remotes import open_remote, parse_remote
from ...store.checkpoint import MAX_FILES, read_header
from .layout import (INDEX, MAX_INDEX_BYTES, DeltaIndex, Frame, check_shard, dir_name, number_of, opaque_ok,
                     parse_index, parse_number)


@dataclass(frozen=True)
class SourceVersion:
    dirname: str  # the version's directory under the source
    number: int | None  # weight_vN: N; None for an opaque name
    files: dict[str, int] = field(compare=False)  # path in the directory -> size

    @property
    def key(self) -> str:
        """The version as the layout's metadata names it."""
        return f"{self.number:06d}" if self.number is not None else self.dirname


@dataclass(frozen=True)
class Step:
    """One version of a run: a full version to seed from, or a delta."""

    version: SourceVersion
    index: DeltaIndex | None  # None: full


class Source:
    """A source of the layout, listed once."""

    def __init__(self, url, *, token: str | None = None) -> None:
        url = os.fspath(url)
        spec = parse_remote(url)
        if spec["kind"] not in ("local", "objstore"):
            raise UsageError(f"{printable(url)}: --layout hf-delta reads a directory or an object store "
                             "(s3://, gs://, az://, ...)", hint="download the repository first, or use s3://")
        self.url = os.path.abspath(spec["path"]) if spec["kind"] == "local" else url.rstrip("/")
        self.store = open_remote(url, token=token)
        self.versions = self._list()
        self.numbered = any(v.number is not None for v in self.versions.values())
        self._indexes: dict[str, DeltaIndex | None] = {}

    def _list(self) -> dict[str, SourceVersion]:
        listed = self.store.list()
        if not listed and self.store.read_chain() == (None, None):
            raise NotFoundError(f"{printable(self.url)}: no such source")
        groups: dict[str, dict[str, int]] = {}
        for path, size in listed:
            top, sep, rest = path.partition("/")
            if not sep or any(p.startswith(".") for p in path.split("/")):
                continue  # files at the top, and anything hidden (wdiff's ledgers, temporaries)
            groups.setdefault(top, {})[rest] = size
        numbered = {d: number_of(d) for d in groups}
        if any(n is not None for n in numbered.values()):
            return {d: SourceVersion(d, n, groups[d]) for d, n in numbered.items() if n is not None}
        return {d: SourceVersion(d, None, files) for d, files in groups.items() if opaque_ok(d)}

    # -- versions ----------------------------------------------------------------------

    def by_key(self, key: str) -> SourceVersion | None:
        if self.numbered:
            n = parse_number(key)
            return self.versions.get(dir_name(n)) if n is not None else None
        return self.versions.get(key)

    def resolve(self, spec: str | None) -> SourceVersion:
        """The version ``spec`` names (``4``, ``000004``, ``weight_v000004``,
        or an opaque name); by default the newest (the highest number; with
        opaque names, the one version no delta starts from)."""
        if not self.versions:
            raise NotFoundError(f"{printable(self.url)}: holds no version directories (weight_vNNNNNN/)")
        if spec is None:
            if self.numbered:
                return max(self.versions.values(), key=lambda v: v.number)
            bases = {ix.base_version for ix in (self.index(v) for v in self.versions.values()) if ix is not None}
            tips = [v for v in self.versions.values() if v.key not in bases]
            if len(tips) != 1:
                raise UsageError(f"{printable(self.url)}: {len(tips)} versions are not the base of another; "
                                 "say which one with --to")
            return tips[0]
        v = self.versions.get(spec) or self.by_key(spec)
        if v is None:
            raise NotFoundError(f"{printable(self.url)}: no version {printable(spec, 80)}")
        return v

    def index(self, v: SourceVersion) -> DeltaIndex | None:
        """The version's delta index, read and checked once; None: full."""
        if v.dirname in self._indexes:
            return self._indexes[v.dirname]
        ix = None
        if INDEX in v.files:
            raw = self.read_small(f"{v.dirname}/{INDEX}", MAX_INDEX_BYTES)
            where = f"{printable(self.url)}: {v.dirname}/{INDEX}"
            ix = parse_index(raw, where=where)
            if ix is not None and not self._same(ix.version, v.key):
                raise FormatError(f"{where}: metadata.version {printable(ix.version, 40)} is not the version "
                                  f"its directory names ({v.key})")
        elif not any(p.endswith(".safetensors") for p in v.files):
            raise FormatError(f"{printable(self.url)}: {v.dirname} has neither an index nor tensor files")
        self._indexes[v.dirname] = ix
        return ix

    def _same(self, a: str, b: str) -> bool:
        if self.numbered:
            na, nb = parse_number(a), parse_number(b)
            return na is not None and na == nb
        return a == b

    def plan(self, held: str | None, goal: SourceVersion) -> list[Step]:
        """The run from ``held`` (a version key; None: nothing) to ``goal``:
        [] when held is the goal, else an optional full version, then
        deltas, each one's base_version the version before it (checked
        here: a source whose deltas do not chain is refused)."""
        if held is not None and self._same(held, goal.key):
            return []
        run: list[Step] = []
        seen: set[str] = set()
        cur = goal
        while True:
            ix = self.index(cur)
            run.append(Step(cur, ix))
            seen.add(cur.dirname)
            if ix is None:
                break
            self._check_base(cur, ix)
            if held is not None and self._same(ix.base_version, held):
                break
            prev = self._base_of(cur, ix)
            if prev.dirname in seen:
                raise FormatError(f"{printable(self.url)}: the versions' bases form a loop at {prev.dirname}")
            cur = prev
        run.reverse()
        return run

    def _check_base(self, v: SourceVersion, ix: DeltaIndex) -> None:
        """Numbered versions are contiguous: a delta is against the one before it."""
        n = parse_number(ix.base_version)
        if self.numbered and (n is None or n != v.number - 1):
            raise BaseMismatchError(f"{printable(self.url)}: {v.dirname}/{INDEX}: base_version "
                                    f"{printable(ix.base_version, 40)} is not the version before it "
                                    f"({v.number - 1:06d}): the deltas do not chain")

    def _base_of(self, v: SourceVersion, ix: DeltaIndex) -> SourceVersion:
        where = f"{printable(self.url)}: {v.dirname}/{INDEX}"
        if self.numbered:
            n = v.number - 1
            prev = self.versions.get(dir_name(n)) if n >= 0 else None
            if prev is None:
                raise NotFoundError(f"{printable(self.url)}: {dir_name(n)} is missing, and {v.dirname} is a delta "
                                    "against it (no full version below it to start from)")
            return prev
        prev = self.versions.get(ix.base_version)
        if prev is None:
            raise NotFoundError(f"{where}: base_version {printable(ix.base_version, 40)} is not a version of the source")
        return prev

    # -- files -------------------------------------------------------------------------

    def read_small(self, path: str, limit: int) -> bytes:
        with scratch_dir("hfdelta") as t:  # a killed run's is removed by the next
            dest = os.path.join(t, "x")
            self.store.fetch(path, dest, max_size=limit)
            with open(dest, "rb") as f:
                return f.read()

    def fetch(self, v: SourceVersion, rel: str, dest: str) -> int:
        """Download file ``rel`` of version ``v`` to ``dest``; its size."""
        path = f"{v.dirname}/{rel}"
        size = v.files.get(rel)
        if size is None:
            # not listed: a link, or missing; the store says which
            self.store.fetch(path, dest, max_size=0)
            raise NotFoundError(f"{printable(self.url)}: {printable(path)} is missing")
        if os.path.lexists(dest):
            os.unlink(dest)
        self.store.fetch(path, dest, size=size)
        return size

    def full_files(self, v: SourceVersion) -> list[tuple[str, int]]:
        """The files of a full version, each path checked."""
        if len(v.files) > MAX_FILES:
            raise FormatError(f"{printable(self.url)}: {v.dirname} holds more than {MAX_FILES} files")
        out = []
        for rel, size in sorted(v.files.items()):
            validate_relpath(rel, where=f"{printable(self.url)}: {v.dirname}")
            out.append((rel, size))
        return out

    def fetch_delta(self, step: Step, work: str) -> tuple[dict[str, tuple[str, Frame]], int]:
        """Download the shards of a delta into folder ``work`` and check
        each against its index: {tensor: (local shard path, frame)}, and the
        bytes downloaded."""
        v, ix = step.version, step.index
        frames: dict[str, tuple[str, Frame]] = {}
        got = 0
        for k, (shard, names) in enumerate(ix.shards().items()):
            dest = os.path.join(work, f"shard-{k:05d}")
            got += self.fetch(v, shard, dest)
            where = f"{printable(self.url)}: {v.dirname}/{shard}"
            header = read_header(dest, os.path.getsize(dest), where=where)
            for name, fr in check_shard(header, names, ix.checksum, where=where).items():
                frames[name] = (dest, fr)
        if set(frames) != set(ix.weight_map):  # pragma: no cover - check_shard compares each shard's names
            raise IntegrityError(f"{printable(self.url)}: {v.dirname}: shards and weight map disagree")
        return frames, got
