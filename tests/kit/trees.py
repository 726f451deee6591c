"""A directory as the tests make and compare it: :func:`write_tree` (files
from a dict), :func:`tree` (its files' bytes, the inverse), :func:`digests`
(their digests, for short failure messages), :func:`snapshot` (every entry,
links and modes included: "nothing changed"), :func:`listing` and
:func:`du`. Nothing here follows a link to a directory."""

from __future__ import annotations

import os
import stat

from .digests import sha256


def _walk(root, skip):
    """(relative path, full path, listed as a directory) of every entry
    under ``root``, as os.walk lists them (a link to a directory is listed
    as one, and not entered); a directory whose relative path is in
    ``skip`` is left out with all it holds (a file of that name is not)."""
    root = os.fspath(root)
    skip = set(skip)
    for dirpath, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        kept = []
        for d in dirs:
            rel = os.path.normpath(os.path.join(rel_dir, d))
            if rel not in skip:
                kept.append(d)
                yield rel, os.path.join(dirpath, d), True
        dirs[:] = kept
        for f in files:
            yield os.path.normpath(os.path.join(rel_dir, f)), os.path.join(dirpath, f), False


def write_tree(root, files: dict[str, bytes]) -> str:
    """Write ``files`` (relative path: bytes) under ``root``, making the
    folders they need; returns ``root`` as a str."""
    root = os.fspath(root)
    os.makedirs(root, exist_ok=True)
    for rel, data in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    return root


def tree(root, *, skip=(".wdiff",)) -> dict[str, bytes]:
    """Every file under ``root`` by relative path: its bytes (a link to a
    file read through). ``skip``: directories left out, by relative path:
    wdiff's own .wdiff/ unless told otherwise."""
    out = {}
    for rel, p, is_dir in _walk(root, skip):
        if not is_dir:
            with open(p, "rb") as f:
                out[rel] = f.read()
    return out


def digests(root, *, skip=(".wdiff",), length: int = 64) -> dict[str, str]:
    """:func:`tree` with each file's SHA-256 (hex, its first ``length``
    digits) for its bytes: the same comparisons, short messages."""
    return {p: sha256(data)[:length] for p, data in tree(root, skip=skip).items()}


def snapshot(root, *, skip=(), content: str = "sha256", inodes: bool = False, modes: bool = False) -> dict:
    """Every entry under ``root``, links never followed, by relative path:
    ``("link", target)``, ``("dir",)``, ``("file", data)`` or, for anything
    else (a FIFO, a socket, a device), ``(S_IFMT,)``.

    ``content``: a file's data as its SHA-256 ("sha256") or its bytes
    ("bytes"); ``inodes``: ``("file", inode, data)``, so that a file
    replaced by an equal one is a change; ``modes``: the permission bits
    last in every tuple but a link's; ``skip``: directories left out with
    all they hold, by relative path."""
    if content not in ("sha256", "bytes"):
        raise ValueError(f"content is 'sha256' or 'bytes', not {content!r}")
    out = {}
    for rel, p, _is_dir in _walk(root, skip):
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(p))
            continue
        if stat.S_ISDIR(st.st_mode):
            entry = ("dir",)
        elif stat.S_ISREG(st.st_mode):
            with open(p, "rb") as f:
                data = f.read()
            entry = ("file", *((st.st_ino,) if inodes else ()), sha256(data) if content == "sha256" else data)
        else:
            entry = (stat.S_IFMT(st.st_mode),)
        out[rel] = (*entry, stat.S_IMODE(st.st_mode)) if modes else entry
    return out


def listing(root) -> list[str]:
    """Every entry under ``root``, sorted, a directory's name (or a link's
    to one) ending in /."""
    return sorted(rel + "/" if is_dir else rel for rel, _p, is_dir in _walk(root, ()))


def du(path) -> int:
    """Bytes of every file under ``path`` (lstat: a link counts its own
    size; 0 when ``path`` does not exist)."""
    return sum(os.lstat(p).st_size for _rel, p, is_dir in _walk(path, ()) if not is_dir)
