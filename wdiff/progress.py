"""How the library reports what it is doing, without printing.

Operations take a :class:`Reporter`; the command line passes one that draws
progress bars on a terminal, tests and library users get the silent default.
"""

from __future__ import annotations


class Reporter:
    """Receives progress and warnings. Every method may be called from the
    thread that runs the operation only; implementations must be cheap."""

    def phase(self, name: str, total: int | None = None) -> None:
        """A new phase starts; ``total`` is its amount of work in bytes."""

    def advance(self, n: int) -> None:
        """``n`` more bytes of the current phase are done."""

    def file(self, name: str, size: int) -> None:
        """Within the current phase, the transfer of one file (a part of a
        bundle on a remote, ``size`` bytes) starts; its bytes keep arriving
        through :meth:`advance`, as part of the phase's."""

    def warn(self, message: str) -> None:
        """Something the user should know; the operation goes on."""

    def note(self, message: str, *, level: int = 1) -> None:
        """Detail for a verbose run: what the operation plans and does
        (``level`` 1: shown with -v; 2: with -vv). Never needed to act."""

    def done(self) -> None:
        """The operation finished (or failed); remove any live display."""


SILENT = Reporter()


def size_text(n: int) -> str:
    """Human bytes, decimal units as disk and network vendors use them (the
    one spelling of a size in wdiff's output and messages)."""
    x: float = n
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(x) < 1000 or unit == "TB":
            return f"{n} B" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1000
    return f"{n} B"
