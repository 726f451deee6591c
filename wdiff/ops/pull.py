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
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass

from ..errors import BaseMismatchError, BusyError, Interrupted, RemoteError, UsageError, WdiffError, WdiffIOError
from ..format import signature as signing
from ..format.journal import Txn
from ..fsutil import fsync_dir, io_error, locked_beside, owner_alive, owner_tag, remove_tree
from ..parallel import default_threads
from ..paths import RESERVED, STATE_DIR
from ..progress import SILENT, Reporter
from ..remotes import open_remote
from ..statedir import StateDir
from ..store.hashing import hexd, short
from .apply import apply
from .apply.inplace import apply_in_place
from . import trust
from .fetch import accept, download, read_verified
from .history import EMPTY_FINGERPRINT, fingerprint_of, plan
from .places import refuse_remote_as_checkpoint
from .rollback import finish_interrupted, plan_back, step_back
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
        }


def pull(
    remote,
    directory,
    *,
    to: str | None = None,
    trusted_keys: list | None = None,
    require_signature: bool = False,
    token: str | None = None,
    threads: int | None = None,
    max_age: float | None = None,
    reporter: Reporter = SILENT,
) -> PullResult:
    """Bring ``directory`` to version ``to`` (default: the head) of ``remote``.
    With trusted keys (given, or in WDIFF_TRUSTED_KEYS), the chain index and
    every bundle must carry a valid signature by one of them. A symbolic link
    to a directory is followed: its target is updated, the link stays. The
    chain must not be older than one this directory or this user accepted
    before (nor, with ``max_age`` in seconds, published longer ago than
    that). ``token``: for a Hub remote (default: huggingface_hub's own)."""
    given = os.path.abspath(os.fspath(directory))
    directory = os.path.realpath(given)
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise UsageError(f"{given}: exists and is not a directory", hint="pull into a directory (it is created if missing)")
    threads = threads or default_threads()
    keys = signing.required_keys(trusted_keys, require_signature)
    refuse_remote_as_checkpoint(directory, "a pull would write a checkpoint over it")
    store = open_remote(remote, token=token)
    # read (and check) the chain before creating DIR: a missing or untrusted
    # remote must not leave an empty directory behind
    records = trust.places(directory)
    read = read_verified(store, keys, max_age=max_age, records=records, reporter=reporter)
    chain = read.chain
    created = not os.path.exists(directory)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise io_error(directory, e) from None
    # the lock sits beside the directory: a pull may swap the directory itself
    parent, name = os.path.split(directory)
    try:
        with locked_beside(os.path.join(parent, f".{name}.wdiff-lock"), what=directory):
            _sweep(parent, name, old_too=False)
            res = _pull_locked(store, chain, keys, directory, to, threads, reporter)
            accept(store, read, records)  # after any swap: DIR/.wdiff is the new directory's
            _sweep(parent, name, old_too=True)
    except (Interrupted, KeyboardInterrupt, RemoteError):
        raise  # DIR keeps the downloads: the next pull resumes them
    except BaseException:
        if created:
            _remove_if_empty(directory)
        raise
    reporter.done()
    return res


def _pull_locked(store, chain, keys, directory: str, to, threads: int, reporter: Reporter) -> PullResult:
    with StateDir.open(directory) as state:
        state.sweep_temps()
        txn = Txn(state)
        journal = txn.read_journal()  # a damaged one is refused here, before anything is written
        work = state.sub("pull")
        try:
            try:
                if journal is not None:
                    _finish_interrupted(store, chain, keys, journal, directory, work, threads, reporter)
                goal = chain.resolve(to)
                # the manifest cache's guess of DIR's version picks the bundles; it
                # is confirmed by reading where nothing later would check it (DIR
                # already at the goal, or at a version the remote does not know)
                current = fingerprint_of(directory, threads, reporter, guess=True)
                guessed = current != EMPTY_FINGERPRINT and current != goal and current in chain.versions
                if not guessed and current != EMPTY_FINGERPRINT:
                    current = fingerprint_of(directory, threads, reporter)
                try:
                    return _bring(store, chain, keys, directory, work, state, current, goal, guessed, threads, reporter)
                except BaseMismatchError:
                    if not guessed:
                        raise
                    # the guess was stale (a file changed behind the cache's back):
                    # nothing was written; plan again from what DIR holds
                    current = fingerprint_of(directory, threads, reporter)
                    return _bring(store, chain, keys, directory, work, state, current, goal, False, threads, reporter)
            finally:
                work.close()
        except (Interrupted, KeyboardInterrupt, RemoteError):
            raise  # the downloads stay: the next pull resumes them
        except BaseException:
            if not txn.exists():  # an unfinished apply needs its bundle; anything else is debris now
                state.unlink("pull")
            raise
        finally:
            if not txn.exists():
                _clear_quietly(state)


def _bring(store, chain, keys, directory: str, work: StateDir, state: StateDir, current: bytes, goal: bytes,
           guessed: bool, threads: int, reporter: Reporter) -> PullResult:
    """Bring ``directory``, at version ``current``, to ``goal``. An apply
    reads and checks the whole base, so a ``guessed`` current that is wrong
    ends in a BaseMismatchError before anything is written."""
    run, from_anchor = plan(chain, current, goal)
    before = current if current in chain.versions else None
    if not run:
        return PullResult(store.url, directory, before, goal, up_to_date=True)
    back = plan_back(chain, current, goal, run)
    fetched = 0
    if back:  # a rollback: undoing the bundles between costs less than the anchor
        if guessed:  # the inverses are built from DIR's bytes: plan from them, not from a guess
            return _bring(store, chain, keys, directory, work, state, fingerprint_of(directory, threads, reporter),
                          goal, False, threads, reporter)
        _check_space(work, back)
        got = step_back(store, chain, keys, directory, work, back, budget=sum(e.size for e in run),
                        threads=threads, reporter=reporter)
        if got.done:
            return PullResult(store.url, directory, before, goal, tuple(e.bundle for e in reversed(back)),
                              got.downloaded, stepped_back=True)
        reporter.warn(f"cannot step back along the chain ({got.why}); rebuilding from an anchor")
        fetched = got.downloaded
        current = fingerprint_of(directory, threads, reporter)
        run, from_anchor = plan(chain, current, goal)
    empty = current == EMPTY_FINGERPRINT
    rebuild = from_anchor and not empty
    if rebuild and os.stat(directory).st_dev != os.stat(os.path.dirname(directory)).st_dev:
        raise WdiffIOError(
            f"{directory}: holds a version the remote does not know, and is a mount point, "
            "which a pull cannot replace with a rebuilt copy; nothing was changed",
            hint="empty it (or pull into a new directory inside it), then pull again",
        )
    _check_space(work, run)
    downloaded = fetched
    bundles = []
    for e in run:
        path, n = download(store, e, work, reporter)
        if keys:
            verify_bundle_signature(store, e, path, keys)
        bundles.append(path)
        downloaded += n
    if rebuild:
        _rebuild_beside(directory, bundles, work, state, threads, reporter)
    else:
        if len(bundles) == 1:
            bundle = bundles[0]
        else:
            bundle = work.where(f"squash-{short(current)}-{short(goal)}.wdb")
            squash(bundles, None if from_anchor else directory, bundle, threads=threads, reporter=reporter,
                   base_fingerprint=None if from_anchor or guessed else current, check_out=False)
        apply_in_place(bundle, directory, abort=False, threads=threads, reporter=reporter)
    return PullResult(store.url, directory, before, goal, tuple(e.bundle for e in run), downloaded,
                      from_anchor=from_anchor)


def _clear_quietly(state: StateDir) -> None:
    """After a finished pull, the work area goes; on a failure it is
    removed above (or kept for a resume), so errors here are not the story."""
    try:
        if state.kind("pull") == "dir" and not _pending_downloads(state):
            state.unlink("pull")
    except WdiffError:
        pass


def _pending_downloads(state: StateDir) -> bool:
    with state.sub("pull", create=False) as w:
        return w is not None and bool(w.names())


def _check_space(work: StateDir, run) -> None:
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


def _remove_if_empty(directory: str) -> None:
    """A pull that created DIR and failed leaves nothing behind."""
    try:
        state = os.path.join(directory, STATE_DIR)
        if os.path.isdir(state) and not os.path.islink(state) and not _has_files(state, "txn"):
            shutil.rmtree(state, ignore_errors=True)
        os.rmdir(directory)
    except OSError:
        pass


def _has_files(state: str, name: str) -> bool:
    return os.path.lexists(os.path.join(state, name))


def _finish_interrupted(store, chain, keys, journal, directory: str, work: StateDir, threads: int,
                        reporter: Reporter) -> None:
    """A pull killed while applying left a journal: finish that apply first,
    but only when its bundle is one of the verified chain, checked again in
    this run (every part's digest, the signature with trusted keys)."""
    entry = next((e for e in chain.entries if hexd(e.bundle) == journal.bundle_id), None)
    if entry is None and finish_interrupted(chain, journal.bundle_id, directory, work, threads=threads,
                                            reporter=reporter):
        return
    if entry is None:
        raise BusyError(
            f"{directory}: an in-place apply that this pull did not start (bundle {journal.bundle_id[:12]}, "
            "which the remote's chain does not hold) was interrupted here",
            hint="finish it (or --abort it) with wdiff apply BUNDLE DIR --in-place",
        )
    path, _ = download(store, entry, work, reporter)
    if keys:
        verify_bundle_signature(store, entry, path, keys)
    apply_in_place(path, directory, abort=False, threads=threads, reporter=reporter)


def _debris(name: str) -> re.Pattern:
    return re.compile(rf"^\.\.?{re.escape(name)}\.wdiff-(new|old)-(\d+)(?:-(\d+))?(?:\.wdiff-tmp-[0-9a-f]+)?$")


def _sweep(parent: str, name: str, *, old_too: bool) -> None:
    """Remove the copies dead pulls left beside DIR (the caller holds DIR's
    beside lock, so no live pull of DIR owns any). A previous DIR
    (``-old-``) goes only once DIR is whole again."""
    pat = _debris(name)
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for n in names:
        m = pat.match(n)
        if not m or (m.group(1) == "old" and not old_too):
            continue
        if owner_alive(int(m.group(2)), int(m.group(3)) if m.group(3) else None):
            continue
        p = os.path.join(parent, n)
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise io_error(p, e) from None


def _rebuild_beside(directory: str, bundles: list[str], work: StateDir, state: StateDir, threads: int,
                    reporter: Reporter) -> None:
    """The directory holds a version the remote does not know: build the
    wanted version beside it from an anchor, then swap the two directories
    by rename, holding DIR's own lock (no in-place apply runs meanwhile).
    The old content is kept until the new one is complete and verified; a
    crash between the two renames leaves both as hidden siblings and no
    directory, which the next pull treats as empty (and whose debris it
    removes). ``.git/`` and ``.cache/`` move over to the new directory."""
    parent, name = os.path.split(directory)
    tag = owner_tag()
    fresh = os.path.join(parent, f".{name}.wdiff-new-{tag}")
    old = os.path.join(parent, f".{name}.wdiff-old-{tag}")
    with state.lock(what=directory):
        carried: list[str] = []
        swapped = False
        try:
            bundle = bundles[0]
            if len(bundles) > 1:
                bundle = work.where("squash-anchor.wdb")
                squash(bundles, None, bundle, threads=threads, reporter=reporter, overwrite=True)
            apply(bundle, None, fresh, threads=threads, reporter=reporter)
            for keep in sorted(RESERVED - {STATE_DIR}):
                if os.path.lexists(os.path.join(directory, keep)):
                    os.rename(os.path.join(directory, keep), os.path.join(fresh, keep))
                    carried.append(keep)
            os.rename(directory, old)
            swapped = True
            os.rename(fresh, directory)
            fsync_dir(parent)
        except OSError as e:
            if not swapped:
                for keep in carried:
                    os.rename(os.path.join(fresh, keep), os.path.join(directory, keep))
            elif not os.path.lexists(directory):
                os.rename(old, directory)  # put the user's directory back
                swapped = False
            raise io_error(directory, e) from None
        finally:
            if not swapped or os.path.isdir(directory):
                remove_tree(fresh)
    remove_tree(old)
