"""The journal of an in-place apply (``DIR/.wdiff/txn/``): which bundle, which
phase, and the staged files, read back by the next run to finish or roll
back an interrupted apply."""

from __future__ import annotations

import json
import os

from ..errors import IntegrityError
from ..fsutil import atomic_write_bytes, fsync_dir, remove_tree
from .records import canonical_json

JOURNAL_VERSION = 1


class Txn:
    def __init__(self, path: str) -> None:
        self.path = path
        self.journal = os.path.join(path, "journal.json")
        self.stage = os.path.join(path, "stage")
        self.undo = os.path.join(path, "undo.log")

    def read_journal(self) -> dict | None:
        try:
            with open(self.journal, "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError):
            raise IntegrityError(f"{self.journal}: unreadable journal of an interrupted apply") from None
        if not isinstance(data, dict) or data.get("version") != JOURNAL_VERSION:
            raise IntegrityError(f"{self.journal}: journal of an unknown version")
        return data

    def write_journal(self, journal: dict) -> None:
        atomic_write_bytes(self.journal, canonical_json(journal))

    def remove(self) -> None:
        """Delete the transaction; the journal goes last, so a crash midway
        leaves a transaction that is finished again."""
        remove_tree(self.stage)
        for p in (self.undo,):
            if os.path.exists(p):
                os.unlink(p)
        if os.path.exists(self.journal):
            os.unlink(self.journal)
        fsync_dir(self.path)
        os.rmdir(self.path)
        fsync_dir(os.path.dirname(self.path))
