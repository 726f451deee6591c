"""Ed25519 signatures in minisign's formats, so that a signature wdiff writes
can be checked with ``minisign -V`` and a key made with ``minisign -G`` can
sign with wdiff.

A signature covers a file through BLAKE2b-512 (minisign's prehashed "ED"
mode), and its trusted comment says what the file is. Digests elsewhere in
wdiff are XXH3-128, fast but not meant to resist an adversary: what a
signature vouches for is always hashed with BLAKE2b here.

Key files: ``KEY`` (secret, unencrypted: wdiff runs unattended) and
``KEY.pub``. Encrypted minisign secret keys are refused with a hint.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import struct
from dataclasses import dataclass

from ..errors import IntegrityError, NotFoundError, UsageError
from ..fsutil import atomic_write_bytes, io_error, open_regular, read_bounded

ENV_KEYS = "WDIFF_TRUSTED_KEYS"
SUFFIX = ".minisig"
PIECE = 8 * 1024 * 1024
#: the most a signature file may hold: four lines, the trusted comment the
#: longest (a minisign signature is about 300 bytes; a longer file is not one)
MAX_SIGNATURE = 16 * 1024
MAX_KEY_FILE = 64 * 1024
#: minisign's legacy mode signs the file itself rather than its hash; wdiff
#: never writes it, and checks it only on files small enough to hold
MAX_LEGACY_SIGNED = 1024 * 1024


def _ed25519():
    from cryptography.hazmat.primitives.asymmetric import ed25519

    return ed25519


@dataclass(frozen=True)
class PublicKey:
    key_id: bytes  # 8 bytes
    key: bytes  # 32 bytes
    source: str = ""

    @property
    def id_hex(self) -> str:
        return struct.unpack("<Q", self.key_id)[0].to_bytes(8, "big").hex().upper()

    def encode(self) -> bytes:
        return (
            f"untrusted comment: minisign public key {self.id_hex}\n".encode()
            + base64.b64encode(b"Ed" + self.key_id + self.key)
            + b"\n"
        )


@dataclass(frozen=True)
class SecretKey:
    key_id: bytes
    seed: bytes  # 32 bytes
    public: bytes  # 32 bytes

    @property
    def public_key(self) -> PublicKey:
        return PublicKey(self.key_id, self.public)

    def sign(self, message: bytes) -> bytes:
        return _ed25519().Ed25519PrivateKey.from_private_bytes(self.seed).sign(message)

    def encode(self) -> bytes:
        sk = self.seed + self.public
        checksum = hashlib.blake2b(b"Ed" + self.key_id + sk, digest_size=32).digest()
        raw = b"Ed" + b"\0\0" + b"B2" + b"\0" * 32 + struct.pack("<QQ", 0, 0) + self.key_id + sk + checksum
        return b"untrusted comment: minisign secret key (unencrypted, written by wdiff)\n" + base64.b64encode(raw) + b"\n"


def generate(path: str) -> PublicKey:
    """Write a new key pair to ``path`` (secret, mode 0600) and ``path.pub``."""
    if os.path.exists(path) or os.path.exists(path + ".pub"):
        raise UsageError(f"{path}: a key is already there; wdiff never overwrites keys")
    ed = _ed25519()
    priv = ed.Ed25519PrivateKey.generate()
    from cryptography.hazmat.primitives import serialization as ser

    seed = priv.private_bytes(ser.Encoding.Raw, ser.PrivateFormat.Raw, ser.NoEncryption())
    pub = priv.public_key().public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    key = SecretKey(secrets.token_bytes(8), seed, pub)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.encode())
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise io_error(path, e) from None
    atomic_write_bytes(path + ".pub", key.public_key.encode())
    return key.public_key


def _b64_line(path: str, data: bytes, line: int) -> bytes:
    lines = data.splitlines()
    if len(lines) <= line:
        raise UsageError(f"{path}: not a minisign key file")
    try:
        return base64.b64decode(lines[line], validate=True)
    except ValueError:
        raise UsageError(f"{path}: not a minisign key file") from None


def _read(path: str) -> bytes:
    try:
        return read_bounded(path, MAX_KEY_FILE, what=f"{path}: key file")
    except FileNotFoundError:
        raise NotFoundError(f"{path}: no such key file") from None
    except OSError as e:
        raise io_error(path, e) from None


def load_secret(path: str) -> SecretKey:
    raw = _b64_line(path, _read(path), 1)
    if len(raw) != 158 or raw[:2] != b"Ed":
        raise UsageError(f"{path}: not a minisign secret key")
    if raw[2:4] != b"\0\0":
        raise UsageError(
            f"{path}: the secret key is encrypted; wdiff signs unattended and needs an unencrypted key",
            hint="make one with `wdiff keygen KEY` or `minisign -G -W`",
        )
    key_id, sk, checksum = raw[54:62], raw[62:126], raw[126:158]
    if checksum != b"\0" * 32 and hashlib.blake2b(b"Ed" + key_id + sk, digest_size=32).digest() != checksum:
        raise UsageError(f"{path}: the secret key's checksum does not match; the file is damaged")
    return SecretKey(key_id, sk[:32], sk[32:])


def load_public(path: str) -> PublicKey:
    data = _read(path)
    raw = _b64_line(path, data, 1) if data.startswith(b"untrusted comment:") else _b64_line(path, data, 0)
    if len(raw) != 42 or raw[:2] != b"Ed":
        raise UsageError(f"{path}: not a minisign public key")
    return PublicKey(raw[2:10], raw[10:42], path)


def trusted_keys(paths: list[str] | None) -> list[PublicKey]:
    """The keys given on the command line, or else those in WDIFF_TRUSTED_KEYS."""
    if not paths:
        env = os.environ.get(ENV_KEYS, "")
        paths = [p for p in env.split(os.pathsep) if p]
    return [load_public(os.fspath(p)) for p in paths]


def required_keys(paths: list | None, require: bool) -> list[PublicKey]:
    """The trusted keys (given, or from WDIFF_TRUSTED_KEYS); having any means
    signatures are required, and ``require`` without any is a usage error."""
    keys = trusted_keys(paths)
    if require and not keys:
        raise UsageError("--require-signature needs a trusted key", hint=f"give --trusted-key or set {ENV_KEYS}")
    return keys


def _blake2b_file(path: str) -> bytes:
    try:
        with open_regular(path) as f:
            return blake2b_stream(f)
    except OSError as e:
        raise io_error(path, e) from None


def blake2b_stream(f) -> bytes:
    """BLAKE2b-512 of an open binary file from offset 0 to its end, read
    with pread so that the file's position (and anyone sharing it) is left
    alone; what minisign's "ED" mode signs."""
    h = hashlib.blake2b(digest_size=64)
    fd, off = f.fileno(), 0
    while piece := os.pread(fd, PIECE, off):
        h.update(piece)
        off += len(piece)
    return h.digest()


def sign_file(path: str, key: SecretKey, trusted_comment: str) -> str:
    """Write ``path.minisig`` for ``path``; returns the signature file's path."""
    if "\n" in trusted_comment or "\r" in trusted_comment:
        raise UsageError("a trusted comment is one line")
    sig = key.sign(_blake2b_file(path))
    global_sig = key.sign(sig + trusted_comment.encode())
    text = (
        f"untrusted comment: signature from wdiff, key {key.public_key.id_hex}\n".encode()
        + base64.b64encode(b"ED" + key.key_id + sig) + b"\n"
        + f"trusted comment: {trusted_comment}\n".encode()
        + base64.b64encode(global_sig) + b"\n"
    )
    out = path + SUFFIX
    atomic_write_bytes(out, text)
    return out


def verify_file(path: str, signature: str, keys: list[PublicKey], *, what: str | None = None) -> str:
    """Check ``signature`` (a .minisig file) over ``path`` with any of
    ``keys``; returns the trusted comment. Raises IntegrityError naming
    ``what`` (default: the path)."""
    try:
        with open_regular(path, what=what) as f:
            return verify_open(f, signature, keys, what=what or path)
    except FileNotFoundError:
        raise NotFoundError(f"{path}: no such file") from None
    except OSError as e:
        raise io_error(path, e) from None


def verify_open(f, signature: str, keys: list[PublicKey], *, what: str) -> str:
    """Check ``signature`` (a .minisig file) over the content of the open
    file ``f`` with any of ``keys``; returns the trusted comment, which the
    caller MUST compare with what it expects the file to be. Whoever goes on
    to use the content should read it through ``f``: that is what was
    checked, whatever happens to the file's name meanwhile."""
    return verify_open_with_key(f, signature, keys, what=what)[0]


def verify_open_with_key(f, signature: str, keys: list[PublicKey], *, what: str) -> tuple[str, PublicKey]:
    """:func:`verify_open`, also returning the key that verified."""
    if not keys:
        raise UsageError("no trusted key to check signatures with", hint=f"give --trusted-key or set {ENV_KEYS}")
    try:
        lines = read_bounded(signature, MAX_SIGNATURE, what=f"{what}: signature").splitlines()
    except FileNotFoundError:
        raise IntegrityError(f"{what}: not signed (no {os.path.basename(signature)})") from None
    except OSError as e:
        raise io_error(signature, e) from None
    if len(lines) < 4 or not lines[2].startswith(b"trusted comment: "):
        raise IntegrityError(f"{signature}: not a minisign signature")
    try:
        raw = base64.b64decode(lines[1], validate=True)
        global_sig = base64.b64decode(lines[3], validate=True)
    except ValueError:
        raise IntegrityError(f"{signature}: not a minisign signature") from None
    if len(raw) != 74 or raw[:2] not in (b"ED", b"Ed") or len(global_sig) != 64:
        raise IntegrityError(f"{signature}: not a minisign signature")
    key = next((k for k in keys if k.key_id == raw[2:10]), None)
    if key is None:
        raise IntegrityError(f"{what}: signed by key {PublicKey(raw[2:10], b'').id_hex}, which is not trusted")
    if raw[:2] == b"ED":
        message = blake2b_stream(f)
    else:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_LEGACY_SIGNED:
            raise IntegrityError(f"{what}: a legacy (non-prehashed) minisign signature over {size} bytes; "
                                 "wdiff checks those only up to 1 MiB", hint="sign with minisign -S (prehashed)")
        message = os.pread(f.fileno(), size + 1, 0)
    trusted = lines[2][len(b"trusted comment: "):]
    pub = _ed25519().Ed25519PublicKey.from_public_bytes(key.key)
    from cryptography.exceptions import InvalidSignature

    try:
        pub.verify(raw[10:74], message)
        pub.verify(global_sig, raw[10:74] + trusted)
    except InvalidSignature:
        raise IntegrityError(f"{what}: the signature does not match (altered file or signature)") from None
    return trusted.decode("utf-8", "replace"), key
