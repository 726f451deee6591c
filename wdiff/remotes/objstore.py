"""Object stores as remotes, through fsspec: ``s3://BUCKET[/PREFIX]`` (s3fs),
``gs://`` (gcsfs), ``az://`` / ``abfs://`` (adlfs), and any other fsspec URL
whose implementation is installed. This module holds the URL parsing, the
error mapping and the generic store; stores.py the S3 and GCS stores (with
conditional writes) and ``open_store``. Only these two import fsspec and
the stores' libraries.

Credentials are each store's own configuration, read by its library
(for S3: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, instance metadata); wdiff never
prints them, and error messages carry the store's error code, not its text,
when the credentials are refused.

The chain index is the one mutable object, replaced by a conditional write:

- S3 (and S3-compatible stores that honour it, such as R2 or MinIO): the
  chain is read with its ETag in the same GET, and written with
  ``If-Match: ETAG`` (``If-None-Match: *`` for the first push): of two
  concurrent pushes the store lets exactly one write, the other gets HTTP
  412 and exits with the conflict code.
- GCS: the same with the object's generation (``ifGenerationMatch``; 0
  for the first push).
- every other store: no conditional write; the chain is read again just
  before it is written, which narrows the window but does not close it, and
  ``wdiff push`` says so (a warning) every time.

Objects (bundle parts) are stored before the chain that names them. On S3 a
part larger than one chunk goes up as a multipart upload, UPLOADERS chunks
in flight (and in memory) at a time; a push that died halfway leaves the
upload open, and the rerun lists its parts and sends only those missing or
different (each kept part's ETag is checked against the MD5 of our bytes). Other stores write
through fsspec's buffered file (gcsfs and adlfs upload in blocks), and
reuse a whole object already there with the right size. Downloads go in
ranged pieces, appended to the caller's file as they arrive: a broken
connection costs at most one piece, and an interrupted fetch continues from
the bytes already there.

For a fleet's cache in front of the store: on S3 every object is written
with a ``Cache-Control`` (objects and signatures immutable, the chain index
``no-cache``; see :func:`cache_control`), and a puller may read without
credentials where the operator's proxy adds them, through fsspec's own
configuration (``FSSPEC_S3_ANON=true``: s3fs then signs nothing); wdiff
adds no variable of its own.
"""

from __future__ import annotations

import contextlib
import os
import re

import xxhash

from ..errors import (AuthError, ConflictError, FormatError, IntegrityError, NotFoundError, RemoteError, UsageError,
                      WdiffError, WdiffIOError)
from ..fsutil import atomic_write_bytes, io_error
from ..progress import SILENT, Reporter
from .base import CHAIN, MAX_CHAIN_OBJECT, Upload, Writer, check_deletable, check_fetch_args, check_prefix

#: download piece: what a dropped connection costs at most, and the memory a fetch holds
PIECE = 4 * 1024 * 1024
#: S3 multipart chunk (S3 wants at least 5 MiB per part but the last, at most 10,000 parts)
CHUNK = 8 * 1024 * 1024
MAX_PARTS = 10_000
#: S3 multipart chunks uploaded at once (each held in memory while it goes)
UPLOADERS = 4
#: protocols that are not stores one can push to (read-only, or not a store)
_REFUSED = {"http", "https", "file", "local", "hf", "github", "git", "zip", "tar",
            "reference", "cached", "simplecache", "filecache", "blockcache", "dir", "libarchive", "jlab",
            "jupyter", "data"}
_ALIASES = {"gcs": "gs", "s3a": "s3", "abfss": "abfs"}
#: the extra that installs each protocol's library
_EXTRAS = {"s3": ("s3", "s3fs"), "gs": ("gcs", "gcsfs"), "az": ("azure", "adlfs"), "abfs": ("azure", "adlfs")}
_SCHEME = re.compile(r"([a-z][a-z0-9+.-]*)://(.*)", re.S)
#: Cache-Control of what wdiff writes where the store keeps it (S3, and
#: GCS's chain): objects and signatures are named by their content and never
#: change, so a fleet's cache may keep them for ever; the chain index (and
#: a stage's objects, which a rerun may replace) must be asked for again
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
_IMMUTABLE_FOLDERS = ("objects", "signatures")


def cache_control(path: str) -> str:
    """The Cache-Control an object at ``path`` (relative to the remote's
    root) is written with."""
    return IMMUTABLE if path.split("/", 1)[0] in _IMMUTABLE_FOLDERS and path != CHAIN else REVALIDATE


def parse(url: str) -> dict:
    """``{"kind": "objstore", "protocol", "bucket", "prefix"}``; UsageError
    when the URL is malformed or names no store wdiff can push to."""
    m = _SCHEME.fullmatch(url)
    shown = _shown(url)
    if not m:
        raise UsageError(f"{shown}: not a store URL")
    protocol = _ALIASES.get(m.group(1), m.group(1))
    if protocol in _REFUSED or not _known(protocol):
        raise UsageError(f"{shown}: unsupported remote (use a directory, file://, hf://, s3://, gs://, az:// "
                         "or another fsspec store URL)")
    rest = m.group(2)
    bucket, _, prefix = rest.partition("/")
    # a bucket name; Azure's may name the account (CONTAINER@ACCOUNT.dfs.core.windows.net)
    name = r"[A-Za-z0-9][A-Za-z0-9._@-]*" if protocol in ("az", "abfs") else r"[A-Za-z0-9][A-Za-z0-9._-]*"
    if protocol != "memory" and not re.fullmatch(name, bucket or ""):
        raise UsageError(f"{shown}: expected {m.group(1)}://BUCKET[/PREFIX]",
                         hint="credentials go in the store's own configuration, never in the URL")
    prefix = prefix.strip("/")
    if any(c in prefix for c in "?#\\") or any(ord(c) < 32 for c in prefix) or (
            prefix and any(p in ("", ".", "..") for p in prefix.split("/"))):
        raise UsageError(f"{shown}: bad prefix {prefix!r}")
    return {"kind": "objstore", "protocol": protocol, "bucket": bucket, "prefix": prefix}


def _shown(url: str) -> str:
    """``url`` for a message, with anything like ``user:secret@`` masked."""
    return re.sub(r"(://)[^/@]*:[^/@]*@", r"\1***@", url)


def _known(protocol: str) -> bool:
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:  # pragma: no cover - fsspec comes with huggingface_hub
        return protocol in _EXTRAS
    return protocol in known_implementations or protocol in registry


def _filesystem(url: str, protocol: str):
    import fsspec

    if protocol == "s3":
        try:
            import s3fs  # noqa: F401 - fsspec's registry loads it; imported here for a clear error
        except ImportError:
            raise UsageError(f"{url}: s3:// remotes need s3fs", hint="pip install 'wdiff[s3]'") from None
    # every open is fresh (no instance cache: credentials may have changed)
    # and lists nothing from a cache: sizes and existence are the store's word
    opts: dict = {"skip_instance_cache": True}
    if protocol in ("s3", "gs", "az", "abfs"):
        opts["use_listings_cache"] = False
    try:
        return fsspec.filesystem(protocol, **opts)
    except ImportError:
        extra, lib = _EXTRAS.get(protocol, (None, None))
        hint = f"pip install 'wdiff[{extra}]'" if extra else f"install the fsspec implementation for {protocol}://"
        raise UsageError(f"{url}: {protocol}:// remotes need {lib or 'an fsspec implementation'}", hint=hint) from None
    except ValueError as e:  # pragma: no cover - an unknown protocol after all
        raise UsageError(f"{url}: {_scrub(str(e))}") from None


# -- errors: the stores' exceptions as wdiff's, secrets scrubbed ---------------------------

_AUTH_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
               "AccountProblem", "AllAccessDisabled", "RequestTimeTooSkewed", "InvalidSecurity", "NotSignedUp",
               "AuthorizationHeaderMalformed", "AuthenticationFailed", "AuthorizationFailure"}
_AUTH_HINT = ("check the store's credentials (for S3: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
              "AWS_PROFILE, AWS_ENDPOINT_URL)")


def _scrub(text: str) -> str:
    for name in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN",
                 "AZURE_STORAGE_CONNECTION_STRING", "AZURE_CLIENT_SECRET", "AWS_ACCESS_KEY_ID"):
        v = os.environ.get(name)
        if v and len(v) >= 4:
            text = text.replace(v, "***")
    return text[:300]


def _client_error(e: BaseException):
    """The botocore ClientError behind an exception s3fs translated (or the
    exception itself), as (code, HTTP status); (None, None) when none."""
    for x in (e, e.__cause__, e.__context__):
        resp = getattr(x, "response", None)
        if isinstance(resp, dict) and "Error" in resp:
            status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return resp["Error"].get("Code"), status
    code = getattr(e, "code", None)  # gcsfs.HttpError, azure's HttpResponseError
    if isinstance(code, int):
        return None, code
    status = getattr(e, "status_code", None)
    if isinstance(status, int):
        return getattr(e, "error_code", None), status
    return None, None


@contextlib.contextmanager
def store_errors(url: str, what: str, *, conflict: bool = False):
    """Map the stores' exceptions to wdiff's, in one place. ``conflict``:
    a failed precondition (HTTP 412, or 409 for a concurrent conditional
    write) means someone else wrote the chain."""
    try:
        yield
    except WdiffError:
        raise
    except Exception as e:  # noqa: BLE001 - fsspec, s3fs, aiohttp and botocore raise their own types
        code, status = _client_error(e)
        name = type(e).__name__
        if conflict and (status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict")
                         or isinstance(e, FileExistsError)):
            raise ConflictError(f"{url}: the chain changed since it was read (another push?)",
                                hint="run the push again") from None
        if (code in _AUTH_CODES or status in (401, 403) or isinstance(e, PermissionError)
                or name in ("NoCredentialsError", "PartialCredentialsError", "NoAuthTokenError",
                            "ClientAuthenticationError", "CredentialRetrievalError")):
            why = code or (f"HTTP {status}" if status else name)
            raise AuthError(f"{url}: {what}: the store refused the credentials ({why})", hint=_AUTH_HINT) from None
        if isinstance(e, FileNotFoundError) or status == 404 or code in ("NoSuchKey", "NoSuchBucket", "404"):
            raise NotFoundError(f"{url}: {what}: not found") from None
        detail = f"{code or name}" + (f" (HTTP {status})" if status else "")
        if not code:
            detail += f": {_scrub(_first_line(e))}"
        raise RemoteError(f"{url}: {what}: {detail}", hint="check the network and the store; try again") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


# -- the generic store -------------------------------------------------------------------


class ObjectStore(Writer):
    """Any fsspec file system. No conditional write: see the module's docstring."""

    #: whether the chain is replaced with a compare-and-swap the store enforces
    conditional = False

    def __init__(self, url: str, fs, root: str) -> None:
        self.url = url
        self.fs = fs
        self.root = root.rstrip("/")
        self._sizes: dict[str, int] = {}

    def _key(self, rel: str) -> str:
        if rel.startswith("/") or any(p in ("", ".", "..") for p in rel.split("/")):
            raise IntegrityError(f"{self.url}: refusing object name {rel!r}")
        return f"{self.root}/{rel}" if self.root else rel

    # reading ---------------------------------------------------------------------------

    def _exists(self) -> bool:
        with store_errors(self.url, "remote"):
            self.fs.invalidate_cache()
            return bool(self.fs.exists(self.root)) if self.root else True

    def read_chain(self) -> tuple[bytes | None, object]:
        raw = self._cat_chain()
        if raw is None:
            return None, (b"" if self._exists() else None)
        return raw, xxhash.xxh3_128_digest(raw)

    def _cat_chain(self) -> bytes | None:
        key = self._key(CHAIN)
        try:
            with store_errors(self.url, CHAIN):
                info = self.fs.info(key)
        except NotFoundError:
            return None
        self._check_info(CHAIN, info, max_size=MAX_CHAIN_OBJECT, chain=True)
        with store_errors(self.url, CHAIN):
            raw = self.fs.cat_file(key, start=0, end=MAX_CHAIN_OBJECT + 1)
        if len(raw) > MAX_CHAIN_OBJECT:
            raise FormatError(f"{self.url}: chain index is larger than this wdiff accepts",
                              hint="start a new remote from a fresh anchor")
        return raw

    def _check_info(self, path: str, info: dict, *, size: int | None = None, max_size: int | None = None,
                    chain: bool = False) -> int:
        if info.get("type", "file") != "file":
            raise IntegrityError(f"{self.url}: {path} is not a plain object (damaged remote)")
        have = int(info.get("size") or 0)
        if size is not None and have != size:
            raise IntegrityError(f"{self.url}: {path} is not {size} bytes long (damaged remote)")
        if max_size is not None and have > max_size:
            if chain:
                raise FormatError(f"{self.url}: chain index is larger than this wdiff accepts",
                                  hint="start a new remote from a fresh anchor")
            raise IntegrityError(f"{self.url}: {path}: {have} bytes, more than the {max_size} this object may have")
        return have

    def _info(self, path: str) -> dict:
        with store_errors(self.url, path):
            try:
                return self.fs.info(self._key(path))
            except FileNotFoundError:
                raise NotFoundError(f"{self.url}: object {path} is missing") from None

    def _size(self, path: str, size: int) -> None:
        """Check once per store that object ``path`` is ``size`` bytes long."""
        if self._sizes.get(path) != size:
            self._check_info(path, self._info(path), size=size)
            self._sizes[path] = size

    def _read(self, path: str, start: int, end: int) -> bytes:
        with store_errors(self.url, path):
            return self.fs.cat_file(self._key(path), start=start, end=end)

    def fetch(self, path: str, dest: str, *, size: int | None = None, max_size: int | None = None,
              reporter: Reporter = SILENT, at: str | None = None) -> None:
        check_fetch_args(size, max_size)
        if size is None:
            have = self._check_info(path, self._info(path), max_size=max_size)
            data = self._read(path, 0, have) if have else b""
            if len(data) > max_size:
                raise IntegrityError(f"{self.url}: {path}: more than the {max_size} bytes this object may have")
            atomic_write_bytes(dest, data)
            reporter.advance(len(data))
            return
        self._size(path, size)
        try:
            have = os.path.getsize(dest) if os.path.exists(dest) else 0
            if have > size:  # not a prefix of this object
                os.unlink(dest)
                have = 0
            reporter.file(path, size)
            if have:
                reporter.advance(have)
            with open(dest, "ab") as out:
                while have < size:
                    end = min(size, have + PIECE)
                    piece = self._read(path, have, end)
                    if len(piece) != end - have:
                        raise RemoteError(f"{self.url}: {path}: the store sent {len(piece)} bytes of a "
                                          f"{end - have}-byte range", hint="try again")
                    out.write(piece)
                    out.flush()  # what arrived stays for a rerun, whatever happens next
                    have = end
                    reporter.advance(len(piece))
        except OSError as e:
            raise io_error(dest, e) from None

    def fetch_range(self, path: str, offset: int, length: int, *, size: int, at: str | None = None) -> bytes:
        if offset < 0 or length < 0 or offset + length > size:
            raise ValueError("a range outside the object")
        self._size(path, size)
        data = self._read(path, offset, offset + length) if length else b""
        if len(data) != length:
            raise IntegrityError(f"{self.url}: {path} ended early (damaged remote)")
        return data

    def list(self, prefix: str = "") -> list[tuple[str, int]]:
        prefix = check_prefix(prefix)
        base = self._key(prefix) if prefix else self.root
        with store_errors(self.url, "list"):
            self.fs.invalidate_cache()
            try:
                found = self.fs.find(base, detail=True)
            except FileNotFoundError:
                return []
        root = self.root.lstrip("/")  # some file systems (memory://) name everything from "/"
        cut = len(root) + 1 if root else 0
        out = []
        for name, info in found.items():
            name = name.lstrip("/")
            if info.get("type", "file") != "file" or (root and not name.startswith(root + "/")):
                continue
            rel = name[cut:]
            if rel and (not prefix or rel.startswith(prefix + "/")):
                out.append((rel, int(info.get("size") or 0)))
        return sorted(out)

    # writing ---------------------------------------------------------------------------

    def store(self, uploads: list[Upload], *, reporter: Reporter = SILENT) -> None:
        for u in uploads:
            if u.path == CHAIN:
                raise UsageError(f"{self.url}: store() never writes the chain index")
            self._upload(u, reporter)

    def delete(self, paths: list[str]) -> None:
        check_deletable(paths)
        keys = [self._key(p) for p in paths]
        for k in keys:
            with contextlib.suppress(NotFoundError), store_errors(self.url, "delete"):
                try:
                    self.fs.rm_file(k)
                except FileNotFoundError:
                    pass
        for p in paths:
            self._sizes.pop(p, None)

    def publish(self, uploads: list[Upload], chain: bytes, token: object, *, message: str,
                reporter: Reporter = SILENT) -> None:
        if not self.conditional:
            reporter.warn(f"{self.url}: this store has no conditional write; two pushes at the same moment "
                          "can overwrite each other's chain entry (push from one place at a time)")
        self._check_token(token)  # fail early, before uploading anything
        self.store(uploads, reporter=reporter)
        self._write_chain(chain, token)

    def _check_token(self, token: object) -> None:
        _, current = self.read_chain()
        if current != token and not (token is None and current == b""):
            raise ConflictError(f"{self.url}: the chain changed since it was read (another push?)",
                                hint="run the push again")

    def _write_chain(self, chain: bytes, token: object) -> None:
        self._check_token(token)
        with store_errors(self.url, "write chain"):
            self.fs.pipe_file(self._key(CHAIN), chain)

    def _stored(self, u: Upload) -> bool:
        """An object an earlier, interrupted push stored whole (the chain's
        digest guards its content on every pull)."""
        try:
            info = self._info(u.path)
        except NotFoundError:
            return False
        return info.get("type", "file") == "file" and int(info.get("size") or -1) == u.length

    def _upload(self, u: Upload, reporter: Reporter) -> None:
        if self._stored(u):
            reporter.advance(u.length)
            return
        left = u.length
        with store_errors(self.url, f"upload {u.path}"):
            out = self.fs.open(self._key(u.path), "wb", block_size=CHUNK)
            try:
                while left:
                    piece = _read_range(u.source, u.offset + u.length - left, min(CHUNK, left))
                    out.write(piece)
                    left -= len(piece)
                    reporter.advance(len(piece))
            except BaseException:
                # never commit a part that did not arrive whole (closing would)
                with contextlib.suppress(Exception):
                    out.discard()
                    out.closed = True
                raise
            out.close()


def _read_range(path: str, offset: int, length: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(length)
    except OSError as e:
        raise io_error(path, e) from None
    if len(data) != length:
        raise WdiffIOError(f"{path}: shorter than expected")
    return data
