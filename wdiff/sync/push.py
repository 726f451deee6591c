"""push: store a bundle's parts on a remote, then a new chain index naming
them, refusing a bundle whose base is not the chain's head (unless it is an
anchor or a fork is asked for); and squash on a remote, which adds one
bundle composed from bundles the chain already has."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
import time
from dataclasses import dataclass

from ..defaults import DEFAULT_LEVEL, DEFAULT_PART_SIZE
from ..errors import BaseMismatchError, IntegrityError, NotFoundError, UsageError
from ..format import signature as signing
from ..format.bundle import BundleReader, check_records
from ..format.chain import Chain, Entry, Part, part_paths
from ..fsutil import scratch_dir
from ..ops import loadable
from ..ops.pack import pack
from ..ops.signing import sign_bundle
from ..ops.squash import squash
from ..parallel import default_threads
from ..paths import PathLike
from ..progress import SILENT, Reporter
from ..remotes import Upload, open_remote, parse_remote
from ..store.checkpoint import scan
from ..store.hashing import hexd, range_digest, short
from . import trust
from .fetch import download, read_chain
from .places import holds_checkpoint, holds_remote, refuse_remote_as_checkpoint
from .signatures import chain_signature, has_chain_signature, verify_chain


@dataclass(frozen=True)
class PushResult:
    """The version a push (or a squash on the remote, or a commit) published."""

    remote: str
    bundle_id: bytes
    version: bytes
    parent: bytes | None
    parts: int
    bytes: int
    uploaded: bool  # False when the remote already had this bundle
    label: str | None = None
    anchored: bytes | None = None  # an anchor of the same version published with it (anchor policy)

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
            "anchored": hexd(self.anchored) if self.anchored else None,
        }


def push(
    source: PathLike,
    remote: str,
    *,
    base: PathLike | None = None,
    anchor: bool = False,
    label: str | None = None,
    part_size: int = DEFAULT_PART_SIZE,
    fork: bool = False,
    level: int = DEFAULT_LEVEL,
    sign_key: PathLike | None = None,
    token: str | None = None,
    private: bool = True,
    commit_message: str | None = None,
    adopt: bool = False,
    allow_opaque: bool = False,
    threads: int | None = None,
    anchor_every: int | None = None,
    anchor_when: float | None = None,
    exclude: tuple[str, ...] | list[str] = (),
    include: tuple[str, ...] | list[str] = (),
    reporter: Reporter = SILENT,
) -> PushResult:
    """Publish ``source`` on ``remote`` as the new head of its chain.

    ``source`` is a bundle file, or a checkpoint directory packed against
    ``base`` (or whole, with ``anchor=True``; ``label`` names the version,
    ``level`` is zstd's, parts are at most ``part_size`` bytes). A bundle
    whose base is not the head is refused unless ``fork=True`` and the
    remote has its base. With ``sign_key`` (a minisign secret key file) the
    bundle and the new chain index are signed, once the chain being extended
    has verified (see :func:`push_bundle`; an unsigned chain is signed for
    the first time only with ``adopt=True``); an unsigned push onto a signed
    chain is refused. A checkpoint directory that a loader could not open is
    refused unless ``allow_opaque=True``. Of two concurrent pushes one wins;
    the other raises :class:`~wdiff.errors.ConflictError`.

    On the Hub, a push creates what is missing: the repository (private
    unless ``private=False``), the branch named by ``@REV`` (from the
    default branch), and a model card when the repository has none.
    ``token`` is handed to huggingface_hub (default: ``HF_TOKEN`` or the
    stored login); ``commit_message`` replaces wdiff's own.

    ``exclude`` and ``include``: which files of a checkpoint directory are
    packed, as :func:`~wdiff.ops.pack.pack` takes them (trainer state is
    left out unless included).

    Anchor policy, for a checkpoint directory pushed with ``base``: the push
    also publishes an anchor of the same version, in the same chain write,
    when ``anchor_every`` (N >= 1) says so (N pushes since the newest anchor,
    counting this one) or when the cheapest catch-up from the newest anchor
    to this version would be more than ``anchor_when`` (a fraction > 0) of
    that anchor's size. Returns a :class:`PushResult`."""
    source = os.fspath(source)
    if part_size < 1024 * 1024:
        raise UsageError("the part size must be at least 1 MiB")
    policy = _policy(anchor_every, anchor_when)
    if policy is not None and not (os.path.isdir(source) and base is not None):
        raise UsageError("--anchor-every and --anchor-when apply to a checkpoint directory pushed with --base",
                         hint="an anchor is made from the directory itself")
    _refuse_confusion(source, remote)
    if os.path.isdir(source):
        if anchor == (base is not None):
            raise UsageError("pushing a checkpoint directory needs --base PREV or --anchor (one of them)")
        if not allow_opaque:
            _refuse_unloadable(source)
        parent_dir = os.path.dirname(os.path.abspath(source))
        fd, tmp = tempfile.mkstemp(prefix=".wdiff-push-", suffix=".wdb", dir=parent_dir)
        os.close(fd)
        try:
            rules = {"exclude": exclude, "include": include}
            pack(None if anchor else base, source, tmp, level=level, threads=threads, reporter=reporter, overwrite=True,
                 **rules)
            also = None
            if policy is not None:
                also = (policy, lambda out: pack(None, source, out, level=level, threads=threads, reporter=reporter,
                                                 overwrite=True, **rules))
            return push_bundle(tmp, remote, label=label, part_size=part_size, fork=fork, sign_key=sign_key,
                                adopt=adopt, reporter=reporter, token=token, private=private,
                                commit_message=commit_message, also_anchor=also)
        finally:
            for p in (tmp, tmp + signing.SUFFIX, tmp + ".anchor.wdb", tmp + ".anchor.wdb" + signing.SUFFIX):
                if os.path.exists(p):
                    os.unlink(p)
    if base is not None or anchor or exclude or include:
        raise UsageError("--base, --anchor, --exclude and --include apply to a checkpoint directory, "
                         "not to a bundle file (its files were chosen when it was packed)")
    return push_bundle(source, remote, label=label, part_size=part_size, fork=fork, sign_key=sign_key,
                        adopt=adopt, reporter=reporter, token=token, private=private, commit_message=commit_message)


@dataclass(frozen=True)
class AnchorPolicy:
    every: int | None
    when: float | None

    def wants(self, chain: Chain, delta_size: int) -> bool:
        """Whether a delta of ``delta_size`` bytes pushed onto ``chain``'s
        head should come with an anchor of the same version."""
        last = next((k for k in range(len(chain.entries) - 1, -1, -1) if chain.entries[k].anchor), None)
        if last is None:
            return True
        a = chain.entries[last]
        if self.every is not None:
            seen = {e.version for e in chain.entries[: last + 1]}
            pushes = 0
            for e in chain.entries[last + 1 :]:
                if e.version not in seen:
                    seen.add(e.version)
                    pushes += 1
            if pushes + 1 >= self.every:
                return True
        if self.when is not None and chain.head is not None:
            run = chain.path(a.version, chain.head)
            cost = (sum(e.size for e in run) if run is not None else a.size) + delta_size
            if cost > self.when * a.size:
                return True
        return False


def _policy(every: int | None, when: float | None) -> AnchorPolicy | None:
    if every is None and when is None:
        return None
    if every is not None and every < 1:
        raise UsageError("--anchor-every must be 1 or more")
    if when is not None and not when > 0:
        raise UsageError("--anchor-when must be a fraction above 0 (0.5: when catching up costs half an anchor)")
    return AnchorPolicy(every, when)


def _refuse_confusion(source: str, remote) -> None:
    """A remote that is a checkpoint directory, or a source directory that
    is a remote, is a swapped or mistyped argument: refused before anything
    is written."""
    target = _local_path(remote)
    if target is not None and os.path.isdir(target) and not holds_remote(target) and holds_checkpoint(target):
        raise UsageError(f"{target} holds a checkpoint; a push would turn it into a remote (chain.json, objects/)",
                         hint="give a remote (an empty or new directory, or one pushed to before) as the last argument")
    if os.path.isdir(source):
        refuse_remote_as_checkpoint(source, "a push publishes a checkpoint directory")


def _local_path(remote) -> str | None:
    try:
        spec = parse_remote(os.fspath(remote))
    except UsageError:
        return None
    return spec["path"] if spec["kind"] == "local" else None


def _refuse_unloadable(source: str) -> None:
    found = loadable.problems(scan(source))
    if found:
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        raise IntegrityError(f"{source}: not a checkpoint a loader can open, so it is not pushed: "
                             + "; ".join(found[:3]) + more,
                             hint="fix the checkpoint, or push it as it is with --allow-opaque")


def push_bundle(path: str, remote, *, label, part_size: int, fork: bool, sign_key, reporter: Reporter,
                 shortcut: bool = False, adopt: bool = False, token: str | None = None, private: bool = True,
                 commit_message: str | None = None, also_anchor=None) -> PushResult:
    """Publish a bundle file. A ``shortcut`` (a squash of versions the chain
    has) may start anywhere and must end at a version the chain has; it
    leaves the head alone.

    The chain being extended is checked first (:func:`check_extended`): a
    signed chain is verified (with the signing key, or a key in
    WDIFF_TRUSTED_KEYS, for a rotation) and must not go back on this
    user's records; an unsigned push onto a signed chain, and a signed push
    onto an unsigned one without ``adopt``, are refused. The new chain
    carries the remote's identity, the next sequence number and the digest
    of the chain it replaces, and is recorded as this user's newest.

    ``also_anchor``: (AnchorPolicy, a function that packs an anchor of the
    same version into the path it is given): when the policy wants one,
    the anchor is published with the delta, in the same chain write."""
    key = signing.load_secret(os.fspath(sign_key)) if sign_key is not None else None
    store = open_remote(remote, token=token, private=private, create=True)
    with BundleReader(path) as reader:
        check_records(reader, reporter)
        ix = reader.index
        bundle_id, size = reader.id, reader.size
    raw, chain_token = store.read_chain()
    chain = Chain.decode(raw, where=store.url)
    records = trust.places(None)
    verified = check_extended(store, chain, raw, key, adopt=adopt, records=records, reporter=reporter)
    parent, version = ix.base_fingerprint, ix.target_fingerprint
    done = chain.entry(bundle_id)
    if done is None and not shortcut:
        # another bundle of the same step (the same base and target: packed
        # again, by another wdiff or with other options) adds nothing
        done = next((e for e in chain.entries if e.version == version and e.parent == parent), None)
    if done is not None:
        return PushResult(store.url, done.bundle, version, parent, len(done.parts), done.size, False, done.label)
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
    uploads: list[Upload] = []
    entry = _entry(path, bundle_id, size, version, parent, label, part_size, key, uploads)
    n_parts = len(entry.parts)
    extra = None
    if also_anchor is not None and parent is not None and also_anchor[0].wants(chain, size):
        anchor_path = path + ".anchor.wdb"
        also_anchor[1](anchor_path)
        with BundleReader(anchor_path) as ar:
            check_records(ar, reporter)
            if ar.index.target_fingerprint != version or ar.index.base_fingerprint is not None:
                raise IntegrityError(f"{anchor_path}: the anchor is not of the version pushed")
            a_id, a_size = ar.id, ar.size
        if chain.entry(a_id) is None:
            extra = _entry(anchor_path, a_id, a_size, version, None, label, part_size, key, uploads)
    lineage = chain.lineage
    replaced = raw if chain.entries or lineage is not None else None
    if extra is not None:
        chain = chain.appended(entry)
        entry = extra
    new = chain.appended(entry, head=not shortcut).succeeding(
        replaced,
        remote=lineage.remote if lineage is not None else secrets.token_hex(16),
        published=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        signer=key.public_key.id_hex if key is not None else None,
    )
    # a Hub repository commits the parts first and says which commit holds
    # them, which the chain records (one URL per part for ever); other stores
    # place nothing, and the chain made here is the one published
    final = [new, new.encode()]
    sigs = [chain_signature(final[1], key, path)] if key is not None else []

    def make_chain(placed: dict[str, str]) -> tuple[bytes, list[Upload]]:
        if placed:
            final[0] = new.placed(placed)
            final[1] = final[0].encode()
            if key is not None:
                sigs.append(chain_signature(final[1], key, path))
        return final[1], sigs[-1:]

    reporter.phase("upload", sum(u.length for u in uploads) + sum(u.length for u in sigs))
    verb = "wdiff squash" if shortcut else "wdiff push"
    message = commit_message or f"{verb} {short(version)}" + (f" ({label})" if label else "")
    try:
        store.publish_placed(uploads, make_chain, chain_token, message=message, reporter=reporter)
    finally:
        for sig in sigs:  # the chain's signature files are wdiff's own temps: they go once uploaded
            with contextlib.suppress(OSError):
                os.unlink(sig.source)
    new, encoded = final
    if key is not None or verified:
        trust.remember(store.url, new, encoded, records)
    reporter.done()
    return PushResult(store.url, bundle_id, version, parent, n_parts, size, True, label,
                      anchored=extra.bundle if extra is not None else None)


def _entry(path: str, bundle_id: bytes, size: int, version: bytes, parent: bytes | None, label, part_size: int,
           key, uploads: list[Upload]) -> Entry:
    """The chain entry of a bundle file, adding its parts (and signature) to ``uploads``."""
    n_parts = max(1, -(-size // part_size))
    names = part_paths(bundle_id, n_parts)
    parts = []
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
    return Entry(
        bundle=bundle_id, version=version, parent=parent, parts=tuple(parts),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), label=label, signature=signature,
    )


def check_extended(store, chain: Chain, raw: bytes | None, key, *, adopt: bool, records: list,
                   reporter: Reporter) -> bool:
    """Refuse to extend a chain that this push cannot vouch for; returns
    whether the chain was verified. A chain is signed when it says so (its
    signer) or, written before format 1.1, when a signature object for its
    bytes exists."""
    if raw is None or not chain.entries:
        return False
    lin = chain.lineage
    signed = lin.signer is not None if lin is not None else has_chain_signature(store, raw)
    if signed and key is None:
        by = f" by key {lin.signer}" if lin is not None else ""
        raise IntegrityError(f"{store.url}: the chain is signed{by}; an unsigned push would strip its signature "
                             "and every puller with a trusted key would refuse the remote",
                             hint="push with --sign KEY")
    if key is None:
        return False
    if not signed:
        if not adopt:
            raise IntegrityError(f"{store.url}: the chain is not signed, so nobody can tell whether its storage "
                                 "changed it; --sign would vouch for it unchecked",
                                 hint="check the remote (wdiff log), then sign it for the first time with --adopt")
        return False
    keys = [key.public_key] + [k for k in signing.trusted_keys(None) if k.key_id != key.key_id]
    verify_chain(store, raw, chain, keys, reporter=reporter)
    trust.check(store.url, chain, raw, records)
    return True


def squash_remote(
    remote: str,
    *,
    start: str | None = None,
    to: str | None = None,
    base: PathLike | None = None,
    label: str | None = None,
    part_size: int = DEFAULT_PART_SIZE,
    sign_key: PathLike | None = None,
    adopt: bool = False,
    threads: int | None = None,
    reporter: Reporter = SILENT,
) -> PushResult:
    """Add to ``remote`` one bundle that goes from version ``start`` (default:
    nothing, making an anchor) to ``to`` (default: the head), composed from
    the bundles the chain already has: a late joiner then downloads one
    bundle. A squash from a version needs that version's checkpoint as
    ``base``; from nothing it needs no checkpoint at all. ``label``,
    ``part_size`` and ``sign_key`` (with ``adopt``) are as for :func:`push`.
    Returns a :class:`PushResult`."""
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
    with scratch_dir("squash") as work:
        bundles = [download(store, e, work, reporter)[0] for e in run]
        out = os.path.join(work, "squash.wdb")
        squash(bundles, base, out, threads=threads, reporter=reporter)
        label = label or next((e.label for e in reversed(run) if e.label), None)
        return push_bundle(out, remote, label=label, part_size=part_size, fork=False, sign_key=sign_key,
                            reporter=reporter, shortcut=True, adopt=adopt)
