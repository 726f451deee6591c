"""The ``wdiff`` command line. :func:`main` is the console script: it runs the
Typer app and turns every outcome into a documented exit code. No exception
escapes as a traceback unless WDIFF_DEBUG=1; nothing ever exits 1 but a
command asked to report differences (``diff``/``status --exit-code``) that
found some. Every other failure prints one message on stderr and, under
--json, one ``wdiff.error/1`` document on stdout."""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

ENV_DEBUG = "WDIFF_DEBUG"


def _wants_json(argv: list[str]) -> bool:
    """Whether --json is among the options, read before parsing so that a
    usage error (found while parsing) is reported as a JSON document too."""
    for a in argv:
        if a == "--":
            return False
        if a == "--json":
            return True
    return False


class _Signalled:
    """SIGINT and SIGTERM both raise KeyboardInterrupt (a BaseException, so
    no broad ``except Exception`` in the library can swallow it), and are
    remembered: typer turns KeyboardInterrupt into a silent Exit(130), which
    would otherwise lose the message and the error document."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> _Signalled:
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (main() called from a library user's thread)
                pass
        return self

    def _handle(self, signum, frame):
        self.signum = signum
        raise KeyboardInterrupt

    def __exit__(self, *exc) -> None:
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class _LazyCommands(MutableMapping):
    """The subcommands of the group, in the order they registered, each
    turned from its function into a click command (typer inspects its
    signature and options: ~4 ms a command, ~60 ms for all of them) only when
    it is looked up: ``wdiff diff A B`` builds ``diff`` alone; ``wdiff
    --help``, which lists every command, builds them all."""

    def __init__(self, infos, convert) -> None:
        self._infos = {info.name or _command_name(info.callback.__name__): info for info in infos}
        self._built: dict = {}
        self._convert = convert

    def __getitem__(self, name: str):
        cmd = self._built.get(name)
        if cmd is None:
            cmd = self._built[name] = self._convert(self._infos[name])
        return cmd

    def __setitem__(self, name: str, cmd) -> None:
        self._infos.setdefault(name, None)
        self._built[name] = cmd

    def __delitem__(self, name: str) -> None:
        del self._infos[name]
        self._built.pop(name, None)

    def __iter__(self):
        return iter(list(self._infos))

    def __len__(self) -> int:
        return len(self._infos)


def _command_name(function_name: str) -> str:
    return function_name.lower().replace("_", "-")  # typer's own rule (typer.main.get_command_name)


def _lazy_group(app):
    """The click group of ``app``, as ``typer.main.get_command(app)`` makes
    it, but with its subcommands built on first use (:class:`_LazyCommands`)."""
    import typer

    from .coerce import quicken

    infos = app.registered_commands
    if app.registered_groups or app.registered_callback is None:  # not wdiff's shape: build it all
        return typer.main.get_command(app)
    app.registered_commands = []
    try:
        group = typer.main.get_command(app)  # the group itself: its callback (--version) and help
    finally:
        app.registered_commands = infos

    def convert(info):
        cmd = typer.main.get_command_from_info(
            info, pretty_exceptions_short=app.pretty_exceptions_short, rich_markup_mode=app.rich_markup_mode
        )
        quicken(cmd)  # typer 0.29's option values without pydantic
        return cmd

    quicken(group)
    group.commands = _LazyCommands(infos, convert)
    return group


# Longer than most functions, on purpose: every way a command can end is mapped
# here, in one place, to its documented exit code; the length is the list of cases.
def main(argv: list[str] | None = None) -> int:
    import errno

    import typer

    from ..errors import ExitCode, WdiffError
    from ..paths import printable
    from . import interrupts, output
    from .app import app
    from .state import STATE

    args = list(sys.argv[1:] if argv is None else argv)
    interrupts.reset(args)
    STATE.out = output.Out(json_mode=True) if _wants_json(args) else None
    command = _lazy_group(app)
    debug = os.environ.get(ENV_DEBUG, "") not in ("", "0")

    def fail(code: int, kind: str, message: str, hint: str | None = None, details: dict | None = None) -> int:
        if STATE.out is not None:
            STATE.out.close()
        # the names in a message are printable() already: no second escape
        # of their backslashes, only of what could still drive a terminal
        message = printable(message, 4000, backslashes=False)
        output.error(message, printable(hint, 1000, backslashes=False) if hint else None)
        if STATE.out is not None and STATE.out.json:
            error = {"kind": kind, "message": message, "hint": hint, "exit_code": int(code)}
            if details is not None:
                error["details"] = details
            STATE.out.document({"schema": "wdiff.error/1", "error": error})
        return int(code)

    def interrupted() -> int:
        # what was kept, and the next step: the command armed a describer
        return fail(ExitCode.INTERRUPTED, "interrupted", *interrupts.describe())

    with _Signalled() as signalled:
        try:
            rv = command.main(args=args, prog_name="wdiff", standalone_mode=False)
            code = rv if isinstance(rv, int) else 0
            if code == ExitCode.INTERRUPTED or signalled.signum is not None:
                code = interrupted()  # typer's own KeyboardInterrupt -> Exit(130)
        except typer.Exit as e:
            code = interrupted() if e.exit_code == ExitCode.INTERRUPTED else e.exit_code
        except typer.Abort:
            code = interrupted()
        except typer.TyperException as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # typer keeps its click private: known by name
                e.show()  # `wdiff` alone: the help is the message
                code = ExitCode.USAGE
            else:
                ctx = getattr(e, "ctx", None)
                if ctx is not None:
                    sys.stderr.write(ctx.get_usage() + "\n")
                where = (f"wdiff {ctx.command_path.split(' ', 1)[1]} --help"
                         if ctx is not None and " " in ctx.command_path else "wdiff --help")
                code = fail(ExitCode.USAGE, "usage", e.format_message(), f"see `{where}`")
        except WdiffError as e:
            if debug:
                import traceback

                traceback.print_exc()
            code = fail(e.exit_code, e.kind, e.message, e.hint, e.details)
        except KeyboardInterrupt:
            code = interrupted()
        except SystemExit as e:
            # typer exits 1 itself on EPIPE: the reader went away (| head)
            if isinstance(e.__context__, BrokenPipeError):
                code = _quiet_broken_pipe()
            elif e.code in (0, None):
                code = ExitCode.OK
            else:  # nothing in wdiff calls sys.exit; never a silent or a lying exit status
                code = fail(ExitCode.USAGE, "internal", f"unexpected exit (status {e.code})",
                            f"this is a bug; rerun with {ENV_DEBUG}=1 for a traceback and report it")
        except BrokenPipeError:
            code = _quiet_broken_pipe()
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
            if STATE.out is not None:
                STATE.out.close()
    try:
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        pass
    return int(code)


def _quiet_broken_pipe() -> int:
    """The reader of stdout went away (``| head``): not our failure."""
    try:
        sys.stdout = open(os.devnull, "w")
    except OSError:
        pass
    return 0


def run() -> None:  # pragma: no cover - thin shim for the console script
    # the process's own settings (BLAS threads, the collector's pace, the
    # allocator), before numpy is imported: see wdiff/process.py
    from .. import process

    process.setup()
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
