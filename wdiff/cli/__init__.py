"""The ``wdiff`` command line. :func:`main` is the console script: it runs the
Typer app and turns every outcome into a documented exit code. No exception
escapes as a traceback unless WDIFF_DEBUG=1; nothing ever exits 1 but
``diff --exit-code`` finding differences."""

from __future__ import annotations

import os
import sys

ENV_DEBUG = "WDIFF_DEBUG"


# Longer than most functions, on purpose: every way a command can end is mapped
# here, in one place, to its documented exit code; the length is the list of cases.
def main(argv: list[str] | None = None) -> int:
    import errno
    import signal

    import typer

    from ..errors import ExitCode, WdiffError
    from ..paths import printable
    from . import output
    from .app import app
    from .state import STATE

    STATE.out = None
    command = typer.main.get_command(app)
    debug = os.environ.get(ENV_DEBUG, "") not in ("", "0")

    def fail(code: int, kind: str, message: str, hint: str | None = None) -> int:
        message = printable(message, 4000)
        output.error(message, printable(hint, 1000) if hint else None)
        if STATE.out is not None and STATE.out.json:
            STATE.out.document({"schema": "wdiff.error/1", "error": {"kind": kind, "message": message, "hint": hint, "exit_code": code}})
        return code

    def on_term(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        rv = command.main(args=argv, prog_name="wdiff", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except typer.Exit as e:
        code = e.exit_code
    except typer.Abort:
        code = fail(ExitCode.INTERRUPTED, "interrupted", "interrupted")
    except typer.TyperException as e:
        show = getattr(e, "show", None)
        if show is not None:
            show()
        else:
            output.error(printable(e.format_message(), 4000))
        code = ExitCode.USAGE
    except WdiffError as e:
        if debug:
            import traceback

            traceback.print_exc()
        code = fail(int(e.exit_code), e.kind, e.message, e.hint)
    except KeyboardInterrupt:
        code = fail(ExitCode.INTERRUPTED, "interrupted", "interrupted")
    except BrokenPipeError:
        # the reader went away (| head): not our failure; keep quiet
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        code = ExitCode.OK
    except OSError as e:
        # an OS error that no layer below turned into a WdiffIOError: still a
        # documented I/O failure, named by its path
        if debug:
            import traceback

            traceback.print_exc()
        where = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None)
        reason = e.strerror or str(e)
        code = fail(ExitCode.IO, "io", f"{where}: {reason}" if where else reason,
                    "free some space" if e.errno == errno.ENOSPC else None)
    except MemoryError:
        code = fail(ExitCode.USAGE, "internal", "out of memory")
    except Exception as e:  # noqa: BLE001 - the last line of defence
        if debug:
            import traceback

            traceback.print_exc()
        code = fail(ExitCode.USAGE, "internal", f"unexpected error: {type(e).__name__}: {e}",
                    f"this is a bug; rerun with {ENV_DEBUG}=1 for a traceback and report it")
    finally:
        signal.signal(signal.SIGTERM, previous)
    try:
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        pass
    return int(code)


def run() -> None:  # pragma: no cover - thin shim for the console script
    # wdiff's own threads do the work and it makes no BLAS calls that need
    # more than one; the pool OpenBLAS starts at numpy's import, a thread
    # per core, only spins beside them (0.05-0.1 s of CPU per command)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # A checkpoint of 20,000 tensors puts a few hundred thousand small
    # objects in memory for the whole command, and the cyclic collector's
    # default pace (every 700 allocations) walks them again and again:
    # 0.1-0.3 s of a diff. wdiff makes few cycles; collecting every 50,000
    # allocations still bounds what they can hold.
    import gc

    gc.set_threshold(50_000, 10, 10)
    code = main()
    if code in (0, 1):
        # Done, every file closed and synced, output flushed: skip the
        # interpreter's teardown of a few hundred modules (0.15 s of every
        # command; wdiff registers no exit handlers). Errors exit normally.
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (BrokenPipeError, OSError):
            pass
        os._exit(code)
    sys.exit(code)
