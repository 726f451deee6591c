"""Many writers, one version: staged parts and the commit that joins them.

Each writer packs the files it holds (``--only PATTERN``) against the files
of its base that those files need (the same paths, and every base file that
holds the old bytes of one of its tensors: a tensor may move between
shards), and stores the bundle, a small part manifest and, when it signs,
the manifest's signature under ``stage/NAME/`` with
:meth:`~wdiff.remotes.base.Writer.store`: the chain index is untouched, so
no reader sees anything. ``commit`` then reads every manifest of the stage,
checks each one's signature against the trusted keys (required when the
commit signs), that every part is of this remote, this stage and the head,
that no file is in two parts (never resolved by which is newer), that there
are exactly the expected number, that every bundle is what its manifest
says and that no tensor was packed whole for want of a base file another
part holds, and merges them into one ordinary bundle (records copied as
they are, renumbered by file; one index over all files): the bundle a
single host would pack, byte for byte. It publishes that with one
conditional chain write as a push does, so a reader sees the version whole
or not at all. A writer that dies leaves only objects under stage/ (a
rerun of it stores the same part again); the commit deletes the objects of
the stage it listed once the version is published (a part stored since is
not in the version, and stays), and gc removes stale stages after its grace
period.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..defaults import DEFAULT_LEVEL, DEFAULT_PART_SIZE
from ..errors import BaseMismatchError, IntegrityError, NotFoundError, UsageError
from ..format import signature as signing
from ..format.bundle import BundleReader
from ..format.chain import Chain
from ..fsutil import atomic_write_bytes, scratch_dir
from ..ops.pack import pack_pair
from ..ops.pair import Pair
from ..ops.signing import SIG_MAX
from ..paths import PathLike, printable
from ..progress import SILENT, Reporter
from ..remotes import Upload, open_remote
from ..store import ignore
from ..store.checkpoint import Checkpoint, scan
from ..store.hashing import hexd, range_digest, short
from ..store.units import base_source
from .push import PushResult, push_bundle
from .stage_merge import (
    MAX_MANIFEST,
    PART_NAME,
    Manifest,
    Tensor,
    check_heads,
    check_parts,
    encode_manifest,
    merge,
    needed_version,
    parse_manifest,
    part_comment,
)

STAGE = "stage"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

__all__ = ["STAGE", "CommitResult", "StagedPart", "commit", "merge", "push_part", "stage_prefix", "store_part"]


def stage_prefix(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UsageError(f"stage name {printable(str(name))} is not 1-64 letters, digits, '.', '_' or '-'")
    return f"{STAGE}/{name}"


@dataclass(frozen=True)
class StagedPart:
    """The part :func:`push_part` stored under a remote's stage."""

    remote: str
    stage: str
    bundle_id: bytes
    bytes: int
    files: int
    head: bytes
    uploaded: bool
    #: XXH3-128 of the part's manifest (which names its bundle's digest)
    digest: bytes = b""
    signed: bool = False

    def to_json(self) -> dict:
        return {"schema": "wdiff.stage/1", "remote": self.remote, "stage": self.stage,
                "bundle_id": hexd(self.bundle_id), "bytes": self.bytes, "files": self.files,
                "head": hexd(self.head), "uploaded": self.uploaded, "part": hexd(self.digest),
                "signed": self.signed}


def push_part(source: PathLike, remote: str, *, base: PathLike | None, only: list[str], stage: str,
              level: int = DEFAULT_LEVEL, sign_key: PathLike | None = None, token: str | None = None,
              threads: int | None = None, reporter: Reporter = SILENT) -> StagedPart:
    """One writer's part of a version many writers publish together: pack
    the files of the checkpoint directory ``source`` that match ``only``
    (gitignore-style patterns, as pack's --include) against the files of
    ``base`` (the remote's head) they need (the same paths, and the base
    files holding the old bytes of their tensors), and store the bundle and
    its manifest under stage/``stage``/ of ``remote`` (``token``: for a Hub
    remote); ``level`` is zstd's. With ``sign_key`` (a minisign secret key
    file) the part is signed, as a commit that signs requires. Nothing
    becomes visible: the chain is not changed, and :func:`commit` publishes
    the parts. A rerun stores the same part again.
    Returns a :class:`StagedPart`."""
    stage_prefix(stage)  # a bad name is refused before any work
    source = os.fspath(source)
    if not os.path.isdir(source) or base is None:
        raise UsageError("a staged push takes a checkpoint directory and --base PREV (the remote's head)")
    if not only:
        raise UsageError("a staged push needs --only PATTERN: the files this writer holds")
    key = signing.load_secret(os.fspath(sign_key)) if sign_key is not None else None
    store = open_remote(remote, token=token)
    raw, _ = store.read_chain()
    chain = Chain.decode(raw, where=store.url)
    if chain.head is None:
        raise NotFoundError(f"{store.url}: has no versions yet; push an anchor first",
                            hint="wdiff push --anchor CHECKPOINT REMOTE")
    pair, tensors = part_pair(base, source, only, _OwnFilesOnly(reporter))
    if not pair.B.files:
        raise NotFoundError(f"{source}: no file matches {', '.join(printable(p) for p in only)}")
    # the part is packed in a scratch folder of the system's temporary
    # directory, never beside the user's checkpoint: a writer killed mid-pack
    # (a host that dies, a cron job's timeout) leaves it there, and the next
    # staged push removes what dead runs left, so a fleet's reruns do not
    # fill the disk one partial bundle at a time
    with scratch_dir("stage") as work:
        out = os.path.join(work, "part.wdb")
        pack_pair(pair, out, level=level, threads=threads, reporter=_OwnFilesOnly(reporter))
        return store_part(out, store, stage=stage, head=chain.head, reporter=reporter, sign_key=key, tensors=tensors)


def part_pair(base, source, only: list[str], reporter: Reporter) -> tuple[Pair, tuple]:
    """The pair a writer packs: its target files (those ``only`` names) and
    the base files they need, found as a single host's pack finds them: by
    path, and every tensor's base by its qualified name in the whole base
    directory this writer has. Also, for the commit's checks, the tensors
    of those base files, the target tensors with no base here (no other
    part's base may hold one) and the names of every target tensor."""
    rules = ignore.rules(("*",), ("*/", *only))
    A = scan(base)
    B = scan(source, rules=rules, reuse=A)
    need = {f.path for f in scan(base, rules=rules, reuse=A).files}
    new = []
    for f in B.files:
        if f.header is None:
            continue
        scope = A.base_tensors_for(f.path)
        for t in f.header.tensors:
            src = base_source(t, scope)
            if src is None:
                new.append(Tensor(t.name, t.dtype, tuple(t.shape), f.path))
            else:
                need.add(src.file.path)
    A = Checkpoint(root=A.root, files=tuple(f for f in A.files if f.path in need))
    held = [Tensor(t.name, t.dtype, tuple(t.shape), f.path) for f in A.files if f.header is not None
            for t in f.header.tensors]
    names = [(f.path, t.name) for f in B.files if f.header is not None for t in f.header.tensors]
    return Pair(A, B, reporter=reporter, rules=rules), (held, new, names)


def store_part(bundle, store, *, stage: str, head: bytes | None, reporter: Reporter = SILENT, sign_key=None,
               tensors: tuple | None = None) -> StagedPart:
    """Store a packed bundle (over this writer's files) and its part
    manifest under ``store``'s (an open remote's) stage/NAME/, as packed
    against version ``head`` (None: an anchor part, onto a remote with no
    versions yet). With ``sign_key`` (a SecretKey or a key file) the
    manifest is signed: a commit that signs accepts only signed parts.
    ``tensors``: (the tensors of the part's base files, its target tensors
    with no base there, (file, name) of every target tensor), for the
    commit's checks. The chain is not changed; once this returns, the part
    is durable. For writers that pack themselves (wdiff.live's ranks)."""
    prefix = stage_prefix(stage)
    key = signing.load_secret(os.fspath(sign_key)) if sign_key is not None and not isinstance(
        sign_key, signing.SecretKey) else sign_key
    out = os.fspath(bundle)
    with BundleReader(out) as r:
        ix = r.index
        bundle_id, size = r.id, r.size
    raw, _ = store.read_chain()
    chain = Chain.decode(raw, where=store.url)
    remote_id = chain.lineage.remote if chain.lineage is not None else None
    with scratch_dir("stage") as work:
        bundle_path = f"{prefix}/{hexd(bundle_id)}.wdb"
        manifest = encode_manifest(
            stage=stage, remote=remote_id, head=head, bundle=bundle_id, path=bundle_path, size=size,
            digest=range_digest(out, 0, size), files=[f.path for f in ix.files],
            base_files=[f.path for f in ix.base_files],
            base_tensors=tensors[0] if tensors else None, new_tensors=tensors[1] if tensors else None,
            target_tensors=tensors[2] if tensors else None)
        mpath = os.path.join(work, "part.json")
        atomic_write_bytes(mpath, manifest)
        name = f"{prefix}/part-{hexd(bundle_id)}.json"
        have = dict(store.list(prefix))
        uploaded = have.get(bundle_path) != size
        reporter.phase("upload", size)
        store.store([Upload(bundle_path, out, 0, size)], reporter=reporter)  # the bundle first,
        if key is not None:  # then the manifest's signature,
            sig = signing.sign_file(mpath, key, part_comment(stage, remote_id, head, bundle_id))
            store.store([Upload(name + signing.SUFFIX, sig, 0, os.path.getsize(sig))])
        store.store([Upload(name, mpath, 0, len(manifest))])  # then the manifest: the part is there
        reporter.done()
        return StagedPart(store.url, stage, bundle_id, size, len(ix.files), head or b"", uploaded,
                          range_digest(mpath, 0, len(manifest)), key is not None)


class _OwnFilesOnly(Reporter):
    """The pack's reporter, without its note on the files left out: in a
    staged push those are the other writers' files, left out on purpose."""

    def __init__(self, inner: Reporter) -> None:
        self.inner = inner

    def phase(self, name: str, total: int | None = None) -> None:
        self.inner.phase(name, total)

    def advance(self, n: int) -> None:
        self.inner.advance(n)

    def file(self, name: str, size: int) -> None:
        self.inner.file(name, size)

    def warn(self, message: str) -> None:
        if not message.startswith("left out (trainer state or ignore patterns)"):
            self.inner.warn(message)

    def done(self) -> None:
        self.inner.done()


@dataclass(frozen=True)
class CommitResult:
    """The version :func:`commit` published (``push``), from how many parts."""

    push: PushResult
    stage: str
    parts: int

    def to_json(self) -> dict:
        d = self.push.to_json()
        d.pop("anchored", None)
        d.update(schema="wdiff.commit/1", stage=self.stage, merged=self.parts)
        return d




def commit(remote: str, *, stage: str, expect: int, label: str | None = None, sign_key: PathLike | None = None,
           trusted_keys: list[PathLike] | None = None, part_size: int = DEFAULT_PART_SIZE,
           token: str | None = None, threads: int | None = None, reporter: Reporter = SILENT) -> CommitResult:
    """Publish the ``expect`` parts staged under ``stage`` of ``remote`` as
    one version (named ``label``; parts of at most ``part_size`` bytes;
    ``token``: for a Hub remote), atomically: checked (signatures, remote,
    stage and head of each part, count, disjoint files, bases that together
    are the head, every bundle as its manifest says), merged into one bundle
    (the one a single host would pack) and pushed onto the head with one
    conditional chain write; then the stage's objects it listed are
    deleted. Two parts holding one file
    raise :class:`~wdiff.errors.BaseMismatchError`; a missing part raises
    :class:`~wdiff.errors.NotFoundError` and changes nothing.

    Parts are authenticated by their writers' signatures (``push --stage
    --sign``): with ``sign_key`` (the commit signs the version) or trusted
    keys (``trusted_keys``, public key files, else WDIFF_TRUSTED_KEYS) every
    part must be signed by one of them, or by the commit's own key, else
    :class:`~wdiff.errors.IntegrityError`; with neither, the stage's storage
    is trusted as it is. Returns a :class:`CommitResult`."""
    prefix = stage_prefix(stage)
    if expect < 1:
        raise UsageError("--expect must be 1 or more")
    key = signing.load_secret(os.fspath(sign_key)) if sign_key is not None else None
    keys = signing.trusted_keys([os.fspath(k) for k in trusted_keys] if trusted_keys else None)
    if key is not None and all(k.key_id != key.key_id for k in keys):
        keys.append(key.public_key)
    store = open_remote(remote, token=token)
    raw, _ = store.read_chain()
    chain = Chain.decode(raw, where=store.url)
    remote_id = chain.lineage.remote if chain.lineage is not None else None
    where = f"{store.url}: stage {stage}"
    with scratch_dir("commit") as work:
        listing = dict(store.list(prefix))
        parts = _read_parts(store, prefix, stage, work, keys, listing)
        check_parts(parts, where=where, stage=stage, remote=remote_id)
        if len(parts) != expect:
            raise NotFoundError(f"{where} holds {len(parts)} part(s), not the {expect} expected",
                                hint="run the missing writers (a rerun of one stores its part again), then commit")
        bundles = []
        for k, m in enumerate(parts):
            dest = os.path.join(work, f"part{k:05d}.wdb")
            store.fetch(m.path, dest, size=m.size, reporter=reporter)
            if range_digest(dest, 0, m.size) != m.digest:
                raise IntegrityError(f"{store.url}: {m.path} arrived damaged (digest mismatch)", hint="run the commit again")
            with BundleReader(dest) as r:
                if (r.id != m.bundle or tuple(f.path for f in r.index.files) != m.files
                        or tuple(f.path for f in r.index.base_files) != m.base_files):
                    raise IntegrityError(f"{m.where}: the bundle is not the one the manifest describes")
            bundles.append(dest)
        out = os.path.join(work, "version.wdb")
        merged_id, parent = merge(bundles, out, where=where, version=needed_version(parts))
        if chain.entry(merged_id) is None:  # not published by an earlier run of this commit
            check_heads(parts, head=chain.head)
        if chain.entry(merged_id) is None and parent != chain.head:
            raise BaseMismatchError(
                f"{where}: the parts' bases together are {short(parent) if parent else 'nothing'}, "
                f"not the head {short(chain.head) if chain.head else '(none)'}",
                hint="every file of the head must be in some writer's --only patterns (a file the version "
                     "deletes too); stage again against the head (with a new stage name)")
        res = push_bundle(out, store.url, label=label, part_size=part_size, fork=False, sign_key=sign_key,
                          reporter=reporter, token=token)
    # published (or it was already): the stage has done its work. Only what
    # this commit listed goes: a part a writer stored since (a late or extra
    # writer) is not in this version, and stays for the next commit or gc
    store.delete(sorted(listing))
    return CommitResult(res, stage, len(parts))


def _read_parts(store, prefix: str, stage: str, work: str, keys: list, listing: dict) -> list[Manifest]:
    """Every part manifest of the stage's ``listing`` ({path: size}), in
    path order; with ``keys``, each one's signature checked first (an
    unsigned or untrusted part is refused, never skipped: what storage
    planted is reported)."""
    parts = []
    for path in sorted(listing):
        found = PART_NAME.fullmatch(path.rsplit("/", 1)[-1])
        if path.rsplit("/", 1)[0] != prefix or found is None:
            continue
        what = f"{store.url}: {path}"
        dest = os.path.join(work, f"m{len(parts):05d}.json")
        store.fetch(path, dest, max_size=MAX_MANIFEST)
        if keys:
            sig = dest + signing.SUFFIX
            if path + signing.SUFFIX not in listing:
                raise IntegrityError(f"{what}: the part is not signed, and this commit accepts only parts "
                                     "signed by a trusted key", hint="stage it again with push --stage --sign KEY")
            store.fetch(path + signing.SUFFIX, sig, max_size=SIG_MAX)
            with open(dest, "rb") as f:
                comment = signing.verify_open(f, sig, keys, what=what)
                f.seek(0)
                m = parse_manifest(f.read(MAX_MANIFEST + 1), what, prefix)
            if comment != part_comment(m.stage, m.remote, m.head, m.bundle):
                raise IntegrityError(f"{what}: the signature's trusted comment does not match the manifest")
        else:
            with open(dest, "rb") as f:
                m = parse_manifest(f.read(MAX_MANIFEST + 1), what, prefix)
        if m.bundle.hex() != found.group(1) or m.path != f"{prefix}/{hexd(m.bundle)}.wdb":
            raise IntegrityError(f"{what}: the manifest names bundle {hexd(m.bundle)} at {printable(m.path)}, "
                                 "not its own")
        parts.append(m)
    return parts
