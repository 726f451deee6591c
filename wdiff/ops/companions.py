"""Companion files as byte-level deltas (format version 3, DELTA records):
encode a changed companion file against the base's file at the same path,
range by range, and rebuild it, streaming, with every range checked.

A target byte that no DELTA record covers is the base file's byte at the
same offset. The encoder writes a record for each run of 1 MiB blocks whose
digests differ from the base's (cut into ranges of at most RANGE_BYTES), and
keeps, per range, the smallest of its candidates (codec.filedelta); a range
whose bytes are not where they were is looked up in an index of the whole
base file (BaseIndex) and cut where their source moves. Memory is bounded
by a few ranges and the index (at most 48 MiB), whatever the file's size.
"""

from __future__ import annotations

import os
import threading
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
    """Exactly ``n`` bytes of the file from ``offset``. A regular file gives
    them in one read, copied once into the bytes returned (growing a buffer
    piece by piece and copying it out took three copies: 100 ms for a 64 MiB
    window against 40); a short read (a signal) is continued, and the end of
    the file before ``n`` bytes is an error."""
    parts: list[bytes] = []
    got = 0
    while got < n:
        try:
            # at most the largest window a DELTA record may name in one read
            piece = os.pread(fdesc, min(n - got, fd.MAX_DICT_BYTES), offset + got)
        except OSError as e:
            raise io_error(where, e) from None
        if not piece:
            raise IntegrityError(f"{where}: file is shorter than expected (changed while it was read?)")
        parts.append(piece)
        got += len(piece)
    return parts[0] if len(parts) == 1 else b"".join(parts)


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
             word_codec: bool = True, word=None, cap: int = fd.MAX_DICT_BYTES):
    """The smallest of: a word codec at the guessed width (when the base has
    bytes [lo, hi) and ``word_codec``), then zstd against the base window
    around [lo, hi) shifted by each of ``shifts`` in turn (a window tried
    once); the earlier on a tie. Returns (word, codec, encoded, base digest).
    ``word``: the word codec's candidate, already encoded (it is not again).
    ``cap``: the most bytes a window around [lo, hi) may hold (the file's
    window budget): its margins are cut to fit."""
    best = word
    n = hi - lo
    if word is not None:
        if best[2].size * SKIP_ZSTD_BELOW <= n:
            return best
    elif word_codec and hi <= base_size:
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
        if isinstance(shift, tuple):  # ("at", dlo, dhi): a window found by BaseIndex
            dlo, dhi = shift[1], shift[2]
        else:
            margin = max(0, min(fd.WINDOW_BYTES, (cap - (hi - lo)) // 2))
            dlo = min(base_size, max(0, lo - shift - margin))
            dhi = min(base_size, max(dlo, hi - shift + margin), dlo + cap)
        if (dlo, dhi) in tried:
            continue
        tried.add((dlo, dhi))
        window = pread_exact(base_fd, dlo, dhi - dlo, where=where)
        enc = fd.encode_zstd_base(window, dlo, new, level)
        if best is None or enc.size < best[2].size:
            best = (1, fd.ZSTD_BASE, enc, fd.digest(window))
    return best


def encode_range(base_fd: int, base_size: int, lo: int, hi: int, new: bytes, level: int, growth: int,
                 *, where: str, index: BaseIndex | None = None, prev_hi: int = 0) -> list[Candidate]:
    """The records for target bytes [lo, hi) = ``new``: one record, the
    smallest of a word codec at the guessed width (when the base has bytes
    [lo, hi)), zstd against the base window around the same offsets, and
    (when the file grew or shrank by more than the window) around the
    offsets shifted by that growth. When the word codec leaves more than a
    quarter of the range (the bytes are not where they were: a re-save in
    another order, say), the range is first looked up in ``index`` (the whole
    base file's content keys, see BaseIndex): it is cut where the place its
    bytes come from changes (at the byte that best separates the two
    sources) into pieces, grouped into records whose windows cover the
    places found. Those records are kept when they are smaller together
    than the single record (whose zstd windows are not tried when the
    records found take at most a quarter of the range).

    The file's window budget (codec.filedelta.window_budget) is kept range
    by range: ``prev_hi`` is the end of the file's previous range (0 for
    the first), and the windows of this range's records, up to any of them,
    name at most window_budget(its hi - prev_hi) bytes. The budget of each
    range is thus known before any is encoded, and the bytes do not depend
    on the order the ranges are encoded in."""
    shifts = [0] + ([growth] if abs(growth) > fd.WINDOW_BYTES else [])
    n = hi - lo
    cap = min(fd.MAX_DICT_BYTES, fd.window_budget(hi - prev_hi))
    word = _best_of(base_fd, base_size, lo, hi, new, level, [], where=where) if hi <= base_size else None
    if word is not None and word[2].size * 4 <= n:
        # in place: the bytes did not move (zstd is tried unless the word codec left 1/32)
        return [(lo, hi, *_best_of(base_fd, base_size, lo, hi, new, level, shifts, where=where, word=word,
                                   cap=cap))]
    found: list[Candidate] = []
    total = 0
    if index is not None:
        groups = _located(base_fd, base_size, lo, hi, new, index.get(), where=where, prev_hi=prev_hi)
        spent = 0
        for glo, ghi, (slo, shi) in groups:
            spent += shi - slo
            if spent > fd.window_budget(ghi - prev_hi):
                # _located keeps the budget, so this does not happen; were it
                # to, the range would be one record rather than a refused bundle
                groups = []
                break
        for glo, ghi, (slo, shi) in groups:
            c = _best_of(base_fd, base_size, glo, ghi, new[glo - lo : ghi - lo], level, [("at", slo, shi)],
                         where=where, word_codec=False)
            found.append((glo, ghi, *c))
            total += c[2].size + fmt.RECORD.size
    if found and total * 4 <= n:
        # the places found explain the range: windows nearby cannot do much better
        best = word
    else:
        best = _best_of(base_fd, base_size, lo, hi, new, level, shifts, where=where, word=word,
                        word_codec=word is not None, cap=cap)
    if found and (best is None or total < best[2].size + fmt.RECORD.size):
        return found
    return [(lo, hi, *best)]


#: a record's window: the base bytes its pieces come from, with this margin
#: on each side, at most GROUP_SPAN bytes in all (zstandard indexes at most
#: 16 MiB less 2 bytes of a dictionary at the fast levels)
LOCATE_MARGIN, GROUP_SPAN = 64 * 1024, 16 * 1024 * 1024 - 64 * 1024


class BaseIndex:
    """Content keys of the base file, built once per file on first use, in
    bounded memory: the key (codec.filedelta.keys_at) of the KEY_BYTES bytes
    at each multiple of ``step`` bytes (4 KiB, doubled until there are at
    most MAX_KEYS of them), constant runs left out, as sorted numpy arrays
    (the first offset for a key seen more than once): 16 bytes per entry,
    at most 32 MiB, plus a 16 MiB filter, whatever the file's size.

    A target sample of ``step`` consecutive offsets, hashed at every offset,
    meets each place its bytes may come from at exactly one offset."""

    MAX_KEYS = 1 << 21
    FILTER_BITS = 24

    def __init__(self, base_fd: int, base_size: int, *, where: str) -> None:
        self.fd, self.size, self.where = base_fd, base_size, where
        self.step = 4096
        while base_size // self.step > self.MAX_KEYS:
            self.step *= 2
        self._lock = threading.Lock()
        self._built = False

    def get(self) -> BaseIndex:
        with self._lock:
            if not self._built:
                self._build()
                self._built = True
        return self

    def _build(self) -> None:
        step, keys, offs = self.step, [], []
        piece = max(step, PIECE // step * step)
        for at in range(0, self.size - fd.KEY_BYTES + 1, piece):
            n = min(piece, self.size - at)
            buf = np.frombuffer(pread_exact(self.fd, at, n, where=self.where), dtype=np.uint8)
            k = (n - fd.KEY_BYTES) // step + 1
            rows = np.lib.stride_tricks.as_strided(buf, (k, fd.KEY_BYTES), (step, 1))
            keep = ~fd.constant_rows(rows)
            keys.append(fd.keys_at(rows[keep]))
            offs.append(at + np.flatnonzero(keep).astype(np.uint64) * step)
        key = np.concatenate(keys) if keys else np.empty(0, np.uint64)
        off = np.concatenate(offs) if offs else np.empty(0, np.uint64)
        order = np.lexsort((off, key))
        key, off = key[order], off[order]
        first = np.ones(key.size, dtype=bool)
        first[1:] = key[1:] != key[:-1]
        self.keys, self.offs = key[first], off[first]
        self.filter = np.zeros(1 << self.FILTER_BITS, dtype=bool)
        self.filter[self.keys >> np.uint64(64 - self.FILTER_BITS)] = True

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions in ``keys``, base offsets) of the keys the base has."""
        cand = np.flatnonzero(self.filter[keys >> np.uint64(64 - self.FILTER_BITS)])
        if not cand.size:
            return cand, cand.astype(np.uint64)
        k = keys[cand]
        j = np.minimum(np.searchsorted(self.keys, k), self.keys.size - 1)
        hit = self.keys[j] == k
        return cand[hit], self.offs[j[hit]]


def _located(base_fd: int, base_size: int, lo: int, hi: int, new: bytes, index: BaseIndex, *,
             where: str, prev_hi: int = 0) -> list[tuple[int, int, tuple[int, int]]]:
    """Target [lo, hi) cut into groups (glo, ghi, (slo, shi)): the base
    window [slo, shi) its bytes come from, as found by samples of
    ``index.step`` offsets every 8 steps and at the range's end; [] when no
    sample is found."""
    t = np.frombuffer(new, dtype=np.uint8)
    step = index.step
    every = 8 * step
    shifts: list[tuple[int, int]] = []  # (target offset of the sample, shift = target - base)
    prev = None
    starts = list(range(0, t.size - fd.KEY_BYTES + 1, every))
    end = max(0, t.size - step - fd.KEY_BYTES + 1)  # the range's last bytes too
    if starts and starts[-1] < end:
        starts.append(end)
    for s in starts:
        window = t[s : s + step + fd.KEY_BYTES - 1]
        keys = fd.rolling_keys(window)
        pos, offs = index.lookup(keys)
        found = []
        for j, o in zip(pos.tolist(), offs.tolist()):
            if t[s + j : s + j + fd.KEY_BYTES].tobytes() == pread_exact(base_fd, o, fd.KEY_BYTES, where=where):
                found.append(lo + s + j - o)
        if not found:
            continue
        d = prev if prev in found else found[0]
        shifts.append((s, d))
        prev = d
    if not shifts:
        return []
    # pieces of one shift, cut between samples of different shifts at the
    # byte that best separates them
    pieces: list[list[int]] = []  # [start, end, shift], relative to lo
    last = 0
    for s, d in shifts:
        if pieces and pieces[-1][2] == d:
            last = s
            continue
        if not pieces:
            pieces.append([0, t.size, d])
        else:
            c = _cut(base_fd, base_size, lo, t, max(last, pieces[-1][0]), min(t.size, s + step), pieces[-1][2], d,
                     where=where)
            pieces[-1][1] = c
            pieces.append([c, t.size, d])
        last = s
    # group pieces while the union of their windows stays small and the
    # windows so far keep the file's window budget (see encode_range)
    groups: list[tuple[int, int, tuple[int, int]]] = []
    spent = 0  # window bytes of this range's groups, the open one's included
    for p in pieces:
        a, b, d = p
        if b <= a:
            continue
        end = lo + b
        slo = max(0, min(base_size, lo + a - d - LOCATE_MARGIN))
        shi = max(slo, min(base_size, end - d + LOCATE_MARGIN))
        if groups:
            glo, _, (plo, phi) = groups[-1]
            ulo, uhi = min(plo, slo), max(phi, shi)
            before = spent - (phi - plo)
            if (uhi - ulo <= GROUP_SPAN and end - glo <= fd.RANGE_BYTES
                    and before + uhi - ulo <= fd.window_budget(end - prev_hi)):
                groups[-1] = (glo, end, (ulo, uhi))
                spent = before + uhi - ulo
                continue
        # a group of its own: its window is at most GROUP_SPAN (a long piece)
        # and what the budget leaves, narrowed around the start of the source
        keep = max(0, min(GROUP_SPAN, fd.window_budget(end - prev_hi) - spent))
        if shi - slo > keep:
            src_lo = max(0, min(base_size, lo + a - d))
            src_hi = max(src_lo, min(base_size, end - d))
            margin = max(0, min(LOCATE_MARGIN, (keep - (src_hi - src_lo)) // 2))
            slo = max(0, src_lo - margin)
            shi = min(base_size, slo + keep)
        groups.append((lo + a, end, (slo, shi)))
        spent += shi - slo
    return groups


def _cut(base_fd: int, base_size: int, lo: int, t: np.ndarray, a: int, b: int, d0: int, d1: int, *,
         where: str) -> int:
    """The offset c in [a, b] (relative to lo) that makes the most target
    bytes of [a, c) equal to the base's at shift d0 and of [c, b) at d1."""
    n = b - a
    if n <= 0:
        return b

    def eq(d: int) -> np.ndarray:
        blo, bhi = lo + a - d, lo + b - d
        out = np.zeros(n, dtype=bool)
        clo, chi = max(0, blo), min(base_size, bhi)
        if chi > clo:
            old = np.frombuffer(pread_exact(base_fd, clo, chi - clo, where=where), dtype=np.uint8)
            out[clo - blo : chi - blo] = old == t[a + clo - blo : a + chi - blo]
        return out

    e0, e1 = eq(d0), eq(d1)
    # score(c) = sum(e0[:c]) + sum(e1[c:]); the first best c
    score = np.concatenate(([0], np.cumsum(e0.astype(np.int64) - e1)))
    return a + int(np.argmax(score))


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

    index = BaseIndex(bfd, base_size, where=base_path) if base_size >= fd.KEY_BYTES else None

    def encode(job: tuple[int, int, int]):
        lo, hi, prev_hi = job
        new = pread_exact(tfd, lo, hi - lo, where=target_path)
        return [(plo, phi, word, codec, enc, base_digest, fd.digest(new[plo - lo : phi - lo]))
                for plo, phi, word, codec, enc, base_digest in encode_range(
                    bfd, base_size, lo, hi, new, level, target_size - base_size, where=base_path, index=index,
                    prev_hi=prev_hi)]

    n = max(1, min(threads, MAX_THREADS))
    try:
        ranges = changed_ranges(a_blocks, base_size, b_blocks, target_size)
        # each range with the end of the one before it (its window budget)
        jobs = [(lo, hi, ranges[k - 1][1] if k else 0) for k, (lo, hi) in enumerate(ranges)]
        for lo, hi, word, codec, enc, base_digest, target in (
                rec for recs in ordered_map(encode, jobs, threads=n, window=n) for rec in recs):
            rh = w.add(fmt.RecordHeader(
                type=fmt.DELTA, codec=codec, word=word, param=enc.param, file=i, lo=lo, hi=hi,
                count=enc.count, lens=(0, 0, 0), base=base_digest, target=target,
            ), enc.parts)
            name = fd.CODEC_NAMES[codec]
            r, b = stats.get(name, (0, 0))
            stats[name] = (r + 1, b + rh.payload_len + fmt.RECORD.size)
            reporter.advance(hi - lo)
    finally:
        os.close(bfd)
        os.close(tfd)
    return stats


class BlockHasher:
    """Block digests of bytes fed in order. Each byte is copied at most once
    (into the partial block): joining the partial block to every piece fed
    copied up to a block per piece, so one-byte DELTA records cost 0.25 ms
    each, most of a reader's time per record."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.pending = bytearray()
        self.size = 0

    def update(self, data) -> None:
        self.size += len(data)
        mv = memoryview(data).cast("B")
        if self.pending:
            take = min(len(mv), BLOCK_SIZE - len(self.pending))
            self.pending += mv[:take]
            mv = mv[take:]
            if len(self.pending) < BLOCK_SIZE:
                return
            self.parts.append(block_digests(self.pending))
            self.pending = bytearray()
        whole = len(mv) - len(mv) % BLOCK_SIZE
        if whole:
            self.parts.append(block_digests(mv[:whole]))
        self.pending += mv[whole:]

    def blocks(self) -> bytes:
        return b"".join(self.parts) + (block_digests(self.pending) if self.pending else b"")


def decode_record(h: fmt.RecordHeader, parts, base_fd: int, base_size: int, *, where: str,
                  window_spent: int = 0) -> tuple[bytes, int]:
    """The target bytes [h.lo, h.hi) of a DELTA record, its base bytes and
    its result checked against the record's digests, and the window bytes
    the file's records have named so far (``window_spent`` before this
    one): a ZSTD_BASE record that would take them past the file's window
    budget (codec.filedelta.window_budget) is refused before its window is
    read."""
    n = h.hi - h.lo
    if h.codec == fd.ZSTD_BASE:
        if h.word != 1 or h.param or h.count or parts[2]:
            raise FormatError(f"{where}: malformed file delta record")
        dlo, dhi = fd.dict_range(parts[0], base_size, where=where)
        window_spent += dhi - dlo
        if window_spent > fd.window_budget(h.hi):
            raise FormatError(
                f"{where}: file delta windows name {window_spent} base bytes up to offset {h.hi}, more than "
                f"{fd.WINDOW_FACTOR} times that (records that re-read the base file without end)")
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
    return new, window_spent


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
        #: window bytes the file's ZSTD_BASE records have named so far
        self.window_bytes = 0

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
        new, self.window_bytes = decode_record(h, parts, self.base_fd, self.base_size, where=where,
                                               window_spent=self.window_bytes)
        self._emit(new)

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
