"""Stepping a directory back along a remote's chain. A pull to an older
version whose run of bundles from there to the directory's version is
cheaper than an anchor downloads those bundles (verified as for any pull),
builds each one's inverse (reverse.py) against the directory and applies it
in place, newest first: the ordinary verified apply, journaled, so a killed
rollback is finished by the next pull (:func:`finish_interrupted`).

What the forward bundles lack (see reverse.py) is read from a bundle whose
target is the older version: the previous bundle of the run, already here,
or, for the oldest step, an anchor of it (else a bundle) on the remote,
record by record, within the bytes the anchor route would cost. With
trusted keys nothing is read in pieces: a signature covers whole files.
When a step cannot be built, :func:`step_back` says so and the pull takes
the anchor.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from ..format.bundle import BundleReader
from ..format.chain import Chain, Entry
from ..ops.apply.inplace import apply_in_place
from ..ops.reverse import NotInvertible, Older, build_inverse, local_older
from ..progress import Reporter
from ..statedir import StateDir
from ..store.hashing import hexd, short
from .fetch import download

READ_AHEAD = 512  # bytes read for a record header: it and, when payloads are tiny, the next ones
PREFIX = "inverse-"


@dataclass(frozen=True)
class SteppedBack:
    done: bool  # False: the caller must take another route (the anchor); nothing was left half-done
    downloaded: int  # bytes fetched from the remote, whole bundles and pieces
    why: str = ""


def plan_back(chain: Chain, current: bytes, goal: bytes, forward: list[Entry]) -> list[Entry] | None:
    """The run of entries from ``goal`` to ``current`` when the directory is
    past the goal along the chain and downloading that run costs fewer bytes
    than ``forward`` (the run a pull would take otherwise)."""
    if current == goal or current not in chain.versions:
        return None
    back = chain.path(goal, current)
    if not back or any(e.anchor for e in back):
        return None
    if sum(e.size for e in back) >= sum(e.size for e in forward):
        return None
    return back


def step_back(store, chain: Chain, keys, directory: str, work: StateDir, back: list[Entry], *, budget: int,
              threads: int, reporter: Reporter) -> SteppedBack:
    """Bring ``directory``, at the version of ``back[-1]``, to the parent of
    ``back[0]`` by applying the inverses of ``back``, newest first. Fetches
    at most about ``budget`` bytes before giving up."""
    downloaded = 0
    paths = []
    for e in back:
        path, n = download(store, e, work, reporter, keys=keys)
        paths.append(path)
        downloaded += n
    for k in reversed(range(len(back))):
        e = back[k]
        fetched = [0]
        # the bundles of the run before this one are here, newest first, and
        # each asks the one before for what it kept from its base; the
        # oldest asks the remote's bundles of its base version, read in
        # pieces (not with trusted keys: a signature covers whole files).
        # Failing that, the remote's bundles of this step's older version.
        oldest = [] if keys else [_remote_older(store, p, fetched, budget - downloaded)
                                  for p in _producers(chain, back[0].parent)]
        then = oldest[0] if oldest else None
        for j in range(k - 1):
            then = local_older(paths[j], expect_target=back[j].version, then=then)
        sources = [local_older(paths[k - 1], expect_target=e.parent, then=then)] if k > 0 else oldest
        if k > 0 and not keys:
            sources += [_remote_older(store, p, fetched, budget - downloaded) for p in _producers(chain, e.parent)
                        if p.bundle != back[k - 1].bundle]
        tmp = f"{PREFIX}{hexd(e.bundle)}.tmp"
        built = None
        why = ""
        for src in sources or [None]:
            work.unlink(tmp)
            try:
                built = build_inverse(paths[k], directory, work.where(tmp), older=src,
                                      threads=threads, reporter=reporter)
                break
            except NotInvertible as err:
                why = str(err)
        downloaded += fetched[0]
        if built is None:
            work.unlink(tmp)
            return SteppedBack(False, downloaded, why)
        name = f"{PREFIX}{hexd(built.bundle_id)}.wdb"
        os.rename(tmp, name, src_dir_fd=work.fd, dst_dir_fd=work.fd)
        apply_in_place(work.where(name), directory, abort=False, threads=threads, reporter=reporter,
                       beside_locked=True)  # under the pull's lock
        work.unlink(name)
    return SteppedBack(True, downloaded)


def _producers(chain: Chain, version: bytes) -> list[Entry]:
    """The entries whose version is ``version``: anchors first (everything of
    the version is in them), then bundles, each kind smallest first."""
    return sorted((e for e in chain.entries if e.version == version), key=lambda e: (not e.anchor, e.size))


def _remote_older(store, e: Entry, fetched: list, budget: int) -> Callable[[], Older]:
    """An :class:`Older` over the remote bundle of ``e``, read in pieces; the
    bytes it fetches add up in ``fetched[0]``, and past ``budget`` it gives
    up (the anchor route is then no dearer)."""

    def open_it() -> Older:
        starts, at = [], 0
        for p in e.parts:
            starts.append(at)
            at += p.size
        window = [0, b""]

        def fetch(offset: int, n: int) -> bytes:
            out = []
            for p, s in zip(e.parts, starts):
                a, b = max(offset, s), min(offset + n, s + p.size)
                if a < b:
                    try:
                        out.append(store.fetch_range(p.path, a - s, b - a, size=p.size, at=p.commit))
                    except NotImplementedError:
                        raise NotInvertible(f"{store.url}: cannot read part of a bundle") from None
            fetched[0] += n
            if fetched[0] > budget:
                raise NotInvertible("reading the older version in pieces would cost more than its anchor")
            return b"".join(out)

        def read_at(offset: int, n: int) -> bytes:
            w0, wb = window
            if w0 <= offset and offset + n <= w0 + len(wb):
                return wb[offset - w0 : offset - w0 + n]
            if n >= READ_AHEAD:
                return fetch(offset, n)
            m = min(READ_AHEAD, e.size - offset)
            window[0], window[1] = offset, fetch(offset, max(m, n))
            return window[1][:n]

        return Older(read_at, e.size, where=f"{store.url}: bundle {hexd(e.bundle)[:12]}",
                     expect_id=e.bundle, expect_target=e.version)

    return open_it


def finish_interrupted(chain: Chain, bundle_id: str, directory: str, work: StateDir, *, threads: int,
                       reporter: Reporter) -> bool:
    """A rollback killed while applying an inverse: finish that apply, when
    the work area holds that inverse and it joins two versions of the
    verified chain (the apply checks the result against the older one's
    digests, which its fingerprint commits to). False: not one of ours."""
    name = f"{PREFIX}{bundle_id}.wdb"
    if work.kind(name) != "file":
        return False
    path = work.where(name)
    try:
        with BundleReader(path) as r:
            ok = (hexd(r.id) == bundle_id and r.index.base_fingerprint in chain.versions
                  and r.index.target_fingerprint in chain.versions)
    except Exception:  # noqa: BLE001 - a damaged file is not ours to finish
        return False
    if not ok:
        return False
    reporter.note(f"finishing the interrupted rollback (to {short(r.index.target_fingerprint)})")
    apply_in_place(path, directory, abort=False, threads=threads, reporter=reporter,
                   beside_locked=True)  # under the pull's lock
    work.unlink(name)
    return True
