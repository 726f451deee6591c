"""``apply --in-place``: update a checkpoint inside its own directory, for
checkpoints too large to copy, without ever leaving an unexplained mix.

The directory holds ``.wdiff/txn/`` while an apply runs:

``journal.json``  which bundle, which phase, what to stage, patch and remove
``stage/N``       complete, verified new files (new shards, changed companions)
``undo.log``      for every chunk patched in place: positions and old values

Steps:

1. *verify*: check the bundle, the base fingerprint, and decode every patch
   without writing it to check the tensors it yields against the index.
2. *stage*: build every file whose layout changes into ``stage/``, then write
   the journal. Before the journal exists the checkpoint is untouched and
   ``txn/`` is debris that readers ignore and the next run clears.
3. *patch* (journal phase "patch"): tensor files whose header is unchanged
   are patched chunk by chunk.
   A batch's undo entries are fsynced before its bytes are written, so every
   chunk is the base, the target, or a torn write the undo log can restore.
4. *commit* (journal phase "commit"): remove files the target lacks, rename
   staged files into place, delete the transaction.

Every chunk is checked against the base and target digests before it is
written. ``DIR/.wdiff`` and everything in it is reached through
wdiff.statedir (no links, no other user's directories), and the journal is
input: the plan is derived again from the bundle (:func:`derive_plan`) and a
journal whose plan differs is refused. A resumed apply checks every staged
file before it patches, and the whole result against the target's digests
before it commits, so "finished" always means "verified".
Interrupted, the next run with the same bundle finishes the job;
with ``abort=True`` it rolls the patch phase back. Other commands refuse to read
the directory meanwhile (see checkpoint.scan).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from ...errors import BaseMismatchError, BusyError, IntegrityError, UsageError, WdiffIOError
from ...format.bundle import BundleReader, reading
from ...format.journal import JOURNAL_VERSION, Journal, Plan, Txn  # noqa: F401 - JOURNAL_VERSION: re-exported
from ...fsutil import beside_lock_path, fsync_dir, io_error, locked_beside
from ...parallel import ordered_map
from ...paths import printable
from ...progress import SILENT, Reporter
from ...statedir import StateDir
from ...store import manifest, version_record
from ...store.blockio import FdCache
from ...store.checkpoint import KIND_TENSORS, Checkpoint, path_sort_key, scan
from ...store.digests import Digests
from ...store.hashing import fingerprint, hexd
from ...store.ignore import DEFAULT_RULES, Rules
from .checks import check_base_listing, check_target_digests, judge_base_mismatch, verify_bundle
from .commit import commit, real_parents, rollback, staged_files, verify_result
from .engine import apply_unit, build_checked, remember_output
from .patch import patch_files, patch_items
from .result import ApplyResult


@dataclass(frozen=True)
class TrustedBase:
    """What a caller knows of BASE because it read and hashed it itself, in
    this process, just before (the Publisher, which compared its tensors
    with the mirror chunk by chunk): never digests from a cache on disk.

    ``checkpoint``: BASE as scanned before it was read (the stat keys name
    the bytes that were hashed); ``digests``: the block digests of every
    tensor and companion file of it; ``fingerprint``: the manifest
    fingerprint they give.

    An in-place apply given it hashes nothing it does not patch: it takes
    these digests for BASE where the files are still those (same paths,
    sizes and stat keys, and the digests give the bundle's base
    fingerprint; otherwise it ignores them and checks everything), skips the
    dry run, and checks the result instead, after the patch phase and
    before the commit, from the block digests of the bytes it wrote (every
    chunk is still checked against its base and target digests as it is
    read and written); a result that is not the target is rolled back from
    the undo log. The journal, undo log and fsyncs are the same."""

    checkpoint: Checkpoint
    digests: Digests
    fingerprint: bytes

    def same_files(self, A: Checkpoint) -> bool:
        """``A`` lists the files hashed, with the same sizes and stat keys."""
        def key(c: Checkpoint) -> list:
            return [(f.path, f.kind, f.size, f.stat_key) for f in c.files]

        return key(A) == key(self.checkpoint) and all(f.stat_key != (0, 0, 0, 0, 0) for f in A.files)

    def holds(self, A: Checkpoint, index) -> Digests | None:
        """A copy of the digests, when ``A`` (scanned now) is the checkpoint
        they were hashed from and they give the bundle's base fingerprint."""
        if index.base_fingerprint is None or self.fingerprint != index.base_fingerprint or not self.same_files(A):
            return None
        d = Digests()
        d.tensors = {k: bytes(v) for k, v in self.digests.tensors.items()}  # put_unit updates bytearrays in place
        d.files = dict(self.digests.files)
        if any(f.kind == KIND_TENSORS and any(t.nbytes and t.name not in d.tensors for t in f.header.tensors)
               or f.kind != KIND_TENSORS and f.path not in d.files for f in A.files):
            return None
        rows = [(m.path, m.kind, m.size, m.digest) for m in d.manifest(A).files]
        if fingerprint(sorted(rows, key=lambda r: path_sort_key(r[0]))) != self.fingerprint:
            return None
        return d


def derive_plan(index) -> Plan:
    """What an in-place apply of ``index`` patches, stages and removes: a pure
    function of the bundle (its base listing, which the base must match)."""
    base = {r.path: r for r in index.base_files}
    patch, stage = [], []
    for i, f in enumerate(index.files):
        old = base.get(f.path)
        if f.kind == KIND_TENSORS and f.source == "base":
            patch.append(i)  # same path, same header: verified by verify_bundle
        elif f.kind == "file" and f.source == "base" and old is not None and old.kind == "file" and old.size == f.size:
            continue  # unchanged companion file: the base fingerprint vouches for its digest, and the size matches
        else:
            stage.append((i, f.path))
    target = {f.path for f in index.files}
    remove = sorted((r.path for r in index.base_files if r.path not in target), key=path_sort_key)
    return Plan(tuple(patch), tuple(stage), tuple(remove))


def apply_in_place(bundle, base, *, abort: bool, threads: int, reporter: Reporter = SILENT,
                   rules: Rules = DEFAULT_RULES, replace: frozenset[str] = frozenset(),
                   over: bool = False, beside_locked: bool = False, trusted: TrustedBase | None = None) -> ApplyResult:
    """See module doc. Holds the lock beside BASE (every writer of BASE
    does; ``beside_locked``: the caller, a pull, holds it already) and
    ``BASE/.wdiff/lock`` throughout.

    Where ``BASE/.wdiff/state.json`` records the version BASE holds, files
    it does not list (nor the bundle's base) are untracked: never read,
    replaced or removed. ``replace``: files of BASE whose local content is
    discarded (pull --force): the base check takes the bundle's own row for
    them, and each must be one the bundle writes whole or removes. ``over``:
    an anchor may be applied over the files of the recorded version, which
    it replaces (and those it lacks are removed: only recorded ones).
    ``trusted``: see :class:`TrustedBase` (used only for a fresh start of a
    delta, with no ``replace``)."""
    root = os.fspath(base)
    if replace or over:
        trusted = None
    if not os.path.isdir(root):
        scan(root)  # raises the right error
    beside = contextlib.nullcontext() if beside_locked else _writers_lock(root)
    with beside, StateDir.open(root) as state, state.lock(what=root), reading(bundle) as reader:
        recorded = version_record.read(state)
        rules, target_rules = _narrowed(rules, recorded, reader.index, replace)
        txn = Txn(state)
        journal = txn.read_journal()
        if journal is not None and journal.bundle_id != hexd(reader.id):
            raise BusyError(
                f"{root}: an in-place apply of another bundle ({printable(journal.bundle_path)}) was interrupted here",
                hint="finish or abort that one first, with that bundle",
            )
        plan = derive_plan(reader.index)
        if journal is not None and journal.plan != plan:
            raise IntegrityError(
                f"{txn.journal}: the journal's plan is not the one bundle {hexd(reader.id)[:12]} gives for this directory",
                hint="the journal was not written by this apply; if you trust the directory, remove its .wdiff/txn",
            )
        if abort:
            if journal is None:
                raise UsageError(f"{root}: no interrupted in-place apply to abort")
            rollback(reader, root, txn, journal, threads=threads, rules=rules)
            reporter.done()
            return _result(reader, root, 0, resumed=True, target=reader.index.base_fingerprint)
        headers = known = None
        if over and reader.index.base_fingerprint is not None:
            raise UsageError(f"{reader.path}: only an anchor can be applied over a checkpoint's files")
        old = scan(root, rules=rules).files if over and recorded is not None and journal is None else ()
        if journal is None:
            started = _start(reader, root, txn, plan, threads=threads, reporter=reporter, rules=rules,
                             target_rules=target_rules, replace=replace, over=over, trusted=trusted)
            if started is None:  # already the target
                _record(state, reader.index)
                reporter.done()
                return _result(reader, root, 0, resumed=False, already=True)
            journal, headers, known, checked = started
            resumed = False
        else:
            resumed, checked = True, True
        written = _run(reader, root, txn, journal, headers, resumed=resumed, threads=threads, reporter=reporter,
                       rules=rules, check_into=None if checked else known,
                       reuse=trusted.checkpoint if trusted is not None else None)
        _remove_recorded(root, [f.path for f in old], reader.index)
        _record(state, reader.index)
        if known is not None:
            remember_output(root, reader.index, headers, known)  # never fails: the target is in place
    reporter.done()
    return _result(reader, root, written, resumed=resumed)


@contextlib.contextmanager
def _writers_lock(root: str):
    """The lock beside ``root`` that a pull holds, so that an in-place apply
    and a pull never write (or read half-written) the same directory at
    once. Where the parent cannot hold it, no pull can take it either, and
    ``root/.wdiff/lock`` alone guards the directory."""
    path = beside_lock_path(root)
    if not os.access(os.path.dirname(path), os.W_OK):
        yield
        return
    with locked_beside(path, what=root):
        yield


def _narrowed(rules: Rules, recorded: version_record.Record | None, index, replace) -> tuple[Rules, Rules]:
    """The rules for DIR as a base, and as the target: with a record, only
    the files it lists, those of the bundle's base (and those to replace)
    are DIR's checkpoint; as the target, the target's files as well."""
    if recorded is None:
        return rules, rules
    base = recorded.paths | {r.path for r in index.base_files} | frozenset(replace)
    return rules.tracking(base), rules.tracking(base | {f.path for f in index.files})


def _record(state: StateDir, index) -> None:
    """DIR holds the bundle's target now: say so, and which files are its."""
    rec = version_record.of_rows((f.path, f.kind, f.size, f.digest) for f in index.files)
    if rec.version == index.target_fingerprint:
        version_record.write(state, rec)
    else:  # never a record that does not describe what is there
        version_record.forget(state)


def _remove_recorded(root: str, paths: list[str], index) -> None:
    """After an anchor was applied over the recorded version: remove the
    files of that version that the target lacks (only those: paths the
    record listed and a scan found, validated by both)."""
    target = {f.path for f in index.files}
    dirs = set()
    try:
        for path in sorted(set(paths) - target, key=path_sort_key):
            p = real_parents(root, path, create=False)
            if os.path.lexists(p) and not os.path.isdir(p):
                os.unlink(p)
                d = os.path.dirname(p)
                while d != root and os.path.isdir(d) and not os.path.islink(d) and not os.listdir(d):
                    os.rmdir(d)
                    d = os.path.dirname(d)
                dirs.add(d)
        for d in dirs:
            if os.path.isdir(d):
                fsync_dir(d)
    except OSError as e:
        raise io_error(f"{root}: removing the files the new version lacks", e) from None


def _result(reader: BundleReader, root: str, written: int, *, resumed: bool, target: bytes | None = None,
            already: bool = False) -> ApplyResult:
    ix = reader.index
    return ApplyResult(
        output=root,
        bundle_id=reader.id,
        base_fingerprint=ix.base_fingerprint,
        target_fingerprint=target if target is not None else ix.target_fingerprint,
        files=len(ix.files),
        bytes_written=written,
        in_place=True,
        resumed=resumed,
        already=already,
    )


def _is_target(index, A: Checkpoint, *, threads: int, reporter: Reporter) -> bool:
    if [(f.path, f.kind, f.size) for f in A.files] != [(f.path, f.kind, f.size) for f in index.files]:
        return False
    reporter.phase("check target", A.total_bytes)
    return manifest.compute(A, threads=threads, reporter=reporter).fingerprint == index.target_fingerprint


def _start(reader: BundleReader, root: str, txn: Txn, plan: Plan, *, threads: int, reporter: Reporter,
           rules: Rules = DEFAULT_RULES, target_rules: Rules = DEFAULT_RULES, replace=frozenset(), over=False,
           trusted: TrustedBase | None = None):
    """Verify and stage; returns None (already the target) or (journal,
    headers, digests, checked): ``checked`` False when the dry run was left
    out (a trusted base) and the patch phase must check the result."""
    index = reader.index
    known = None
    if trusted is not None:  # BASE as the caller hashed it, if it is still that: not the target
        known = trusted.holds(scan(root, rules=rules, reuse=trusted.checkpoint), index)
    if known is None and index.files and _is_target(index, scan(root, rules=target_rules), threads=threads,
                                                    reporter=reporter):
        return None
    try:
        A = check_base_listing(index, root, rules=rules, in_place=True, replace=replace, over=over)
    except BaseMismatchError as e:
        raise BaseMismatchError(
            f"{e.message}; this bundle turns {hexd(index.base_fingerprint or b'')[:16] or 'nothing'} "
            f"into {hexd(index.target_fingerprint)[:16]}",
            hint=f"`wdiff verify {root} --bundle BUNDLE` names what differs from its target; "
                 "`wdiff status DIR REMOTE` says which version DIR is",
        ) from None
    A = A if A is not None else scan(root, rules=rules)
    if over:
        A = Checkpoint(root=A.root, files=(), excluded=A.excluded)  # every file is replaced: none is read
    gone = [f for f in A.files if f.path in replace]
    if gone:  # their content here is discarded: never read, the bundle's rows stand for them
        A = Checkpoint(root=A.root, files=tuple(f for f in A.files if f.path not in replace), excluded=A.excluded)
        _refuse_unrestorable(index, plan, replace)
    _refuse_shared_files(A)
    try:
        headers = verify_bundle(reader, A, reporter=reporter)
    except BaseMismatchError as e:  # a base header the bundle expects: another base, or a false claim
        raise judge_base_mismatch(e, index, A, threads=threads) from None
    if known is not None and not trusted.same_files(A):
        known = None  # changed since the first look: check everything
    base_digests = known if known is not None else Digests()
    fp = index.base_fingerprint if known is not None else None
    if index.base_fingerprint is not None and known is None:
        reporter.phase("check base", A.total_bytes)
        m = manifest.complete(A, base_digests, threads=threads, reporter=reporter)
        rows = [(d.path, d.kind, d.size, d.digest) for d in m.files]
        rows += [(r.path, r.kind, r.size, r.digest) for r in index.base_files if r.path in replace]
        fp = fingerprint(sorted(rows, key=lambda r: path_sort_key(r[0])))
        if fp != index.base_fingerprint:
            raise BaseMismatchError(
                f"{root}: fingerprint {hexd(fp)[:16]} is neither the bundle's base {hexd(index.base_fingerprint)[:16]} "
                f"nor its target {hexd(index.target_fingerprint)[:16]}",
                hint=f"`wdiff verify {root} --bundle BUNDLE` names what differs from its target",
            )
    try:
        if known is None:
            _dry_run(reader, A, headers, set(plan.patch), base_digests, threads=threads, reporter=reporter)
    except BaseMismatchError as e:  # the base is the bundle's base (fp above): a chunk's base digest is false
        raise judge_base_mismatch(e, index, A, threads=threads, fingerprint=fp) from None
    journal = Journal(
        bundle_id=hexd(reader.id),
        bundle_path=os.path.abspath(reader.path),
        base_fingerprint=hexd(index.base_fingerprint) if index.base_fingerprint else None,
        target_fingerprint=hexd(index.target_fingerprint),
        phase="patch",
        plan=plan,
    )
    # Stage before the journal exists: until it does, the transaction is
    # debris that the next run clears and that no reader sees, so a failure
    # or a crash while staging leaves the checkpoint fully usable.
    try:
        txn.clear()
        with txn.stage_dir(create=True) as stage:
            outputs = {i: stage.where(str(i)) for i, _ in plan.stage}
            _, staged = build_checked(reader, A, headers, outputs, threads=threads, reporter=reporter,
                                      base_fingerprint=fp or b"")
            base_digests.tensors.update(staged.tensors)
            base_digests.files.update(staged.files)
            stage.sync()
        txn.write_journal(journal)
        txn.state.sync()
    except OSError as e:
        _discard(txn)
        raise io_error(txn.path, e) from None
    except BaseException:
        _discard(txn)
        raise
    return journal, headers, base_digests, known is None


def restorable(index, replace) -> list[str]:
    """The paths of ``replace`` that applying ``index`` in place cannot
    restore: only a companion file that the bundle writes whole (or removes)
    can be taken from it, whatever it holds here now."""
    base = {r.path: r for r in index.base_files}
    target = {f.path: f for f in index.files}
    bad = []
    for p in sorted(replace, key=path_sort_key):
        b, t = base.get(p), target.get(p)
        if (b is not None and b.kind != "file") or (b is None and t is None):
            bad.append(p)
        elif t is not None and t.source in ("base", "delta"):  # "delta": built from what is there
            bad.append(p)
    return bad


def _refuse_unrestorable(index, plan: Plan, replace) -> None:
    bad = restorable(index, replace)
    staged = {path for _, path in plan.stage} | set(plan.remove)
    bad += [p for p in replace if p not in staged and p not in bad]
    if bad:
        raise BaseMismatchError(
            f"this bundle cannot restore {', '.join(printable(p) for p in bad[:20])}: it does not carry "
            f"{'it' if len(bad) == 1 else 'them'} whole",
            hint="pull --force restores such files from an anchor",
        )


def _discard(txn: Txn) -> None:
    try:
        txn.remove()
    except Exception:  # noqa: BLE001 - debris the next run clears; the first error is the one to report
        pass


def _dry_run(reader, A: Checkpoint, headers, patch: set[int], digests: Digests, *, threads: int, reporter) -> None:
    """Decode every in-place patch without writing it and check the tensors
    it produces (patched chunks over the base's other blocks) against the
    target digests, so nothing is changed unless the whole result is right."""
    if not patch:
        return
    reporter.phase("verify patch", None)
    with FdCache() as fds:

        def work(item):
            where = printable(item.entry.path)
            return apply_unit(fds, -1, item.entry.header.data_start, item.unit, item.record, where=where)

        for done in ordered_map(work, patch_items(reader, A, headers, patch), threads=threads):
            digests.put_unit(done.unit, done.target_digests)
    check_target_digests(reader.index, headers, digests, only=patch)


def _refuse_shared_files(A: Checkpoint) -> None:
    for f in A.files:
        st = os.lstat(f.abspath)
        if os.path.islink(f.abspath) or st.st_nlink > 1:
            raise UsageError(
                f"{A.root}: {printable(f.path)} is a link; patching it in place would change other copies",
                hint="apply into a new directory with -o instead",
            )


def _run(reader: BundleReader, root: str, txn: Txn, journal: Journal, headers, *, resumed: bool, threads: int,
         reporter: Reporter, rules: Rules = DEFAULT_RULES, check_into: Digests | None = None,
         reuse: Checkpoint | None = None) -> int:
    """The patch and commit phases. ``check_into``: the base's digests, when
    no dry run checked the patches (a trusted base): the patch phase puts
    the digests of what it writes into them, and a result that is not the
    target's tensors is rolled back before the commit. ``reuse``: a scan of
    BASE whose byte-identical headers need not be parsed again."""
    A = scan(root, allow_unfinished=True, rules=rules, reuse=reuse)
    plan = journal.plan
    phase = journal.phase
    staged = staged_files(reader, root, txn, plan, require_all=phase == "patch") if resumed else None
    written = sum(reader.index.files[i].size for i, _ in plan.stage)
    if phase == "patch" and headers is None:
        headers = verify_bundle(reader, A, reporter=reporter)
    if phase == "patch":
        with txn.dir() as tdir:
            try:
                written += patch_files(reader, A, headers, set(plan.patch), tdir, threads=threads, reporter=reporter,
                                       digests=check_into)
                if check_into is not None:
                    check_target_digests(reader.index, headers, check_into, only=set(plan.patch))
            except IntegrityError as e:
                if check_into is None:
                    raise
                try:  # no dry run vouched for this bundle's patches: put the base back
                    rollback(reader, root, txn, journal, threads=threads, rules=rules)
                except Exception:  # noqa: BLE001 - the journal stays; --abort can retry
                    raise e from None
                raise IntegrityError(f"{e.message}; the in-place apply was rolled back", hint=e.hint) from None
            except WdiffIOError as e:
                # a full disk or a refused write: put every patched chunk back (that
                # needs no new space) so that the checkpoint is the base again
                try:
                    rollback(reader, root, txn, journal, threads=threads, rules=rules)
                except Exception:  # noqa: BLE001 - the journal stays; --abort can retry
                    raise e from None
                raise WdiffIOError(f"{e.message}; the in-place apply was rolled back", hint=e.hint) from None
        journal = journal.with_phase("commit")
        txn.write_journal(journal)
    if resumed:
        verify_result(reader, root, staged, threads=threads, reporter=reporter)
    commit(root, txn, plan)
    return written
