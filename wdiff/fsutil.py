"""Crash-safe file system primitives: temp file + fsync + rename, directory
fsync, advisory locks. Everything that replaces user data goes through here."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import stat
import tempfile

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
    """``.NAME.wdiff-TAG-PID-START-RANDOM`` beside ``final``: a temporary
    that carries its owner (see :func:`owner_tag`), so that the next writer
    of ``final`` can clear what a killed one left (:func:`clear_dead_temps`)."""
    head, tail = os.path.split(final)
    return os.path.join(head, f".{tail}.wdiff-{tag}-{owner_tag()}-{secrets.token_hex(4)}")


def clear_dead_temps(final: str, tag: str = "tmp") -> None:
    """Remove the temporaries :func:`temp_name` named for ``final`` whose
    owner no longer runs: the partial bundle of a killed pack, the partial
    checkpoint of a killed ``apply -o`` (gigabytes each, hidden beside their
    output). Best effort: what cannot be listed or removed stays. Removing a
    live writer's temporary (one whose PID this process cannot see, in
    another PID namespace) costs that writer its run, never data: its
    rename into place then fails."""
    head, tail = os.path.split(os.path.abspath(final))
    _remove_dead(head, _temp_pattern(tail, tag))


def clear_dead_temps_at(dir_fd: int, name: str, tag: str = "tmp") -> None:
    """:func:`clear_dead_temps` for entry ``name`` of the open directory
    ``dir_fd``: listed and removed relative to the descriptor."""
    _remove_dead_at(dir_fd, _temp_pattern(name, tag))


def _temp_pattern(tail: str, tag: str) -> re.Pattern:
    """The names :func:`temp_name` gives the temporaries of ``tail``."""
    return re.compile(rf"\.{re.escape(tail)}\.wdiff-{re.escape(tag)}-(\d+)-(\d+)-[0-9a-f]{{8}}")


def _remove_dead(head: str, pat: re.Pattern, *, uid: int | None = None) -> None:
    """:func:`_remove_dead_at` for the folder ``head``."""
    try:
        fd = os.open(head, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        _remove_dead_at(fd, pat, uid=uid)
    finally:
        os.close(fd)


def _remove_dead_at(dir_fd: int, pat: re.Pattern, *, uid: int | None = None) -> None:
    """Remove the entries of the open directory ``dir_fd`` that ``pat``
    matches (its groups: the owner's PID and start, as :func:`owner_tag`
    writes them) and whose owner no longer runs; with ``uid``, only those
    that user owns (a shared folder, where anyone may plant a name). All
    relative to the descriptor, never through a link: a planted link is
    removed itself, a folder by a walk that follows no link either. Best
    effort: what cannot be listed or removed stays."""
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return
    for n in names:
        m = pat.fullmatch(n)
        if m is None or owner_alive(int(m.group(1)), int(m.group(2))):
            continue
        with contextlib.suppress(OSError):
            st = os.stat(n, dir_fd=dir_fd, follow_symlinks=False)
            if uid is not None and st.st_uid != uid:
                continue
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(n, dir_fd=dir_fd)
            else:
                os.unlink(n, dir_fd=dir_fd)


@contextlib.contextmanager
def scratch_dir(what: str):
    """A private work folder in the system's temporary directory, named
    ``wdiff-WHAT-PID-START-RANDOM`` and removed on the way out. A run
    killed before it could remove its own (a commit's downloaded parts, the
    bundles gc re-packs, a squash of a pushed run: gigabytes each) leaves
    one, and the next run that asks for a ``WHAT`` scratch removes those
    whose owner is gone, so that a job killed from cron again and again does
    not fill the disk. The folder is shared (anyone may plant a name there):
    only this user's entries go (see :func:`_remove_dead_at`)."""
    base = tempfile.gettempdir()
    _remove_dead(base, re.compile(rf"wdiff-{re.escape(what)}-(\d+)-(\d+)-[0-9a-f]{{8}}"), uid=os.geteuid())
    path = os.path.join(base, f"wdiff-{what}-{owner_tag()}-{secrets.token_hex(4)}")
    try:
        os.mkdir(path, 0o700)
    except OSError as e:
        raise io_error(path, e) from None
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_parents(parent: str) -> list[str]:
    """Create the missing directories of path ``parent`` (a directory a
    command is about to create, less its last part); those made, outermost
    first. When one cannot be made, those made before it are removed and
    WdiffIOError raised: a refused command leaves no folder behind."""
    made: list[str] = []
    p = parent
    while p and not os.path.lexists(p):
        made.append(p)
        p = os.path.dirname(p)
    made.reverse()
    for d in made:
        try:
            os.mkdir(d)
        except FileExistsError:
            pass
        except OSError as e:
            remove_made(made)
            raise io_error(d, e) from None
    return made


def remove_made(made: list[str]) -> None:
    """Remove the directories :func:`make_parents` made (outermost first in
    ``made``), innermost first, stopping at the first that is not empty
    (something else was put there meanwhile) or is gone."""
    for d in reversed(made):
        try:
            os.rmdir(d)
        except OSError:
            return


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


# -- outputs named on the command line -------------------------------------------

#: an input directory with more entries than this is not searched for hard links
MAX_LINK_SCAN = 100_000


def check_output(out, inputs, *, overwrite: bool = True) -> str:
    """Refuse (UsageError, exit 2) an output path ``out`` that is, or lies
    inside, one of ``inputs`` (``(what, path)`` pairs; None paths are
    skipped), compared as resolved paths: symlinks, relative paths, ``..``
    and trailing slashes resolve first, and an existing output that is the
    same file as an input, or as a file inside an input directory (a hard
    link), is refused too. Both the place a rename lands (the output's
    resolved parent) and the file the output names now (followed when it is
    a symlink) are checked. Without ``overwrite``, an existing output is
    refused as well. Returns ``out`` as a string."""
    from .errors import UsageError

    out = os.fspath(out)
    if not overwrite and os.path.lexists(out):
        raise UsageError(f"{out}: already exists", hint="pass --force (-f) to replace it")
    stripped = out.rstrip("/") or "/"
    head, tail = os.path.split(stripped)
    landing = os.path.join(os.path.realpath(head or "."), tail) if tail not in ("", ".", "..") else os.path.realpath(stripped)
    targets = {os.path.normpath(landing), os.path.realpath(stripped)}
    existing = _stat(out)
    try:
        linked = existing is not None and os.stat(out).st_nlink > 1
    except OSError:
        linked = False
    for what, path in inputs:
        if path is None:
            continue
        path = os.fspath(path)
        real = os.path.realpath(path)
        for t in targets:
            if t == real or t.startswith(real.rstrip("/") + "/"):
                rel = "is" if t == real else "lies inside"
                raise UsageError(f"{out}: {rel} {what} {path} (resolved: {real}); refusing to write an input")
        if existing is None:
            continue
        st = _stat(path)
        if st is not None and st == existing:
            raise UsageError(f"{out}: is the same file as {what} {path}; refusing to write an input")
        if linked and os.path.isdir(path):
            hit = _linked_inside(real, existing)
            if hit is not None:
                raise UsageError(f"{out}: is the same file as {hit}, inside {what} {path}; refusing to write an input")
    return out


def _stat(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _linked_inside(root: str, ident) -> str | None:
    """A path under ``root`` that is the file ``ident`` (device, inode)."""
    n = 0
    for dirpath, dirs, files in os.walk(root):
        for name in files:
            n += 1
            if n > MAX_LINK_SCAN:
                return None
            p = os.path.join(dirpath, name)
            if _stat(p) == ident:
                return p
    return None


def owner_tag() -> str:
    """``PID-START`` of this process (START: its start time in clock ticks
    since boot), carried in the names of temporary artefacts so that a later
    run can tell whether their owner still lives."""
    pid = os.getpid()
    if _OWN_START.get("pid") != pid:  # a forked child is another owner
        _OWN_START.update(pid=pid, start=_start_time(pid))
    return f"{pid}-{_OWN_START['start']}"


_OWN_START: dict = {}


def _start_time(pid: int) -> int:
    return _proc_stat(pid)[1]


def _proc_stat(pid: int) -> tuple[bytes, int]:
    """The state letter and start time of process ``pid`` (``b"", 0`` where
    /proc does not say)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2 :].split()
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return b"", 0


def owner_alive(pid: int, start: int | None) -> bool:
    """Whether the process that made an artefact tagged ``pid[-start]`` still runs.
    A tag that names no process (0, which ``kill`` reads as this process
    group, or a number past any PID) has no live owner, nor has a zombie."""
    if not 0 < pid < 1 << 31:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if start is None:
        return False
    state, started = _proc_stat(pid)
    # a zombie (killed, not yet reaped: its parent died with it) runs no more
    return started == start and state not in (b"Z", b"X")


def beside_lock_path(directory: str, *, follow: bool = True) -> str:
    """``PARENT/.NAME.wdiff-lock``: the lock every writer of checkpoint
    directory ``directory`` holds (pull, and apply --in-place), beside it
    because a pull may swap the directory itself. Without ``follow``, the
    lock of a symbolic link itself (pull --atomic switches the link)."""
    parent, name = os.path.split(os.path.realpath(directory) if follow else os.path.abspath(directory))
    return os.path.join(parent, f".{name}.wdiff-lock")


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


def open_regular(path: str, *, max_size: int | None = None, what: str | None = None):
    """Open ``path`` for reading, refusing (IntegrityError) anything that is
    not a regular file once links are followed, and a file larger than
    ``max_size``. The open never blocks: a FIFO opens at once with
    O_NONBLOCK and is then refused, where a plain open() would wait for a
    writer forever. Callers still read at most ``max_size + 1`` bytes, since
    a file may grow after the check. FileNotFoundError and other OSErrors
    reach the caller, who knows what a missing file means there."""
    what = what or path
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    return _regular_file(fd, max_size, what)


def open_regular_at(dir_fd: int, name: str, *, max_size: int | None = None, what: str):
    """:func:`open_regular` for entry ``name`` of the open directory
    ``dir_fd``, which is never followed when it is a link: a link there is
    refused (IntegrityError) like any other file that is not a regular one."""
    from .errors import IntegrityError

    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise IntegrityError(f"{what}: a symbolic link, not a regular file") from None
        raise
    return _regular_file(fd, max_size, what)


def _regular_file(fd: int, max_size: int | None, what: str):
    """``fd`` as a file object, if it is a regular file of at most
    ``max_size`` bytes; otherwise closed, and IntegrityError."""
    from .errors import IntegrityError

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
