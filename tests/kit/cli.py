"""The command line, as the tests run it: :func:`run` runs ``python -m
wdiff ARGS`` (or the installed console script) in a child process, as a
user or a script does; :func:`in_process` runs the same ``main()`` inside
this process, through typer's CliRunner, where a test needs no process of
its own. Both take the same environment and give the same :class:`Result`.

The environment of a run is the test's own (``os.environ``: the private
cache and state directories tests/conftest.py sets, any monkeypatch) made
plain (:func:`environment`): none of the developer's knobs that change what
wdiff says (a traceback with WDIFF_DEBUG, a signature policy with
WDIFF_TRUSTED_KEYS), no colour, 80 columns. ``env`` changes it: a value
sets a variable, None removes it (CliRunner's convention).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

#: the developer's settings a run leaves out unless ``env`` puts them back
UNSET = ("WDIFF_DEBUG", "WDIFF_TRUSTED_KEYS")
#: what every run sets: plain text, the width the expected outputs were written at
PLAIN = {"NO_COLOR": "1", "COLUMNS": "80"}

_EXE = Path(sys.executable).parent / "wdiff"
#: the console script installed beside this interpreter (None: not installed)
SCRIPT = str(_EXE) if _EXE.exists() else None


def argv(*args, script: bool = False) -> list[str]:
    """The command: ``python -m wdiff ARGS``, or with ``script`` the
    installed console script (``python -m wdiff`` where there is none)."""
    head = [SCRIPT] if script and SCRIPT else [sys.executable, "-m", "wdiff"]
    return [*head, *map(str, args)]


def environment(env: Mapping[str, object] | None = None) -> dict[str, str]:
    """This process's environment made plain (see the module), then ``env``
    over it: a value sets a variable (str() of it), None removes it."""
    e = {k: v for k, v in os.environ.items() if k not in UNSET}
    e.update(PLAIN)
    for k, v in (env or {}).items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = str(v)
    return e


class Result(subprocess.CompletedProcess):
    """A finished run: ``returncode``, ``stdout``, ``stderr`` (str, or bytes
    with ``text=False``), also read as ``rc``, ``out`` and ``err``; str() of
    it is the whole story, for an assertion's message."""

    @property
    def rc(self) -> int:
        return self.returncode

    @property
    def out(self):
        return self.stdout

    @property
    def err(self):
        return self.stderr

    @property
    def text(self):
        """stdout and stderr, one after the other."""
        return self.stdout + self.stderr

    def __str__(self) -> str:
        def tail(s) -> str:
            s = s.decode("utf-8", "replace") if isinstance(s, bytes) else s
            return s[-3000:]

        return (f"$ {shlex.join(map(str, self.args))}\nexit status {self.returncode}\n"
                f"--- stdout\n{tail(self.stdout)}--- stderr\n{tail(self.stderr)}")


def _check(r: Result, want: int | None) -> Result:
    assert want is None or r.returncode == want, f"wanted exit status {want}:\n{r}"
    return r


def run(*args, env: Mapping[str, object] | None = None, cwd=None, want: int | None = None, script: bool = False,
        text: bool = True, umask: int | None = None, timeout: float = 300) -> Result:
    """Run ``wdiff ARGS`` in a child process and wait for it.

    ``env``: changes to the plain environment (see the module); ``cwd``: the
    directory it runs in; ``want``: the exit status it must end with (an
    assertion, with the whole run in its message), None for any;
    ``script``: the installed console script rather than ``python -m
    wdiff``; ``text``: stdout and stderr as str (UTF-8, undecodable bytes
    replaced, newlines as written), or bytes; ``umask``: the child's umask
    (the file modes a test reads); ``timeout``: seconds before it is killed
    (subprocess.TimeoutExpired). stdin is /dev/null."""
    cmd = argv(*args, script=script)
    preexec = None if umask is None else (lambda: os.umask(umask))
    p = subprocess.run(cmd, capture_output=True, env=environment(env), cwd=cwd, timeout=timeout,
                       stdin=subprocess.DEVNULL, preexec_fn=preexec)
    out, err = p.stdout, p.stderr
    if text:
        out, err = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    return _check(Result(cmd, p.returncode, out, err), want)


def run_pty_stderr(*args, env: Mapping[str, object] | None = None, cwd=None, stdout=subprocess.PIPE,
                   umask: int | None = None, timeout: float = 300) -> Result:
    """Run ``wdiff ARGS`` with stderr on a pseudo-terminal (as at a shell
    prompt: progress is drawn there) and ``stdout`` a pipe, or a file
    object (as with ``> report.txt``: the Result's stdout is then empty).
    stderr comes back as the terminal received it (str, escapes and all);
    ``env``, ``cwd``, ``umask`` and ``timeout`` as for :func:`run`."""
    import threading

    cmd = argv(*args)
    preexec = None if umask is None else (lambda: os.umask(umask))
    master, slave = os.openpty()
    seen = bytearray()

    def drain():
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            seen.extend(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        p = subprocess.run(cmd, check=False, stdout=stdout, stderr=slave, stdin=subprocess.DEVNULL, cwd=cwd,
                           env=environment(env), timeout=timeout, preexec_fn=preexec)
    finally:
        os.close(slave)
        reader.join(5)
        os.close(master)
    out = p.stdout.decode("utf-8", "replace") if p.stdout is not None else ""
    return Result(cmd, p.returncode, out, bytes(seen).decode("utf-8", "replace"))


def ok(*args, **kw) -> Result:
    """:func:`run` that must succeed (exit status 0)."""
    return run(*args, want=0, **kw)


def in_process(*args, env: Mapping[str, object] | None = None, want: int | None = None) -> Result:
    """``wdiff.cli.main(ARGS)`` in this process, inside typer's CliRunner
    isolation: stdout and stderr caught, the environment as :func:`run`
    makes it for the call's length. No start-up cost, and a test can patch
    what the command calls; but it shares this process (its signal
    handlers, its imported modules): a test of the command line as users
    run it uses :func:`run`."""
    from typer.testing import CliRunner

    from wdiff.cli import main

    changes: dict = {k: None for k in UNSET}
    changes.update(PLAIN)
    changes.update({k: (None if v is None else str(v)) for k, v in (env or {}).items()})
    with CliRunner().isolation(env=changes) as (out, err, _mixed):
        code = main([str(a) for a in args])
        sys.stdout.flush()
        sys.stderr.flush()
        o, e = out.getvalue(), err.getvalue()
    return _check(Result(["wdiff", *map(str, args)], code, o.decode("utf-8", "replace"),
                         e.decode("utf-8", "replace")), want)
