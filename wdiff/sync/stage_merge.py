"""The pieces of a many-writer commit that work on local files only: a
staged part's manifest (what it is, what it says), the checks that the
parts fit together as one version, and the merge of their bundles into the
bundle a single host would pack (see sync/stage.py for the remote side)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace

import xxhash

from ..defaults import DEFAULT_LEVEL
from ..errors import BaseMismatchError, FormatError, IntegrityError, NotFoundError
from ..format import records as fmt
from ..format.bundle import BundleReader, BundleWriter
from ..ops.pack import WRITER
from ..paths import printable
from ..store.checkpoint import bare_name
from ..store.hashing import fingerprint, hexd, short, unhex

MANIFEST_FORMAT = "wdiff-stage-part"
#: version 2 names the remote and the tensors a part's base holds and those
#: it packed with no base; version 1 parts (of wdiff before it) are refused
MANIFEST_VERSION = 2
MAX_MANIFEST = 16 * 1024 * 1024
#: a staged object's name: its bundle (I.wdb), its manifest, the manifest's signature
PART_NAME = re.compile(r"part-([0-9a-f]{32})\.json")


def part_comment(stage: str, remote: str | None, head: bytes | None, bundle: bytes) -> str:
    """The trusted comment of a part manifest's signature: which remote,
    which stage, which head and which bundle the writer vouches for."""
    return (f"wdiff part/1 remote {remote or 'none'} stage {stage} head {hexd(head) if head else 'none'} "
            f"bundle {hexd(bundle)}")


@dataclass(frozen=True)
class Tensor:
    """A tensor a part's manifest names: qualified name, dtype, shape and file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str


@dataclass(frozen=True)
class Manifest:
    stage: str
    remote: str | None  # the remote's identity (its chain's lineage), None on a chain without one
    head: bytes | None  # None: an anchor part (no versions yet)
    bundle: bytes
    path: str
    size: int
    digest: bytes
    files: tuple[str, ...]
    base_files: tuple[str, ...]
    #: the tensors of the part's base files, and its target tensors that
    #: have no base there (None: not said, as by a live rank's part)
    base_tensors: tuple[Tensor, ...] | None
    new_tensors: tuple[Tensor, ...] | None
    #: the qualified names of the tensors of each target tensor file
    target_tensors: tuple[tuple[str, str], ...] | None = None
    where: str = ""


def encode_manifest(*, stage: str, remote: str | None, head: bytes | None, bundle: bytes, path: str, size: int,
                    digest: bytes, files, base_files, base_tensors=None, new_tensors=None,
                    target_tensors=None) -> bytes:
    """The manifest's bytes: canonical JSON, the same for the same part (a
    rerun of a writer stores the same object again)."""
    d = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "stage": stage, "remote": remote,
         "head": hexd(head) if head else None, "bundle": hexd(bundle), "path": path, "size": size,
         "digest": hexd(digest), "files": list(files), "base_files": list(base_files)}
    if base_tensors is not None:
        d["base_tensors"] = _tensor_map(base_tensors)
        d["new_tensors"] = _tensor_map(new_tensors or ())
        names: dict[str, list] = {}
        for file, name in target_tensors or ():
            names.setdefault(file, []).append(name)
        d["target_tensors"] = names
    return fmt.canonical_json(d) + b"\n"


def _tensor_map(tensors) -> dict:
    out: dict[str, list] = {}
    for t in tensors:
        out.setdefault(t.file, []).append([t.name, t.dtype, list(t.shape)])
    return out


def _tensors(d, where: str) -> tuple[Tensor, ...]:
    if not isinstance(d, dict):
        raise FormatError(f"{where}: malformed tensor lists")
    out = []
    for file, rows in d.items():
        if not isinstance(rows, list):
            raise FormatError(f"{where}: malformed tensor lists")
        for row in rows:
            if not (isinstance(row, list) and len(row) == 3 and isinstance(row[0], str) and isinstance(row[1], str)
                    and isinstance(row[2], list) and all(type(x) is int and x >= 0 for x in row[2])):
                raise FormatError(f"{where}: malformed tensor lists")
            out.append(Tensor(row[0], row[1], tuple(row[2]), file))
    return tuple(out)


def _names(d, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(d, dict) or not all(isinstance(v, list) and all(isinstance(n, str) for n in v)
                                          for v in d.values()):
        raise FormatError(f"{where}: malformed tensor lists")
    return tuple((file, n) for file, names in d.items() for n in names)


def parse_manifest(raw: bytes, where: str, prefix: str) -> Manifest:
    """A part manifest, checked for form only (what it says is checked by the commit)."""
    try:
        d = json.loads(raw.decode("utf-8"))
        if not isinstance(d, dict) or d.get("format") != MANIFEST_FORMAT:
            raise FormatError(f"{where}: not a wdiff part manifest")
        if d.get("version") != MANIFEST_VERSION:
            raise FormatError(f"{where}: a part manifest of version {printable(str(d.get('version')))}, not "
                              f"{MANIFEST_VERSION}", hint="stage the part again with this wdiff (a new stage name)")
        path = d["path"]
        if not isinstance(path, str) or not re.fullmatch(re.escape(prefix) + r"/[0-9a-f]{32}\.wdb", path):
            raise FormatError(f"{where}: part path outside its stage")
        files, base_files = d["files"], d["base_files"]
        if not all(isinstance(x, list) and all(isinstance(p, str) for p in x) for x in (files, base_files)):
            raise FormatError(f"{where}: malformed file lists")
        size = d["size"]
        if type(size) is not int or size < 0:
            raise FormatError(f"{where}: malformed size")
        stage, remote = d["stage"], d["remote"]
        if not isinstance(stage, str) or not (remote is None or isinstance(remote, str)):
            raise FormatError(f"{where}: malformed stage or remote")
        head = None if d["head"] is None else unhex(d["head"], where=where)  # None: an anchor part (no versions yet)
        said = "base_tensors" in d
        return Manifest(stage, remote, head, unhex(d["bundle"], where=where), path, size, unhex(d["digest"], where=where),
                        tuple(files), tuple(base_files), _tensors(d["base_tensors"], where) if said else None,
                        _tensors(d["new_tensors"], where) if said else None,
                        _names(d["target_tensors"], where) if said else None, where)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError):
        raise FormatError(f"{where}: malformed part manifest") from None


def check_parts(parts: list[Manifest], *, where: str, stage: str, remote: str | None) -> None:
    """Refuse parts that are not of this stage and remote, two parts that
    hold one file (never resolved by which is newer), and a target tensor a
    part packed whole although another part's base holds it (a tensor that
    moved between files: its writer lacked the base file, so its record is
    not the one a single host would write)."""
    for m in parts:
        if m.stage != stage or (remote is not None and m.remote != remote):
            raise IntegrityError(f"{m.where}: a part of stage {printable(m.stage)} of remote "
                                 f"{printable(str(m.remote))}, not of stage {stage} of this remote (replayed?)",
                                 hint="delete the stage and stage every part again")
    seen: dict[str, Manifest] = {}
    for m in parts:
        for p in m.files:
            if p in seen:
                raise BaseMismatchError(f"{where}: {printable(p)} is in two parts ({seen[p].path} and {m.path})",
                                        hint="give each writer --only patterns that do not overlap; a writer that "
                                        "staged twice with other bytes: delete the stage and stage again")
            seen[p] = m
    held: dict[str, Tensor] = {}
    for m in parts:
        for t in m.base_tensors or ():
            held.setdefault(t.name, t)
    for m in parts:
        for t in m.new_tensors or ():
            h = held.get(t.name)
            if h is not None and (h.dtype, h.shape) == (t.dtype, t.shape):
                raise BaseMismatchError(
                    f"{where}: tensor {printable(t.name)} of {printable(t.file)} has its base in {printable(h.file)}, "
                    f"which the writer of {printable(t.file)} did not have, so it was packed whole",
                    hint=f"give that writer {printable(h.file)} in its --base directory, then stage again")


def needed_version(parts: list[Manifest]) -> int:
    """The lowest bundle format version whose base rules the whole version
    needs (as pack's format_version decides it from both checkpoints): a
    part sees only its own files, so two models' tensors of one bare name
    held by two writers, or a tensor moved between directories, show only
    here. Parts that do not list their tensors (a live rank's) add nothing."""
    said = [m for m in parts if m.base_tensors is not None]
    base = {(t.file, t.name): t for m in said for t in m.base_tensors}.values()
    targets = {(f, n) for m in said for f, n in m.target_tensors or ()}
    for names in ([bare_name(t.file, t.name) for t in base], [bare_name(f, n) for f, n in targets]):
        if len(set(names)) != len(names):
            return fmt.SCOPED_NAMES
    by_bare = {bare_name(t.file, t.name): t for t in base}
    for m in said:
        for t in m.new_tensors or ():
            h = by_bare.get(bare_name(t.file, t.name))
            if h is not None and (h.dtype, h.shape) == (t.dtype, t.shape):
                return fmt.SCOPED_NAMES  # version 1 would find it a base in another directory
    return fmt.VERSION


def check_heads(parts: list[Manifest], *, head: bytes | None) -> None:
    """Every part was packed against ``head``, the chain's head."""
    for m in parts:
        if m.head != head:
            raise BaseMismatchError(f"{m.where}: packed against {short(m.head) if m.head else '(nothing)'}, not the "
                                    f"head {short(head) if head else '(none)'}",
                                    hint="stage again against the head (with a new stage name)")


def merge(bundles: list[str], out: str, *, where: str, level: int = DEFAULT_LEVEL,
          version: int = fmt.VERSION) -> tuple[bytes, bytes | None]:
    """Join bundles over disjoint target files into one bundle over all of
    them: the target is the union of theirs, the base the union of theirs
    (a base file two parts hold must be the same in both), records are
    copied as they are (each re-read and checked against its digest) under
    the merged file numbers; the bundle's format version is the highest of
    theirs and ``version``. Returns the new bundle's id and base fingerprint."""
    readers = [BundleReader(b) for b in bundles]
    try:
        versions = {r.index.version for r in readers} | {version}
        anchors = {r.index.base_fingerprint is None for r in readers}
        if len(anchors) != 1:
            raise BaseMismatchError(f"{where}: some parts are anchors and some are deltas")
        rows = sorted((f.path, k, j) for k, r in enumerate(readers) for j, f in enumerate(r.index.files))
        if len({p for p, _, _ in rows}) != len(rows):
            raise BaseMismatchError(f"{where}: two parts hold the same file")
        held: dict[str, fmt.FileRow] = {}
        for r in readers:
            for b in r.index.base_files:
                if held.setdefault(b.path, b) != b:
                    raise BaseMismatchError(f"{where}: two parts hold different base files {printable(b.path)}")
        base_rows = sorted(held.values(), key=lambda b: b.path)
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
