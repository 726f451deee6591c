"""Content digests: per block, per tensor, per file, per checkpoint.

Every digest is XXH3-128. Tensor bytes (and companion-file bytes) are cut into
blocks of :data:`BLOCK_SIZE` bytes counted from the tensor's first byte; the
digest of a tensor is the digest of the concatenation of its block digests,
so any block-aligned run of blocks has a digest that can be computed from the
block digests alone. The format spec (man/wdiff-format.5) defines these
exactly; changing any of them is a new format version.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

BLOCK_SIZE = 1 << 20
DIGEST_SIZE = 16
EMPTY = xxhash.xxh3_128_digest(b"")

_h = xxhash.xxh3_128_digest


def block_digests(buf) -> bytes:
    """Concatenated digests of each BLOCK_SIZE block of ``buf`` (a buffer)."""
    mv = memoryview(buf).cast("B")
    n = len(mv)
    if n <= BLOCK_SIZE:
        return _h(mv) if n else b""
    return b"".join(_h(mv[i : i + BLOCK_SIZE]) for i in range(0, n, BLOCK_SIZE))


def tree(digests: bytes) -> bytes:
    """Digest of a run of blocks, from their concatenated block digests."""
    return _h(digests)


def n_blocks(nbytes: int) -> int:
    return -(-nbytes // BLOCK_SIZE)


def tensor_file_digest(header_digest: bytes, tensor_digests: list[bytes]) -> bytes:
    """Digest of a tensor file: its header's digest, then each tensor's in data order."""
    return _h(b"wdiff-safetensors\x00" + header_digest + b"".join(tensor_digests))


_ENTRY = struct.Struct("<I")


def fingerprint(files) -> bytes:
    """Fingerprint of a checkpoint from ``(path, kind, size, digest)`` rows,
    which must be in path order. Two checkpoints have the same fingerprint
    exactly when they hold the same files with the same bytes."""
    h = xxhash.xxh3_128()
    h.update(b"wdiff-checkpoint\x00")
    for path, kind, size, digest in files:
        p = path.encode("utf-8")
        h.update(_ENTRY.pack(len(p)) + p)
        h.update(b"T" if kind == "safetensors" else b"F")
        h.update(struct.pack("<Q", size))
        h.update(digest)
    return h.digest()


def hexd(d: bytes) -> str:
    return d.hex()


_HEX = frozenset("0123456789abcdef")


def unhex(s: object, *, where: str) -> bytes:
    """A digest from its canonical form: exactly 32 lowercase hex digits."""
    from ..errors import FormatError

    if not isinstance(s, str) or len(s) != 2 * DIGEST_SIZE or not _HEX.issuperset(s):
        raise FormatError(f"{where}: malformed digest")
    return bytes.fromhex(s)


@dataclass(frozen=True, slots=True)
class FileDigest:
    """What wdiff knows of one file of a checkpoint, by digest."""

    path: str
    kind: str
    size: int
    digest: bytes
    header_digest: bytes | None = None  # tensor files only
    #: tensor files: concatenated block digests of each tensor, in data order;
    #: companion files: one entry, the file's block digests
    blocks: tuple[bytes, ...] = ()

    def tensor_digests(self) -> list[bytes]:
        return [tree(b) for b in self.blocks]


@dataclass(frozen=True)
class Manifest:
    files: tuple[FileDigest, ...]  # path order

    @property
    def fingerprint(self) -> bytes:
        return fingerprint((f.path, f.kind, f.size, f.digest) for f in self.files)

    def file(self, path: str) -> FileDigest | None:
        for f in self.files:
            if f.path == path:
                return f
        return None


def file_digest_from_blocks(kind: str, header_raw: bytes | None, blocks: list[bytes]) -> bytes:
    if kind == "safetensors":
        assert header_raw is not None
        return tensor_file_digest(_h(header_raw), [tree(b) for b in blocks])
    return tree(blocks[0]) if blocks else EMPTY


RANGE_PIECE = 8 * 1024 * 1024


def short(fp: bytes | None) -> str:
    """The first 12 hex digits of a fingerprint, for messages; '-' for none."""
    return hexd(fp)[:12] if fp else "-"


def range_digest(path: str, offset: int, length: int) -> bytes:
    """XXH3-128 of ``length`` bytes of the file at ``path`` from ``offset``."""
    from ..errors import IntegrityError

    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        f.seek(offset)
        left = length
        while left:
            piece = f.read(min(RANGE_PIECE, left))
            if not piece:
                raise IntegrityError(f"{path}: shorter than expected")
            h.update(piece)
            left -= len(piece)
    return h.digest()
