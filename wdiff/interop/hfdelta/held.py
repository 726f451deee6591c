"""``DIR/.wdiff/hfdelta.json``: which version of which source of the layout
a directory holds, for ``pull --layout hf-delta``. Input like everything in
``DIR/.wdiff`` (reached through wdiff.statedir, parsed strictly); it only
says where the next pull starts, and that start is checked against DIR's
own record (state.json: the fingerprint of what is there) before anything
rests on it.

``pending`` names the version an in-place apply is bringing DIR to, written
before that apply starts: after a crash, DIR's record says whether the
apply finished (DIR holds the pending version) or not (the one before).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ...errors import IntegrityError
from ...statedir import StateDir
from ...store.hashing import hexd, unhex
from .layout import MAX_VERSION_TEXT

NAME = "hfdelta.json"
SCHEMA = "wdiff-hfdelta/1"
LIMIT = 64 * 1024


@dataclass(frozen=True)
class Held:
    source: str  # the source's URL (a directory: its absolute path)
    version: str  # the layout's name of the version DIR holds
    fingerprint: bytes  # DIR's fingerprint at that version
    pending: tuple[str, bytes] | None = None  # (version, fingerprint) an apply is bringing DIR to

    def encode(self) -> bytes:
        doc = {"schema": SCHEMA, "source": self.source, "version": self.version, "fingerprint": hexd(self.fingerprint),
               "pending": None if self.pending is None else
               {"version": self.pending[0], "fingerprint": hexd(self.pending[1])}}
        return json.dumps(doc, indent=1).encode("utf-8") + b"\n"


def _text(v: object, where: str, what: str) -> str:
    if not isinstance(v, str) or not v or len(v) > (4096 if what == "source" else MAX_VERSION_TEXT):
        raise IntegrityError(f"{where}: {what} is malformed; it is not a record wdiff wrote",
                             hint="remove it if you trust the directory (the next pull then needs --force)")
    return v


def read(state: StateDir) -> Held | None:
    raw = state.read(NAME, limit=LIMIT)
    if raw is None:
        return None
    where = state.where(NAME)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or set(doc) != {"schema", "source", "version",
                                                                               "fingerprint", "pending"}:
        raise IntegrityError(f"{where}: not a {SCHEMA} record", hint="remove it if you trust the directory")
    pending = doc["pending"]
    if pending is not None:
        if not isinstance(pending, dict) or set(pending) != {"version", "fingerprint"}:
            raise IntegrityError(f"{where}: pending is malformed")
        pending = (_text(pending["version"], where, "pending version"), unhex(pending["fingerprint"], where=where))
    return Held(_text(doc["source"], where, "source"), _text(doc["version"], where, "version"),
                unhex(doc["fingerprint"], where=where), pending)


def write(state: StateDir, held: Held) -> None:
    state.atomic_write(NAME, held.encode())


def forget(state: StateDir) -> None:
    state.unlink(NAME)
