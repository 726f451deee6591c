"""The disk a pull needs, from the plan it will really take, checked before
it writes anything.

A pull's plan is a run of bundles and a way to apply them: *in place* (a
run of deltas from the version DIR holds: the files whose layout changes
are staged whole, the rest patched where they lie, with an undo log) or
*whole* (from an anchor: into an empty DIR, over a recorded one, rebuilt
beside DIR, or ``--atomic`` beside the link's target: every file of the
new version is written while the old ones still stand; ``--atomic
--keep`` removes old versions only after the link is switched, so the
space that frees is never counted as free here). What it takes:

* downloads: the run's bundles, less what the work area already holds
  (a verified bundle, the parts of an interrupted download), plus the
  largest of them once more (its parts stand beside the assembled bundle
  until it verifies);
* new files: the sizes the bundles' indexes give, each index checked
  against the bundle id the verified chain names. A pull reads nothing
  from the remote but the chain and its bundles (one URL per part, which a
  fleet's cache serves; a ranged read of each index would be a second
  request per part, and through a caching proxy possibly a second whole
  read), so the indexes are read once the bundles are in the work area,
  and the new files checked then, before DIR is touched: a pull that made
  DIR/.wdiff removes its downloads (and DIR, if it made it) on that
  refusal, another keeps them for the next pull. Where the work area holds
  the bundles already (a resumed pull), the first check is exact;
* temporary space: a squash of a run of several bundles (counted as the
  sum of their sizes) and, in place, the undo log (counted as twice the
  run's bytes: it holds the positions and old values of the words the
  deltas change, which the deltas hold as new values). Both are estimates,
  not bounds the format enforces.

The check before the download counts the downloads and temporary space;
the check after it is exact.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from ...errors import WdiffIOError
from ...format.bundle import BundleReader
from ...ops.apply.inplace import derive_plan
from ...progress import SILENT, Reporter, size_text
from ...statedir import StateDir
from ..fetch import work_names


class NoSpace(WdiffIOError):
    """The disk lacks what the pull's plan needs (exit status 9, as any full disk)."""


@dataclass(frozen=True)
class Need:
    """Bytes a pull will write, by what writes them."""

    downloads: int
    files: int  # the new version's files: staged in place, or the whole rebuilt checkpoint
    temporary: int  # parts beside their bundle, a squash, an undo log
    exact: bool = True  # False: not every bundle is in the work area yet, ``files`` is 0 (unknown)

    @property
    def total(self) -> int:
        return self.downloads + self.files + self.temporary


def to_download(run, work: StateDir | None) -> int:
    """Bytes of ``run`` a pull still downloads, given what the work area
    ``work`` holds (an interrupted pull's bundles and parts)."""
    return need_of(run, work, whole=False).downloads if run else 0


def need_of(run, work: StateDir | None, *, whole: bool) -> Need:
    """What applying ``run`` (in place, or ``whole``) will write, given what
    the work area ``work`` holds already (None: no work area yet)."""
    found = [_index(e, work) for e in run]
    remaining, partial = [], 0
    for e in run:
        names = work_names(e)
        if work is not None and _size(work, names[0]) == e.size:
            continue  # assembled already: it occupies its place on the disk
        remaining.append(e)
        if work is not None:
            partial += sum(min(_size(work, n) or 0, p.size) for n, p in zip(names[1:], e.parts))
    downloads = max(0, sum(e.size for e in remaining) - partial)
    temporary = max((e.size for e in remaining), default=0)  # a bundle's parts beside it
    run_bytes = sum(e.size for e in run)
    if len(run) > 1:
        temporary += run_bytes  # the squash of the run
    if not whole:
        temporary += 2 * run_bytes  # the undo log
    if any(i is None for i in found):
        return Need(downloads, 0, temporary, exact=False)
    last = found[-1]
    if whole:
        files = sum(f.size for f in last.files)
    else:
        staged = {p for index in found for _, p in derive_plan(index).stage}
        files = sum(f.size for f in last.files if f.path in staged)
    return Need(downloads, files, temporary)


def check(need: Need, *, work_at: str, files_at: str, what: str, reporter: Reporter = SILENT) -> None:
    """Refuse, with nothing written, when the disks lack what ``need`` says:
    the downloads and temporary space on the work area's file system, the
    new files on that of ``files_at`` (the same one, but for --atomic).
    ``reporter`` notes (-v) what the pull needs and what the disks have."""
    want: dict[int, list] = {}
    for path, n in ((work_at, need.downloads + need.temporary), (files_at, need.files)):
        dev, free = _free(path)
        got = want.setdefault(dev, [0, free, path])
        got[0] += n
    parts = f"downloads {size_text(need.downloads)}, new files {size_text(need.files)}, " \
            f"temporary {size_text(need.temporary)}"
    for total, free, path in want.values():
        disk = "" if path == what else f", on the file system of {path}"
        has = "free space unknown" if free is None else f"has {size_text(free)}"
        later = "" if need.exact else "; the new files are counted once the bundles are here"
        reporter.note(f"disk: needs {size_text(total)} free, {has} ({parts}{disk}){later}")
        if free is not None and total > free:
            raise NoSpace(
                f"{what}: a pull needs {size_text(total)} free, has {size_text(free)} ({parts}{disk}); "
                f"the checkpoint was left as it was ({os.strerror(errno.ENOSPC)})",
                hint="free some space (or pull into a directory on a larger disk), then pull again",
            )


def _free(path: str) -> tuple[int, int | None]:
    """(device, bytes free to this user) of the file system that holds
    ``path`` or, when it does not exist yet, its nearest existing parent."""
    p = os.path.abspath(path)
    while True:
        try:
            st = os.statvfs(p)
            return os.stat(p).st_dev, st.f_bavail * st.f_frsize
        except FileNotFoundError:
            up = os.path.dirname(p)
            if up == p:
                return -1, None
            p = up
        except OSError:
            return -1, None


def _size(work: StateDir, name: str) -> int | None:
    """The size of a regular file of the work area; None for anything else."""
    try:
        st = os.stat(name, dir_fd=work.fd, follow_symlinks=False)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _index(e, work: StateDir | None):
    """The index of ``e``'s bundle when the work area holds it whole, checked
    against the bundle id (the digest of the index) the verified chain
    gives; None when it does not (or it is damaged: the download replaces it)."""
    name = work_names(e)[0]
    if work is None or _size(work, name) != e.size:
        return None
    try:
        with BundleReader(work.where(name)) as r:
            return r.index if r.id == e.bundle else None
    except Exception:  # noqa: BLE001 - damaged: the download replaces it
        return None
