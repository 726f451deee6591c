"""What the user-experience tests share: the real command line in a child
process (tests/kit's runner, offline, with the common umask), a
pseudo-terminal for stderr, JSON documents, and checks that collect every
broken promise of one scenario before they fail it.

Nothing here imports wdiff: these tests drive ``python -m wdiff`` only, so
they hold whatever the package's insides look like.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from kit.cli import Result, argv, environment, run, run_pty_stderr
from kit.trees import tree

ROOT = Path(__file__).resolve().parents[2]
#: these tests' environment: changes to the test's (kit.cli.environment)
UX_ENV = {"HF_HUB_OFFLINE": "1", "WDIFF_THREADS": "2", "WDIFF_NATIVE": None}
#: the modes the tests read are those of the common umask
UMASK = 0o022


def _umask():  # runs in the child
    os.umask(UMASK)


def wdiff(*args, env=None, **kw) -> Result:
    """Run the real command line (kit.cli.run) in UX_ENV, ``env`` over it;
    stdout and stderr are pipes."""
    return run(*args, env={**UX_ENV, **(env or {})}, **{"umask": UMASK, "timeout": 120, **kw})


def ok(*args, **kw) -> Result:
    """A setup step that must succeed for the scenario to mean anything."""
    return wdiff(*args, want=0, **kw)


def with_pty_stderr(*args, stdout_path, cwd=None, timeout=120) -> Result:
    """Run with stderr on a pseudo-terminal (as at a shell prompt) and
    stdout redirected to ``stdout_path`` (as with ``> report.txt``)."""
    with open(stdout_path, "wb") as out:
        r = run_pty_stderr(*args, stdout=out, cwd=cwd, env={**UX_ENV, "TERM": "xterm-256color"}, umask=UMASK,
                           timeout=timeout)
    return Result(r.args, r.returncode, Path(stdout_path).read_text("utf-8", "replace"), r.stderr)


def interrupted_while_waiting(lock_file: Path, sig: int, *args, cwd=None) -> Result:
    """Run a command that must wait for ``lock_file`` (an flock this process
    holds), and send it ``sig`` once the kernel shows it waiting there."""
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        p = subprocess.Popen(argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                             env=environment(UX_ENV), cwd=cwd, preexec_fn=_umask)
        deadline = time.monotonic() + 20
        while not _waits_for_lock(p.pid):
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                o, e = p.communicate()
                pytest.fail(f"the setup did not work: `wdiff {' '.join(map(str, args))}` never waited on "
                            f"{lock_file} (exit {p.returncode})\n{o.decode()}{e.decode()}")
            time.sleep(0.01)
        p.send_signal(sig)
        o, e = p.communicate(timeout=60)
    finally:
        os.close(fd)
    return Result(p.args, p.returncode, o.decode("utf-8", "replace"), e.decode("utf-8", "replace"))


def _waits_for_lock(pid: int) -> bool:
    # a process blocked in flock() is listed in /proc/locks as a waiter ("->")
    with open("/proc/locks") as f:
        return any("->" in line and f" {pid} " in line for line in f)


def json_docs(text: str) -> list:
    """Every JSON document in ``text``, in order; raises on anything else."""
    dec = json.JSONDecoder()
    docs, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return docs
        doc, i = dec.raw_decode(text, i)
        docs.append(doc)


def one_json_doc(text: str):
    """The single JSON document ``text`` holds, or None when it is not exactly one."""
    try:
        docs = json_docs(text)
    except ValueError:
        return None
    return docs[0] if len(docs) == 1 else None


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def listing(d) -> set[str]:
    return set(os.listdir(d))


def weights_tree(d) -> dict[str, bytes]:
    """The checkpoint's own files (factory.tree, without .git/ and .cache/)."""
    return tree(d, skip=(".wdiff", ".git", ".cache"))


def copy_ckpt(src, dst) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return Path(dst)


class Promises:
    """Collect every broken promise of one scenario, then fail once, listing
    them all: one test per issue item, and no item hides behind another."""

    def __init__(self) -> None:
        self.broken: list[str] = []

    def check(self, cond, promise: str, result=None) -> bool:
        if not cond:
            detail = textwrap.indent(str(result), "    ") if result is not None else ""
            self.broken.append(f"- {promise}\n{detail}".rstrip())
        return bool(cond)

    def __enter__(self) -> Promises:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and self.broken:
            pytest.fail(f"{len(self.broken)} broken promise(s):\n" + "\n".join(self.broken), pytrace=False)


SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}
