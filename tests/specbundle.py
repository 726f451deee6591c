"""An independent reader and writer of the wdiff bundle format, version 1.

Written from man/wdiff-format.5 alone: nothing here imports wdiff, and no
rule is taken from wdiff's code. It holds

* the digests (H, BD, D, tensor-file digest, fingerprint), a strict
  safetensors parser and a checkpoint scanner, as the spec defines them;
* :func:`parse` and :func:`serialize`: a bundle as Python objects
  (:class:`Bundle`, :class:`Rec`, the index as a plain dict) and back to
  bytes with every digest recomputed: record digests, records.count/bytes,
  the chain digest, the index's tensor-file digests and fingerprints
  (:func:`refresh_index`), the index digest and the footer, as an attacker
  who controls a bundle would;
* the codecs (byte planes, Rice, bitmap) both ways;
* :func:`read`: a reference reader that applies a bundle to a base the way
  READING A BUNDLE says, refusing (:class:`SpecError`) wherever the spec says
  MUST refuse, and returns the target files;
* :func:`pack`: a reference writer that makes valid bundles with choices
  wdiff's own writer never makes (any codec that fits, any Rice parameter,
  chunks of several tensors, block-aligned pieces, gaps, sources "bundle"
  where "base" would do), so that wdiff's reader is tested on the format,
  not on its own output.

Where the spec is silent or ambiguous this module says so in a comment that
starts with ``SPEC:``. What writing it found (see also test_semantic_fuzz.py);
the spec's version 2.1 (CHANGES) settles the first four: step 7 now refuses
such a companion file, paths are limited to 33 components, the exit-status
guidance says 4 for a bundle inconsistent with its own base, and LIMITS
gives wdiff's index limits (this reader checks the 64 MiB one):

* READING A BUNDLE never asks a reader to check that a companion ("file")
  entry whose path ends in .safetensors does not hold a strict tensor file,
  although "every implementation MUST classify files exactly as described";
  a reader that follows the steps (this one, and wdiff) builds a checkpoint
  whose fingerprint is not target.fingerprint. Step 7 should say: a
  companion file at a *.safetensors path MUST NOT pass the strict rules.
* The index checks bound paths but not their depth, while a checkpoint
  deeper than 32 levels is refused: a bundle can state a target that is no
  checkpoint. Likewise the file-count and tensor-name rules of CHECKPOINTS
  are checked for headers but not for what the FILE records contain.
* The spec does not say which status (4 or 5) a reader gives a bundle whose
  base fingerprint matches but which is inconsistent about its base (a
  source "base" the base lacks, a wrong CHUNK base digest); wdiff gives 5,
  "made for another base", which it is not.
* LIMITS: index, uncompressed, 512 MiB; wdiff refuses an index above 64 MiB
  ("damaged bundle footer") and one with more than 1,000,000 "," and ":".
* The spec says nothing on zstd window sizes; RFC 8878 lets a decoder refuse
  large ones. wdiff accepts a window of 2^31 (the output is bounded by the
  declared size); python-zstandard's decompressobj refuses above 2^27.
* The payload bound 2(hi - lo) + 65536 makes some SPARSE encodings that the
  codec rules allow (large r, many positions) invalid; a writer must check.
"""

from __future__ import annotations

import json
import os
import random
import stat
import struct
import unicodedata
from dataclasses import dataclass, replace

import numpy as np
import xxhash
import zstandard

B = 1 << 20
MAGIC = b"\x89WDIFF\r\n"
END_MAGIC = b"WDIFFEND"
REC_MAGIC = b"WREC"
PREAMBLE = struct.Struct("<8sII")
FOOTER = struct.Struct("<QQQ16s8s")
REC = struct.Struct("<4sBBBBIIQQQQQQ16s16s16s")
assert PREAMBLE.size == 16 and FOOTER.size == 48 and REC.size == 112

CHUNK, FILE, HEADER = 1, 2, 3
RAW, SPARSE, BITMAP, DENSE, ZSTD = 0, 1, 2, 3, 4
ZERO = bytes(16)
LIMIT = 1 << 62
MAX_CHUNK_BYTES = 64 << 20
MAX_INDEX_RAW = 64 << 20  # spec 2.1 (was 512 MiB)
MAX_HEADER_HI = (64 << 20) + 8
MAX_FILES = 100000
MAX_TENSORS = 200000
MAX_RICE = 40
TENSOR_PREFIX = b"wdiff-safetensors\x00"
CKPT_PREFIX = b"wdiff-checkpoint\x00"
IGNORED_TOP = (".wdiff", ".git", ".cache")

#: dtype -> (bits per element, word size), ELEMENT WORDS
DTYPES = {
    **{d: (8, 1) for d in ("BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0")},
    **{d: (16, 2) for d in ("I16", "U16", "F16", "BF16")},
    **{d: (32, 4) for d in ("I32", "U32", "F32")},
    **{d: (64, 8) for d in ("I64", "U64", "F64")},
    "C64": (64, 4),
    "F4": (4, 1),
    "F6_E2M3": (6, 1),
    "F6_E3M2": (6, 1),
}


def word_of(dtype: str) -> int:
    return DTYPES.get(dtype, (None, 1))[1]


class SpecError(Exception):
    """The spec says a reader MUST refuse this. ``status`` is 4 (integrity)
    or 5 (made for another base), as the spec's Conventions say."""

    def __init__(self, msg: str, status: int = 4):
        super().__init__(msg)
        self.status = status


def refuse(msg: str, status: int = 4):
    raise SpecError(msg, status)


# -- digests -------------------------------------------------------------------------------


def H(x) -> bytes:
    return xxhash.xxh3_128_digest(bytes(x))


def hexd(d: bytes) -> str:
    return d.hex()


def BD(s) -> bytes:
    s = memoryview(s)
    return b"".join(H(s[i:i + B]) for i in range(0, len(s), B))


def D(s) -> bytes:
    return H(BD(s))


def tensor_file_digest(header_digest: bytes, tensor_digests) -> bytes:
    return H(TENSOR_PREFIX + header_digest + b"".join(tensor_digests))


def fingerprint(entries) -> bytes:
    """``entries``: (path, kind, size, digest) in path order; kind is
    "safetensors" or "file", digest 16 bytes."""
    parts = [CKPT_PREFIX]
    for path, kind, size, digest in entries:
        p = path.encode("utf-8")
        parts.append(struct.pack("<I", len(p)) + p + (b"T" if kind == "safetensors" else b"F")
                     + struct.pack("<Q", size) + digest)
    return H(b"".join(parts))


def path_key(p: str) -> bytes:
    return p.encode("utf-8", "surrogatepass")


# -- canonical JSON, paths -----------------------------------------------------------------


def canon(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def path_problem(p) -> str | None:
    """Why ``p`` breaks the path rules, or None."""
    if not isinstance(p, str) or not p:
        return "empty or not a string"
    try:
        raw = p.encode("utf-8")  # lone surrogates are not Unicode scalar values
    except UnicodeEncodeError:
        return "not Unicode scalar values"
    if len(raw) > 4096:
        return "longer than 4096 bytes"
    if p.startswith("/") or "\\" in p or "\x00" in p:
        return "absolute, backslash or NUL"
    for c in p.split("/"):
        if not c or c in (".", ".."):
            return "empty, . or .. component"
        if len(c.encode("utf-8")) > 255:
            return "component longer than 255 bytes"
        if any(unicodedata.category(ch) == "Cc" for ch in c):
            return "control character"
    return None


# -- safetensors ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class StHeader:
    size: int  # header size, 8 + N
    tensors: tuple  # in data order
    metadata: object


class _NotStrict(Exception):
    pass


def _no_dupes(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise _NotStrict("duplicate member " + repr(k))
        d[k] = v
    return d


def _bad_constant(s):
    raise _NotStrict("non-JSON constant " + s)


def _bad_float(s):
    raise _NotStrict("not an integer: " + s)


def _is_int(v) -> bool:
    return type(v) is int


def parse_st(buf, F: int) -> StHeader:
    """Check the strict safetensors rules for a file of ``F`` bytes whose
    first bytes are ``buf`` (at least the header). Raises _NotStrict."""
    if F < 8 or len(buf) < 8:
        raise _NotStrict("shorter than 8 bytes")
    (N,) = struct.unpack_from("<Q", buf, 0)
    if not (2 <= N <= 64 << 20) or 8 + N > F:
        raise _NotStrict(f"bad JSON length {N}")
    if len(buf) < 8 + N:
        raise _NotStrict("header cut short")
    text = bytes(buf[8:8 + N])
    if text[:1] != b"{":
        raise _NotStrict("does not start with {")
    if text.count(b"{") > MAX_TENSORS + 2:
        raise _NotStrict("too many {")
    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError:
        raise _NotStrict("not UTF-8") from None
    try:
        obj = json.loads(s, object_pairs_hook=_no_dupes, parse_constant=_bad_constant, parse_float=_bad_float)
    except _NotStrict:
        raise
    except (ValueError, RecursionError) as e:
        raise _NotStrict(f"not JSON: {e}") from None
    # SPEC: "optionally followed by whitespace (safetensors pads with spaces)":
    # Python's json.loads allows JSON whitespace (space, tab, CR, LF) after the
    # value, which is what RFC 8259 calls whitespace; taken to be that.
    if not isinstance(obj, dict):
        raise _NotStrict("not an object")
    data_len = F - 8 - N
    tensors = []
    meta = None
    for name, v in obj.items():
        if name == "__metadata__":
            if v is not None and not (isinstance(v, dict) and all(isinstance(x, str) for x in v.values())):
                raise _NotStrict("bad __metadata__")
            meta = v
            continue
        if len(name.encode("utf-8", "surrogatepass")) > 4096:
            raise _NotStrict("tensor name too long")
        if not isinstance(v, dict) or set(v) != {"dtype", "shape", "data_offsets"}:
            raise _NotStrict(f"{name!r}: bad tensor entry")
        dt, shape, offs = v["dtype"], v["shape"], v["data_offsets"]
        if not isinstance(dt, str) or not (1 <= len(dt) <= 32):
            raise _NotStrict("bad dtype")
        if not isinstance(shape, list) or len(shape) > 64 or not all(_is_int(d) and d >= 0 for d in shape):
            raise _NotStrict("bad shape")
        if not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(x) for x in offs):
            raise _NotStrict("bad data_offsets")
        b, e = offs
        if not (0 <= b <= e <= data_len):
            raise _NotStrict("data_offsets out of range")
        if dt in DTYPES:
            n = 1
            for d in shape:
                n *= d
            if n * DTYPES[dt][0] != (e - b) * 8:
                raise _NotStrict("shape does not match length")
        tensors.append(Tensor(name, dt, tuple(shape), b, e))
    if len(tensors) > MAX_TENSORS:
        raise _NotStrict("too many tensors")
    tensors.sort(key=lambda t: (t.begin, t.end, t.name))
    pos = 0
    for t in tensors:
        if t.begin != pos:
            raise _NotStrict("tensors do not tile the data region")
        pos = t.end
    if pos != data_len:
        raise _NotStrict("tensors do not tile the data region")
    return StHeader(8 + N, tuple(tensors), meta)


def strict_header(path: str, data) -> StHeader | None:
    """The header if ``data`` (a whole file at ``path``) is a tensor file."""
    if not path.endswith(".safetensors"):
        return None
    try:
        return parse_st(data, len(data))
    except _NotStrict:
        return None


def write_st(tensors, metadata=None) -> bytes:
    """A safetensors file: ``tensors`` is a list of (name, dtype, shape,
    bytes) in data order; the JSON is padded with spaces to 8 bytes."""
    hdr = {}
    if metadata is not None:
        hdr["__metadata__"] = metadata
    pos = 0
    for name, dt, shape, data in tensors:
        hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    text = json.dumps(hdr, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


@dataclass
class FileInfo:
    path: str
    kind: str
    size: int
    digest: bytes
    data: bytes
    header: StHeader | None = None

    @property
    def header_bytes(self) -> bytes:
        return self.data[:self.header.size]

    def tensor_bytes(self, t: Tensor) -> bytes:
        o = self.header.size
        return self.data[o + t.begin:o + t.end]


def file_info(path: str, data: bytes) -> FileInfo:
    h = strict_header(path, data)
    if h is None:
        return FileInfo(path, "file", len(data), D(data), data)
    tds = [D(data[h.size + t.begin:h.size + t.end]) for t in h.tensors]
    return FileInfo(path, "safetensors", len(data), tensor_file_digest(H(data[:h.size]), tds), data, h)


@dataclass
class Checkpoint:
    files: list  # FileInfo, path order

    @property
    def fingerprint(self) -> bytes:
        return fingerprint((f.path, f.kind, f.size, f.digest) for f in self.files)

    def by_path(self) -> dict:
        return {f.path: f for f in self.files}

    def tensors(self) -> dict:
        """name -> (FileInfo, Tensor)."""
        out = {}
        for f in self.files:
            if f.header:
                for t in f.header.tensors:
                    out[t.name] = (f, t)
        return out


def scan(root) -> Checkpoint:
    """The files of a checkpoint, as CHECKPOINTS says (raises SpecError for
    a tree the spec refuses)."""
    root = os.fspath(root)
    found = []

    def walk(d, rel, depth):
        if depth > 32:
            refuse("nested too deep")
        for name in sorted(os.listdir(d)):
            if not rel and name in IGNORED_TOP:
                continue
            p = os.path.join(d, name)
            r = rel + "/" + name if rel else name
            if path_problem(r):
                refuse(f"bad path {r!r}")
            st = os.lstat(p)
            if stat.S_ISDIR(st.st_mode):
                walk(p, r, depth + 1)
            elif stat.S_ISREG(st.st_mode) or (stat.S_ISLNK(st.st_mode) and os.path.isfile(p) and not os.path.isdir(p)):
                found.append(r)
            else:
                refuse(f"{r}: not a regular file")

    walk(root, "", 0)
    if len(found) > MAX_FILES:
        refuse("too many files")
    found.sort(key=path_key)
    files = []
    for r in found:
        with open(os.path.join(root, r), "rb") as fh:
            files.append(file_info(r, fh.read()))
    names = {}
    for f in files:
        if f.header:
            for t in f.header.tensors:
                if t.name in names:
                    refuse(f"tensor {t.name!r} in two files")
                names[t.name] = f.path
    return Checkpoint(files)


# -- zstd ------------------------------------------------------------------------------------


def Z(x, level: int = 3) -> bytes:
    """Z(x, len(x)): one frame that declares its content size."""
    return zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False).compress(bytes(x))


def unZ(frame, m: int, what: str = "data") -> bytes:
    """Decompress exactly ``m`` bytes from one frame, never trusting the frame
    header for allocation (streamed, output limited to m + small slack)."""
    frame = bytes(frame)
    try:
        params = zstandard.get_frame_parameters(frame)
    except zstandard.ZstdError as e:
        refuse(f"{what}: not a zstd frame ({e})")
    if params.content_size != m:  # also catches "unknown" (-1)
        refuse(f"{what}: frame declares {params.content_size} bytes, not {m}")
    if params.dict_id:
        refuse(f"{what}: uses a dictionary")
    # RFC 8878 lets a decoder refuse large windows; the output buffer is
    # bounded by the declared size anyway, so this one accepts any window
    d = zstandard.ZstdDecompressor(max_window_size=1 << 31).decompressobj()
    out = []
    got = 0
    pos = 0
    step = 256
    try:
        while pos < len(frame) and not d.eof:
            piece = d.decompress(frame[pos:pos + step])
            pos += step
            got += len(piece)
            if got > m:
                refuse(f"{what}: decompresses to more than {m} bytes")
            out.append(piece)
    except zstandard.ZstdError as e:
        refuse(f"{what}: does not decompress ({e})")
    if not d.eof:
        refuse(f"{what}: frame cut short")
    if got != m:
        refuse(f"{what}: decompresses to {got} bytes, not {m}")
    rest = d.unused_data + frame[pos:]
    if rest:
        # SPEC: data after the frame that decompresses to nothing is tolerated
        # by wdiff and MAY be refused by others; this reader tolerates it
        # (it must decompress to nothing, and be well-formed frames).
        try:
            extra = zstandard.ZstdDecompressor().decompressobj().decompress(rest)
        except zstandard.ZstdError:
            refuse(f"{what}: garbage after the frame")
        if extra:
            refuse(f"{what}: a second frame with content")
    return b"".join(out)


# -- codecs ------------------------------------------------------------------------------------

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def P(data, w: int) -> bytes:
    """Byte planes, most significant byte first."""
    a = np.frombuffer(bytes(data), dtype=np.uint8).reshape(-1, w)
    return np.ascontiguousarray(a[:, ::-1].T).tobytes()


def unP(data, w: int) -> bytes:
    a = np.frombuffer(bytes(data), dtype=np.uint8).reshape(w, -1)
    return np.ascontiguousarray(a.T[:, ::-1]).tobytes()


def xor(a, b) -> bytes:
    return (np.frombuffer(bytes(a), np.uint8) ^ np.frombuffer(bytes(b), np.uint8)).tobytes()


def changed_positions(x: bytes, w: int) -> list:
    words = np.frombuffer(x, dtype=_UINT[w])
    return np.flatnonzero(words).tolist()


def pick_words(x: bytes, w: int, pos) -> bytes:
    a = np.frombuffer(x, dtype=np.uint8).reshape(-1, w)
    return a[np.asarray(pos, dtype=np.int64)].tobytes()


def _pack_bits(bits) -> bytes:
    return np.packbits(np.asarray(bits, dtype=np.uint8)).tobytes() if len(bits) else b""


def rice_encode(positions, r: int) -> tuple[bytes, bytes]:
    unary, rem = [], []
    prev = -1
    for p in positions:
        g = p - prev - 1
        prev = p
        q, m = g >> r, g & ((1 << r) - 1)
        unary.extend([0] * q)
        unary.append(1)
        rem.extend((m >> (r - 1 - i)) & 1 for i in range(r))
    return _pack_bits(unary), _pack_bits(rem)


def rice_decode(unary: bytes, rem: bytes, k: int, r: int, n: int) -> list:
    ubits = np.unpackbits(np.frombuffer(unary, np.uint8)) if unary else np.zeros(0, np.uint8)
    ones = np.flatnonzero(ubits)
    if len(ones) != k:
        refuse(f"SPARSE: unary stream holds {len(ones)} 1 bits, not {k}")
    if k == 0 or len(unary) != (int(ones[-1]) + 8) // 8:
        refuse("SPARSE: unary stream has the wrong length")
    if len(rem) != (k * r + 7) // 8:
        refuse("SPARSE: remainder stream has the wrong length")
    rbits = np.unpackbits(np.frombuffer(rem, np.uint8)) if rem else np.zeros(0, np.uint8)
    if rbits[k * r:].any():
        refuse("SPARSE: remainder padding is not zero")
    qs = np.diff(np.concatenate([[-1], ones])) - 1
    if (qs > (n >> r)).any():
        refuse("SPARSE: quotient too large")
    out = []
    prev = -1
    for i in range(k):
        m = 0
        for j in range(r):
            m = (m << 1) | int(rbits[i * r + j])
        p = prev + 1 + (int(qs[i]) << r) + m
        out.append(p)
        prev = p
    if out[-1] >= n:
        refuse("SPARSE: last position not below n")
    return out


def bitmap_encode(positions, n: int) -> bytes:
    bits = np.zeros(n, np.uint8)
    bits[list(positions)] = 1
    return _pack_bits(bits)


def best_rice(positions, n) -> int:
    k = len(positions)
    g = max((n - k) / max(k, 1) * 0.69, 1)
    return int(np.floor(np.log2(g)))


def encode_chunk(codec: int, old: bytes | None, new: bytes, w: int, *, r: int | None = None, level: int = 3):
    """(param, count, [s0, s1, s2]) for the codec, valid per CODECS."""
    if codec == RAW:
        return 0, 0, [Z(P(new, w), level), b"", b""]
    x = xor(old, new)
    pos = changed_positions(x, w)
    n = len(new) // w
    if codec == DENSE:
        return 0, len(pos), [Z(P(x, w), level), b"", b""]
    X = pick_words(x, w, pos)
    if codec == BITMAP:
        return 0, len(pos), [Z(bitmap_encode(pos, n), level), Z(P(X, w), level), b""]
    if codec == SPARSE:
        if r is None:
            r = best_rice(pos, n)
        u, m = rice_encode(pos, r)
        return r, len(pos), [u, m, Z(P(X, w), level)]
    raise ValueError(codec)


def decode_chunk(rec: "Rec", old: bytes | None, n: int) -> bytes:
    """The new bytes of a CHUNK record (checks of CODECS)."""
    w = rec.word
    s0, s1, s2 = rec.sections
    if rec.codec == RAW:
        if s1 or s2 or rec.param or rec.count:
            refuse("RAW: unused section, param or count")
        return unP(unZ(s0, n * w, "RAW"), w)
    if rec.codec == DENSE:
        if s1 or s2 or rec.param:
            refuse("DENSE: unused section or param")
        x = unP(unZ(s0, n * w, "DENSE"), w)
        nz = len(changed_positions(x, w))
        if not (1 <= rec.count <= n) or nz != rec.count:
            refuse("DENSE: count is not the number of non-zero words")
        return xor(old, x)
    if rec.codec == BITMAP:
        if s2 or rec.param:
            refuse("BITMAP: unused section or param")
        if not (1 <= rec.count <= n):
            refuse("BITMAP: bad count")
        bm = unZ(s0, (n + 7) // 8, "BITMAP bitmap")
        bits = np.unpackbits(np.frombuffer(bm, np.uint8))
        if bits[n:].any():
            refuse("BITMAP: padding bits set")
        pos = np.flatnonzero(bits[:n]).tolist()
        if len(pos) != rec.count:
            refuse("BITMAP: bits set differ from count")
        X = unP(unZ(s1, rec.count * w, "BITMAP values"), w)
    elif rec.codec == SPARSE:
        if not (0 <= rec.param <= MAX_RICE):
            refuse("SPARSE: Rice parameter above 40")
        if not (1 <= rec.count <= n):
            refuse("SPARSE: bad count")
        if rec.param == 0 and s1:
            refuse("SPARSE: remainder stream with r = 0")
        pos = rice_decode(s0, s1, rec.count, rec.param, n)
        X = unP(unZ(s2, rec.count * w, "SPARSE values"), w)
    else:
        refuse(f"unknown CHUNK codec {rec.codec}")
    Xw = np.frombuffer(X, dtype=_UINT[w])
    if (Xw == 0).any():
        refuse("a carried X word is zero")
    out = np.frombuffer(old, dtype=_UINT[w]).copy()
    out[np.asarray(pos, np.int64)] ^= Xw
    return out.tobytes()


# -- records and bundles ------------------------------------------------------------------


@dataclass
class Rec:
    type: int
    codec: int
    word: int
    param: int
    file: int
    lo: int
    hi: int
    count: int
    base: bytes
    target: bytes
    sections: list  # three byte strings
    reserved: int = 0
    magic: bytes = REC_MAGIC
    #: explicit len0..len2 (a lie about the payload); None: the real lengths
    lens: tuple | None = None
    #: explicit digest; None: recomputed
    digest: bytes | None = None

    def header96(self) -> bytes:
        lens = self.lens if self.lens is not None else tuple(len(s) for s in self.sections)
        return REC.pack(self.magic, self.type, self.codec, self.word, self.param, self.file, self.reserved,
                        self.lo, self.hi, self.count, *lens, self.base, self.target, ZERO)[:96]

    def payload(self) -> bytes:
        return b"".join(self.sections)

    def to_bytes(self) -> bytes:
        h = self.header96()
        pl = self.payload()
        d = self.digest if self.digest is not None else H(pl + h)
        return h + d + pl

    def computed_digest(self) -> bytes:
        return H(self.payload() + self.header96())

    def copy(self) -> "Rec":
        return replace(self, sections=list(self.sections))


@dataclass
class Bundle:
    records: list
    index: dict
    magic: bytes = MAGIC
    version: int = 1
    flags: int = 0
    end_magic: bytes = END_MAGIC
    #: bytes to put between the records and the index (garbage), normally empty
    gap: bytes = b""

    def copy(self) -> "Bundle":
        return Bundle([r.copy() for r in self.records], json.loads(json.dumps(self.index)), self.magic,
                      self.version, self.flags, self.end_magic, self.gap)


def parse(data: bytes) -> Bundle:
    """Parse a bundle, checking framing and every digest (not the semantics:
    see :func:`read`)."""
    data = bytes(data)
    S = len(data)
    if S < 64:
        refuse("shorter than 64 bytes")
    magic, version, flags = PREAMBLE.unpack_from(data, 0)
    if magic != MAGIC or version != 1 or flags != 0:
        refuse("bad preamble")
    ioff, ilen, iraw, idig, emagic = FOOTER.unpack_from(data, S - 48)
    if emagic != END_MAGIC:
        refuse("bad end magic")
    if ioff < 16 or ioff + ilen != S - 48:
        refuse("index does not end at the footer")
    if iraw > MAX_INDEX_RAW:
        refuse("index too large")
    frame = data[ioff:ioff + ilen]
    if H(frame) != idig:
        refuse("index digest mismatch")
    raw = unZ(frame, iraw, "index")
    try:
        text = raw.decode("ascii")
        index = json.loads(text, object_pairs_hook=_dict_no_dupes, parse_constant=_bad_constant_spec)
    except (UnicodeDecodeError, ValueError, RecursionError):
        refuse("index is not ASCII JSON")
    try:
        again = canon(index)
    except (ValueError, TypeError):
        refuse("index is not canonical")
    if again != raw:
        refuse("index is not canonical")
    if not isinstance(index, dict):
        refuse("index is not an object")
    recs = []
    off = 16
    while off < ioff:
        if ioff - off < REC.size:
            refuse("record header runs past the index")
        (m, typ, codec, word, param, fileno, reserved, lo, hi, count, l0, l1, l2, base, target,
         digest) = REC.unpack_from(data, off)
        if m != REC_MAGIC:
            refuse(f"record at {off}: bad magic")
        if any(v > LIMIT for v in (hi, count, l0, l1, l2)):
            refuse(f"record at {off}: field above 2^62")
        end = off + REC.size + l0 + l1 + l2
        if end > ioff:
            refuse(f"record at {off}: payload runs past the index")
        p = off + REC.size
        secs = [data[p:p + l0], data[p + l0:p + l0 + l1], data[p + l0 + l1:end]]
        rec = Rec(typ, codec, word, param, fileno, lo, hi, count, base, target, secs, reserved, m)
        if rec.computed_digest() != digest:
            refuse(f"record at {off}: digest mismatch")
        recs.append(rec)
        off = end
    return Bundle(recs, index)


def _dict_no_dupes(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            refuse("duplicate member in the index")
        d[k] = v
    return d


def _bad_constant_spec(s):
    refuse("NaN or infinity in the index")


def chain_digest(records) -> bytes:
    return H(b"".join(r.computed_digest() if r.digest is None else r.digest for r in records))


def refresh_index(index: dict) -> None:
    """Recompute, in place, every digest the index derives from others:
    the tensor-file digest of each target tensor file, the target
    fingerprint and the base fingerprint (skipping entries too broken to
    digest)."""
    t = index.get("target")
    if isinstance(t, dict) and isinstance(t.get("files"), list):
        rows = []
        for f in t["files"]:
            try:
                if f.get("kind") == "safetensors":
                    f["digest"] = tensor_file_digest(bytes.fromhex(f["header_digest"]),
                                                     [bytes.fromhex(x) for x in f["tensors"]]).hex()
                rows.append((f["path"], f["kind"], f["size"], bytes.fromhex(f["digest"])))
            except Exception:  # noqa: BLE001 - a deliberately broken entry
                rows = None
                break
        if rows is not None:
            try:
                t["fingerprint"] = fingerprint(rows).hex()
            except Exception:  # noqa: BLE001
                pass
    b = index.get("base")
    if isinstance(b, dict) and isinstance(b.get("files"), list):
        try:
            b["fingerprint"] = fingerprint((p, k, s, bytes.fromhex(d)) for p, k, s, d in b["files"]).hex()
        except Exception:  # noqa: BLE001
            pass


def serialize(b: Bundle, *, fix_records: bool = True, fix_index: bool = True, level: int = 19,
              index_raw: bytes | None = None, footer: dict | None = None) -> bytes:
    """Bytes of ``b``. With ``fix_records``, records.count, records.bytes and
    records.digest are set from the records; with ``fix_index`` the derived
    digests of the index too (:func:`refresh_index`). ``index_raw`` replaces
    the canonical index text (to write a non-canonical one); ``footer``
    overrides footer fields (index_offset, index_length, index_raw_length)."""
    recs = b"".join(r.to_bytes() for r in b.records) + b.gap
    index = b.index
    if fix_records and isinstance(index.get("records"), dict):
        index["records"]["count"] = len(b.records)
        index["records"]["bytes"] = len(recs)
        index["records"]["digest"] = chain_digest(b.records).hex()
    if fix_index:
        refresh_index(index)
    raw = canon(index) if index_raw is None else index_raw
    frame = Z(raw, level)
    ioff = 16 + len(recs)
    f = {"index_offset": ioff, "index_length": len(frame), "index_raw_length": len(raw)}
    if footer:
        f.update(footer)
    return (PREAMBLE.pack(b.magic, b.version, b.flags) + recs + frame
            + FOOTER.pack(f["index_offset"], f["index_length"], f["index_raw_length"], H(frame), b.end_magic))


# -- the index: consistency checks --------------------------------------------------------

_HEX = set("0123456789abcdef")


def _digest_ok(v) -> bool:
    return isinstance(v, str) and len(v) == 32 and set(v) <= _HEX


def _int_ok(v) -> bool:
    return type(v) is int and 0 <= v <= LIMIT


def check_index(index, index_offset: int) -> None:
    """Consistency checks of INDEX (everything a reader checks before it
    trusts the index)."""
    if not isinstance(index, dict) or set(index) != {"base", "block_size", "format", "records", "target",
                                                    "version", "writer"}:
        refuse("index members")
    if index["format"] != "wdiff-bundle" or type(index["version"]) is not int or index["version"] != 1:
        refuse("index format or version")
    if type(index["block_size"]) is not int or index["block_size"] != B:
        refuse("block_size")
    if not isinstance(index["writer"], str):
        refuse("writer")
    recs = index["records"]
    if not isinstance(recs, dict) or set(recs) != {"bytes", "count", "digest"} or not _int_ok(recs["bytes"]) \
            or not _int_ok(recs["count"]) or not _digest_ok(recs["digest"]):
        refuse("records")
    if recs["bytes"] != index_offset - 16:
        refuse("records.bytes")
    base = index["base"]
    if base is not None:
        if not isinstance(base, dict) or set(base) != {"files", "fingerprint"} or not _digest_ok(base["fingerprint"]) \
                or not isinstance(base["files"], list):
            refuse("base")
        if len(base["files"]) > MAX_FILES:
            refuse("base.files too long")
        prev = None
        for row in base["files"]:
            if not isinstance(row, list) or len(row) != 4:
                refuse("base row")
            p, k, s, d = row
            if path_problem(p) or k not in ("safetensors", "file") or not _int_ok(s) or not _digest_ok(d):
                refuse("base row fields")
            if prev is not None and path_key(p) <= path_key(prev):
                refuse("base.files out of order")
            prev = p
        if fingerprint((p, k, s, bytes.fromhex(d)) for p, k, s, d in base["files"]).hex() != base["fingerprint"]:
            refuse("base fingerprint")
    t = index["target"]
    if not isinstance(t, dict) or set(t) != {"files", "fingerprint"} or not _digest_ok(t["fingerprint"]) \
            or not isinstance(t["files"], list):
        refuse("target")
    if len(t["files"]) > MAX_FILES:
        refuse("target.files too long")
    prev = None
    rows = []
    for f in t["files"]:
        if not isinstance(f, dict):
            refuse("target entry")
        kind = f.get("kind")
        need = {"digest", "kind", "path", "size", "source"}
        if kind == "safetensors":
            need |= {"header_digest", "header_size", "tensors"}
        elif kind != "file":
            refuse("target kind")
        if set(f) != need:
            refuse("target entry members")
        p = f["path"]
        if path_problem(p):
            refuse(f"target path {p!r}: {path_problem(p)}")
        if f["source"] not in ("base", "bundle") or not _int_ok(f["size"]) or not _digest_ok(f["digest"]):
            refuse("target entry fields")
        if prev is not None and path_key(p) <= path_key(prev):
            refuse("target.files out of order")
        prev = p
        if p.split("/")[0] in IGNORED_TOP:
            refuse("target path in .wdiff, .git or .cache")
        if base is None and f["source"] == "base":
            refuse("anchor with a base source")
        if kind == "safetensors":
            if not p.endswith(".safetensors"):
                refuse("safetensors path without .safetensors")
            if not _int_ok(f["header_size"]) or not _digest_ok(f["header_digest"]) \
                    or not isinstance(f["tensors"], list) or not all(_digest_ok(x) for x in f["tensors"]):
                refuse("tensor entry fields")
            if not (10 <= f["header_size"] <= f["size"]) or len(f["tensors"]) > MAX_TENSORS:
                refuse("header_size or tensors")
            if tensor_file_digest(bytes.fromhex(f["header_digest"]), [bytes.fromhex(x) for x in f["tensors"]]).hex() \
                    != f["digest"]:
                refuse("tensor-file digest")
        rows.append((p, kind, f["size"], bytes.fromhex(f["digest"])))
    if fingerprint(rows).hex() != t["fingerprint"]:
        refuse("target fingerprint")
    paths = {r[0] for r in rows}
    for p in paths:
        parts = p.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in paths:
                refuse(f"{p!r} lies below another listed path")


# -- the reference reader ------------------------------------------------------------------


def _chunk_digest(covered, lo, hi, region_bytes) -> bytes:
    """covered: tensors in data order; region_bytes: bytes [lo, hi)."""
    parts = []
    for t in covered:
        a, b = max(lo, t.begin), min(hi, t.end)
        parts.append(BD(region_bytes[a - lo:b - lo]))
    return H(b"".join(parts))


def read(data: bytes, base: Checkpoint | None) -> dict:
    """Apply a bundle as READING A BUNDLE says: the target files (path ->
    bytes), or SpecError."""
    bnd = parse(data)
    S = len(data)
    ioff = FOOTER.unpack_from(data, S - 48)[0]
    index = bnd.index
    check_index(index, ioff)
    recs = bnd.records
    if len(recs) != index["records"]["count"]:
        refuse("record count")
    if chain_digest(recs).hex() != index["records"]["digest"]:
        refuse("chain digest")
    files = index["target"]["files"]
    nfiles = len(files)
    anchor = index["base"] is None
    # record header checks and order
    last_file = -1
    seen_header = set()
    seen_file = set()
    last_hi = {}
    chunks = {}
    header_recs = {}
    file_recs = {}
    for i, r in enumerate(recs):
        where = f"record {i}"
        if r.type not in (CHUNK, FILE, HEADER) or r.word not in (1, 2, 4, 8) or r.reserved != 0:
            refuse(f"{where}: bad type, word or reserved")
        if r.file >= nfiles:
            refuse(f"{where}: file out of range")
        if r.lo > r.hi:
            refuse(f"{where}: lo > hi")
        if r.file < last_file:
            refuse(f"{where}: file order")
        last_file = r.file
        f = files[r.file]
        if r.type in (FILE, HEADER):
            if r.codec != ZSTD or r.word != 1 or r.param or r.count or r.base != ZERO or r.sections[1] or r.sections[2]:
                refuse(f"{where}: bad FILE/HEADER fields")
            if r.lo != 0:
                refuse(f"{where}: lo not 0")
        if r.type == FILE:
            if f["kind"] != "file" or f["source"] != "bundle" or r.file in seen_file:
                refuse(f"{where}: FILE record for a wrong file")
            if r.target.hex() != f["digest"] or r.hi != f["size"] or len(r.sections[0]) > 2 * f["size"] + 65536:
                refuse(f"{where}: FILE target, hi or length")
            seen_file.add(r.file)
            file_recs[r.file] = r
        elif r.type == HEADER:
            if f["kind"] != "safetensors" or f["source"] != "bundle" or r.file in seen_header or r.file in chunks:
                refuse(f"{where}: HEADER for a wrong file or after its chunks")
            if r.target.hex() != f["header_digest"] or r.hi != f["header_size"] or r.hi > MAX_HEADER_HI \
                    or len(r.sections[0]) > 2 * r.hi + 65536:
                refuse(f"{where}: HEADER target, hi or length")
            seen_header.add(r.file)
            header_recs[r.file] = r
        else:
            if f["kind"] != "safetensors":
                refuse(f"{where}: CHUNK for a companion file")
            if f["source"] == "bundle" and r.file not in seen_header:
                refuse(f"{where}: CHUNK before the HEADER")
            if r.codec not in (RAW, SPARSE, BITMAP, DENSE):
                refuse(f"{where}: bad CHUNK codec")
            dlen = f["size"] - f["header_size"]
            if not (r.lo < r.hi <= dlen) or r.hi - r.lo > MAX_CHUNK_BYTES or (r.hi - r.lo) % r.word \
                    or sum(len(s) for s in r.sections) > 2 * (r.hi - r.lo) + 65536:
                refuse(f"{where}: CHUNK bounds")
            if r.lo < last_hi.get(r.file, 0):
                refuse(f"{where}: CHUNK overlap or order")
            last_hi[r.file] = r.hi
            chunks.setdefault(r.file, []).append(r)
    for j, f in enumerate(files):
        if f["source"] == "bundle" and j not in seen_header and j not in seen_file:
            refuse(f"{f['path']}: no record for a file of source bundle")
    # base listing
    if not anchor:
        if base is None:
            refuse("a delta bundle needs a base", 5)
        want = [(p, k, s, d) for p, k, s, d in index["base"]["files"]]
        have = [(f.path, f.kind, f.size, f.digest.hex()) for f in base.files]
        if [(p, k, s) for p, k, s, _ in want] != [(p, k, s) for p, k, s, _ in have]:
            refuse("the base does not match base.files", 5)
        if base.fingerprint.hex() != index["base"]["fingerprint"]:
            refuse("base fingerprint mismatch", 5)
    elif base is not None and base.files:
        refuse("an anchor applies onto an empty directory only", 5)
    bfiles = base.by_path() if base is not None and not anchor else {}
    btensors = base.tensors() if base is not None and not anchor else {}
    # headers
    headers = {}
    names = set()
    for j, f in enumerate(files):
        if f["kind"] != "safetensors":
            continue
        if f["source"] == "bundle":
            r = header_recs[j]
            hb = unZ(r.sections[0], r.hi, "HEADER")
        else:
            bf = bfiles.get(f["path"])
            if bf is None or bf.kind != "safetensors":
                refuse(f"{f['path']}: header source base, but the base has no tensor file there")
            hb = bf.header_bytes
        if len(hb) != f["header_size"] or H(hb).hex() != f["header_digest"]:
            refuse(f"{f['path']}: header size or digest")
        try:
            h = parse_st(hb, f["size"])
        except _NotStrict as e:
            refuse(f"{f['path']}: header not strict safetensors ({e})")
        if h.size != f["header_size"] or len(h.tensors) != len(f["tensors"]):
            refuse(f"{f['path']}: header tensor count")
        for t in h.tensors:
            if t.name in names:
                refuse(f"tensor {t.name!r} twice in the target")
            names.add(t.name)
        headers[j] = (hb, h)
    out = {}
    for j, f in enumerate(files):
        if f["kind"] == "file":
            if f["source"] == "bundle":
                content = unZ(file_recs[j].sections[0], f["size"], "FILE")
            else:
                bf = bfiles.get(f["path"])
                if bf is None or bf.kind != "file" or bf.digest.hex() != f["digest"]:
                    refuse(f"{f['path']}: source base, but the base has no such companion file")
                content = bf.data
            if len(content) != f["size"] or D(content).hex() != f["digest"]:
                refuse(f"{f['path']}: companion digest")
            out[f["path"]] = content
            continue
        hb, h = headers[j]
        src = {}
        for t in h.tensors:
            bt = btensors.get(t.name)
            if bt is not None and bt[1].dtype == t.dtype and bt[1].shape == t.shape and bt[1].nbytes == t.nbytes:
                src[t.name] = bt
        # coverage first, from the record ranges alone: a data region larger
        # than the base and the records can fill is refused before it is built
        have = {t.name: 0 for t in h.tensors}
        for r in chunks.get(j, []):
            for t in h.tensors:
                if t.nbytes and t.begin < r.hi and t.end > r.lo:
                    have[t.name] += min(r.hi, t.end) - max(r.lo, t.begin)
        for t in h.tensors:
            if t.nbytes and t.name not in src and have[t.name] != t.nbytes:
                refuse(f"tensor {t.name!r} without base source not covered")
        region = bytearray(f["size"] - len(hb))
        for name, bt in src.items():
            t = next(t for t in h.tensors if t.name == name)
            region[t.begin:t.end] = bt[0].tensor_bytes(bt[1])
        covered_by = {t.name: 0 for t in h.tensors}
        for r in chunks.get(j, []):
            cov = [t for t in h.tensors if t.nbytes and t.begin < r.hi and t.end > r.lo]
            if not cov:
                refuse("CHUNK covers no tensor")
            whole = r.lo == cov[0].begin and r.hi == cov[-1].end
            piece = len(cov) == 1 and (r.lo - cov[0].begin) % B == 0 and r.lo >= cov[0].begin \
                and r.hi <= cov[0].end and ((r.hi - cov[0].begin) % B == 0 or r.hi == cov[0].end)
            if not (whole or piece):
                refuse("CHUNK range is neither whole tensors nor a block-aligned piece")
            if any(word_of(t.dtype) != r.word for t in cov):
                refuse("CHUNK word differs from a covered tensor's")
            has = [t.name in src for t in cov]
            if any(has) and not all(has):
                refuse("CHUNK mixes tensors with and without base sources")
            if (r.base == ZERO) != (not has[0]):
                refuse("CHUNK base digest zero iff no base source")
            if r.codec != RAW and not has[0]:
                refuse("delta codec without base source")
            old = bytes(region[r.lo:r.hi])
            if has[0] and _chunk_digest(cov, r.lo, r.hi, old) != r.base:
                refuse("CHUNK base digest mismatch")
            new = decode_chunk(r, old if has[0] else None, (r.hi - r.lo) // r.word)
            if _chunk_digest(cov, r.lo, r.hi, new) != r.target:
                refuse("CHUNK target digest mismatch")
            region[r.lo:r.hi] = new
            for t in cov:
                covered_by[t.name] += min(r.hi, t.end) - max(r.lo, t.begin)
        for t in h.tensors:
            if t.nbytes and t.name not in src and covered_by[t.name] != t.nbytes:
                refuse(f"tensor {t.name!r} without base source not covered")
        for t, want in zip(h.tensors, f["tensors"]):
            if D(region[t.begin:t.end]).hex() != want:
                refuse(f"tensor {t.name!r} digest")
        out[f["path"]] = hb + bytes(region)
    return out


# -- the reference writer ------------------------------------------------------------------


def index_entry(f: FileInfo, source: str) -> dict:
    e = {"path": f.path, "kind": f.kind, "size": f.size, "digest": f.digest.hex(), "source": source}
    if f.kind == "safetensors":
        e["header_digest"] = H(f.header_bytes).hex()
        e["header_size"] = f.header.size
        e["tensors"] = [D(f.tensor_bytes(t)).hex() for t in f.header.tensors]
    return e


def pack(base: Checkpoint | None, target: Checkpoint, rng: random.Random, *, level: int = 3,
         writer: str = "specbundle 1") -> Bundle:
    """A valid bundle from ``base`` (None: an anchor) to ``target``, with
    random valid choices."""
    bfiles = base.by_path() if base else {}
    btensors = base.tensors() if base else {}
    entries, records = [], []
    for j, f in enumerate(target.files):
        bf = bfiles.get(f.path)
        if f.kind == "file":
            same = bf is not None and bf.kind == "file" and bf.digest == f.digest
            source = "base" if same and rng.random() < 0.85 else "bundle"
            entries.append(index_entry(f, source))
            if source == "bundle":
                records.append(Rec(FILE, ZSTD, 1, 0, j, 0, f.size, 0, ZERO, f.digest, [Z(f.data, level), b"", b""]))
            continue
        same = bf is not None and bf.kind == "safetensors" and bf.header_bytes == f.header_bytes
        source = "base" if same and rng.random() < 0.85 else "bundle"
        entries.append(index_entry(f, source))
        if source == "bundle":
            hb = f.header_bytes
            records.append(Rec(HEADER, ZSTD, 1, 0, j, 0, len(hb), 0, ZERO, H(hb), [Z(hb, level), b"", b""]))
        region = f.data[f.header.size:]
        oldregion = bytearray(len(region))
        has = {}
        for t in f.header.tensors:
            bt = btensors.get(t.name)
            if bt is not None and bt[1].dtype == t.dtype and bt[1].shape == t.shape:
                has[t.name] = True
                oldregion[t.begin:t.end] = bt[0].tensor_bytes(bt[1])
        for lo, hi, cov in _cut(f.header.tensors, has, rng):
            w = word_of(cov[0].dtype)
            new = region[lo:hi]
            if cov[0].name in has:
                old = bytes(oldregion[lo:hi])
                if old == new:
                    continue
                x = xor(old, new)
                nz = len(changed_positions(x, w))
                codec = rng.choice([RAW, SPARSE, BITMAP, DENSE] if nz else [RAW])
                basedig = _chunk_digest(cov, lo, hi, old)
            else:
                old, codec, basedig = None, RAW, ZERO
            r = rng.choice([None, 0, rng.randrange(0, 41)]) if codec == SPARSE else None
            param, count, secs = encode_chunk(codec, old, new, w, r=r, level=level)
            if sum(len(s) for s in secs) > 2 * (hi - lo) + 65536:  # a Rice parameter too far off
                param, count, secs = encode_chunk(RAW, old, new, w, level=level)
                codec = RAW
            records.append(Rec(CHUNK, codec, w, param, j, lo, hi, count, basedig,
                               _chunk_digest(cov, lo, hi, new), secs))
    index = {
        "base": None if base is None else {
            "fingerprint": base.fingerprint.hex(),
            "files": [[f.path, f.kind, f.size, f.digest.hex()] for f in base.files],
        },
        "block_size": B,
        "format": "wdiff-bundle",
        "records": {"bytes": 0, "count": 0, "digest": H(b"").hex()},
        "target": {"fingerprint": target.fingerprint.hex(), "files": entries},
        "version": 1,
        "writer": writer,
    }
    return Bundle(records, index)


def _cut(tensors, has, rng):
    """(lo, hi, covered) chunks: runs of consecutive non-empty tensors with
    the same word and base-source presence, or block-aligned pieces."""
    ts = [t for t in tensors if t.nbytes]
    i = 0
    while i < len(ts):
        t = ts[i]
        if t.nbytes > B and rng.random() < 0.7:
            pos = t.begin
            while pos < t.end:
                step = B * rng.randint(1, 3)
                hi = min(pos + step, t.end)
                yield pos, hi, [t]
                pos = hi
            i += 1
            continue
        j = i + 1
        limit = rng.choice([1, 2, 4, 64])
        while j < len(ts) and j - i < limit and word_of(ts[j].dtype) == word_of(t.dtype) \
                and (ts[j].name in has) == (t.name in has) and ts[j].end - t.begin <= MAX_CHUNK_BYTES:
            j += 1
        yield t.begin, ts[j - 1].end, ts[i:j]
        i = j


# -- small helpers for tests -------------------------------------------------------------------


def files_of(index) -> list:
    return index["target"]["files"]


def snapshot(root) -> dict:
    """Every entry under ``root``: relative path -> bytes (files), 'dir' or
    ('link', target)."""
    out = {}
    root = os.fspath(root)
    for dirpath, dirs, fnames in os.walk(root):
        for d in dirs:
            p = os.path.join(dirpath, d)
            out[os.path.relpath(p, root)] = ("link", os.readlink(p)) if os.path.islink(p) else "dir"
        for fn in fnames:
            p = os.path.join(dirpath, fn)
            if os.path.islink(p):
                out[os.path.relpath(p, root)] = ("link", os.readlink(p))
            else:
                with open(p, "rb") as fh:
                    out[os.path.relpath(p, root)] = fh.read()
    return out


