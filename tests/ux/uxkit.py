"""What the user-experience tests share: the real command line in a child
process, a pseudo-terminal for stderr, JSON documents, and checks that
collect every broken promise of one scenario before they fail it.

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
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from factory import tree

ROOT = Path(__file__).resolve().parents[2]


def _env(extra: dict | None = None) -> dict:
    e = dict(os.environ, COLUMNS="80", NO_COLOR="1", HF_HUB_OFFLINE="1", WDIFF_THREADS="2")
    for k in ("WDIFF_DEBUG", "WDIFF_TRUSTED_KEYS", "WDIFF_NATIVE"):
        e.pop(k, None)
    if extra:
        e.update(extra)
    return e


def _umask():  # runs in the child: the modes tests need the common umask
    os.umask(0o022)


@dataclass
class Result:
    args: tuple
    rc: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err

    def __str__(self) -> str:
        return (f"$ wdiff {' '.join(map(str, self.args))}\nexit status {self.rc}\n"
                f"--- stdout\n{self.out[-3000:]}--- stderr\n{self.err[-3000:]}")


def cmd(*args) -> list[str]:
    return [sys.executable, "-m", "wdiff", *map(str, args)]


def wdiff(*args, cwd=None, env=None, timeout=120) -> Result:
    """Run the real command line; stdout and stderr are pipes."""
    p = subprocess.run(cmd(*args), capture_output=True, env=_env(env), cwd=cwd, timeout=timeout,
                       stdin=subprocess.DEVNULL, preexec_fn=_umask)
    return Result(args, p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"))


def ok(*args, **kw) -> Result:
    """A setup step that must succeed for the scenario to mean anything."""
    r = wdiff(*args, **kw)
    assert r.rc == 0, f"setup step failed:\n{r}"
    return r


def with_pty_stderr(*args, stdout_path, cwd=None, timeout=120) -> Result:
    """Run with stderr on a pseudo-terminal (as at a shell prompt) and
    stdout redirected to ``stdout_path`` (as with ``> report.txt``)."""
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
        with open(stdout_path, "wb") as out:
            p = subprocess.run(cmd(*args), stdout=out, stderr=slave, stdin=subprocess.DEVNULL, cwd=cwd,
                               env=_env({"TERM": "xterm-256color"}), timeout=timeout, preexec_fn=_umask)
    finally:
        os.close(slave)
        reader.join(5)
        os.close(master)
    return Result(args, p.returncode, Path(stdout_path).read_text("utf-8", "replace"),
                  bytes(seen).decode("utf-8", "replace"))


def interrupted_while_waiting(lock_file: Path, sig: int, *args, cwd=None) -> Result:
    """Run a command that must wait for ``lock_file`` (an flock this process
    holds), and send it ``sig`` once the kernel shows it waiting there."""
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        p = subprocess.Popen(cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                             env=_env(), cwd=cwd, preexec_fn=_umask)
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
    return Result(args, p.returncode, o.decode("utf-8", "replace"), e.decode("utf-8", "replace"))


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
    return {k: v for k, v in tree(d).items() if not k.startswith((".git/", ".cache/"))}


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
