"""Block digests as a data pass produces them: :class:`Digests` collects the
digests of one checkpoint's tensors and companion files as units are
processed, in any order, and turns them into a manifest."""

from __future__ import annotations

import os

import xxhash

from ..fsutil import io_error, write_all
from ..progress import SILENT, Reporter
from .blockio import scratch
from .checkpoint import KIND_TENSORS, Checkpoint, read_into
from .hashing import BLOCK_SIZE, FileDigest, Manifest, block_digests, file_digest_from_blocks, n_blocks
from .units import Unit

READ_PIECE = 8 * BLOCK_SIZE


class Digests:
    """Block digests of one checkpoint's tensors and companion files, filled
    in as units are processed (in any order)."""

    def __init__(self) -> None:
        #: tensor name -> concatenated block digests: bytes when they came
        #: whole, a bytearray filled piece by piece for a tensor cut in units
        self.tensors: dict[str, bytes | bytearray] = {}
        self.files: dict[str, bytes] = {}

    def put_unit(self, unit: Unit, digests: list[bytes], *, base: bool = False) -> None:
        tensors = self.tensors
        for s, d in zip(unit.spans, digests):
            t = s.base.tensor if base else s.tensor
            if s.lo == 0 and s.hi == t.nbytes:  # a whole tensor: most of them, in a small-tensor checkpoint
                tensors[t.name] = d
                continue
            arr = tensors.get(t.name)
            if arr is None:
                arr = tensors[t.name] = bytearray(16 * n_blocks(t.nbytes))
            elif type(arr) is bytes:  # known whole before; a piece of it is updated now
                arr = tensors[t.name] = bytearray(arr)
            at = 16 * (s.lo // BLOCK_SIZE)
            arr[at : at + len(d)] = d

    def has_tensor(self, name: str) -> bool:
        return name in self.tensors

    def manifest(self, ckpt: Checkpoint) -> Manifest:
        """The manifest of ``ckpt``; every tensor and file must be present."""
        out = []
        for f in ckpt.files:
            if f.kind == KIND_TENSORS:
                blocks = [bytes(self.tensors.get(t.name, b"")) for t in f.header.tensors]
                header_raw = f.header.raw
            else:
                blocks = [self.files[f.path]]
                header_raw = None
            out.append(
                FileDigest(
                    f.path, f.kind, f.size, file_digest_from_blocks(f.kind, header_raw, blocks),
                    header_digest=_hdr(header_raw), blocks=tuple(blocks),
                )
            )
        return Manifest(tuple(out))


def _hdr(raw: bytes | None) -> bytes | None:
    return None if raw is None else xxhash.xxh3_128_digest(raw)


def hash_file(path: str, size: int, *, reporter: Reporter = SILENT, copy_to: int | None = None) -> bytes:
    """Block digests of a whole (companion) file, read in pieces; with
    ``copy_to`` (a file descriptor) each piece is also written there."""
    buf = scratch("file", READ_PIECE)
    parts = []
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise io_error(path, e) from None
    try:
        for off in range(0, size, READ_PIECE):
            n = min(READ_PIECE, size - off)
            read_into(fd, off, memoryview(buf[:n]), where=path)
            parts.append(block_digests(buf[:n]))
            if copy_to is not None:
                write_all(copy_to, buf[:n], off)
            reporter.advance(n)
    finally:
        os.close(fd)
    return b"".join(parts)
