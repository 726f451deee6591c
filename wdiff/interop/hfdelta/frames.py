"""The zstd frames of the layout, read by streaming and applied to a
tensor's bytes where they lie.

A frame is input from another system. One-shot decompression trusts the
size a frame declares (a 19-byte frame declaring 1 TiB raised MemoryError),
so a frame is decompressed a small piece of input at a time, and refused as
soon as it would yield more than the tensor it patches needs: memory stays
bounded by PIECE_IN times zstd's largest expansion (an RLE block), whatever
the frame says. A frame must declare its content size (the layout's writers
write it), hold exactly that much, and be followed by nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import zstandard

from ...errors import FormatError, IntegrityError
from ...fsutil import io_error

_MAGIC = b"\x28\xb5\x2f\xfd"
#: compressed bytes fed per call: zstd expands one input byte at most ~32768
#: times (a 4-byte RLE block of 128 KiB), so one call yields at most ~64 MiB
PIECE_IN = 2048
#: tensor bytes handled per step (xor), positions per step (overwrite)
CHUNK = 4 << 20
#: the largest window a frame may ask for (zstd's own default limit)
MAX_WINDOW = 1 << 27


def pread_exact(fd: int, n: int, offset: int, *, where: str) -> bytes:
    try:
        data = os.pread(fd, n, offset)
    except OSError as e:
        raise io_error(where, e) from None
    if len(data) != n:
        raise IntegrityError(f"{where}: the file ended early (was it changed while wdiff read it?)")
    return data


class FrameStream:
    """The decompressed bytes of the one zstd frame at ``[offset, offset +
    length)`` of the open file ``fd``, read in order."""

    def __init__(self, fd: int, offset: int, length: int, *, where: str) -> None:
        self.fd, self.pos, self.end, self.where = fd, offset, offset + length, where
        head = pread_exact(fd, min(18, length), offset, where=where) if length else b""
        if head[:4] != _MAGIC:
            raise FormatError(f"{where}: not a zstd frame")
        try:
            params = zstandard.get_frame_parameters(head)
        except zstandard.ZstdError:
            raise FormatError(f"{where}: a zstd frame with a damaged header") from None
        if params.content_size in (zstandard.CONTENTSIZE_UNKNOWN, zstandard.CONTENTSIZE_ERROR):
            raise FormatError(f"{where}: the zstd frame does not declare its content size (the layout's writers do)")
        if params.window_size > MAX_WINDOW:
            raise FormatError(f"{where}: the zstd frame asks for a {params.window_size}-byte window")
        self.size = params.content_size
        self.produced = 0  # bytes out of the decompressor so far
        self.taken = 0  # bytes handed to the caller
        self._dobj = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).decompressobj()
        self._buf = bytearray()
        self._at = 0

    def _feed(self) -> None:
        if self._dobj.eof or self.pos >= self.end:
            raise FormatError(f"{self.where}: the zstd frame ends before the {self.size} bytes it declares")
        n = min(PIECE_IN, self.end - self.pos)
        data = pread_exact(self.fd, n, self.pos, where=self.where)
        self.pos += n
        try:
            out = self._dobj.decompress(data)
        except zstandard.ZstdError as e:
            raise FormatError(f"{self.where}: damaged zstd frame ({e})") from None
        self.produced += len(out)
        if self.produced > self.size:
            raise FormatError(f"{self.where}: the zstd frame holds more than the {self.size} bytes it declares")
        if self._dobj.eof and self._dobj.unused_data:
            raise FormatError(f"{self.where}: data after the zstd frame (one frame per tensor)")
        if self._at and self._at * 2 >= len(self._buf):
            del self._buf[: self._at]
            self._at = 0
        self._buf += out

    def read(self, n: int) -> bytes:
        """Exactly the next ``n`` bytes of the content."""
        if self.taken + n > self.size:
            raise FormatError(f"{self.where}: the zstd frame holds {self.size} bytes, fewer than needed")
        while len(self._buf) - self._at < n:
            self._feed()
        out = bytes(self._buf[self._at : self._at + n])
        self._at += n
        self.taken += n
        return out

    def skip(self, n: int) -> None:
        while n:
            k = min(CHUNK, n)
            self.read(k)
            n -= k

    def finish(self) -> None:
        """Every byte of the content was read, and the frame ends the entry."""
        if self.taken != self.size:
            raise FormatError(f"{self.where}: {self.size - self.taken} bytes of the zstd frame left unread")
        while not self._dobj.eof:
            self._feed()
        if self.pos != self.end or len(self._buf) != self._at:
            raise FormatError(f"{self.where}: data after the zstd frame (one frame per tensor)")


def apply_xor(region: np.ndarray, stream: FrameStream) -> None:
    """``region`` (the tensor's old bytes, writable) XOR the frame's content."""
    n = len(region)
    if stream.size != n:
        raise FormatError(f"{stream.where}: an xor frame of {stream.size} bytes for a tensor of {n}")
    off = 0
    while off < n:
        k = min(CHUNK, n - off)
        region[off : off + k] ^= np.frombuffer(stream.read(k), np.uint8)
        off += k
    stream.finish()


def apply_overwrite(region: np.ndarray, open_stream: Callable[[], FrameStream]) -> None:
    """``region`` with the frame's new bytes written at its positions. The
    frame is read twice at once (positions from one stream, values from
    another): memory stays one chunk of each, whatever the count."""
    n = len(region)
    a = open_stream()
    if a.size < 4 or (a.size - 4) % 5:
        raise FormatError(f"{a.where}: an overwrite frame of {a.size} bytes is not count, positions and values")
    count = (a.size - 4) // 5
    if int.from_bytes(a.read(4), "little") != count:
        raise FormatError(f"{a.where}: the overwrite count does not match the frame's size")
    if count > n:
        raise FormatError(f"{a.where}: {count} positions for a tensor of {n} bytes")
    b = open_stream()
    b.skip(4 + 4 * count)
    step = CHUNK // 4
    done = 0
    while done < count:
        k = min(step, count - done)
        pos = np.frombuffer(a.read(4 * k), "<u4")
        vals = np.frombuffer(b.read(k), np.uint8)
        if int(pos.max()) >= n:
            raise FormatError(f"{a.where}: position {int(pos.max())} is past the tensor's {n} bytes")
        region[pos] = vals
        done += k
    b.finish()


def apply_frame(region: np.ndarray, encoding: str, fd: int, offset: int, length: int, *, where: str) -> None:
    """Patch ``region`` with the frame at ``[offset, offset + length)`` of ``fd``."""
    if encoding == "xor":
        apply_xor(region, FrameStream(fd, offset, length, where=where))
    elif encoding == "overwrite":
        apply_overwrite(region, lambda: FrameStream(fd, offset, length, where=where))
    else:  # pragma: no cover - the index parser admits only these
        raise FormatError(f"{where}: unknown encoding {encoding!r}")
