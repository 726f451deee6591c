"""Telling a remote from a checkpoint before writing into either: a
directory remote holds chain.json and objects/, a checkpoint holds
safetensors files. A command pointed at the wrong one refuses with a clear
message instead of turning a checkpoint into a remote (or the reverse)."""

from __future__ import annotations

import os

from ..errors import UsageError
from ..remotes import parse_remote
from ..remotes.base import CHAIN

INDEX_SUFFIX = ".safetensors.index.json"


def _local(url) -> str | None:
    url = os.fspath(url)
    try:
        spec = parse_remote(url)
    except UsageError:
        return None
    return spec["path"] if spec["kind"] == "local" else None


def holds_remote(path) -> bool:
    path = os.fspath(path)
    return os.path.lexists(os.path.join(path, CHAIN)) or os.path.isdir(os.path.join(path, "objects"))


def holds_checkpoint(path) -> bool:
    """A directory with safetensors files (or a sharded index) at its top."""
    try:
        names = os.listdir(os.fspath(path))
    except OSError:
        return False
    return any(n.endswith(".safetensors") or n.endswith(INDEX_SUFFIX) for n in names)


def refuse_checkpoint_as_remote(remote) -> None:
    """A remote URL naming a local directory that holds a checkpoint and no
    remote: refused, naming what it is."""
    path = _local(remote)
    if path is not None and os.path.isdir(path) and not holds_remote(path) and holds_checkpoint(path):
        raise UsageError(f"{path} is a checkpoint directory, not a remote (it has no {CHAIN})",
                         hint="give the remote the checkpoint was pushed to; wdiff status DIR REMOTE compares them")


def refuse_remote_as_checkpoint(directory, what: str) -> None:
    """A checkpoint directory that holds a remote's files: refused, so that
    a pull or push never treats chain.json and objects/ as model files."""
    directory = os.fspath(directory)
    if os.path.isdir(directory) and holds_remote(directory):
        raise UsageError(f"{directory} holds a remote ({CHAIN}, objects/), not a checkpoint; {what}",
                         hint="give the checkpoint directory; a remote is the other argument")
