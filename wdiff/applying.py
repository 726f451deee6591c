"""``apply``: rebuild the target checkpoint from a base and a bundle.

Copy mode builds the target in a hidden temp directory beside OUT, checks
every tensor and file against the target digests and the base against the
base fingerprint, fsyncs, and only then renames the directory into place. A
crash or refusal leaves OUT as it was. In-place mode lives in inplace.py.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator
from dataclasses import dataclass

import xxhash

from . import format as fmt
from . import manifest
from .blockio import FdCache, known_digests, read_base, scratch, span_digests
from .bundle import ZERO, BundleReader, Record, decode_header_record
from .checkpoint import KIND_TENSORS, Checkpoint, scan
from .codecs import RAW, decode_into
from .dtypes import uint_type
from .errors import BaseMismatchError, FormatError, IntegrityError, UsageError
from .fsutil import fsync_dir, io_error, remove_tree, temp_name, write_all
from .hashing import hexd, tree
from .header import Header, parse_header
from .parallel import default_threads, ordered_map
from .paths import printable
from .plan import DEFAULT_CHUNK, FileLayout, Unit
from .progress import SILENT, Reporter

SCHEMA = "wdiff.apply/1"


@dataclass(frozen=True)
class ApplyResult:
    output: str
    bundle_id: bytes
    base_fingerprint: bytes | None
    target_fingerprint: bytes
    files: int
    bytes_written: int
    in_place: bool = False
    resumed: bool = False

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "output": self.output,
            "bundle_id": hexd(self.bundle_id),
            "base_fingerprint": hexd(self.base_fingerprint) if self.base_fingerprint else None,
            "target_fingerprint": hexd(self.target_fingerprint),
            "files": self.files,
            "bytes_written": self.bytes_written,
            "in_place": self.in_place,
            "resumed": self.resumed,
        }


def apply(
    bundle,
    base=None,
    out=None,
    *,
    in_place: bool = False,
    abort: bool = False,
    trusted_keys: list | None = None,
    require_signature: bool = False,
    threads: int | None = None,
    reporter: Reporter = SILENT,
) -> ApplyResult:
    """Apply ``bundle`` to the checkpoint ``base``: into a new directory
    ``out``, or with ``in_place=True`` inside ``base`` itself. With trusted
    keys (given, or in WDIFF_TRUSTED_KEYS), ``bundle.minisig`` must be a valid
    signature of the bundle by one of them."""
    threads = threads or default_threads()
    from . import signing

    keys = signing.required_keys(trusted_keys, require_signature)
    if keys and not abort:
        signing.verify_file(os.fspath(bundle), os.fspath(bundle) + signing.SUFFIX, keys)
    if in_place:
        if out is not None:
            raise UsageError("give either an output directory or --in-place, not both")
        if base is None:
            raise UsageError("--in-place needs the checkpoint directory to update")
        from .inplace import apply_in_place

        return apply_in_place(bundle, base, abort=abort, threads=threads, reporter=reporter)
    if abort:
        raise UsageError("--abort only makes sense with --in-place")
    if out is None:
        raise UsageError("give an output directory (-o OUT) or --in-place")
    out = os.fspath(out)
    _check_out(out, base)
    with BundleReader(bundle) as reader:
        A = check_base_listing(reader.index, base)
        headers = verify_bundle(reader, A, reporter=reporter)
        tmp = temp_name(os.path.abspath(out).rstrip("/"), "tmp")
        try:
            os.mkdir(tmp)
        except OSError as e:
            raise io_error(tmp, e) from None
        try:
            outputs = {i: os.path.join(tmp, f.path) for i, f in enumerate(reader.index.files)}
            written, produced = build(reader, A, headers, outputs, threads=threads, reporter=reporter)
            fsync_tree(tmp)
            if os.path.isdir(out):
                os.rmdir(out)  # empty, checked above; fails loudly if that changed
            os.rename(tmp, out)
            fsync_dir(os.path.dirname(os.path.abspath(out)))
        except OSError as e:
            remove_tree(tmp)
            raise io_error(out, e) from None
        except BaseException:
            remove_tree(tmp)
            raise
    manifest.remember(scan(out, reuse=A), produced)  # the next step's base is hashed already
    reporter.done()
    return ApplyResult(
        output=out,
        bundle_id=reader.id,
        base_fingerprint=reader.index.base_fingerprint,
        target_fingerprint=reader.index.target_fingerprint,
        files=len(reader.index.files),
        bytes_written=written,
    )


def _check_out(out: str, base) -> None:
    if os.path.lexists(out):
        if not os.path.isdir(out) or os.path.islink(out) or os.listdir(out):
            raise UsageError(f"{out}: already exists and is not an empty directory", hint="choose a new output path")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise UsageError(f"{parent}: no such directory")
    if base is not None:
        b = os.path.abspath(os.fspath(base))
        o = os.path.abspath(out)
        if o == b or o.startswith(b + os.sep):
            raise UsageError("the output directory must not be inside the base checkpoint; use --in-place")


def check_base_listing(index: fmt.Index, base) -> Checkpoint | None:
    """Scan the base and compare its file list with the bundle's record of
    its base: a cheap first refusal before any byte is read."""
    if index.base_fingerprint is None:
        if base is not None:
            A = scan(base)
            if A.files:
                raise BaseMismatchError(
                    "this bundle is a full anchor: it builds a checkpoint from nothing and takes no base",
                    hint="apply it without a base directory",
                )
        return None
    if base is None:
        raise UsageError(
            f"this bundle needs its base checkpoint (fingerprint {hexd(index.base_fingerprint)[:16]})"
        )
    A = scan(base)
    want = {r.path: r for r in index.base_files}
    have = {f.path: f for f in A.files}
    for path, r in want.items():
        f = have.get(path)
        if f is None:
            raise BaseMismatchError(f"{A.root}: lacks {printable(path)}, which the bundle's base has")
        if f.kind != r.kind or f.size != r.size:
            raise BaseMismatchError(f"{A.root}: {printable(path)} differs from the bundle's base ({f.size} bytes, expected {r.size})")
    for path in have:
        if path not in want:
            raise BaseMismatchError(f"{A.root}: has {printable(path)}, which the bundle's base does not")
    return A


def verify_bundle(
    reader: BundleReader, A: Checkpoint | None, *, reporter: Reporter = SILENT, records: list | None = None
) -> dict[int, Header]:
    """Read the whole bundle once: every record digest, the record order, the
    chain digest; parse and check every target header. Nothing is written.
    ``A`` needs only ``A.file(path).header``. With ``records``, the headers
    of CHUNK and FILE records are appended to it (payloads are not kept)."""
    index = reader.index
    reporter.phase("verify bundle", reader.size)
    headers: dict[int, Header] = {}
    for rec in reader.records():
        h = rec.header
        where = f"{reader.path}: record {rec.index}"
        if records is not None and h.type != fmt.HEADER:
            records.append(Record(h, rec.offset, rec.index, None))
        if h.type == fmt.FILE:
            reader.check_file_payload(rec)
        elif h.type == fmt.HEADER:
            f = index.files[h.file]
            raw = decode_header_record(rec, where=where)
            if xxhash.xxh3_128_digest(raw) != f.header_digest:
                raise IntegrityError(f"{where}: header of {printable(f.path)} does not match its digest")
            headers[h.file] = _parse_target_header(raw, f, where)
        reporter.advance(fmt.RECORD.size + h.payload_len)
    for i, f in enumerate(index.files):
        if f.kind == KIND_TENSORS and f.source == "base":
            old = A.file(f.path) if A else None
            if old is None or old.header is None or xxhash.xxh3_128_digest(old.header.raw) != f.header_digest:
                raise BaseMismatchError(f"{printable(f.path)}: the base's header is not the one the bundle expects")
            headers[i] = _parse_target_header(old.header.raw, f, reader.path)
    seen: dict[str, str] = {}
    for i, header in sorted(headers.items()):
        for t in header.tensors:
            other = seen.setdefault(t.name, index.files[i].path)
            if other != index.files[i].path:
                raise FormatError(f"{reader.path}: target tensor {printable(t.name)} appears in two files")
    return headers


def _parse_target_header(raw: bytes, f: fmt.TargetFile, where: str) -> Header:
    if len(raw) != f.header_size:
        raise FormatError(f"{where}: header of {printable(f.path)} has the wrong size")
    header = parse_header(raw, f.size, where=f"{where}: {printable(f.path)}")
    if len(header.tensors) != len(f.tensor_digests):
        raise FormatError(f"{where}: {printable(f.path)} lists {len(f.tensor_digests)} tensor digests for {len(header.tensors)} tensors")
    return header


def _unit_work(reader: BundleReader, index: fmt.Index, headers: dict[int, Header], A, on_file) -> Iterator:
    """The work of the data pass in order: (file index, layout, unit, record)
    items for tensor data. Companion files are handled by ``on_file``
    inline, in order, since they stream from the bundle."""
    base_tensors = A.tensors if A else {}
    layouts: dict[int, FileLayout] = {}
    done_upto: dict[int, int] = {}
    records = reader.records()

    def gaps(i: int, upto: int):
        lay = layouts[i]
        start = done_upto.get(i, 0)
        if upto > start:
            yield from ((i, lay, u, None) for u in lay.gap_units(start, upto, DEFAULT_CHUNK, where=f"{index.files[i].path}"))
        done_upto[i] = upto

    file_iter = iter(range(len(index.files)))
    current = -1

    def advance_to(i: int):
        nonlocal current
        while current < i:
            if current >= 0 and index.files[current].kind == KIND_TENSORS:
                yield from gaps(current, index.files[current].data_len)
            current = next(file_iter)
            f = index.files[current]
            if f.kind == KIND_TENSORS:
                layouts[current] = FileLayout(headers[current], base_tensors)
                yield ("open", current)
            elif f.source == "base":
                on_file(current, None)

    for rec in records:
        h = rec.header
        yield from advance_to(h.file)
        if h.type == fmt.FILE:
            on_file(h.file, rec)
        elif h.type == fmt.CHUNK:
            where = f"{reader.path}: record {rec.index}"
            yield from gaps(h.file, h.lo)
            lay = layouts[h.file]
            unit = lay.record_unit(h.lo, h.hi, h.word, delta=h.codec != RAW, where=where)
            based = {s.base is not None for s in unit.spans}
            if len(based) != 1 or (h.base != ZERO) != (True in based):
                raise FormatError(f"{where}: base digest does not match the tensors the chunk covers")
            done_upto[h.file] = h.hi
            yield (h.file, lay, unit, rec)
    yield from advance_to(len(index.files) - 1)
    if current >= 0 and index.files[current].kind == KIND_TENSORS:
        yield from gaps(current, index.files[current].data_len)


def apply_unit(
    fds: FdCache, out_fd: int, data_start: int, unit: Unit, rec: Record | None, *, where: str, known_a: dict | None = None
):
    """Produce one unit of the target: base bytes, patched by ``rec`` if any;
    check base and target chunk digests; write at its offset in ``out_fd``
    (or nowhere when ``out_fd`` is negative). Returns the digests. The base
    digests of a patched unit come from the manifest cache (``known_a``)
    when it holds them; every byte written is hashed."""
    buf = scratch("b", unit.nbytes)
    a_dig = None
    if unit.spans[0].base is not None:
        read_base(fds, unit, buf)
        # bytes copied as they are must be hashed (they are the target);
        # bytes about to be patched are checked by the cache's digests, and
        # the patched result is hashed below
        a_dig = known_digests(unit, known_a, base=True) if known_a and rec is not None else None
        if a_dig is None:
            a_dig = span_digests(unit, buf)
    if rec is None:
        t_dig = a_dig
    else:
        h = rec.header
        if a_dig is not None and tree(b"".join(a_dig)) != h.base:
            raise BaseMismatchError(
                f"{where}: base bytes of {printable(unit.spans[0].tensor.name)} differ from the bundle's base"
            )
        decode_into(h.codec, h.param, h.count, list(rec.payload), buf.view(uint_type(unit.word)), where=where)
        t_dig = span_digests(unit, buf)
        if tree(b"".join(t_dig)) != h.target:
            raise IntegrityError(f"{where}: rebuilt bytes of {printable(unit.spans[0].tensor.name)} do not match the target digest")
    if out_fd >= 0:
        try:
            write_all(out_fd, buf, data_start + unit.lo)
        except OSError as e:
            raise io_error(where, e) from None
    return unit, a_dig, t_dig


def build(
    reader: BundleReader,
    A: Checkpoint | None,
    headers: dict[int, Header],
    outputs: dict[int, str],
    *,
    threads: int,
    reporter: Reporter,
    check_base: bool = True,
) -> tuple[int, manifest.Digests]:
    """Write the target files named in ``outputs`` (file index -> path) and
    verify each against the target digests; with ``check_base``, also check
    the base against the bundle's base fingerprint. Returns the bytes written
    and the block digests of what was written."""
    index = reader.index
    da, dt = manifest.Digests(), manifest.Digests()
    out_fds: dict[int, int] = {}
    written = 0
    reporter.phase("apply", sum(index.files[i].size for i in outputs))

    def open_out(i: int) -> int:
        path = outputs[i]
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as e:
            raise io_error(path, e) from None

    def on_file(i: int, rec: Record | None) -> None:
        nonlocal written
        if i not in outputs:
            return
        f = index.files[i]
        fd = open_out(i)
        try:
            if rec is None:
                old = A.file(f.path) if A else None
                if old is None or old.kind == KIND_TENSORS:
                    raise BaseMismatchError(f"{printable(f.path)}: the base lacks this file")
                blocks = manifest.hash_file(old.abspath, old.size, reporter=reporter, copy_to=fd)
                da.files[f.path] = blocks
            else:
                blocks = _write_stream(reader.file_payload(rec), fd, reporter)
            dt.files[f.path] = blocks
            if tree(blocks) != f.digest:
                raise IntegrityError(f"{printable(f.path)}: content does not match the target digest")
            os.fsync(fd)
        finally:
            os.close(fd)
        written += f.size

    known_a = manifest.cached_tensors(A) if A is not None else manifest.Known()
    with FdCache() as fds:
        try:

            def work(item):
                if item[0] == "open":
                    return item
                i, lay, unit, rec = item
                where = f"{reader.path}: {printable(index.files[i].path)}"
                return (i,) + apply_unit(fds, out_fds[i], lay.header.data_start, unit, rec, where=where, known_a=known_a)

            def items():
                for item in _unit_work(reader, index, headers, A, on_file):
                    if (item[1] if item[0] == "open" else item[0]) not in outputs:
                        continue
                    if item[0] == "open":
                        i = item[1]
                        fd = out_fds[i] = open_out(i)
                        f = index.files[i]
                        _preallocate(fd, f.size, f.path)
                        write_all(fd, headers[i].raw, 0)
                    yield item

            # results arrive in file order: once file i's successor shows up,
            # file i is complete and its fsync can overlap the remaining work
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="wdiff-sync") as syncer:
                synced: list = []
                current = None
                for res in ordered_map(work, items(), threads=threads):
                    i = res[1] if res[0] == "open" else res[0]
                    if current is not None and i != current:
                        synced.append(syncer.submit(os.fsync, out_fds[current]))
                    current = i
                    if res[0] == "open":
                        continue
                    _, unit, a_dig, t_dig = res
                    if a_dig is not None:
                        da.put_unit(unit, a_dig, base=True)
                    dt.put_unit(unit, t_dig)
                    reporter.advance(unit.nbytes)
                if current is not None:
                    synced.append(syncer.submit(os.fsync, out_fds[current]))
                for f in synced:
                    f.result()
            written += sum(index.files[i].size for i in out_fds)
        finally:
            for fd in out_fds.values():
                os.close(fd)
    check_target_digests(index, headers, dt, only=outputs)
    if A is not None and check_base:
        reporter.phase("check base", None)
        fp = manifest.complete(A, da, threads=threads, cached=known_a.paths).fingerprint
        if fp != index.base_fingerprint:
            raise BaseMismatchError(
                f"{A.root}: fingerprint {hexd(fp)[:16]} is not the bundle's base {hexd(index.base_fingerprint)[:16]}"
            )
    return written, dt


def check_target_digests(index: fmt.Index, headers: dict[int, Header], dt: manifest.Digests, *, only) -> None:
    for i, f in enumerate(index.files):
        if f.kind != KIND_TENSORS or i not in only:
            continue
        for t, want in zip(headers[i].tensors, f.tensor_digests):
            got = tree(bytes(dt.tensors.get(t.name, b""))) if t.nbytes else tree(b"")
            if got != want:
                raise IntegrityError(f"{printable(f.path)}: tensor {printable(t.name)} does not match the target digest")


def _preallocate(fd: int, size: int, path: str) -> None:
    """Reserve the space now, so a full disk fails before any work is done."""
    try:
        os.posix_fallocate(fd, 0, size) if size else None
    except OSError as e:
        if e.errno in (95, 22):  # EOPNOTSUPP / EINVAL: file system cannot; truncate instead
            os.ftruncate(fd, size)
        else:
            raise io_error(path, e) from None


def _write_stream(pieces, fd: int, reporter: Reporter) -> bytes:
    """Write decompressed pieces and return the block digests of the whole."""
    from .hashing import BLOCK_SIZE, block_digests

    parts = []
    pending = b""
    off = 0
    for piece in pieces:
        write_all(fd, piece, off)
        off += len(piece)
        reporter.advance(len(piece))
        data = pending + piece
        whole = len(data) - len(data) % BLOCK_SIZE
        parts.append(block_digests(data[:whole]))
        pending = data[whole:]
    if pending:
        parts.append(block_digests(pending))
    return b"".join(parts)


def fsync_tree(root: str) -> None:
    for dirpath, _dirs, _files in os.walk(root, topdown=False):
        fsync_dir(dirpath)

