"""Reading from a remote: its chain index (checked against trusted keys when
there are any) and whole bundles, downloaded part by part, each part
checked against the digest the chain gives it."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from ..errors import IntegrityError, UsageError
from ..format.bundle import BundleReader
from ..format.chain import Chain, Entry
from ..fsutil import io_error
from ..progress import SILENT, Reporter
from ..remotes import missing_remote
from ..statedir import StateDir
from ..store.hashing import hexd, range_digest
from . import trust
from .signatures import ChainTrust, verify_bundle_signature, verify_chain

PIECE = 8 * 1024 * 1024


def read_chain(store, *, keys: list | None = None) -> Chain:
    """The chain of a remote that must exist (log, status, pull); with
    ``keys``, its signature must verify with one of them."""
    return read_verified(store, keys).chain


@dataclass(frozen=True)
class ReadChain:
    chain: Chain
    raw: bytes | None
    trust: ChainTrust | None  # None: read without trusted keys


def read_verified(store, keys: list | None, *, max_age: float | None = None, records: list | None = None,
                  reporter: Reporter = SILENT) -> ReadChain:
    """Read a remote's chain, which must exist. With ``keys`` its signature
    must verify with one of them and name this chain (see
    signatures.verify_chain, which also applies ``max_age``), and the chain
    must not go back on any of ``records`` (trust.check). Nothing is
    recorded here: the caller does, once what it read is in place
    (:func:`accept`)."""
    if max_age is not None and not keys:
        raise UsageError("--max-age needs a trusted key: only a signed chain has a time to trust",
                         hint="give --trusted-key or set WDIFF_TRUSTED_KEYS")
    raw, token = store.read_chain()
    if raw is None and token is None:
        raise missing_remote(store)
    if not keys:
        return ReadChain(Chain.decode(raw, where=store.url), raw, None)
    if raw is None:
        raise IntegrityError(f"{store.url}: has no signed chain")
    chain = Chain.decode(raw, where=store.url)
    verdict = verify_chain(store, raw, chain, keys, max_age=max_age, reporter=reporter)
    trust.check(store.url, chain, raw, records or [])
    return ReadChain(chain, raw, verdict)


def accept(store, read: ReadChain, records: list) -> None:
    """Remember a verified chain as the newest accepted from this remote."""
    if read.trust is not None and read.raw is not None:
        trust.remember(store.url, read.chain, read.raw, records)


def download(store, e: Entry, work, reporter: Reporter, *, keys: list | None = None) -> tuple[str, int]:
    """Fetch and verify every part of an entry's bundle into ``work`` (a
    :class:`~wdiff.statedir.StateDir`, or a path of a private directory);
    with trusted ``keys``, its signature too, which must verify with one of
    them and name this bundle, its base and its target. Returns the
    bundle's path and the bytes fetched. The work area is a cache, never
    proof: a part or bundle found there is used only once its digests match
    the chain's in this run, and one that does not is deleted and fetched
    again. A shorter part (an interrupted download) is resumed."""
    if isinstance(work, str):
        with StateDir.at(work) as d:
            return download(store, e, d, reporter, keys=keys)
    path, fetched = _download(store, e, work, reporter)
    if keys:
        verify_bundle_signature(store, e, path, keys)
    return path, fetched


def _download(store, e: Entry, work, reporter: Reporter) -> tuple[str, int]:
    name = f"{hexd(e.bundle)}.wdb"
    final = work.where(name)
    if work.kind(name) == "file" and _verified(final, e):
        return final, 0
    work.unlink(name)
    fetched = 0
    part_files = []
    reporter.phase("download", e.size)
    for k, p in enumerate(e.parts):
        pn = f"{hexd(e.bundle)}.part{k:05d}"
        dest = work.where(pn)
        work.unlink(pn + ".ok")  # markers of older versions: a name is no proof
        kind = work.kind(pn)
        if kind not in (None, "file") or (kind == "file" and os.path.getsize(dest) > p.size):
            work.unlink(pn)
        elif kind == "file" and os.path.getsize(dest) == p.size:
            if range_digest(dest, 0, p.size) == p.digest:
                part_files.append(dest)
                continue
            work.unlink(pn)
        # an interrupted run may have left the first bytes of the part: stores
        # continue from there, and the whole part is checked below
        resumed = work.kind(pn) == "file" and os.path.getsize(dest) > 0
        store.fetch(p.path, dest, size=p.size, reporter=reporter, at=p.commit)
        fetched += p.size
        if resumed and not _part_ok(work, pn, p):
            # the bytes kept from before may be what is damaged: never trust
            # them, fetch the whole part once more
            work.unlink(pn)
            reporter.warn(f"{p.path}: the resumed download did not verify; fetching the whole part again")
            store.fetch(p.path, dest, size=p.size, reporter=reporter, at=p.commit)
        if not _part_ok(work, pn, p):
            work.unlink(pn)
            raise IntegrityError(
                f"{store.url}: part {p.path} arrived damaged (digest mismatch); it was discarded",
                hint="run the pull again",
            )
        part_files.append(dest)
    tmp = name + ".tmp"
    try:
        fd = work.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            with os.fdopen(fd, "wb", closefd=False) as out:
                for pf in part_files:
                    with open(pf, "rb") as f:
                        shutil.copyfileobj(f, out, PIECE)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=work.fd, dst_dir_fd=work.fd)
    except OSError as err:
        work.unlink(tmp)
        raise io_error(work.where(tmp), err) from None
    if not _verified(final, e):
        work.unlink(name)
        raise IntegrityError(f"{store.url}: bundle {hexd(e.bundle)[:12]} is not what the chain says")
    for k in range(len(e.parts)):
        work.unlink(f"{hexd(e.bundle)}.part{k:05d}")
    return final, fetched


def work_names(e: Entry) -> list[str]:
    """The names :func:`download` gives an entry's files in a work area:
    the whole bundle, then each part while it is being fetched."""
    h = hexd(e.bundle)
    return [f"{h}.wdb"] + [f"{h}.part{k:05d}" for k in range(len(e.parts))]


def _part_ok(work, pn: str, p) -> bool:
    """The part file ``pn`` of the work area is a regular file of the part's
    size and digest."""
    dest = work.where(pn)
    return work.kind(pn) == "file" and os.path.getsize(dest) == p.size and range_digest(dest, 0, p.size) == p.digest


def _verified(path: str, e: Entry) -> bool:
    """Every part's digest over its range of the whole bundle, and the id."""
    try:
        if os.path.getsize(path) != sum(p.size for p in e.parts):
            return False
        off = 0
        for p in e.parts:
            if range_digest(path, off, p.size) != p.digest:
                return False
            off += p.size
        with BundleReader(path) as r:
            return r.id == e.bundle
    except Exception:  # noqa: BLE001 - any damage means "fetch it again"
        return False
