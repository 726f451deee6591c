"""pull: bring a directory to a version of a remote. It fingerprints the
directory, follows the cheapest run of bundles from there (or from an
anchor), downloads and verifies every part, squashes a run of several into
one bundle, and applies it in place: no intermediate checkpoint is written.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..errors import BusyError
from ..format import signature as signing
from ..fsutil import fsync_dir, locked, remove_tree
from ..parallel import default_threads
from ..paths import STATE_DIR
from ..progress import SILENT, Reporter
from ..remotes import open_remote
from ..store.checkpoint import TXN_JOURNAL
from ..store.hashing import hexd, short
from .apply import apply
from .apply.inplace import apply_in_place
from . import trust
from .fetch import accept, download, read_verified
from .history import EMPTY_FINGERPRINT, fingerprint_of, plan
from .places import refuse_remote_as_checkpoint
from .signatures import verify_bundle_signature
from .squash import squash


@dataclass(frozen=True)
class PullResult:
    remote: str
    directory: str
    before: bytes | None  # None: empty, or a version the remote does not know
    after: bytes
    bundles: tuple[bytes, ...] = ()
    downloaded: int = 0  # bytes fetched from the remote
    up_to_date: bool = False
    from_anchor: bool = False

    def to_json(self) -> dict:
        return {
            "schema": "wdiff.pull/1",
            "remote": self.remote,
            "directory": self.directory,
            "before": hexd(self.before) if self.before else None,
            "after": hexd(self.after),
            "up_to_date": self.up_to_date,
            "from_anchor": self.from_anchor,
            "bundles": [hexd(b) for b in self.bundles],
            "downloaded_bytes": self.downloaded,
        }


def pull(
    remote,
    directory,
    *,
    to: str | None = None,
    trusted_keys: list | None = None,
    require_signature: bool = False,
    threads: int | None = None,
    max_age: float | None = None,
    reporter: Reporter = SILENT,
) -> PullResult:
    """Bring ``directory`` to version ``to`` (default: the head) of ``remote``.
    With trusted keys (given, or in WDIFF_TRUSTED_KEYS), the chain index and
    every bundle must carry a valid signature by one of them, and the chain
    must not be older than one this directory or this user accepted before
    (nor, with ``max_age`` in seconds, published longer ago than that)."""
    directory = os.path.abspath(os.fspath(directory))
    threads = threads or default_threads()
    keys = signing.required_keys(trusted_keys, require_signature)
    refuse_remote_as_checkpoint(directory, "a pull would write a checkpoint over it")
    store = open_remote(remote)
    # read (and check) the chain before creating DIR: a missing or untrusted
    # remote must not leave an empty directory behind
    records = trust.places(directory)
    read = read_verified(store, keys, max_age=max_age, records=records, reporter=reporter)
    chain = read.chain
    os.makedirs(directory, exist_ok=True)
    # the lock sits beside the directory: a pull may swap the directory itself
    parent, name = os.path.split(directory)
    with locked(os.path.join(parent, f".{name}.wdiff-lock"), what=directory):
        work = os.path.join(directory, STATE_DIR, "pull")
        _finish_interrupted(directory, work, threads, reporter)
        goal = chain.resolve(to)
        current = fingerprint_of(directory, threads, reporter)
        run, from_anchor = plan(chain, current, goal)
        before = current if current in chain.versions else None
        if not run:
            remove_tree(work)
            accept(store, read, records)
            reporter.done()
            return PullResult(store.url, directory, before, goal, up_to_date=True)
        downloaded = 0
        bundles = []
        for e in run:
            path, n = download(store, e, work, reporter)
            if keys:
                verify_bundle_signature(store, e, path, keys)
            bundles.append(path)
            downloaded += n
        empty = current == EMPTY_FINGERPRINT
        if from_anchor and not empty:
            _rebuild_beside(directory, bundles, work, threads, reporter)
        else:
            if len(bundles) == 1:
                bundle = bundles[0]
            else:
                bundle = os.path.join(work, f"squash-{short(current)}-{short(goal)}.wdb")
                squash(bundles, None if from_anchor else directory, bundle, threads=threads, reporter=reporter,
                       base_fingerprint=None if from_anchor else current)
            apply_in_place(bundle, directory, abort=False, threads=threads, reporter=reporter)
        remove_tree(work)
        accept(store, read, records)  # after the swap: DIR/.wdiff is the new directory's
    reporter.done()
    return PullResult(store.url, directory, before, goal, tuple(e.bundle for e in run), downloaded,
                      from_anchor=from_anchor)


def _finish_interrupted(directory: str, work: str, threads: int, reporter: Reporter) -> None:
    """A pull killed while applying left a journal; finish that apply first
    with the bundle it names, which our work area still holds."""
    journal = os.path.join(directory, TXN_JOURNAL)
    if not os.path.exists(journal):
        return
    try:
        with open(journal, "rb") as f:
            bundle = json.loads(f.read()).get("bundle_path", "")
    except (OSError, ValueError):
        bundle = ""
    if not (isinstance(bundle, str) and bundle.startswith(work + os.sep) and os.path.exists(bundle)):
        raise BusyError(
            f"{directory}: an in-place apply that this pull did not start was interrupted here",
            hint="finish it (or --abort it) with wdiff apply BUNDLE DIR --in-place",
        )
    apply_in_place(bundle, directory, abort=False, threads=threads, reporter=reporter)


def _rebuild_beside(directory: str, bundles: list[str], work: str, threads: int, reporter: Reporter) -> None:
    """The directory holds a version the remote does not know: build the
    wanted version beside it from an anchor, then swap the two directories
    by rename. The old content is kept until the new one is complete and
    verified; a crash between the two renames leaves both as hidden siblings
    and no directory, which the next pull treats as empty."""
    parent, name = os.path.split(directory)
    fresh = os.path.join(parent, f".{name}.wdiff-new-{os.getpid()}")
    old = os.path.join(parent, f".{name}.wdiff-old-{os.getpid()}")
    remove_tree(fresh)
    bundle = bundles[0]
    if len(bundles) > 1:
        bundle = os.path.join(work, "squash-anchor.wdb")
        squash(bundles, None, bundle, threads=threads, reporter=reporter)
    apply(bundle, None, fresh, threads=threads, reporter=reporter)
    os.rename(directory, old)
    os.rename(fresh, directory)
    fsync_dir(parent)
    remove_tree(old)
