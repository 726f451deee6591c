"""What every remote offers: a small object store with one mutable object,
``chain.json``. Stores move bytes and know nothing of bundles or chains.

Capabilities are split the way callers use them: a :class:`Reader` is all a
pull needs; a :class:`Writer` adds publishing (objects first, then the chain,
with a conflict check on the chain).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from ..progress import SILENT, Reporter

CHAIN = "chain.json"
#: stores refuse to read a chain object larger than this (chain.py's limit),
#: so that a hostile remote cannot make a reader hold gigabytes
MAX_CHAIN_OBJECT = 32 * 1024 * 1024


def read_chain_file(path: str, url: str) -> bytes:
    """Read a downloaded chain index, refusing one over MAX_CHAIN_OBJECT."""
    from ..errors import FormatError

    with open(path, "rb") as f:
        raw = f.read(MAX_CHAIN_OBJECT + 1)
    if len(raw) > MAX_CHAIN_OBJECT:
        raise FormatError(f"{url}: chain index is larger than this wdiff accepts",
                          hint="start a new remote from a fresh anchor")
    return raw


@dataclass(frozen=True)
class Upload:
    """An object to store: ``length`` bytes of ``source`` from ``offset``."""

    path: str  # relative to the remote root
    source: str  # local file
    offset: int
    length: int


class Reader(ABC):
    url: str

    @abstractmethod
    def read_chain(self) -> tuple[bytes | None, object]:
        """The chain index (None when the remote has none yet) and a token
        that :meth:`Writer.publish` uses to detect a concurrent change. The
        token is None exactly when the remote itself does not exist."""

    @abstractmethod
    def fetch(self, path: str, dest: str, *, size: int, reporter: Reporter = SILENT) -> None:
        """Download object ``path`` (``size`` bytes; -1 for a small object of
        unknown size, such as a signature) into the local file ``dest``; a
        partial ``dest`` from an interrupted fetch may be resumed. The caller
        verifies the content; stores check at most the size."""


class Writer(Reader):
    @abstractmethod
    def publish(self, uploads: list[Upload], chain: bytes, token: object, *, message: str,
                reporter: Reporter = SILENT) -> None:
        """Store ``uploads``, then replace the chain index with ``chain`` if it
        is still what ``token`` saw; otherwise raise ConflictError. Readers
        never see a chain that lists objects not yet stored."""
