"""What the two kinds of pull share: their result, the remote's chain read
and verified before anything is written, the disk a pull's plan needs
(checked before anything is written), the downloads of a run of bundles
into the work area (``DIR/.wdiff/pull``) and the record of the version a
directory now holds.

The work area holds one pull's worth at most: a pull first removes from it
whatever its own run cannot reuse (a dead pull's bundles for another
version, squash outputs, temp files), keeps its verified downloads when it
is interrupted (killed, Ctrl-C, a network error, a full disk), so that the
next pull resumes them, and removes the whole area once it succeeds.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from ...errors import WdiffError
from ...format import signature as signing
from ...format.bundle import BundleReader
from ...format.journal import Txn
from ...ops.apply.inplace import apply_in_place
from ...paths import STATE_DIR
from ...progress import Reporter
from ...remotes import open_remote
from ...statedir import StateDir
from ...store import version_record
from ...store.hashing import hexd, short
from .. import trust
from ..fetch import download, read_verified, work_names
from ..places import refuse_remote_as_checkpoint


@dataclass(frozen=True)
class PullResult:
    """Where :func:`wdiff.pull` brought the directory from and to, and with what."""

    remote: str
    directory: str
    before: bytes | None  # None: empty, or a version the remote does not know
    after: bytes
    bundles: tuple[bytes, ...] = ()
    downloaded: int = 0  # bytes fetched from the remote
    up_to_date: bool = False
    from_anchor: bool = False
    restored: tuple[str, ...] = ()  # files whose local changes --force discarded
    link: str | None = None  # --atomic: the link that now points at ``directory``
    stepped_back: bool = False  # undid ``bundles`` (newest first) through their inverses
    removed: tuple[str, ...] = ()  # --atomic: old version directories removed beyond --keep
    finished: str | None = None  # what this pull finished first: an interrupted "apply" or "rollback"
    #: the labels of the remote's versions, for messages (not in the JSON document: see ``wdiff log``)
    labels: dict = field(default_factory=dict, compare=False, repr=False)

    def to_json(self) -> dict:
        return {
            "schema": "wdiff.pull/1",
            "remote": self.remote,
            "directory": self.directory,
            "before": hexd(self.before) if self.before else None,
            "after": hexd(self.after),
            "up_to_date": self.up_to_date,
            "from_anchor": self.from_anchor,
            "stepped_back": self.stepped_back,
            "bundles": [hexd(b) for b in self.bundles],
            "downloaded_bytes": self.downloaded,
            "restored": list(self.restored),
            "link": self.link,
            "finished_interrupted": self.finished is not None,
        } | ({"removed": list(self.removed)} if self.link else {})

def open_verified(remote, directory: str, purpose: str, *, token, trusted_keys, require_signature, max_age,
                   reporter: Reporter):
    """The remote a pull into ``directory`` reads, and its chain, verified
    with the trusted keys and against the records of remotes seen (beside
    ``directory`` and this user's): (store, keys, ReadChain, records)."""
    keys = signing.required_keys(trusted_keys, require_signature)
    refuse_remote_as_checkpoint(directory, purpose)
    store = open_remote(remote, token=token)
    records = trust.places(directory)
    return store, keys, read_verified(store, keys, max_age=max_age, records=records, reporter=reporter), records

def fetch_run(store, keys, run, work: StateDir, reporter: Reporter) -> tuple[list[str], int]:
    """Download (or find, verified, in ``work``) every bundle of ``run``,
    checking each one's signature when keys are trusted: (paths, bytes
    downloaded). The caller has checked the disk the plan needs
    (:func:`check_space`); what the work area holds beyond this run goes
    first."""
    prune_work(work, run)
    paths, downloaded = [], 0
    for e in run:
        path, n = download(store, e, work, reporter, keys=keys)
        paths.append(path)
        downloaded += n
    return paths, downloaded


def prune_work(work: StateDir, run) -> None:
    """Remove from the work area every entry that ``run`` cannot reuse: the
    downloads of a dead pull that went to another version, squash outputs
    and temp files of killed runs. What is left is this run's own bundles
    and parts, each checked again before use (fetch.download)."""
    keep = {n for e in run for n in work_names(e)}
    for n in work.names():
        if n not in keep:
            work.unlink(n)


def work_names_held(state: StateDir) -> list[str] | None:
    """What the work area holds; None when there is none."""
    w = state.sub("pull", create=False)
    if w is None:
        return None
    with w:
        return w.names()


@dataclass(frozen=True)
class Left:
    """What a directory holds of wdiff's after a command on it stopped: for
    saying what comes next (an interrupted command's message)."""

    journal: bool  # an in-place apply that began and did not finish (DIR holds parts of two versions)
    version: bytes | None  # the version its record names (None: no record)
    kept: int  # bytes of downloads in the pull work area, which the next pull verifies and reuses


def left_in(directory: str) -> Left | None:
    """What ``directory/.wdiff`` holds now, read without creating, locking
    or following anything; None when there is no such directory or it
    cannot be read (a message is all this is for: it never steers a write)."""
    try:
        if not os.path.isdir(directory):
            return None
        state = StateDir.open(directory, create=False)
        if state is None:
            return Left(False, None, 0)
        with state:
            journal = state.kind("txn") is not None and Txn(state).read_journal() is not None
            try:
                version = version_record.read(state)
            except WdiffError:
                version = None
            kept = 0
            work = state.sub("pull", create=False)
            if work is not None:
                with work:
                    for n in work.names():
                        st = os.stat(n, dir_fd=work.fd, follow_symlinks=False)
                        kept += st.st_size if stat.S_ISREG(st.st_mode) else 0
            return Left(journal, version.version if version is not None else None, kept)
    except (OSError, WdiffError):
        return None


def clear_work(state: StateDir) -> None:
    """After a pull that succeeded, nothing in its work area is needed again."""
    state.unlink("pull")


def tidy_state(directory: str) -> None:
    """Remove ``directory/.wdiff`` when a pull made it and it holds nothing
    worth keeping: an empty work area and the lock file at most (a record,
    a journal, verified downloads stay). Every step is relative to a
    descriptor, never through a link; errors are ignored, as the caller is
    raising the failure that matters."""
    try:
        state = StateDir.open(directory, create=False)
        if state is None:
            return
        with state:
            if work_names_held(state) == []:
                state.unlink("pull")
            if not set(state.names()) <= {"lock"}:
                return
            state.unlink("lock")
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.rmdir(STATE_DIR, dir_fd=fd)
        finally:
            os.close(fd)
    except (OSError, WdiffError):
        pass


def record_target(state: StateDir, index) -> None:
    """Record in ``state`` that its directory now holds the target of the
    bundle with this ``index`` (when its listing is the whole version)."""
    rec = version_record.of_rows((f.path, f.kind, f.size, f.digest) for f in index.files)
    if rec.version == index.target_fingerprint:
        version_record.write(state, rec)


def finish_squash(chain, bundle_id: str, directory: str, work: StateDir, *, threads: int,
                  reporter: Reporter) -> bool:
    """A pull killed while applying the squash of its run (two versions or
    more behind): finish that apply, when the work area holds that squash
    and it joins two versions of the verified chain (the apply checks the
    result against the target's digests, which its fingerprint commits to,
    so what DIR ends as is a version of the chain, byte for byte). False:
    not one of ours; the caller refuses."""
    for name in work.names():
        if not (name.startswith("squash-") and name.endswith(".wdb")) or work.kind(name) != "file":
            continue
        try:
            with BundleReader(work.where(name)) as r:
                ours = (hexd(r.id) == bundle_id and r.index.target_fingerprint in chain.versions
                        and r.index.base_fingerprint in chain.versions | {None})
        except Exception:  # noqa: BLE001 - a damaged file is not ours to finish
            continue
        if ours:
            reporter.note(f"finishing the interrupted apply (to {short(r.index.target_fingerprint)})")
            apply_in_place(work.where(name), directory, abort=False, threads=threads, reporter=reporter,
                           beside_locked=True)  # under the pull's lock
            work.unlink(name)
            return True
    return False
