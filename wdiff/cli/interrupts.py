"""What an interrupted command says comes next.

Ctrl-C (or SIGTERM) stops a command wherever it is; the library raises
KeyboardInterrupt through, undoing what it must. Each long command *arms*
a describer here before it starts its work; when it is interrupted,
:func:`describe` looks at what is on the disk now (the directory's
journal, record and verified downloads; the output file) and says what was
kept and what to do: run the same command again (which resumes or finishes
the job), or roll back with ``--abort``. It reads, never writes, and never
fails: a describer that cannot tell says only what is sure.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable

from ..paths import printable
from ..progress import size_text

_argv: list[str] = []
_armed: list = []  # [describer, args, kwargs, what it saw before the command began]


def reset(argv: list[str]) -> None:
    """A new invocation with these arguments: nothing armed."""
    _argv[:] = list(argv)
    _armed.clear()


def arm(describer: Callable, *args, **kwargs) -> None:
    """Say how ``describer(*args, before, **kwargs)`` tells what comes next
    when this command is interrupted; ``before`` is what its ``before``
    attribute (if any) saw now, before the work begins."""
    seen = None
    look = getattr(describer, "before", None)
    if look is not None:
        try:
            seen = look(*args, **kwargs)
        except Exception:  # noqa: BLE001 - only a message depends on it
            seen = None
    _armed[:] = [describer, args, kwargs, seen]


def describe() -> tuple[str, str | None]:
    """(message, hint) of the interrupted command."""
    if not _armed:
        return "interrupted", None
    describer, args, kwargs, seen = _armed
    try:
        return describer(*args, seen, **kwargs)
    except BaseException:  # noqa: BLE001 - a second Ctrl-C, an unreadable state: say what is sure
        return "interrupted", f"{again()} to start over"


def again() -> str:
    """The command line as it was given, to run again."""
    line = printable(shlex.join(["wdiff", *_argv]), 300, backslashes=False)
    return f"run `{line}` again"


def _left(directory) -> object:
    from ..sync.pull.work import left_in

    return left_in(os.path.abspath(os.fspath(directory)))


def _stat(path) -> tuple | None:
    try:
        st = os.lstat(os.fspath(path))
    except OSError:
        return None
    return (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size)


def _stopped(directory, before, what: str, *, abort_with: str | None = None) -> tuple[str, str] | None:
    """The message for a directory an in-place command was writing, when
    the state on the disk tells: None when it shows no trace of the
    command (the caller says what it had done then)."""
    d = printable(os.fspath(directory))
    left = _left(directory)
    if left is None:
        return None
    if left.journal:
        roll = f", or roll it back to where it was with `{abort_with}`" if abort_with else ""
        return (f"interrupted while {what} {d} in place: it holds parts of two versions until the update is finished, "
                "and wdiff refuses to read it meanwhile",
                f"{again()} to finish the update{roll}")
    if before is not None and left.version is not None and left.version != before.version:
        return (f"interrupted after {d} was updated: it is complete at {left.version.hex()[:12]}",
                f"nothing is left to do; `wdiff status {d} REMOTE` says where it stands")
    return None


# -- pull ---------------------------------------------------------------------------------


def pull(remote, directory, before, *, atomic: bool = False) -> tuple[str, str | None]:
    d = printable(os.fspath(directory))
    if atomic:
        target = os.path.realpath(os.fspath(directory))
        left = _left(target)
        kept = f"; the {size_text(left.kept)} downloaded so far are kept in {printable(target)}/.wdiff/pull" \
            if left is not None and left.kept else ""
        return (f"interrupted: {d} still points at the version it held, whole; the new version was not "
                f"finished and what was built of it was removed{kept}",
                f"{again()}: it resumes from the downloads")
    said = _stopped(directory, before, "updating", abort_with=None)
    if said is not None:
        return said
    left = _left(directory)
    if left is None:
        return f"interrupted: {d} was not created", f"{again()} to pull it"
    if left.kept:
        return (f"interrupted: {d} was not changed; the {size_text(left.kept)} downloaded so far are kept in "
                f"{d}/.wdiff/pull", f"{again()}: it checks them and resumes from there")
    return f"interrupted: {d} was not changed", f"{again()} to pull it"


pull.before = lambda remote, directory: _left(directory)


# -- apply --------------------------------------------------------------------------------


def apply(bundle, base, output, before, *, in_place: bool, abort: bool) -> tuple[str, str | None]:
    if in_place:
        line = shlex.join(["wdiff", "apply", os.fspath(bundle), os.fspath(base), "--in-place", "--abort"])
        said = _stopped(base, before, "rolling back" if abort else "updating",
                        abort_with=None if abort else printable(line, 300, backslashes=False))
        if said is not None:
            return said
        return f"interrupted: {printable(os.fspath(base))} was not changed", f"{again()} to apply the bundle"
    if output is None:
        return "interrupted; nothing was written", f"{again()} to start over"
    out = printable(os.fspath(output))
    now = _stat(output)
    if now is not None and now != before:  # renamed into place, its last step: complete and verified
        return f"interrupted after {out} was written, complete and verified", "nothing is left to do"
    return (f"interrupted: {out} was not created (what was built of it was removed)",
            f"{again()} to apply the bundle")


def _apply_before(bundle, base, output, *, in_place: bool, abort: bool):
    if in_place:
        return _left(base)
    return _stat(output) if output is not None else None


apply.before = _apply_before


# -- files written whole: pack, squash -o --------------------------------------------------


def written(output, before) -> tuple[str, str | None]:
    """A command that writes one file by temp and rename (its last step)."""
    out = printable(os.fspath(output))
    now = _stat(output)
    if now is not None and now != before:
        return f"interrupted after {out} was written, complete", "nothing is left to do"
    what = "left as it was" if before is not None else "not created"
    return f"interrupted: {out} was {what} (the partial file was removed)", f"{again()} to write it"


written.before = _stat


# -- remotes: push, squash --remote, commit, gc ---------------------------------------------


def remote_write(remote, before, *, what: str) -> tuple[str, str | None]:
    """A command that changes a remote by writing its chain last, in one
    conditional write: the remote holds the chain before or after it."""
    r = printable(os.fspath(remote))
    return (f"interrupted: {what} only when the remote's chain is written, its last step, in one write; "
            f"`wdiff log {r}` shows whether it was",
            f"{again()}: a version the remote has already is not added twice")


def gc(remote, before) -> tuple[str, str | None]:
    """gc writes the chain without the dropped versions in one write, then
    deletes the objects that an earlier gc listed long enough ago."""
    r = printable(os.fspath(remote))
    return (f"interrupted: gc changes the chain of {r} in one write, then deletes objects; the remote holds the "
            f"old chain or the new one, whole (`wdiff log {r}` shows which)",
            f"{again()}: it goes on from what it finds")


def commit(remote, stage, before) -> tuple[str, str | None]:
    r = printable(os.fspath(remote))
    return (f"interrupted: the commit publishes the version only when the chain of {r} is written, in one write; "
            f"the stage {printable(stage, 80)} is kept until then (`wdiff log {r}` shows whether it was)",
            f"{again()}: a version the remote has already is not added twice")


def staged(remote, stage, before) -> tuple[str, str | None]:
    """push --stage: a part goes into a stage, which no reader sees."""
    return (f"interrupted: the part for stage {printable(stage, 80)} of {printable(os.fspath(remote))} may be partly "
            "uploaded; nothing of it is visible until `wdiff commit`",
            f"{again()} to stage the part")


def read_only(before) -> tuple[str, str | None]:
    return "interrupted; nothing was changed", f"{again()} to start over"
