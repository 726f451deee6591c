"""The field's delta layout, pinned down (slime and miles write it, SGLang's
``/pull_weights`` and NVIDIA ModelExpress read it). Pure: bytes in, objects
out; every name, number and checksum read here comes from another system
and is checked before anything uses it.

A source holds one directory per version: ``weight_v{N:06d}/`` (SGLang,
slime: contiguous integers, never reused) or, in ModelExpress's object-store
variant, ``{version}/`` with an opaque name. A version is *full* when it has
no ``model.safetensors.index.json``, or one without
``metadata.delta_encoding``: a plain Hugging Face checkpoint directory. A
*delta*'s index::

    {"metadata": {"version": "000004", "base_version": "000003",
                  "delta_encoding": "xor" | "overwrite",
                  "compression_format": "zstd",
                  "checksum_format": "xxh3-128" | "blake3" | "adler32"},
     "weight_map": {"model.layers.0.mlp.up_proj.weight": "model-00000-of-00001.safetensors", ...}}

lists the changed tensors only. Each shard entry is named by the tensor's
name, dtype ``U8``, shape ``[len]``, and holds one zstd frame (content size
written): ``xor`` is the new bytes XOR the old over the whole tensor;
``overwrite`` is a u32le count, that many u32le byte positions, then that
many new bytes. The shard's ``__metadata__`` maps each name to the checksum
of the new tensor's bytes.

What wdiff adds, readers ignore: ``metadata.wdiff_version`` and
``metadata.wdiff_base`` (the fingerprints of the version and its base), and
a ledger ``.wdiff/export.json`` in every version that ``wdiff export``
wrote (which wdiff version it is; the export's record of its numbering).
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass

from ...errors import FormatError, IntegrityError, UsageError
from ...paths import printable
from ...store.hashing import hexd, unhex
from ...store.header import MAX_NAME_BYTES, Header

INDEX = "model.safetensors.index.json"
#: wdiff's own folder inside a version directory (readers of the layout never look there)
LEDGER_DIR = ".wdiff"
LEDGER = f"{LEDGER_DIR}/export.json"
LEDGER_SCHEMA = "wdiff-export/1"
ENCODINGS = ("xor", "overwrite")
CHECKSUMS = ("xxh3-128", "blake3", "adler32")
COMPRESSION = "zstd"
#: overwrite positions are u32: a tensor longer than this cannot be overwritten
MAX_POSITION = 1 << 32
#: bounds of our own on what a hostile source may make us hold
MAX_INDEX_BYTES = 64 * 1024 * 1024
MAX_LEDGER_BYTES = 64 * 1024
MAX_WEIGHT_MAP = 1_000_000
MAX_VERSION_TEXT = 128

_NUMBERED = re.compile(r"weight_v([0-9]{6,9})")
_OPAQUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SHARD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}\.safetensors")
_FORMS = {"xxh3-128": re.compile(r"[0-9a-f]{32}"), "blake3": re.compile(r"[0-9a-f]{64}"),
          "adler32": re.compile(r"[0-9a-f]{8}")}


# -- names -------------------------------------------------------------------------------


def dir_name(n: int) -> str:
    return f"weight_v{n:06d}"


def version_text(n: int) -> str:
    return f"{n:06d}"


def number_of(name: str) -> int | None:
    """N of a ``weight_vN`` directory written as the layout writes it
    (``%06d``: ``weight_v0000001`` is not version 1); None otherwise."""
    m = _NUMBERED.fullmatch(name)
    if m is None or f"{int(m.group(1)):06d}" != m.group(1):
        return None
    return int(m.group(1))


def parse_number(text: str) -> int | None:
    """An integer version as the index metadata or the user spells it."""
    if not isinstance(text, str) or not text.isascii() or not text.isdigit() or len(text) > 9:
        return None
    return int(text)


def opaque_ok(name: str) -> bool:
    """An opaque version name (ModelExpress): one plain path component."""
    return isinstance(name, str) and _OPAQUE.fullmatch(name) is not None and name not in (".", "..")


def shard_name(k: int, total: int) -> str:
    """The name of shard ``k`` (counted from 0, as slime counts its writers) of ``total``."""
    return f"model-{k:05d}-of-{total:05d}.safetensors"


# -- the index of a delta ----------------------------------------------------------------


@dataclass(frozen=True)
class DeltaIndex:
    version: str
    base_version: str
    encoding: str  # one of ENCODINGS
    checksum: str  # one of CHECKSUMS
    weight_map: dict[str, str]  # changed tensor -> shard file name

    def shards(self) -> dict[str, list[str]]:
        """shard -> the tensors the weight map puts there, both sorted."""
        out: dict[str, list[str]] = {}
        for name in sorted(self.weight_map):
            out.setdefault(self.weight_map[name], []).append(name)
        return dict(sorted(out.items()))


def _no_duplicates(pairs):
    d = dict(pairs)
    if len(d) != len(pairs):
        raise ValueError("a key is given twice")
    return d


def load_json(raw: bytes, *, where: str, what: str) -> dict:
    """A JSON object, strictly: UTF-8, no key given twice, bounded nesting."""
    try:
        obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise FormatError(f"{where}: {what} is not valid JSON ({type(e).__name__}: {printable(str(e), 80)})") from None
    if not isinstance(obj, dict):
        raise FormatError(f"{where}: {what} is not a JSON object")
    return obj


def parse_index(raw: bytes, *, where: str) -> DeltaIndex | None:
    """The index of a version: a DeltaIndex, or None when it is the index of
    a full version (no ``metadata.delta_encoding``), which is a plain file."""
    if len(raw) > MAX_INDEX_BYTES:
        raise FormatError(f"{where}: index larger than {MAX_INDEX_BYTES} bytes")
    obj = load_json(raw, where=where, what="the index")
    meta = obj.get("metadata")
    if meta is None or (isinstance(meta, dict) and "delta_encoding" not in meta):
        return None
    if not isinstance(meta, dict):
        raise FormatError(f"{where}: metadata is not a JSON object")

    def text(key: str, *, number_ok: bool = False) -> str:
        v = meta.get(key)
        if number_ok and type(v) is int and 0 <= v < 10**9:
            return str(v)  # a writer that numbers versions as JSON integers
        if not isinstance(v, str) or not v or len(v) > MAX_VERSION_TEXT:
            raise FormatError(f"{where}: metadata.{key} is missing or not a short string")
        return v

    encoding, compression, checksum = text("delta_encoding"), text("compression_format"), text("checksum_format")
    if encoding not in ENCODINGS:
        raise FormatError(f"{where}: delta_encoding {printable(encoding, 40)} is not one of {', '.join(ENCODINGS)}")
    if compression != COMPRESSION:
        raise FormatError(f"{where}: compression_format {printable(compression, 40)} is not {COMPRESSION}")
    if checksum not in CHECKSUMS:
        raise FormatError(f"{where}: checksum_format {printable(checksum, 40)} is not one of {', '.join(CHECKSUMS)}")
    wm = obj.get("weight_map")
    if not isinstance(wm, dict) or len(wm) > MAX_WEIGHT_MAP:
        raise FormatError(f"{where}: weight_map is not an object of at most {MAX_WEIGHT_MAP} tensors")
    for name, shard in wm.items():
        check_tensor_name(name, where=where)
        if not isinstance(shard, str) or not _SHARD.fullmatch(shard):
            raise FormatError(f"{where}: tensor {printable(name, 80)} is mapped to {printable(str(shard), 80)}, "
                              "which is not a shard file name of this version (NAME.safetensors, no folders)")
    return DeltaIndex(text("version", number_ok=True), text("base_version", number_ok=True), encoding, checksum,
                      dict(wm))


def check_tensor_name(name: object, *, where: str) -> str:
    if not isinstance(name, str) or not name or "\x00" in name or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise FormatError(f"{where}: a tensor name is empty, too long or holds a NUL: {printable(str(name), 80)}")
    return name


def encode_index(ix: DeltaIndex, extra: dict[str, str]) -> bytes:
    """The index as wdiff writes it: the layout's metadata first, then
    ``extra`` (keys readers ignore), the weight map in name order."""
    meta = {"version": ix.version, "base_version": ix.base_version, "delta_encoding": ix.encoding,
            "compression_format": COMPRESSION, "checksum_format": ix.checksum, **extra}
    doc = {"metadata": meta, "weight_map": dict(sorted(ix.weight_map.items()))}
    return json.dumps(doc, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"


# -- checksums ---------------------------------------------------------------------------


class _Adler32:
    """zlib's adler32 with a hasher's update / hexdigest (seed 1, as the layout's writers start)."""

    def __init__(self) -> None:
        self.value = 1

    def update(self, data) -> None:
        self.value = zlib.adler32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


def hasher(fmt: str):
    """A new hasher for checksum format ``fmt`` (update, hexdigest)."""
    if fmt == "xxh3-128":
        import xxhash

        return xxhash.xxh3_128()
    if fmt == "adler32":
        return _Adler32()
    if fmt == "blake3":
        try:
            import blake3
        except ImportError:
            raise UsageError("this source's checksums are blake3, and the blake3 package is not installed",
                             hint="pip install blake3 (wdiff reads blake3 checksums when it is importable)") from None
        return blake3.blake3()
    raise FormatError(f"unknown checksum format {printable(fmt, 40)}")


def check_checksum(fmt: str, value: object, *, where: str, name: str) -> str:
    if not isinstance(value, str) or not _FORMS[fmt].fullmatch(value):
        raise FormatError(f"{where}: the checksum of {printable(name, 80)} is not a {fmt} checksum")
    return value


# -- shards ------------------------------------------------------------------------------


def shard_header(entries: list[tuple[str, int]], metadata: dict[str, str]) -> bytes:
    """The safetensors header (length prefix and JSON, padded with spaces to
    8 bytes) of a shard holding ``entries`` ((name, length), in data order)
    as U8 tensors, with ``metadata`` as its ``__metadata__``."""
    import struct

    doc: dict = {"__metadata__": dict(metadata)}
    off = 0
    for name, n in entries:
        doc[name] = {"dtype": "U8", "shape": [n], "data_offsets": [off, off + n]}
        off += n
    js = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js


@dataclass(frozen=True)
class Frame:
    """One entry of a shard: where its zstd frame lies in the shard file,
    and the checksum of the tensor it rebuilds."""

    name: str
    offset: int  # from the start of the shard file
    length: int
    checksum: str


def check_shard(header: Header, names: list[str], checksum: str, *, where: str) -> dict[str, Frame]:
    """The frames of a shard whose weight map entries are ``names``: it must
    hold exactly those tensors (the strictest reader's rule), each U8 of
    shape [len], with a checksum of ``checksum``'s form for each."""
    held = {t.name for t in header.tensors}
    want = set(names)
    if held != want:
        extra, missing = sorted(held - want), sorted(want - held)
        what = (f"holds {len(extra)} tensor(s) the index does not list ({printable(extra[0], 80)}...)" if extra
                else f"lacks {len(missing)} tensor(s) the index puts there ({printable(missing[0], 80)}...)")
        raise IntegrityError(f"{where}: {what}")
    meta = header.metadata or {}
    out = {}
    for t in header.tensors:
        if t.dtype != "U8" or t.shape != (t.nbytes,):
            raise FormatError(f"{where}: tensor {printable(t.name, 80)} is not a U8 tensor of shape [len]")
        value = check_checksum(checksum, meta.get(t.name), where=where, name=t.name)
        out[t.name] = Frame(t.name, header.data_start + t.start, t.nbytes, value)
    return out


def looks_like_delta(headers: list[Header]) -> bool:
    """Whether tensor files are a delta's shards (every tensor U8 of shape
    [len], each with a checksum in the metadata) rather than a checkpoint:
    what a delta folder whose index is missing (or not written yet) looks
    like, which the layout's own rule would take for a full version."""
    tensors = [(h, t) for h in headers for t in h.tensors]
    return bool(tensors) and all(
        t.dtype == "U8" and t.shape == (t.nbytes,)
        and any(f.fullmatch(str((h.metadata or {}).get(t.name.rsplit("/", 1)[-1], ""))) for f in _FORMS.values())
        for h, t in tensors)


# -- the export's ledger -----------------------------------------------------------------


@dataclass(frozen=True)
class Ledger:
    """What ``wdiff export`` records in each version it writes."""

    version: str  # the layout's name of the version ("000004")
    fingerprint: bytes  # the wdiff version it holds
    base: bytes | None  # the wdiff version a delta is against; None: written full

    def encode(self) -> bytes:
        doc = {"schema": LEDGER_SCHEMA, "version": self.version, "fingerprint": hexd(self.fingerprint),
               "base": hexd(self.base) if self.base is not None else None}
        return json.dumps(doc, indent=1).encode("utf-8") + b"\n"

    @classmethod
    def decode(cls, raw: bytes, *, where: str) -> Ledger:
        if len(raw) > MAX_LEDGER_BYTES:
            raise FormatError(f"{where}: larger than any ledger wdiff writes")
        doc = load_json(raw, where=where, what="the export ledger")
        if doc.get("schema") != LEDGER_SCHEMA or set(doc) != {"schema", "version", "fingerprint", "base"}:
            raise FormatError(f"{where}: not a {LEDGER_SCHEMA} ledger")
        version, base = doc["version"], doc["base"]
        if parse_number(version) is None:
            raise FormatError(f"{where}: the version is not a number")
        fp = unhex(doc["fingerprint"], where=where)
        return cls(version, fp, unhex(base, where=where) if base is not None else None)
