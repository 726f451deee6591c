"""pull: bring a directory to a version of a remote. It fingerprints the
directory, follows the cheapest run of bundles from there (or from an
anchor), downloads and verifies every part, squashes a run of several into
one bundle, and applies it in place: no intermediate checkpoint is written.

Its work area (``DIR/.wdiff/pull``) and DIR's journal are input: reached
through wdiff.statedir, reused only once verified in this run, and an
interrupted apply is finished only with a bundle of the verified chain,
downloaded (or found) and checked again, signature included. Every writer
of DIR holds ``PARENT/.NAME.wdiff-lock`` and, to swap DIR, ``DIR/.wdiff/lock``
too; under them, a pull removes the debris of pulls that died.

What it leaves in ``DIR/.wdiff`` is bounded over any number of runs: after
a success, the record of the version (``state.json``) and the lock file; the
work area is removed. A pull that is interrupted (killed, Ctrl-C, a network
error, a full disk) keeps its verified downloads for the next one, which
reuses them and removes whatever else is there first (pullwork.prune_work).
The disk the plan needs is checked before anything is written
(pullspace), and a pull that refuses leaves no ``.wdiff/`` it made, and no
DIR or parent directory it made, behind.
"""

from __future__ import annotations

import dataclasses
import os

from ...errors import (BaseMismatchError, BusyError, Interrupted, LocalChangesError, RemoteError, UsageError,
                        WdiffError, WdiffIOError)
from ...format.bundle import reading
from ...format.journal import Txn
from ...fsutil import beside_lock_path, io_error, locked_beside, make_parents, remove_made
from ...ops.apply.inplace import apply_in_place
from ...ops.squash import squash_from
from ...parallel import default_threads
from ...paths import STATE_DIR, PathLike, printable
from ...progress import SILENT, Reporter
from ...statedir import StateDir
from ...store import manifest, version_record
from ...store.checkpoint import scan
from ...store.hashing import hexd, short
from ...store.ignore import DEFAULT_RULES
from ..fetch import accept, download
from ..rollback import finish_interrupted, step_back
from ..tracked import EMPTY_FINGERPRINT, LocalState, fingerprint_of, local_state
from .atomic import pull_atomic
from .beside import rebuild_beside, sweep
from .keep import DEFAULT_KEEP
from .plan import held_bundles, note_route, route
from .space import NoSpace, need_of
from .space import check as check_space
from .work import (PullResult, fetch_run, finish_squash, open_verified, prune_work, record_target, tidy_state,
                   work_names_held)


def pull(
    remote: str,
    directory: PathLike,
    *,
    to: str | None = None,
    trusted_keys: list | None = None,
    require_signature: bool = False,
    token: str | None = None,
    threads: int | None = None,
    max_age: float | None = None,
    force: bool = False,
    atomic: bool = False,
    keep: int | None = None,
    reporter: Reporter = SILENT,
) -> PullResult:
    """Bring ``directory`` to version ``to`` (default: the head) of ``remote``:
    the cheapest run of bundles from its version, or an anchor, downloaded,
    verified and applied in place; an interrupted download continues, on
    the next call, from the bytes it had. With trusted keys (``trusted_keys``,
    else WDIFF_TRUSTED_KEYS; ``require_signature``: none is an error) the
    chain index and every bundle must be signed by one of them, and the
    chain must not go back on what this directory or this user accepted
    before (a rollback, another remote's chain), nor, with ``max_age`` in
    seconds, have been published longer ago than that. A symbolic link is
    followed: its target is updated, the link stays. ``token``: for a Hub
    remote (default: ``HF_TOKEN`` or the stored login). Returns a
    :class:`PullResult`.

    Files that the directory's recorded version does not list are untracked:
    kept. Files of that version changed here are local changes: the pull
    refuses (LocalChangesError, exit 5) unless ``force``, which restores them
    (from the deltas when they carry them whole, else from an anchor).
    ``atomic``: ``directory`` is a symbolic link; the new version is built
    beside the link's target, then the link is switched to it in one rename.
    ``keep`` (with ``atomic`` only; default 2): how many version directories
    that atomic pulls made for this link stay beside it, counting the one it
    points to (0: all); the oldest beyond are removed after the switch."""
    given = os.path.abspath(os.fspath(directory))
    if keep is not None and not atomic:
        raise UsageError("--keep counts the versions kept beside the link of pull --atomic",
                         hint="add --atomic, or drop --keep")
    if atomic:
        return pull_atomic(remote, given, to=to, trusted_keys=trusted_keys, require_signature=require_signature,
                           token=token, threads=threads, max_age=max_age, reporter=reporter,
                           keep=DEFAULT_KEEP if keep is None else keep)
    directory = os.path.realpath(given)
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise UsageError(f"{given}: exists and is not a directory", hint="pull into a directory (it is created if missing)")
    threads = threads or default_threads()
    # read (and check) the chain before creating DIR: a missing or untrusted
    # remote must not leave an empty directory behind
    store, keys, read, records = open_verified(remote, directory, "a pull would write a checkpoint over it",
                                                token=token, trusted_keys=trusted_keys,
                                                require_signature=require_signature, max_age=max_age,
                                                reporter=reporter)
    chain = read.chain
    goal = chain.resolve(to)  # no versions, or no such version: refused before DIR exists
    parent, name = os.path.split(directory)
    made = make_parents(parent)
    try:
        # the lock sits beside the directory: a pull may swap the directory itself
        with locked_beside(beside_lock_path(directory), what=directory):
            sweep(parent, name, old_too=False)
            created = not os.path.lexists(directory)
            had_state = not created and os.path.lexists(os.path.join(directory, STATE_DIR))
            try:
                if created:  # what the pull downloads must fit before DIR exists
                    r = route(chain, goal, current=EMPTY_FINGERPRINT)
                    note_route(reporter, chain, r, url=store.url, directory=directory, current=None, goal=goal)
                    check_space(need_of(r.run, None, whole=True), work_at=directory, files_at=directory,
                                what=directory, reporter=reporter)
                    try:
                        os.mkdir(directory)
                    except OSError as e:
                        raise io_error(directory, e) from None
                res = _pull_locked(store, chain, keys, directory, to, threads, reporter, force, checked=created,
                                   made_state=not had_state)
                accept(store, read, records)  # after any swap: DIR/.wdiff is the new directory's
                sweep(parent, name, old_too=True)
            except BaseException:
                _tidy(directory, created=created, had_state=had_state)  # still under the lock
                raise
    except BaseException:
        remove_made(made)
        raise
    reporter.done()
    return dataclasses.replace(res, labels=chain.labels())


def _pull_locked(store, chain, keys, directory: str, to, threads: int, reporter: Reporter,
                 force: bool = False, *, checked: bool = False, made_state: bool = False) -> PullResult:
    with StateDir.open(directory) as state:
        state.sweep_temps()
        txn = Txn(state)
        journal = txn.read_journal()  # a damaged one is refused here, before anything is written
        work = state.sub("pull")
        try:
            try:
                res = _pull_in(store, chain, keys, journal, directory, work, state, to, threads, reporter, force,
                               checked)
            finally:
                work.close()
        except NoSpace:
            if made_state:  # DIR/.wdiff is this pull's: it goes, downloads and all (tidied by the caller)
                _clear_quietly(state)
            else:  # the downloads stay for the next pull, once there is room
                _clear_quietly(state, only_empty=True)
            raise
        except (Interrupted, KeyboardInterrupt, RemoteError, WdiffIOError):
            # killed, a network error, a full disk: the verified downloads
            # stay, and the next pull resumes them; an empty area goes
            _clear_quietly(state, only_empty=True)
            raise
        except BaseException:
            if not txn.exists():  # an unfinished apply needs its bundle; anything else is debris now
                _clear_quietly(state)
            raise
        _clear_quietly(state)  # done: nothing in the work area is needed again
        return res


def _pull_in(store, chain, keys, journal, directory: str, work: StateDir, state: StateDir, to, threads: int,
             reporter: Reporter, force: bool, checked: bool) -> PullResult:
    """The pull itself, under both locks, with the work area open; first,
    the apply an interrupted pull left half done, which the result names."""
    finished = None
    if journal is not None:
        finished = _finish_interrupted(store, chain, keys, journal, directory, work, threads, reporter)
    res = _pull_on(store, chain, keys, directory, work, state, to, threads, reporter, force, checked)
    if finished is None:
        return res
    return dataclasses.replace(res, finished=finished, up_to_date=False)


def _pull_on(store, chain, keys, directory: str, work: StateDir, state: StateDir, to, threads: int,
             reporter: Reporter, force: bool, checked: bool) -> PullResult:
    goal = chain.resolve(to)
    recorded = version_record.read(state)  # strict: a planted one is refused, never obeyed
    if recorded is not None:
        return _bring_recorded(store, chain, keys, directory, work, recorded, goal, force, threads,
                               reporter)
    # the manifest cache's guess of DIR's version picks the bundles; it
    # is confirmed by reading where nothing later would check it (DIR
    # already at the goal, or at a version the remote does not know)
    current = fingerprint_of(directory, threads, reporter, guess=True)
    guessed = current != EMPTY_FINGERPRINT and current != goal and current in chain.versions
    if not guessed and current != EMPTY_FINGERPRINT:
        current = fingerprint_of(directory, threads, reporter)
    try:
        return _bring(store, chain, keys, directory, work, state, current, goal, guessed, threads, reporter,
                      force, checked)
    except BaseMismatchError:
        if not guessed:
            raise
        # the guess was stale (a file changed behind the cache's back):
        # nothing was written; plan again from what DIR holds
        current = fingerprint_of(directory, threads, reporter)
        return _bring(store, chain, keys, directory, work, state, current, goal, False, threads, reporter,
                      force)


def _bring(store, chain, keys, directory: str, work: StateDir, state: StateDir, current: bytes, goal: bytes,
           guessed: bool, threads: int, reporter: Reporter, force: bool = False, checked: bool = False) -> PullResult:
    """Bring ``directory``, at version ``current``, to ``goal``. An apply
    reads and checks the whole base, so a ``guessed`` current that is wrong
    ends in a BaseMismatchError before anything is written. A directory at a
    version the remote does not know, with no record of a pull, is replaced
    only with ``force``: what it holds may be someone's work."""
    r = route(chain, goal, current=current)
    run, from_anchor, back = list(r.run), r.from_anchor, r.back
    before = current if current in chain.versions else None
    if not run:
        _adopt(state, directory, threads, reporter)
        return PullResult(store.url, directory, before, goal, up_to_date=True)
    fetched = 0
    if back:  # a rollback: undoing the bundles between costs less than the anchor
        if guessed:  # the inverses are built from DIR's bytes: plan from them, not from a guess
            return _bring(store, chain, keys, directory, work, state, fingerprint_of(directory, threads, reporter),
                          goal, False, threads, reporter, force)
        _note(reporter, store, chain, r, directory, current, goal, work)
        got = _stepping_back(store, chain, keys, directory, work, list(back), run, threads, reporter)
        if got.done:
            return PullResult(store.url, directory, before, goal, tuple(e.bundle for e in reversed(back)),
                              got.downloaded, stepped_back=True)
        reporter.warn(f"cannot step back along the chain ({got.why}); rebuilding from an anchor")
        fetched = got.downloaded
        current = fingerprint_of(directory, threads, reporter)
        r = route(chain, goal, current=current)
        r = dataclasses.replace(r, back=None)
        run, from_anchor = list(r.run), r.from_anchor
    empty = current == EMPTY_FINGERPRINT
    if not (checked and empty):  # a DIR this pull made: its route was noted when it was checked
        _note(reporter, store, chain, r, directory, current, goal, work)
    empty = current == EMPTY_FINGERPRINT
    rebuild = from_anchor and not empty
    if rebuild and current not in chain.versions and not force:
        _refuse_unknown(directory, chain)  # before anything is downloaded
    if rebuild and os.stat(directory).st_dev != os.stat(os.path.dirname(directory)).st_dev:
        raise WdiffIOError(
            f"{directory}: holds a version the remote does not know, and is a mount point, "
            "which a pull cannot replace with a rebuilt copy; nothing was changed",
            hint="empty it (or pull into a new directory inside it), then pull again",
        )
    exact = True
    if not (checked and empty):  # a DIR this pull made was checked before it was
        exact = _check(run, work, directory, whole=from_anchor, reporter=reporter)
    bundles, downloaded = fetch_run(store, keys, run, work, reporter)
    downloaded += fetched
    _check_again(run, work, directory, whole=from_anchor, reporter=reporter if not exact else SILENT)
    if rebuild:
        with reading(bundles[-1]) as last:
            target = last.index
        rebuild_beside(directory, bundles, work, state, threads, reporter)
        with StateDir.open(directory) as fresh:  # the new directory's own state
            record_target(fresh, target)
    else:
        if len(bundles) == 1:
            bundle = bundles[0]
        else:
            bundle = work.where(f"squash-{short(current)}-{short(goal)}.wdb")
            squash_from(bundles, None if from_anchor else directory, bundle, threads=threads, reporter=reporter,
                        base_fingerprint=None if from_anchor or guessed else current, check_out=False)
        apply_in_place(bundle, directory, abort=False, threads=threads, reporter=reporter, beside_locked=True)
    return PullResult(store.url, directory, before, goal, tuple(e.bundle for e in run), downloaded,
                      from_anchor=from_anchor)


# -- a directory with a record of its version ------------------------------------------------


def _adopt(state: StateDir, directory: str, threads: int, reporter: Reporter) -> None:
    """DIR, just read and found at a version of the chain, gets a record of
    it (the cache holds its digests now, so this reads nothing again)."""
    ckpt = scan(directory)
    if ckpt.files:
        m = manifest.compute(ckpt, threads=threads, reporter=reporter, use_cache=True)
        version_record.write(state, version_record.of_rows((d.path, d.kind, d.size, d.digest) for d in m.files))


def _refuse_local_changes(directory: str, local: LocalState, clashes=()) -> None:
    lines = [f"{printable(p)} differs from {short(local.version)}" if os.path.lexists(os.path.join(directory, p))
             else f"{printable(p)} of {short(local.version)} is missing" for p in local.changed]
    lines += [f"{printable(p)} is not part of {short(local.version)}, and the new version has its own" for p in clashes]
    more = f" (and {len(lines) - 20} more)" if len(lines) > 20 else ""
    raise LocalChangesError(
        f"{directory}: holds local changes that a pull would discard: " + "; ".join(lines[:20]) + more,
        hint="--force discards these changes (files that are not part of the checkpoint are kept); "
             "or copy them elsewhere first, or pull into another directory",
    )


def _refuse_unknown(directory: str, chain) -> None:
    names = [printable(f.path) for f in scan(directory).files]
    more = f" (and {len(names) - 10} more)" if len(names) > 10 else ""
    raise LocalChangesError(
        f"{directory}: holds a version the remote does not know ({len(names)} file{'s' if len(names) != 1 else ''}: "
        + ", ".join(names[:10]) + more + "), and no record of a pull says which of them are the checkpoint; "
        "a pull would replace them all",
        hint="--force replaces the directory with the remote's version (its .git/ and .cache/ are kept); "
             "or pull into another directory",
    )


def _clashes(directory: str, index, recorded: version_record.Record) -> list[str]:
    """Untracked files where ``index``'s target puts a file of its own."""
    return [f.path for f in index.files if f.path not in recorded.paths
            and os.path.lexists(os.path.join(directory, f.path))]


def _bring_recorded(store, chain, keys, directory: str, work: StateDir, recorded: version_record.Record, goal: bytes,
                    force: bool, threads: int, reporter: Reporter) -> PullResult:
    local = local_state(directory, recorded, threads, reporter, guess=True)
    try:
        return _bring_local(store, chain, keys, directory, work, local, goal, force, threads, reporter)
    except BaseMismatchError as e:
        if isinstance(e, LocalChangesError) or not local.guessed:
            raise
        # the cache's guess was stale (a file changed behind its back): nothing
        # was written; look again, reading every recorded file
        local = local_state(directory, recorded, threads, reporter, guess=False)
        return _bring_local(store, chain, keys, directory, work, local, goal, force, threads, reporter)


def _bring_local(store, chain, keys, directory: str, work: StateDir, local: LocalState, goal: bytes, force: bool,
                 threads: int, reporter: Reporter) -> PullResult:
    if local.changed and not force:
        _refuse_local_changes(directory, local)  # before anything is downloaded
    before = local.version if local.version in chain.versions else None
    probed = [0]

    def index_of(e):
        """The index of the run's first bundle, which says whether it
        carries the changed files whole: downloaded (the way by deltas
        needs it anyway), after the disk check."""
        _check([e], work, directory, whole=False, reporter=reporter)
        path, n = download(store, e, work, reporter, keys=keys)
        probed[0] += n
        with reading(path) as r:
            return r.index

    r = route(chain, goal, current=local.version, local=local, index_of=index_of)
    run, from_anchor = list(r.run), r.from_anchor
    if not run:
        return PullResult(store.url, directory, before, goal, up_to_date=True)
    _note(reporter, store, chain, r, directory, local.version, goal, work)
    if r.back:
        stepped = _step_back(store, chain, keys, directory, work, list(r.back), goal, run, before, threads, reporter)
        if stepped is not None:
            return stepped
    replace = set(local.changed)
    if not from_anchor:
        exact = _check(run, work, directory, whole=False, reporter=reporter)
        paths, downloaded = fetch_run(store, keys, run, work, reporter)
        _check_again(run, work, directory, whole=False, reporter=reporter if not exact else SILENT)
        _apply_run(directory, work, local, paths, replace, force, threads, reporter)
        return PullResult(store.url, directory, before, goal, tuple(e.bundle for e in run), downloaded + probed[0],
                          restored=tuple(sorted(replace)))
    if r.unrestorable:  # a changed file that no delta of the run carries whole: from an anchor
        reporter.warn(f"{directory}: {', '.join(printable(p) for p in r.unrestorable[:5])} cannot be restored from "
                      "the deltas; restoring from an anchor")
    exact = _check(run, work, directory, whole=True, reporter=reporter)
    paths, downloaded = fetch_run(store, keys, run, work, reporter)
    downloaded += probed[0]
    _check_again(run, work, directory, whole=True, reporter=reporter if not exact else SILENT)
    bundle = paths[0]
    if len(paths) > 1:
        bundle = work.where(f"squash-anchor-{short(goal)}.wdb")
        squash_from(paths, None, bundle, threads=threads, reporter=reporter, overwrite=True, check_out=False)
    with reading(bundle) as rd:
        clashes = _clashes(directory, rd.index, local.recorded)
    if clashes and not force:
        _refuse_local_changes(directory, local, clashes)
    apply_in_place(bundle, directory, abort=False, threads=threads, reporter=reporter, over=True, beside_locked=True,
                   replace=frozenset(replace | set(clashes)))
    return PullResult(store.url, directory, before, goal, tuple(e.bundle for e in run), downloaded,
                      from_anchor=True, restored=tuple(sorted(replace | set(clashes))))


def _step_back(store, chain, keys, directory: str, work: StateDir, back, goal: bytes, run, before,
               threads: int, reporter: Reporter) -> PullResult | None:
    """A recorded directory going back to an older version: undo the bundles
    ``back`` through their inverses (the route found that cheaper than the
    anchor ``run``); None when it cannot (the anchor run follows)."""
    got = _stepping_back(store, chain, keys, directory, work, back, run, threads, reporter)
    if got.done:
        return PullResult(store.url, directory, before, goal, tuple(e.bundle for e in reversed(back)),
                          got.downloaded, stepped_back=True)
    reporter.warn(f"cannot step back along the chain ({got.why}); restoring from an anchor")
    return None


def _apply_run(directory: str, work: StateDir, local: LocalState, paths: list[str], replace: set[str], force: bool,
               threads: int, reporter: Reporter) -> None:
    """Apply a run of deltas from the recorded version in place: files to
    restore go with the first bundle (which carries them whole), the rest
    of the run squashed into one, the directory's untracked files kept."""
    rules = DEFAULT_RULES.tracking(local.recorded.paths)
    if replace:
        with reading(paths[0]) as first:
            clashes = _clashes(directory, first.index, local.recorded)
        if clashes and not force:
            _refuse_local_changes(directory, local, clashes)
        apply_in_place(paths[0], directory, abort=False, threads=threads, reporter=reporter, beside_locked=True,
                       replace=frozenset(replace | set(clashes)))
        replace.update(clashes)
        paths = paths[1:]
        if not paths:
            return
        with StateDir.open(directory) as state:
            now = version_record.read(state)
        rules = DEFAULT_RULES.tracking(now.paths if now is not None else ())
        guessed = False
    else:
        guessed = local.guessed
    bundle = paths[0]
    if len(paths) > 1:
        with reading(paths[0]) as a, reading(paths[-1]) as b:
            base_fp, goal = a.index.base_fingerprint, b.index.target_fingerprint
        bundle = work.where(f"squash-{short(base_fp or b'')}-{short(goal)}.wdb")
        squash_from(paths, directory, bundle, threads=threads, reporter=reporter, overwrite=True, check_out=False,
                    base_fingerprint=None if guessed else base_fp, rules=rules)
    with reading(bundle) as r:
        clashes = _clashes(directory, r.index, local.recorded) if not replace else []
    if clashes and not force:
        _refuse_local_changes(directory, local, clashes)
    apply_in_place(bundle, directory, abort=False, threads=threads, reporter=reporter, replace=frozenset(clashes),
                   beside_locked=True)
    replace.update(clashes)


def _stepping_back(store, chain, keys, directory: str, work: StateDir, back, run, threads: int,
                   reporter: Reporter):
    """Undo ``back`` through its inverses (rollback.step_back), after the
    disk check: its downloads, and an in-place apply of each inverse."""
    _check(back, work, directory, whole=False, reporter=reporter)
    prune_work(work, back)
    return step_back(store, chain, keys, directory, work, back, budget=sum(e.size for e in run),
                     threads=threads, reporter=reporter)


def _check(run, work: StateDir, directory: str, *, whole: bool, reporter: Reporter = SILENT) -> bool:
    """Refuse before anything is downloaded when the disk lacks what the
    plan needs (pullspace); -v says what it needs and has. A rebuild
    writes beside DIR, on its disk. True: the count was exact."""
    need = need_of(run, work, whole=whole)
    check_space(need, work_at=work.path, files_at=directory, what=directory, reporter=reporter)
    return need.exact


def _check_again(run, work: StateDir, directory: str, *, whole: bool, reporter: Reporter = SILENT) -> None:
    """Check again once the bundles are here, before DIR is touched: exact
    where the store could not read their indexes before the download."""
    check_space(need_of(run, work, whole=whole), work_at=work.path, files_at=directory, what=directory,
                reporter=reporter)


def _note(reporter: Reporter, store, chain, r, directory: str, current: bytes, goal: bytes, work: StateDir) -> None:
    note_route(reporter, chain, r, url=store.url, directory=directory, current=current, goal=goal,
               held=held_bundles(work))


def _clear_quietly(state: StateDir, *, only_empty: bool = False) -> None:
    """The work area goes (``only_empty``: when it holds nothing); errors
    here are not the story of the failure being raised."""
    try:
        held = work_names_held(state)
        if held is None or (only_empty and held):
            return
        state.unlink("pull")
    except WdiffError:
        pass


def _tidy(directory: str, *, created: bool, had_state: bool) -> None:
    """After a pull that failed, under its lock: an unfinished apply's
    journal, a record and verified downloads stay; a ``.wdiff/`` this pull
    made that holds nothing else goes, and so does DIR when this pull made
    it and it is empty."""
    if not had_state and os.path.isdir(directory):
        tidy_state(directory)
    if created:
        remove_made([directory])


def _finish_interrupted(store, chain, keys, journal, directory: str, work: StateDir, threads: int,
                        reporter: Reporter) -> str:
    """A pull killed while applying left a journal: finish that apply first,
    but only when its bundle is one of the verified chain, checked again in
    this run (every part's digest, the signature with trusted keys), or
    the inverse or squash that pull built from such bundles, joining two
    versions of the chain. What it finished: "rollback" or "apply"."""
    entry = next((e for e in chain.entries if hexd(e.bundle) == journal.bundle_id), None)
    if entry is None and finish_interrupted(chain, journal.bundle_id, directory, work, threads=threads,
                                            reporter=reporter):
        return "rollback"
    if entry is None and finish_squash(chain, journal.bundle_id, directory, work, threads=threads,
                                       reporter=reporter):
        return "apply"
    if entry is None:
        raise BusyError(
            f"{directory}: an in-place apply that this pull did not start (bundle {journal.bundle_id[:12]}, "
            "which the remote's chain does not hold) was interrupted here",
            hint="finish it (or --abort it) with wdiff apply BUNDLE DIR --in-place",
        )
    reporter.note(f"finishing the interrupted apply of {chain.name(entry.parent)} -> {chain.name(entry.version)}")
    path, _ = download(store, entry, work, reporter, keys=keys)
    apply_in_place(path, directory, abort=False, threads=threads, reporter=reporter, beside_locked=True)
    return "apply"
