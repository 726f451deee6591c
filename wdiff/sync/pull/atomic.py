"""pull --atomic: DIR is a symbolic link to a versioned directory. The new
version is built from the old one (never changed) into a new directory
beside it, named by the version's label or fingerprint; the link is then
switched in one rename of a fresh link over it, so a reader of the link sees
the old checkpoint or the new one, whole. Both the link's lock and the old
directory's (whose ``.wdiff`` holds the downloads) are held throughout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

from ...errors import BusyError, UsageError
from ...format.bundle import reading
from ...format.journal import Txn
from ...fsutil import beside_lock_path, fsync_dir, io_error, locked_beside, owner_tag
from ...ops.apply.copy import apply_copy
from ...ops.squash import squash_from
from ...parallel import default_threads
from ...paths import STATE_DIR
from ...progress import Reporter
from ...statedir import StateDir
from ...store import version_record
from ...store.hashing import hexd, short
from ...store.ignore import DEFAULT_RULES
from .. import trust
from ..fetch import accept
from ..tracked import EMPTY_FINGERPRINT, fingerprint_of, local_state, plan
from .keep import DEFAULT_KEEP, Versions
from .keep import SAFE_NAME as _SAFE_NAME
from .plan import Route, held_bundles, note_route
from .space import check as check_space
from .space import need_of
from .work import PullResult, clear_work, fetch_run, open_verified, record_target, tidy_state


def pull_atomic(remote, link: str, *, to, trusted_keys, require_signature, token, threads, max_age,
                reporter: Reporter, keep: int = DEFAULT_KEEP) -> PullResult:
    """pull --atomic: ``link`` is a symbolic link to a directory; the version
    ``to`` is built in a new directory beside that one (the old one is its
    base and is left as it was), then the link is switched to it in one
    rename. Then the oldest version directories that pull --atomic made
    for this link are removed, beyond ``keep`` (0: keep all; see pull_keep)."""
    if keep < 0:
        raise UsageError(f"--keep {keep}: a number of versions to keep, 0 for all")
    if not os.path.islink(link):
        raise UsageError(f"{link}: --atomic switches a symbolic link, and this is not one",
                         hint="make DIR a symbolic link to a versioned directory (current -> v17), or drop --atomic")
    old = os.path.realpath(link)
    if not os.path.isdir(old):
        raise UsageError(f"{link}: points at {old}, which is not a directory",
                         hint="point the link at a directory (it may be empty), or pull without --atomic")
    threads = threads or default_threads()
    store, keys, read, _ = open_verified(remote, old, "a pull would build a checkpoint from it",
                                          token=token, trusted_keys=trusted_keys,
                                          require_signature=require_signature, max_age=max_age,
                                          reporter=reporter)
    chain = read.chain
    goal = chain.resolve(to)
    # the link's own lock (two --atomic pulls), and the one every writer of the
    # old directory holds: this pull writes into its .wdiff (work area, temps)
    res = _pull_locked(store, keys, read, chain, goal, link, old, threads, reporter, keep)
    return dataclasses.replace(res, labels=chain.labels())


def _pull_locked(store, keys, read, chain, goal: bytes, link: str, old: str, threads: int,
                 reporter: Reporter, keep: int) -> PullResult:
    with locked_beside(beside_lock_path(link, follow=False), what=link):
        with locked_beside(beside_lock_path(old), what=old):
            had_state = os.path.lexists(os.path.join(old, STATE_DIR))
            try:
                res = _build(store, keys, read, chain, goal, link, old, threads, reporter)
            finally:
                if not had_state:  # a .wdiff/ this pull made in the old directory, holding nothing worth keeping
                    tidy_state(old)
        # the link now points at a complete version, its switch on the disk:
        # only now may what it pointed to before go (old's lock is released,
        # so the removal takes it again, as it takes every victim's)
        with Versions(link) as versions:
            removed = versions.prune(keep, known=chain.versions, reporter=reporter)
    reporter.done()
    return dataclasses.replace(res, removed=tuple(removed))


def _build(store, keys, read, chain, goal: bytes, link: str, old: str, threads: int,
           reporter: Reporter) -> PullResult:
    """Under both locks: build the new version beside ``old``, switch the link."""
    with StateDir.open(old) as state:
        state.sweep_temps()
        if Txn(state).read_journal() is not None:
            raise BusyError(f"{old}: an in-place apply was interrupted there",
                            hint=f"finish it with wdiff pull REMOTE {old} first")
        recorded = version_record.read(state)
        if recorded is not None:
            local = local_state(old, recorded, threads, reporter, guess=False)
            current = local.version if not local.changed else None
            rules = DEFAULT_RULES.tracking(recorded.paths)
        else:
            current, rules = fingerprint_of(old, threads, reporter), DEFAULT_RULES
        if current == goal:
            return PullResult(store.url, old, current, goal, up_to_date=True, link=link)
        run = chain.path(current, goal) if current is not None and current in chain.versions else None
        from_anchor = run is None
        if from_anchor:
            run, _ = plan(chain, EMPTY_FINGERPRINT, goal)
        work = state.sub("pull")
        try:
            note_route(reporter, chain, Route(tuple(run), from_anchor), url=store.url, directory=link,
                       current=current, goal=goal, held=held_bundles(work))
            siblings = os.path.dirname(old)  # the new version is written beside the old one
            check_space(need_of(run, work, whole=True), work_at=work.path, files_at=siblings, what=link,
                        reporter=reporter)
            paths, downloaded = fetch_run(store, keys, run, work, reporter)
            check_space(need_of(run, work, whole=True), work_at=work.path, files_at=siblings, what=link)
            bundle = paths[0]
            if len(paths) > 1:
                bundle = work.where(f"squash-{short(current or b'')}-{short(goal)}.wdb")
                squash_from(paths, None if from_anchor else old, bundle, threads=threads, reporter=reporter,
                            overwrite=True, check_out=False, base_fingerprint=None if from_anchor else current,
                            rules=None if from_anchor else rules)
            new = _new_sibling(old, chain, goal)
            with Versions(link) as versions:  # pending: a kill before add() leaves it known as ours
                versions.pend(new, goal)
            try:
                apply_copy(bundle, None if from_anchor else old, new, threads=threads, reporter=reporter,
                           rules=rules)
                with reading(bundle) as r, StateDir.open(new) as fresh:
                    record_target(fresh, r.index)
            except BaseException:
                with Versions(link) as versions:
                    versions.unpend(new)
                raise
            with Versions(link) as versions:  # listed before the switch: never a version we did not list
                versions.add(new, goal, old, reporter)
        finally:
            work.close()
        clear_work(state)  # done: nothing in the work area is needed again
    _switch_link(link, new)
    accept(store, read, trust.places(new))
    return PullResult(store.url, new, current if current in chain.versions else None, goal,
                      tuple(e.bundle for e in run), downloaded, from_anchor=from_anchor, link=link)


def _new_sibling(old: str, chain, goal: bytes) -> str:
    """A name beside the link's target for the new version: its label when
    that is a plain name, else its fingerprint."""
    parent = os.path.dirname(old)
    label = next((e.label for e in chain.entries if e.version == goal and e.label), None)
    names = [label] if label and _SAFE_NAME.fullmatch(label) else []
    names += [hexd(goal)[:12]] + [f"{hexd(goal)[:12]}-{k}" for k in range(2, 100)]
    for n in names:
        if not os.path.lexists(os.path.join(parent, n)):
            return os.path.join(parent, n)
    raise UsageError(f"{parent}: no free name for the new version beside {os.path.basename(old)}")


def _switch_link(link: str, new: str) -> None:
    """Point ``link`` at ``new`` in one rename of a fresh link over it (a
    relative link stays relative); a reader sees the old or the new target."""
    parent, name = os.path.split(link)
    text = os.readlink(link)
    target = new if os.path.isabs(text) else os.path.relpath(new, parent)
    tmp = os.path.join(parent, f".{name}.wdiff-link-{owner_tag()}")
    try:
        os.symlink(target, tmp)
        os.replace(tmp, link)
        fsync_dir(parent)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise io_error(link, e) from None
