"""A plain directory as a remote: the embedded default, for the demo, for
shared file systems, and for anyone without a Hub account."""

from __future__ import annotations

import os

import xxhash

from ..errors import ConflictError, IntegrityError, NotFoundError, WdiffIOError
from ..fsutil import (atomic_write_bytes, clear_dead_temps, fsync_dir, io_error, open_regular, read_bounded, temp_name,
                      write_all)
from ..progress import SILENT, Reporter
from .base import CHAIN, Upload, Writer, check_deletable, check_fetch_args, check_prefix, read_chain_file

PIECE = 8 * 1024 * 1024


class LocalStore(Writer):
    def __init__(self, root: str, url: str | None = None) -> None:
        self.root = os.path.abspath(root)
        self.url = url or self.root

    def _path(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/"))

    def read_chain(self) -> tuple[bytes | None, object]:
        try:
            raw = read_chain_file(self._path(CHAIN), self.url)
        except FileNotFoundError:
            return None, (b"" if os.path.isdir(self.root) else None)
        except OSError as e:
            raise io_error(self._path(CHAIN), e) from None
        return raw, xxhash.xxh3_128_digest(raw)

    def fetch(self, path: str, dest: str, *, size: int | None = None, max_size: int | None = None,
              reporter: Reporter = SILENT, at: str | None = None) -> None:
        check_fetch_args(size, max_size)
        src = self._path(path)
        what = f"{self.url}: {path}"
        try:
            if size is None:
                data = read_bounded(src, max_size, what=what)
                atomic_write_bytes(dest, data)
                reporter.advance(len(data))
                return
            have = os.path.getsize(dest) if os.path.exists(dest) else 0
            if have > size:
                os.unlink(dest)
                have = 0
            with open_regular(src, what=what) as f:
                if os.fstat(f.fileno()).st_size != size:
                    raise IntegrityError(f"{self.url}: {path} is not {size} bytes long (damaged remote)")
                with open(dest, "ab") as out:
                    f.seek(have)
                    while have < size:
                        piece = f.read(min(PIECE, size - have))
                        if not piece:
                            break
                        out.write(piece)
                        have += len(piece)
                        reporter.advance(len(piece))
        except FileNotFoundError:
            raise NotFoundError(f"{self.url}: object {path} is missing") from None
        except OSError as e:
            raise io_error(dest, e) from None

    def fetch_range(self, path: str, offset: int, length: int, *, size: int, at: str | None = None) -> bytes:
        src = self._path(path)
        what = f"{self.url}: {path}"
        if offset < 0 or length < 0 or offset + length > size:
            raise ValueError("a range outside the object")
        try:
            with open_regular(src, what=what) as f:
                if os.fstat(f.fileno()).st_size != size:
                    raise IntegrityError(f"{self.url}: {path} is not {size} bytes long (damaged remote)")
                data = os.pread(f.fileno(), length, offset)
        except FileNotFoundError:
            raise NotFoundError(f"{self.url}: object {path} is missing") from None
        except OSError as e:
            raise io_error(src, e) from None
        if len(data) != length:
            raise IntegrityError(f"{self.url}: {path} ended early (damaged remote)")
        return data

    def publish(self, uploads: list[Upload], chain: bytes, token: object, *, message: str,
                reporter: Reporter = SILENT) -> None:
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as e:
            raise io_error(self.root, e) from None
        # one writer at a time; the token check then catches anyone who got in
        # between our read and this lock
        with _blocking_lock(os.path.join(self.root, ".lock")):
            _, current = self.read_chain()
            if current != token and not (token is None and current == b""):
                raise ConflictError(
                    f"{self.url}: the chain changed since it was read (another push?)",
                    hint="run the push again",
                )
            self._store(uploads, reporter)
            atomic_write_bytes(self._path(CHAIN), chain)

    def _store(self, uploads: list[Upload], reporter: Reporter) -> None:
        dirs = set()
        for u in uploads:
            if u.path == CHAIN:
                raise ValueError("the chain index is written by publish only")
            dest = self._path(u.path)
            if os.path.exists(dest) and os.path.getsize(dest) == u.length:
                continue  # stored by an earlier, interrupted push; the chain digest guards it
            try:
                os.makedirs(os.path.dirname(dest), exist_ok=True)
            except OSError as e:
                raise io_error(dest, e) from None
            _copy_range(u.source, u.offset, u.length, dest, reporter)
            dirs.add(os.path.dirname(dest))
        for d in dirs:
            fsync_dir(d)

    def store(self, uploads: list[Upload], *, reporter: Reporter = SILENT) -> None:
        self._store(uploads, reporter)

    def list(self, prefix: str = "") -> list[tuple[str, int]]:
        """Regular files only, never through a link; names starting with a
        dot (the lock, temp files of writes under way) are not objects."""
        prefix = check_prefix(prefix)
        out: list[tuple[str, int]] = []

        def walk(folder: str, rel: str) -> None:
            try:
                it = os.scandir(folder)
            except (FileNotFoundError, NotADirectoryError):
                return
            except OSError as e:
                raise io_error(folder, e) from None
            with it:
                for d in it:
                    if d.name.startswith("."):
                        continue
                    name = f"{rel}/{d.name}" if rel else d.name
                    if d.is_dir(follow_symlinks=False):
                        walk(d.path, name)
                    elif d.is_file(follow_symlinks=False):
                        out.append((name, d.stat(follow_symlinks=False).st_size))

        start = self._path(prefix) if prefix else self.root
        if prefix and os.path.islink(start):
            return []
        if prefix:
            # no folder on the way may be a link out of the remote
            real = os.path.realpath(start)
            if real != os.path.join(os.path.realpath(self.root), *prefix.split("/")):
                return []
        walk(start, prefix)
        out.sort()
        return out

    def delete(self, paths: list[str]) -> None:
        check_deletable(paths)
        root = os.path.realpath(self.root)
        for p in paths:
            dest = self._path(p)
            # the folder must be the remote's own, not a link to elsewhere
            if os.path.realpath(os.path.dirname(dest)) != os.path.dirname(os.path.join(root, *p.split("/"))):
                raise ValueError(f"refusing to delete {p!r}: a folder on its way is a link")
            try:
                os.unlink(dest)
            except FileNotFoundError:
                continue
            except IsADirectoryError:
                raise ValueError(f"refusing to delete {p!r}: a folder") from None
            except OSError as e:
                raise io_error(dest, e) from None


class _blocking_lock:
    """An exclusive flock that waits: pushes to a local remote are short."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __enter__(self):
        import fcntl

        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError as e:
            raise io_error(self.path, e) from None
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def _copy_range(src: str, offset: int, length: int, dest: str, reporter: Reporter) -> None:
    clear_dead_temps(dest)
    tmp = temp_name(dest)
    try:
        with open(src, "rb") as f:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                f.seek(offset)
                done = 0
                while done < length:
                    piece = f.read(min(PIECE, length - done))
                    if not piece:
                        raise WdiffIOError(f"{src}: shorter than expected")
                    write_all(fd, piece, done)
                    done += len(piece)
                    reporter.advance(len(piece))
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, dest)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise io_error(dest, e) from None
