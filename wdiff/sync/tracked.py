"""Where a directory stands: its fingerprint, what it holds against its
record (``DIR/.wdiff/state.json``: which files of the recorded version
changed here), and the cheapest run of bundles from there to a version.
pull acts on it; status only reports it."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import NotFoundError
from ..format.chain import Chain, Entry
from ..progress import Reporter
from ..store import manifest, version_record
from ..store.checkpoint import Checkpoint, scan
from ..store.hashing import fingerprint, short
from ..store.ignore import DEFAULT_RULES

EMPTY_FINGERPRINT = fingerprint([])


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


@dataclass(frozen=True)
class LocalState:
    """DIR against the version its record names."""

    recorded: version_record.Record
    changed: tuple[str, ...]  # files of that version that differ here (or are gone)
    guessed: bool  # "unchanged" rests on the manifest cache; an apply confirms it by reading

    @property
    def version(self) -> bytes:
        return self.recorded.version


def local_state(directory: str, recorded: version_record.Record, threads: int, reporter: Reporter, *,
                guess: bool) -> LocalState:
    """Which files of the recorded version changed in DIR. Only the files
    the record lists are read (untracked ones never are); with ``guess``,
    the manifest cache's digests stand for unchanged files, and every file
    it says changed is read to confirm it."""
    rules = DEFAULT_RULES.tracking(recorded.paths)
    ckpt = scan(directory, rules=rules, keep=recorded.paths)
    reporter.phase("fingerprint", ckpt.total_bytes)
    m = manifest.compute(ckpt, threads=threads, reporter=reporter, use_cache=guess)
    have = {d.path: (d.kind, d.size, d.digest) for d in m.files}
    changed = [r.path for r in recorded.files if have.get(r.path) != (r.kind, r.size, r.digest)]
    if guess and changed:
        sub = Checkpoint(root=ckpt.root, files=tuple(f for f in ckpt.files if f.path in set(changed)))
        have.update({d.path: (d.kind, d.size, d.digest) for d in manifest.compute(sub, threads=threads).files})
        changed = [r.path for r in recorded.files if have.get(r.path) != (r.kind, r.size, r.digest)]
    return LocalState(recorded, tuple(changed), guess)


def plan_recorded(chain, local: LocalState, goal: bytes) -> tuple[list, bool]:
    """The run of bundles for a directory at its recorded version: deltas
    from that version where the chain has them; to restore changed files of
    the goal itself, or from a version the chain cannot leave by deltas, an
    anchor run."""
    if local.version == goal:
        if not local.changed:
            return [], False
        run = chain.path(None, goal)
        if run is None:
            raise NotFoundError(f"no anchor leads to version {short(goal)}; the remote cannot restore it")
        return run, True
    return plan(chain, local.version, goal)
