"""``wdiff pull SRC DIR --layout hf-delta``: bring a directory to a version
of a source of the field's delta layout (a slime trainer's output, an
export), with wdiff's guarantees.

The run from the version DIR holds (``DIR/.wdiff/hfdelta.json``) to the one
wanted is planned from the indexes alone (reader.Source.plan): the deltas
after it, or the newest full version at or below the goal and the deltas
after that. Every delta is downloaded, checked (names, shapes, frames) and
replayed away from DIR, each tensor against the source's checksum, each
delta's ``base_version`` against the version it lands on; any refusal
leaves DIR as it was. The result is then brought into DIR by wdiff's own
in-place apply, as one bundle packed from DIR and the replayed tensors
(journal, undo log, verified against its target's digests), so that a
crash leaves the old version or the new one, and the next pull (or ``wdiff
apply --in-place`` with the bundle) finishes it. A DIR that does not exist
yet is built beside its name and renamed into place.

Locks: the lock beside DIR (every wdiff writer of DIR holds it) for the
whole pull, and the in-place apply's own.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from ...errors import BaseMismatchError, BusyError, FormatError, LocalChangesError, UsageError
from ...format.bundle import BundleReader
from ...format.journal import Txn
from ...fsutil import (beside_lock_path, check_output, clear_dead_temps, fsync_dir, io_error, locked_beside,
                       make_parents, remove_made, remove_tree, temp_name)
from ...ops.apply.inplace import TrustedBase, apply_in_place
from ...ops.loadable import problems
from ...ops.memsource import pack_memory
from ...ops.pack import pack_pair
from ...ops.pair import Pair
from ...sync.places import refuse_remote_as_checkpoint
from ...sync.pull.work import tidy_state
from ...sync.tracked import local_state
from ...parallel import default_threads
from ...paths import STATE_DIR, printable
from ...progress import SILENT, Reporter
from ...statedir import StateDir
from ...store import manifest, version_record
from ...store.checkpoint import scan
from ...store.digests import Digests
from ...store.hashing import hexd
from ...store.ignore import DEFAULT_RULES
from . import held as held_file
from .held import Held
from .layout import looks_like_delta
from .reader import Source, SourceVersion, Step
from .replay import Delta, InPlace, Overlay, Staged, replay
from .writer import fsync_tree

WORK = "hfdelta"
PENDING = "pending.wdb"


@dataclass(frozen=True)
class HfPullResult:
    source: str
    directory: str
    before: str | None  # the version DIR held (None: empty, or replaced)
    after: str
    fingerprint: bytes  # DIR's fingerprint now
    seeded: str | None = None  # the full version the run started from
    deltas: tuple[str, ...] = ()
    downloaded: int = 0

    @property
    def up_to_date(self) -> bool:
        return self.seeded is None and not self.deltas

    def to_json(self) -> dict:
        return {"schema": "wdiff.hfpull/1", "source": self.source, "directory": self.directory,
                "before": self.before, "after": self.after, "fingerprint": hexd(self.fingerprint),
                "up_to_date": self.up_to_date, "seeded_from": self.seeded, "deltas": list(self.deltas),
                "downloaded_bytes": self.downloaded}


def pull_hfdelta(source, directory, *, to: str | None = None, force: bool = False, token: str | None = None,
                 threads: int | None = None, reporter: Reporter = SILENT) -> HfPullResult:
    """Bring ``directory`` to version ``to`` (default: the newest) of
    ``source`` (see the module's doc). Refusals: a checksum that does not
    match, a malformed index, shard or frame (IntegrityError, exit 4); a
    delta whose base is not the version DIR holds, or DIR holding another
    source's version (exit 5); files changed in DIR since the last pull, or
    a DIR with files and no record of a pull (exit 5, unless ``force``,
    which starts again from the source's newest full version)."""
    threads = threads or default_threads()
    directory = os.path.realpath(os.path.abspath(os.fspath(directory)))
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise UsageError(f"{directory}: exists and is not a directory", hint="pull into a directory")
    refuse_remote_as_checkpoint(directory, "a pull would write a checkpoint over it")
    src = Source(source, token=token)
    if not src.url.count("://"):
        check_output(directory, [("the source", src.url)])
        check_output(src.url, [("the directory", directory)])
    goal = src.resolve(to)
    made = make_parents(os.path.dirname(directory))
    try:
        with locked_beside(beside_lock_path(directory), what=directory):
            clear_dead_temps(directory, "hfseed")
            if not os.path.lexists(directory):
                res = _create(src, goal, directory, threads, reporter)
            else:
                had_state = os.path.lexists(os.path.join(directory, STATE_DIR))
                try:
                    res = _update(src, goal, directory, force, threads, reporter)
                except BaseException:
                    if not had_state:
                        tidy_state(directory)
                    raise
    except BaseException:
        remove_made(made)  # a refused pull leaves no folder it made
        raise
    reporter.done()
    return res


def _replay_run(src: Source, steps: list[Step], base, into, work: str, held: str, reporter: Reporter) -> int:
    """Download, check and replay each delta of ``steps`` onto ``base``
    (which holds version ``held``); the bytes downloaded."""
    got = 0
    os.makedirs(work, exist_ok=True)
    for step in steps:
        v, ix = step.version, step.index
        if not src._same(ix.base_version, held):
            raise BaseMismatchError(f"{printable(src.url)}: {v.dirname} is a delta against {printable(ix.base_version, 40)}, "
                                    f"and the directory would hold {printable(held, 40)} then; nothing was changed")
        frames, n = src.fetch_delta(step, work)
        got += n
        replay(Delta(f"{printable(src.url)}: {v.dirname}", ix.encoding, ix.checksum, frames), base, into,
               reporter=reporter)
        for name in os.listdir(work):
            os.unlink(os.path.join(work, name))
        held = v.key
    return got


def _seed(src: Source, run: list[Step], root: str, work: str, reporter: Reporter) -> int:
    """Build the run's goal in the private folder ``root``: the full version's
    files, then each delta replayed in place; the bytes downloaded."""
    full = run[0].version
    got = 0
    for rel, _ in src.full_files(full):
        dest = os.path.join(root, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        got += src.fetch(full, rel, dest)
    ckpt = scan(root)
    if looks_like_delta([f.header for f in ckpt.files if f.header is not None]):
        raise FormatError(f"{printable(src.url)}: {full.dirname} has no index and holds only a delta's shards (U8 "
                          "frames with checksums): a delta whose index is missing or not written yet, not a full "
                          "version; nothing was changed")
    broken = problems(ckpt)  # a part of a version is never taken for the whole
    if broken:
        raise FormatError(f"{printable(src.url)}: {full.dirname} is not a whole checkpoint: {'; '.join(broken[:5])}; "
                          "nothing was changed")
    into = InPlace()
    got += _replay_run(src, run[1:], ckpt, into, work, full.key, reporter)
    into.sync()
    return got


def _create(src: Source, goal: SourceVersion, directory: str, threads: int, reporter: Reporter) -> HfPullResult:
    """DIR does not exist: build it beside its name, then rename it into place."""
    run = src.plan(None, goal)
    tmp = temp_name(directory, "hfseed")
    try:
        os.mkdir(tmp, 0o755)
    except OSError as e:
        raise io_error(tmp, e) from None
    try:
        with StateDir.open(tmp) as state:
            got = _seed(src, run, tmp, state.where(WORK), reporter)
            state.unlink(WORK)
            m = manifest.compute(scan(tmp), threads=threads)
            version_record.write(state, version_record.of_rows((f.path, f.kind, f.size, f.digest) for f in m.files))
            held_file.write(state, Held(src.url, goal.key, m.fingerprint))
        fsync_tree(tmp)
        os.rename(tmp, directory)
        fsync_dir(os.path.dirname(directory))
    except BaseException:
        remove_tree(tmp)
        raise
    return HfPullResult(src.url, directory, None, goal.key, m.fingerprint, run[0].version.key,
                        tuple(s.version.key for s in run[1:]), got)


def _update(src: Source, goal: SourceVersion, directory: str, force: bool, threads: int,
            reporter: Reporter) -> HfPullResult:
    with StateDir.open(directory) as state:
        state.sweep_temps()
        txn = Txn(state)
        journal = txn.read_journal()
        work = state.sub(WORK)
        try:
            held = held_file.read(state)
            if journal is not None:
                _finish(journal, work, directory, threads, reporter)
            recorded = version_record.read(state)
            held = _settle(state, held, recorded)
            for name in work.names():
                work.unlink(name)
            current = _current(src, held, recorded, directory, force, threads, reporter)
            run = src.plan(current, goal)
            before = current
            if not run:
                return HfPullResult(src.url, directory, before, goal.key, held.fingerprint)
            if run[0].index is None:
                base = held if current is not None else None
                fp, got = _reseed(src, run, directory, state, work, base, recorded, force, threads, reporter)
            else:
                fp, got = _deltas(src, run, directory, state, work, held, recorded, threads, reporter)
            held_file.write(state, Held(src.url, goal.key, fp))
        finally:
            work.close()
            if not txn.exists():  # an unfinished apply needs its bundle; anything else is debris now
                with contextlib.suppress(Exception):
                    state.unlink(WORK)
    seeded = run[0].version.key if run[0].index is None else None
    deltas = tuple(s.version.key for s in run if s.index is not None)
    return HfPullResult(src.url, directory, before, goal.key, fp, seeded, deltas, got)


def _finish(journal, work: StateDir, directory: str, threads: int, reporter: Reporter) -> None:
    """An in-place apply this kind of pull started was interrupted: finish
    it with its bundle, which the apply checks again in full."""
    if work.kind(PENDING) == "file":
        with BundleReader(work.where(PENDING)) as r:
            ours = hexd(r.id) == journal.bundle_id
        if ours:
            apply_in_place(work.where(PENDING), directory, abort=False, threads=threads, reporter=reporter,
                           beside_locked=True)
            return
    raise BusyError(f"{directory}: an in-place apply that this pull did not start (bundle {journal.bundle_id[:12]}) "
                    "was interrupted here", hint="finish it (or --abort it) with wdiff apply BUNDLE DIR --in-place")


def _settle(state: StateDir, held: Held | None, recorded) -> Held | None:
    """A pending version is DIR's when DIR's record says so (the apply
    finished), else the version before it is."""
    if held is None or held.pending is None:
        return held
    version, fp = held.pending
    now = Held(held.source, version, fp) if recorded is not None and recorded.version == fp else \
        Held(held.source, held.version, held.fingerprint)
    held_file.write(state, now)
    return now


def _current(src: Source, held: Held | None, recorded, directory: str, force: bool, threads: int,
             reporter: Reporter) -> str | None:
    """The version of the source DIR holds, as far as a pull may build on
    it; None: start from a full version (an empty DIR, or ``force``)."""
    why = None
    if held is None:
        if recorded is None and not scan(directory).files:
            return None
        why = (f"{directory}: holds files and no record of a pull from this source; a pull would replace them",
               "--force replaces them with the source's version (files that are not the checkpoint's are kept "
               "only where DIR has a record)")
        err = LocalChangesError
    elif held.source != src.url:
        why = (f"{directory}: holds version {printable(held.version, 40)} of another source "
               f"({printable(held.source)}); its versions are not this source's",
               "--force replaces it with this source's version, from its newest full version")
        err = BaseMismatchError
    elif recorded is None or recorded.version != held.fingerprint:
        why = (f"{directory}: was changed since the pull that brought it to {printable(held.version, 40)} "
               "(its record names another version)", "--force starts again from the source's newest full version")
        err = LocalChangesError
    else:
        local = local_state(directory, recorded, threads, reporter, guess=True)
        if not local.changed:
            return held.version
        names = ", ".join(printable(p) for p in local.changed[:10])
        why = (f"{directory}: holds local changes that a pull would discard: {names}",
               "--force discards them (starting again from the source's newest full version)")
        err = LocalChangesError
    if not force:
        raise err(why[0], hint=why[1])
    return None


def _deltas(src: Source, run: list[Step], directory: str, state: StateDir, work: StateDir, held: Held, recorded,
            threads: int, reporter: Reporter) -> tuple[bytes, int]:
    """Deltas only: replay the changed tensors into a stage file, pack the
    bundle that turns DIR into the result, apply it in place."""
    A = scan(directory, rules=DEFAULT_RULES.tracking(recorded.paths))
    with Staged(work.where("tensors.bin")) as st:
        got = _replay_run(src, run, A, st, work.where("shards"), held.version, reporter)
        if not st.at:  # versions that changed nothing (an empty weight map)
            return recorded.version, got
        overlay = Overlay(A, st)
        digests = Digests()
        try:
            packed = pack_memory(A, overlay, work.where(PENDING + ".new"), threads=threads, base_digests=digests)
        finally:
            overlay.close()
    if packed.base_fingerprint != recorded.version:
        raise LocalChangesError(f"{directory}: changed while the pull read it", hint="run the pull again")
    _apply(work, directory, state, src.url, held, run[-1].version.key, packed.target_fingerprint, threads, reporter,
           trusted=TrustedBase(A, digests, packed.base_fingerprint))
    return packed.target_fingerprint, got


def _reseed(src: Source, run: list[Step], directory: str, state: StateDir, work: StateDir, held: Held | None,
            recorded, force: bool, threads: int, reporter: Reporter) -> tuple[bytes, int]:
    """From a full version: build the goal in the work area, pack the bundle
    from DIR's checkpoint to it, apply that in place."""
    seed = work.where("seed")
    os.mkdir(seed, 0o700)
    got = _seed(src, run, seed, work.where("shards"), reporter)
    S = scan(seed)
    tracked = set(recorded.paths) if recorded is not None else None
    rules = DEFAULT_RULES.tracking(tracked) if tracked is not None else DEFAULT_RULES
    A = scan(directory, rules=rules)
    if tracked is not None:
        clashes = [f.path for f in S.files if f.path not in tracked and os.path.lexists(os.path.join(directory, f.path))]
        if clashes and not force:
            raise LocalChangesError(f"{directory}: {', '.join(printable(p) for p in clashes[:10])} would be replaced "
                                    "by the new version's files, and no pull put them there",
                                    hint="--force replaces them; or move them away first")
        if clashes:
            A = scan(directory, rules=DEFAULT_RULES.tracking(tracked | set(clashes)))
    pair = Pair(A if A.files else None, S, reporter=SILENT)
    packed = pack_pair(pair, work.where(PENDING + ".new"), threads=threads)
    _apply(work, directory, state, src.url, held, run[-1].version.key, packed.target_fingerprint, threads, reporter)
    return packed.target_fingerprint, got


def _apply(work: StateDir, directory: str, state: StateDir, source: str, held: Held | None, version: str,
           target: bytes, threads: int, reporter: Reporter, trusted: TrustedBase | None = None) -> None:
    """The bundle packed at ``pending.wdb.new``, applied in place, with the
    version it brings recorded as pending first (see held.py). ``held``:
    the version DIR holds, None when the run does not build on it (then,
    should the apply not finish, no version is DIR's: the next pull needs
    --force)."""
    os.replace(work.where(PENDING + ".new"), work.where(PENDING))
    work.sync()
    before = held if held is not None else Held(source, "unknown", bytes(16))
    held_file.write(state, Held(source, before.version, before.fingerprint, (version, target)))
    apply_in_place(work.where(PENDING), directory, abort=False, threads=threads, reporter=reporter,
                   beside_locked=True, trusted=trusted)
