"""Signatures of bundles and of chain indexes: what the signer's trusted
comment says, where a chain's signature is stored, and the checks a pull or
an apply makes with trusted keys. The file formats are minisign's
(format/signature.py)."""

from __future__ import annotations

import os
import tempfile

import xxhash

from ..errors import IntegrityError, NotFoundError
from ..format import signature as signing
from ..format.bundle import BundleReader, check_records
from ..format.chain import Entry
from ..fsutil import check_output
from ..progress import SILENT, Reporter
from ..remotes import Upload
from ..store.hashing import hexd

#: signature objects are small, their size is not known in advance
SIG_MAX = -1



def sign_bundle(path, key, *, verify: bool = True, reporter: Reporter = SILENT, key_path=None) -> str:
    """Write ``path.minisig``: ``key`` (a SecretKey or a key file) signs the
    bundle, its trusted comment naming the bundle, its base and its target.
    With ``verify``, every record is checked first. The signature file is
    refused when it is the bundle or the key (``key_path``, for a SecretKey
    loaded from a file), however reached. Returns the signature path."""
    path = os.fspath(path)
    key_path = os.fspath(key) if not isinstance(key, signing.SecretKey) else key_path and os.fspath(key_path)
    check_output(path + signing.SUFFIX, [("the bundle", path), ("the secret key", key_path),
                                         ("the public key", key_path and key_path + ".pub")])
    secret = key if key_path is None else signing.load_secret(key_path)
    with BundleReader(path) as r:
        if verify:
            check_records(r, reporter)
        comment = bundle_comment(r.id, r.index.base_fingerprint, r.index.target_fingerprint)
    return signing.sign_file(path, secret, comment)


def bundle_comment(bundle_id: bytes, parent: bytes | None, version: bytes) -> str:
    return f"wdiff bundle {hexd(bundle_id)} base {hexd(parent) if parent else 'none'} target {hexd(version)}"


def chain_signature(encoded: bytes, key, beside: str) -> Upload:
    """Sign a chain index. The signature is an object named by the index's
    digest, stored before the index: a reader finds it from the bytes it
    read, and never sees an index whose signature is not there yet."""
    fd, tmp = tempfile.mkstemp(prefix=".wdiff-chain-", dir=os.path.dirname(os.path.abspath(beside)))
    with os.fdopen(fd, "wb") as f:
        f.write(encoded)
    sig = signing.sign_file(tmp, key, f"wdiff chain {xxhash.xxh3_128_hexdigest(encoded)}")
    os.unlink(tmp)
    return Upload(chain_signature_path(encoded), sig, 0, os.path.getsize(sig))


def chain_signature_path(encoded: bytes) -> str:
    """signatures/XX/chain-DIGEST.minisig: sharded like objects/, since the
    Hub wants fewer than 10,000 entries per folder and there is one per push."""
    h = xxhash.xxh3_128_hexdigest(encoded)
    return f"signatures/{h[:2]}/chain-{h}{signing.SUFFIX}"


def verify_chain(store, raw: bytes, keys: list) -> None:
    with tempfile.TemporaryDirectory(prefix="wdiff-sig-") as tmp:
        chain_file = os.path.join(tmp, "chain.json")
        with open(chain_file, "wb") as f:
            f.write(raw)
        sig = chain_file + signing.SUFFIX
        try:
            store.fetch(chain_signature_path(raw), sig, size=SIG_MAX)
        except NotFoundError:
            raise IntegrityError(f"{store.url}: the chain index is not signed") from None
        signing.verify_file(chain_file, sig, keys, what=f"{store.url}: chain index")


def verify_bundle_signature(store, e: Entry, bundle: str, keys: list) -> None:
    if e.signature is None:
        raise IntegrityError(f"{store.url}: bundle {hexd(e.bundle)[:12]} is not signed")
    sig = bundle + signing.SUFFIX
    if os.path.exists(sig):
        os.unlink(sig)
    store.fetch(e.signature, sig, size=SIG_MAX)
    comment = signing.verify_file(bundle, sig, keys, what=f"{store.url}: bundle {hexd(e.bundle)[:12]}")
    if comment != bundle_comment(e.bundle, e.parent, e.version):
        raise IntegrityError(f"{store.url}: bundle {hexd(e.bundle)[:12]} carries a signature made for something else")
