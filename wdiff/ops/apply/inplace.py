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
written. Interrupted, the next run with the same bundle finishes the job;
with ``abort=True`` it rolls the patch phase back. Other commands refuse to read
the directory meanwhile (see checkpoint.scan).
"""

from __future__ import annotations

import os

import numpy as np

from ...codec.dtypes import uint_type
from ...errors import BaseMismatchError, BusyError, IntegrityError, UsageError, WdiffIOError
from ...format.bundle import BundleReader, reading
from ...format.journal import JOURNAL_VERSION, Txn
from ...format.undo import UndoLog
from ...fsutil import fsync_dir, io_error, locked, remove_tree, write_all
from ...parallel import ordered_map
from ...paths import STATE_DIR, printable
from ...progress import SILENT, Reporter
from ...store import cache, manifest
from ...store.blockio import FdCache
from ...store.checkpoint import KIND_TENSORS, Checkpoint, read_into, scan
from ...store.digests import Digests
from ...store.hashing import hexd
from .checks import check_base_listing, check_target_digests, verify_bundle
from .engine import apply_unit, build
from .patch import patch_files, patch_items
from .result import ApplyResult


def apply_in_place(bundle, base, *, abort: bool, threads: int, reporter: Reporter = SILENT) -> ApplyResult:
    """See module doc. Holds ``BASE/.wdiff/lock`` throughout."""
    root = os.fspath(base)
    if not os.path.isdir(root):
        scan(root)  # raises the right error
    state = os.path.join(root, STATE_DIR)
    try:
        os.makedirs(state, exist_ok=True)
    except OSError as e:
        raise io_error(state, e) from None
    with locked(os.path.join(state, "lock"), what=root), reading(bundle) as reader:
        txn = Txn(os.path.join(state, "txn"))
        journal = txn.read_journal()
        if journal is not None and journal["bundle_id"] != hexd(reader.id):
            raise BusyError(
                f"{root}: an in-place apply of another bundle ({printable(journal.get('bundle_path', '?'))}) was interrupted here",
                hint="finish or abort that one first, with that bundle",
            )
        if abort:
            if journal is None:
                raise UsageError(f"{root}: no interrupted in-place apply to abort")
            _rollback(reader, root, txn, journal, threads=threads)
            reporter.done()
            return _result(reader, root, 0, resumed=True, target=reader.index.base_fingerprint)
        headers = known = None
        if journal is None:
            journal, headers, known = _start(reader, root, txn, threads=threads, reporter=reporter)
            if journal is None:  # already the target
                return _result(reader, root, 0, resumed=False)
            resumed = False
        else:
            resumed = True
        written = _run(reader, root, txn, journal, headers, threads=threads, reporter=reporter)
        if known is not None:
            cache.remember(scan(root), known)  # the next step's base is hashed already
    reporter.done()
    return _result(reader, root, written, resumed=resumed)


def _result(reader: BundleReader, root: str, written: int, *, resumed: bool, target: bytes | None = None) -> ApplyResult:
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
    )


def _start(reader: BundleReader, root: str, txn: Txn, *, threads: int, reporter: Reporter):
    index = reader.index
    A = check_base_listing(index, root)
    A = A if A is not None else scan(root)
    _refuse_shared_files(A)
    headers = verify_bundle(reader, A, reporter=reporter)
    base_digests = Digests()
    if index.base_fingerprint is not None:
        reporter.phase("check base", A.total_bytes)
        fp = manifest.complete(A, base_digests, threads=threads, reporter=reporter).fingerprint
        if fp != index.base_fingerprint:
            raise BaseMismatchError(
                f"{root}: fingerprint {hexd(fp)[:16]} is not the bundle's base {hexd(index.base_fingerprint)[:16]}"
            )
        if fp == index.target_fingerprint:
            return None, headers, None
    patch, stage = [], {}
    for i, f in enumerate(index.files):
        old = A.file(f.path)
        if f.kind == KIND_TENSORS and f.source == "base":
            patch.append(i)  # same path, same header: verified by verify_bundle
        elif (f.kind == "file" and f.source == "base" and old is not None and old.kind == "file"
              and old.size == f.size):
            continue  # unchanged companion file: the base fingerprint vouches for its digest, and the size matches
        else:
            stage[str(i)] = f.path
    _dry_run(reader, A, headers, set(patch), base_digests, threads=threads, reporter=reporter)
    target_paths = {f.path for f in index.files}
    journal = {
        "version": JOURNAL_VERSION,
        "bundle_id": hexd(reader.id),
        "bundle_path": os.path.abspath(reader.path),
        "base_fingerprint": hexd(index.base_fingerprint) if index.base_fingerprint else None,
        "target_fingerprint": hexd(index.target_fingerprint),
        "phase": "patch",
        "patch": patch,
        "stage": stage,
        "remove": [f.path for f in A.files if f.path not in target_paths],
    }
    # Stage before the journal exists: until it does, the transaction is
    # debris that the next run clears and that no reader sees, so a failure
    # or a crash while staging leaves the checkpoint fully usable.
    remove_tree(txn.path)
    try:
        os.makedirs(txn.stage)
        outputs = {int(i): os.path.join(txn.stage, i) for i in stage}
        _, staged = build(reader, A, headers, outputs, threads=threads, reporter=reporter, check_base=False)
        base_digests.tensors.update(staged.tensors)
        base_digests.files.update(staged.files)
        fsync_dir(txn.stage)
        txn.write_journal(journal)
        fsync_dir(os.path.dirname(txn.path))
    except OSError as e:
        remove_tree(txn.path)
        raise io_error(txn.path, e) from None
    except BaseException:
        remove_tree(txn.path)
        raise
    return journal, headers, base_digests


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


def _run(reader: BundleReader, root: str, txn: Txn, journal: dict, headers, *, threads: int, reporter: Reporter) -> int:
    A = scan(root, allow_unfinished=True)
    phase = journal["phase"]
    stage = {int(k): v for k, v in journal["stage"].items()}
    written = sum(os.path.getsize(os.path.join(txn.stage, str(i))) for i in stage if os.path.exists(os.path.join(txn.stage, str(i))))
    if phase == "patch" and headers is None:
        headers = verify_bundle(reader, A, reporter=reporter)
    if phase == "patch":
        try:
            written += patch_files(reader, A, headers, set(journal["patch"]), txn, threads=threads, reporter=reporter)
        except WdiffIOError as e:
            # a full disk or a refused write: put every patched chunk back (that
            # needs no new space) so that the checkpoint is the base again
            try:
                _rollback(reader, root, txn, journal, threads=threads)
            except Exception:  # noqa: BLE001 - the journal stays; --abort can retry
                raise e from None
            raise WdiffIOError(f"{e.message}; the in-place apply was rolled back", hint=e.hint) from None
        journal = dict(journal, phase="commit")
        txn.write_journal(journal)
        phase = "commit"
    if phase != "commit":
        raise IntegrityError(f"{txn.journal}: unknown phase {phase!r}")
    _commit(root, txn, stage, journal["remove"])
    return written


def _commit(root: str, txn: Txn, stage: dict[int, str], remove: list[str]) -> None:
    """Remove what the target lacks, then rename staged files into place.
    Removals go first: a path can turn from a file into a directory or back.
    Every step is idempotent, so a rerun after a crash finishes the job."""
    dirs = {root}
    try:
        for path in remove:
            p = os.path.join(root, path)
            if os.path.lexists(p) and not os.path.isdir(p):
                os.unlink(p)
            d = os.path.dirname(p)
            while d != root and os.path.isdir(d) and not os.listdir(d):
                os.rmdir(d)
                d = os.path.dirname(d)
            dirs.add(d)
        for i, path in sorted(stage.items()):
            src = os.path.join(txn.stage, str(i))
            dst = os.path.join(root, path)
            if os.path.exists(src):
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                os.replace(src, dst)
                dirs.add(os.path.dirname(dst))
        for d in dirs:
            if os.path.isdir(d):
                fsync_dir(d)
    except OSError as e:
        raise io_error(f"{root}: committing the in-place apply", e) from None
    txn.remove()


# -- rollback --------------------------------------------------------------------


def _rollback(reader: BundleReader, root: str, txn: Txn, journal: dict, *, threads: int) -> None:
    if journal["phase"] == "commit":
        raise BusyError(
            f"{root}: the interrupted apply was already committing and cannot be rolled back",
            hint="run it again without --abort to finish it",
        )
    if journal["phase"] == "patch":  # undo what was patched; staged files are simply dropped
        A = scan(root, allow_unfinished=True)
        entries = UndoLog(txn.undo).load()
        by_path: dict[str, int] = {}
        try:
            for (i, lo), e in sorted(entries.items()):
                f = A.file(reader.index.files[i].path)
                if f is None or f.header is None:
                    raise IntegrityError(f"{root}: a file patched in place is missing")
                fd = by_path.get(f.abspath)
                if fd is None:
                    fd = by_path[f.abspath] = os.open(f.abspath, os.O_RDWR)
                buf = np.empty(e.hi - lo, dtype=np.uint8)
                read_into(fd, f.header.data_start + lo, memoryview(buf), where=f.abspath)
                e.restore(buf.view(uint_type(e.word)))
                write_all(fd, buf, f.header.data_start + lo)
            for fd in by_path.values():
                os.fsync(fd)
        finally:
            for fd in by_path.values():
                os.close(fd)
        # every chunk is now back to its base bytes: check what we can cheaply
        if reader.index.base_fingerprint is not None:
            fp = manifest.compute(scan(root, allow_unfinished=True), threads=threads).fingerprint
            if fp != reader.index.base_fingerprint:
                raise IntegrityError(f"{root}: rollback did not restore the base (fingerprint {hexd(fp)[:16]})")
    txn.remove()
