"""The end of an in-place apply's transaction (see :mod:`.inplace`): the
staged files and, for a resumed apply, the whole result checked against the
target's digests before anything is committed; the commit (removals, then
renames, then fsyncs of every directory touched, each step idempotent); and
the rollback of the patch phase from the undo log.
"""

from __future__ import annotations

import os
import stat

import numpy as np

from ...codec.dtypes import uint_type
from ...errors import BusyError, IntegrityError, WdiffIOError
from ...format.bundle import BundleReader
from ...format.journal import Journal, Plan, Txn
from ...format.undo import UndoLog
from ...fsutil import fsync_dir, io_error, write_all
from ...paths import printable
from ...progress import Reporter
from ...store import manifest
from ...store.checkpoint import Checkpoint, entry_at, path_sort_key, read_into, scan
from ...store.hashing import hexd
from ...store.ignore import DEFAULT_RULES, Rules


def staged_files(reader: BundleReader, root: str, txn: Txn, plan: Plan, *, require_all: bool) -> dict[int, str]:
    """The staged files of a resumed apply that are still to be renamed into
    place, each checked against the target's digest now; a file that is not
    the bundle's is refused before anything is written."""
    index = reader.index
    out: dict[int, str] = {}
    stage = txn.stage_dir()
    if stage is None:
        if require_all and plan.stage:
            raise IntegrityError(f"{txn.stage}: the staged files of the interrupted apply are missing",
                                 hint="run it again with --abort, then apply again")
        return out
    with stage:
        for i, path in plan.stage:
            k = stage.kind(str(i))
            if k is None:
                if require_all:
                    raise IntegrityError(f"{stage.where(str(i))}: staged file for {printable(path)} is missing",
                                         hint="run it again with --abort, then apply again")
                continue
            if k != "file":
                raise IntegrityError(f"{stage.where(str(i))}: is not a plain file")
            out[i] = stage.where(str(i))
        entries = [entry_at(root, index.files[i].path, p) for i, p in out.items()]
    bad = _differ(index, entries)
    if bad:
        raise IntegrityError(
            f"{txn.stage}: staged {', '.join(printable(p) for p in bad[:20])} "
            f"{'is' if len(bad) == 1 else 'are'} not the bundle's target; nothing was changed",
            hint="the transaction was not written by this apply; run it again with --abort, then apply again",
        )
    return out


def _differ(index, entries) -> list[str]:
    """Paths (by target path) whose content is not the target's."""
    if not entries:
        return []
    want = {f.path: f for f in index.files}
    ckpt = Checkpoint(root="", files=tuple(sorted(entries, key=lambda e: path_sort_key(e.path))))
    m = manifest.compute(ckpt, threads=1, use_cache=False)
    return [d.path for d in m.files
            if (d.kind, d.size, d.digest) != (want[d.path].kind, want[d.path].size, want[d.path].digest)]


def verify_result(reader: BundleReader, root: str, staged: dict[int, str], *, threads: int,
                   reporter: Reporter) -> None:
    """Before a resumed apply commits: what DIR will hold (its files, with the
    staged ones in their places) is the target, file by file and digest by
    digest; otherwise nothing is committed and the differing files are named."""
    index = reader.index
    entries, missing = [], []
    for i, f in enumerate(index.files):
        if i in staged:
            continue  # checked by staged_files
        p = os.path.join(root, f.path)
        try:
            entries.append(entry_at(root, f.path, p))
        except WdiffIOError:
            missing.append(f.path)
    reporter.phase("verify", sum(e.size for e in entries))
    bad = missing + _differ(index, entries)
    if bad:
        raise IntegrityError(
            f"{root}: {', '.join(printable(p) for p in bad[:20])} {'is' if len(bad) == 1 else 'are'} not what the "
            f"bundle's target holds; the directory changed while the apply was unfinished",
            hint="restore those files (or the whole checkpoint) from a good copy; nothing was committed",
        )


def real_parents(root: str, path: str, *, create: bool) -> str:
    """``root/path``, after checking that every directory on the way is a
    real directory inside ``root`` (no link can take a write elsewhere)."""
    d = root
    for part in path.split("/")[:-1]:
        d = os.path.join(d, part)
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            if not create:
                return os.path.join(root, path)
            os.mkdir(d)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise IntegrityError(f"{d}: is not a directory inside {root}; nothing is written through it")
    return os.path.join(root, path)


def commit(root: str, txn: Txn, plan: Plan) -> None:
    """Remove what the target lacks, then rename staged files into place.
    Removals go first: a path can turn from a file into a directory or back.
    Every step is idempotent, so a rerun after a crash finishes the job.
    Every path comes from the bundle (derive_plan), checked like all bundle paths."""
    dirs = {root}
    try:
        for path in plan.remove:
            p = real_parents(root, path, create=False)
            if os.path.lexists(p) and not os.path.isdir(p):
                os.unlink(p)
            d = os.path.dirname(p)
            while d != root and os.path.isdir(d) and not os.path.islink(d) and not os.listdir(d):
                os.rmdir(d)
                d = os.path.dirname(d)
            dirs.add(d)
        stage = txn.stage_dir()
        if stage is not None:
            with stage:
                for i, path in plan.stage:
                    if stage.kind(str(i)) != "file":
                        continue
                    src = stage.where(str(i))
                    dst = real_parents(root, path, create=True)
                    _keep_mode(src, dst)
                    os.replace(src, dst)
                    dirs.add(os.path.dirname(dst))
        for d in dirs:
            if os.path.isdir(d):
                fsync_dir(d)
    except OSError as e:
        raise io_error(f"{root}: committing the in-place apply", e) from None
    txn.remove()


def _keep_mode(src: str, dst: str) -> None:
    """A file replaced by its new version keeps its permission bits."""
    try:
        st = os.lstat(dst)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode):
        os.chmod(src, stat.S_IMODE(st.st_mode))


# -- rollback --------------------------------------------------------------------


def rollback(reader: BundleReader, root: str, txn: Txn, journal: Journal, *, threads: int,
             rules: Rules = DEFAULT_RULES) -> None:
    """``--abort``: restore every chunk the patch phase wrote from the undo
    log, drop the staged files, check the base's fingerprint, end the
    transaction (refused once the commit has begun)."""
    if journal.phase == "commit":
        raise BusyError(
            f"{root}: the interrupted apply was already committing and cannot be rolled back",
            hint="run it again without --abort to finish it",
        )
    # undo what was patched; staged files are simply dropped
    A = scan(root, allow_unfinished=True, rules=rules)
    patchable = set(journal.plan.patch)
    with txn.dir() as tdir:
        entries = UndoLog(tdir).load()
    by_path: dict[str, int] = {}
    try:
        for (i, lo), e in sorted(entries.items()):
            if i not in patchable:
                raise IntegrityError(f"{txn.undo}: an entry names file {i}, which this apply does not patch")
            f = A.file(reader.index.files[i].path)
            if f is None or f.header is None:
                raise IntegrityError(f"{root}: a file patched in place is missing")
            if e.hi > f.header.data_len:
                raise IntegrityError(f"{txn.undo}: an entry lies outside {printable(f.path)}")
            fd = by_path.get(f.abspath)
            if fd is None:
                fd = by_path[f.abspath] = os.open(f.abspath, os.O_RDWR | os.O_NOFOLLOW)
            buf = np.empty(e.hi - lo, dtype=np.uint8)
            read_into(fd, f.header.data_start + lo, memoryview(buf), where=f.abspath)
            e.restore(buf.view(uint_type(e.word)))
            write_all(fd, buf, f.header.data_start + lo)
        for fd in by_path.values():
            os.fsync(fd)
    except OSError as e:
        raise io_error(f"{root}: rolling back", e) from None
    finally:
        for fd in by_path.values():
            os.close(fd)
    # every chunk is now back to its base bytes: check what we can cheaply
    if reader.index.base_fingerprint is not None:
        fp = manifest.compute(scan(root, allow_unfinished=True, rules=rules), threads=threads).fingerprint
        if fp != reader.index.base_fingerprint:
            raise IntegrityError(f"{root}: rollback did not restore the base (fingerprint {hexd(fp)[:16]})")
    txn.remove()
