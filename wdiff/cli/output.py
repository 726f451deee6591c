"""Everything the command line prints: result rendering on stdout, messages
and progress on stderr. Nothing from a checkpoint or bundle is printed
without going through :func:`wdiff.paths.printable`."""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time

from ..paths import printable
from ..progress import Reporter, size_text


class Out:
    """Output settings of one invocation."""

    def __init__(self, *, quiet: bool = False, verbose: int = 0, json_mode: bool = False) -> None:
        self.quiet = quiet
        self.verbose = verbose
        self.json = json_mode
        self._live: list[TerminalReporter] = []

    def reporter(self, *, timings: bool = False) -> TerminalReporter:
        """A progress reporter whose display this invocation owns: it is
        taken down before the first line of the result, whether or not the
        operation said it was done (an early return, an error). With
        ``timings``, -v also says how long each phase took."""
        r = TerminalReporter(self, timings=timings)
        self._live.append(r)
        return r

    def close(self) -> None:
        """Take down every live display (before results, errors, exit)."""
        for r in self._live:
            r.done()

    def result(self, text: str) -> None:
        """A line of the human result on stdout (suppressed by -q)."""
        if not self.quiet and not self.json:
            self.close()
            sys.stdout.write(text + "\n")

    def document(self, doc: dict) -> None:
        """The one JSON document of a --json invocation: indented for a
        person at a terminal, one line for a program (Python's C encoder
        only writes unindented JSON, ten times faster on a diff of 20,000
        tensors)."""
        self.close()
        indent = 2 if sys.stdout.isatty() else None
        sys.stdout.write(json.dumps(doc, indent=indent, sort_keys=False, allow_nan=False, default=_jsonable) + "\n")

    def info(self, text: str) -> None:
        if not self.quiet and self.verbose:
            self.close()
            sys.stderr.write(text + "\n")

    def warn(self, text: str) -> None:
        if not self.quiet:
            self.close()
            sys.stderr.write(f"wdiff: warning: {text}\n")


def _timing(what: str, dt: float, n: int, *, sep: str = ": ") -> str:
    rate = f" ({size_text(int(n / dt))}/s)" if n and dt >= 0.01 else ""
    return f"{what}{sep}{size_text(n)} in {dt:.2f} s{rate}" if n else f"{what}{sep}{dt:.2f} s"


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    raise TypeError(type(x).__name__)


def error(text: str, hint: str | None = None) -> None:
    sys.stderr.write(f"wdiff: error: {text}\n")
    if hint:
        sys.stderr.write(f"wdiff: hint: {hint}\n")


def name(s: str, limit: int = 200) -> str:
    return printable(s, limit)


def size(n: int | None) -> str:
    """Human bytes (:func:`wdiff.progress.size_text`); ``-`` for unknown."""
    return "-" if n is None else size_text(n)


_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmgtp])(i)?)?b?\s*", re.I)
_POWER = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_size(text: str) -> int:
    """'20GB', '500 MB', '1.5TiB', '4k' or plain bytes -> bytes. Decimal units
    (kB, MB, GB, TB, PB: powers of 1000) and binary ones (KiB, MiB, GiB, TiB,
    PiB: powers of 1024), in any case, as transformers' ``max_shard_size``
    and most tools read them. Raises ValueError for anything else."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise ValueError(f"not a size: {text!r}")
    number, unit, binary = m.groups()
    base = 1024 if binary else 1000
    value = float(number) * base ** _POWER[unit.lower()] if unit else float(number)
    if not math.isfinite(value) or value != int(value) and not unit:
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return int(value)


def version(fp: bytes | None, labels: dict | None = None, *, none: str = "nothing") -> str:
    """A version as messages name it: by its label where the remote gives
    one, then its fingerprint as ``wdiff log`` shows it (``step-4
    (dea9c1b2c3d4)``); the fingerprint alone otherwise."""
    if fp is None:
        return none
    from ..format.chain import version_name  # here: the chain's module is ~5 ms of every command's start

    label = (labels or {}).get(fp)
    return version_name(fp, {fp: name(label, 80)} if label else None)


def count(n: int) -> str:
    return f"{n:,}"


def pct(x: float) -> str:
    if x == 0:
        return "0%"
    if x < 0.0001:
        return "<0.01%"
    return f"{100 * x:.2f}%"


def sci(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if x != x:
        return "nan"
    if math.isinf(x):
        return "inf"
    return "0" if x == 0 else f"{x:.3g}"


def shape(s) -> str:
    return "x".join(str(d) for d in s) if s else "scalar"


def table(rows: list[list[str]], *, right: set[int] = frozenset()) -> list[str]:
    """Plain aligned columns, stable for scripts and readable for people."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append("  ".join(cells).rstrip())
    return out


class TerminalReporter(Reporter):
    """Progress bars on stderr, only when stderr is a terminal and the user
    did not ask for -q or --json; warnings go to stderr unless -q; with -v
    (-vv) the operation's notes of its level, and with ``timings`` how long
    its phases took (-v: :meth:`summary`, once; -vv: each as it ends), on
    stderr too: stdout keeps the result alone."""

    def __init__(self, out: Out, *, timings: bool = False) -> None:
        self.out = out
        self._progress = None
        self._task = None
        self._enabled = (sys.stderr.isatty() and not out.quiet and not out.json
                         and os.environ.get("TERM") != "dumb")
        self._timings = timings and out.verbose > 0 and not out.quiet
        self._timed: list | None = None  # [name, start, bytes] of the phase being timed
        self._times: dict[str, list] = {}  # phase name -> [seconds, bytes], in the order they began
        self._t0 = time.monotonic()

    def _start(self):
        """The display starts with the first phase, not before: a command
        that fails or answers at once never draws one. It never redirects
        stdout or stderr (rich's default): the result goes to stdout, a file
        or a pipe, wherever stderr is."""
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        console = Console(stderr=True, no_color=bool(os.environ.get("NO_COLOR")))
        self._progress = Progress(
            TextColumn("{task.description:>14}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._progress.start()

    def phase(self, name: str, total: int | None = None) -> None:
        self._end_phase()
        if self._timings:
            self._timed = [name, time.monotonic(), 0]
        if self._progress is None:
            if not self._enabled:
                return
            self._start()
        if self._task is not None:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(name, total=total)

    def advance(self, n: int) -> None:
        if self._timed is not None:
            self._timed[2] += n
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, n)

    def warn(self, message: str) -> None:
        if self._progress is not None:
            self._progress.console.print(f"wdiff: warning: {message}", markup=False, highlight=False)
        else:
            self.out.warn(message)

    def file(self, name: str, size: int) -> None:
        self.note(f"fetching {name} ({size_text(size)})", level=2)

    def note(self, message: str, *, level: int = 1) -> None:
        if self.out.quiet or self.out.verbose < level:
            return
        text = printable(message, 4000, backslashes=False)
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            sys.stderr.write(text + "\n")

    def _end_phase(self) -> None:
        """With timings: the phase that ends, its bytes and seconds (-vv)."""
        if self._timed is None:
            return
        what, t0, n = self._timed
        self._timed = None
        dt = time.monotonic() - t0
        got = self._times.setdefault(what, [0.0, 0])
        got[0] += dt
        got[1] += n
        self.note(_timing(what, dt, n), level=2)

    def summary(self) -> None:
        """-v with timings: one line of where the time went, phase by phase."""
        self._end_phase()
        if not self._times:
            return
        parts = [_timing(what, dt, n, sep=" ") for what, (dt, n) in self._times.items()]
        self.note(f"took {time.monotonic() - self._t0:.2f} s: " + ", ".join(parts))

    def done(self) -> None:
        self._end_phase()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._task = None
