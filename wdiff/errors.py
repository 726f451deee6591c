"""The error tree. Every error wdiff raises is a :class:`WdiffError`; each class
carries the process exit code the command line uses for it.

Exit codes are part of the scripting contract (see ``wdiff --help`` and the
README) and never change meaning once released.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The exit status of every wdiff command, and of every error the library
    raises (``WdiffError.exit_code``): documented in --help, the man pages and
    the README, and stable for scripts."""

    OK = 0
    DIFFERENCES = 1  # only when asked (diff or status --exit-code, generate --check), never an error
    USAGE = 2  # bad arguments, or an unexpected (unclassified) error
    NOT_FOUND = 3  # a path, file, tensor or version that does not exist
    INTEGRITY = 4  # corrupt or malformed bundle or checkpoint, digest mismatch
    BASE_MISMATCH = 5  # the bundle was made for another base; or pull refuses to discard local changes
    REMOTE = 6  # network or remote store failure
    AUTH = 7  # the remote refused our credentials
    BUSY = 8  # locked by another wdiff, or an unfinished operation needs attention
    IO = 9  # the operating system refused: disk full, permission denied, ...
    INTERRUPTED = 130  # SIGINT / SIGTERM


#: (code, meaning) rows, in the order the docs print them.
EXIT_CODE_TABLE: tuple[tuple[int, str], ...] = (
    (ExitCode.OK, "success"),
    (ExitCode.DIFFERENCES, "differences found (only when asked, with --exit-code or --check)"),
    (ExitCode.USAGE, "usage error, or an unexpected error"),
    (ExitCode.NOT_FOUND, "not found: path, file or version"),
    (ExitCode.INTEGRITY, "integrity failure: corrupt bundle or checkpoint, digest mismatch"),
    (ExitCode.BASE_MISMATCH, "base mismatch: not the bundle's base, or local changes (pull --force)"),
    (ExitCode.REMOTE, "remote or network failure"),
    (ExitCode.AUTH, "authentication refused by the remote"),
    (ExitCode.BUSY, "busy: locked by another wdiff, or an unfinished apply"),
    (ExitCode.IO, "I/O error: disk full, permission denied, ..."),
    (ExitCode.INTERRUPTED, "interrupted"),
)


class WdiffError(Exception):
    """Base of every error wdiff raises on purpose."""

    exit_code: ExitCode = ExitCode.USAGE
    #: short machine-readable kind, used in --json error documents
    kind: str = "error"

    def __init__(self, message: str, *, hint: str | None = None, details: dict | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        #: the result that came with the failure (verify's problems), for the
        #: ``error.details`` member of a --json error document
        self.details = details

    def __str__(self) -> str:
        return self.message


class UsageError(WdiffError):
    exit_code = ExitCode.USAGE
    kind = "usage"


class LayoutError(UsageError):
    """A checkpoint directory laid out in a way wdiff does not handle (a
    symlinked subdirectory, an unprintable file name): the user's to fix, not
    corrupt data. Hostile names read from a bundle are FormatErrors."""

    kind = "layout"


class NotFoundError(WdiffError):
    exit_code = ExitCode.NOT_FOUND
    kind = "not-found"


class IntegrityError(WdiffError):
    """Something is not what its digests, magic or structure say it must be."""

    exit_code = ExitCode.INTEGRITY
    kind = "integrity"


class FormatError(IntegrityError):
    """Malformed input: not a bundle, unsupported version, invalid header."""

    kind = "format"


class BaseMismatchError(WdiffError):
    exit_code = ExitCode.BASE_MISMATCH
    kind = "base-mismatch"


class LocalChangesError(BaseMismatchError):
    """A pull would discard what the directory holds: files of its recorded
    version that changed here, or untracked files where the new version
    puts its own. Exit 5: the directory is not the base the pull starts
    from, which is what "base mismatch" means; --force discards them."""

    kind = "local-changes"


class BusyError(WdiffError):
    exit_code = ExitCode.BUSY
    kind = "busy"


class ConflictError(BusyError):
    """Someone else changed the remote chain between our read and our write."""

    kind = "conflict"


class WdiffIOError(WdiffError):
    exit_code = ExitCode.IO
    kind = "io"


class RemoteError(WdiffError):
    exit_code = ExitCode.REMOTE
    kind = "remote"


class AuthError(RemoteError):
    exit_code = ExitCode.AUTH
    kind = "auth"


class Interrupted(WdiffError):
    exit_code = ExitCode.INTERRUPTED
    kind = "interrupted"
