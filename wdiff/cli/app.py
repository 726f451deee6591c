"""The Typer application: thin wrappers over the library. Each command parses
its options, calls one library function, and renders the result. Commands
register on ``app`` when their module is imported, in the order of --help."""

from __future__ import annotations

from . import cmd_checkpoints, cmd_remotes, cmd_interop, cmd_tools  # noqa: F401 - registers the commands
from .common import app

__all__ = ["app"]
