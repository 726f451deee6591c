"""Checkpoint directories: find the tensor files and companion files, read
their headers, and read byte ranges into caller-owned buffers.

A checkpoint is a directory tree of regular files. ``*.safetensors`` files
whose header passes :func:`wdiff.header.parse_header` are *tensor files*;
every other file (config.json, tokenizer files, the shard index, odd or
invalid safetensors files) is an opaque *companion file*. Tensors are matched
by name across the whole checkpoint, whatever shard holds them.
"""

from __future__ import annotations

import os
import stat as stat_mod
from dataclasses import dataclass, field
from functools import cached_property

from ..errors import BusyError, FormatError, LayoutError, NotFoundError, UsageError, WdiffIOError
from ..paths import RESERVED, printable, validate_relpath
from .header import Header, HeaderError, TensorInfo, header_length, parse_header

#: top-level entries that belong to tools, not to the checkpoint
IGNORED = RESERVED
#: a directory tree deeper than this is refused (symlink loops, hostile trees)
MAX_DEPTH = 32
MAX_FILES = 100_000

KIND_TENSORS = "safetensors"
KIND_FILE = "file"


@dataclass(frozen=True, slots=True)
class FileEntry:
    path: str  # relative POSIX path, validated
    abspath: str
    size: int
    kind: str  # KIND_TENSORS or KIND_FILE
    header: Header | None
    #: identity of the bytes on disk for the manifest cache
    stat_key: tuple[int, int, int, int, int]
    #: why a *.safetensors file is handled as an opaque file
    note: str | None = None


@dataclass(frozen=True)
class Checkpoint:
    root: str
    files: tuple[FileEntry, ...]  # sorted by path (UTF-8 byte order)
    _by_path: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_path", {f.path: f for f in self.files})

    def file(self, path: str) -> FileEntry | None:
        return self._by_path.get(path)

    @cached_property
    def tensors(self) -> dict[str, tuple[FileEntry, TensorInfo]]:
        """Every tensor by name. Names are unique across the checkpoint."""
        out: dict[str, tuple[FileEntry, TensorInfo]] = {}
        for f in self.files:
            if f.header is None:
                continue
            for t in f.header.tensors:
                if t.name in out:
                    raise FormatError(
                        f"{self.root}: tensor {printable(t.name)} appears in both "
                        f"{printable(out[t.name][0].path)} and {printable(f.path)}"
                    )
                out[t.name] = (f, t)
        return out

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def tensor_bytes(self) -> int:
        return sum(f.header.data_len for f in self.files if f.header is not None)


def path_sort_key(path: str) -> bytes:
    return path.encode("utf-8")


#: where an in-place apply keeps its journal while it runs
TXN_JOURNAL = os.path.join(".wdiff", "txn", "journal.json")


def scan(root: str | os.PathLike, *, allow_unfinished: bool = False, reuse: Checkpoint | None = None) -> Checkpoint:
    """Scan a checkpoint directory. Reads only headers, never tensor data.
    Refuses a directory that holds an unfinished in-place apply. A header
    byte-identical to that of the same file of ``reuse`` (the other side of
    a diff or pack, usually) is not parsed again: the result is the same."""
    root = os.fspath(root)
    try:
        st = os.stat(root)
    except FileNotFoundError:
        raise NotFoundError(f"{root}: no such directory") from None
    except OSError as e:
        raise WdiffIOError(f"{root}: {e.strerror}") from None
    if not stat_mod.S_ISDIR(st.st_mode):
        raise UsageError(f"{root}: not a directory (a checkpoint is a directory)")
    if not allow_unfinished and os.path.exists(os.path.join(root, TXN_JOURNAL)):
        raise BusyError(
            f"{root}: an in-place apply was interrupted here; the checkpoint is between two versions",
            hint="run the same `wdiff apply BUNDLE DIR --in-place` again to finish it, or add --abort to roll it back",
        )
    found: list[FileEntry] = []
    _walk(root, "", 0, found, reuse)
    found.sort(key=lambda f: path_sort_key(f.path))
    ckpt = Checkpoint(root=root, files=tuple(found))
    ckpt.tensors  # noqa: B018 - refuses a tensor name held by two files, now
    return ckpt


def _walk(root: str, rel: str, depth: int, out: list[FileEntry], reuse: Checkpoint | None) -> None:
    if depth > MAX_DEPTH:
        raise LayoutError(f"{root}: directory tree is deeper than {MAX_DEPTH} levels",
                          hint="a checkpoint is a shallow tree; move the deep part out of it")
    here = os.path.join(root, rel) if rel else root
    try:
        entries = list(os.scandir(here))
    except OSError as e:
        raise WdiffIOError(f"{here}: {e.strerror}") from None
    for entry in entries:
        name = entry.name
        if not rel and name in IGNORED:
            continue
        relpath = f"{rel}/{name}" if rel else name
        try:
            validate_relpath(relpath, where=root)
        except FormatError as e:
            # the user's own directory, not hostile input: theirs to fix (exit 2)
            raise LayoutError(str(e), hint="rename it, or move it out of the checkpoint; "
                                           "wdiff refuses names it cannot ship") from None
        try:
            if entry.is_dir(follow_symlinks=False):
                _walk(root, relpath, depth + 1, out, reuse)
                continue
            st = os.stat(entry.path)  # follows a symlink to a file
        except OSError as e:
            raise WdiffIOError(f"{os.path.join(root, relpath)}: {e.strerror}") from None
        if stat_mod.S_ISDIR(st.st_mode):
            raise LayoutError(
                f"{root}: {printable(relpath)} is a symbolic link to a directory; "
                "wdiff does not follow those",
                hint="replace the link by a copy of the directory it points to, or move it out of the checkpoint",
            )
        if not stat_mod.S_ISREG(st.st_mode):
            raise LayoutError(f"{root}: {printable(relpath)} is not a regular file",
                              hint="a checkpoint holds regular files and directories only; move it out")
        if len(out) >= MAX_FILES:
            raise LayoutError(f"{root}: more than {MAX_FILES} files",
                              hint="is this the checkpoint directory, or a directory above it?")
        seen = reuse.file(relpath) if reuse is not None else None
        out.append(_entry(root, relpath, entry.path, st, seen.header if seen is not None else None))


def _entry(root: str, relpath: str, abspath: str, st: os.stat_result, seen: Header | None) -> FileEntry:
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if not relpath.endswith(".safetensors"):
        return FileEntry(relpath, abspath, st.st_size, KIND_FILE, None, key)
    try:
        header = read_header(abspath, st.st_size, where=f"{root}: {printable(relpath)}", seen=seen)
    except HeaderError as e:
        return FileEntry(relpath, abspath, st.st_size, KIND_FILE, None, key, note=str(e))
    return FileEntry(relpath, abspath, st.st_size, KIND_TENSORS, header, key)


def read_header(path: str, size: int, *, where: str, seen: Header | None = None) -> Header:
    """The header of the tensor file at ``path`` (``size`` bytes); ``seen``
    is returned as it is when its bytes and file size are the same."""
    try:
        with open(path, "rb") as f:
            n = header_length(f.read(8), size, where=where)
            f.seek(0)
            raw = f.read(8 + n)  # one buffer: hostile headers are tens of MB
    except OSError as e:
        raise WdiffIOError(f"{where}: {e.strerror}") from None
    if seen is not None and seen.file_size == size and seen.raw == raw:
        return seen  # parsing depends on these bytes and the size alone
    return parse_header(raw, size, where=where)


def read_into(fd: int, offset: int, buf: memoryview, *, where: str) -> None:
    """Fill ``buf`` with the bytes at ``offset`` of ``fd`` (``os.preadv``),
    raising if the file is shorter than expected (it changed under us)."""
    done = 0
    total = len(buf)
    while done < total:
        try:
            n = os.preadv(fd, [buf[done:]], offset + done)
        except OSError as e:
            raise WdiffIOError(f"{where}: {e.strerror}") from None
        if n == 0:
            raise FormatError(f"{where}: file ended early; was it modified while wdiff read it?")
        done += n
