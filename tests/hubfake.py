"""A local stand-in for the Hugging Face Hub, for tests that must never touch the internet.

``FakeHub`` runs a ``ThreadingHTTPServer`` on 127.0.0.1 that the *real* ``huggingface_hub`` client
(2.4, which speaks HTTP through ``httpx2``) and the *real* ``hf_xet`` (Rust) talk to:

- model and dataset repositories: create, info, preupload, atomic NDJSON commits (with
  ``parentCommit`` -> HTTP 412 when stale), per-commit trees (files stay readable at old shas),
  tree listing, paths-info, refs, commits, branch creation (``POST .../branch/{name}``, from
  ``startingPoint``), visibility (a private repository is invisible without a valid token: the
  Hub answers a request without one 401 "RepoNotFound", for a missing repository as well; with a
  token, 404), the model card's YAML metadata reported by repo info (``cardData``, ``tags``), and
  ``/resolve`` downloads (HEAD + GET, with ``Range``);
- uploads through the legacy LFS protocol (``HF_HUB_DISABLE_XET=1``: batch + basic PUT + verify)
  and through Xet: the Xet token endpoints answer with a ``local://<tmp>/cas`` CAS URL, which
  hf_xet treats as a local folder where it runs its real chunking/dedup/reconstruction. The server
  reads the shard files (``*.mdb``) hf_xet writes there to learn which (xet hash, size, sha256)
  files exist, and reconstructs bytes with hf_xet when a file must be served over plain HTTP;
- Storage Buckets (Xet only): create, info, delete, tree, paths-info, batch, resolve.

State lives in memory (small dataclasses below) plus blob files under the directory passed in.

How a test configures the client (see ``configure_client``, which does all of this)::

    from hubfake import FakeHub, configure_client, block_internet

    def test_x(tmp_path, monkeypatch):
        block_internet(monkeypatch)                     # only 127.0.0.1 / ::1 may be reached
        with FakeHub(tmp_path / "hub") as hub:
            configure_client(monkeypatch, hub, xet=True, home=tmp_path / "hf_home")
            api = HfApi(endpoint=hub.endpoint, token=hub.token)
            ...

``configure_client`` sets the environment (``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HOME``,
``HF_HUB_CACHE``, ``HF_XET_CACHE``, ``HF_HUB_DISABLE_TELEMETRY=1``, ``HF_HUB_DISABLE_XET``...)
*and* patches the ``huggingface_hub.constants`` that are read once at import time:
``ENDPOINT`` together with ``HUGGINGFACE_CO_URL_TEMPLATE`` (``hf_hub_url`` formats the template and
only swaps the endpoint prefix when the URL starts with ``constants.ENDPOINT``: patching one without
the other sends downloads to huggingface.co), ``HF_HUB_DISABLE_XET`` (checked on every call by
``is_xet_available()``), ``HF_HUB_DISABLE_TELEMETRY`` (otherwise ``build_hf_headers`` fetches
``{ENDPOINT}/api/agent-harnesses`` to build the user agent), ``HF_HUB_OFFLINE``, the cache and token
paths. It also gives the client a fresh ``httpx2`` session, a fresh Xet session (created lazily with
the environment above) and an empty Xet token cache, since those are process-wide.

Fault injection (``hub.faults``), e.g.::

    hub.faults.fail("commit", status=503)              # next POST .../commit answers 503
    hub.faults.fail("upload", status=500, times=2)     # LFS PUT or Xet write-token
    hub.faults.truncate_download("model.bin", 1000)    # full Content-Length, 1000 bytes, then close
    hub.faults.short_download("model.bin", 1000)       # Content-Length 1000: a clean but short body
    hub.faults.corrupt_download("model.bin")           # one byte flipped, same length

Download faults act on plain HTTP GETs of ``/resolve``. A Xet-enabled client fetches Xet files from
the CAS folder instead, so while a download fault is armed for a path, HEAD ``/resolve`` for that
path leaves out the Xet headers and the client falls back to HTTP (``serve_xet=False`` does the
same for every file).

``hub.requests`` counts requests per route name (``"resolve"``, ``"commit"``...) and per
``"METHOD route"`` (``"GET resolve"``); ``hub.log`` keeps every request (with its ``Range`` header,
its ``Authorization`` header's presence, and the body bytes sent for file downloads); ``hub.unhandled`` lists
requests no route matched (tests should assert it stays empty).
"""

from __future__ import annotations

import base64
import collections
import fnmatch
import hashlib
import hmac
import importlib
import json
import os
import re
import secrets
import socket
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, unquote, urlsplit

DEFAULT_TOKEN = "hf_fake_token"
DEFAULT_USER = "fake-user"

# Files at or above this size are always stored with LFS/Xet (the Hub rejects larger regular files).
REGULAR_MAX_BYTES = 10 * 1000 * 1000

# The .gitattributes the Hub writes into every new repository: these patterns are LFS-tracked.
LFS_PATTERNS = (
    "*.7z *.arrow *.bin *.bz2 *.ckpt *.ftz *.gz *.h5 *.joblib *.lfs.* *.mlmodel *.model *.msgpack *.npy "
    "*.npz *.onnx *.ot *.parquet *.pb *.pickle *.pkl *.pt *.pth *.rar *.safetensors *.tar.* *.tar *.tflite "
    "*.tgz *.wasm *.xz *.zip *.zst *tfevents*"
).split()
GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in LFS_PATTERNS)

TOKEN_TTL_S = 3600


def _now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _iso_from_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def git_blob_oid(data: bytes) -> str:
    """The git object id of a blob: what the Hub reports as a file's ``oid``/``blob_id``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


# =============================================================================
# State
# =============================================================================


@dataclass(frozen=True)
class FileEntry:
    """One file in one commit's tree. Immutable: trees of old commits share entries."""

    path: str
    size: int
    sha256: str  # of the content, for every file
    git_oid: str  # git blob id: of the content (regular file) or of the LFS pointer (LFS/Xet file)
    lfs: bool
    xet_hash: str | None = None  # set when the bytes live in the Xet CAS


@dataclass
class Commit:
    oid: str
    parent: str | None
    title: str
    message: str
    date: str
    files: dict[str, FileEntry]  # the full tree after this commit, path -> entry


@dataclass
class Repo:
    repo_type: str  # "model" | "dataset" | "space"
    repo_id: str
    private: bool
    created_at: str
    branches: dict[str, str] = field(default_factory=dict)  # branch -> head commit oid
    commits: dict[str, Commit] = field(default_factory=dict)


@dataclass(frozen=True)
class BucketEntry:
    path: str
    size: int
    xet_hash: str
    mtime_ms: int
    uploaded_at: str
    content_type: str | None = None


@dataclass
class Bucket:
    bucket_id: str
    private: bool
    created_at: str
    files: dict[str, BucketEntry] = field(default_factory=dict)


@dataclass(frozen=True)
class XetFile:
    """A file hf_xet registered in the CAS folder (read from its shard files)."""

    xet_hash: str
    size: int
    sha256: str | None  # only when the uploader asked hf_xet to compute it (repos do, buckets don't)


@dataclass
class RequestRecord:
    method: str
    path: str
    route: str | None
    status: int | None = None
    range: str | None = None  # the Range header, if any
    authorized: bool = False  # an Authorization header was sent
    sent: int = 0  # body bytes of a file download actually written to the socket


class HubError(Exception):
    """Raised by route handlers; turned into an error response the client understands."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code  # value of the X-Error-Code header (RepoNotFound, RevisionNotFound, EntryNotFound)
        self.headers = headers or {}


# =============================================================================
# Xet CAS folder: shard parsing and reconstruction
# =============================================================================

# MDB shard layout (xet-core `mdb_shard`, format version 2), all records 48 bytes:
#   header: 32-byte tag ("HFRepoMetaData\0" + magic), u64 version, u64 footer size
#   file info section, per file:
#     FileDataSequenceHeader: file hash (4 x u64 LE), u32 flags, u32 entry count, 8 unused bytes
#     count x FileDataSequenceEntry: xorb hash (32), u32 xorb flags, u32 unpacked bytes, u32 chunk start, u32 end
#     count x FileVerificationEntry (48 bytes)      if flags & 1<<31
#     FileMetadataExt: sha256 (4 x u64 LE) + 16 unused bytes   if flags & 1<<30
#   then a bookend record whose hash is all 0xff, then the xorb section and the footer (not needed here).
_SHARD_TAG = b"HFRepoMetaData\0"
_SHARD_HEADER = 48
_SHARD_RECORD = 48
_FLAG_VERIFICATION = 1 << 31
_FLAG_METADATA_EXT = 1 << 30


def _xet_hex(raw: bytes) -> str:
    """Xet's hex form of a 32-byte hash: four little-endian u64, each printed as 16 hex digits."""
    return "".join(f"{v:016x}" for v in struct.unpack("<4Q", raw))


def parse_shard(data: bytes) -> list[XetFile]:
    if not data.startswith(_SHARD_TAG):
        raise ValueError("not an MDB shard")
    out = []
    off = _SHARD_HEADER
    while off + _SHARD_RECORD <= len(data):
        raw_hash = data[off : off + 32]
        if raw_hash == b"\xff" * 32:  # bookend: end of the file info section
            break
        flags, count = struct.unpack_from("<II", data, off + 32)
        off += _SHARD_RECORD
        size = 0
        for _ in range(count):
            (unpacked,) = struct.unpack_from("<I", data, off + 36)
            size += unpacked
            off += _SHARD_RECORD
        if flags & _FLAG_VERIFICATION:
            off += _SHARD_RECORD * count
        sha256 = None
        if flags & _FLAG_METADATA_EXT:
            sha256 = _xet_hex(data[off : off + 32])
            off += _SHARD_RECORD
        out.append(XetFile(xet_hash=_xet_hex(raw_hash), size=size, sha256=sha256))
    return out


class XetCas:
    """The ``local://`` CAS folder shared with hf_xet, indexed by reading the shards it writes."""

    def __init__(self, root: Path):
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = "local://" + str(self.root.resolve())
        self._lock = threading.Lock()
        self._seen: dict[Path, tuple[int, int]] = {}  # shard -> (size, mtime) when it was parsed
        self._by_hash: dict[str, XetFile] = {}
        self._by_sha256: dict[str, XetFile] = {}
        self._session = None

    def _refresh(self) -> None:
        for shard in self.root.rglob("*.mdb"):  # xorbs/shards/ (uploads) and the client's shard-cache/
            try:
                st = shard.stat()
                if self._seen.get(shard) == (st.st_size, st.st_mtime_ns):
                    continue
                files = parse_shard(shard.read_bytes())
            except (OSError, ValueError, struct.error):
                continue  # being written: retry on the next lookup
            self._seen[shard] = (st.st_size, st.st_mtime_ns)
            for f in files:
                self._by_hash.setdefault(f.xet_hash, f)
                if f.sha256 is not None:
                    self._by_sha256.setdefault(f.sha256, f)

    def by_hash(self, xet_hash: str) -> XetFile | None:
        with self._lock:
            if xet_hash not in self._by_hash:
                self._refresh()
            return self._by_hash.get(xet_hash)

    def by_sha256(self, sha256: str) -> XetFile | None:
        with self._lock:
            if sha256 not in self._by_sha256:
                self._refresh()
            return self._by_sha256.get(sha256)

    def reconstruct(self, xet_hash: str, size: int, dest: Path) -> None:
        """Rebuild a file's bytes from the CAS folder with hf_xet (used to serve plain HTTP GETs)."""
        import hf_xet

        with self._lock:
            if self._session is None:
                self._session = hf_xet.XetSession()
            session = self._session
        with session.new_file_download_group(
            endpoint=self.url, token="fake-xet-token", token_expiry_unix_secs=int(time.time()) + TOKEN_TTL_S
        ) as group:
            group.start_download_file(hf_xet.XetFileInfo(xet_hash, size), str(dest))


class BlobStore:
    """File bytes by content: ``sha256/<hex>`` (commits, LFS uploads) and ``xet/<hash>`` (bucket files)."""

    def __init__(self, root: Path, cas: XetCas):
        self.root = root
        self.cas = cas
        (root / "sha256").mkdir(parents=True, exist_ok=True)
        (root / "xet").mkdir(parents=True, exist_ok=True)
        (root / "tmp").mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def sha256_path(self, sha256: str) -> Path:
        return self.root / "sha256" / sha256

    def has_sha256(self, sha256: str) -> bool:
        return self.sha256_path(sha256).is_file()

    def put(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        dest = self.sha256_path(sha)
        if not dest.is_file():
            tmp = self._tmp()
            tmp.write_bytes(data)
            os.replace(tmp, dest)
        return sha

    def _tmp(self) -> Path:
        return self.root / "tmp" / secrets.token_hex(8)

    def path_for(self, *, size: int, sha256: str | None, xet_hash: str | None) -> Path:
        """Local path holding the bytes, reconstructing them from the Xet CAS on first use."""
        if sha256 is not None and self.has_sha256(sha256):
            return self.sha256_path(sha256)
        if xet_hash is None:
            raise HubError(500, f"FakeHub lost the bytes of blob {sha256}")
        dest = self.sha256_path(sha256) if sha256 is not None else self.root / "xet" / xet_hash
        with self._lock:
            if not dest.is_file():
                tmp = self._tmp()
                self.cas.reconstruct(xet_hash, size, tmp)
                if sha256 is not None and _sha256_file(tmp) != sha256:
                    tmp.unlink(missing_ok=True)
                    raise HubError(500, f"FakeHub: Xet reconstruction of {xet_hash} does not match sha256 {sha256}")
                os.replace(tmp, dest)
        return dest


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# =============================================================================
# Fault injection
# =============================================================================

ROUTE_ALIASES = {"upload": {"lfs_upload", "xet_write_token"}}


@dataclass
class _Fault:
    kind: str  # "fail" | "truncate" | "short" | "corrupt"
    routes: set[str] | None = None  # for "fail"
    path_substring: str | None = None
    status: int = 503
    nbytes: int = 0
    remaining: int = 1


class Faults:
    """One-shot / N-shot switches tests arm; each firing decrements ``remaining``."""

    def __init__(self, known_routes: set[str]):
        self._known = known_routes
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self.fired: list[tuple[str, str]] = []  # (kind, route or path) of every fault that fired

    def fail(self, route: str, status: int = 503, times: int = 1, path_substring: str | None = None) -> None:
        """Answer the next ``times`` requests of ``route`` (a route name or "upload") with ``status``."""
        routes = ROUTE_ALIASES.get(route, {route})
        unknown = routes - self._known
        if unknown:
            raise ValueError(f"unknown route(s) {sorted(unknown)}; known: {sorted(self._known | set(ROUTE_ALIASES))}")
        self._add(_Fault("fail", routes=routes, path_substring=path_substring, status=status, remaining=times))

    def truncate_download(self, path_substring: str, nbytes: int, times: int = 1) -> None:
        """Declare the full Content-Length, send only ``nbytes`` of the body, then close the connection."""
        self._add(_Fault("truncate", path_substring=path_substring, nbytes=nbytes, remaining=times))

    def short_download(self, path_substring: str, nbytes: int, times: int = 1) -> None:
        """Answer with a well-formed response whose body (and Content-Length) is only ``nbytes`` long."""
        self._add(_Fault("short", path_substring=path_substring, nbytes=nbytes, remaining=times))

    def corrupt_download(self, path_substring: str, times: int = 1) -> None:
        """Flip one byte (in the middle of the file) of the served content; the length is unchanged."""
        self._add(_Fault("corrupt", path_substring=path_substring, remaining=times))

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def pending(self) -> list[_Fault]:
        with self._lock:
            return [f for f in self._faults if f.remaining > 0]

    def _add(self, fault: _Fault) -> None:
        if fault.remaining < 1:
            raise ValueError("times must be >= 1")
        with self._lock:
            self._faults.append(fault)

    def _take(self, match: Callable[[_Fault], bool], what: str) -> _Fault | None:
        with self._lock:
            for f in self._faults:
                if f.remaining > 0 and match(f):
                    f.remaining -= 1
                    self.fired.append((f.kind, what))
                    return f
        return None

    def take_failure(self, route: str, path: str) -> int | None:
        f = self._take(
            lambda f: f.kind == "fail"
            and route in (f.routes or ())
            and (f.path_substring is None or f.path_substring in path),
            route,
        )
        return None if f is None else f.status

    def download_armed(self, file_path: str) -> bool:
        with self._lock:
            return any(
                f.remaining > 0 and f.kind != "fail" and f.path_substring in file_path for f in self._faults
            )

    def take_download(self, file_path: str) -> _Fault | None:
        return self._take(lambda f: f.kind != "fail" and f.path_substring in file_path, file_path)


# =============================================================================
# HTTP handler: one class, one route table
# =============================================================================

_TYPES = r"(?P<types>models|datasets|spaces)"
_REPO = r"(?P<ns>[^/]+)/(?P<name>[^/]+)"
_PREFIX = r"(?:(?P<prefix>datasets|spaces)/)?"  # web URLs: "" for models, "datasets/" for datasets
_REV = r"(?P<rev>[^/]+)"  # the client quotes revisions with safe="" ("refs/pr/1" -> "refs%2Fpr%2F1")

# (methods, path regex, route name, handler method). First match wins.
ROUTES: list[tuple[tuple[str, ...], str, str, str]] = [
    (("POST",), r"/api/repos/create", "create_repo", "create_repo"),
    (("DELETE",), r"/api/repos/delete", "delete_repo", "delete_repo"),
    (("GET",), rf"/api/{_TYPES}/{_REPO}(?:/revision/{_REV})?", "repo_info", "repo_info"),
    (("POST",), rf"/api/{_TYPES}/{_REPO}/preupload/{_REV}", "preupload", "preupload"),
    (("POST",), rf"/api/{_TYPES}/{_REPO}/commit/{_REV}", "commit", "commit"),
    (("GET",), rf"/api/{_TYPES}/{_REPO}/tree/{_REV}(?:/(?P<path>.*))?", "tree", "tree"),
    (("POST",), rf"/api/{_TYPES}/{_REPO}/paths-info/{_REV}", "paths_info", "paths_info"),
    (("GET",), rf"/api/{_TYPES}/{_REPO}/refs", "refs", "refs"),
    (("GET",), rf"/api/{_TYPES}/{_REPO}/commits/{_REV}", "commits", "commits"),
    (("POST",), rf"/api/{_TYPES}/{_REPO}/branch/{_REV}", "create_branch", "create_branch"),
    (("GET",), rf"/api/{_TYPES}/{_REPO}/xet-read-token/{_REV}", "xet_read_token", "repo_xet_token"),
    (("GET",), rf"/api/{_TYPES}/{_REPO}/xet-write-token/{_REV}", "xet_write_token", "repo_xet_token"),
    (("POST",), rf"/{_PREFIX}{_REPO}\.git/info/lfs/objects/batch", "lfs_batch", "lfs_batch"),
    (("POST",), rf"/{_PREFIX}{_REPO}\.git/info/lfs/objects/verify", "lfs_verify", "lfs_verify"),
    (("PUT",), r"/_fake_lfs/(?P<oid>[0-9a-f]{64})", "lfs_upload", "lfs_upload"),
    (("POST",), rf"/api/buckets/{_REPO}", "bucket_create", "bucket_create"),
    (("GET",), rf"/api/buckets/{_REPO}", "bucket_info", "bucket_info"),
    (("DELETE",), rf"/api/buckets/{_REPO}", "bucket_delete", "bucket_delete"),
    (("GET",), rf"/api/buckets/{_REPO}/tree(?:/(?P<path>.*))?", "bucket_tree", "bucket_tree"),
    (("POST",), rf"/api/buckets/{_REPO}/paths-info", "bucket_paths_info", "bucket_paths_info"),
    (("POST",), rf"/api/buckets/{_REPO}/batch", "bucket_batch", "bucket_batch"),
    (("GET",), rf"/api/buckets/{_REPO}/xet-read-token", "xet_read_token", "bucket_xet_token"),
    (("GET",), rf"/api/buckets/{_REPO}/xet-write-token", "xet_write_token", "bucket_xet_token"),
    (("HEAD", "GET"), rf"/buckets/{_REPO}/resolve/(?P<path>.+)", "bucket_resolve", "bucket_resolve"),
    (("HEAD", "GET"), rf"/{_PREFIX}{_REPO}/resolve/{_REV}/(?P<path>.+)", "resolve", "resolve"),
    (("POST",), r"/api/validate-yaml", "validate_yaml", "validate_yaml"),
    (("GET",), r"/api/agent-harnesses", "agent_harnesses", "agent_harnesses"),
]
_COMPILED = [(methods, re.compile(pattern + r"/?"), name, fn) for methods, pattern, name, fn in ROUTES]
ROUTE_NAMES = {name for _, _, name, _ in ROUTES}


@dataclass
class _Response:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    # for file downloads: stream ``length`` bytes of ``file`` from ``offset`` instead of ``body``
    file: Path | None = None
    offset: int = 0
    length: int = 0
    content_length: int | None = None  # overrides the Content-Length header (HEAD: the file's size)
    corrupt_at: int | None = None  # absolute file offset of a byte to flip
    close_after: int | None = None  # send this many body bytes, then drop the connection


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> _Response:
    return _Response(status=status, body=json.dumps(obj).encode(), headers=headers or {})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like the Hub: every response carries a Content-Length
    hub: FakeHub  # set on a per-server subclass

    # ---- plumbing -----------------------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        self.hub._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.hub._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence stderr logging
        pass

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        split = urlsplit(self.path)
        self.query = parse_qs(split.query)
        self._body: bytes | None = None
        record = RequestRecord(self.command, self.path, None, range=self.headers.get("Range"),
                               authorized=self.headers.get("Authorization") is not None)
        self.hub.log.append(record)
        self._record = record
        try:
            for methods, regex, name, fn in _COMPILED:
                m = regex.fullmatch(split.path)
                if m is None or self.command not in methods:
                    continue
                record.route = name
                self.hub._count(self.command, name)
                self.route = name
                self.params = {k: unquote(v) for k, v in m.groupdict().items() if v is not None}
                self._check_token()
                status = self.hub.faults.take_failure(name, unquote(split.path))
                if status is not None:
                    self.read_body()  # keep the connection in sync
                    raise HubError(status, f"FakeHub: injected failure on {name}")
                response = getattr(self, "r_" + fn)()
                break
            else:
                self.hub.unhandled.append(f"{self.command} {self.path}")
                self.read_body()
                response = _json({"error": f"FakeHub does not implement {self.command} {split.path}"}, 404)
        except HubError as e:
            headers = {"X-Error-Message": e.message, **e.headers}
            if e.code:
                headers["X-Error-Code"] = e.code
            response = _json({"error": e.message}, e.status, headers)
        except Exception as e:  # a bug in the fake: answer 500 and keep the trace for the test
            self.hub.errors.append(e)
            response = _json({"error": f"FakeHub internal error: {e!r}"}, 500)
        record.status = response.status
        self._send(response)

    def read_body(self) -> bytes:
        """The request body, whether sent with Content-Length or chunked (read once, then cached)."""
        if self._body is not None:
            return self._body
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            self._body = b"".join(parts)
        else:
            length = int(self.headers.get("Content-Length") or 0)
            self._body = self.rfile.read(length) if length else b""
        return self._body

    def json_body(self) -> Any:
        try:
            return json.loads(self.read_body() or b"{}")
        except ValueError:
            raise HubError(400, "FakeHub: malformed JSON body")

    def _send(self, r: _Response) -> None:
        self.read_body()  # anything the handler did not read must not be parsed as the next request
        self.send_response(r.status)
        for key, value in r.headers.items():
            self.send_header(key, value)
        self.send_header("Content-Type", r.content_type)
        if r.file is not None:
            length = r.length
        else:
            length = len(r.body)
        self.send_header("Content-Length", str(r.content_length if r.content_length is not None else length))
        if r.close_after is not None:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command == "HEAD":
            return
        if r.file is None:
            self.wfile.write(r.body)
            return
        to_send = length if r.close_after is None else min(length, r.close_after)
        with open(r.file, "rb") as f:
            f.seek(r.offset)
            pos = r.offset
            while to_send > 0:
                block = bytearray(f.read(min(to_send, 64 << 10)))  # small blocks: ``sent`` is what left
                if not block:
                    break
                if r.corrupt_at is not None and pos <= r.corrupt_at < pos + len(block):
                    block[r.corrupt_at - pos] ^= 0xFF
                self.wfile.write(block)
                self._record.sent += len(block)
                pos += len(block)
                to_send -= len(block)
        if r.close_after is not None:
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ---- auth ---------------------------------------------------------------------------------

    def _check_token(self) -> None:
        """A wrong token is refused on every route; ``self.authed`` says whether a valid one was sent."""
        auth = self.headers.get("Authorization")
        self.authed = False
        if auth is None or self.route == "lfs_upload":  # the PUT URL is pre-signed, like S3's
            return
        if not hmac.compare_digest(auth, f"Bearer {self.hub.token}"):
            # The Hub's message for a bad token; the client then keeps the plain HfHubHTTPError(401).
            raise HubError(401, "Invalid credentials in Authorization header")
        self.authed = True

    def _require_write(self) -> None:
        if not self.authed:
            raise HubError(401, "You must be authenticated to perform this operation (FakeHub: write needs a token)")

    # ---- lookups ------------------------------------------------------------------------------

    def _repo_type(self) -> str:
        # API URLs carry "models"/"datasets"/"spaces"; web URLs a "datasets/"/"spaces/" prefix or none.
        return (self.params.get("types") or self.params.get("prefix") or "models")[:-1]

    def _repo(self, *, write: bool = False) -> Repo:
        if write:
            self._require_write()
        repo_id = f"{self.params['ns']}/{self.params['name']}"
        repo = self.hub._repos.get((self._repo_type(), repo_id))
        if repo is None or (repo.private and not self.authed):
            raise self._not_found("Repository", repo_id)
        return repo

    def _not_found(self, what: str, name: str) -> HubError:
        """A repository or bucket this request may not see, as the Hub answers it: to a request
        without a token, 401 whether it is private or missing (the client cannot tell which, and
        huggingface_hub raises RepositoryNotFoundError for both, as ``hf download`` reports it); with
        a valid token, 404."""
        if self.headers.get("Authorization") is None:
            return HubError(401, f"{what} not found", "RepoNotFound")
        return HubError(404, f"{what} {name} not found", "RepoNotFound")

    def _commit(self, repo: Repo, rev: str) -> Commit:
        """Resolve a branch name (optionally ``refs/heads/<b>``) or a full commit sha."""
        branch = rev[len("refs/heads/") :] if rev.startswith("refs/heads/") else rev
        if branch in repo.branches:
            return repo.commits[repo.branches[branch]]
        if rev.lower() in repo.commits:
            return repo.commits[rev.lower()]
        raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")

    def _bucket(self, *, write: bool = False) -> Bucket:
        if write:
            self._require_write()
        bucket_id = f"{self.params['ns']}/{self.params['name']}"
        bucket = self.hub._buckets.get(bucket_id)
        if bucket is None or (bucket.private and not self.authed):
            raise self._not_found("Bucket", bucket_id)
        return bucket

    def _url_prefix(self, repo: Repo) -> str:
        return "" if repo.repo_type == "model" else f"{repo.repo_type}s/"

    # ---- repositories -------------------------------------------------------------------------

    def r_create_repo(self) -> _Response:
        self._require_write()
        body = self.json_body()
        repo_type = body.get("type") or "model"
        if repo_type not in ("model", "dataset", "space"):
            raise HubError(400, f"Invalid repo type {repo_type}")
        repo_id = f"{body.get('organization') or self.hub.username}/{body['name']}"
        private = body.get("visibility") == "private" or bool(body.get("private"))
        url = f"{self.hub.endpoint}/{'' if repo_type == 'model' else repo_type + 's/'}{repo_id}"
        with self.hub._lock:
            if (repo_type, repo_id) in self.hub._repos:
                return _json({"error": "You already created this repo", "url": url}, 409)
            self.hub._repos[(repo_type, repo_id)] = self.hub._new_repo(repo_type, repo_id, private)
        return _json({"url": url, "name": repo_id, "id": secrets.token_hex(12)})

    def r_delete_repo(self) -> _Response:
        self._require_write()
        body = self.json_body()
        key = (body.get("type") or "model", f"{body.get('organization') or self.hub.username}/{body['name']}")
        with self.hub._lock:
            if self.hub._repos.pop(key, None) is None:
                raise HubError(404, f"Repository {key[1]} not found", "RepoNotFound")
        return _json({})

    def r_repo_info(self) -> _Response:
        with self.hub._lock:
            repo = self._repo()
            commit = self._commit(repo, self.params.get("rev", "main"))
            with_blobs = self.query.get("blobs", ["false"])[0].lower() == "true"
            siblings = []
            for entry in sorted(commit.files.values(), key=lambda e: e.path):
                sibling: dict[str, Any] = {"rfilename": entry.path}
                if with_blobs:
                    sibling.update(size=entry.size, blobId=entry.git_oid)
                    if entry.lfs:
                        ptr = len(lfs_pointer(entry.sha256, entry.size))
                        sibling["lfs"] = {"size": entry.size, "sha256": entry.sha256, "pointerSize": ptr}
                siblings.append(sibling)
            card = self._card_data(commit)
            return _json(
                {
                    "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
                    "id": repo.repo_id,
                    "author": repo.repo_id.split("/")[0],
                    "sha": commit.oid,
                    "lastModified": commit.date,
                    "createdAt": repo.created_at,
                    "private": repo.private,
                    "disabled": False,
                    "gated": False,
                    "downloads": 0,
                    "likes": 0,
                    "tags": list(card.get("tags") or []) if isinstance(card, dict) else [],
                    **({"cardData": card} if card else {}),
                    "siblings": siblings,
                }
            )

    def _card_data(self, commit: Commit) -> dict[str, Any]:
        """The YAML metadata block at the top of the repository's README.md, as the Hub parses it."""
        entry = commit.files.get("README.md")
        if entry is None:
            return {}
        text = self.hub._blobs.path_for(size=entry.size, sha256=entry.sha256, xet_hash=entry.xet_hash).read_text(
            errors="replace"
        )
        m = re.match(r"---\r?\n(.*?)\r?\n---\r?\n", text, re.S)
        if m is None:
            return {}
        import yaml

        try:
            data = yaml.safe_load(m.group(1))
        except yaml.YAMLError:
            return {}
        return data if isinstance(data, dict) else {}

    def _upload_mode(self, path: str, size: int, sample: bytes) -> str:
        name = path.rsplit("/", 1)[-1]
        if size >= self.hub.regular_max_bytes or b"\0" in sample:
            return "lfs"
        if any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(path, p) for p in LFS_PATTERNS):
            return "lfs"
        return "regular"

    def r_preupload(self) -> _Response:
        with self.hub._lock:
            repo = self._repo(write=True)
            commit = self._commit(repo, self.params["rev"])
        files = []
        for f in self.json_body().get("files", []):
            mode = self._upload_mode(f["path"], int(f["size"]), base64.b64decode(f.get("sample", "")))
            existing = commit.files.get(f["path"])
            # The client skips unchanged files by comparing this oid with its own:
            # sha256 for LFS files, git blob sha1 for regular ones.
            oid = None if existing is None else (existing.sha256 if existing.lfs else existing.git_oid)
            files.append({"path": f["path"], "uploadMode": mode, "shouldIgnore": False, "oid": oid})
        return _json({"files": files, "commitOid": commit.oid})

    def r_commit(self) -> _Response:
        body = self.read_body()
        if self.query.get("create_pr"):
            raise HubError(400, "FakeHub does not implement create_pr")
        lines = _ndjson(body)
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "The commit payload must start with a header line")
        header = lines[0]["value"]
        with self.hub._lock:  # validate everything, then apply: a commit is all or nothing
            repo = self._repo(write=True)
            branch = self.params["rev"]
            branch = branch[len("refs/heads/") :] if branch.startswith("refs/heads/") else branch
            if branch not in repo.branches:
                raise HubError(404, f"Invalid rev id: {self.params['rev']} (FakeHub commits only to branches)",
                               "RevisionNotFound")
            head = repo.commits[repo.branches[branch]]
            parent = header.get("parentCommit")
            if parent is not None and parent.lower() != head.oid:
                raise HubError(412, "A commit has happened since. Please refresh and try again.")
            files = dict(head.files)
            for line in lines[1:]:
                key, value = line.get("key"), line.get("value", {})
                path = value.get("path", "")
                if key == "file":
                    data = base64.b64decode(value["content"])
                    sha = self.hub._blobs.put(data)  # unreferenced blobs are harmless if the commit fails
                    files[path] = FileEntry(path, len(data), sha, git_blob_oid(data), lfs=False)
                elif key == "lfsFile":
                    files[path] = self._lfs_entry(path, value["oid"].lower(), value.get("size"))
                elif key == "deletedFile":
                    if files.pop(path, None) is None:
                        raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                elif key == "deletedFolder":
                    prefix = path.rstrip("/") + "/"
                    doomed = [p for p in files if p.startswith(prefix)]
                    if not doomed:
                        raise HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
                    for p in doomed:
                        del files[p]
                else:
                    raise HubError(400, f"FakeHub: unsupported commit operation {key!r}")
            summary = header.get("summary") or ""
            commit = self.hub._add_commit(repo, branch, head.oid, summary, header.get("description") or "", files)
        return _json(
            {
                "success": True,
                "commitOid": commit.oid,
                "commitUrl": f"{self.hub.endpoint}/{self._url_prefix(repo)}{repo.repo_id}/commit/{commit.oid}",
                "hookOutput": "",
            }
        )

    def _lfs_entry(self, path: str, sha256: str, size: int | None) -> FileEntry:
        """An LFS/Xet file of a commit: its bytes must already be uploaded (LFS PUT or Xet CAS)."""
        if self.hub._blobs.has_sha256(sha256):
            actual = self.hub._blobs.sha256_path(sha256).stat().st_size
            xet_hash = None
        else:
            xet = self.hub._cas.by_sha256(sha256)
            if xet is None:
                raise HubError(
                    422,
                    f"Your push was rejected because an LFS pointer pointed to a file that does not exist: {path}",
                )
            actual, xet_hash = xet.size, xet.xet_hash
        if size is not None and int(size) != actual:
            raise HubError(422, f"LFS file {path}: size {size} does not match the uploaded object ({actual})")
        ptr_oid = git_blob_oid(lfs_pointer(sha256, actual))
        return FileEntry(path, actual, sha256, ptr_oid, lfs=True, xet_hash=xet_hash)

    def _tree_item(self, commit: Commit, entry: FileEntry | str) -> dict[str, Any]:
        if isinstance(entry, str):  # a directory
            oid = hashlib.sha1(f"tree {commit.oid} {entry}".encode()).hexdigest()
            return {"type": "directory", "oid": oid, "size": 0, "path": entry}
        item: dict[str, Any] = {"type": "file", "oid": entry.git_oid, "size": entry.size, "path": entry.path}
        if entry.lfs:
            ptr = len(lfs_pointer(entry.sha256, entry.size))
            item["lfs"] = {"oid": entry.sha256, "size": entry.size, "pointerSize": ptr}
        if entry.xet_hash is not None:
            item["xetHash"] = entry.xet_hash
        return item

    def r_tree(self) -> _Response:
        with self.hub._lock:
            repo = self._repo()
            commit = self._commit(repo, self.params["rev"])
        base = self.params.get("path", "").strip("/")
        recursive = self.query.get("recursive", ["false"])[0].lower() == "true"
        files, dirs = _listing(commit.files, base, recursive)
        if files is None:
            raise HubError(404, f"Entry not found: {base}", "EntryNotFound")
        items = [self._tree_item(commit, d) for d in dirs]
        items += [self._tree_item(commit, commit.files[p]) for p in files]
        items.sort(key=lambda i: (i["type"] != "directory", i["path"]))
        return _json(items)

    def r_paths_info(self) -> _Response:
        with self.hub._lock:
            repo = self._repo()
            commit = self._commit(repo, self.params["rev"])
        ctype = self.headers.get("Content-Type", "")
        if "json" in ctype:
            paths = self.json_body().get("paths", [])
        else:
            paths = parse_qs(self.read_body().decode()).get("paths", [])
        out = []
        for p in paths:
            p = p.strip("/")
            if p in commit.files:
                out.append(self._tree_item(commit, commit.files[p]))
            elif any(f.startswith(p + "/") for f in commit.files):
                out.append(self._tree_item(commit, p))
        return _json(out)

    def r_refs(self) -> _Response:
        with self.hub._lock:
            repo = self._repo()
            branches = [
                {"name": b, "ref": f"refs/heads/{b}", "targetCommit": oid} for b, oid in sorted(repo.branches.items())
            ]
        return _json({"branches": branches, "converts": [], "tags": []})

    def r_commits(self) -> _Response:
        with self.hub._lock:
            repo = self._repo()
            commit: Commit | None = self._commit(repo, self.params["rev"])
            out = []
            while commit is not None:
                out.append(
                    {
                        "id": commit.oid,
                        "title": commit.title,
                        "message": commit.message,
                        "date": commit.date,
                        "authors": [{"user": self.hub.username}],
                    }
                )
                commit = repo.commits.get(commit.parent) if commit.parent else None
        return _json(out)

    def r_create_branch(self) -> _Response:
        """``HfApi.create_branch``: a new branch at ``startingPoint`` (a branch or a sha; default main).
        409 when it exists, 400 for a name that is not a plain branch name, like the Hub."""
        branch = self.params["rev"]
        if branch.startswith("refs/") or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]*", branch) or ".." in branch:
            raise HubError(400, f"Invalid reference for a branch: {branch}")
        start = self.json_body().get("startingPoint") or "main"
        with self.hub._lock:
            repo = self._repo(write=True)
            if branch in repo.branches:
                raise HubError(409, "Reference already exists")
            repo.branches[branch] = self._commit(repo, start).oid
        return _json({})

    def _xet_token(self, refresh_route: str) -> _Response:
        exp = int(time.time()) + TOKEN_TTL_S
        token = "xet_" + secrets.token_hex(8)
        headers = {
            "X-Xet-Cas-Url": self.hub._cas.url,
            "X-Xet-Access-Token": token,
            "X-Xet-Token-Expiration": str(exp),
            "X-Xet-Refresh-Route": refresh_route,
        }
        return _json({"accessToken": token, "exp": exp, "casUrl": self.hub._cas.url}, headers=headers)

    def r_repo_xet_token(self) -> _Response:
        write = self.route == "xet_write_token"
        with self.hub._lock:
            repo = self._repo(write=write)
            if not write:
                self._commit(repo, self.params["rev"])
        return self._xet_token(self.hub.endpoint + urlsplit(self.path).path)

    # ---- LFS protocol (HF_HUB_DISABLE_XET=1) ---------------------------------------------------

    def _lfs_signature(self, oid: str) -> str:
        return hmac.new(self.hub._secret, oid.encode(), hashlib.sha256).hexdigest()[:32]

    def r_lfs_batch(self) -> _Response:
        with self.hub._lock:
            repo = self._repo(write=True)
        body = self.json_body()
        if body.get("operation") != "upload":
            raise HubError(400, "FakeHub implements LFS uploads only (downloads go through /resolve)")
        verify_url = f"{self.hub.endpoint}/{self._url_prefix(repo)}{repo.repo_id}.git/info/lfs/objects/verify"
        objects = []
        for obj in body.get("objects", []):
            oid, size = obj["oid"].lower(), int(obj["size"])
            item: dict[str, Any] = {"oid": oid, "size": size}
            if not self.hub._blobs.has_sha256(oid):  # already present: no "actions", the client skips it
                item["authenticated"] = True
                item["actions"] = {
                    "upload": {"href": f"{self.hub.endpoint}/_fake_lfs/{oid}?sig={self._lfs_signature(oid)}"},
                    "verify": {"href": verify_url},
                }
            objects.append(item)
        return _Response(
            body=json.dumps({"transfer": "basic", "objects": objects}).encode(),
            content_type="application/vnd.git-lfs+json",
        )

    def r_lfs_upload(self) -> _Response:
        oid = self.params["oid"]
        data = self.read_body()
        if not hmac.compare_digest(self.query.get("sig", [""])[0], self._lfs_signature(oid)):
            raise HubError(403, "FakeHub: bad upload signature")
        if hashlib.sha256(data).hexdigest() != oid:
            raise HubError(400, "FakeHub: uploaded content does not match its sha256")
        self.hub._blobs.put(data)
        return _Response(status=200, headers={"ETag": f'"{hashlib.md5(data).hexdigest()}"'})

    def r_lfs_verify(self) -> _Response:
        with self.hub._lock:
            self._repo(write=True)
        body = self.json_body()
        oid, size = body["oid"].lower(), int(body["size"])
        path = self.hub._blobs.sha256_path(oid)
        if not path.is_file() or path.stat().st_size != size:
            raise HubError(404, f"FakeHub: object {oid} was not uploaded")
        return _json({"success": True})

    # ---- downloads ----------------------------------------------------------------------------

    def r_resolve(self) -> _Response:
        with self.hub._lock:
            repo = self._repo()
            commit = self._commit(repo, self.params["rev"])
        path = self.params["path"]
        entry = commit.files.get(path)
        if entry is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit.oid})
        etag = entry.sha256 if entry.lfs else entry.git_oid
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
        if entry.lfs:
            headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(entry.size)})
        if entry.xet_hash is not None and self.hub.serve_xet and not self.hub.faults.download_armed(path):
            refresh = (
                f"{self.hub.endpoint}/api/{repo.repo_type}s/{repo.repo_id}/xet-read-token/{commit.oid}"
            )
            headers.update({"X-Xet-Hash": entry.xet_hash, "X-Xet-Refresh-Route": refresh})
        return self._file_response(path, entry.size, entry.sha256, entry.xet_hash, headers)

    def _file_response(
        self, path: str, size: int, sha256: str | None, xet_hash: str | None, headers: dict[str, str]
    ) -> _Response:
        """HEAD: headers only. GET: the bytes, honouring ``Range`` and any armed download fault."""
        if self.command == "HEAD":
            return _Response(headers=headers, content_type="application/octet-stream", content_length=size)
        file = self.hub._blobs.path_for(size=size, sha256=sha256, xet_hash=xet_hash)
        start, end, status = 0, size, 200
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", rng)
            if m is None or not (m.group(1) or m.group(2)):
                raise HubError(400, f"FakeHub: unsupported Range {rng!r}")
            if m.group(1):
                start = int(m.group(1))
                end = min(size, int(m.group(2)) + 1) if m.group(2) else size
            else:
                start = max(0, size - int(m.group(2)))
            if start >= size or start >= end:
                raise HubError(416, "Range Not Satisfiable", headers={"Content-Range": f"bytes */{size}"})
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{size}"}
        r = _Response(status=status, headers=headers, content_type="application/octet-stream",
                      file=file, offset=start, length=end - start)
        fault = self.hub.faults.take_download(path)
        if fault is not None and fault.kind == "truncate":
            r.close_after = min(fault.nbytes, r.length)
        elif fault is not None and fault.kind == "short":
            r.length = min(fault.nbytes, r.length)
        elif fault is not None and fault.kind == "corrupt":
            r.corrupt_at = size // 2 if start <= size // 2 < end else start
        return r

    # ---- buckets ------------------------------------------------------------------------------

    def _bucket_url(self, bucket_id: str) -> str:
        return f"{self.hub.endpoint}/buckets/{bucket_id}"

    def r_bucket_create(self) -> _Response:
        self._require_write()
        ns = self.hub.username if self.params["ns"] == "me" else self.params["ns"]
        bucket_id = f"{ns}/{self.params['name']}"
        private = self.json_body().get("visibility") == "private"
        with self.hub._lock:
            if bucket_id in self.hub._buckets:
                return _json({"error": "Bucket already exists", "url": self._bucket_url(bucket_id)}, 409)
            self.hub._buckets[bucket_id] = Bucket(bucket_id, private, _now_iso())
        return _json({"url": self._bucket_url(bucket_id), "id": bucket_id, "name": self.params["name"]})

    def r_bucket_info(self) -> _Response:
        with self.hub._lock:
            b = self._bucket()
            return _json(
                {
                    "id": b.bucket_id,
                    "private": b.private,
                    "createdAt": b.created_at,
                    "size": sum(f.size for f in b.files.values()),
                    "totalFiles": len(b.files),
                }
            )

    def r_bucket_delete(self) -> _Response:
        with self.hub._lock:
            b = self._bucket(write=True)
            del self.hub._buckets[b.bucket_id]
        return _json({})

    def _bucket_item(self, b: Bucket, entry: BucketEntry | str) -> dict[str, Any]:
        if isinstance(entry, str):
            return {"type": "directory", "path": entry, "uploadedAt": b.created_at}
        return {
            "type": "file",
            "path": entry.path,
            "size": entry.size,
            "xetHash": entry.xet_hash,
            "mtime": _iso_from_ms(entry.mtime_ms),
            "uploadedAt": entry.uploaded_at,
        }

    def r_bucket_tree(self) -> _Response:
        with self.hub._lock:
            b = self._bucket()
            files_by_path = dict(b.files)
        prefix = self.params.get("path", "")
        recursive = self.query.get("recursive", ["false"])[0].lower() == "true"
        base = prefix.strip("/")
        files, dirs = _listing(files_by_path, base, recursive)
        if files is None:  # not a folder: a plain string prefix filter over file paths
            files, dirs = sorted(p for p in files_by_path if p.startswith(prefix)), []
        items = [self._bucket_item(b, d) for d in dirs] + [self._bucket_item(b, files_by_path[p]) for p in files]
        items.sort(key=lambda i: i["path"])
        return _json(items)

    def r_bucket_paths_info(self) -> _Response:
        with self.hub._lock:
            b = self._bucket()
            found = [b.files[p] for p in self.json_body().get("paths", []) if p in b.files]
        return _json([self._bucket_item(b, e) for e in found])

    def r_bucket_batch(self) -> _Response:
        """Non-transactional, like the Hub: each operation succeeds or is listed in ``failed``."""
        lines = _ndjson(self.read_body())
        failed = []
        with self.hub._lock:
            b = self._bucket(write=True)
            for op in lines:
                path = op.get("path", "")
                if op.get("type") in ("addFile", "copyFile"):
                    xet = self.hub._cas.by_hash(op.get("xetHash", ""))
                    if xet is None:
                        failed.append({"path": path, "error": f"Xet file {op.get('xetHash')} not found"})
                        continue
                    mtime = int(op.get("mtime") or time.time() * 1000)
                    b.files[path] = BucketEntry(path, xet.size, xet.xet_hash, mtime, _now_iso(), op.get("contentType"))
                elif op.get("type") == "deleteFile":
                    b.files.pop(path, None)  # deleting a missing file is not an error here
                else:
                    failed.append({"path": path, "error": f"unknown operation {op.get('type')!r}"})
        status = 422 if failed and len(failed) == len(lines) else 200
        return _json({"success": not failed, "failed": failed}, status)

    def r_bucket_xet_token(self) -> _Response:
        with self.hub._lock:
            self._bucket(write=self.route == "xet_write_token")
        return self._xet_token(self.hub.endpoint + urlsplit(self.path).path)

    def r_bucket_resolve(self) -> _Response:
        with self.hub._lock:
            b = self._bucket()
        path = self.params["path"]
        entry = b.files.get(path)
        if entry is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
        headers = {
            "ETag": f'"{entry.xet_hash}"',
            "Accept-Ranges": "bytes",
            "X-Linked-Size": str(entry.size),
            "X-Xet-Hash": entry.xet_hash,
            "X-Xet-Refresh-Route": f"{self.hub.endpoint}/api/buckets/{b.bucket_id}/xet-read-token",
        }
        return self._file_response(path, entry.size, None, entry.xet_hash, headers)

    # ---- misc ---------------------------------------------------------------------------------

    def r_validate_yaml(self) -> _Response:
        """The check ``create_commit`` makes of a README.md it commits: the metadata block must be YAML
        mapping; 400 with ``errors`` otherwise, like the Hub (which checks much more)."""
        content = self.json_body().get("content") or ""
        m = re.match(r"---\r?\n(.*?)\r?\n---\r?\n", content, re.S)
        if m is None:
            return _json({"warnings": [], "errors": []})
        import yaml

        try:
            data = yaml.safe_load(m.group(1))
        except yaml.YAMLError as e:
            return _json({"errors": [{"message": f"Invalid YAML: {e}"}]}, 400)
        if data is not None and not isinstance(data, dict):
            return _json({"errors": [{"message": "The metadata must be a mapping"}]}, 400)
        tags = (data or {}).get("tags")
        if tags is not None and not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
            return _json({"errors": [{"message": '"tags" must be an array of strings'}]}, 400)
        return _json({"warnings": [], "errors": []})

    def r_agent_harnesses(self) -> _Response:
        # Fetched by build_hf_headers() unless telemetry is disabled: an empty registry detects no agent.
        return _json({"standardEnvVars": [], "harnesses": {}})


def _ndjson(body: bytes) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in body.splitlines() if line.strip()]
    except ValueError:
        raise HubError(400, "FakeHub: malformed NDJSON body")


def _listing(paths: dict[str, Any], base: str, recursive: bool) -> tuple[list[str] | None, list[str]]:
    """Files and folders under ``base`` ("" is the root). ``(None, [])`` when ``base`` is not a folder."""
    prefix = base + "/" if base else ""
    under = sorted(p for p in paths if p.startswith(prefix))
    if base and not under:
        return None, []
    files: list[str] = []
    dirs: set[str] = set()
    for p in under:
        rest = p[len(prefix) :].split("/")
        if recursive:
            files.append(p)
            for i in range(1, len(rest)):
                dirs.add(prefix + "/".join(rest[:i]))
        elif len(rest) == 1:
            files.append(p)
        else:
            dirs.add(prefix + rest[0])
    return files, sorted(dirs)


# =============================================================================
# The server
# =============================================================================


class FakeHub:
    """A Hub on 127.0.0.1 for the real client. Use as a context manager; see the module docstring."""

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        token: str = DEFAULT_TOKEN,
        username: str = DEFAULT_USER,
        serve_xet: bool = True,
        regular_max_bytes: int = REGULAR_MAX_BYTES,
        gitattributes: bool = True,
    ):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.username = username
        self.serve_xet = serve_xet  # False: never send X-Xet-Hash, so downloads use plain HTTP
        self.regular_max_bytes = regular_max_bytes
        self.gitattributes = gitattributes  # new repos start with the Hub's .gitattributes commit
        self.faults = Faults(ROUTE_NAMES)
        self.requests: collections.Counter[str] = collections.Counter()
        self.log: list[RequestRecord] = []
        self.unhandled: list[str] = []
        self.errors: list[Exception] = []  # exceptions raised inside handlers (answered with 500)
        self._cas = XetCas(self.root / "cas")
        self._blobs = BlobStore(self.root / "blobs", self._cas)
        self._repos: dict[tuple[str, str], Repo] = {}
        self._buckets: dict[str, Bucket] = {}
        self._lock = threading.RLock()
        self._secret = secrets.token_bytes(16)
        self._commit_counter = 0
        self._conns: dict[socket.socket, threading.Thread] = {}  # open connections -> handler thread
        self._conns_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.endpoint = ""

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> FakeHub:
        handler = type("FakeHubHandler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="FakeHub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, drop idle keep-alive connections, and wait for every handler thread."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._conns_lock:
            conns = dict(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # a handler blocked reading the next request sees EOF
            except OSError:
                pass
        for thread in conns.values():
            thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._conns_lock:
            if add:
                self._conns[conn] = threading.current_thread()
            else:
                self._conns.pop(conn, None)

    def _count(self, method: str, route: str) -> None:
        with self._count_lock:
            self.requests[route] += 1
            self.requests[f"{method} {route}"] += 1

    # ---- state helpers (also used by tests to look behind the API) ----------------------------

    def _new_repo(self, repo_type: str, repo_id: str, private: bool) -> Repo:
        repo = Repo(repo_type, repo_id, private, _now_iso())
        files: dict[str, FileEntry] = {}
        if self.gitattributes:
            data = GITATTRIBUTES.encode()
            sha = self._blobs.put(data)
            files[".gitattributes"] = FileEntry(".gitattributes", len(data), sha, git_blob_oid(data), lfs=False)
        self._add_commit(repo, "main", None, "initial commit", "", files)
        return repo

    def _add_commit(
        self, repo: Repo, branch: str, parent: str | None, title: str, message: str, files: dict[str, FileEntry]
    ) -> Commit:
        with self._lock:
            self._commit_counter += 1
            material = json.dumps(
                [parent, title, message, sorted((p, e.git_oid) for p, e in files.items()), self._commit_counter],
            ).encode()
            oid = hashlib.sha1(material + self._secret).hexdigest()
            commit = Commit(oid, parent, title, message, _now_iso(), files)
            repo.commits[oid] = commit
            repo.branches[branch] = oid
            return commit

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo:
        with self._lock:
            return self._repos[(repo_type, repo_id)]

    def head(self, repo_id: str, repo_type: str = "model", branch: str = "main") -> str:
        """The commit sha a branch points to."""
        with self._lock:
            return self._repos[(repo_type, repo_id)].branches[branch]

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, FileEntry]:
        with self._lock:
            repo = self._repos[(repo_type, repo_id)]
            oid = repo.branches.get(revision, revision)
            return dict(repo.commits[oid].files)

    def read_file(self, repo_id: str, path: str, revision: str = "main", repo_type: str = "model") -> bytes:
        """The bytes the Hub holds for a file (reconstructed from the Xet CAS when needed)."""
        e = self.files(repo_id, revision, repo_type)[path]
        return self._blobs.path_for(size=e.size, sha256=e.sha256, xet_hash=e.xet_hash).read_bytes()

    def bucket_files(self, bucket_id: str) -> dict[str, BucketEntry]:
        with self._lock:
            return dict(self._buckets[bucket_id].files)

    def count(self, route: str, method: str | None = None) -> int:
        """How many requests hit ``route`` (optionally only those with ``method``)."""
        return self.requests[f"{method} {route}" if method else route]


# =============================================================================
# Client configuration for tests
# =============================================================================

_LOCAL_HOSTS = {"127.0.0.1", "::1", "localhost"}


class NetworkBlocked(OSError):
    pass


def block_internet(monkeypatch: Any) -> list[str]:
    """Refuse (in Python) any DNS lookup or connection to a host other than 127.0.0.1 / ::1.

    Returns the list of refused attempts, so a test can assert it is empty: some client code
    (e.g. the agent registry fetch) swallows errors. hf_xet's own traffic (Rust) is not
    covered; FakeHub only ever hands it a ``local://`` CAS and 127.0.0.1 URLs.
    """
    attempts: list[str] = []
    real_getaddrinfo = socket.getaddrinfo
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name is not None and name not in _LOCAL_HOSTS:
            attempts.append(f"getaddrinfo {name}")
            raise NetworkBlocked(f"test guard: no network access to {name!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    def _check(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in _LOCAL_HOSTS:
            attempts.append(f"connect {address!r}")
            raise NetworkBlocked(f"test guard: no network access to {address!r}")

    def connect(self: socket.socket, address: Any) -> Any:
        _check(self, address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> Any:
        _check(self, address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    return attempts


def configure_client(
    monkeypatch: Any,
    hub: FakeHub,
    *,
    xet: bool = True,
    home: str | os.PathLike | None = None,
    xet_retry_base_delay: str | None = "50ms",
    progress_bars: bool = False,
) -> None:
    """Point huggingface_hub (and hf_xet) at ``hub`` for the duration of a test.

    ``xet=False`` sets ``HF_HUB_DISABLE_XET=1``: uploads then use the LFS batch + PUT protocol and
    downloads plain HTTP. ``xet_retry_base_delay`` shortens hf_xet's retry backoff (3 s by default,
    up to 5 attempts: a persistently failing Xet token endpoint otherwise costs minutes); ``None``
    keeps hf_xet's default. Progress bars are off unless ``progress_bars``. Everything is undone by
    ``monkeypatch`` at teardown.
    """
    from huggingface_hub import constants
    from huggingface_hub.utils import _http, _xet

    hf_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")  # the module ("utils.tqdm" is the class)

    home = Path(home) if home is not None else Path(tempfile.mkdtemp(prefix="hf_home_", dir=hub.root))
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "HF_ENDPOINT": hub.endpoint,
        "HF_TOKEN": hub.token,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_HUB_DISABLE_TELEMETRY": "1",  # also read by hf_xet
        "HF_XET_TELEMETRY_ENABLED": "0",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_OIDC_RESOURCE", "HUGGING_FACE_HUB_TOKEN",
                "HUGGINGFACE_CO_STAGING", "HF_HUB_DISABLE_XET", "HF_HUB_DISABLE_IMPLICIT_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    if not xet:
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    if xet_retry_base_delay is not None:
        monkeypatch.setenv("HF_XET_CLIENT_RETRY_BASE_DELAY", xet_retry_base_delay)

    # Constants computed once at import time.
    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
    template = hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)  # hf_hub_url() formats this
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", not xet)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", False)
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HUGGINGFACE_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_XET_CACHE", str(home / "xet"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    if not progress_bars:
        monkeypatch.setattr(hf_tqdm, "HF_HUB_DISABLE_PROGRESS_BARS", True)

    # Process-wide client state: a fresh HTTP session (no keep-alive to an older server), an empty
    # Xet token cache (keyed by URL: a reused port would hand out another hub's CAS folder) and a
    # fresh Xet session, created lazily under the environment above.
    _http.close_session()
    monkeypatch.setattr(_xet, "XET_CONNECTION_INFO_CACHE", {})
    monkeypatch.setattr(_xet, "_GLOBAL_XET_HOLDER", _xet.XetSessionHolder())


__all__ = [
    "FakeHub",
    "Faults",
    "HubError",
    "NetworkBlocked",
    "block_internet",
    "configure_client",
    "git_blob_oid",
    "lfs_pointer",
    "parse_shard",
]
