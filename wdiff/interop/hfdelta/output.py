"""Where ``wdiff export`` writes: a local directory, or an object store
through wdiff's remotes (``s3://``, ``gs://``, ...), which ModelExpress
reads as prefixes.

A directory: each version is written into a hidden temporary folder beside
its final name (``.weight_vNNNNNN.wdiff-tmp-PID-START-RANDOM``), checked,
fsynced, and renamed into place in one step, so a reader sees a version
whole or not at all; the export holds ``OUT/.wdiff/export.lock``; the
temporaries of killed exports are removed by the next. Every path in OUT is
reached from OUT's descriptor without following links: a version folder or
ledger that is a link is refused.

An object store has no rename: the version's files go up in order, a
delta's index (the layout's commit point) and then the ledger last (a full
version's own index first: see export.py). Before the
first object, ``.wdiff/export-pending.json`` names the version being
written, so that the next export knows a ledger-less folder of that number
for the debris of an interrupted one and replaces it; any other folder
without a ledger is someone else's, and refused. An object store has no
lock either: run one export per output at a time.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import stat

from ...errors import FormatError, IntegrityError, UsageError
from ...fsutil import clear_dead_temps_at, io_error, open_regular_at, owner_tag, scratch_dir
from ...paths import printable
from ...remotes import Upload, open_remote, parse_remote
from ...statedir import StateDir
from .layout import LEDGER, LEDGER_DIR, MAX_LEDGER_BYTES, Ledger, dir_name, number_of, version_text

PENDING = f"{LEDGER_DIR}/export-pending.json"
_TEMP = re.compile(r"\.(weight_v[0-9]{6,9})\.wdiff-tmp-[0-9]+-[0-9]+-[0-9a-f]{8}")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_output(url, *, token: str | None = None):
    url = os.fspath(url)
    spec = parse_remote(url)
    if spec["kind"] == "local":
        return LocalOutput(spec["path"])
    if spec["kind"] == "objstore":
        return StoreOutput(url, open_remote(url, token=token))
    raise UsageError(f"{printable(url)}: export writes a directory or an object store (s3://, gs://, az://, ...)")


def _own(ledger: Ledger, n: int, where: str) -> Ledger:
    if ledger.version != version_text(n):
        raise IntegrityError(f"{where}: the ledger of {dir_name(n)} names version {ledger.version}; "
                             "it was not written there by wdiff export")
    return ledger


def _check_numbers(where: str, numbers: list[int]) -> int:
    """The count of versions, which must be numbered 0, 1, ... without a gap."""
    numbers = sorted(numbers)
    if numbers != list(range(len(numbers))):
        missing = next(i for i, n in enumerate(numbers + [None]) if n != i)
        raise IntegrityError(f"{where}: {dir_name(missing)} is missing between the versions it holds; "
                             "it was not written by wdiff export (alone)",
                             hint="export into a new output, or restore the missing version")
    return len(numbers)


class LocalOutput:
    """A directory; ``open()`` creates it, locks it, sweeps dead temporaries."""

    local = True

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.url = self.path
        self.fd = -1
        self._made = False
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> LocalOutput:
        if os.path.lexists(self.path) and not os.path.isdir(self.path):
            raise UsageError(f"{self.path}: exists and is not a directory")
        self._made = not os.path.lexists(self.path)
        try:
            os.makedirs(self.path, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise io_error(self.path, e) from None
        try:
            state = self._stack.enter_context(StateDir.open(self.path))
            self._stack.enter_context(state.lock(what=f"{self.path} (export)", name="export.lock"))
            for n in os.listdir(self.fd):
                m = _TEMP.fullmatch(n)
                if m:
                    clear_dead_temps_at(self.fd, m.group(1))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._made and exc and exc[0] is not None:  # a refused export leaves no OUT it made
            with contextlib.suppress(OSError):
                if os.listdir(self.path) == [".wdiff"] and os.listdir(os.path.join(self.path, ".wdiff")) in (
                        [], ["export.lock"]):
                    shutil.rmtree(self.path)

    def count(self) -> int:
        """How many versions OUT holds (numbered 0 to count - 1)."""
        numbers = []
        for n in os.listdir(self.fd):
            k = number_of(n)
            if k is None:
                continue
            st = os.stat(n, dir_fd=self.fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise IntegrityError(f"{self.path}/{n}: not a folder (a link?); wdiff export never writes one",
                                     hint="remove it if it is not yours, then run the export again")
            numbers.append(k)
        return _check_numbers(self.path, numbers)

    def ledger(self, n: int) -> Ledger:
        name = dir_name(n)
        where = f"{self.path}/{name}/{LEDGER}"
        fds = []
        try:
            fds.append(os.open(name, _DIR, dir_fd=self.fd))
            fds.append(os.open(LEDGER_DIR, _DIR, dir_fd=fds[-1]))
            with open_regular_at(fds[-1], os.path.basename(LEDGER), max_size=MAX_LEDGER_BYTES, what=where) as f:
                raw = f.read(MAX_LEDGER_BYTES + 1)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                raise IntegrityError(f"{where}: missing (or a link): {name} was not written by wdiff export",
                                     hint="export into a new output") from None
            raise io_error(where, e) from None
        finally:
            for fd in reversed(fds):
                os.close(fd)
        return _own(Ledger.decode(raw, where=where), n, where)

    @contextlib.contextmanager
    def staging(self, n: int, work: str):
        """A new, empty folder for version ``n``, beside its final name."""
        name = f".{dir_name(n)}.wdiff-tmp-{owner_tag()}-{secrets.token_hex(4)}"
        try:
            os.mkdir(name, 0o755, dir_fd=self.fd)
        except OSError as e:
            raise io_error(f"{self.path}/{name}", e) from None
        path = os.path.join(self.path, name)
        try:
            yield path
        finally:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(name, dir_fd=self.fd)

    def commit(self, n: int, folder: str, files: list[str], sources: dict[str, str] | None = None) -> None:
        """The checked version in ``folder`` becomes ``weight_vN``, in one rename."""
        name = dir_name(n)
        if os.path.lexists(os.path.join(self.path, name)):
            raise IntegrityError(f"{self.path}/{name}: appeared while the export ran; it is never replaced")
        try:
            os.rename(os.path.basename(folder), name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            os.fsync(self.fd)
        except OSError as e:
            raise io_error(f"{self.path}/{name}", e) from None


class StoreOutput:
    """An object store, through wdiff's remotes (``store``, ``list``, ``fetch``, ``delete``)."""

    local = False

    def __init__(self, url: str, store) -> None:
        self.url, self.store = url, store
        self._listed: list[tuple[str, int]] | None = None

    def __enter__(self) -> StoreOutput:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def _folders(self) -> dict[int, set[str]]:
        listed = self.store.list()
        out: dict[int, set[str]] = {}
        for path, _ in listed:
            top, sep, rest = path.partition("/")
            k = number_of(top)
            if sep and k is not None:
                out.setdefault(k, set()).add(rest)
        return out

    def _pending(self) -> int | None:
        try:
            raw = self._read(PENDING, 4096)
        except FileNotFoundError:
            return None
        try:
            n = json.loads(raw)["version"]
        except (ValueError, KeyError, TypeError):
            raise FormatError(f"{self.url}: {PENDING} is not what wdiff export writes") from None
        if type(n) is not int or n < 0:
            raise FormatError(f"{self.url}: {PENDING} is not what wdiff export writes")
        return n

    def count(self) -> int:
        folders = self._folders()
        pending = self._pending()
        done = [k for k, files in folders.items() if LEDGER in files]
        for k, files in folders.items():
            if LEDGER not in files and k != pending:
                raise IntegrityError(f"{self.url}: {dir_name(k)} has no ledger ({LEDGER}) and no export was "
                                     "writing it: it was not written by wdiff export",
                                     hint="export into a new prefix")
        return _check_numbers(self.url, done)

    def _read(self, path: str, limit: int) -> bytes:
        from ...errors import NotFoundError

        with scratch_dir("hfdelta") as t:
            dest = os.path.join(t, "x")
            try:
                self.store.fetch(path, dest, max_size=limit)
            except NotFoundError:
                raise FileNotFoundError(path) from None
            with open(dest, "rb") as f:
                return f.read()

    def ledger(self, n: int) -> Ledger:
        path = f"{dir_name(n)}/{LEDGER}"
        try:
            raw = self._read(path, MAX_LEDGER_BYTES)
        except FileNotFoundError:
            raise IntegrityError(f"{self.url}: {path} is missing: not written by wdiff export") from None
        return _own(Ledger.decode(raw, where=f"{self.url}: {path}"), n, f"{self.url}: {path}")

    @contextlib.contextmanager
    def staging(self, n: int, work: str):
        """A new, empty folder for version ``n`` in the export's work folder."""
        path = os.path.join(work, f"stage-{dir_name(n)}")
        shutil.rmtree(path, ignore_errors=True)  # a killed export's
        os.mkdir(path, 0o700)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def commit(self, n: int, folder: str, files: list[str], sources: dict[str, str] | None = None) -> None:
        """Upload the checked version: ``files`` (relative paths, in order;
        each from ``folder``, or from ``sources[path]`` when given there),
        after the pending marker and the removal of what an interrupted
        export of this number left; the marker goes last."""
        name = dir_name(n)
        marker = os.path.join(folder, ".pending")
        with open(marker, "wb") as f:
            f.write(json.dumps({"version": n}).encode())
        self.store.delete([PENDING])  # a store keeps an object of the same size: never a stale marker
        self.store.store([Upload(PENDING, marker, 0, os.path.getsize(marker))])
        left = [f"{name}/{p}" for p in sorted(self._folders().get(n, ()))]
        if left:
            self.store.delete(left)
        for rel in files:
            src = (sources or {}).get(rel) or os.path.join(folder, rel)
            self.store.store([Upload(f"{name}/{rel}", src, 0, os.path.getsize(src))])
        self.store.delete([PENDING])
