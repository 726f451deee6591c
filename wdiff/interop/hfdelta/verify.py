"""Checking a written version against wdiff's digests before it becomes
visible. The version is read back from where it was written, as a reader
would read it (the same parser and frame decoder as ``pull --layout
hf-delta``), replayed onto the previous version, and every file it changes
must come out with the digest the chain gives that file in the new
version; a full version's files must have the new version's fingerprint.
"""

from __future__ import annotations

import os

from ...errors import IntegrityError
from ...paths import printable
from ...store import manifest
from ...store.checkpoint import KIND_TENSORS, Checkpoint, read_header, read_into, scan
from ...store.hashing import block_digests, file_digest_from_blocks, hexd
from ...store.ignore import DEFAULT_RULES
from ...store.version_record import Record
from .frames import CHUNK
from .layout import INDEX, LEDGER, Ledger, check_shard, parse_index
from .replay import Delta, Staged, replay


def read_delta(folder: str, *, where: str) -> tuple[Delta, object]:
    """The delta version in ``folder``, parsed and checked as a reader does."""
    with open(os.path.join(folder, INDEX), "rb") as f:
        ix = parse_index(f.read(), where=f"{where}/{INDEX}")
    if ix is None:
        raise IntegrityError(f"{where}: the index written is not a delta's")
    frames = {}
    for shard, names in ix.shards().items():
        path = os.path.join(folder, shard)
        header = read_header(path, os.path.getsize(path), where=f"{where}/{shard}")
        for name, fr in check_shard(header, names, ix.checksum, where=f"{where}/{shard}").items():
            frames[name] = (path, fr)
    return Delta(where, ix.encoding, ix.checksum, frames), ix


def _blocks(fd: int, offset: int, n: int, where: str) -> bytes:
    out = []
    buf = bytearray(min(CHUNK, n))
    for off in range(0, n, CHUNK):
        k = min(CHUNK, n - off)
        mv = memoryview(buf)[:k]
        read_into(fd, offset + off, mv, where=where)
        out.append(block_digests(mv))
    return b"".join(out)


def check_delta(folder: str, A: Checkpoint, ra: Record, rb: Record, ledger: Ledger, *, version: str, base: str,
                stage: str) -> None:
    """The delta in ``folder`` turns A (at ``ra``) into the version ``rb``
    records, file for file, by wdiff's digests."""
    where = printable(folder)
    delta, ix = read_delta(folder, where=where)
    if (ix.version, ix.base_version) != (version, base):
        raise IntegrityError(f"{where}: the index names {ix.version} from {ix.base_version}, not {version} from {base}")
    _check_ledger(folder, ledger)
    old = {r.path: r.digest for r in ra.files}
    want = {r.path: r.digest for r in rb.files if old.get(r.path) != r.digest}
    with Staged(stage) as st:
        replay(delta, A, st)
        touched = {A.tensors[name][0].path for name in st.at}
        if touched != set(want):
            raise IntegrityError(f"{where}: the delta changes {sorted(touched)}, the new version {sorted(want)}")
        for path in sorted(want):
            f = A.file(path)
            blocks = []
            with open(f.abspath, "rb") as src:
                for t in f.header.tensors:
                    if t.name in st.at:
                        off, n = st.at[t.name]
                        blocks.append(_blocks(st.fd, off, n, st.path))
                    else:
                        blocks.append(_blocks(src.fileno(), f.header.data_start + t.start, t.nbytes, f.abspath))
            got = file_digest_from_blocks(KIND_TENSORS, f.header.raw, blocks)
            if got != want[path]:
                raise IntegrityError(f"{where}: replayed onto the previous version, {printable(path)} comes out "
                                     f"{hexd(got)[:16]}, not the new version's {hexd(want[path])[:16]}")
    os.unlink(stage)


def check_full(folder: str, rb: Record, ledger: Ledger | None, *, threads: int) -> None:
    """The checkpoint in ``folder`` is the version ``rb`` records (its
    fingerprint, from every byte read now); with a ledger, that one too."""
    ckpt = scan(folder, rules=DEFAULT_RULES.tracking(rb.paths))
    got = manifest.compute(ckpt, threads=threads).fingerprint
    if got != rb.version or [f.path for f in ckpt.files] != [r.path for r in rb.files]:
        raise IntegrityError(f"{printable(folder)}: the full version written is {hexd(got)[:16]}, "
                             f"not {hexd(rb.version)[:16]}")
    if ledger is not None:
        _check_ledger(folder, ledger)


def _check_ledger(folder: str, ledger: Ledger) -> None:
    with open(os.path.join(folder, LEDGER), "rb") as f:
        if Ledger.decode(f.read(), where=folder) != ledger:
            raise IntegrityError(f"{printable(folder)}: the ledger written is not the version's")
