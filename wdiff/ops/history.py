"""log and status: what a remote holds, and where a directory stands against
it. ``plan`` finds the cheapest run of bundles from a directory's version
(or from an anchor) to the one wanted; pull follows it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import NotFoundError, UsageError
from ..format import signature as signing
from ..format.chain import Chain, Entry
from ..parallel import default_threads
from ..progress import SILENT, Reporter
from ..remotes import open_remote
from ..store import manifest
from ..store.checkpoint import scan
from ..store.hashing import fingerprint, hexd, short
from . import trust
from .fetch import read_verified
from .places import refuse_checkpoint_as_remote

EMPTY_FINGERPRINT = fingerprint([])


@dataclass(frozen=True)
class LogResult:
    remote: str
    head: bytes | None
    entries: tuple[Entry, ...]  # newest first

    def to_json(self) -> dict:
        return {
            "schema": "wdiff.log/1",
            "remote": self.remote,
            "head": hexd(self.head) if self.head else None,
            "entries": [dict(e.to_json(), anchor=e.anchor) for e in self.entries],
        }


def log(remote, *, trusted_keys: list | None = None, require_signature: bool = False,
        max_age: float | None = None, reporter: Reporter = SILENT) -> LogResult:
    """The versions of ``remote``, newest first. With trusted keys (given, or
    in WDIFF_TRUSTED_KEYS) the chain is checked as pull checks it, against
    this user's records (which log only reads)."""
    refuse_checkpoint_as_remote(remote)
    store = open_remote(remote)
    keys = signing.required_keys(trusted_keys, require_signature)
    chain = read_verified(store, keys, max_age=max_age, records=trust.places(None), reporter=reporter).chain
    return LogResult(store.url, chain.head, tuple(reversed(chain.entries)))


@dataclass(frozen=True)
class StatusResult:
    remote: str
    directory: str
    current: bytes  # the directory's fingerprint
    known: bool  # the remote has this version
    target: bytes  # the head (or the version asked for)
    behind: int  # bundles a pull to ``target`` would apply; -1 when no path exists
    download: int  # bytes a pull would fetch
    from_anchor: bool = False
    labels: dict = field(default_factory=dict)
    ahead: int = 0  # versions the directory is past ``target`` along the chain
    exists: bool = True  # False: no such directory yet (a pull creates it)

    @property
    def up_to_date(self) -> bool:
        return self.current == self.target

    def to_json(self) -> dict:
        return {
            "schema": "wdiff.status/1",
            "remote": self.remote,
            "directory": self.directory,
            "current": hexd(self.current),
            "known": self.known,
            "target": hexd(self.target),
            "up_to_date": self.up_to_date,
            "exists": self.exists,
            "ahead": self.ahead,
            "behind": self.behind,
            "download_bytes": self.download,
            "from_anchor": self.from_anchor,
        }


def fingerprint_of(directory: str, threads: int, reporter: Reporter, *, guess: bool = False) -> bytes:
    """The fingerprint of ``directory``, read and hashed; with ``guess``,
    taken from the manifest cache where it holds the files' digests: a
    guess, to be confirmed by reading before anything rests on it."""
    if not os.path.isdir(directory):
        return EMPTY_FINGERPRINT
    ckpt = scan(directory)
    if not ckpt.files:
        return EMPTY_FINGERPRINT
    reporter.phase("fingerprint", ckpt.total_bytes)
    return manifest.compute(ckpt, threads=threads, reporter=reporter, use_cache=guess).fingerprint


def plan(chain: Chain, current: bytes, goal: bytes) -> tuple[list[Entry], bool]:
    if current == goal:
        return [], False
    run = chain.path(current, goal) if current in chain.versions else None
    if run is not None:
        return run, False
    run = chain.path(None, goal)
    if run is None:
        raise NotFoundError(f"no anchor leads to version {short(goal)}; the remote cannot rebuild it")
    return run, True


def status(directory, remote, *, to: str | None = None, trusted_keys: list | None = None,
           require_signature: bool = False, max_age: float | None = None, threads: int | None = None,
           reporter: Reporter = SILENT) -> StatusResult:
    """Where ``directory`` stands against ``remote``. With trusted keys
    (given, or in WDIFF_TRUSTED_KEYS) the chain is checked as pull checks
    it, against the records beside the directory and this user's (which
    status only reads): a rolled-back chain is refused, not reported."""
    directory = os.fspath(directory)
    threads = threads or default_threads()
    refuse_checkpoint_as_remote(remote)
    store = open_remote(remote)
    keys = signing.required_keys(trusted_keys, require_signature)
    chain = read_verified(store, keys, max_age=max_age, records=trust.places(directory), reporter=reporter).chain
    goal = chain.resolve(to)
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise UsageError(f"{directory}: not a directory (a checkpoint is a directory)")
    current = fingerprint_of(directory, threads, reporter)
    try:
        run, from_anchor = plan(chain, current, goal)
        behind, download = len(run), sum(e.size for e in run)
    except NotFoundError:
        behind, download, from_anchor = -1, 0, True
    # a directory at a later version of the chain is ahead of the target,
    # not behind it, whatever a pull back there would cost
    back = chain.path(goal, current) if current != goal and current in chain.versions else None
    reporter.done()
    return StatusResult(store.url, directory, current, current in chain.versions or current == EMPTY_FINGERPRINT,
                        goal, behind, download, from_anchor, ahead=len(back) if back else 0,
                        exists=os.path.isdir(directory))

