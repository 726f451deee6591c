"""gc: retention on a remote, in two phases as restic's prune does.

1. *Reachability first.* The kept versions are the newest ``keep_last``
   (in push order), the ones named by ``keep`` (labels or fingerprints) and
   the head. An entry survives when it leads from a kept version (or from
   nothing) to a kept version. A kept version that the survivors cannot
   reach from nothing gets a bridge first, published as a squash (additive,
   so nobody is disturbed): the first such version an anchor squashed from
   nothing, every later one a delta squashed from the kept version before it
   (whose checkpoint is pulled into a work directory for that).
2. *Phase 1: a new chain index.* One conditional write (ConflictError, exit
   status 8, when the chain moved since it was read) publishes the chain
   without the dropped entries. Every object in objects/, signatures/ or
   stage/ that the new chain does not name is listed in it as garbage with
   the time it was first found unreferenced (a gc before may have listed it
   already; its time is kept).
3. *Phase 2: deletion after a grace period.* Only garbage listed at least
   ``grace`` seconds ago is deleted, after the new index is published. A
   pull that read the old index before this gc keeps finding every object
   it needs for the grace period (default 24 hours); a push or a staged part
   under way (objects stored, chain not yet written) too. An object that a
   chain names again (the same bundle pushed again) leaves the list.

A signed chain is re-signed with ``sign_key``; without one gc refuses it.
"""

from __future__ import annotations

import calendar
import contextlib
import os
import secrets
import tempfile
import time
from dataclasses import dataclass, field, replace

from ..errors import ConflictError, IntegrityError, NotFoundError, UsageError
from ..format import signature as signing
from ..format.chain import GC_FOLDERS, Chain, Entry, Garbage
from ..fsutil import scratch_dir
from ..paths import PathLike
from ..progress import SILENT, Reporter
from ..remotes import missing_remote, open_remote
from ..store.hashing import hexd, short
from . import trust
from .fetch import download

#: how long an unreferenced object stays before a gc deletes it
DEFAULT_GRACE = 24 * 3600.0


@dataclass(frozen=True)
class Bridge:
    """A squash gc publishes (or would) so that a kept version stays reachable."""

    start: bytes | None  # None: an anchor
    version: bytes
    bundles: int  # bundles composed
    bundle_id: bytes | None = None  # None in a dry run
    bytes: int | None = None

    def to_json(self) -> dict:
        return {"from": hexd(self.start) if self.start else None, "version": hexd(self.version),
                "bundles": self.bundles, "bundle_id": hexd(self.bundle_id) if self.bundle_id else None,
                "bytes": self.bytes}


@dataclass
class GcResult:
    """What :func:`wdiff.gc` kept, dropped, deleted, and left for a later gc."""

    remote: str
    dry_run: bool
    grace: float
    kept: list[bytes] = field(default_factory=list)
    bridges: list[Bridge] = field(default_factory=list)
    dropped: list[Entry] = field(default_factory=list)  # entries the new chain no longer lists
    marked: list[tuple[str, int]] = field(default_factory=list)  # newly unreferenced objects
    pending: list[tuple[str, int]] = field(default_factory=list)  # garbage left for a later gc
    deleted: list[tuple[str, int]] = field(default_factory=list)  # removed now (or would be)
    published: bool = False

    @property
    def freed(self) -> int:
        return sum(s for _, s in self.deleted)

    def to_json(self) -> dict:
        return {
            "schema": "wdiff.gc/1",
            "remote": self.remote,
            "dry_run": self.dry_run,
            "grace_seconds": self.grace,
            "kept": [hexd(v) for v in self.kept],
            "bridges": [b.to_json() for b in self.bridges],
            "dropped": [{"bundle_id": hexd(e.bundle), "version": hexd(e.version), "bytes": e.size,
                         "label": e.label} for e in self.dropped],
            "marked": {"objects": len(self.marked), "bytes": sum(s for _, s in self.marked)},
            "pending": {"objects": len(self.pending), "bytes": sum(s for _, s in self.pending)},
            "deleted": {"objects": len(self.deleted), "bytes": self.freed},
            "published": self.published,
        }


def _now_text(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


def _parse_time(text: str) -> float:
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))


def kept_versions(chain: Chain, keep_last: int, keep: list[str]) -> list[bytes]:
    """The versions gc keeps, in the order they first appear in the chain."""
    order: list[bytes] = []
    seen: set[bytes] = set()
    for e in chain.entries:
        if e.version not in seen:
            seen.add(e.version)
            order.append(e.version)
    want = set(order[-keep_last:]) if keep_last > 0 else set()
    want.update(chain.resolve(k) for k in keep)
    want.add(chain.resolve(None))
    return [v for v in order if v in want]


def surviving(chain: Chain, kept: list[bytes]) -> list[Entry]:
    """Entries from a kept version (or nothing) to a kept version, in order."""
    k = set(kept)
    return [e for e in chain.entries if e.version in k and (e.parent is None or e.parent in k)]


def in_push_order(chain: Chain, entries: list[Entry]) -> list[Entry]:
    """``entries`` ordered by when their version first appeared in ``chain``
    (then as they were): a bridge gc adds for an old version takes the place
    of the entry it replaces, so that push order (--keep-last, HEAD~N) is
    what it was."""
    first: dict[bytes, int] = {}
    for k, e in enumerate(chain.entries):
        first.setdefault(e.version, k)
    pos = {e.bundle: k for k, e in enumerate(chain.entries)}
    return sorted(entries, key=lambda e: (first[e.version], pos[e.bundle]))


def _label_of(chain: Chain, v: bytes) -> str | None:
    return next((e.label for e in reversed(chain.entries) if e.version == v and e.label), None)


def plan_bridges(chain: Chain, kept: list[bytes]) -> list[Bridge]:
    """The squashes that make every kept version reachable from nothing
    through surviving entries, in the order they must be made."""
    entries = surviving(chain, kept)
    out: list[Bridge] = []
    prev: bytes | None = None
    for v in kept:
        if Chain(head=v, entries=tuple(entries)).path(None, v) is None:
            run = chain.path(prev, v) if prev is not None else None
            start = prev
            if run is None:
                run, start = chain.path(None, v), None
            if run is None:
                raise NotFoundError(f"{chain.head and short(chain.head)}: version {short(v)} cannot be reached")
            out.append(Bridge(start, v, len(run)))
            # assume the bridge is there for the versions after it
            entries.append(Entry(bundle=secrets.token_bytes(16), version=v, parent=start, parts=run[0].parts,
                                 created="", label=None))
        prev = v
    return out


def gc(
    remote: str,
    *,
    keep_last: int,
    keep: list[str] | None = None,
    dry_run: bool = False,
    grace: float = DEFAULT_GRACE,
    sign_key: PathLike | None = None,
    token: str | None = None,
    work: PathLike | None = None,
    threads: int | None = None,
    reporter: Reporter = SILENT,
) -> GcResult:
    """Retention on ``remote``: keep the newest ``keep_last`` versions, the
    versions ``keep`` names (labels, fingerprints, HEAD~N) and the head, and
    drop every other entry of the chain; kept versions that would become
    unreachable get a squashed bundle first (rebuilt in ``work``, default: a
    temporary directory). In two phases (see the module docstring): a new
    chain index (conditional: :class:`~wdiff.errors.ConflictError` when the
    chain moved) lists the objects it no longer names as garbage; only
    garbage that a gc listed at least ``grace`` seconds ago is deleted, so
    that a pull that read the old chain keeps working. ``dry_run`` changes
    nothing and says what would go. A signed chain needs ``sign_key`` (it is
    signed again). ``token``: for a Hub remote. Returns a
    :class:`GcResult`."""
    if keep_last < 0:
        raise UsageError("--keep-last must be 0 or more")
    if grace < 0:
        raise UsageError("--grace must be 0 or more")
    keep = list(keep or [])
    key = signing.load_secret(os.fspath(sign_key)) if sign_key is not None else None
    store = open_remote(remote, token=token)
    raw, tok = store.read_chain()
    if raw is None:
        raise NotFoundError(f"{store.url}: no chain on this remote") if tok is not None else missing_remote(store)
    chain = Chain.decode(raw, where=store.url)
    records = trust.places(None)
    if key is not None or not dry_run:  # a dry run changes nothing: it needs no key
        _check_signed(store, chain, raw, key, records, reporter)
    kept = kept_versions(chain, keep_last, keep)
    res = GcResult(store.url, dry_run, grace, kept=kept)
    bridges = plan_bridges(chain, kept)
    if dry_run:
        res.bridges = bridges
        final = surviving(chain, kept)
        _sweep(store, chain, raw, final, res, grace, time.time())
        res.dropped = [e for e in chain.entries if e not in final]
        return res
    if bridges:
        res.bridges = _build_bridges(store, chain, bridges, sign_key, work, threads, reporter, token)
        store = open_remote(remote, token=token)
        raw, tok = store.read_chain()
        chain = Chain.decode(raw, where=store.url)
        kept = kept_versions(chain, keep_last, keep)
        res.kept = kept
    final = in_push_order(chain, surviving(chain, kept))
    for v in kept:
        if Chain(head=v, entries=tuple(final)).path(None, v) is None:
            raise ConflictError(f"{store.url}: the chain changed while gc was making {short(v)} reachable",
                                hint="run the gc again")
    stamp = time.time()
    garbage = _sweep(store, chain, raw, final, res, grace, stamp)
    res.dropped = [e for e in chain.entries if e not in final]
    if res.dropped or set(garbage) != set(chain.garbage):
        new = replace(chain, entries=tuple(final), garbage=tuple(garbage))
        lin = chain.lineage
        new = new.succeeding(raw, remote=lin.remote if lin is not None else secrets.token_hex(16),
                             published=_now_text(time.time()), signer=key.public_key.id_hex if key else None)
        encoded = new.encode()
        uploads = []
        with scratch_dir("gc-sig") as tmp:
            if key is not None:
                from .signatures import chain_signature

                uploads.append(chain_signature(encoded, key, os.path.join(tmp, "chain")))
            message = f"wdiff gc: keep {len(kept)} version(s), drop {len(res.dropped)} bundle(s)"
            store.publish(uploads, encoded, tok, message=message, reporter=reporter)
        res.published = True
        if key is not None:
            trust.remember(store.url, new, encoded, records)
    if res.deleted:
        store.delete([p for p, _ in res.deleted])
    reporter.done()
    return res


def _check_signed(store, chain: Chain, raw: bytes, key, records, reporter: Reporter) -> None:
    from .push import check_extended

    lin = chain.lineage
    if key is None:
        from .signatures import has_chain_signature

        signed = lin.signer is not None if lin is not None else has_chain_signature(store, raw)
        if signed:
            by = f" by key {lin.signer}" if lin is not None and lin.signer else ""
            raise IntegrityError(f"{store.url}: the chain is signed{by}; gc rewrites it and would strip the signature",
                                 hint="run gc with --sign KEY")
        return
    check_extended(store, chain, raw, key, adopt=False, records=records, reporter=reporter)


def _sweep(store, chain: Chain, raw: bytes, final: list[Entry], res: GcResult, grace: float,
           now: float) -> list[Garbage]:
    """Fill ``res`` with what is unreferenced once ``final`` is the chain,
    and return the garbage list the new chain carries."""
    named: set[str] = set()
    for e in final:
        named.update(p.path for p in e.parts)
        if e.signature:
            named.add(e.signature)
    known = {g.path: g for g in chain.garbage}
    listed: list[tuple[str, int]] = []
    for folder in GC_FOLDERS:
        listed.extend(store.list(folder))
    from .signatures import chain_signature_path

    current_sig = chain_signature_path(raw)  # a reader of the chain gc replaces still needs it
    stamp = _now_text(now)
    out: list[Garbage] = []
    for path, size in listed:
        if path in named:
            continue
        g = known.get(path)
        if g is None or g.size != size:
            g = Garbage(path, size, stamp)
            res.marked.append((path, size))
        if path != current_sig and now - _parse_time(g.since) >= grace:
            res.deleted.append((path, size))
        else:
            res.pending.append((path, size))
            out.append(g)
    return out


def _build_bridges(store, chain: Chain, bridges: list[Bridge], sign_key, work: PathLike | None, threads,
                   reporter: Reporter, token: str | None) -> list[Bridge]:
    from ..defaults import DEFAULT_PART_SIZE
    from ..ops.squash import squash
    from .pull.inplace import pull
    from .push import push_bundle

    done: list[Bridge] = []
    with contextlib.ExitStack() as stack:
        base_dir = work or stack.enter_context(scratch_dir("gc"))
        os.makedirs(base_dir, exist_ok=True)
        ckpt = os.path.join(base_dir, "checkpoint")
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="wdiff-gc-bundles-", dir=base_dir))
        for b in bridges:
            run = chain.path(b.start, b.version)
            base = None
            if b.start is not None:
                pull(store.url, ckpt, to=hexd(b.start), token=token, threads=threads, reporter=reporter)
                base = ckpt
            bundles = [download(store, e, scratch, reporter)[0] for e in run]
            out = os.path.join(scratch, "bridge.wdb")
            squash(bundles, base, out, threads=threads, reporter=reporter, overwrite=True)
            r = push_bundle(out, store.url, label=_label_of(chain, b.version), part_size=DEFAULT_PART_SIZE,
                            fork=False, sign_key=sign_key, reporter=reporter, shortcut=True, token=token)
            done.append(replace(b, bundle_id=r.bundle_id, bytes=r.bytes))
            for p in (out, out + signing.SUFFIX):
                with contextlib.suppress(OSError):
                    os.unlink(p)
    return done
