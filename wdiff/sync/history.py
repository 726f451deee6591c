"""log and status: what a remote holds, and where a directory stands against
it: status reports the route a pull would take from there
(:func:`wdiff.ops.pullplan.route`, the pull's own) and what it downloads."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import NotFoundError, UsageError
from ..format import signature as signing
from ..format.chain import Entry
from ..parallel import default_threads
from ..paths import PathLike
from ..progress import SILENT, Reporter
from ..remotes import open_remote
from ..statedir import StateDir
from ..store import version_record
from ..store.hashing import hexd
from . import trust
from .fetch import read_verified
from .places import refuse_checkpoint_as_remote
from .pull.plan import remote_index, route
from .pull.space import to_download
from .tracked import EMPTY_FINGERPRINT, fingerprint_of, local_state


@dataclass(frozen=True)
class LogResult:
    """The versions :func:`wdiff.log` found on a remote, newest first, and its head."""

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


def log(remote: str, *, trusted_keys: list | None = None, require_signature: bool = False,
        max_age: float | None = None, reporter: Reporter = SILENT) -> LogResult:
    """The versions of ``remote``, newest first, with the head. With trusted
    keys (``trusted_keys``, else WDIFF_TRUSTED_KEYS; ``require_signature``,
    ``max_age``) the chain is checked as :func:`wdiff.pull` checks it,
    against this user's records (which log only reads). Returns a
    :class:`LogResult`."""
    refuse_checkpoint_as_remote(remote)
    store = open_remote(remote)
    keys = signing.required_keys(trusted_keys, require_signature)
    chain = read_verified(store, keys, max_age=max_age, records=trust.places(None), reporter=reporter).chain
    return LogResult(store.url, chain.head, tuple(reversed(chain.entries)))


@dataclass(frozen=True)
class StatusResult:
    """Where :func:`wdiff.status` found a directory against a remote's version."""

    remote: str
    directory: str
    current: bytes  # the directory's fingerprint
    known: bool  # the remote has this version
    target: bytes  # the head (or the version asked for)
    behind: int  # bundles a pull to ``target`` would apply; -1 when no path exists
    download: int  # bytes a pull would fetch
    from_anchor: bool = False
    labels: dict = field(default_factory=dict)  # the remote's labels of its versions, for messages
    ahead: int = 0  # versions the directory is past ``target`` along the chain
    exists: bool = True  # False: no such directory yet (a pull creates it)
    recorded: bool = False  # ``current`` is the version DIR's record names (untracked files not counted)
    changed: tuple[str, ...] = ()  # with a record: its files that differ here (or are gone)

    @property
    def up_to_date(self) -> bool:
        return self.current == self.target and not self.changed

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
            "recorded": self.recorded,
            "local_changes": list(self.changed),
            "ahead": self.ahead,
            "behind": self.behind,
            "download_bytes": self.download,
            "from_anchor": self.from_anchor,
        }


def status(directory: PathLike, remote: str, *, to: str | None = None, trusted_keys: list | None = None,
           require_signature: bool = False, max_age: float | None = None, threads: int | None = None,
           reporter: Reporter = SILENT) -> StatusResult:
    """Where ``directory`` stands against ``remote``: its version, whether
    the remote knows it, and how many bundles (and bytes) a pull to ``to``
    (default: the head) would fetch. With trusted keys (``trusted_keys``,
    else WDIFF_TRUSTED_KEYS; ``require_signature``, ``max_age``) the chain
    is checked as :func:`wdiff.pull` checks it, against the records beside
    the directory and this user's (which status only reads): a rolled-back
    chain is refused, not reported. Returns a :class:`StatusResult`."""
    directory = os.fspath(directory)
    threads = threads or default_threads()
    refuse_checkpoint_as_remote(remote)
    store = open_remote(remote)
    keys = signing.required_keys(trusted_keys, require_signature)
    chain = read_verified(store, keys, max_age=max_age, records=trust.places(directory), reporter=reporter).chain
    goal = chain.resolve(to)
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise UsageError(f"{directory}: not a directory (a checkpoint is a directory)")
    recorded = _record_of(directory)
    if recorded is not None:
        # the record says which files are the checkpoint: untracked ones
        # (notes, .git/, caches) do not make DIR an unknown version
        local = local_state(directory, recorded, threads, reporter, guess=False)
        current, changed = recorded.version, local.changed
    else:
        local, current, changed = None, fingerprint_of(directory, threads, reporter), ()
    work = StateDir.open(directory, "pull", create=False) if os.path.isdir(directory) else None
    try:
        # the route the pull (with --force, for local changes) would take,
        # less what an interrupted pull left verified in the work area
        r = route(chain, goal, current=current, local=local, index_of=lambda e: remote_index(store, e, work))
        behind, download, from_anchor = len(r.run), to_download(r.downloads(), work), r.from_anchor
    except NotFoundError:
        behind, download, from_anchor = -1, 0, True
    finally:
        if work is not None:
            work.close()
    # a directory at a later version of the chain is ahead of the target,
    # not behind it, whatever a pull back there would cost
    back = chain.path(goal, current) if current != goal and current in chain.versions else None
    reporter.done()
    return StatusResult(store.url, directory, current, current in chain.versions or current == EMPTY_FINGERPRINT,
                        goal, behind, download, from_anchor, labels=chain.labels(), ahead=len(back) if back else 0,
                        exists=os.path.isdir(directory), recorded=recorded is not None, changed=changed)


def _record_of(directory: str) -> version_record.Record | None:
    """DIR's record, read strictly (a planted one is refused); None when DIR
    or its record does not exist. Nothing is created."""
    if not os.path.isdir(directory):
        return None
    state = StateDir.open(directory, create=False)
    if state is None:
        return None
    with state:
        return version_record.read(state)

