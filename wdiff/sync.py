"""push, pull, log, status: moving versions through a remote.

A remote holds ``chain.json`` (see chain.py) and the bundles it lists, split
into parts. ``push`` stores a bundle's parts and then a new chain naming them,
refusing a bundle whose base is not the chain's head (unless it is an anchor
or a fork is asked for). ``pull`` fingerprints the directory, finds the
cheapest run of bundles from there (or from an anchor) to the wanted
version, downloads and verifies every part, squashes a run of several into
one bundle, and applies it in place: no intermediate checkpoint is written.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field

import xxhash

from . import manifest, signing
from .applying import apply
from .bundle import BundleReader
from .chain import Chain, Entry, Part, part_paths
from .checkpoint import TXN_JOURNAL, scan
from .compose import squash
from .errors import BaseMismatchError, BusyError, IntegrityError, NotFoundError, UsageError
from .fsutil import locked, remove_tree
from .hashing import fingerprint, hexd
from .inplace import apply_in_place
from .packing import pack
from .parallel import default_threads
from .codecs import DEFAULT_LEVEL
from .progress import SILENT, Reporter
from .remotes import Upload, open_remote

DEFAULT_PART_SIZE = 20 * 1000**3  # the Hub recommends files of at most 20 GB
EMPTY_FINGERPRINT = fingerprint([])
STATE = ".wdiff"
PIECE = 8 * 1024 * 1024


def short(fp: bytes | None) -> str:
    return hexd(fp)[:12] if fp else "-"


# -- push ---------------------------------------------------------------------------------


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
    threads: int | None = None,
    reporter: Reporter = SILENT,
) -> PushResult:
    """Push a bundle file, or a checkpoint directory packed against ``base``
    (or whole, with ``anchor=True``), to ``remote`` as its new head. With
    ``sign_key`` (a minisign secret key file), the bundle and the new chain
    index are signed."""
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
            pack(None if anchor else base, source, tmp, level=level, threads=threads, reporter=reporter)
            return _push_bundle(tmp, remote, label=label, part_size=part_size, fork=fork, sign_key=sign_key,
                                reporter=reporter)
        finally:
            for p in (tmp, tmp + signing.SUFFIX):
                if os.path.exists(p):
                    os.unlink(p)
    if base is not None or anchor:
        raise UsageError("--base and --anchor apply to a checkpoint directory, not to a bundle file")
    return _push_bundle(source, remote, label=label, part_size=part_size, fork=fork, sign_key=sign_key,
                        reporter=reporter)


def _push_bundle(path: str, remote, *, label, part_size: int, fork: bool, sign_key, reporter: Reporter,
                 shortcut: bool = False) -> PushResult:
    """Publish a bundle file. A ``shortcut`` (a squash of versions the chain
    has) may start anywhere and must end at a version the chain has; it
    leaves the head alone."""
    key = signing.load_secret(os.fspath(sign_key)) if sign_key is not None else None
    store = open_remote(remote)
    with BundleReader(path) as reader:
        _verify_records(reader, reporter)
        ix = reader.index
        bundle_id, size = reader.id, reader.size
    raw, token = store.read_chain()
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
        parts.append(Part(name, length, _digest_range(path, off, length)))
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
    if key is not None:
        uploads.append(_chain_signature(encoded, key, path))
    reporter.phase("upload", size)
    verb = "wdiff squash" if shortcut else "wdiff push"
    store.publish(uploads, encoded, token, message=f"{verb} {short(version)}" + (f" ({label})" if label else ""),
                  reporter=reporter)
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
    import tempfile

    threads = threads or default_threads()
    store = open_remote(remote)
    chain = _read(store)
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
        bundles = [_download(store, e, work, reporter)[0] for e in run]
        out = os.path.join(work, "squash.wdb")
        squash(bundles, base, out, threads=threads, reporter=reporter)
        label = label or next((e.label for e in reversed(run) if e.label), None)
        return _push_bundle(out, remote, label=label, part_size=part_size, fork=False, sign_key=sign_key,
                            reporter=reporter, shortcut=True)


def sign_bundle(path, key, *, verify: bool = True, reporter: Reporter = SILENT) -> str:
    """Write ``path.minisig``: ``key`` (a SecretKey or a key file) signs the
    bundle, its trusted comment naming the bundle, its base and its target.
    With ``verify``, every record is checked first. Returns the signature path."""
    path = os.fspath(path)
    secret = key if isinstance(key, signing.SecretKey) else signing.load_secret(os.fspath(key))
    with BundleReader(path) as r:
        if verify:
            _verify_records(r, reporter)
        comment = bundle_comment(r.id, r.index.base_fingerprint, r.index.target_fingerprint)
    return signing.sign_file(path, secret, comment)


def bundle_comment(bundle_id: bytes, parent: bytes | None, version: bytes) -> str:
    return f"wdiff bundle {hexd(bundle_id)} base {hexd(parent) if parent else 'none'} target {hexd(version)}"


def _chain_signature(encoded: bytes, key, beside: str) -> Upload:
    """Sign a chain index. The signature is an object named by the index's
    digest, stored before the index: a reader finds it from the bytes it
    read, and never sees an index whose signature is not there yet."""
    import tempfile

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


def _verify_records(reader: BundleReader, reporter: Reporter) -> None:
    """Read every record once so that nothing corrupt is ever published."""
    reporter.phase("verify bundle", reader.size)
    for rec in reader.records():
        if rec.payload is None:
            reader.check_file_payload(rec)
        reporter.advance(rec.header.payload_len)


def _digest_range(path: str, offset: int, length: int) -> bytes:
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        f.seek(offset)
        left = length
        while left:
            piece = f.read(min(PIECE, left))
            if not piece:
                raise IntegrityError(f"{path}: shorter than expected")
            h.update(piece)
            left -= len(piece)
    return h.digest()


# -- log ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogResult:
    remote: str
    head: bytes | None
    entries: tuple[Entry, ...]  # newest first

    def to_json(self) -> dict:
        return {
            "schema": "wdiff.log/1",
            "remote": self.remote,
            "head": hexd(self.head) if self.head else None,
            "entries": [dict(e.to_json(), anchor=e.anchor) for e in self.entries],
        }


def _read(store, *, keys: list | None = None) -> Chain:
    """The chain of a remote that must exist (log, status, pull); with
    ``keys``, its signature must verify with one of them."""
    raw, token = store.read_chain()
    if raw is None and token is None:
        raise NotFoundError(f"{store.url}: no such remote")
    if keys:
        if raw is None:
            raise IntegrityError(f"{store.url}: has no signed chain")
        _verify_chain(store, raw, keys)
    return Chain.decode(raw, where=store.url)


def _verify_chain(store, raw: bytes, keys: list) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="wdiff-sig-") as tmp:
        chain_file = os.path.join(tmp, "chain.json")
        with open(chain_file, "wb") as f:
            f.write(raw)
        sig = chain_file + signing.SUFFIX
        try:
            store.fetch(chain_signature_path(raw), sig, size=_SIG_MAX)
        except NotFoundError:
            raise IntegrityError(f"{store.url}: the chain index is not signed") from None
        signing.verify_file(chain_file, sig, keys, what=f"{store.url}: chain index")


_SIG_MAX = -1  # signature objects: small, size not known in advance


def _verify_bundle_signature(store, e: Entry, bundle: str, keys: list) -> None:
    if e.signature is None:
        raise IntegrityError(f"{store.url}: bundle {hexd(e.bundle)[:12]} is not signed")
    sig = bundle + signing.SUFFIX
    if os.path.exists(sig):
        os.unlink(sig)
    store.fetch(e.signature, sig, size=_SIG_MAX)
    comment = signing.verify_file(bundle, sig, keys, what=f"{store.url}: bundle {hexd(e.bundle)[:12]}")
    if comment != bundle_comment(e.bundle, e.parent, e.version):
        raise IntegrityError(f"{store.url}: bundle {hexd(e.bundle)[:12]} carries a signature made for something else")


def log(remote) -> LogResult:
    store = open_remote(remote)
    chain = _read(store)
    return LogResult(store.url, chain.head, tuple(reversed(chain.entries)))


# -- pull and status -------------------------------------------------------------------------


@dataclass(frozen=True)
class PullResult:
    remote: str
    directory: str
    before: bytes | None  # None: empty, or a version the remote does not know
    after: bytes
    bundles: tuple[bytes, ...] = ()
    downloaded: int = 0  # bytes fetched from the remote
    up_to_date: bool = False
    from_anchor: bool = False

    def to_json(self) -> dict:
        return {
            "schema": "wdiff.pull/1",
            "remote": self.remote,
            "directory": self.directory,
            "before": hexd(self.before) if self.before else None,
            "after": hexd(self.after),
            "up_to_date": self.up_to_date,
            "from_anchor": self.from_anchor,
            "bundles": [hexd(b) for b in self.bundles],
            "downloaded_bytes": self.downloaded,
        }


@dataclass(frozen=True)
class StatusResult:
    remote: str
    directory: str
    current: bytes  # the directory's fingerprint
    known: bool  # the remote has this version
    target: bytes  # the head (or the version asked for)
    behind: int  # bundles to apply; -1 when no path exists
    download: int  # bytes a pull would fetch
    from_anchor: bool = False
    labels: dict = field(default_factory=dict)

    @property
    def up_to_date(self) -> bool:
        return self.current == self.target

    def to_json(self) -> dict:
        return {
            "schema": "wdiff.status/1",
            "remote": self.remote,
            "directory": self.directory,
            "current": hexd(self.current),
            "known": self.known,
            "target": hexd(self.target),
            "up_to_date": self.up_to_date,
            "behind": self.behind,
            "download_bytes": self.download,
            "from_anchor": self.from_anchor,
        }


def _fingerprint(directory: str, threads: int, reporter: Reporter) -> bytes:
    if not os.path.isdir(directory):
        return EMPTY_FINGERPRINT
    ckpt = scan(directory)
    if not ckpt.files:
        return EMPTY_FINGERPRINT
    reporter.phase("fingerprint", ckpt.total_bytes)
    return manifest.compute(ckpt, threads=threads, reporter=reporter).fingerprint


def _plan(chain: Chain, current: bytes, goal: bytes) -> tuple[list[Entry], bool]:
    if current == goal:
        return [], False
    run = chain.path(current, goal) if current in chain.versions else None
    if run is not None:
        return run, False
    run = chain.path(None, goal)
    if run is None:
        raise NotFoundError(f"no anchor leads to version {short(goal)}; the remote cannot rebuild it")
    return run, True


def status(directory, remote, *, to: str | None = None, threads: int | None = None, reporter: Reporter = SILENT) -> StatusResult:
    directory = os.fspath(directory)
    threads = threads or default_threads()
    store = open_remote(remote)
    chain = _read(store)
    goal = chain.resolve(to)
    current = _fingerprint(directory, threads, reporter)
    try:
        run, from_anchor = _plan(chain, current, goal)
        behind, download = len(run), sum(e.size for e in run)
    except NotFoundError:
        behind, download, from_anchor = -1, 0, True
    reporter.done()
    return StatusResult(store.url, directory, current, current in chain.versions or current == EMPTY_FINGERPRINT,
                        goal, behind, download, from_anchor)


def pull(
    remote,
    directory,
    *,
    to: str | None = None,
    trusted_keys: list | None = None,
    require_signature: bool = False,
    threads: int | None = None,
    reporter: Reporter = SILENT,
) -> PullResult:
    """Bring ``directory`` to version ``to`` (default: the head) of ``remote``.
    With trusted keys (given, or in WDIFF_TRUSTED_KEYS), the chain index and
    every bundle must carry a valid signature by one of them."""
    directory = os.path.abspath(os.fspath(directory))
    threads = threads or default_threads()
    keys = signing.required_keys(trusted_keys, require_signature)
    store = open_remote(remote)
    # read (and check) the chain before creating DIR: a missing or untrusted
    # remote must not leave an empty directory behind
    chain = _read(store, keys=keys)
    os.makedirs(directory, exist_ok=True)
    # the lock sits beside the directory: a pull may swap the directory itself
    parent, name = os.path.split(directory)
    with locked(os.path.join(parent, f".{name}.wdiff-lock"), what=directory):
        work = os.path.join(directory, STATE, "pull")
        _finish_interrupted(directory, work, threads, reporter)
        goal = chain.resolve(to)
        current = _fingerprint(directory, threads, reporter)
        run, from_anchor = _plan(chain, current, goal)
        before = current if current in chain.versions else None
        if not run:
            remove_tree(work)
            reporter.done()
            return PullResult(store.url, directory, before, goal, up_to_date=True)
        downloaded = 0
        bundles = []
        for e in run:
            path, n = _download(store, e, work, reporter)
            if keys:
                _verify_bundle_signature(store, e, path, keys)
            bundles.append(path)
            downloaded += n
        empty = current == EMPTY_FINGERPRINT
        if from_anchor and not empty:
            _rebuild_beside(directory, bundles, work, threads, reporter)
        else:
            if len(bundles) == 1:
                bundle = bundles[0]
            else:
                bundle = os.path.join(work, f"squash-{short(current)}-{short(goal)}.wdb")
                squash(bundles, None if from_anchor else directory, bundle, threads=threads, reporter=reporter,
                       base_fingerprint=None if from_anchor else current)
            apply_in_place(bundle, directory, abort=False, threads=threads, reporter=reporter)
        remove_tree(work)
    reporter.done()
    return PullResult(store.url, directory, before, goal, tuple(e.bundle for e in run), downloaded,
                      from_anchor=from_anchor)


def _finish_interrupted(directory: str, work: str, threads: int, reporter: Reporter) -> None:
    """A pull killed while applying left a journal; finish that apply first
    with the bundle it names, which our work area still holds."""
    journal = os.path.join(directory, TXN_JOURNAL)
    if not os.path.exists(journal):
        return
    import json

    try:
        with open(journal, "rb") as f:
            bundle = json.loads(f.read()).get("bundle_path", "")
    except (OSError, ValueError):
        bundle = ""
    if not (isinstance(bundle, str) and bundle.startswith(work + os.sep) and os.path.exists(bundle)):
        raise BusyError(
            f"{directory}: an in-place apply that this pull did not start was interrupted here",
            hint="finish it (or --abort it) with wdiff apply BUNDLE DIR --in-place",
        )
    apply_in_place(bundle, directory, abort=False, threads=threads, reporter=reporter)


def _download(store, e: Entry, work: str, reporter: Reporter) -> tuple[str, int]:
    """Fetch and verify every part of an entry's bundle; parts that an
    interrupted pull already verified are not fetched again."""
    os.makedirs(work, exist_ok=True)
    final = os.path.join(work, f"{hexd(e.bundle)}.wdb")
    if os.path.exists(final) and _is_bundle(final, e.bundle):
        return final, 0
    fetched = 0
    part_files = []
    reporter.phase("download", e.size)
    for k, p in enumerate(e.parts):
        dest = os.path.join(work, f"{hexd(e.bundle)}.part{k:05d}")
        done = dest + ".ok"
        if not (os.path.exists(done) and os.path.getsize(dest) == p.size):
            if os.path.exists(done):
                os.unlink(done)
            store.fetch(p.path, dest, size=p.size, reporter=reporter)
            fetched += p.size
            if os.path.getsize(dest) != p.size or _digest_range(dest, 0, p.size) != p.digest:
                os.unlink(dest)
                raise IntegrityError(
                    f"{store.url}: part {p.path} arrived damaged (digest mismatch); it was discarded",
                    hint="run the pull again",
                )
            open(done, "wb").close()
        part_files.append(dest)
    tmp = final + ".tmp"
    with open(tmp, "wb") as out:
        for pf in part_files:
            with open(pf, "rb") as f:
                shutil.copyfileobj(f, out, PIECE)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, final)
    if not _is_bundle(final, e.bundle):
        os.unlink(final)
        raise IntegrityError(f"{store.url}: bundle {hexd(e.bundle)[:12]} is not what the chain says")
    for pf in part_files:
        os.unlink(pf)
        os.unlink(pf + ".ok")
    return final, fetched


def _is_bundle(path: str, bundle_id: bytes) -> bool:
    try:
        with BundleReader(path) as r:
            return r.id == bundle_id
    except Exception:  # noqa: BLE001 - any damage means "fetch it again"
        return False


def _rebuild_beside(directory: str, bundles: list[str], work: str, threads: int, reporter: Reporter) -> None:
    """The directory holds a version the remote does not know: build the
    wanted version beside it from an anchor, then swap the two directories
    by rename. The old content is kept until the new one is complete and
    verified; a crash between the two renames leaves both as hidden siblings
    and no directory, which the next pull treats as empty."""
    parent, name = os.path.split(directory)
    fresh = os.path.join(parent, f".{name}.wdiff-new-{os.getpid()}")
    old = os.path.join(parent, f".{name}.wdiff-old-{os.getpid()}")
    remove_tree(fresh)
    bundle = bundles[0]
    if len(bundles) > 1:
        bundle = os.path.join(work, "squash-anchor.wdb")
        squash(bundles, None, bundle, threads=threads, reporter=reporter)
    apply(bundle, None, fresh, threads=threads, reporter=reporter)
    from .fsutil import fsync_dir

    os.rename(directory, old)
    os.rename(fresh, directory)
    fsync_dir(parent)
    remove_tree(old)
