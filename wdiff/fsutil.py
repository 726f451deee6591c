"""Crash-safe file system primitives: temp file + fsync + rename, directory
fsync, advisory locks. Everything that replaces user data goes through here."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil

from .errors import BusyError, WdiffIOError


def io_error(where: str, e: OSError) -> WdiffIOError:
    reason = e.strerror or str(e)
    hint = None
    if e.errno == errno.ENOSPC:
        hint = "free some space; nothing was replaced"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = "check permissions; nothing was replaced"
    return WdiffIOError(f"{where}: {reason}", hint=hint)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(final: str, tag: str = "tmp") -> str:
    head, tail = os.path.split(final)
    return os.path.join(head, f".{tail}.wdiff-{tag}-{secrets.token_hex(4)}")


def write_all(fd: int, data, offset: int) -> None:
    mv = memoryview(data).cast("B")
    while mv:
        n = os.pwrite(fd, mv, offset)
        mv = mv[n:]
        offset += n


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write a small file so that readers see the old or the new content."""
    tmp = temp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_all(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(os.path.abspath(path)))
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise io_error(path, e) from None


def remove_tree(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)


@contextlib.contextmanager
def locked(lock_path: str, *, what: str):
    """Hold an exclusive advisory lock, or fail at once with BusyError."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise io_error(lock_path, e) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BusyError(f"{what} is in use by another wdiff process", hint="wait for it to finish") from None
        yield
    finally:
        os.close(fd)


def owner_tag() -> str:
    """``PID-START`` of this process (START: its start time in clock ticks
    since boot), carried in the names of temporary artefacts so that a later
    run can tell whether their owner still lives."""
    return f"{os.getpid()}-{_start_time(os.getpid())}"


def _start_time(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def owner_alive(pid: int, start: int | None) -> bool:
    """Whether the process that made an artefact tagged ``pid[-start]`` still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return start is not None and _start_time(pid) == start


@contextlib.contextmanager
def locked_beside(lock_path: str, *, what: str):
    """Like :func:`locked`, for a lock file that sits beside a directory: it
    is never followed through a link, and it is removed on release (a waiter
    that opened the removed file sees that its inode is gone and retries)."""
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise io_error(lock_path, e) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BusyError(f"{what} is in use by another wdiff process", hint="wait for it to finish") from None
        try:
            same = os.stat(lock_path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock_path)
        os.close(fd)
