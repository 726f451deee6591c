"""Option values without pydantic, where typer (0.29 and later) would import
it to coerce them.

typer 0.29 turns every option value through a pydantic ``TypeAdapter``
built on first use: importing pydantic and building the adapters costs
0.1-0.15 s of every wdiff command (wdiff runs every training step and from
cron), where typer 0.28 took click's own types. wdiff's options are plain
``str``, ``int`` (with bounds), ``float``, ``Path`` and lists of them, and
the values a command line gives are strings (and a flag's bool or None): :class:`Quick` turns those it
can turn exactly as typer's adapter would (a string; decimal digits; a
path that is missing or readable) and hands anything else to typer's own
coercion, built then, so that every refusal and its message stay typer's.
tests/test_cli_coerce.py holds the two to the same answers.

And typer 0.29 writes an argument of several values, named by its metavar,
as ``{A B}...`` on the usage line where 0.28 wrote ``{A B}``, and adds its
type to an argument's help (``REMOTE <str>``): wdiff keeps 0.28's text (its
transcripts, help and error messages are golden; tests/test_cli_coerce.py
compares every command's help and usage errors with 0.28's). With typer
0.28 (no ``_runtime_param`` on its parameters) nothing here is used.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_INT = re.compile(r"-?[0-9]{1,18}")
_FLOAT = re.compile(r"-?[0-9]{1,15}(\.[0-9]{1,15})?")


class Quick:
    """A stand-in for typer's runtime parameter (``coerce(value, param,
    ctx)``), with typer's own built only for a value it does not take."""

    __slots__ = ("descriptor", "_full", "_leaf")

    def __init__(self, descriptor, leaf) -> None:
        self.descriptor = descriptor
        self._leaf = leaf
        self._full = None

    def full(self):
        if self._full is None:
            from typer._coercion import build_runtime_param

            self._full = build_runtime_param(self.descriptor)
        return self._full

    def coerce(self, value, param, ctx):
        multi = param.multiple or param.nargs == -1
        if value is None:  # typer's own answer, before it coerces anything
            return () if multi else None
        got = _MISS
        if multi:
            if isinstance(value, (list, tuple)):
                got = [self._leaf(v) for v in value]
                got = _MISS if _MISS in got else got
        elif not isinstance(value, (list, tuple)):
            got = self._leaf(value)
        if got is _MISS:
            return self.full().coerce(value, param, ctx)
        return got


_MISS = object()


def _boolean(v):
    return v if type(v) is bool else _MISS


def _string(v):
    return v if type(v) is str else _MISS


def _integer(lo, hi):
    def one(v):
        if type(v) is str and _INT.fullmatch(v):
            v = int(v)
        if type(v) is not int or (lo is not None and v < lo) or (hi is not None and v > hi):
            return _MISS
        return v

    return one


def _floating(v):
    if type(v) is str and _FLOAT.fullmatch(v):
        return float(v)
    return _MISS


def _path(v):
    if type(v) is not str or not v or "\0" in v or v == "-":
        return _MISS
    try:
        os.stat(v)
    except (OSError, ValueError):
        return Path(v)
    # typer checks that a path that exists is readable (and refuses with its own message)
    return Path(v) if os.access(v, os.R_OK) else _MISS


def _leaf_of(annotation, info):
    """The quick coercion of one value of ``annotation``, or None where
    this module does not know the annotation or its options."""
    if getattr(info, "parser", None) is not None or getattr(info, "click_type", None) is not None:
        return None
    if annotation is bool:
        return _boolean
    if annotation is str:
        return _string
    if annotation is int and not getattr(info, "clamp", False):
        return _integer(info.min, info.max)
    if annotation is float and info.min is None and info.max is None:
        return _floating
    if annotation is Path and _plain_path(info):
        return _path
    return None


def _plain_path(info) -> bool:
    return (getattr(info, "path_type", None) in (None, Path) and not getattr(info, "exists", False)
            and not getattr(info, "resolve_path", False) and getattr(info, "file_okay", True)
            and getattr(info, "dir_okay", True) and not getattr(info, "writable", False))


def quicken(command) -> None:
    """Give each parameter of ``command`` (a click command typer built),
    its ``--help`` included, the quick coercion where typer would build a
    pydantic one and wdiff knows the annotation."""
    for p in getattr(command, "params", ()):
        _quicken(p)
    made = getattr(command, "get_help_option", None)
    if made is not None and hasattr(command, "_help_option"):  # typer 0.29 makes --help when asked

        def get_help_option(ctx):
            opt = made(ctx)
            if opt is not None:
                _quicken(opt)
            return opt

        command.get_help_option = get_help_option


def _usage_as_028(p):
    """typer 0.29 writes an argument of several values as ``{A B}...`` on
    the usage line even when its metavar names them all, and an optional
    one whose metavar is ``[DIR]`` as ``[[DIR]]``; 0.28 (and wdiff's
    transcripts, help and error messages) wrote ``{A B}`` and ``[DIR]``."""
    var = p.metavar

    def usage() -> str:
        if var.startswith("["):
            return var
        return f"{{{var}}}" if p.required else f"[{var}]"

    return usage


def _no_type(ctx) -> None:
    return None


def _quicken(p) -> None:
    if hasattr(p, "_usage_display_name"):  # an argument, typer 0.29
        if getattr(p, "metavar", None):
            p._usage_display_name = _usage_as_028(p)
        # 0.29 adds the type to an argument's help (`REMOTE <str>`, `A B <list[Path]>`);
        # 0.28 and wdiff's help name the argument alone, its help says what it is
        p.display_type_rich = _no_type
    if getattr(p, "_runtime_param", False) is not None or not hasattr(p, "type_descriptor"):
        return
    d = p.type_descriptor
    ann = d.annotation
    if d.is_list:
        args = getattr(ann, "__args__", ())
        ann = args[0] if len(args) == 1 else None
    elif d.is_tuple or getattr(d, "file_annotation", None) is not None:
        return
    leaf = _leaf_of(ann, d.parameter_info)
    if leaf is not None:
        p._runtime_param = Quick(d, leaf)
