"""Companion files as byte-level deltas (format version 3, DELTA records):
encode a changed companion file against the base's file at the same path,
range by range, and rebuild it, streaming, with every range checked.

A target byte that no DELTA record covers is the base file's byte at the
same offset. The encoder writes a record for each run of 1 MiB blocks whose
digests differ from the base's (cut into ranges of at most RANGE_BYTES), and
keeps, per range, the smallest of its candidates (codec.filedelta). Memory
is bounded by a few ranges, whatever the file's size.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator

import numpy as np

from ..codec import filedelta as fd
from ..errors import BaseMismatchError, FormatError, IntegrityError
from ..format import records as fmt
from ..format.bundle import BundleWriter
from ..fsutil import io_error, write_all
from ..parallel import ordered_map
from ..progress import SILENT, Reporter
from ..store.hashing import BLOCK_SIZE, DIGEST_SIZE, block_digests, n_blocks

PIECE = 4 * 1024 * 1024
#: ZSTD_BASE is not tried on a range that a word codec encodes in at most
#: 1/SKIP_ZSTD_BELOW of its bytes
SKIP_ZSTD_BELOW = 32


def pread_exact(fdesc: int, offset: int, n: int, *, where: str) -> bytes:
    out = bytearray()
    while len(out) < n:
        try:
            piece = os.pread(fdesc, min(n - len(out), PIECE), offset + len(out))
        except OSError as e:
            raise io_error(where, e) from None
        if not piece:
            raise IntegrityError(f"{where}: file is shorter than expected (changed while it was read?)")
        out += piece
    return bytes(out)


def changed_ranges(a_blocks: bytes, a_size: int, b_blocks: bytes, b_size: int,
                   limit: int = fd.RANGE_BYTES) -> list[tuple[int, int]]:
    """The target ranges to encode: runs of blocks whose digest differs from
    the base block at the same index (or that the base lacks), cut at
    multiples of ``limit``."""
    na = len(a_blocks) // DIGEST_SIZE
    out: list[tuple[int, int]] = []
    run = None
    for k in range(n_blocks(b_size)):
        same = k < na and a_blocks[k * DIGEST_SIZE : (k + 1) * DIGEST_SIZE] == b_blocks[k * DIGEST_SIZE : (k + 1) * DIGEST_SIZE]
        # a partial last block of B matches only a base block of the same length
        if same and (k + 1) * BLOCK_SIZE > b_size and min(a_size, (k + 1) * BLOCK_SIZE) != b_size:
            same = False
        if not same:
            run = [k * BLOCK_SIZE, min(b_size, (k + 1) * BLOCK_SIZE)] if run is None else [run[0], min(b_size, (k + 1) * BLOCK_SIZE)]
        elif run is not None:
            out.append(tuple(run))
            run = None
    if run is not None:
        out.append(tuple(run))
    cut = []
    for lo, hi in out:
        while lo < hi:
            end = min(hi, (lo // limit + 1) * limit)
            cut.append((lo, end))
            lo = end
    # bytes past the base's end always need a record; so does a base longer
    # than the target only through the digest above (nothing to copy there)
    return cut


Candidate = tuple  # (lo, hi, word, codec, encoded, base digest)


def _best_of(base_fd: int, base_size: int, lo: int, hi: int, new: bytes, level: int, shifts, *, where: str,
             word_codec: bool = True):
    """The smallest of: a word codec at the guessed width (when the base has
    bytes [lo, hi) and ``word_codec``), then zstd against the base window
    around [lo, hi) shifted by each of ``shifts`` in turn (a window tried
    once); the earlier on a tie. Returns (word, codec, encoded, base digest)."""
    best = None
    n = hi - lo
    if word_codec and hi <= base_size:
        old = pread_exact(base_fd, lo, n, where=where)
        x = fd.encode_xor(np.frombuffer(old, dtype=np.uint8), np.frombuffer(new, dtype=np.uint8), level)
        if x is not None:
            best = (x[0], x[1].codec, x[1], fd.digest(old))
        if best is not None and best[2].size * SKIP_ZSTD_BELOW <= n:
            # a word codec left at most 1/32 of the range: the bytes moved in
            # place and nothing shifted, so zstd (a literal and a match for
            # every changed spot) cannot do better; it costs 2x the time
            return best
    tried: set[tuple[int, int]] = set()
    for shift in shifts:
        shift, margin = shift if isinstance(shift, tuple) else (shift, fd.WINDOW_BYTES)
        dlo = min(base_size, max(0, lo - shift - margin))
        dhi = min(base_size, max(dlo, hi - shift + margin))
        if (dlo, dhi) in tried:
            continue
        tried.add((dlo, dhi))
        window = pread_exact(base_fd, dlo, dhi - dlo, where=where)
        enc = fd.encode_zstd_base(window, dlo, new, level)
        if best is None or enc.size < best[2].size:
            best = (1, fd.ZSTD_BASE, enc, fd.digest(window))
    return best


def encode_range(base_fd: int, base_size: int, lo: int, hi: int, new: bytes, level: int, growth: int,
                 *, where: str, base_map=None) -> list[Candidate]:
    """The records for target bytes [lo, hi) = ``new``: one record, the
    smallest of a word codec at the guessed width (when the base has bytes
    [lo, hi)), zstd against the base window around the same offsets, and
    (when the file grew or shrank by more than the window) around the
    offsets shifted by that growth. When all of these left more than a
    quarter of the range (the bytes are not where they were: a re-save in another
    order, say) and probes of the range are found in the base within
    SEARCH_BYTES (``base_map``: the base file, mapped), windows around the
    places found are tried too, and the range is also encoded as 1 MiB
    pieces, each the smallest of the same candidates with its own probes;
    the pieces are kept when they are smaller together."""
    shifts = [0] + ([growth] if abs(growth) > fd.WINDOW_BYTES else [])
    best = _best_of(base_fd, base_size, lo, hi, new, level, shifts, where=where)
    if base_map is None or best[2].size * 4 <= hi - lo:
        return [(lo, hi, *best)]
    found = [x for x in _probe_shifts(base_map, base_size, lo, new, probes=1) if x not in shifts]
    if not found:
        return [(lo, hi, *best)]
    return _refine(base_fd, base_map, base_size, lo, hi, new, level, shifts, found, best, where=where)


def _refine(base_fd: int, base_map, base_size: int, lo: int, hi: int, new: bytes, level: int, shifts, found,
            best, *, where: str) -> list[Candidate]:
    """A poorly matched range with probe ``found`` shifts: the best of the
    range as one record with windows at those shifts too, and of its four
    quarters, each refined the same way with probes of its own (down to
    MIN_PIECE_BYTES), kept when they are smaller together. A probe's shift
    is exact, so its window has a margin of PIECE_MARGIN only."""
    n = hi - lo
    near = [(x, min(fd.WINDOW_BYTES, max(PIECE_MARGIN, n))) for x in found]
    c = _best_of(base_fd, base_size, lo, hi, new, level, near, where=where, word_codec=False)
    if best is None or c[2].size < best[2].size:
        best = c
    if best[2].size * SKIP_ZSTD_BELOW <= n or n < 4 * MIN_PIECE_BYTES:
        return [(lo, hi, *best)]
    pieces: list[Candidate] = []
    total = 0
    step = -(-n // 4)
    for plo in range(lo, hi, step):
        phi = min(hi, plo + step)
        part = new[plo - lo : phi - lo]
        mine = found + [x for x in _probe_shifts(base_map, base_size, plo, part) if x not in found + shifts]
        first = _best_of(base_fd, base_size, plo, phi, part, level, shifts, where=where)
        got = [(plo, phi, *first)] if first[2].size * SKIP_ZSTD_BELOW <= phi - plo else _refine(
            base_fd, base_map, base_size, plo, phi, part, level, shifts, mine, first, where=where)
        pieces += got
        total += sum(g[4].size + fmt.RECORD.size for g in got)
        if total >= best[2].size:
            return [(lo, hi, *best)]
    return pieces


#: the smallest piece a poorly matched range is cut into, and the margin of
#: a window around a place a probe found
MIN_PIECE_BYTES, PIECE_MARGIN = 16 * 1024, 256 * 1024


#: a range that no nearby window encodes in under half its size is searched
#: for: probes of PROBE_BYTES at PROBES places, each looked for within
#: SEARCH_BYTES on either side of its own offset in the base
PROBE_BYTES, PROBES, SEARCH_BYTES = 32, 2, 32 * 1024 * 1024


def _probe_shifts(base_map, base_size: int, lo: int, new: bytes, probes: int = PROBES) -> list[int]:
    """Shifts (target offset minus base offset) at which probes of ``new``
    (the target bytes from ``lo``, at (2k + 1)/(2 probes) of them) occur in
    the base, first occurrence each, in probe order; probes of fewer than 8
    distinct byte values (zeros, padding) are skipped: they would match
    anywhere. The pages scanned are dropped from the mapping afterwards, so
    the search holds no more memory than a window."""
    out: list[int] = []
    n = len(new)
    for k in range(probes):
        at = (2 * k + 1) * n // (2 * probes)
        probe = new[at : at + PROBE_BYTES]
        if len(probe) < PROBE_BYTES or len(set(probe)) < 8:
            continue
        t = lo + at
        start, end = max(0, t - SEARCH_BYTES), min(base_size, t + SEARCH_BYTES)
        p = base_map.find(probe, start, end)
        start &= ~(mmap.PAGESIZE - 1)
        with contextlib.suppress(OSError, ValueError):
            base_map.madvise(mmap.MADV_DONTNEED, start, end - start)
        if p >= 0 and t - p not in out:
            out.append(t - p)
    return out


#: ranges encoded at once, at most (each holds about 40 MiB while it is encoded)
MAX_THREADS = 4


def write_file_delta(w: BundleWriter, i: int, base_path: str, base_size: int, a_blocks: bytes,
                     target_path: str, target_size: int, b_blocks: bytes, level: int,
                     reporter: Reporter = SILENT, threads: int = 1) -> dict[str, tuple[int, int]]:
    """Append the DELTA records of target file ``i`` (at ``target_path``)
    against the base's file; returns {codec name: (records, bytes)}. Ranges
    are encoded on up to ``threads`` threads (at most MAX_THREADS) and
    written in order: the bytes do not depend on the thread count."""
    stats: dict[str, tuple[int, int]] = {}
    try:
        bfd = os.open(base_path, os.O_RDONLY)
    except OSError as e:
        raise io_error(base_path, e) from None
    try:
        tfd = os.open(target_path, os.O_RDONLY)
    except OSError as e:
        os.close(bfd)
        raise io_error(target_path, e) from None

    try:
        base_map = mmap.mmap(bfd, base_size, prot=mmap.PROT_READ) if base_size else None
    except OSError:  # a file system that cannot map: no search
        base_map = None

    def encode(rng: tuple[int, int]):
        lo, hi = rng
        new = pread_exact(tfd, lo, hi - lo, where=target_path)
        return [(plo, phi, word, codec, enc, base_digest, fd.digest(new[plo - lo : phi - lo]))
                for plo, phi, word, codec, enc, base_digest in encode_range(
                    bfd, base_size, lo, hi, new, level, target_size - base_size, where=base_path, base_map=base_map)]

    n = max(1, min(threads, MAX_THREADS))
    try:
        ranges = changed_ranges(a_blocks, base_size, b_blocks, target_size)
        for lo, hi, word, codec, enc, base_digest, target in (
                rec for recs in ordered_map(encode, ranges, threads=n, window=n) for rec in recs):
            rh = w.add(fmt.RecordHeader(
                type=fmt.DELTA, codec=codec, word=word, param=enc.param, file=i, lo=lo, hi=hi,
                count=enc.count, lens=(0, 0, 0), base=base_digest, target=target,
            ), enc.parts)
            name = fd.CODEC_NAMES[codec]
            r, b = stats.get(name, (0, 0))
            stats[name] = (r + 1, b + rh.payload_len + fmt.RECORD.size)
            reporter.advance(hi - lo)
    finally:
        if base_map is not None:
            base_map.close()
        os.close(bfd)
        os.close(tfd)
    return stats


class BlockHasher:
    """Block digests of bytes fed in order."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.pending = b""
        self.size = 0

    def update(self, data: bytes) -> None:
        self.size += len(data)
        data = self.pending + data if self.pending else data
        whole = len(data) - len(data) % BLOCK_SIZE
        if whole:
            self.parts.append(block_digests(memoryview(data)[:whole]))
        self.pending = bytes(data[whole:])

    def blocks(self) -> bytes:
        return b"".join(self.parts) + (block_digests(self.pending) if self.pending else b"")


def decode_record(h: fmt.RecordHeader, parts, base_fd: int, base_size: int, *, where: str) -> bytes:
    """The target bytes [h.lo, h.hi) of a DELTA record, its base bytes and
    its result checked against the record's digests."""
    n = h.hi - h.lo
    if h.codec == fd.ZSTD_BASE:
        if h.word != 1 or h.param or h.count or parts[2]:
            raise FormatError(f"{where}: malformed file delta record")
        dlo, dhi = fd.dict_range(parts[0], base_size, where=where)
        window = pread_exact(base_fd, dlo, dhi - dlo, where=where)
        if fd.digest(window) != h.base:
            raise BaseMismatchError(f"{where}: base bytes differ from the bundle's base")
        new = fd.decode_zstd_base(window, parts[1], n, where=where)
    elif h.codec in fd.XOR_CODECS:
        if h.hi > base_size:
            raise FormatError(f"{where}: file delta range lies past the base's file")
        old = pread_exact(base_fd, h.lo, n, where=where)
        if fd.digest(old) != h.base:
            raise BaseMismatchError(f"{where}: base bytes differ from the bundle's base")
        new = fd.decode_xor(h.codec, h.word, h.param, h.count, parts, old, where=where)
    else:
        raise FormatError(f"{where}: unknown file delta codec {h.codec}")
    if fd.digest(new) != h.target:
        raise IntegrityError(f"{where}: rebuilt bytes do not match the target digest")
    return new


class FileRebuild:
    """Rebuild one companion file from the base's file (``base_fd``) and its
    DELTA records, fed in order with :meth:`record`, into ``out_fd`` (or
    nowhere when it is negative: hashing only); :meth:`finish` copies the
    tail and returns the block digests of what was produced."""

    def __init__(self, base_fd: int, base_size: int, target_size: int, out_fd: int, *, where: str,
                 reporter: Reporter = SILENT) -> None:
        self.base_fd, self.base_size, self.size = base_fd, base_size, target_size
        self.out_fd, self.where, self.reporter = out_fd, where, reporter
        self.pos = 0
        self.hasher = BlockHasher()

    def _emit(self, data: bytes) -> None:
        if self.out_fd >= 0:
            try:
                write_all(self.out_fd, data, self.pos)
            except OSError as e:
                raise io_error(self.where, e) from None
        self.hasher.update(data)
        self.pos += len(data)
        self.reporter.advance(len(data))

    def _copy_to(self, end: int) -> None:
        if end > max(self.pos, self.base_size):
            raise FormatError(f"{self.where}: bytes [{max(self.pos, self.base_size)}, {end}) are in no record "
                              "and past the base's file")
        while self.pos < end:
            self._emit(pread_exact(self.base_fd, self.pos, min(PIECE, end - self.pos), where=self.where))

    def record(self, h: fmt.RecordHeader, parts, *, where: str) -> None:
        if h.lo < self.pos or h.hi > self.size or h.hi <= h.lo:
            raise FormatError(f"{where}: file delta range out of order or out of bounds")
        self._copy_to(h.lo)
        self._emit(decode_record(h, parts, self.base_fd, self.base_size, where=where))

    def finish(self) -> bytes:
        self._copy_to(self.size)
        return self.hasher.blocks()


def rebuild_file(base_path: str, base_size: int, target_size: int, records: Iterator, out_fd: int, *,
                 where: str, reporter: Reporter = SILENT) -> bytes:
    """Rebuild a file from ``records`` ((header, parts) pairs in order)."""
    try:
        bfd = os.open(base_path, os.O_RDONLY)
    except OSError as e:
        raise io_error(base_path, e) from None
    try:
        if os.fstat(bfd).st_size != base_size:
            raise BaseMismatchError(f"{where}: the base's file is not {base_size} bytes")
        rb = FileRebuild(bfd, base_size, target_size, out_fd, where=where, reporter=reporter)
        for h, parts in records:
            rb.record(h, parts, where=where)
        return rb.finish()
    finally:
        os.close(bfd)
