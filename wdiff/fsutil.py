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


def open_regular(path: str, *, max_size: int | None = None, what: str | None = None):
    """Open ``path`` for reading, refusing (IntegrityError) anything that is
    not a regular file once links are followed, and a file larger than
    ``max_size``. The open never blocks: a FIFO opens at once with
    O_NONBLOCK and is then refused, where a plain open() would wait for a
    writer forever. Callers still read at most ``max_size + 1`` bytes, since
    a file may grow after the check. FileNotFoundError and other OSErrors
    reach the caller, who knows what a missing file means there."""
    import stat

    from .errors import IntegrityError

    what = what or path
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IntegrityError(f"{what}: not a regular file")
        if max_size is not None and st.st_size > max_size:
            raise IntegrityError(f"{what}: {st.st_size} bytes, more than the {max_size} this object may have")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str, max_size: int, *, what: str | None = None) -> bytes:
    """The whole content of regular file ``path``, which must be at most
    ``max_size`` bytes (checked before and while reading)."""
    from .errors import IntegrityError

    with open_regular(path, max_size=max_size, what=what) as f:
        data = f.read(max_size + 1)
    if len(data) > max_size:
        raise IntegrityError(f"{what or path}: more than the {max_size} bytes this object may have")
    return data
