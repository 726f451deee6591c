"""Reading from a remote: its chain index (checked against trusted keys when
there are any) and whole bundles, downloaded part by part, each part
checked against the digest the chain gives it."""

from __future__ import annotations

import os
import shutil

from ..errors import IntegrityError, NotFoundError
from ..format.bundle import BundleReader
from ..format.chain import Chain, Entry
from ..progress import Reporter
from ..remotes import suggest
from ..store.hashing import hexd, range_digest
from .signatures import verify_chain

PIECE = 8 * 1024 * 1024


def read_chain(store, *, keys: list | None = None) -> Chain:
    """The chain of a remote that must exist (log, status, pull); with
    ``keys``, its signature must verify with one of them."""
    raw, token = store.read_chain()
    if raw is None and token is None:
        raise NotFoundError(f"{store.url}: no such remote", hint=suggest(store.url))
    if keys:
        if raw is None:
            raise IntegrityError(f"{store.url}: has no signed chain")
        verify_chain(store, raw, keys)
    return Chain.decode(raw, where=store.url)


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
