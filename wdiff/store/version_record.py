"""``DIR/.wdiff/state.json``: which version a directory was brought to by
the last pull or in-place apply, and which files belong to that version
(path, kind, size and digest, as the target's manifest lists them).

The record is input, like everything in ``DIR/.wdiff``: it is reached
through wdiff.statedir only and validated strictly when read (every path a
plain relative path outside the reserved directories, in order, no
duplicates, and the fingerprint of its rows equal to the version it names).
It only *narrows* what counts as DIR's checkpoint: a file it does not list
is untracked (kept, never read into the fingerprint); a file it lists is
still read and checked against digests before anything rests on it, and
the only files a pull removes because of it are files it lists.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..errors import FormatError, IntegrityError
from ..paths import printable, validate_relpath
from ..statedir import StateDir
from .checkpoint import KIND_FILE, KIND_TENSORS, MAX_FILES, path_sort_key
from .hashing import fingerprint, hexd

NAME = "state.json"
SCHEMA = "wdiff-state/1"  # a file format (like "wdiff-chain"), not a command document
#: far more than MAX_FILES rows need
LIMIT = 64 * 1024 * 1024
_HEX32 = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class Row:
    path: str
    kind: str
    size: int
    digest: bytes


@dataclass(frozen=True)
class Record:
    version: bytes
    files: tuple[Row, ...]  # in path order

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(r.path for r in self.files)

    def row(self, path: str) -> Row | None:
        return next((r for r in self.files if r.path == path), None)

    def encode(self) -> bytes:
        doc = {
            "schema": SCHEMA,
            "version": hexd(self.version),
            "files": [{"path": r.path, "kind": r.kind, "size": r.size, "digest": hexd(r.digest)} for r in self.files],
        }
        return json.dumps(doc, indent=1).encode("utf-8") + b"\n"


def of_rows(rows) -> Record:
    """The record of a version listed as ``(path, kind, size, digest)`` rows."""
    files = tuple(sorted((Row(p, k, s, d) for p, k, s, d in rows), key=lambda r: path_sort_key(r.path)))
    return Record(fingerprint((r.path, r.kind, r.size, r.digest) for r in files), files)


def read(state: StateDir) -> Record | None:
    """The record of the directory whose state directory is ``state``; None
    when there is none. Anything else than a record wdiff wrote is refused."""
    raw = state.read(NAME, limit=LIMIT)
    if raw is None:
        return None
    return decode(raw, where=state.where(NAME))


def write(state: StateDir, record: Record) -> None:
    state.atomic_write(NAME, record.encode())


def forget(state: StateDir) -> None:
    state.unlink(NAME)


def decode(raw: bytes, *, where: str) -> Record:
    def bad(why: str) -> IntegrityError:
        return IntegrityError(f"{where}: {why}; it is not a record wdiff wrote",
                              hint="remove it if you trust the directory (a pull then treats every file as part "
                                   "of the checkpoint), then run the command again")

    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise bad("not valid JSON") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or set(doc) != {"schema", "version", "files"}:
        raise bad(f"not a {SCHEMA} document")
    version, files = doc["version"], doc["files"]
    if not isinstance(version, str) or not _HEX32.fullmatch(version):
        raise bad("the version is not a fingerprint")
    if not isinstance(files, list) or len(files) > MAX_FILES:
        raise bad("the file list is not a list of at most %d files" % MAX_FILES)
    rows: list[Row] = []
    for f in files:
        if not isinstance(f, dict) or set(f) != {"path", "kind", "size", "digest"}:
            raise bad("a file row is malformed")
        path, kind, size, digest = f["path"], f["kind"], f["size"], f["digest"]
        try:
            validate_relpath(path, where=where)
        except FormatError as e:
            raise bad(e.message) from None
        if kind not in (KIND_TENSORS, KIND_FILE):
            raise bad(f"{printable(path)} has an unknown kind")
        if type(size) is not int or size < 0:
            raise bad(f"{printable(path)} has no valid size")
        if not isinstance(digest, str) or not _HEX32.fullmatch(digest):
            raise bad(f"{printable(path)} has no valid digest")
        if rows and path_sort_key(rows[-1].path) >= path_sort_key(path):
            raise bad("the files are not in order, or one is listed twice")
        rows.append(Row(path, kind, size, bytes.fromhex(digest)))
    # a file cannot also be a directory of another listed file
    paths = {r.path for r in rows}
    for r in rows:
        parts = r.path.split("/")
        if any("/".join(parts[:i]) in paths for i in range(1, len(parts))):
            raise bad(f"{printable(r.path)} lies inside another listed file")
    rec = Record(bytes.fromhex(version), tuple(rows))
    if fingerprint((r.path, r.kind, r.size, r.digest) for r in rec.files) != rec.version:
        raise bad("its files are not the version it names")
    return rec
