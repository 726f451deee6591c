"""``info``: describe a bundle, verifying every digest in it."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..codec.chunk import CODEC_NAMES
from ..codec.filedelta import CODEC_NAMES as FILE_CODEC_NAMES
from ..format import records as fmt
from ..format.bundle import BundleReader, decode_header_record
from ..paths import PathLike
from ..store.hashing import hexd

SCHEMA = "wdiff.info/1"


@dataclass(frozen=True)
class BundleInfo:
    """What :func:`inspect` read in a bundle: its fingerprints, files and records."""

    path: str
    bundle_id: bytes
    version: int
    writer: str
    bundle_bytes: int
    base_fingerprint: bytes | None
    target_fingerprint: bytes
    target_bytes: int
    files: tuple[dict, ...]
    records: dict[str, dict]  # kind -> {records, bytes, changed}

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "bundle": self.path,
            "bundle_id": hexd(self.bundle_id),
            "format_version": self.version,
            "writer": self.writer,
            "bundle_bytes": self.bundle_bytes,
            "base_fingerprint": hexd(self.base_fingerprint) if self.base_fingerprint else None,
            "target_fingerprint": hexd(self.target_fingerprint),
            "target_bytes": self.target_bytes,
            "files": list(self.files),
            "records": self.records,
            "verified": True,
        }


def inspect(bundle: PathLike) -> BundleInfo:
    """Describe ``bundle`` (base, target, files, records per codec) after
    reading it whole and checking every digest in it."""
    with BundleReader(os.fspath(bundle)) as r:
        ix = r.index
        records: dict[str, dict] = {}
        for rec in r.records():
            h = rec.header
            if h.type == fmt.FILE:
                r.check_file_payload(rec)
                kind = "file"
            elif h.type == fmt.HEADER:
                decode_header_record(rec, where=f"{r.path}: record {rec.index}")
                kind = "header"
            elif h.type == fmt.DELTA:  # a range of a companion file (version 3)
                kind = FILE_CODEC_NAMES.get(h.codec, f"file-codec-{h.codec}")
            else:
                kind = CODEC_NAMES.get(h.codec, f"codec-{h.codec}")
            c = records.setdefault(kind, {"records": 0, "bytes": 0, "changed": 0})
            c["records"] += 1
            c["bytes"] += fmt.RECORD.size + h.payload_len
            c["changed"] += h.count
        files = tuple(
            {"path": f.path, "kind": f.kind, "size": f.size, "source": f.source, "digest": hexd(f.digest)} for f in ix.files
        )
        return BundleInfo(
            path=r.path, bundle_id=r.id, version=ix.version, writer=ix.writer, bundle_bytes=r.size,
            base_fingerprint=ix.base_fingerprint, target_fingerprint=ix.target_fingerprint,
            target_bytes=sum(f.size for f in ix.files), files=files, records=dict(sorted(records.items())),
        )
