"""wdiff's own state inside a checkpoint (``DIR/.wdiff/`` and its
subdirectories), opened as input, never as trusted memory.

Whoever wrote DIR may have written ``DIR/.wdiff`` too (a copied or shared
checkpoint, a container image, an rsync from elsewhere). So every state
directory is created and opened relative to its parent's descriptor with
``O_NOFOLLOW | O_DIRECTORY``, and refused unless it is a plain directory
owned by this user (or by DIR's owner) that nobody else can write. Files in
it are opened the same way: never through a link, always regular files.
This module is the only code that reaches state files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat

from .errors import BusyError, IntegrityError
from .fsutil import io_error
from .paths import STATE_DIR

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: the names of the temporary files atomic_write makes; any left over is debris
TMP_TAG = ".wdiff-tmp-"


class StateError(IntegrityError):
    """A state path that wdiff did not make: a link, a file, another user's."""

    kind = "state"


def _refuse(path: str, what: str) -> StateError:
    return StateError(f"{path}: {what}; it is not wdiff's state directory",
                      hint="remove it if you trust what is in it, then run the command again")


class StateDir:
    """An open state directory: every operation is relative to its descriptor."""

    def __init__(self, fd: int, path: str, owner: int) -> None:
        self.fd, self.path, self.owner = fd, path, owner

    # -- opening -------------------------------------------------------------------------

    @classmethod
    def open(cls, root: str, *components: str, create: bool = True) -> StateDir | None:
        """``root/.wdiff/components...``; None when one is missing and ``create`` is off.
        ``root`` itself is the user's directory (it may be reached through a link)."""
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise io_error(root, e) from None
        try:
            owner = os.fstat(fd).st_uid
            top = cls(fd, root, owner)
            fd = -1
            d = top.sub(STATE_DIR, create=create)
        finally:
            if fd >= 0:
                os.close(fd)
        top.close()
        for c in components:
            if d is None:
                return None
            nxt = d.sub(c, create=create)
            d.close()
            d = nxt
        return d

    @classmethod
    def at(cls, path: str) -> StateDir:
        """A private directory wdiff made itself (a temporary directory)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise io_error(path, e) from None
        return cls(fd, path, os.fstat(fd).st_uid)

    def sub(self, name: str, *, create: bool = True) -> StateDir | None:
        path = os.path.join(self.path, name)
        if create:
            try:
                os.mkdir(name, 0o700, dir_fd=self.fd)
            except FileExistsError:
                pass
            except OSError as e:
                raise io_error(path, e) from None
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            if create:
                raise io_error(path, OSError(errno.ENOENT, "vanished while being opened")) from None
            return None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                st = self._lstat(name)
                what = "is a symbolic link" if st is not None and stat.S_ISLNK(st.st_mode) else "is not a directory"
                raise _refuse(path, what) from None
            raise io_error(path, e) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                raise _refuse(path, "is not a directory")
            if st.st_uid not in (os.geteuid(), self.owner):
                raise _refuse(path, f"is owned by user {st.st_uid}")
            if st.st_mode & 0o022:
                raise _refuse(path, "can be written by other users")
        except BaseException:
            os.close(fd)
            raise
        return StateDir(fd, path, self.owner)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> StateDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- files ---------------------------------------------------------------------------

    def where(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise io_error(self.where(name), e) from None

    def kind(self, name: str) -> str | None:
        """"file", "dir", "other" or None (absent); links are "other"."""
        st = self._lstat(name)
        if st is None:
            return None
        return "file" if stat.S_ISREG(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "other"

    def names(self) -> list[str]:
        try:
            return sorted(os.listdir(self.fd))
        except OSError as e:
            raise io_error(self.path, e) from None

    def open_file(self, name: str, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
        """A regular file of this directory, never reached through a link."""
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _refuse(self.where(name), "is a symbolic link") from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            os.close(fd)
            raise _refuse(self.where(name), "is not a plain file")
        return fd

    def read(self, name: str, limit: int = 64 * 1024 * 1024) -> bytes | None:
        """The whole file, or None when it does not exist."""
        try:
            fd = self.open_file(name)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise io_error(self.where(name), e) from None
        try:
            if os.fstat(fd).st_size > limit:
                raise IntegrityError(f"{self.where(name)}: larger than any file wdiff writes there")
            chunks = []
            while True:
                b = os.read(fd, 1 << 20)
                if not b:
                    return b"".join(chunks)
                chunks.append(b)
        except OSError as e:
            raise io_error(self.where(name), e) from None
        finally:
            os.close(fd)

    def atomic_write(self, name: str, data: bytes) -> None:
        """Readers see the old or the new content; nothing follows a link."""
        tmp = f".{name}{TMP_TAG}{secrets.token_hex(4)}"
        try:
            fd = self.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                mv = memoryview(data)
                while mv:
                    mv = mv[os.write(fd, mv):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)  # replaces, like os.replace
            os.fsync(self.fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise io_error(self.where(name), e) from None

    def unlink(self, name: str) -> None:
        """Remove an entry of any type (a directory with all it holds), never following links."""
        k = self.kind(name)
        try:
            if k == "dir":
                self.clear(name)
                os.rmdir(name, dir_fd=self.fd)
            elif k is not None:
                os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise io_error(self.where(name), e) from None

    def clear(self, name: str | None = None) -> None:
        """Empty subdirectory ``name`` (or this directory): a walk by
        descriptors that never leaves it, whatever links it holds."""
        if name is None:
            for n in self.names():
                self.unlink(n)
            return
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            return
        except OSError as e:
            raise io_error(self.where(name), e) from None
        with StateDir(fd, self.where(name), self.owner) as d:
            d.clear()

    def sweep_temps(self) -> None:
        """Remove the temporary files of atomic writes that were killed: the
        caller holds the lock, so no live process owns them."""
        for n in self.names():
            if TMP_TAG in n:
                self.unlink(n)

    def sync(self) -> None:
        with contextlib.suppress(OSError):
            os.fsync(self.fd)

    # -- the lock ------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, *, what: str, name: str = "lock"):
        """Hold an exclusive advisory lock on ``name`` here, or fail at once with BusyError."""
        try:
            fd = self.open_file(name, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise io_error(self.where(name), e) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise BusyError(f"{what} is in use by another wdiff process", hint="wait for it to finish") from None
            yield
        finally:
            os.close(fd)
