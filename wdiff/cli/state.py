"""Per-invocation state the error handler needs (was --json given?)."""

from __future__ import annotations


class _State:
    out = None  # the cli.output.Out of the running command, once parsed


STATE = _State()
