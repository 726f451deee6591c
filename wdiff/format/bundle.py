"""Bundle files: a streaming writer and a verifying reader.

The writer appends records as they are produced and writes the index and
footer last, into a temp file that is fsynced and renamed into place, so a
bundle on disk is always complete. The reader checks the preamble, footer and
index digest when it opens a bundle, and every record's digest, the chain of
record digests and the record order when it streams the records.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import xxhash
import zstandard

from ..codec.chunk import CODEC_VERSION, ZSTD, compressor, decompress_exact, decompressor
from ..defaults import DEFAULT_LEVEL
from ..errors import FormatError, IntegrityError, NotFoundError, UsageError
from ..fsutil import clear_dead_temps, fsync_dir, io_error, open_regular, temp_name, write_all
from ..progress import SILENT, Reporter
from ..store.hashing import DIGEST_SIZE
from ..store.header import MAX_HEADER_BYTES
from . import records as fmt

ZERO = b"\0" * DIGEST_SIZE
STREAM_PIECE = 4 * 1024 * 1024


def index_level(raw_size: int) -> int:
    """The zstd level of an index of ``raw_size`` bytes. An index is mostly
    digests: level 19 saves a tenth over level 3, which matters little and
    costs 35x the time (0.42 vs 0.012 s for the 700 KB index of 20,000
    tensors), so it is used only on small ones."""
    return 19 if raw_size <= 128 * 1024 else 3


class BundleWriter:
    """Write a bundle to ``path`` atomically. Use as a context manager; call
    :meth:`finish` to commit, anything else leaves no file behind."""

    def __init__(self, path: str, *, level: int = DEFAULT_LEVEL, version: int = fmt.VERSION) -> None:
        self.path = os.fspath(path)
        self.version = version
        self.level = level
        clear_dead_temps(self.path)  # the partial bundles of killed writers of this path
        self._tmp = temp_name(self.path)
        try:
            self._fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as e:
            raise io_error(self.path, e) from None
        self._pos = 0
        self._chain = xxhash.xxh3_128()
        self.count = 0
        try:
            self._write(fmt.pack_preamble(version))
        except BaseException:  # a full disk, Ctrl-C: no temp left behind (no `with` owns it yet)
            self.abort()
            raise

    def _write(self, data) -> None:
        try:
            write_all(self._fd, data, self._pos)
        except OSError as e:
            raise io_error(self.path, e) from None
        self._pos += len(memoryview(data).cast("B"))

    def add(self, header: fmt.RecordHeader, parts: tuple[bytes, ...]) -> fmt.RecordHeader:
        """Append a record whose payload is in memory."""
        lens = tuple(len(p) for p in parts) + (0,) * (3 - len(parts))
        header = _with(header, lens=lens)
        h = xxhash.xxh3_128()
        for p in parts:
            h.update(p)
        header = _with(header, digest=fmt.record_digest(h, header))
        self._write(header.pack())
        for p in parts:
            self._write(p)
        self._done(header)
        return header

    def add_stream(self, header: fmt.RecordHeader, reader, size: int) -> fmt.RecordHeader:
        """Append a FILE record by compressing ``size`` bytes read from the
        binary stream ``reader``, without holding them in memory."""
        start = self._pos
        self._write(b"\0" * fmt.RECORD.size)  # placeholder, rewritten below
        h = xxhash.xxh3_128()
        sink = _Sink(self, h)
        cobj = compressor(self.level).stream_writer(sink, size=size, closefd=False)
        left = size
        while left:
            piece = reader.read(min(STREAM_PIECE, left))
            if not piece:
                raise IntegrityError(f"{self.path}: input file shrank while it was being packed")
            cobj.write(piece)
            left -= len(piece)
        cobj.flush(1)  # zstandard.FLUSH_FRAME
        header = _with(header, codec=ZSTD, lens=(sink.written, 0, 0))
        header = _with(header, digest=fmt.record_digest(h, header))
        try:
            write_all(self._fd, header.pack(), start)
        except OSError as e:
            raise io_error(self.path, e) from None
        self._done(header)
        return header

    def raise_version(self, version: int) -> None:
        """Write the bundle as format ``version`` after all (at least the one
        it was opened with): a writer learns that a companion file needs
        DELTA records only once it has hashed it, and that a codec v2
        record is the smallest only once it has encoded it. The preamble is in no
        digest; the index, written last, carries the same version."""
        if version > self.version:
            self.version = version
            try:
                write_all(self._fd, fmt.pack_preamble(version), 0)
            except OSError as e:
                raise io_error(self.path, e) from None

    def _done(self, header: fmt.RecordHeader) -> None:
        self._chain.update(header.digest)
        self.count += 1

    @property
    def records_bytes(self) -> int:
        return self._pos - fmt.PREAMBLE.size

    @property
    def records_digest(self) -> bytes:
        return self._chain.digest()

    def finish(self, index: fmt.Index) -> bytes:
        """Write index and footer, fsync, rename into place. Returns the
        bundle id (the index digest)."""
        raw = index.encode()
        packed = compressor(index_level(len(raw))).compress(raw)
        digest = xxhash.xxh3_128_digest(packed)
        offset = self._pos
        self._write(packed)
        self._write(fmt.Footer(offset, len(packed), len(raw), digest).pack())
        try:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
            os.replace(self._tmp, self.path)
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        except OSError as e:
            raise io_error(self.path, e) from None
        return digest

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(OSError):
            os.unlink(self._tmp)

    def __enter__(self) -> BundleWriter:
        return self

    def __exit__(self, *exc) -> None:
        if self._fd >= 0:
            self.abort()


class _Sink:
    """File-like target for zstd's stream writer: hashes and appends."""

    def __init__(self, writer: BundleWriter, h) -> None:
        self.w, self.h, self.written = writer, h, 0

    def write(self, data) -> int:
        self.h.update(data)
        self.w._write(data)
        self.written += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def _with(h: fmt.RecordHeader, **kw) -> fmt.RecordHeader:
    d = {s: getattr(h, s) for s in fmt.RecordHeader.__slots__}
    d.update(kw)
    return fmt.RecordHeader(**d)


# -- reading -----------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    header: fmt.RecordHeader
    offset: int  # of the payload in the bundle file
    index: int  # position in the record stream
    payload: tuple[bytes, ...] | None  # None for FILE records (read with open_stream)


class BundleReader:
    """Open a bundle and check its frame: preamble, footer, index digest and
    index consistency. Records are checked as :meth:`records` streams them."""

    def __init__(self, path: str, *, file=None) -> None:
        """Open the bundle at ``path``; or, with ``file`` (an open binary file
        that :meth:`open_file` returned), read that file, ``path`` naming it
        in messages: every check made on ``file`` then holds for what is
        read through it, whatever happens to the name meanwhile. The reader
        owns ``file`` and closes it."""
        self.path = os.fspath(path)
        where = self.path
        self._f = file if file is not None else self.open_file(self.path)
        try:
            self.size = os.fstat(self._f.fileno()).st_size
            version = fmt.check_preamble(self._read_at(0, fmt.PREAMBLE.size), where=where)
            if self.size < fmt.PREAMBLE.size + fmt.FOOTER.size:
                raise FormatError(f"{where}: truncated bundle")
            footer = fmt.unpack_footer(
                self._read_at(self.size - fmt.FOOTER.size, fmt.FOOTER.size), self.size, where=where
            )
            packed = self._read_at(footer.index_offset, footer.index_len)
            if xxhash.xxh3_128_digest(packed) != footer.index_digest:
                raise IntegrityError(f"{where}: bundle index is corrupt (digest mismatch)")
            self.id = footer.index_digest
            self.index = fmt.decode_index(
                decompress_exact(packed, footer.index_raw_len, where=f"{where}: index"), where=where
            )
            if self.index.version != version:
                raise FormatError(f"{where}: preamble and index disagree on the format version")
            if self.index.records_bytes != footer.index_offset - fmt.PREAMBLE.size:
                raise FormatError(f"{where}: index and footer disagree on the record area")
        except BaseException:
            self._f.close()
            raise
        self.records_end = footer.index_offset

    @staticmethod
    def open_file(path: str):
        """Open a bundle file for reading: a regular file (a FIFO or a device
        is refused at once, never waited on)."""
        if os.path.isdir(path):
            # a mistake of the caller's, not of the disk: the commands' usage
            # says which argument is the bundle file
            raise UsageError(f"{path}: is a directory, not a bundle file",
                             hint="a bundle is the file `wdiff pack -o FILE` writes")
        try:
            return open_regular(path, what=f"{path}: bundle")
        except FileNotFoundError:
            raise NotFoundError(f"{path}: no such bundle") from None
        except OSError as e:
            raise io_error(path, e) from None

    def _read_at(self, offset: int, n: int) -> bytes:
        try:
            self._f.seek(offset)
            data = self._f.read(n)
        except OSError as e:
            raise io_error(self.path, e) from None
        if len(data) != n:
            raise FormatError(f"{self.path}: truncated bundle")
        return data

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> BundleReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def records(self) -> Iterator[Record]:
        """Stream the records in order, verifying each in-memory payload's
        digest before yielding it, the order rules, and at the end the chain
        digest and count. FILE payloads are verified by :meth:`open_stream`."""
        index = self.index
        pos = fmt.PREAMBLE.size
        chain = xxhash.xxh3_128()
        last: tuple[int, int, int] = (-1, -1, 0)  # file, type order, end of last chunk
        windows = (-1, 0)  # file, window bytes its ZSTD_BASE records have named so far
        n = 0
        seen_payload: set[int] = set()
        while pos < self.records_end:
            where = f"{self.path}: record {n}"
            if n >= index.records_count:
                raise FormatError(f"{where}: more records than the index lists")
            h = fmt.unpack_record(self._read_at(pos, fmt.RECORD.size), where=where)
            pos += fmt.RECORD.size
            last = _check_order(index, h, last, seen_payload, where)
            if pos + h.payload_len > self.records_end:
                raise FormatError(f"{where}: payload runs past the record area")
            payload = None
            if h.type != fmt.FILE:
                parts = []
                hasher = xxhash.xxh3_128()
                off = pos
                for ln in h.lens:
                    data = self._read_at(off, ln) if ln else b""
                    hasher.update(data)
                    parts.append(data)
                    off += ln
                if fmt.record_digest(hasher, h) != h.digest:
                    raise IntegrityError(f"{where}: record is corrupt (digest mismatch)")
                payload = tuple(parts)
                if h.type == fmt.DELTA:
                    windows = _check_windows(h, payload[0], windows, where)
            chain.update(h.digest)
            yield Record(h, pos, n, payload)
            pos += h.payload_len
            n += 1
        if n != index.records_count or chain.digest() != index.records_digest:
            raise IntegrityError(f"{self.path}: record stream does not match the index (spliced or truncated)")
        missing = [i for i, f in enumerate(index.files) if f.source == "bundle" and i not in seen_payload]
        if missing:
            raise FormatError(f"{self.path}: no data for target file {index.files[missing[0]].path!r}")

    def check_file_payload(self, rec: Record) -> None:
        """Read a FILE record's payload through to its digest check."""
        for _ in self.file_payload(rec, verify_only=True):
            pass

    def file_payload(self, rec: Record, *, verify_only: bool = False) -> Iterator[bytes]:
        """Stream the decompressed content of a FILE record in pieces,
        checking the record digest once the payload has been read. The caller
        must discard what it wrote if this raises at the end."""
        h = rec.header
        where = f"{self.path}: record {rec.index}"
        size = h.hi
        try:
            declared = zstandard.get_frame_parameters(self._read_at(rec.offset, min(18, h.lens[0]))).content_size
        except zstandard.ZstdError:
            raise FormatError(f"{where}: not a zstd frame") from None
        if declared != size:
            raise FormatError(f"{where}: compressed data declares {declared} bytes, expected {size}")
        src = _HashingSource(self, rec.offset, rec.offset + h.lens[0])
        produced = 0
        try:
            rd = decompressor().stream_reader(src, read_across_frames=True)
            while produced < size:
                piece = rd.read(min(STREAM_PIECE, size - produced))
                if not piece:
                    break
                produced += len(piece)
                if not verify_only:
                    yield piece
            extra = rd.read(1)
        except zstandard.ZstdError as e:
            raise FormatError(f"{where}: corrupt compressed data ({e})") from None
        src.drain()  # hash what the decompressor left unread, so the digest covers it all
        if fmt.record_digest(src.hasher, h) != h.digest:
            raise IntegrityError(f"{where}: record is corrupt (digest mismatch)")
        if produced != size or extra:
            raise FormatError(f"{where}: file data does not hold exactly {size} bytes")


class _HashingSource:
    """A byte range of a bundle as a file-like object for zstd's stream
    reader, hashing everything it hands out."""

    def __init__(self, reader: BundleReader, start: int, end: int) -> None:
        self.reader, self.pos, self.end = reader, start, end
        self.hasher = xxhash.xxh3_128()

    def read(self, n: int = -1) -> bytes:
        n = min(n if n >= 0 else STREAM_PIECE, self.end - self.pos)
        if n <= 0:
            return b""
        data = self.reader._read_at(self.pos, n)
        self.pos += n
        self.hasher.update(data)
        return data

    def drain(self) -> None:
        while self.read(STREAM_PIECE):
            pass


def decode_header_record(rec: Record, *, where: str) -> bytes:
    """The raw safetensors header a HEADER record carries (checked by _check_order)."""
    return decompress_exact(rec.payload[0], rec.header.hi, where=where)


def _check_order(index: fmt.Index, h: fmt.RecordHeader, last, seen: set[int], where: str):
    """Records come file by file in index order; a tensor file's HEADER record
    (when its header is in the bundle) comes first, then its CHUNK records by
    offset, without overlap; a companion file has exactly one FILE record."""
    if h.file >= len(index.files):
        raise FormatError(f"{where}: refers to a file the index does not list")
    f = index.files[h.file]
    lf, lt, lend = last
    if h.file < lf:
        raise FormatError(f"{where}: records out of order")
    if h.type in (fmt.FILE, fmt.HEADER) and (h.word != 1 or h.param or h.count or h.base != ZERO or h.codec != ZSTD):
        raise FormatError(f"{where}: malformed {fmt.RECORD_TYPES[h.type]} record")
    if h.type == fmt.FILE:
        if f.kind != "file" or f.source != "bundle" or h.file in seen or h.lo != 0 or h.hi != f.size or h.target != f.digest:
            raise FormatError(f"{where}: unexpected file record")
        if h.payload_len > 2 * f.size + 65536 or h.lens[1] or h.lens[2] or h.codec != ZSTD:
            raise FormatError(f"{where}: malformed file record")
        seen.add(h.file)
        return (h.file, 2, 0)
    if h.type == fmt.DELTA:
        return _check_delta(index, f, h, last, where)
    if f.kind != "safetensors":
        raise FormatError(f"{where}: tensor record for a companion file")
    if h.type == fmt.HEADER:
        if f.source != "bundle" or h.file in seen or h.lo != 0 or h.hi != f.header_size or h.target != f.header_digest:
            raise FormatError(f"{where}: unexpected header record")
        if h.hi > MAX_HEADER_BYTES + 8 or h.payload_len > 2 * h.hi + 65536 or h.lens[1] or h.lens[2]:
            raise FormatError(f"{where}: malformed header record")
        seen.add(h.file)
        return (h.file, 0, 0)
    # CHUNK
    if h.codec == ZSTD or CODEC_VERSION.get(h.codec, fmt.MAX_VERSION + 1) > index.version:
        raise FormatError(f"{where}: chunk record with codec {h.codec}, which format version {index.version} does not have")
    if f.source == "bundle" and h.file not in seen:
        raise FormatError(f"{where}: chunk record before its file's header")
    start = lend if h.file == lf else 0
    if h.lo < start or h.hi <= h.lo or h.hi > f.data_len or h.hi - h.lo > fmt.MAX_CHUNK_BYTES:
        raise FormatError(f"{where}: chunk range out of order or out of bounds")
    if (h.hi - h.lo) % h.word or h.payload_len > 2 * (h.hi - h.lo) + 65536:
        raise FormatError(f"{where}: malformed chunk record")
    return (h.file, 1, h.hi)


def _check_delta(index: fmt.Index, f: fmt.TargetFile, h: fmt.RecordHeader, last, where: str):
    """DELTA records (version 3): ranges of a companion file with source
    "delta", by offset, without overlap, each at most MAX_CHUNK_BYTES; an
    XOR codec's range lies within the base's file (its size is the base
    listing's) and is whole words."""
    from ..codec import filedelta

    lf, _lt, lend = last
    if index.version < fmt.FILE_DELTAS or f.kind != "file" or f.source != "delta":
        raise FormatError(f"{where}: unexpected file delta record")
    start = lend if h.file == lf else 0
    if h.lo < start or h.hi <= h.lo or h.hi > f.size or h.hi - h.lo > fmt.MAX_CHUNK_BYTES:
        raise FormatError(f"{where}: file delta range out of order or out of bounds")
    if h.codec not in filedelta.CODECS or h.payload_len > 2 * (h.hi - h.lo) + 65536:
        raise FormatError(f"{where}: malformed file delta record")
    if h.codec == filedelta.ZSTD_BASE:
        if h.word != 1 or h.param or h.count or h.lens[0] != filedelta.DICT_RANGE.size or h.lens[2]:
            raise FormatError(f"{where}: malformed file delta record")
    else:
        base_size = index.base_size_of.get(f.path, 0)
        if h.hi > base_size or (h.hi - h.lo) % h.word:
            raise FormatError(f"{where}: file delta range lies past the base's file or splits a word")
    return (h.file, 3, h.hi)


def _check_windows(h: fmt.RecordHeader, section0: bytes, windows: tuple[int, int], where: str):
    """The window budget of DELTA records (version 3): the windows a file's
    ZSTD_BASE records name, up to any of them, sum to at most
    WINDOW_FACTOR times its hi. Checked as the records are read, so that
    a bundle that would make a reader re-read its base without end is
    refused before any of it is applied (FileRebuild checks it again where
    the windows are read)."""
    from ..codec import filedelta

    spent = windows[1] if windows[0] == h.file else 0
    if h.codec != filedelta.ZSTD_BASE:
        return (h.file, spent)
    dlo, dhi = filedelta.DICT_RANGE.unpack(section0)  # 16 bytes: _check_delta saw len0
    spent += max(0, dhi - dlo)
    if spent > filedelta.window_budget(h.hi):
        raise FormatError(
            f"{where}: file delta windows name {spent} base bytes up to offset {h.hi}, more than "
            f"{filedelta.WINDOW_FACTOR} times that (records that re-read the base file without end; a bundle "
            f"packed before format 3.1 can break this budget: pack it again)")
    return (h.file, spent)


def check_records(reader: BundleReader, reporter: Reporter = SILENT) -> None:
    """Read every record once so that nothing corrupt is ever published."""
    reporter.phase("verify bundle", reader.size)
    for rec in reader.records():
        if rec.payload is None:
            reader.check_file_payload(rec)
        reporter.advance(rec.header.payload_len)


def reading(bundle) -> BundleReader:
    """A reader for ``bundle``: a path is opened; a :class:`BundleReader`
    (one whose signature was checked on its open file, say) is used as it
    is. Either way the reader is closed when the ``with`` block ends."""
    return bundle if isinstance(bundle, BundleReader) else BundleReader(bundle)


# -- a bundle read piece by piece (a remote one, say) ---------------------------


@dataclass(frozen=True)
class Located:
    """A record found by :func:`walk_headers`: its header and where its
    payload starts in the bundle."""

    header: fmt.RecordHeader
    offset: int
    index: int


def read_frame(read_at, size: int, *, where: str) -> tuple[bytes, fmt.Index]:
    """The id and the checked index of a bundle of ``size`` bytes that is read
    through ``read_at(offset, n) -> bytes``: preamble, footer, index digest,
    index consistency, as :class:`BundleReader` checks them."""
    if size < fmt.PREAMBLE.size + fmt.FOOTER.size:
        raise FormatError(f"{where}: truncated bundle")
    version = fmt.check_preamble(read_at(0, fmt.PREAMBLE.size), where=where)
    footer = fmt.unpack_footer(read_at(size - fmt.FOOTER.size, fmt.FOOTER.size), size, where=where)
    packed = read_at(footer.index_offset, footer.index_len)
    if xxhash.xxh3_128_digest(packed) != footer.index_digest:
        raise IntegrityError(f"{where}: bundle index is corrupt (digest mismatch)")
    index = fmt.decode_index(decompress_exact(packed, footer.index_raw_len, where=f"{where}: index"), where=where)
    if index.version != version:
        raise FormatError(f"{where}: preamble and index disagree on the format version")
    if index.records_bytes != footer.index_offset - fmt.PREAMBLE.size:
        raise FormatError(f"{where}: index and footer disagree on the record area")
    return footer.index_digest, index


def walk_headers(read_at, index: fmt.Index, *, where: str) -> list[Located]:
    """Every record header of a bundle whose index is ``index``, read
    through ``read_at`` without its payload, with the order and bounds rules
    and, at the end, the count and the chain digest checked: each header's
    digest is then the bundle's, and a payload read later is proved by it."""
    end = fmt.PREAMBLE.size + index.records_bytes
    pos = fmt.PREAMBLE.size
    chain = xxhash.xxh3_128()
    last: tuple[int, int, int] = (-1, -1, 0)
    seen: set[int] = set()
    out: list[Located] = []
    while pos < end:
        w = f"{where}: record {len(out)}"
        if len(out) >= index.records_count:
            raise FormatError(f"{w}: more records than the index lists")
        h = fmt.unpack_record(read_at(pos, fmt.RECORD.size), where=w)
        pos += fmt.RECORD.size
        last = _check_order(index, h, last, seen, w)
        if pos + h.payload_len > end:
            raise FormatError(f"{w}: payload runs past the record area")
        chain.update(h.digest)
        out.append(Located(h, pos, len(out)))
        pos += h.payload_len
    if len(out) != index.records_count or chain.digest() != index.records_digest:
        raise IntegrityError(f"{where}: record stream does not match the index (spliced or truncated)")
    return out


def read_payload(read_at, rec: Located, *, where: str) -> tuple[bytes, bytes, bytes]:
    """The payload sections of a located record, checked against its digest."""
    h = rec.header
    data = read_at(rec.offset, h.payload_len) if h.payload_len else b""
    hasher = xxhash.xxh3_128()
    hasher.update(data)
    if len(data) != h.payload_len or fmt.record_digest(hasher, h) != h.digest:
        raise IntegrityError(f"{where}: record {rec.index} is corrupt (digest mismatch)")
    a, b = h.lens[0], h.lens[0] + h.lens[1]
    return data[:a], data[a:b], data[b:]
