"""Signatures on a remote: what a chain signature's trusted comment says,
where it is stored, and the checks a pull makes with trusted keys, of the
chain index and of each bundle it downloads. Bundle files' own signatures
are wdiff.ops.signing's; the file formats are minisign's
(format/signature.py)."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass

import xxhash

from ..errors import IntegrityError, NotFoundError
from ..format import signature as signing
from ..format.chain import Chain, Entry, chain_digest
from ..fsutil import scratch_dir
from ..ops.signing import SIG_MAX, bundle_comment
from ..progress import SILENT, Reporter
from ..remotes import Upload
from ..store.hashing import hexd

#: a signed chain dated further in the future than this is refused by --max-age
CLOCK_SKEW_S = 300


def chain_comment(chain: Chain, raw: bytes) -> str:
    """The trusted comment of a chain signature (format 1.1): everything a
    reader needs to place the chain in its remote's history, and the
    BLAKE2b-256 of the exact bytes. A reader rebuilds it from the chain it
    decoded and requires equality, so a comment cannot move to other bytes."""
    lin = chain.lineage
    assert lin is not None, "only a chain with a lineage is signed"
    return (f"wdiff chain/2 remote {lin.remote} seq {lin.seq} prev {lin.prev or 'none'} "
            f"published {lin.published} signer {lin.signer or 'none'} {chain_digest(raw)}")


def _legacy_comment(raw: bytes) -> str:
    return f"wdiff chain {xxhash.xxh3_128_hexdigest(raw)}"


def chain_signature(encoded: bytes, key, beside: str) -> Upload:
    """Sign a chain index. The signature is an object named by the index's
    digest, stored before the index: a reader finds it from the bytes it
    read, and never sees an index whose signature is not there yet."""
    chain = Chain.decode(encoded, where="the new chain index")
    fd, tmp = tempfile.mkstemp(prefix=".wdiff-chain-", dir=os.path.dirname(os.path.abspath(beside)))
    with os.fdopen(fd, "wb") as f:
        f.write(encoded)
    try:
        sig = signing.sign_file(tmp, key, chain_comment(chain, encoded))
    finally:
        os.unlink(tmp)
    return Upload(chain_signature_path(encoded), sig, 0, os.path.getsize(sig))


def chain_signature_path(encoded: bytes) -> str:
    """signatures/XX/chain-DIGEST.minisig: sharded like objects/, since the
    Hub wants fewer than 10,000 entries per folder and there is one per push.
    (A name, not a security property: what the signature covers is in its
    trusted comment.)"""
    h = xxhash.xxh3_128_hexdigest(encoded)
    return f"signatures/{h[:2]}/chain-{h}{signing.SUFFIX}"


@dataclass(frozen=True)
class ChainTrust:
    """How a chain's signature checked out."""

    key_id: str  # the trusted key that verified it
    legacy: bool  # signed by a wdiff before format 1.1: no rollback protection


def has_chain_signature(store, raw: bytes) -> bool:
    """Whether the remote holds a signature object for these chain bytes."""
    with scratch_dir("sig") as tmp:
        try:
            store.fetch(chain_signature_path(raw), os.path.join(tmp, "chain.minisig"), max_size=SIG_MAX)
        except NotFoundError:
            return False
    return True


def verify_chain(store, raw: bytes, chain: Chain, keys: list, *, max_age: float | None = None,
                 reporter: Reporter = SILENT) -> ChainTrust:
    """Check the signature of chain bytes ``raw`` (decoded: ``chain``) with
    ``keys``, and that its trusted comment is this chain's: its lineage and
    the digest of these bytes. A chain signed before format 1.1 ("wdiff
    chain XXH3") is accepted with a warning, unless its body has a lineage
    (a downgraded signature) or ``max_age`` is asked for. With ``max_age``
    (seconds), a chain published longer ago than that is refused: a frozen
    remote."""
    with scratch_dir("sig") as tmp:
        chain_file = os.path.join(tmp, "chain.json")
        with open(chain_file, "wb") as f:
            f.write(raw)
        sig = chain_file + signing.SUFFIX
        try:
            store.fetch(chain_signature_path(raw), sig, max_size=SIG_MAX)
        except NotFoundError:
            raise IntegrityError(f"{store.url}: the chain index is not signed") from None
        with open(chain_file, "rb") as f:
            comment, key = signing.verify_open_with_key(f, sig, keys, what=f"{store.url}: chain index")
    lin = chain.lineage
    if lin is not None and comment == chain_comment(chain, raw):
        if lin.signer != key.id_hex:
            raise IntegrityError(f"{store.url}: the chain says it is signed by key {lin.signer}, "
                                 f"but key {key.id_hex} signed it")
        if max_age is not None:
            _check_age(store.url, lin.published, max_age)
        return ChainTrust(key.id_hex, legacy=False)
    if lin is None and comment == _legacy_comment(raw):
        if max_age is not None:
            raise IntegrityError(f"{store.url}: the chain was signed by a wdiff before 1.1 and carries no signed "
                                 "time, so --max-age cannot hold", hint="the next push --sign re-signs it")
        reporter.warn(f"{store.url}: the chain was signed by a wdiff before 1.1: no protection against rollback "
                      "or replay until the next push --sign re-signs it")
        return ChainTrust(key.id_hex, legacy=True)
    raise IntegrityError(f"{store.url}: the chain index carries a signature made for something else "
                         f"(its trusted comment is not this chain's)")


def parse_age(published: str) -> float:
    """Seconds since the epoch of a ``YYYY-MM-DDTHH:MM:SSZ`` time."""
    import calendar

    return float(calendar.timegm(time.strptime(published, "%Y-%m-%dT%H:%M:%SZ")))


def _check_age(url: str, published: str, max_age: float) -> None:
    age = time.time() - parse_age(published)
    if age > max_age:
        raise IntegrityError(f"{url}: the chain was published {published}, {age:.0f} s ago, longer ago than "
                             f"--max-age allows ({max_age:.0f} s): the remote may be frozen",
                             hint="its publisher must push (signed) more often than --max-age, or the remote is stale")
    if age < -CLOCK_SKEW_S:
        raise IntegrityError(f"{url}: the chain says it was published {published}, in the future",
                             hint="check this machine's clock")


def verify_bundle_signature(store, e: Entry, bundle: str, keys: list) -> None:
    if e.signature is None:
        raise IntegrityError(f"{store.url}: bundle {hexd(e.bundle)[:12]} is not signed")
    sig = bundle + signing.SUFFIX
    if os.path.exists(sig):
        os.unlink(sig)
    store.fetch(e.signature, sig, max_size=SIG_MAX)
    comment = signing.verify_file(bundle, sig, keys, what=f"{store.url}: bundle {hexd(e.bundle)[:12]}")
    if comment != bundle_comment(e.bundle, e.parent, e.version):
        raise IntegrityError(f"{store.url}: bundle {hexd(e.bundle)[:12]} carries a signature made for something else")


