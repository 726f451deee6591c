"""push: store a bundle's parts on a remote, then a new chain index naming
them, refusing a bundle whose base is not the chain's head (unless it is an
anchor or a fork is asked for); and squash on a remote, which adds one
bundle composed from bundles the chain already has."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass

from ..defaults import DEFAULT_LEVEL, DEFAULT_PART_SIZE
from ..errors import BaseMismatchError, NotFoundError, UsageError
from ..format import signature as signing
from ..format.bundle import BundleReader, check_records
from ..format.chain import Chain, Entry, Part, part_paths
from ..parallel import default_threads
from ..progress import SILENT, Reporter
from ..remotes import Upload, open_remote
from ..store.hashing import hexd, range_digest, short
from .fetch import download, read_chain
from .pack import pack
from .signatures import chain_signature, sign_bundle
from .squash import squash


@dataclass(frozen=True)
class PushResult:
    remote: str
    bundle_id: bytes
    version: bytes
    parent: bytes | None
    parts: int
    bytes: int
    uploaded: bool  # False when the remote already had this bundle
    label: str | None = None

    def to_json(self) -> dict:
        return {
            "schema": "wdiff.push/1",
            "remote": self.remote,
            "bundle_id": hexd(self.bundle_id),
            "version": hexd(self.version),
            "parent": hexd(self.parent) if self.parent else None,
            "anchor": self.parent is None,
            "parts": self.parts,
            "bytes": self.bytes,
            "uploaded": self.uploaded,
            "label": self.label,
        }


def push(
    source,
    remote,
    *,
    base=None,
    anchor: bool = False,
    label: str | None = None,
    part_size: int = DEFAULT_PART_SIZE,
    fork: bool = False,
    level: int = DEFAULT_LEVEL,
    sign_key=None,
    token: str | None = None,
    private: bool = True,
    commit_message: str | None = None,
    threads: int | None = None,
    reporter: Reporter = SILENT,
) -> PushResult:
    """Push a bundle file, or a checkpoint directory packed against ``base``
    (or whole, with ``anchor=True``), to ``remote`` as its new head. With
    ``sign_key`` (a minisign secret key file), the bundle and the new chain
    index are signed. On the Hub: ``token`` (default: huggingface_hub's own),
    ``private`` for a repository the push creates, ``commit_message``
    instead of wdiff's own."""
    source = os.fspath(source)
    if part_size < 1024 * 1024:
        raise UsageError("the part size must be at least 1 MiB")
    if os.path.isdir(source):
        if anchor == (base is not None):
            raise UsageError("pushing a checkpoint directory needs --base PREV or --anchor (one of them)")
        parent_dir = os.path.dirname(os.path.abspath(source))
        fd, tmp = tempfile.mkstemp(prefix=".wdiff-push-", suffix=".wdb", dir=parent_dir)
        os.close(fd)
        try:
            pack(None if anchor else base, source, tmp, level=level, threads=threads, reporter=reporter, overwrite=True)
            return push_bundle(tmp, remote, label=label, part_size=part_size, fork=fork, sign_key=sign_key,
                                reporter=reporter, token=token, private=private, commit_message=commit_message)
        finally:
            for p in (tmp, tmp + signing.SUFFIX):
                if os.path.exists(p):
                    os.unlink(p)
    if base is not None or anchor:
        raise UsageError("--base and --anchor apply to a checkpoint directory, not to a bundle file")
    return push_bundle(source, remote, label=label, part_size=part_size, fork=fork, sign_key=sign_key,
                        reporter=reporter, token=token, private=private, commit_message=commit_message)


def push_bundle(path: str, remote, *, label, part_size: int, fork: bool, sign_key, reporter: Reporter,
                 shortcut: bool = False, token: str | None = None, private: bool = True,
                 commit_message: str | None = None) -> PushResult:
    """Publish a bundle file. A ``shortcut`` (a squash of versions the chain
    has) may start anywhere and must end at a version the chain has; it
    leaves the head alone."""
    key = signing.load_secret(os.fspath(sign_key)) if sign_key is not None else None
    store = open_remote(remote, token=token, private=private, create=True)
    with BundleReader(path) as reader:
        check_records(reader, reporter)
        ix = reader.index
        bundle_id, size = reader.id, reader.size
    raw, chain_token = store.read_chain()
    chain = Chain.decode(raw, where=store.url)
    parent, version = ix.base_fingerprint, ix.target_fingerprint
    done = chain.entry(bundle_id)
    if done is not None:
        return PushResult(store.url, bundle_id, version, parent, len(done.parts), done.size, False, done.label)
    if shortcut:
        if version not in chain.versions or (parent is not None and parent not in chain.versions):
            raise BaseMismatchError(f"{store.url}: a squash must join two versions the chain already has")
    elif parent is not None:
        if chain.head is None:
            raise UsageError(
                f"{store.url} has no versions yet; its first push must be an anchor",
                hint="wdiff push --anchor CHECKPOINT REMOTE",
            )
        if parent != chain.head and not (fork and parent in chain.versions):
            known = "a version the remote has" if parent in chain.versions else "a version the remote does not have"
            raise BaseMismatchError(
                f"the bundle's base {short(parent)} is not the head {short(chain.head)} of {store.url} (it is {known})",
                hint="pull or pack against the head, push an anchor, or use --fork to branch from an older version",
            )
    n_parts = max(1, -(-size // part_size))
    names = part_paths(bundle_id, n_parts)
    uploads, parts = [], []
    for k, name in enumerate(names):
        off = k * part_size
        length = min(part_size, size - off)
        uploads.append(Upload(name, path, off, length))
        parts.append(Part(name, length, range_digest(path, off, length)))
    signature = None
    if key is not None:
        sig_file = sign_bundle(path, key, verify=False)  # verified above
        signature = names[0] + signing.SUFFIX
        uploads.append(Upload(signature, sig_file, 0, os.path.getsize(sig_file)))
    entry = Entry(
        bundle=bundle_id, version=version, parent=parent, parts=tuple(parts),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), label=label, signature=signature,
    )
    new = chain.appended(entry, head=not shortcut)
    encoded = new.encode()
    chain_sig = chain_signature(encoded, key, path) if key is not None else None
    if chain_sig is not None:
        uploads.append(chain_sig)
    reporter.phase("upload", size)
    verb = "wdiff squash" if shortcut else "wdiff push"
    message = commit_message or f"{verb} {short(version)}" + (f" ({label})" if label else "")
    try:
        store.publish(uploads, encoded, chain_token, message=message, reporter=reporter)
    finally:
        if chain_sig is not None:  # the chain's signature file is wdiff's own temp: it goes once uploaded
            with contextlib.suppress(OSError):
                os.unlink(chain_sig.source)
    reporter.done()
    return PushResult(store.url, bundle_id, version, parent, n_parts, size, True, label)


def squash_remote(
    remote,
    *,
    start: str | None = None,
    to: str | None = None,
    base=None,
    label: str | None = None,
    part_size: int = DEFAULT_PART_SIZE,
    sign_key=None,
    threads: int | None = None,
    reporter: Reporter = SILENT,
) -> PushResult:
    """Add to ``remote`` one bundle that goes from version ``start`` (default:
    nothing, making an anchor) to ``to`` (default: the head), composed from
    the bundles the chain already has: a late joiner then downloads one
    bundle. A squash from a version needs that version's checkpoint as
    ``base``; from nothing it needs no checkpoint at all."""
    threads = threads or default_threads()
    store = open_remote(remote)
    chain = read_chain(store)
    goal = chain.resolve(to)
    origin = chain.resolve(start) if start is not None else None
    run = chain.path(origin, goal)
    if run is None:
        raise NotFoundError(f"{store.url}: no run of bundles leads from {short(origin) if origin else 'nothing'} "
                            f"to {short(goal)}")
    if origin is not None and base is None:
        raise UsageError("a squash that starts from a version needs that checkpoint (--base DIR)",
                         hint="or squash from nothing to make an anchor")
    if len(run) == 1:
        return PushResult(store.url, run[0].bundle, goal, origin, len(run[0].parts), run[0].size, False, run[0].label)
    with tempfile.TemporaryDirectory(prefix="wdiff-squash-") as work:
        bundles = [download(store, e, work, reporter)[0] for e in run]
        out = os.path.join(work, "squash.wdb")
        squash(bundles, base, out, threads=threads, reporter=reporter)
        label = label or next((e.label for e in reversed(run) if e.label), None)
        return push_bundle(out, remote, label=label, part_size=part_size, fork=False, sign_key=sign_key,
                            reporter=reporter, shortcut=True)
