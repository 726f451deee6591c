"""The journal of an in-place apply (``DIR/.wdiff/txn/``): which bundle, which
phase, and the plan (what is patched, staged and removed), read back by the
next run to finish or roll back an interrupted apply.

A journal is input like any other: whoever wrote DIR may have written it.
:meth:`Journal.parse` accepts exactly the members a real apply writes, each
of its type, every path by the rules bundle paths follow; the plan in it is
then only compared with the plan derived from the bundle, never obeyed.
Layout: man/wdiff-format.5, "IN-PLACE APPLY"."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..errors import FormatError, IntegrityError
from ..paths import printable, validate_relpath
from ..statedir import StateDir
from .records import canonical_json

JOURNAL_VERSION = 1
PHASES = ("patch", "commit")
_MEMBERS = frozenset({"version", "bundle_id", "bundle_path", "base_fingerprint", "target_fingerprint", "phase",
                      "patch", "stage", "remove"})
_HEX32 = re.compile(r"[0-9a-f]{32}")
_INDEX = re.compile(r"0|[1-9][0-9]{0,8}")


@dataclass(frozen=True)
class Plan:
    """What an in-place apply does: tensor files patched where they lie (file
    indexes), files staged whole (index -> target path), paths removed."""

    patch: tuple[int, ...]
    stage: tuple[tuple[int, str], ...]
    remove: tuple[str, ...]

    def to_json(self) -> dict:
        return {"patch": list(self.patch), "stage": {str(i): p for i, p in self.stage}, "remove": list(self.remove)}


@dataclass(frozen=True)
class Journal:
    bundle_id: str
    bundle_path: str
    base_fingerprint: str | None
    target_fingerprint: str
    phase: str
    plan: Plan

    def to_json(self) -> dict:
        return {
            "version": JOURNAL_VERSION,
            "bundle_id": self.bundle_id,
            "bundle_path": self.bundle_path,
            "base_fingerprint": self.base_fingerprint,
            "target_fingerprint": self.target_fingerprint,
            "phase": self.phase,
            **self.plan.to_json(),
        }

    def with_phase(self, phase: str) -> Journal:
        return Journal(self.bundle_id, self.bundle_path, self.base_fingerprint, self.target_fingerprint, phase,
                       self.plan)

    @classmethod
    def parse(cls, raw: bytes, *, where: str) -> Journal:
        """A journal exactly as :meth:`to_json` writes it, or IntegrityError."""

        def bad(what: str) -> IntegrityError:
            return IntegrityError(f"{where}: damaged journal of an interrupted apply: {what}",
                                  hint="if you trust the directory, remove its .wdiff/txn and check it with wdiff verify")

        try:
            data = json.loads(raw)
        except (ValueError, RecursionError, UnicodeDecodeError):
            raise bad("not JSON") from None
        if not isinstance(data, dict):
            raise bad("not a JSON object")
        if data.get("version") != JOURNAL_VERSION or isinstance(data.get("version"), bool):
            raise IntegrityError(f"{where}: journal of an unknown version")
        if set(data) != _MEMBERS:
            missing, extra = sorted(_MEMBERS - set(data)), sorted(set(data) - _MEMBERS)
            raise bad(f"missing {missing}" if missing else f"unknown members {[printable(k) for k in extra]}")

        def hex32(name: str, *, nullable: bool = False) -> str | None:
            v = data[name]
            if v is None and nullable:
                return None
            if not isinstance(v, str) or not _HEX32.fullmatch(v):
                raise bad(f"{name} is not 32 hex digits")
            return v

        def path(v, name: str) -> str:
            try:
                return validate_relpath(v, where=where)
            except FormatError as e:
                raise bad(f"{name}: {e.message}") from None

        phase = data["phase"]
        if not isinstance(phase, str) or phase not in PHASES:
            raise bad("phase is not one of " + ", ".join(PHASES))
        if not isinstance(data["bundle_path"], str):
            raise bad("bundle_path is not a string")
        patch = data["patch"]
        if not isinstance(patch, list) or not all(type(i) is int and 0 <= i < 1 << 30 for i in patch):
            raise bad("patch is not a list of file indexes")
        stage = data["stage"]
        if not isinstance(stage, dict) or not all(isinstance(k, str) and _INDEX.fullmatch(k) for k in stage):
            raise bad("stage is not an object from file indexes to paths")
        remove = data["remove"]
        if not isinstance(remove, list):
            raise bad("remove is not a list of paths")
        plan = Plan(
            tuple(patch),
            tuple(sorted((int(k), path(v, "stage")) for k, v in stage.items())),
            tuple(path(p, "remove") for p in remove),
        )
        if len(set(plan.patch)) != len(plan.patch) or len(set(plan.remove)) != len(plan.remove):
            raise bad("an entry is listed twice")
        return cls(hex32("bundle_id"), data["bundle_path"], hex32("base_fingerprint", nullable=True),
                   hex32("target_fingerprint"), phase, plan)


class Txn:
    """The transaction directory ``DIR/.wdiff/txn``, reached only through
    :class:`StateDir` (no links, no other user's directories)."""

    NAME = "txn"
    JOURNAL = "journal.json"
    STAGE = "stage"
    UNDO = "undo.log"

    def __init__(self, state: StateDir) -> None:
        self.state = state  # DIR/.wdiff
        self.path = state.where(self.NAME)
        self.journal = state.where(f"{self.NAME}/{self.JOURNAL}")
        self.stage = state.where(f"{self.NAME}/{self.STAGE}")
        self.undo = state.where(f"{self.NAME}/{self.UNDO}")

    def exists(self) -> bool:
        return self.state.kind(self.NAME) is not None

    def dir(self, *, create: bool = False) -> StateDir | None:
        return self.state.sub(self.NAME, create=create)

    def stage_dir(self, *, create: bool = False) -> StateDir | None:
        with self.dir(create=create) as d:
            return d.sub(self.STAGE, create=create) if d is not None else None

    def read_journal(self) -> Journal | None:
        if not self.exists():
            return None
        d = self.dir()
        if d is None:
            return None
        with d:
            raw = d.read(self.JOURNAL, limit=64 * 1024 * 1024)
            if raw is None:
                return None
            return Journal.parse(raw, where=self.journal)

    def write_journal(self, journal: Journal) -> None:
        with self.dir(create=True) as d:
            d.atomic_write(self.JOURNAL, canonical_json(journal.to_json()))

    def clear(self) -> None:
        """Empty the transaction directory: debris of a run killed before its journal existed."""
        with self.dir(create=True) as d:
            d.clear()

    def remove(self) -> None:
        """Delete the transaction; the journal goes last, so a crash midway
        leaves a transaction that is finished again. Whatever else is in it
        (a killed atomic write's temp file) goes too."""
        d = self.dir()
        if d is None:
            return
        with d:
            for n in d.names():
                if n != self.JOURNAL:
                    d.unlink(n)
            d.sync()
            d.unlink(self.JOURNAL)
            d.sync()
        self.state.unlink(self.NAME)
        self.state.sync()
