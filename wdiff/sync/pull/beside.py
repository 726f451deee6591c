"""What a pull does beside DIR, in its parent directory: the rebuild of a
directory that holds a version the remote does not know (built from an
anchor beside it, then swapped in by rename) and the sweep of the copies
that dead pulls left there. The caller holds DIR's lock beside it.
"""

from __future__ import annotations

import os
import re
import shutil

from ...fsutil import fsync_dir, io_error, owner_alive, owner_tag, remove_tree
from ...ops.apply import apply
from ...ops.squash import squash
from ...paths import RESERVED, STATE_DIR
from ...progress import Reporter
from ...statedir import StateDir


def debris(name: str) -> re.Pattern:
    # the copy, apply's temp for it (PID-START-RANDOM) or apply's lock beside it
    tail = r"(?:\.wdiff-tmp-[0-9a-f-]+|\.wdiff-lock)?"
    return re.compile(rf"^\.\.?{re.escape(name)}\.wdiff-(new|old)-(\d+)(?:-(\d+))?{tail}$")


def sweep(parent: str, name: str, *, old_too: bool) -> None:
    """Remove the copies dead pulls left beside DIR (the caller holds DIR's
    beside lock, so no live pull of DIR owns any). A previous DIR
    (``-old-``) goes only once DIR is whole again."""
    pat = debris(name)
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


def rebuild_beside(directory: str, bundles: list[str], work: StateDir, state: StateDir, threads: int,
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
