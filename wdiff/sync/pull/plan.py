"""The route a pull takes, made in one place for pull and for status (which
reports what that same pull would download), and the notes a verbose pull
prints about it.

A route is the run of bundles from the version a directory holds to the
one wanted (or from an anchor), or the bundles undone to step back to an
older version when that costs less. Local changes that ``--force``
discards are restored from the run's deltas when the first of them carries
those files whole, and from an anchor otherwise: only that bundle's index
says which, so the route asks for it (:func:`route`'s ``index_of``). A pull
downloads that bundle, which it needs anyway on the way by deltas; status
reads its index alone, in three ranged reads checked against the bundle id
the verified chain names (:func:`remote_index`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import IntegrityError, NotFoundError
from ...format.bundle import BundleReader, read_frame
from ...format.chain import Chain, Entry
from ...fsutil import scratch_dir
from ...ops.apply.inplace import restorable
from ...paths import printable
from ...progress import SILENT, Reporter, size_text
from ...statedir import StateDir
from ...store.hashing import hexd, short
from ..fetch import download, work_names
from ..rollback import plan_back
from ..tracked import EMPTY_FINGERPRINT, LocalState, plan, plan_recorded


@dataclass(frozen=True)
class Route:
    """What a pull from ``current`` to ``goal`` does."""

    run: tuple[Entry, ...]  # the bundles applied, oldest first (empty: DIR is at the goal)
    from_anchor: bool
    back: tuple[Entry, ...] | None = None  # instead: these bundles undone, newest last (a step back)
    probe: Entry | None = None  # downloaded to learn that the deltas cannot restore ``unrestorable``
    unrestorable: tuple[str, ...] = ()  # local changes no delta of the way carries whole: an anchor restores them

    def downloads(self) -> list[Entry]:
        """The bundles the pull downloads along this route, each once."""
        out: list[Entry] = []
        seen: set[bytes] = set()  # a chain may hold 50,000 entries: no pairwise comparison
        for e in ([self.probe] if self.probe is not None else []) + list(self.back or self.run):
            if e.bundle not in seen:
                seen.add(e.bundle)
                out.append(e)
        return out


def route(chain: Chain, goal: bytes, *, current: bytes, local: LocalState | None = None,
          index_of=None) -> Route:
    """The route of a pull to ``goal`` of ``chain`` for a directory at
    ``current`` (with ``local``: against its record, whose changed files a
    forced pull restores). ``index_of(entry)``: the index of an entry's
    bundle, asked only when local changes must be restored along deltas
    (None: assume the deltas restore them)."""
    if local is None:
        run, from_anchor = plan(chain, current, goal)
        return Route(tuple(run), from_anchor, _back(chain, current, goal, run))
    run, from_anchor = plan_recorded(chain, local, goal)
    if not run:
        return Route((), False)
    if from_anchor and not local.changed:
        return Route(tuple(run), True, _back(chain, local.version, goal, run))
    if not from_anchor and local.changed and index_of is not None:
        bad = restorable(index_of(run[0]), set(local.changed))
        if bad:
            anchored = chain.path(None, goal)
            if anchored is None:
                raise NotFoundError(f"no anchor leads to version {chain.name(goal)}; the remote cannot restore "
                                    f"{', '.join(printable(p) for p in bad[:5])}")
            return Route(tuple(anchored), True, probe=run[0], unrestorable=tuple(bad))
    return Route(tuple(run), from_anchor)


def _back(chain: Chain, current: bytes, goal: bytes, run) -> tuple[Entry, ...] | None:
    back = plan_back(chain, current, goal, list(run)) if run else None
    return tuple(back) if back else None


def held_bundles(work: StateDir) -> set[bytes]:
    """The ids of the bundles the work area holds whole (unverified: for
    the notes only; a pull checks each one again before use)."""
    out = set()
    for n in work.names():
        h = n[:-4] if n.endswith(".wdb") else ""
        if len(h) == 32 and all(c in "0123456789abcdef" for c in h):
            out.add(bytes.fromhex(h))
    return out


def remote_index(store, e: Entry, work: StateDir | None):
    """The index of ``e``'s bundle, for status: from the work area of an
    interrupted pull when it holds the bundle whole, else read from the
    remote in three ranged reads (preamble, footer, index), else (a store
    that cannot read part of an object) downloaded into a scratch
    directory; checked against the bundle id the verified chain names."""
    name = work_names(e)[0]
    if work is not None and work.kind(name) == "file":
        try:
            with BundleReader(work.where(name)) as r:
                if r.id == e.bundle:
                    return r.index
        except Exception:  # noqa: BLE001 - damaged: a pull fetches it again; read the remote's
            pass
    starts, at = [], 0
    for p in e.parts:
        starts.append(at)
        at += p.size

    def read_at(offset: int, n: int) -> bytes:
        out = []
        for p, s in zip(e.parts, starts):
            a, b = max(offset, s), min(offset + n, s + p.size)
            if a < b:
                out.append(store.fetch_range(p.path, a - s, b - a, size=p.size, at=p.commit))
        return b"".join(out)

    where = f"{store.url}: bundle {hexd(e.bundle)[:12]}"
    try:
        bid, index = read_frame(read_at, e.size, where=where)
    except NotImplementedError:
        with scratch_dir("status") as tmp:
            path, _ = download(store, e, tmp, SILENT)
            with BundleReader(path) as r:
                bid, index = r.id, r.index
    if bid != e.bundle:
        raise IntegrityError(f"{where}: is not the bundle the chain names")
    return index


def note_route(reporter: Reporter, chain: Chain, r: Route, *, url: str, directory: str, current: bytes | None,
               goal: bytes, held=()) -> None:
    """-v: where the directory stands, the bundles the pull takes (which,
    how big, from where) and what it will download; -vv: their parts.
    ``held``: bundle ids the work area holds already (an interrupted pull's)."""
    where = "the head" if goal == chain.head else "asked for"
    if current is None or current == EMPTY_FINGERPRINT:
        at = "is empty"
    elif current in chain.versions:
        at = f"is at {chain.name(current)}"
    else:
        at = f"holds a version {url} does not know ({short(current)})"
    reporter.note(f"{directory} {at}; {chain.name(goal)} is {where} on {url}")
    if not r.run:
        return
    steps = r.back or r.run
    how = ("undoing " if r.back else "") + f"{len(steps)} bundle{'s' if len(steps) != 1 else ''}"
    if r.from_anchor and not r.back:
        how += " from an anchor"
    if r.unrestorable:
        how += f" (the deltas do not carry {', '.join(printable(p) for p in r.unrestorable[:5])} whole)"
    fetch = sum(e.size for e in r.downloads() if e.bundle not in held)
    reporter.note(f"plan: {how}, {size_text(fetch)} to download from {url}")
    for e in ([r.probe] if r.probe is not None and r.probe not in steps else []) + list(steps):
        start = "anchor" if e.anchor else chain.name(e.parent)
        kept = ", in the work area" if e.bundle in held else ""
        role = "probe" if e is r.probe and e not in steps else "undo" if r.back else "apply"
        reporter.note(f"  {role} {start} -> {chain.name(e.version)}: {size_text(e.size)} in {len(e.parts)} "
                      f"part{'s' if len(e.parts) != 1 else ''}{kept}")
        for p in e.parts:
            reporter.note(f"    {p.path} ({size_text(p.size)})", level=2)
