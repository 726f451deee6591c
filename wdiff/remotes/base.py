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
    """Read a chain index (a downloaded copy, or a directory remote's own),
    refusing anything but a regular file of at most MAX_CHAIN_OBJECT bytes."""
    from ..errors import FormatError
    from ..fsutil import open_regular

    with open_regular(path, what=f"{url}: chain index") as f:
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
    def fetch(self, path: str, dest: str, *, size: int | None = None, max_size: int | None = None,
              reporter: Reporter = SILENT, at: str | None = None) -> None:
        """Download object ``path`` into the local file ``dest``. ``at``: the
        revision a store with revisions recorded the object at (see
        :meth:`Writer.publish_placed`), read there rather than at the
        chain's; other stores ignore it. Give exactly
        one of ``size`` (the object is exactly that long; a partial ``dest``
        from an interrupted fetch may be resumed) and ``max_size`` (a small
        object of unknown size, such as a signature: refused, with
        IntegrityError and nothing left at ``dest``, when it is longer, before
        more than that is transferred where the store allows). Stores check
        the size and that the object is a plain file; the caller verifies the
        content."""

    def fetch_range(self, path: str, offset: int, length: int, *, size: int, at: str | None = None) -> bytes:
        """Bytes [offset, offset + length) of object ``path``, which is exactly
        ``size`` bytes long (checked, as :meth:`fetch` checks it); the caller
        verifies the content. A store that cannot read part of an object
        raises NotImplementedError, and the caller fetches whole objects."""
        raise NotImplementedError

    def why_absent(self) -> tuple[str, str | None] | None:
        """When :meth:`read_chain` found no remote at all: what this store
        can say about why, as (message, next step), or None for the plain
        "no such remote". A store that cannot tell a missing remote from
        one it may not read without credentials says so."""
        return None

    @abstractmethod
    def list(self, prefix: str = "") -> list[tuple[str, int]]:
        """(path relative to the remote root, size) of every object under
        ``prefix`` (a folder, "" for the whole remote), sorted by path; []
        when there is none. Never follows links out of the remote. A
        repository lists the commit the chain was last read at (its head
        when none was read)."""


def check_prefix(prefix: str) -> str:
    """A listing prefix: "" or a relative folder without "." or ".." parts."""
    prefix = prefix.strip("/")
    if prefix and any(p in ("", ".", "..") for p in prefix.split("/")):
        raise ValueError(f"bad listing prefix {prefix!r}")
    return prefix


def check_deletable(paths: list[str]) -> None:
    """Refuse what a delete must never remove: the chain index, and any
    path that is not a plain relative path inside the remote."""
    for p in paths:
        parts = p.split("/")
        if p == CHAIN or not p or p.startswith("/") or any(x in ("", ".", "..") for x in parts):
            raise ValueError(f"refusing to delete {p!r}")


def check_fetch_args(size: int | None, max_size: int | None) -> None:
    if (size is None) == (max_size is None) or (size is not None and size < 0) or (max_size is not None and max_size < 0):
        raise ValueError("fetch takes exactly one of size and max_size, not negative")


class Writer(Reader):
    @abstractmethod
    def publish(self, uploads: list[Upload], chain: bytes, token: object, *, message: str,
                reporter: Reporter = SILENT) -> None:
        """Store ``uploads``, then replace the chain index with ``chain`` if it
        is still what ``token`` saw; otherwise raise ConflictError. Readers
        never see a chain that lists objects not yet stored."""

    def publish_placed(self, uploads: list[Upload], make_chain, token: object, *, message: str,
                       reporter: Reporter = SILENT) -> bytes:
        """:meth:`publish`, for a chain index that records where the store
        placed ``uploads``: ``make_chain(placed)`` returns the index's bytes
        and the uploads that go with it (its signature), from ``placed``,
        {path: revision} of the uploads a store with revisions (a Hub
        repository: the commit that added each) committed first. Stores
        without revisions place nothing: the chain is made up front, from
        {}. Returns the index's bytes as published."""
        chain, more = make_chain({})
        self.publish(list(uploads) + list(more), chain, token, message=message, reporter=reporter)
        return chain

    @abstractmethod
    def store(self, uploads: list[Upload], *, reporter: Reporter = SILENT) -> None:
        """Store objects only; the chain index is untouched (staged parts, gc
        rewrites). An object already stored with the same size is kept (the
        caller names objects by content)."""

    @abstractmethod
    def delete(self, paths: list[str]) -> None:
        """Remove objects; a missing path is not an error; refuses
        ``chain.json`` (ValueError)."""
