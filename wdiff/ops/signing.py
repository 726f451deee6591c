"""Signatures of bundle files: what the signer's trusted comment says of a
bundle, signing one, and opening one whose signature must verify with
trusted keys. The file format is minisign's (format/signature.py); chain
signatures, which live on remotes, are wdiff.sync.signatures'."""

from __future__ import annotations

import os

from ..errors import IntegrityError
from ..format import signature as signing
from ..format.bundle import BundleReader, check_records
from ..fsutil import check_output
from ..progress import SILENT, Reporter
from ..store.hashing import hexd

#: signature objects are small; a longer one is refused before it is stored
SIG_MAX = signing.MAX_SIGNATURE


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


def open_signed_bundle(path, keys: list) -> BundleReader:
    """Open the bundle file ``path`` whose signature ``path.minisig`` must
    verify with one of ``keys`` and name this bundle, its base and its
    target. The check and every later read use one open file, so renaming
    another file over ``path`` meanwhile changes nothing; the caller applies
    from the reader returned (and closes it)."""
    path = os.fspath(path)
    f = BundleReader.open_file(path)
    try:
        comment = signing.verify_open(f, path + signing.SUFFIX, keys, what=path)
    except BaseException:
        f.close()
        raise
    reader = BundleReader(path, file=f)
    ix = reader.index
    if comment != bundle_comment(reader.id, ix.base_fingerprint, ix.target_fingerprint):
        reader.close()
        raise IntegrityError(f"{path}: the signature was made for something else (its trusted comment does not "
                             "name this bundle, its base and its target)")
    return reader
