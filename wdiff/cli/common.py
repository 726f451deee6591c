"""The Typer application object and what every command shares: the options
defined once, the output setup, the mapping of options onto the library's
functions, the version flag."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..defaults import __version__
from ..errors import EXIT_CODE_TABLE, UsageError
from . import output as o
from .state import STATE

EXIT_STATUS = "\n".join(f"  {int(code):>3}  {text}" for code, text in EXIT_CODE_TABLE)

app = typer.Typer(
    name="wdiff",
    help=(
        "Diff, pack, ship and apply model checkpoint deltas: bit-exact, verified, streaming.\n\n"
        "wdiff finds what changed between two checkpoint directories (sharded safetensors "
        "plus companion files), packs only that into a small verified bundle, and rebuilds "
        "the new checkpoint bit for bit from the old one."
    ),
    epilog="Exit status (every command):\n\n\b\n" + EXIT_STATUS + "\n\nEnvironment: WDIFF_THREADS (worker threads), WDIFF_CACHE_DIR (manifest cache; none: off), WDIFF_NATIVE=0 (numpy kernels), WDIFF_DEBUG=1 (tracebacks), NO_COLOR.",
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 80},
    no_args_is_help=True,
    add_completion=False,
)

# -- options shared by every command, defined once -------------------------------------

Json = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document on stdout.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing on success.")]
Verbose = Annotated[int, typer.Option("--verbose", "-v", count=True, help="More detail (repeatable).")]
Threads = Annotated[
    Optional[int],
    typer.Option("--threads", "-j", min=1, max=256, help="Worker threads [default: all cores, or WDIFF_THREADS]."),
]
SignKey = Annotated[
    Optional[Path],
    typer.Option("--sign", metavar="KEY", help="Sign with this minisign secret key (see wdiff keygen).", show_default=False),
]
TrustedKeys = Annotated[
    Optional[list[Path]],
    typer.Option("--trusted-key", metavar="KEY.pub", help="Accept only what this public key signed (repeatable; default: WDIFF_TRUSTED_KEYS).", show_default=False),
]
RequireSig = Annotated[bool, typer.Option("--require-signature", help="Refuse anything unsigned (needs a trusted key).")]
Exclude = Annotated[
    Optional[list[str]],
    typer.Option("--exclude", metavar="PATTERN", show_default=False,
                 help="Leave out files matching PATTERN (gitignore syntax; repeatable), as .wdiffignore does."),
]
Include = Annotated[
    Optional[list[str]],
    typer.Option("--include", metavar="PATTERN", show_default=False,
                 help="Keep files matching PATTERN even if a default, .wdiffignore or --exclude leaves them out (repeatable)."),
]
MaxAge = Annotated[
    Optional[str],
    typer.Option("--max-age", metavar="AGE", help="Refuse a signed chain published longer ago than this (90s, 10m, 2h, 7d): a frozen remote.", show_default=False),
]
Level = Annotated[
    int, typer.Option("--level", "-l", min=1, max=22, help="zstd level (1 is the fastest and, for weights, the smallest).")
]


def _setup(json_mode: bool, quiet: bool, verbose: int) -> o.Out:
    out = o.Out(quiet=quiet, verbose=verbose, json_mode=json_mode)
    STATE.out = out
    return out


#: options every command has that shape the output, not the library call
PRESENTATION = frozenset({"json_mode", "quiet", "verbose"})


def call(fn, options: dict, /, *, cli: tuple[str, ...] = (), **given):
    """Call the library function ``fn`` with a command's ``options`` (its
    parameters as typer parsed them: ``dict(locals())`` taken first thing):
    each goes to the parameter of ``fn`` of the same name, so that an option
    is written once in the library and once here. ``given`` values (converted
    from their text, or under another name) take precedence; None leaves a
    parameter that has a default at it. An option that names no parameter
    of ``fn`` is a bug here (TypeError), unless it shapes the output only
    (:data:`PRESENTATION`) or the command says it is its own (``cli``)."""
    params = inspect.signature(fn).parameters
    stale = [name for name in cli if name not in options]
    if stale:
        raise TypeError(f"{stale} are not options of the command that calls {fn.__qualname__}")
    args = {}
    for name, value in options.items():
        if name in given or name in cli or name in PRESENTATION:
            continue
        if name not in params:
            raise TypeError(f"option {name!r} of the command line names no parameter of {fn.__qualname__}")
        if value is None and params[name].default is not inspect.Parameter.empty:
            continue
        args[name] = value
    for name, value in given.items():
        if name not in params:
            raise TypeError(f"{name!r} names no parameter of {fn.__qualname__}")
        args[name] = value
    return fn(**args)


def _version(value: bool) -> None:
    if value:
        from ..codec import kernels

        typer.echo(f"wdiff {__version__} ({kernels.features()})")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    pass


Remote = Annotated[str, typer.Argument(metavar="REMOTE", help="A directory, file://PATH, hf://ORG/NAME[@REV][/FOLDER], hf://datasets/ORG/NAME[@REV][/FOLDER], hf://buckets/ORG/NAME[/PREFIX], s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX], az://CONTAINER[/PREFIX] or another fsspec store URL.", show_default=False)]


def _size_arg(text: str) -> int:
    try:
        return o.parse_size(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a size (examples: 20GB, 500MB)") from None


_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _age_arg(text: str | None) -> float | None:
    """Seconds from a duration such as 90s, 10m, 2h or 7d."""
    if text is None:
        return None
    t = text.strip().lower()
    try:
        value = float(t[:-1]) if t and t[-1] in _AGE_UNITS else None
    except ValueError:
        value = None
    if value is None or not value > 0 or value != value:
        raise UsageError(f"{text!r} is not an age (examples: 90s, 10m, 2h, 7d)")
    return value * _AGE_UNITS[t[-1]]
