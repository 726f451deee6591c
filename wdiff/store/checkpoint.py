"""Checkpoint directories: find the tensor files and companion files, read
their headers, and read byte ranges into caller-owned buffers.

A checkpoint is a directory tree of regular files. ``*.safetensors`` files
whose header passes :func:`wdiff.header.parse_header` are *tensor files*;
every other file (config.json, tokenizer files, the shard index, odd or
invalid safetensors files) is an opaque *companion file*.

Tensor names are scoped by the directory of their file: a tensor named
``model.embed`` in ``policy/model-00001-of-00002.safetensors`` is
``policy/model.embed`` here (its *qualified name*; at the top level the name
is its own), so one directory can hold two models (policy/ and ref/). Within
a directory tensors are matched by name across shards, so a re-sharded model
diffs as unchanged. Files that the ignore rules leave out (trainer state,
``.wdiffignore``) are not part of the checkpoint at all.
"""

from __future__ import annotations

import os
import stat as stat_mod
from dataclasses import dataclass, field
from functools import cached_property

from ..errors import BusyError, FormatError, LayoutError, NotFoundError, UsageError, WdiffIOError
from ..paths import MAX_DEPTH, RESERVED, printable, validate_relpath
from .header import Header, HeaderError, TensorInfo, header_length, parse_header
from .ignore import DEFAULT_RULES, Rules

#: top-level entries that belong to tools, not to the checkpoint
IGNORED = RESERVED
#: a directory tree deeper than MAX_DEPTH is refused (symlink loops, hostile trees)
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


def scope_of(path: str) -> str:
    """The scope of the tensors of the tensor file at ``path``: its directory
    ("" at the top level)."""
    return path.rsplit("/", 1)[0] if "/" in path else ""


def bare_name(path: str, name: str) -> str:
    """A qualified tensor name of the file at ``path`` without its scope."""
    scope = scope_of(path)
    return name[len(scope) + 1 :] if scope else name


@dataclass(frozen=True)
class Checkpoint:
    root: str
    files: tuple[FileEntry, ...]  # sorted by path (UTF-8 byte order)
    #: what the ignore rules left out, in path order (a directory ends in /)
    excluded: tuple[str, ...] = ()
    _by_path: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_path", {f.path: f for f in self.files})

    def file(self, path: str) -> FileEntry | None:
        return self._by_path.get(path)

    @cached_property
    def tensors(self) -> dict[str, tuple[FileEntry, TensorInfo]]:
        """Every tensor by qualified name, unique across the checkpoint."""
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

    @cached_property
    def _bare(self) -> dict[str, tuple[FileEntry, TensorInfo]]:
        """Every tensor by its bare name, as format version 1 matches them;
        refuses a checkpoint in which two tensor files share a name."""
        out: dict[str, tuple[FileEntry, TensorInfo]] = {}
        for name, (f, t) in self.tensors.items():
            bare = bare_name(f.path, name)
            if bare in out:
                raise FormatError(
                    f"{self.root}: tensor {printable(bare)} appears in both "
                    f"{printable(out[bare][0].path)} and {printable(f.path)}",
                    hint="format version 1 names tensors across the whole checkpoint; this needs a version 2 bundle",
                )
            out[bare] = (f, t)
        return out

    def unique_bare_names(self) -> bool:
        try:
            self._bare  # noqa: B018
        except FormatError:
            return False
        return True

    def base_tensors_for(self, path: str, scoped: bool = True) -> dict[str, tuple[FileEntry, TensorInfo]]:
        """The tensors of this checkpoint (as a base) that a tensor of target
        file ``path`` may take as its base source, by the target's qualified
        name: those of the same scope (``scoped``, format version 2), or of
        the same bare name in any file (version 1)."""
        scope = scope_of(path)
        key = (scope, scoped)
        memo = self.__dict__.setdefault("_for_scope", {})
        hit = memo.get(key)
        if hit is None:
            if scoped:
                hit = {k: v for k, v in self.tensors.items() if scope_of(v[0].path) == scope}
            else:
                pre = scope + "/" if scope else ""
                hit = {pre + k: v for k, v in self._bare.items()}
            memo[key] = hit
        return hit

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


def scan(
    root: str | os.PathLike,
    *,
    allow_unfinished: bool = False,
    reuse: Checkpoint | None = None,
    rules: Rules = DEFAULT_RULES,
    keep: frozenset[str] | set[str] = frozenset(),
    name: str | None = None,
) -> Checkpoint:
    """Scan a checkpoint directory. Reads only headers, never tensor data.
    Refuses a directory that holds an unfinished in-place apply. A header
    byte-identical to that of the same file of ``reuse`` (the other side of
    a diff or pack, usually) is not parsed again: the result is the same.
    Files that ``rules`` (with the root's .wdiffignore) exclude are left
    out, except those in ``keep`` (a bundle's base lists them). A regular
    file is a checkpoint of that one file (see :func:`scan_file`)."""
    root = os.fspath(root)
    try:
        st = os.stat(root)
    except FileNotFoundError:
        raise NotFoundError(f"{root}: no such directory") from None
    except OSError as e:
        raise WdiffIOError(f"{root}: {e.strerror}") from None
    if stat_mod.S_ISREG(st.st_mode):
        return scan_file(root, name=name)
    if not stat_mod.S_ISDIR(st.st_mode):
        raise UsageError(f"{root}: not a directory or a regular file")
    if not allow_unfinished and os.path.exists(os.path.join(root, TXN_JOURNAL)):
        raise BusyError(
            f"{root}: an in-place apply was interrupted here; the checkpoint is between two versions",
            hint="run the same `wdiff apply BUNDLE DIR --in-place` again to finish it, or add --abort to roll it back",
        )
    found: list[FileEntry] = []
    walk = _Walk(root, rules.with_file(root), frozenset(keep), reuse)
    walk.walk("", 0, found)
    found.sort(key=lambda f: path_sort_key(f.path))
    ckpt = Checkpoint(root=root, files=tuple(found), excluded=tuple(sorted(walk.excluded, key=path_sort_key)))
    ckpt.tensors  # noqa: B018 - refuses a tensor name held by two files of one directory, now
    return ckpt


def scan_file(path: str, *, name: str | None = None) -> Checkpoint:
    """A single file (an adapter's ``adapter_model.safetensors``, a lone
    shard) as a checkpoint holding just that file, under ``name`` (default:
    its own base name): what a pair of files, or a bundle made from one,
    calls it. No ignore rules apply: the file was named."""
    name = name if name is not None else os.path.basename(path)
    validate_relpath(name, where=path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise WdiffIOError(f"{path}: {e.strerror}") from None
    ckpt = Checkpoint(root=path, files=(_entry(path, name, path, st, None),))
    ckpt.tensors  # noqa: B018
    return ckpt


def is_file_arg(path) -> bool:
    """Whether a checkpoint argument names a single regular file."""
    return path is not None and os.path.isfile(os.fspath(path))


def _keeps_below(keep: frozenset[str], rel: str) -> bool:
    pre = rel + "/"
    return any(k.startswith(pre) for k in keep)


class _Walk:
    def __init__(self, root: str, rules: Rules, keep: frozenset[str], reuse: Checkpoint | None) -> None:
        self.root, self.rules, self.keep, self.reuse = root, rules, keep, reuse
        self.excluded: list[str] = []

    def walk(self, rel: str, depth: int, out: list[FileEntry]) -> None:
        _walk(self.root, rel, depth, out, self.reuse, self)

    def skip(self, relpath: str, is_dir: bool) -> bool:
        if not self.rules.active or relpath in self.keep:
            return False
        if self.rules.excluded(relpath, is_dir) is None:
            return False
        if is_dir and _keeps_below(self.keep, relpath):
            return False
        self.excluded.append(relpath + "/" if is_dir else relpath)
        return True


def _walk(root: str, rel: str, depth: int, out: list[FileEntry], reuse: Checkpoint | None, w: _Walk) -> None:
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
            if w.skip(relpath, entry.is_dir()):  # left out: never read, whatever its name or kind
                continue
        except OSError as e:
            raise WdiffIOError(f"{os.path.join(root, relpath)}: {e.strerror}") from None
        try:
            validate_relpath(relpath, where=root)
        except FormatError as e:
            # the user's own directory, not hostile input: theirs to fix (exit 2)
            raise LayoutError(str(e), hint="rename the file, move it out of the checkpoint, or add it to "
                                           ".wdiffignore; wdiff refuses names it cannot ship") from None
        try:
            if entry.is_dir(follow_symlinks=False):
                _walk(root, relpath, depth + 1, out, reuse, w)
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


def entry_at(root: str, relpath: str, abspath: str) -> FileEntry:
    """The entry of the file at ``abspath`` as if it lay at ``relpath`` of a
    checkpoint (a staged file checked before it is renamed into place)."""
    try:
        st = os.stat(abspath, follow_symlinks=False)
    except OSError as e:
        raise WdiffIOError(f"{abspath}: {e.strerror}") from None
    if not stat_mod.S_ISREG(st.st_mode):
        raise FormatError(f"{abspath}: not a regular file")
    return _entry(root, relpath, abspath, st, None)


def known_checkpoint(root: str, files) -> Checkpoint:
    """The checkpoint at ``root`` whose files are known already: ``files``
    holds (relpath, kind, header) in path order, as an apply that just wrote
    and verified them knows them. Stats each file and parses nothing, so it
    refuses nothing a scan would (it raises only OSError)."""
    entries = []
    for relpath, kind, header in files:
        abspath = os.path.join(root, relpath)
        st = os.stat(abspath)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        entries.append(FileEntry(relpath, abspath, st.st_size, kind, header, key))
    return Checkpoint(root=root, files=tuple(entries))


def _entry(root: str, relpath: str, abspath: str, st: os.stat_result, seen: Header | None) -> FileEntry:
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if not relpath.endswith(".safetensors"):
        return FileEntry(relpath, abspath, st.st_size, KIND_FILE, None, key)
    try:
        header = read_header(abspath, st.st_size, where=f"{root}: {printable(relpath)}", seen=seen, scope=scope_of(relpath))
    except HeaderError as e:
        return FileEntry(relpath, abspath, st.st_size, KIND_FILE, None, key, note=str(e))
    return FileEntry(relpath, abspath, st.st_size, KIND_TENSORS, header, key)


def read_header(path: str, size: int, *, where: str, seen: Header | None = None, scope: str = "") -> Header:
    """The header of the tensor file at ``path`` (``size`` bytes), its
    tensors named within ``scope``; ``seen`` (of the same scope) is returned
    as it is when its bytes and file size are the same."""
    try:
        with open(path, "rb") as f:
            n = header_length(f.read(8), size, where=where)
            f.seek(0)
            raw = f.read(8 + n)  # one buffer: hostile headers are tens of MB
    except OSError as e:
        raise WdiffIOError(f"{where}: {e.strerror}") from None
    if seen is not None and seen.file_size == size and seen.raw == raw:
        return seen  # parsing depends on these bytes and the size alone
    return parse_header(raw, size, where=where).scoped(scope)


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
