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
is trust on first use. Both files are replaced atomically under a lock.
"""

from __future__ import annotations

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


def places(directory: str | None) -> list[str]:
    """The record files that apply to a pull into ``directory`` (None: the
    user's only, as for a push)."""
    out = []
    if directory is not None:
        out.append(os.path.join(os.path.abspath(directory), STATE_DIR, FILE))
    out.append(os.path.join(user_state_dir(), FILE))
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
    return f"hf://{spec['kind']}s/{spec['repo_id']}"


def _load(path: str) -> dict:
    try:
        with open_regular(path, max_size=MAX_FILE) as f:
            obj = json.loads(f.read(MAX_FILE + 1))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, IntegrityError) as e:
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


def check(url: str, chain: Chain, raw: bytes, paths: list[str]) -> None:
    """Refuse (IntegrityError) a chain that goes back on what any record in
    ``paths`` says this remote already published. ``chain`` is a verified
    chain with a lineage."""
    lin = chain.lineage
    key = remote_key(url)
    digest = chain_digest(raw)
    for path in paths:
        d = _load(path).get(key)
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


def remember(url: str, chain: Chain, raw: bytes, paths: list[str]) -> None:
    """Record ``chain`` (verified, with a lineage) as the newest accepted
    from ``url`` in every file of ``paths``; never lowers a record."""
    if chain.lineage is None:
        return
    lin = chain.lineage
    seen = Seen(lin.remote, lin.seq, chain_digest(raw), lin.published, lin.signer)
    key = remote_key(url)
    for path in paths:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with _lock(path + ".lock"):
            remotes = _load(path)
            old = remotes.get(key)
            if old is not None and old.get("remote") == seen.remote and _seen(old, path).seq > seen.seq:
                continue  # another process recorded a newer one meanwhile
            remotes[key] = seen.to_json()
            atomic_write_bytes(path, canonical_json({"format": FORMAT, "version": 1, "remotes": remotes}) + b"\n")


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
