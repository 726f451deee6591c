"""What a reader remembers of each signed remote, so that a remote's storage
cannot take it back in time: the highest sequence number it accepted, the
digest of that chain, and the remote's identity (TUF's rollback and
mix-and-match protection, scaled down to one chain per remote).

A record is kept in two places, and both are checked:

* beside the checkpoint, ``DIR/.wdiff/remotes.json``: it travels with the
  directory, so another user (or a wiped home) still cannot downgrade it;
* per user, ``$WDIFF_STATE_DIR/remotes.json`` (default
  ``$XDG_STATE_HOME/wdiff/`` or ``~/.local/state/wdiff/``): it covers a
  fresh directory, and a pusher's own history.

Records are written only for chains whose signature was verified with a
trusted key: an unsigned chain's lineage is anyone's word. A first contact
is trust on first use. Both files are replaced atomically under a lock. The
one beside the checkpoint is reached through wdiff.statedir, like every
other file of ``DIR/.wdiff``: never through a link, never in a directory
another user owns.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass

from ..errors import IntegrityError
from ..format.chain import Chain, chain_digest
from ..format.records import canonical_json
from ..fsutil import atomic_write_bytes, io_error, open_regular
from ..paths import STATE_DIR
from ..remotes import parse_remote
from ..statedir import StateDir

ENV_STATE = "WDIFF_STATE_DIR"
FILE = "remotes.json"
FORMAT = "wdiff-remotes"
MAX_FILE = 16 * 1024 * 1024


@dataclass(frozen=True)
class Seen:
    """The newest chain of one remote that a reader accepted."""

    remote: str
    seq: int
    digest: str  # chain_digest() of its bytes
    published: str
    signer: str | None

    def to_json(self) -> dict:
        return {"remote": self.remote, "seq": self.seq, "digest": self.digest, "published": self.published,
                "signer": self.signer}


def user_state_dir() -> str:
    d = os.environ.get(ENV_STATE)
    if d:
        return d
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "wdiff")


class Place:
    """One record file: the user's, or the one in a checkpoint's ``.wdiff``."""

    def __init__(self, path: str, checkpoint: str | None = None) -> None:
        self.path, self.checkpoint = path, checkpoint

    def __str__(self) -> str:
        return self.path

    def load(self) -> dict:
        if self.checkpoint is None:
            return _load(self.path, _read_user(self.path))
        if not os.path.isdir(self.checkpoint):
            return {}  # a pull into a new directory: nothing recorded beside it yet
        d = StateDir.open(self.checkpoint, create=False)
        if d is None:
            return {}
        with d:
            return _load(self.path, d.read(FILE, MAX_FILE))

    @contextlib.contextmanager
    def locked(self):
        """The record, locked for an update; yields a function that writes it."""
        if self.checkpoint is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with _lock(self.path + ".lock"):
                yield lambda data: atomic_write_bytes(self.path, data)
            return
        with StateDir.open(self.checkpoint) as d, d.lock(what=self.path, name=FILE + ".lock"):
            yield lambda data: d.atomic_write(FILE, data)


def places(directory: str | None) -> list[Place]:
    """The records that apply to a pull into ``directory`` (None: the
    user's only, as for a push)."""
    out = []
    if directory is not None:
        root = os.path.abspath(directory)
        out.append(Place(os.path.join(root, STATE_DIR, FILE), checkpoint=root))
    out.append(Place(os.path.join(user_state_dir(), FILE)))
    return out


def remote_key(url: str) -> str:
    """One name per remote whatever spelling reached it: a directory by its
    real path, a Hub repository without its revision (a revision is a view
    of the same chain), a bucket with its prefix."""
    spec = parse_remote(url)
    if spec["kind"] == "local":
        return "file://" + os.path.realpath(spec["path"])
    if spec["kind"] == "bucket":
        return f"hf://buckets/{spec['repo_id']}" + (f"/{spec['prefix']}" if spec["prefix"] else "")
    if spec["kind"] == "objstore":  # an object store: its bucket and prefix
        return f"{spec['protocol']}://{spec['bucket']}" + (f"/{spec['prefix']}" if spec["prefix"] else "")
    return f"hf://{spec['kind']}s/{spec['repo_id']}"


def _read_user(path: str) -> bytes | None:
    try:
        with open_regular(path, max_size=MAX_FILE) as f:
            return f.read(MAX_FILE + 1)
    except FileNotFoundError:
        return None
    except (OSError, IntegrityError) as e:
        raise IntegrityError(f"{path}: the record of remotes seen is unreadable ({e})",
                             hint="remove it to trust every remote anew on first contact") from None


def _load(path: str, raw: bytes | None) -> dict:
    if raw is None:
        return {}
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise IntegrityError(f"{path}: the record of remotes seen is unreadable ({e})",
                             hint="remove it to trust every remote anew on first contact") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT or not isinstance(obj.get("remotes"), dict):
        raise IntegrityError(f"{path}: not a record of remotes seen", hint="remove it to start afresh")
    return obj["remotes"]


def _seen(d: object, path: str) -> Seen:
    try:
        s = Seen(d["remote"], d["seq"], d["digest"], d["published"], d.get("signer"))
    except (KeyError, TypeError):
        raise IntegrityError(f"{path}: malformed record of a remote", hint="remove it to start afresh") from None
    if type(s.seq) is not int or not isinstance(s.remote, str) or not isinstance(s.digest, str):
        raise IntegrityError(f"{path}: malformed record of a remote", hint="remove it to start afresh")
    return s


def check(url: str, chain: Chain, raw: bytes, paths: list[Place]) -> None:
    """Refuse (IntegrityError) a chain that goes back on what any record in
    ``paths`` says this remote already published. ``chain`` is a verified
    chain with a lineage."""
    lin = chain.lineage
    key = remote_key(url)
    digest = chain_digest(raw)
    for path in paths:
        d = path.load().get(key)
        if d is None:
            continue
        seen = _seen(d, path)
        where = f"{url}: (recorded in {path})"
        if lin is None:
            raise IntegrityError(f"{where} this remote's chain had sequence {seen.seq}; it now serves one from "
                                 "before chains had sequence numbers (a rollback)")
        if lin.remote != seen.remote:
            raise IntegrityError(f"{where} serves the chain of another remote ({lin.remote[:12]}, not "
                                 f"{seen.remote[:12]}): its storage holds another remote's files")
        if lin.seq < seen.seq:
            raise IntegrityError(f"{where} serves chain sequence {lin.seq}, older than {seen.seq} already "
                                 "accepted (a rollback)")
        if lin.seq == seen.seq and digest != seen.digest:
            raise IntegrityError(f"{where} serves a chain with sequence {lin.seq} that differs from the one "
                                 "accepted with that number (two histories)")
        if lin.seq == seen.seq + 1 and lin.prev != seen.digest:
            raise IntegrityError(f"{where} chain {lin.seq} does not follow chain {seen.seq} accepted before "
                                 "(a fork)")


def remember(url: str, chain: Chain, raw: bytes, paths: list[Place]) -> None:
    """Record ``chain`` (verified, with a lineage) as the newest accepted
    from ``url`` in every file of ``paths``; never lowers a record."""
    if chain.lineage is None:
        return
    lin = chain.lineage
    seen = Seen(lin.remote, lin.seq, chain_digest(raw), lin.published, lin.signer)
    key = remote_key(url)
    for path in paths:
        with path.locked() as write:
            remotes = path.load()
            old = remotes.get(key)
            if old is not None and old.get("remote") == seen.remote and _seen(old, path).seq > seen.seq:
                continue  # another process recorded a newer one meanwhile
            remotes[key] = seen.to_json()
            write(canonical_json({"format": FORMAT, "version": 1, "remotes": remotes}) + b"\n")


class _lock:
    def __init__(self, path: str) -> None:
        self.path = path

    def __enter__(self):
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError as e:
            raise io_error(self.path, e) from None
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)
