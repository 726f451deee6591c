"""The bundle format, version 1: constants, the binary record header, the
footer, and the JSON index. Deterministic encoders, strict decoders, no I/O.

Layout (all integers little-endian; man/wdiff-format.5 is the normative spec):

    preamble   16 bytes   MAGIC, u32 version, u32 flags (0)
    records    ...        record header (112 bytes) + payload, repeated
    index      ...        zstd frame of canonical JSON
    footer     48 bytes   u64 index offset, u64 index length, u64 index raw
                          length, 16-byte index digest, END_MAGIC
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from functools import cached_property

import xxhash

from ..errors import FormatError
from ..paths import MAX_DEPTH, printable, validate_relpath
from ..store.hashing import BLOCK_SIZE, DIGEST_SIZE, fingerprint, hexd, tensor_file_digest, unhex
from ..store.header import MAX_TENSORS
from .versions import CODEC_V2, FILE_DELTAS, MAX_VERSION, SCOPED_NAMES, VERSION

MAGIC = b"\x89WDIFF\r\n"
END_MAGIC = b"WDIFFEND"
FORMAT_NAME = "wdiff-bundle"

PREAMBLE = struct.Struct("<8sII")
FOOTER = struct.Struct("<QQQ16s8s")
RECORD = struct.Struct("<4sBBBBIIQQQQQQ16s16s16s")
RECORD_MAGIC = b"WREC"
assert PREAMBLE.size == 16 and FOOTER.size == 48 and RECORD.size == 112

# record types
CHUNK, FILE, HEADER = 1, 2, 3
#: a byte range of a companion file, rebuilt from the base's file (version 3)
DELTA = 4
RECORD_TYPES = {CHUNK: "chunk", FILE: "file", HEADER: "header", DELTA: "delta"}

#: an index lists every target tensor's digest (~35 bytes of JSON each), so a
#: checkpoint of ~900,000 tensors fits; with the element count checked
#: before parsing, a hostile index cannot make json.loads build more than
#: about 150 MB of objects
#: the uncompressed index, and the ',' and ':' bytes in it (counted before
#: parsing, strings included): together they bound what parsing it holds,
#: about 250 MB at worst; 100,000 files with a base need about 1,400,000
MAX_INDEX_BYTES = 64 * 1024 * 1024
MAX_INDEX_ELEMENTS = 2_000_000
#: a CHUNK record covers at most this many bytes (bounds every buffer)
MAX_CHUNK_BYTES = 64 * 1024 * 1024
MAX_FILES = 100_000
MAX_SIZE = 1 << 62  # no file or offset is ever larger


@dataclass(frozen=True, slots=True)
class RecordHeader:
    type: int
    codec: int
    word: int
    param: int
    file: int  # index into Index.files
    lo: int  # CHUNK: byte range in the file's data region; FILE/HEADER: 0, size
    hi: int
    count: int  # changed words (delta codecs)
    lens: tuple[int, int, int]  # payload section lengths
    base: bytes  # CHUNK delta: digest of the base bytes it changes; else zeros
    target: bytes  # digest of the bytes the record produces
    digest: bytes = b"\0" * DIGEST_SIZE  # xxh3-128(payload || header[0:96])

    @property
    def payload_len(self) -> int:
        return sum(self.lens)

    def fields(self) -> bytes:
        """The first 96 bytes: everything but the digest."""
        return RECORD.pack(
            RECORD_MAGIC, self.type, self.codec, self.word, self.param, self.file, 0,
            self.lo, self.hi, self.count, *self.lens, self.base, self.target, b"\0" * 16,
        )[:96]

    def pack(self) -> bytes:
        return self.fields() + self.digest


def unpack_record(raw: bytes, *, where: str) -> RecordHeader:
    if len(raw) != RECORD.size:
        raise FormatError(f"{where}: truncated record header")
    magic, typ, codec, word, param, file, reserved, lo, hi, count, l0, l1, l2, base, target, digest = (
        RECORD.unpack(raw)
    )
    if magic != RECORD_MAGIC:
        raise FormatError(f"{where}: record header is damaged (bad record magic)")
    if typ not in RECORD_TYPES or reserved != 0 or word not in (1, 2, 4, 8):
        raise FormatError(f"{where}: record header is damaged (bad type, word or reserved field)")
    if not 0 <= lo <= hi <= MAX_SIZE or max(l0, l1, l2, count) > MAX_SIZE:
        raise FormatError(f"{where}: record header has out-of-range sizes")
    return RecordHeader(typ, codec, word, param, file, lo, hi, count, (l0, l1, l2), base, target, digest)


def record_digest(payload_digest_state: xxhash.xxh3_128, header: RecordHeader) -> bytes:
    payload_digest_state.update(header.fields())
    return payload_digest_state.digest()


def pack_preamble(version: int = VERSION) -> bytes:
    assert VERSION <= version <= MAX_VERSION
    return PREAMBLE.pack(MAGIC, version, 0)


def check_preamble(raw: bytes, *, where: str) -> int:
    """Check the preamble; return the bundle's format version."""
    if len(raw) < PREAMBLE.size or raw[:8] != MAGIC:
        raise FormatError(f"{where}: not a wdiff bundle (bad magic)")
    _, version, flags = PREAMBLE.unpack(raw[: PREAMBLE.size])
    if not VERSION <= version <= MAX_VERSION:
        raise FormatError(
            f"{where}: bundle format version {version} is not supported (this wdiff reads {VERSION} to {MAX_VERSION})",
            hint="upgrade wdiff" if version > MAX_VERSION else None,
        )
    if flags != 0:
        raise FormatError(f"{where}: bundle uses features this wdiff does not know (flags {flags:#x})")
    return version


@dataclass(frozen=True, slots=True)
class Footer:
    index_offset: int
    index_len: int
    index_raw_len: int
    index_digest: bytes

    def pack(self) -> bytes:
        return FOOTER.pack(self.index_offset, self.index_len, self.index_raw_len, self.index_digest, END_MAGIC)


def unpack_footer(raw: bytes, bundle_size: int, *, where: str) -> Footer:
    if len(raw) != FOOTER.size:
        raise FormatError(f"{where}: truncated bundle (no footer)")
    off, n, raw_len, digest, end = FOOTER.unpack(raw)
    if end != END_MAGIC:
        raise FormatError(f"{where}: truncated or damaged bundle (bad end magic)")
    if off < PREAMBLE.size or off + n != bundle_size - FOOTER.size or raw_len > MAX_INDEX_BYTES or n > MAX_INDEX_BYTES:
        raise FormatError(f"{where}: damaged bundle footer")
    return Footer(off, n, raw_len, digest)


# -- the index -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileRow:
    """A file of the base: enough to check and explain a base mismatch."""

    path: str
    kind: str
    size: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class TargetFile:
    path: str
    kind: str  # "safetensors" or "file"
    size: int
    digest: bytes
    #: companion file: "base" (same path and digest in the base), "bundle"
    #: (one FILE record) or "delta" (the base's file at the same path, with
    #: DELTA records over the ranges that changed; version 3);
    #: tensor file: where its header comes from, "base" or "bundle"
    source: str
    header_digest: bytes | None = None
    header_size: int = 0  # tensor files: bytes before the data region
    tensor_digests: tuple[bytes, ...] = ()

    @property
    def data_len(self) -> int:
        return self.size - self.header_size


@dataclass(frozen=True)
class Index:
    writer: str
    base_fingerprint: bytes | None  # None: the bundle builds from nothing
    base_files: tuple[FileRow, ...]
    target_fingerprint: bytes
    files: tuple[TargetFile, ...]
    records_count: int
    records_bytes: int
    records_digest: bytes
    version: int = VERSION
    block_size: int = BLOCK_SIZE

    @cached_property
    def base_size_of(self) -> dict[str, int]:
        """The size of each of the base's files, by path (the first row of
        a path): a DELTA record's check looks its file up, once per record,
        and a listing may hold 100,000 rows."""
        out: dict[str, int] = {}
        for r in self.base_files:
            out.setdefault(r.path, r.size)
        return out

    def to_json(self) -> dict:
        def target(f: TargetFile) -> dict:
            d = {"path": f.path, "kind": f.kind, "size": f.size, "digest": hexd(f.digest), "source": f.source}
            if f.kind == "safetensors":
                d["header_digest"] = hexd(f.header_digest)
                d["header_size"] = f.header_size
                d["tensors"] = [hexd(t) for t in f.tensor_digests]
            return d

        return {
            "format": FORMAT_NAME,
            "version": self.version,
            "writer": self.writer,
            "block_size": self.block_size,
            "base": None
            if self.base_fingerprint is None
            else {
                "fingerprint": hexd(self.base_fingerprint),
                "files": [[r.path, r.kind, r.size, hexd(r.digest)] for r in self.base_files],
            },
            "target": {"fingerprint": hexd(self.target_fingerprint), "files": [target(f) for f in self.files]},
            "records": {"count": self.records_count, "bytes": self.records_bytes, "digest": hexd(self.records_digest)},
        }

    def encode(self) -> bytes:
        return canonical_json(self.to_json())


def canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


_TOP_KEYS = {"format", "version", "writer", "block_size", "base", "target", "records"}
_FILE_KEYS = {"path", "kind", "size", "digest", "source"}
_TENSOR_FILE_KEYS = _FILE_KEYS | {"header_digest", "header_size", "tensors"}


def _keys(d: object, want: set[str], where: str) -> dict:
    if not isinstance(d, dict) or set(d) != want:
        raise FormatError(f"{where}: index object has missing or unknown members")
    return d


def _get(d: dict, key: str, typ, where: str):
    v = d[key]
    if typ is int:
        if type(v) is not int or not 0 <= v <= MAX_SIZE:
            raise FormatError(f"{where}: index field {key!r} is not a valid size")
    elif type(v) is not typ:
        raise FormatError(f"{where}: index field {key!r} has the wrong type")
    return v


def _kind(v: object, where: str) -> str:
    if v not in ("safetensors", "file"):
        raise FormatError(f"{where}: unknown file kind")
    return v  # type: ignore[return-value]


def _check_paths(paths: list[str], where: str) -> None:
    for p in paths:
        validate_relpath(p, where=where)
        if p.count("/") > MAX_DEPTH:  # no scan would accept such a tree: nor may a reader write one
            raise FormatError(f"{where}: {printable(p)} lies more than {MAX_DEPTH} directories deep")
    encoded = [p.encode("utf-8") for p in paths]
    if any(a >= b for a, b in zip(encoded, encoded[1:])):
        raise FormatError(f"{where}: file list is not sorted or has duplicates")
    names = set(paths)
    for p in paths:
        parts = p.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in names:
                raise FormatError(f"{where}: {printable(p)} lies inside {printable('/'.join(parts[:i]))}, which is a file")


# Longer than most functions, on purpose: one pass over the index, member by
# member in the order of the format spec, each check beside the member it guards.
def decode_index(raw: bytes, *, where: str) -> Index:
    """Parse and cross-check an index. It must be canonical JSON with exactly
    the members this version defines; every digest that can be derived from
    others is recomputed, so a self-inconsistent index is refused here."""
    if raw.count(b",") + raw.count(b":") > MAX_INDEX_ELEMENTS:
        raise FormatError(f"{where}: index has more entries than this wdiff accepts")
    try:
        obj = json.loads(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise FormatError(f"{where}: index is not valid JSON") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
        raise FormatError(f"{where}: not a wdiff bundle index")
    if type(obj.get("version")) is not int or not VERSION <= obj["version"] <= MAX_VERSION:
        raise FormatError(f"{where}: index version {obj.get('version')!r} is not supported")
    try:
        canonical = canonical_json(obj)
    except ValueError:
        canonical = None
    if canonical != raw:
        raise FormatError(f"{where}: index is not in canonical form")
    _keys(obj, _TOP_KEYS, where)
    if type(obj["block_size"]) is not int or obj["block_size"] != BLOCK_SIZE:
        raise FormatError(f"{where}: unsupported block size")
    writer = _get(obj, "writer", str, where)
    base = obj["base"]
    base_fp, base_files = None, ()
    if base is not None:
        _keys(base, {"fingerprint", "files"}, where)
        base_fp = unhex(_get(base, "fingerprint", str, where), where=where)
        rows = _get(base, "files", list, where)
        if len(rows) > MAX_FILES:
            raise FormatError(f"{where}: too many base files")
        out = []
        for r in rows:
            if (
                type(r) is not list or len(r) != 4 or type(r[0]) is not str
                or type(r[2]) is not int or not 0 <= r[2] <= MAX_SIZE
            ):
                raise FormatError(f"{where}: malformed base file row")
            out.append(FileRow(r[0], _kind(r[1], where), r[2], unhex(r[3], where=where)))
        _check_paths([r.path for r in out], where)
        base_files = tuple(out)
        if fingerprint((r.path, r.kind, r.size, r.digest) for r in base_files) != base_fp:
            raise FormatError(f"{where}: base fingerprint does not match its file list")
    target = _keys(obj["target"], {"fingerprint", "files"}, where)
    target_fp = unhex(_get(target, "fingerprint", str, where), where=where)
    rows = _get(target, "files", list, where)
    if len(rows) > MAX_FILES:
        raise FormatError(f"{where}: too many target files")
    files = tuple(_target_file(r, where) for r in rows)
    _check_paths([f.path for f in files], where)
    if fingerprint((f.path, f.kind, f.size, f.digest) for f in files) != target_fp:
        raise FormatError(f"{where}: target fingerprint does not match its file list")
    if base is None and any(f.source in ("base", "delta") for f in files):
        raise FormatError(f"{where}: a bundle without a base takes a file from the base")
    _check_taken_from_base(files, base_files, where)
    _check_deltas(obj["version"], files, base_files, where)
    rec = _keys(obj["records"], {"count", "bytes", "digest"}, where)
    return Index(
        version=obj["version"],
        writer=writer,
        base_fingerprint=base_fp,
        base_files=base_files,
        target_fingerprint=target_fp,
        files=files,
        records_count=_get(rec, "count", int, where),
        records_bytes=_get(rec, "bytes", int, where),
        records_digest=unhex(_get(rec, "digest", str, where), where=where),
    )


def _check_taken_from_base(files, base_files, where: str) -> None:
    """A target file the index takes unchanged from the base ("source":
    "base") must be one the base lists, of the same kind; a companion file
    must have the base's size and digest too. Otherwise the target
    fingerprint commits to a file no apply can build (a size that no file
    with that digest has), and a reader that trusted the base's copy would
    report a target it did not write. (A tensor file's header comes from the
    base and is checked against it by the reader; its size may differ.)"""
    rows = {r.path: r for r in base_files}
    for f in files:
        if f.source != "base":
            continue
        r = rows.get(f.path)
        if r is None or r.kind != f.kind:
            raise FormatError(f"{where}: {printable(f.path)} is taken from the base, which does not list it")
        if f.kind == "file" and (r.size != f.size or r.digest != f.digest):
            raise FormatError(
                f"{where}: {printable(f.path)} is taken unchanged from the base but its size or digest "
                f"differs from the base's ({f.size} bytes against {r.size})"
            )


def _check_deltas(version: int, files, base_files, where: str) -> None:
    """A companion file rebuilt by DELTA records (source "delta", version 3
    on) needs a companion file at the same path in the base: that file is
    the base of its records and the source of the bytes between them."""
    rows = {r.path: r for r in base_files}
    for f in files:
        if f.source != "delta":
            continue
        if version < FILE_DELTAS or f.kind != "file":
            raise FormatError(f"{where}: {printable(f.path)} has source \"delta\", which this version or kind lacks")
        r = rows.get(f.path)
        if r is None or r.kind != "file":
            raise FormatError(f"{where}: {printable(f.path)} is rebuilt from the base's file, which the base lacks")


def _target_file(d: object, where: str) -> TargetFile:
    if not isinstance(d, dict):
        raise FormatError(f"{where}: malformed target file entry")
    kind = _kind(d.get("kind"), where)
    _keys(d, _TENSOR_FILE_KEYS if kind == "safetensors" else _FILE_KEYS, where)
    path = _get(d, "path", str, where)
    size = _get(d, "size", int, where)
    digest = unhex(_get(d, "digest", str, where), where=where)
    source = _get(d, "source", str, where)
    if source not in ("base", "bundle", "delta") or (source == "delta" and kind != "file"):
        raise FormatError(f"{where}: unknown source {source!r}")
    if kind == "file":
        return TargetFile(path, kind, size, digest, source)
    if not path.endswith(".safetensors"):
        raise FormatError(f"{where}: tensor file {printable(path)} is not named *.safetensors")
    header_digest = unhex(_get(d, "header_digest", str, where), where=where)
    header_size = _get(d, "header_size", int, where)
    if not 10 <= header_size <= size:
        raise FormatError(f"{where}: header size of {printable(path)} is out of range")
    tensors = _get(d, "tensors", list, where)
    if len(tensors) > MAX_TENSORS:
        raise FormatError(f"{where}: too many tensors in {printable(path)}")
    digests = tuple(unhex(t, where=where) for t in tensors)
    if tensor_file_digest(header_digest, list(digests)) != digest:
        raise FormatError(f"{where}: digest of {printable(path)} does not match its tensors")
    return TargetFile(path, kind, size, digest, source, header_digest, header_size, digests)


__all__ = [
    "BLOCK_SIZE", "CHUNK", "DIGEST_SIZE", "FILE", "FOOTER", "HEADER", "Index", "MAGIC", "PREAMBLE",
    "RECORD", "RecordHeader", "TargetFile", "FileRow", "VERSION", "MAX_VERSION", "SCOPED_NAMES", "CODEC_V2",
    "DELTA", "FILE_DELTAS",
]
