"""What the two kinds of pull share: their result, the remote's chain read
and verified before anything is written, the downloads of a run of bundles
into the work area (``DIR/.wdiff/pull``, kept for a resume) and the record
of the version a directory now holds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import WdiffIOError
from ..format import signature as signing
from ..progress import Reporter
from ..remotes import open_remote
from ..statedir import StateDir
from ..store import record
from ..store.hashing import hexd
from . import trust
from .fetch import download, read_verified
from .places import refuse_remote_as_checkpoint
from .signatures import verify_bundle_signature


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
    restored: tuple[str, ...] = ()  # files whose local changes --force discarded
    link: str | None = None  # --atomic: the link that now points at ``directory``
    stepped_back: bool = False  # undid ``bundles`` (newest first) through their inverses

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
        }

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
    checking each one's signature when keys are trusted, after saying
    whether the staging space is there: (paths, bytes downloaded)."""
    check_space(work, run)
    paths, downloaded = [], 0
    for e in run:
        path, n = download(store, e, work, reporter)
        if keys:
            verify_bundle_signature(store, e, path, keys)
        paths.append(path)
        downloaded += n
    return paths, downloaded

def pending_downloads(state: StateDir) -> bool:
    """Whether the work area holds downloads a later pull may resume."""
    with state.sub("pull", create=False) as w:
        return w is not None and bool(w.names())


def check_space(work: StateDir, run) -> None:
    """Say before downloading anything how much staging the pull needs."""
    need = sum(e.size for e in run) + max(e.size for e in run)
    try:
        st = os.fstatvfs(work.fd)
    except OSError:
        return
    free = st.f_bavail * st.f_frsize
    if free < need:
        raise WdiffIOError(
            f"{work.path}: the pull needs {need} bytes of staging space and {free} are free (No space left on device)",
            hint="free some space; nothing was changed",
        )

def record_target(state: StateDir, index) -> None:
    """Record in ``state`` that its directory now holds the target of the
    bundle with this ``index`` (when its listing is the whole version)."""
    rec = record.of_rows((f.path, f.kind, f.size, f.digest) for f in index.files)
    if rec.version == index.target_fingerprint:
        record.write(state, rec)
