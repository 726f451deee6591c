"""Many writers, one version: staged parts and the commit that joins them.

Each writer packs the files it holds (``--only PATTERN``) against the same
files of the base, and stores the bundle and a small part manifest under
``stage/NAME/`` with :meth:`~wdiff.remotes.base.Writer.store`: the chain
index is untouched, so no reader sees anything. ``commit`` then reads every
manifest of the stage, checks that there are exactly the expected number of
parts, that they cover disjoint files, that their bases together are exactly
the chain's head and that every bundle is what its manifest says, and merges
them into one ordinary bundle (records copied as they are, renumbered by
file; one index over all files), which it publishes with one conditional
chain write as a push does. A reader sees the version whole or not at all,
and readers of any wdiff read it (a merged bundle is a plain bundle). A
writer that dies leaves only objects under stage/ (a rerun of it stores the
same part again); the commit deletes the stage once the version is
published, and gc removes stale stages after its grace period.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, replace

import xxhash

from ..defaults import DEFAULT_LEVEL, DEFAULT_PART_SIZE
from ..errors import BaseMismatchError, FormatError, IntegrityError, NotFoundError, UsageError
from ..format import records as fmt
from ..format.bundle import BundleReader, BundleWriter
from ..format.chain import Chain
from ..fsutil import atomic_write_bytes
from ..paths import printable
from ..progress import SILENT, Reporter
from ..remotes import Upload, open_remote
from ..store.hashing import fingerprint, hexd, range_digest, short, unhex
from .pack import WRITER, pack
from .push import PushResult, push_bundle

STAGE = "stage"
MANIFEST_FORMAT = "wdiff-stage-part"
MAX_MANIFEST = 16 * 1024 * 1024
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def stage_prefix(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UsageError(f"stage name {printable(str(name))} is not 1-64 letters, digits, '.', '_' or '-'")
    return f"{STAGE}/{name}"


@dataclass(frozen=True)
class StagedPart:
    remote: str
    stage: str
    bundle_id: bytes
    bytes: int
    files: int
    head: bytes
    uploaded: bool

    def to_json(self) -> dict:
        return {"schema": "wdiff.stage/1", "remote": self.remote, "stage": self.stage,
                "bundle_id": hexd(self.bundle_id), "bytes": self.bytes, "files": self.files,
                "head": hexd(self.head), "uploaded": self.uploaded}


def push_part(source, remote, *, base, only: list[str], stage: str, level: int = DEFAULT_LEVEL,
              token: str | None = None, threads: int | None = None, reporter: Reporter = SILENT) -> StagedPart:
    """Pack the files of ``source`` that match ``only`` (gitignore-style
    patterns, as pack's --include) against the same files of ``base``, and
    store the bundle and its manifest under the remote's stage/NAME/. The
    chain is not changed."""
    stage_prefix(stage)  # a bad name is refused before any work
    source = os.fspath(source)
    if not os.path.isdir(source) or base is None:
        raise UsageError("a staged push takes a checkpoint directory and --base PREV (the remote's head)")
    if not only:
        raise UsageError("a staged push needs --only PATTERN: the files this writer holds")
    store = open_remote(remote, token=token)
    raw, _ = store.read_chain()
    chain = Chain.decode(raw, where=store.url)
    if chain.head is None:
        raise NotFoundError(f"{store.url}: has no versions yet; push an anchor first",
                            hint="wdiff push --anchor CHECKPOINT REMOTE")
    work = tempfile.mkdtemp(prefix=".wdiff-stage-", dir=os.path.dirname(os.path.abspath(source)))
    try:
        out = os.path.join(work, "part.wdb")
        # every file out, every folder in, then the writer's own files back in
        pack(base, source, out, level=level, threads=threads, reporter=_OwnFilesOnly(reporter), overwrite=True,
                   exclude=("*",), include=("*/", *only))
        with BundleReader(out) as r:
            if not r.index.files:
                raise NotFoundError(f"{source}: no file matches {', '.join(printable(p) for p in only)}")
        return store_part(out, store, stage=stage, head=chain.head, reporter=reporter)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def store_part(bundle, store, *, stage: str, head: bytes | None, reporter: Reporter = SILENT) -> StagedPart:
    """Store a packed bundle (over this writer's files) and its part
    manifest under ``store``'s (an open remote's) stage/NAME/, as packed
    against version ``head`` (None: an anchor part, onto a remote with no
    versions yet). The chain is not changed; once this returns, the part is
    durable. For writers that pack themselves (wdiff.live's ranks)."""
    prefix = stage_prefix(stage)
    out = os.fspath(bundle)
    with BundleReader(out) as r:
        ix = r.index
        bundle_id, size = r.id, r.size
    work = tempfile.mkdtemp(prefix=".wdiff-stage-", dir=os.path.dirname(os.path.abspath(out)))
    try:
        bundle_path = f"{prefix}/{hexd(bundle_id)}.wdb"
        manifest = {
            "format": MANIFEST_FORMAT, "version": 1, "stage": stage, "head": hexd(head) if head else None,
            "bundle": hexd(bundle_id), "path": bundle_path, "size": size,
            "digest": hexd(range_digest(out, 0, size)),
            "files": [f.path for f in ix.files], "base_files": [f.path for f in ix.base_files],
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        mpath = os.path.join(work, "part.json")
        atomic_write_bytes(mpath, fmt.canonical_json(manifest) + b"\n")
        have = dict(store.list(prefix))
        uploaded = have.get(bundle_path) != size
        reporter.phase("upload", size)
        store.store([Upload(bundle_path, out, 0, size)], reporter=reporter)  # the bundle first,
        store.store([Upload(f"{prefix}/part-{hexd(bundle_id)}.json", mpath, 0, os.path.getsize(mpath))])  # then its manifest
        reporter.done()
        return StagedPart(store.url, stage, bundle_id, size, len(ix.files), head or b"", uploaded)
    finally:
        shutil.rmtree(work, ignore_errors=True)


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
    push: PushResult
    stage: str
    parts: int

    def to_json(self) -> dict:
        d = self.push.to_json()
        d.pop("anchored", None)
        d.update(schema="wdiff.commit/1", stage=self.stage, merged=self.parts)
        return d


@dataclass(frozen=True)
class _Manifest:
    head: bytes | None
    bundle: bytes
    path: str
    size: int
    digest: bytes
    files: tuple[str, ...]
    base_files: tuple[str, ...]
    created: str


def _manifest(raw: bytes, where: str, prefix: str) -> _Manifest:
    try:
        d = json.loads(raw.decode("utf-8"))
        if not isinstance(d, dict) or d.get("format") != MANIFEST_FORMAT or d.get("version") != 1:
            raise FormatError(f"{where}: not a wdiff part manifest")
        path = d["path"]
        if not isinstance(path, str) or not re.fullmatch(re.escape(prefix) + r"/[0-9a-f]{32}\.wdb", path):
            raise FormatError(f"{where}: part path outside its stage")
        files, base_files = d["files"], d["base_files"]
        if not all(isinstance(x, list) and all(isinstance(p, str) for p in x) for x in (files, base_files)):
            raise FormatError(f"{where}: malformed file lists")
        size = d["size"]
        if type(size) is not int or size < 0:
            raise FormatError(f"{where}: malformed size")
        head = None if d["head"] is None else unhex(d["head"], where=where)  # None: an anchor part (no versions yet)
        return _Manifest(head, unhex(d["bundle"], where=where), path, size,
                         unhex(d["digest"], where=where), tuple(files), tuple(base_files), str(d.get("created", "")))
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError):
        raise FormatError(f"{where}: malformed part manifest") from None


def commit(remote, *, stage: str, expect: int, label: str | None = None, sign_key=None,
           part_size: int = DEFAULT_PART_SIZE, token: str | None = None, threads: int | None = None,
           reporter: Reporter = SILENT) -> CommitResult:
    """Publish the ``expect`` parts staged under ``stage`` as one version:
    checked (count, disjoint files, bases that together are the head, every
    bundle as its manifest says), merged into one bundle and pushed onto the
    head with one conditional chain write; then the stage is deleted."""
    prefix = stage_prefix(stage)
    if expect < 1:
        raise UsageError("--expect must be 1 or more")
    store = open_remote(remote, token=token)
    raw, _ = store.read_chain()
    chain = Chain.decode(raw, where=store.url)
    listing = store.list(prefix)
    with tempfile.TemporaryDirectory(prefix="wdiff-commit-") as work:
        manifests: list[_Manifest] = []
        for path, size in listing:
            if not (path.endswith(".json") and path.rsplit("/", 1)[-1].startswith("part-")):
                continue
            dest = os.path.join(work, "m.json")
            store.fetch(path, dest, max_size=MAX_MANIFEST)
            with open(dest, "rb") as f:
                manifests.append(_manifest(f.read(), f"{store.url}: {path}", prefix))
        # a writer that ran twice (same files) staged the same part twice: the newest counts
        by_files: dict[tuple, _Manifest] = {}
        for m in sorted(manifests, key=lambda m: m.created):
            by_files[(m.files, m.base_files)] = m
        parts = sorted(by_files.values(), key=lambda m: m.files)
        if len(parts) != expect:
            raise NotFoundError(f"{store.url}: stage {stage} holds {len(parts)} part(s), not the {expect} expected",
                                hint="run the missing writers (a rerun of one stores its part again), then commit")
        seen: dict[str, int] = {}
        seen_base: dict[str, int] = {}
        for k, m in enumerate(parts):
            for p in m.files:
                if p in seen:
                    raise BaseMismatchError(f"{store.url}: stage {stage}: {printable(p)} is in two parts",
                                            hint="give each writer --only patterns that do not overlap")
                seen[p] = k
            for p in m.base_files:
                if p in seen_base:
                    raise BaseMismatchError(f"{store.url}: stage {stage}: base file {printable(p)} is in two parts")
                seen_base[p] = k
        bundles = []
        for k, m in enumerate(parts):
            dest = os.path.join(work, f"part{k:05d}.wdb")
            store.fetch(m.path, dest, size=m.size, reporter=reporter)
            if range_digest(dest, 0, m.size) != m.digest:
                raise IntegrityError(f"{store.url}: {m.path} arrived damaged (digest mismatch)", hint="run the commit again")
            bundles.append(dest)
        out = os.path.join(work, "version.wdb")
        merged_id, parent = merge(bundles, out, where=f"{store.url}: stage {stage}")
        if chain.entry(merged_id) is None:
            heads = {m.head for m in parts}
            if heads != {chain.head} or parent != chain.head:
                raise BaseMismatchError(
                    f"{store.url}: stage {stage} was packed against "
                    f"{', '.join(short(h) if h else '(nothing)' for h in sorted(heads, key=lambda h: h or b''))}"
                    + ("" if parent in heads else f" (its bases together are {short(parent) if parent else 'nothing'})")
                    + f", not the head {short(chain.head) if chain.head else '(none)'}",
                    hint="stage again against the head (with a new stage name)")
        res = push_bundle(out, store.url, label=label, part_size=part_size, fork=False, sign_key=sign_key,
                          reporter=reporter, token=token)
    # published (or it was already): the stage has done its work
    store.delete([p for p, _ in store.list(prefix)])
    return CommitResult(res, stage, len(parts))


def merge(bundles: list[str], out: str, *, where: str, level: int = DEFAULT_LEVEL) -> tuple[bytes, bytes | None]:
    """Join bundles over disjoint files into one bundle over all of them: the
    base and target are the unions of theirs, records are copied as they are
    (each re-read and checked against its digest) under the merged file
    numbers. Returns the new bundle's id and base fingerprint."""
    readers = [BundleReader(b) for b in bundles]
    try:
        versions = {r.index.version for r in readers}
        anchors = {r.index.base_fingerprint is None for r in readers}
        if len(anchors) != 1:
            raise BaseMismatchError(f"{where}: some parts are anchors and some are deltas")
        rows = sorted((f.path, k, j) for k, r in enumerate(readers) for j, f in enumerate(r.index.files))
        if len({p for p, _, _ in rows}) != len(rows):
            raise BaseMismatchError(f"{where}: two parts hold the same file")
        base_rows = sorted((b for r in readers for b in r.index.base_files), key=lambda b: b.path)
        if len({b.path for b in base_rows}) != len(base_rows):
            raise BaseMismatchError(f"{where}: two parts hold the same base file")
        new_index = {(k, j): i for i, (_, k, j) in enumerate(rows)}
        by_file: dict[tuple[int, int], list] = {}
        for k, r in enumerate(readers):
            for rec in r.records():
                by_file.setdefault((k, rec.header.file), []).append(rec)
                if rec.header.type == fmt.FILE:
                    r.check_file_payload(rec)
        files = []
        with BundleWriter(out, level=level, version=max(versions)) as w:
            for i, (_, k, j) in enumerate(rows):
                files.append(readers[k].index.files[j])
                fd = readers[k]._f.fileno()
                for rec in by_file.get((k, j), ()):
                    h = rec.header
                    data = os.pread(fd, h.payload_len, rec.offset)
                    hasher = xxhash.xxh3_128()
                    hasher.update(data)
                    if len(data) != h.payload_len or fmt.record_digest(hasher, h) != h.digest:
                        raise IntegrityError(f"{where}: a record changed while it was being copied")
                    a, b = h.lens[0], h.lens[0] + h.lens[1]
                    sections = (data[:a], data[a:b], data[b:]) if h.type != fmt.FILE else (data,)
                    w.add(replace(h, file=new_index[(k, j)]), sections)
            base_fp = None if anchors == {True} else fingerprint((b.path, b.kind, b.size, b.digest) for b in base_rows)
            target_fp = fingerprint((f.path, f.kind, f.size, f.digest) for f in files)
            index = fmt.Index(
                version=max(versions), writer=WRITER, base_fingerprint=base_fp,
                base_files=tuple(base_rows) if base_fp is not None else (), target_fingerprint=target_fp,
                files=tuple(files), records_count=w.count, records_bytes=w.records_bytes,
                records_digest=w.records_digest,
            )
            bundle_id = w.finish(index)
    finally:
        for r in readers:
            r.close()
    with BundleReader(out) as r:  # the merged bundle passes every check a reader makes
        names = {f.path for f in r.index.files}
        for rec in r.records():
            f = r.index.files[rec.header.file]
            if rec.header.type == fmt.FILE and f.path.endswith(".safetensors.index.json") and f.size <= MAX_MANIFEST:
                _check_weight_map(f.path, b"".join(r.file_payload(rec)), names, where)
    return bundle_id, base_fp


def _check_weight_map(path: str, raw: bytes, names: set[str], where: str) -> None:
    """A sharded index the version carries must name only shards it has:
    a writer whose --only missed a new shard is caught here."""
    try:
        wm = json.loads(raw.decode("utf-8")).get("weight_map", {})
        shards = set(wm.values()) if isinstance(wm, dict) else set()
    except (UnicodeDecodeError, ValueError, AttributeError, TypeError):
        return  # not ours to judge: the loadable check of the pushing host applies
    folder = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
    missing = sorted(s for s in shards if isinstance(s, str) and folder + s not in names)
    if missing:
        raise NotFoundError(f"{where}: {printable(path)} names {printable(missing[0])}, which no part holds"
                            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
                            hint="a writer's --only misses that shard: push it with the stage, then commit again")
