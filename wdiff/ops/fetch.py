"""Reading from a remote: its chain index (checked against trusted keys when
there are any) and whole bundles, downloaded part by part, each part
checked against the digest the chain gives it."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from ..errors import IntegrityError, NotFoundError, UsageError
from ..format.bundle import BundleReader
from ..format.chain import Chain, Entry
from ..progress import SILENT, Reporter
from ..store.hashing import hexd, range_digest
from . import trust
from .signatures import ChainTrust, verify_chain

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


def read_verified(store, keys: list | None, *, max_age: float | None = None, records: list[str] | None = None,
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
        raise NotFoundError(f"{store.url}: no such remote")
    if not keys:
        return ReadChain(Chain.decode(raw, where=store.url), raw, None)
    if raw is None:
        raise IntegrityError(f"{store.url}: has no signed chain")
    chain = Chain.decode(raw, where=store.url)
    verdict = verify_chain(store, raw, chain, keys, max_age=max_age, reporter=reporter)
    trust.check(store.url, chain, raw, records or [])
    return ReadChain(chain, raw, verdict)


def accept(store, read: ReadChain, records: list[str]) -> None:
    """Remember a verified chain as the newest accepted from this remote."""
    if read.trust is not None and read.raw is not None:
        trust.remember(store.url, read.chain, read.raw, records)


def download(store, e: Entry, work: str, reporter: Reporter) -> tuple[str, int]:
    """Fetch and verify every part of an entry's bundle; parts that an
    interrupted pull already verified are not fetched again."""
    os.makedirs(work, exist_ok=True)
    final = os.path.join(work, f"{hexd(e.bundle)}.wdb")
    if os.path.exists(final) and _is_bundle(final, e.bundle):
        return final, 0
    fetched = 0
    part_files = []
    reporter.phase("download", e.size)
    for k, p in enumerate(e.parts):
        dest = os.path.join(work, f"{hexd(e.bundle)}.part{k:05d}")
        done = dest + ".ok"
        if not (os.path.exists(done) and os.path.getsize(dest) == p.size):
            if os.path.exists(done):
                os.unlink(done)
            store.fetch(p.path, dest, size=p.size, reporter=reporter)
            fetched += p.size
            if os.path.getsize(dest) != p.size or range_digest(dest, 0, p.size) != p.digest:
                os.unlink(dest)
                raise IntegrityError(
                    f"{store.url}: part {p.path} arrived damaged (digest mismatch); it was discarded",
                    hint="run the pull again",
                )
            open(done, "wb").close()
        part_files.append(dest)
    tmp = final + ".tmp"
    with open(tmp, "wb") as out:
        for pf in part_files:
            with open(pf, "rb") as f:
                shutil.copyfileobj(f, out, PIECE)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, final)
    if not _is_bundle(final, e.bundle):
        os.unlink(final)
        raise IntegrityError(f"{store.url}: bundle {hexd(e.bundle)[:12]} is not what the chain says")
    for pf in part_files:
        os.unlink(pf)
        os.unlink(pf + ".ok")
    return final, fetched


def _is_bundle(path: str, bundle_id: bytes) -> bool:
    try:
        with BundleReader(path) as r:
            return r.id == bundle_id
    except Exception:  # noqa: BLE001 - any damage means "fetch it again"
        return False
