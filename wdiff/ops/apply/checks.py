"""The checks an apply makes before it writes anything and after: the base's
file list, every record and header of the bundle, and every tensor of the
result against the target digests."""

from __future__ import annotations

import xxhash

from ...errors import BaseMismatchError, FormatError, IntegrityError, UsageError, WdiffError
from ...format import records as fmt
from ...format.bundle import BundleReader, Record, decode_header_record
from ...paths import printable
from ...progress import SILENT, Reporter
from ...store import manifest
from ...store.checkpoint import KIND_TENSORS, Checkpoint, bare_name, is_file_arg, scan, scope_of
from ...store.digests import Digests
from ...store.hashing import hexd, tree
from ...store.header import Header, parse_header
from ...store.ignore import DEFAULT_RULES, Rules
from ...store.units import FileLayout


def _refuse_clashes(index: fmt.Index, A: Checkpoint) -> None:
    """In place, a target file must not land on a file left out here."""
    targets = {f.path for f in index.files}
    for path in A.excluded:
        if path.rstrip("/") in targets or (path.endswith("/") and any(t.startswith(path) for t in targets)):
            raise UsageError(
                f"{A.root}: {printable(path)} is left out of the checkpoint here, but the bundle's target has it",
                hint=f"--include {printable(path.rstrip('/'))} makes it part of the base, or move it away",
            )


def check_base_listing(index: fmt.Index, base, *, rules: Rules = DEFAULT_RULES, in_place: bool = False,
                       replace=frozenset(), over: bool = False) -> Checkpoint | None:
    """Scan the base and compare its file list with the bundle's record of
    its base: a cheap first refusal before any byte is read. Files the
    ignore ``rules`` leave out are not part of the base (trainer state
    beside the weights), unless the bundle's base lists them; ``in_place``,
    a target file that would land on such a file is refused, not written.
    Files in ``replace`` are discarded, whatever they hold (or whether they
    exist); with ``over``, an anchor is applied over whatever files are here."""
    if index.base_fingerprint is None:
        if base is not None:
            A = scan(base, rules=rules)
            if in_place:
                _refuse_clashes(index, A)
            if A.files and not over:
                raise BaseMismatchError(
                    "this bundle is a full anchor: it builds a checkpoint from nothing and takes no base",
                    hint="apply it without a base directory",
                )
        return None
    if base is None:
        raise UsageError(
            f"this bundle needs its base checkpoint (fingerprint {hexd(index.base_fingerprint)[:16]})"
        )
    # a single file is the bundle's one base file, whatever its name here
    name = index.base_files[0].path if is_file_arg(base) and len(index.base_files) == 1 else None
    A = scan(base, rules=rules, keep=frozenset(r.path for r in index.base_files), name=name)
    if in_place:
        _refuse_clashes(index, A)
    want = {r.path: r for r in index.base_files}
    have = {f.path: f for f in A.files}
    for path, r in want.items():
        if path in replace:
            continue
        f = have.get(path)
        if f is None:
            raise BaseMismatchError(f"{A.root}: lacks {printable(path)}, which the bundle's base has")
        if f.kind != r.kind or f.size != r.size:
            raise BaseMismatchError(f"{A.root}: {printable(path)} differs from the bundle's base ({f.size} bytes, expected {r.size})")
    for path in have:
        if path not in want and path not in replace:
            raise BaseMismatchError(f"{A.root}: has {printable(path)}, which the bundle's base does not")
    return A


def verify_bundle(
    reader: BundleReader, A: Checkpoint | None, *, reporter: Reporter = SILENT, records: list | None = None,
    coverage: bool = True,
) -> dict[int, Header]:
    """Read the whole bundle once: every record digest, the record order, the
    chain digest; parse and check every target header. Nothing is written.
    ``A`` needs only ``A.file(path).header``. With ``records``, the headers
    of CHUNK and FILE records are appended to it (payloads are not kept).
    With ``coverage`` (``A`` a Checkpoint or None), also check that records
    and base sources cover every byte of every target tensor file."""
    index = reader.index
    reporter.phase("verify bundle", reader.size)
    headers: dict[int, Header] = {}
    chunks: dict[int, list[tuple[int, int]]] = {}  # file -> data ranges its CHUNK records cover, in order
    for rec in reader.records():
        h = rec.header
        where = f"{reader.path}: record {rec.index}"
        if records is not None and h.type != fmt.HEADER:
            records.append(Record(h, rec.offset, rec.index, None))
        if h.type == fmt.CHUNK:
            chunks.setdefault(h.file, []).append((h.lo, h.hi))
        elif h.type == fmt.FILE:
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
    # names are unique within a directory (version 2) or across the whole
    # target (version 1): headers hold qualified names, unique in both cases
    scoped = index.version >= fmt.SCOPED_NAMES
    seen: dict[str, str] = {}
    for i, header in sorted(headers.items()):
        path = index.files[i].path
        for t in header.tensors:
            key = t.name if scoped else bare_name(path, t.name)
            other = seen.setdefault(key, path)
            if other != path:
                raise FormatError(f"{reader.path}: target tensor {printable(key)} appears in two files")
    if coverage:
        _check_coverage(index, headers, chunks, A, where=reader.path)
    return headers


def _check_coverage(index: fmt.Index, headers: dict[int, Header], chunks: dict[int, list[tuple[int, int]]],
                    A: Checkpoint | None, *, where: str) -> None:
    """Every byte of every target tensor file's data region is covered by a
    CHUNK record or by a base source (a tensor of the same name, dtype and
    shape in the base). Checked from the headers before any output is
    created, so a size no record fills is refused (4), never preallocated.
    (The record reader has checked that ranges are in order and within
    data_len; parse_header that the header describes a file of ``size``.)"""
    scoped = index.version >= fmt.SCOPED_NAMES
    for i, f in enumerate(index.files):
        if f.kind != KIND_TENSORS:
            continue
        base = A.base_tensors_for(f.path, scoped) if A else {}
        layout = FileLayout(headers[i], base)
        at = f"{where}: {printable(f.path)}"
        pos = 0
        for lo, hi in chunks.get(i, ()):
            if lo > pos:
                layout.check_gap(pos, lo, where=at)
            pos = hi
        if f.data_len > pos:
            layout.check_gap(pos, f.data_len, where=at)


def judge_base_mismatch(e: BaseMismatchError, index: fmt.Index, A: Checkpoint | None, *,
                        threads: int, fingerprint: bytes | None = None) -> WdiffError:
    """The error to raise for a claim of the bundle about its base that the
    base did not bear out (a base header, a chunk's base digest, a base
    file). Exit 5 says the base is another version; that is so only when
    the base's fingerprint is not base.fingerprint. When it is, the base is
    the bundle's base and the bundle contradicts it: an inconsistent
    bundle, exit 4. ``fingerprint``: the base's, when already computed.
    Hashes the whole base, on this refusal path only."""
    if A is None or index.base_fingerprint is None:
        return e
    if fingerprint is None:
        try:
            fingerprint = manifest.compute(A, threads=threads).fingerprint
        except WdiffError:
            return e  # the base cannot even be read as it was scanned: not the bundle's base
    if fingerprint != index.base_fingerprint:
        return e
    return IntegrityError(f"{e.message}; the base's fingerprint is the bundle's base, so the bundle is "
                          "inconsistent with itself", hint=e.hint)


def _parse_target_header(raw: bytes, f: fmt.TargetFile, where: str) -> Header:
    if len(raw) != f.header_size:
        raise FormatError(f"{where}: header of {printable(f.path)} has the wrong size")
    header = parse_header(raw, f.size, where=f"{where}: {printable(f.path)}").scoped(scope_of(f.path))
    if len(header.tensors) != len(f.tensor_digests):
        raise FormatError(f"{where}: {printable(f.path)} lists {len(f.tensor_digests)} tensor digests for {len(header.tensors)} tensors")
    return header


def check_target_digests(index: fmt.Index, headers: dict[int, Header], dt: Digests, *, only) -> None:
    for i, f in enumerate(index.files):
        if f.kind != KIND_TENSORS or i not in only:
            continue
        for t, want in zip(headers[i].tensors, f.tensor_digests):
            got = tree(bytes(dt.tensors.get(t.name, b""))) if t.nbytes else tree(b"")
            if got != want:
                raise IntegrityError(f"{printable(f.path)}: tensor {printable(t.name)} does not match the target digest")
