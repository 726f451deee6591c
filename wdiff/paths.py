"""Names that come from checkpoints and bundles: checking them before they
become paths, and escaping them before they reach a terminal."""

from __future__ import annotations

import os
import unicodedata

from .errors import FormatError

#: the directory inside a checkpoint where wdiff keeps its own state (locks,
#: the journal of an unfinished in-place apply, staged downloads)
STATE_DIR = ".wdiff"
#: top-level names that belong to tools, not to a checkpoint; never shipped
RESERVED = frozenset({STATE_DIR, ".git", ".cache"})
MAX_PATH_BYTES = 4096
MAX_COMPONENT_BYTES = 255
#: directories a file may lie below: a checkpoint is a shallow tree, and a
#: scan refuses a deeper one, so a bundle may not state a deeper path either
MAX_DEPTH = 32
#: what the library takes for a path on this machine: a str or any os.PathLike
PathLike = str | os.PathLike


def printable(name: str, limit: int = 200, *, backslashes: bool = True) -> str:
    """``name`` with every control or unprintable character escaped, so that
    nothing read from a file can drive a terminal. Long names are shortened.
    A backslash is doubled, so that an escape is never ambiguous; not with
    ``backslashes=False``, for a message whose names were escaped already
    (escaping it again is for the terminal's sake only)."""
    out = []
    for ch in name:
        cat = unicodedata.category(ch)
        if ch == "\\" and backslashes:
            out.append("\\\\")
        elif cat[0] == "C" or cat in ("Zl", "Zp"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    text = "".join(out)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def validate_relpath(path: str, *, where: str) -> str:
    """Accept ``path`` only as a plain relative POSIX path that stays inside
    its directory. Raises :class:`FormatError` otherwise."""
    if not isinstance(path, str) or not path:
        raise FormatError(f"{where}: empty file name")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise FormatError(f"{where}: file name {printable(path)!s} is not valid UTF-8") from None
    if len(encoded) > MAX_PATH_BYTES:
        raise FormatError(f"{where}: file name is longer than {MAX_PATH_BYTES} bytes")
    if path.startswith("/") or "\\" in path or "\x00" in path:
        raise FormatError(f"{where}: file name {printable(path)} is not a plain relative path")
    if path.split("/", 1)[0] in RESERVED:
        raise FormatError(f"{where}: file name {printable(path)} is inside a reserved directory")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise FormatError(f"{where}: file name {printable(path)} climbs out or is not canonical")
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise FormatError(f"{where}: a component of {printable(path)} is too long")
        if any(unicodedata.category(c) == "Cc" for c in part):
            raise FormatError(f"{where}: file name {printable(path)} holds control characters")
    return path
