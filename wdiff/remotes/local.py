"""A plain directory as a remote: the embedded default, for the demo, for
shared file systems, and for anyone without a Hub account.

Whoever can write the remote's storage (a shared or synced folder, another
user of the machine) may plant links, FIFOs and hard links in it, and a
pusher often runs as root. So every path inside the remote is reached from
a descriptor of its root, one component at a time, with ``O_NOFOLLOW``
(folders with ``O_DIRECTORY`` too, created with ``mkdirat``): a link inside
the remote is never followed, for writing or for reading, and is refused
with IntegrityError (exit status 4). The root the user names is the user's
choice: when it is itself a symbolic link it is followed, once, as the root
is opened, and never again during the operation. Objects and the chain are
written to a temporary beside them and renamed into place, never rewritten
in place, so a hard link to a file outside the remote keeps that file as it
was; the lock is refused unless it is a plain file; files are opened
without blocking and read only when ``fstat`` says they are regular; paths
with ``..``, ``.`` or empty parts are refused before any file is touched.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat

import xxhash

from ..errors import ConflictError, IntegrityError, NotFoundError, WdiffIOError
from ..fsutil import (atomic_write_bytes, clear_dead_temps_at, io_error, open_regular_at, temp_name, write_all)
from ..paths import printable
from ..progress import SILENT, Reporter
from .base import CHAIN, MAX_CHAIN_OBJECT, Upload, Writer, check_deletable, check_fetch_args, check_prefix

PIECE = 8 * 1024 * 1024
LOCK = ".lock"
#: list() does not descend into folders this many components below the root
LIST_DEPTH = 8
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_HINT = "wdiff did not put it there: remove it if you trust the rest of the remote, then run the command again"


class LocalStore(Writer):
    def __init__(self, root: str, url: str | None = None) -> None:
        self.root = os.path.abspath(root)
        self.url = url or self.root

    # -- reaching paths inside the remote ------------------------------------------------

    def _what(self, rel: str) -> str:
        # built for every object opened, used only in errors: escape only what needs it
        plain = rel.isascii() and rel.isprintable() and "\\" not in rel
        return f"{self.url}: {rel if plain else printable(rel)}"

    def _parts(self, rel: str) -> list[str]:
        """The components of ``rel``, a path inside the remote (it may come
        from stored data: a chain, a manifest)."""
        parts = rel.split("/")
        if any(p in ("", ".", "..") or "\0" in p for p in parts):
            raise IntegrityError(f"{self._what(rel)}: not a path inside the remote", hint=_HINT)
        return parts

    @contextlib.contextmanager
    def _root(self, *, create: bool = False):
        """A descriptor of the root (followed if the user named a link);
        FileNotFoundError when it does not exist and ``create`` is off."""
        if create:
            try:
                os.makedirs(self.root, exist_ok=True)
            except OSError as e:
                raise io_error(self.root, e) from None
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise io_error(self.root, e) from None
        try:
            yield fd
        finally:
            os.close(fd)

    def _refuse(self, dir_fd: int, name: str, rel: str, wanted: str) -> IntegrityError:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            link = stat.S_ISLNK(st.st_mode)
        except OSError:
            link = False
        what = "a symbolic link; wdiff never follows links inside a remote" if link else f"not {wanted}"
        return IntegrityError(f"{self._what(rel)} is {what}", hint=_HINT)

    def _dir(self, root_fd: int, parts: list[str], *, create: bool = False) -> int:
        """A new descriptor of folder ``parts`` under the root, every
        component opened without following a link (and made first, relative
        to its parent, with ``create``). FileNotFoundError when one is
        missing; IntegrityError when one is a link or not a folder."""
        fd = os.dup(root_fd)
        try:
            for i, name in enumerate(parts):
                if create:
                    try:
                        os.mkdir(name, 0o777, dir_fd=fd)
                    except FileExistsError:
                        pass
                try:
                    nxt = os.open(name, _DIR, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise self._refuse(fd, name, "/".join(parts[: i + 1]), "a folder") from None
                    raise
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open(self, root_fd: int, rel: str, *, max_size: int | None = None):
        """Object ``rel`` opened for reading: a regular file, reached
        without following links, opened without blocking."""
        parts = self._parts(rel)
        pfd = self._dir(root_fd, parts[:-1])
        try:
            return open_regular_at(pfd, parts[-1], max_size=max_size, what=self._what(rel))
        except IntegrityError as e:
            raise IntegrityError(e.message, hint=_HINT) from None
        finally:
            os.close(pfd)

    @contextlib.contextmanager
    def _object(self, rel: str, *, max_size: int | None = None):
        try:
            with self._root() as rfd:
                f = self._open(rfd, rel, max_size=max_size)
        except FileNotFoundError:
            raise NotFoundError(f"{self.url}: object {printable(rel)} is missing") from None
        except OSError as e:
            raise io_error(self._what(rel), e) from None
        with f:
            yield f

    # -- reading -------------------------------------------------------------------------

    def read_chain(self) -> tuple[bytes | None, object]:
        try:
            with self._root() as rfd:
                return self._read_chain_at(rfd)
        except FileNotFoundError:
            return None, None

    def _read_chain_at(self, rfd: int) -> tuple[bytes | None, object]:
        from ..errors import FormatError

        try:
            with open_regular_at(rfd, CHAIN, what=f"{self.url}: chain index") as f:
                raw = f.read(MAX_CHAIN_OBJECT + 1)
        except FileNotFoundError:
            return None, b""
        except IntegrityError as e:
            raise IntegrityError(e.message, hint=_HINT) from None
        except OSError as e:
            raise io_error(self._what(CHAIN), e) from None
        if len(raw) > MAX_CHAIN_OBJECT:
            raise FormatError(f"{self.url}: chain index is larger than this wdiff accepts",
                              hint="start a new remote from a fresh anchor")
        return raw, xxhash.xxh3_128_digest(raw)

    def fetch(self, path: str, dest: str, *, size: int | None = None, max_size: int | None = None,
              reporter: Reporter = SILENT, at: str | None = None) -> None:
        check_fetch_args(size, max_size)
        what = self._what(path)
        with self._object(path, max_size=max_size) as f:
            try:
                if size is None:
                    data = f.read(max_size + 1)
                    if len(data) > max_size:
                        raise IntegrityError(f"{what}: more than the {max_size} bytes this object may have")
                    atomic_write_bytes(dest, data)
                    reporter.advance(len(data))
                    return
                if os.fstat(f.fileno()).st_size != size:
                    raise IntegrityError(f"{what} is not {size} bytes long (damaged remote)")
                have = os.path.getsize(dest) if os.path.exists(dest) else 0
                if have > size:
                    os.unlink(dest)
                    have = 0
                with open(dest, "ab") as out:
                    f.seek(have)
                    while have < size:
                        piece = f.read(min(PIECE, size - have))
                        if not piece:
                            break
                        out.write(piece)
                        have += len(piece)
                        reporter.advance(len(piece))
            except OSError as e:
                raise io_error(dest, e) from None

    def fetch_range(self, path: str, offset: int, length: int, *, size: int, at: str | None = None) -> bytes:
        if offset < 0 or length < 0 or offset + length > size:
            raise ValueError("a range outside the object")
        with self._object(path) as f:
            if os.fstat(f.fileno()).st_size != size:
                raise IntegrityError(f"{self._what(path)} is not {size} bytes long (damaged remote)")
            try:
                data = os.pread(f.fileno(), length, offset)
            except OSError as e:
                raise io_error(self._what(path), e) from None
        if len(data) != length:
            raise IntegrityError(f"{self._what(path)} ended early (damaged remote)")
        return data

    def list(self, prefix: str = "") -> list[tuple[str, int]]:
        """Regular files only, never through a link: a folder on the way
        to ``prefix`` that is a link is refused (IntegrityError, as every
        other operation refuses it), and links under it are not objects.
        Names starting with a dot (the lock, temp files of writes under
        way) are not objects either, nor is anything more than LIST_DEPTH
        folders deep (wdiff's objects lie 3 deep; each folder is reached
        from the root, so a planted deep tree would cost its depth squared)."""
        prefix = check_prefix(prefix)
        out: list[tuple[str, int]] = []
        try:
            with self._root() as rfd:
                todo = [prefix]
                while todo:
                    rel = todo.pop()
                    try:
                        fd = self._dir(rfd, rel.split("/") if rel else [])
                    except FileNotFoundError:
                        continue
                    except IntegrityError:
                        if rel == prefix:
                            raise
                        continue  # became a link since it was listed as a folder
                    try:
                        names = os.listdir(fd)
                        for n in names:
                            if n.startswith("."):
                                continue
                            try:
                                st = os.stat(n, dir_fd=fd, follow_symlinks=False)
                            except FileNotFoundError:
                                continue
                            name = f"{rel}/{n}" if rel else n
                            if stat.S_ISDIR(st.st_mode):
                                if name.count("/") + 1 < LIST_DEPTH:
                                    todo.append(name)
                            elif stat.S_ISREG(st.st_mode):
                                out.append((name, st.st_size))
                    finally:
                        os.close(fd)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise io_error(self.root, e) from None
        out.sort()
        return out

    # -- writing -------------------------------------------------------------------------

    def publish(self, uploads: list[Upload], chain: bytes, token: object, *, message: str,
                reporter: Reporter = SILENT) -> None:
        with self._root(create=True) as rfd, self._lock(rfd):
            # one writer at a time; the token check then catches anyone who
            # got in between our read and this lock
            _, current = self._read_chain_at(rfd)
            if current != token and not (token is None and current == b""):
                raise ConflictError(
                    f"{self.url}: the chain changed since it was read (another push?)",
                    hint="run the push again",
                )
            self._store(rfd, uploads, reporter)
            self._replace(rfd, CHAIN, _Bytes(chain), CHAIN, SILENT)
            os.fsync(rfd)

    def store(self, uploads: list[Upload], *, reporter: Reporter = SILENT) -> None:
        with self._root(create=True) as rfd:
            self._store(rfd, uploads, reporter)

    def _store(self, rfd: int, uploads: list[Upload], reporter: Reporter) -> None:
        touched: set[tuple[str, ...]] = set()
        for u in uploads:
            if u.path == CHAIN:
                raise ValueError("the chain index is written by publish only")
            parts = self._parts(u.path)
            try:
                pfd = self._dir(rfd, parts[:-1], create=True)
            except OSError as e:
                raise io_error(self._what(u.path), e) from None
            try:
                name = parts[-1]
                try:
                    st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
                except FileNotFoundError:
                    st = None
                if self._holds(pfd, name, st, u):
                    continue  # stored by an earlier, interrupted push
                if st is not None and stat.S_ISDIR(st.st_mode):
                    raise IntegrityError(f"{self._what(u.path)} is a folder where an object belongs", hint=_HINT)
                # a link, a FIFO or a partial object there is replaced, never written through
                self._replace(pfd, name, _Range(u.source, u.offset, u.length), u.path, reporter)
                touched.update(tuple(parts[:k]) for k in range(1, len(parts)))
            except OSError as e:
                raise io_error(self._what(u.path), e) from None
            finally:
                os.close(pfd)
        # each folder once, deepest first: the renames, and the folders made on their way, are durable
        for folder in sorted(touched, key=len, reverse=True):
            try:
                fd = self._dir(rfd, list(folder))
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as e:
                raise io_error(self._what("/".join(folder)), e) from None
        if touched:
            os.fsync(rfd)

    @staticmethod
    def _holds(dir_fd: int, name: str, st: os.stat_result | None, u: Upload) -> bool:
        """Whether entry ``name`` already is upload ``u``: a regular file with
        no other name, of its size and with its bytes. Size alone would keep
        a file planted at the object's name (the version would then not
        pull), and a hard link's bytes can change from outside."""
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size != u.length:
            return False
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            return False
        try:
            if not _same_inode(os.fstat(fd), st):
                return False
            with open(u.source, "rb") as src:
                src.seek(u.offset)
                done = 0
                while done < u.length:
                    want = src.read(min(PIECE, u.length - done))
                    if not want or os.pread(fd, len(want), done) != want:
                        return False
                    done += len(want)
            return True
        finally:
            os.close(fd)

    def _replace(self, dir_fd: int, name: str, source, rel: str, reporter: Reporter) -> None:
        """Entry ``name`` of ``dir_fd`` becomes a new file holding
        ``source``'s bytes: a temporary made beside it (O_EXCL, never through
        a link) and renamed over it, so whatever was there (a link, a hard
        link to a file elsewhere) is replaced, never written through."""
        clear_dead_temps_at(dir_fd, name)
        tmp = temp_name(name)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
            try:
                source.copy_to(fd, reporter)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            if isinstance(e, OSError):
                raise io_error(self._what(rel), e) from None
            raise

    @contextlib.contextmanager
    def _lock(self, rfd: int):
        """An exclusive flock on the root's ``.lock``, which waits (pushes to
        a local remote are short). The lock file is opened, or made, in the
        root without following a link and without blocking, and refused
        unless it is a regular file with no other name: a planted link, FIFO,
        device or hard link is never opened as the lock."""
        where = self._what(LOCK)
        try:
            st = os.stat(LOCK, dir_fd=rfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        except OSError as e:
            raise io_error(where, e) from None
        if st is not None and not (stat.S_ISREG(st.st_mode) and st.st_nlink == 1):
            raise self._lock_refused(st)
        try:
            fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=rfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise self._lock_refused(os.stat(LOCK, dir_fd=rfd, follow_symlinks=False)) from None
            raise io_error(where, e) from None
        try:
            st = os.fstat(fd)
            if not (stat.S_ISREG(st.st_mode) and st.st_nlink == 1):
                raise self._lock_refused(st)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as e:
                raise io_error(where, e) from None
            yield
        finally:
            os.close(fd)

    def _lock_refused(self, st: os.stat_result) -> IntegrityError:
        what = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file" if not stat.S_ISREG(st.st_mode)
                else f"a file with {st.st_nlink} names (a hard link)")
        return IntegrityError(f"{self._what(LOCK)} is {what}; wdiff locks the remote with a plain file of its own",
                              hint=f"remove {os.path.join(self.root, LOCK)} if no push is running, "
                                   "then run the command again")

    def delete(self, paths: list[str]) -> None:
        """Remove objects, each relative to its folder's descriptor: a
        folder on the way that is a link is refused (IntegrityError), and a
        link itself is removed, never what it names."""
        check_deletable(paths)
        try:
            with self._root() as rfd:
                for p in paths:
                    parts = self._parts(p)
                    try:
                        pfd = self._dir(rfd, parts[:-1])
                    except FileNotFoundError:
                        continue
                    except OSError as e:
                        raise io_error(self._what(p), e) from None
                    try:
                        os.unlink(parts[-1], dir_fd=pfd)
                    except FileNotFoundError:
                        continue
                    except IsADirectoryError:
                        raise ValueError(f"refusing to delete {p!r}: a folder") from None
                    except OSError as e:
                        raise io_error(self._what(p), e) from None
                    finally:
                        os.close(pfd)
        except FileNotFoundError:
            return


def _same_inode(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class _Bytes:
    """What :meth:`LocalStore._replace` writes: bytes held in memory."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def copy_to(self, fd: int, reporter: Reporter) -> None:
        write_all(fd, self.data, 0)


class _Range:
    """What :meth:`LocalStore._replace` writes: a range of a local file."""

    def __init__(self, path: str, offset: int, length: int) -> None:
        self.path, self.offset, self.length = path, offset, length

    def copy_to(self, fd: int, reporter: Reporter) -> None:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            done = 0
            while done < self.length:
                piece = f.read(min(PIECE, self.length - done))
                if not piece:
                    raise WdiffIOError(f"{self.path}: shorter than expected")
                write_all(fd, piece, done)
                done += len(piece)
                reporter.advance(len(piece))
