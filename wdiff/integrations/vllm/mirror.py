"""The host's half of a vLLM engine that follows a wdiff remote: no torch,
no vLLM here.

A host keeps one copy of the remote's version in a cache folder shared by
the engine's workers (``CACHE/<remote key>/checkpoint``, a checkpoint that
``wdiff pull`` brings from version to version): a version is downloaded
once per host however many workers read it. Each worker remembers what its
model holds as a :class:`Table` (every tensor's name, dtype, shape and
digest), and an update is:

1. resolve the version asked for on the remote's chain (signed, where keys
   are trusted);
2. under the host's lock, bring the copy to that version (``pull``: every
   part is checked against the chain, every patched chunk against its
   digests, and the copy is the old or the new version after any crash);
3. take the version's table from the copy and check it against the
   version's fingerprint (the table binds every tensor digest to the
   fingerprint the chain names);
4. :func:`~.tables.plan`: which tensors the model must be handed (every tensor of a
   layer in which any tensor changed: vLLM rebuilds a layer from all the
   checkpoint tensors it fuses, so a part of one is never handed alone);
5. :meth:`Mirror.stage` (:mod:`.staged`): read those tensors from the copy into private
   memory, each checked against its digest while it is read.

Only then does anything reach the model (wdiff.integrations.vllm.engine).
The cache folder is input: it is never followed through a link, its record
and files are taken only once they hash to what the chain names, and a copy
found changed is pulled again (restored) before it is read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import shutil
import stat
import time
from collections.abc import Iterable

import xxhash

from ...errors import BusyError, IntegrityError
from ...fsutil import fsync_dir, io_error, remove_tree
from ...sync.fetch import read_verified
from ...sync.pull.inplace import pull
from ...remotes import open_remote
from ...statedir import StateDir
from ...store import manifest, version_record
from ...store.checkpoint import scan
from ...store.hashing import hexd, short
from ...store.ignore import DEFAULT_RULES
from .staged import Staged
from .tables import Table, plan, table_of

ENV_CACHE = "WDIFF_VLLM_CACHE"
#: how long a worker waits for the host's lock (another worker pulling)
LOCK_WAIT = 3600.0


# -- the host's copy ---------------------------------------------------------------


def cache_root(cache_dir: str | None) -> str:
    base = cache_dir or os.environ.get(ENV_CACHE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "wdiff", "vllm")
    return os.path.abspath(base)


def _private_dir(path: str) -> None:
    """``path`` as a directory of this user that no one else may write, made
    if missing; a link or anything else there is refused."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise io_error(path, e) from None
    if not stat.S_ISDIR(st.st_mode):
        raise IntegrityError(f"{path}: {'a symbolic link' if stat.S_ISLNK(st.st_mode) else 'not a directory'}, "
                             "where wdiff keeps its copy of the remote", hint="remove it, or give another cache_dir")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise IntegrityError(f"{path}: owned or writable by another user", hint="give another cache_dir")


class Mirror:
    """The host's copy of ``remote`` under ``cache_dir`` (default
    ``WDIFF_VLLM_CACHE``, else ``~/.cache/wdiff/vllm``)."""

    def __init__(self, remote: str, *, cache_dir: str | None = None, trusted_keys: list | None = None,
                 require_signature: bool = False, token: str | None = None, threads: int = 1,
                 lock_wait: float = LOCK_WAIT) -> None:
        from ...format import signature as signing

        self.remote = os.fspath(remote)
        self.store = open_remote(self.remote, token=token)
        self.key_paths = trusted_keys
        self.keys = signing.required_keys(trusted_keys, require_signature)
        self.require_signature = require_signature
        self.token = token
        self.threads = threads
        self.lock_wait = lock_wait
        base = cache_root(cache_dir)
        self.root = os.path.join(base, xxhash.xxh3_64_hexdigest(self.store.url.encode("utf-8")))
        self.ckpt = os.path.join(self.root, "checkpoint")
        self.chain = None
        self._spare: mmap.mmap | None = None  # the last staging buffer, for the next

    def resolve(self, spec: str | None) -> bytes:
        """The version ``spec`` names (a label, a fingerprint or a prefix of
        one, HEAD), on the chain as verified now."""
        self.chain = read_verified(self.store, self.keys).chain
        return self.chain.resolve(spec)

    @contextlib.contextmanager
    def locked(self):
        """The host's lock on the copy (blocking: the workers of an engine
        take turns; BusyError after ``lock_wait`` seconds)."""
        for d in (os.path.dirname(self.root), self.root):
            _private_dir(d)
        path = os.path.join(self.root, "lock")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise IntegrityError(f"{path}: a symbolic link where wdiff keeps its lock") from None
            raise io_error(path, e) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise IntegrityError(f"{path}: not a regular file")
            deadline = time.monotonic() + self.lock_wait
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise BusyError(f"{self.root}: another process held the copy of {self.store.url} for "
                                        f"{self.lock_wait:.0f} s") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)

    def _checked_copy(self) -> bool:
        """Whether the copy exists (never a link)."""
        try:
            st = os.lstat(self.ckpt)
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            raise IntegrityError(f"{self.ckpt}: not a directory (a link?) where wdiff keeps its copy",
                                 hint="remove it; the next update makes the copy again")
        return True

    def seed(self, directory: str, version: bytes) -> None:
        """Start the copy from the checkpoint in ``directory`` (the engine's
        own, at ``version``), where there is none yet and the remote knows
        that version: a pull then needs only the deltas from it. Copied,
        never linked: the copy is patched in place. Call under
        :meth:`locked`, after :meth:`resolve`."""
        if self._checked_copy() or self.chain is None or version not in self.chain.versions:
            return
        src = scan(directory)
        for name in os.listdir(self.root):  # a seed a killed worker left (this one holds the lock)
            if name.startswith(".seed-"):
                remove_tree(os.path.join(self.root, name))
        tmp = os.path.join(self.root, f".seed-{os.getpid()}")
        try:
            for f in src.files:
                dst = os.path.join(tmp, f.path)
                os.makedirs(os.path.dirname(dst), mode=0o700, exist_ok=True)
                shutil.copyfile(f.abspath, dst, follow_symlinks=False)
                with open(dst, "rb") as fh:
                    os.fsync(fh.fileno())
            os.makedirs(tmp, mode=0o700, exist_ok=True)
            os.rename(tmp, self.ckpt)
            fsync_dir(self.root)
        except OSError as e:
            raise io_error(self.ckpt, e) from None
        finally:
            remove_tree(tmp)

    def bring_to(self, goal: bytes) -> Table:
        """The copy at version ``goal``, and its table (checked against
        ``goal``). Call under :meth:`locked`."""
        self._checked_copy()
        if self._recorded() != goal:
            self._pull(goal)
        table = self._table(goal, guess=True)
        if table is None:  # its record says goal, its files do not: restore them
            self._pull(goal)
            table = self._table(goal, guess=False)
        if table is None:
            raise IntegrityError(f"{self.ckpt}: does not hold version {short(goal)} after a pull "
                                 "(changed meanwhile?)")
        return table

    def _pull(self, goal: bytes) -> None:
        # force: the copy is wdiff's own, nobody's work; a file found changed there (debris,
        # tampering, a seed the remote does not know) is restored, never kept
        pull(self.remote, self.ckpt, to=hexd(goal), trusted_keys=self.key_paths,
             require_signature=self.require_signature, token=self.token, threads=self.threads, force=True)

    def _recorded(self) -> bytes | None:
        if not os.path.isdir(self.ckpt):
            return None
        with StateDir.open(self.ckpt, create=False) or contextlib.nullcontext() as st:
            rec = version_record.read(st) if st is not None else None
        return rec.version if rec is not None else None

    def _table(self, goal: bytes, *, guess: bool) -> Table | None:
        """The copy's table if its files are version ``goal`` by their
        record and digests (with ``guess``, the manifest cache's digests
        where it has them: a guess that the fingerprint confirms or not,
        and staging reads every byte it hands on anyway)."""
        with StateDir.open(self.ckpt, create=False) or contextlib.nullcontext() as st:
            rec = version_record.read(st) if st is not None else None
        if rec is None or rec.version != goal:
            return None
        ckpt = scan(self.ckpt, rules=DEFAULT_RULES.tracking(rec.paths), keep=rec.paths)
        m = manifest.compute(ckpt, threads=self.threads, use_cache=guess)
        if m.fingerprint != goal:
            return None
        return table_of(ckpt, m)

    def stage(self, table: Table, names: Iterable[str]) -> Staged:
        """Read ``names`` of ``table`` from the copy into private memory,
        each tensor checked against its digest. Call under :meth:`locked`."""
        spare, self._spare = self._spare, None
        staged = Staged.read(self.ckpt, table, list(names), spill_dir=self.root, threads=self.threads, spare=spare)
        staged.give_back = self._keep
        return staged

    def _keep(self, buf: mmap.mmap) -> None:
        if self._spare is None or len(buf) > len(self._spare):
            self._spare = buf

    def update(self, goal: bytes, held: Table, *, seed: tuple[str, bytes] | None = None) -> tuple[Table, Staged]:
        """Everything an update needs before the model is touched, under the
        host's lock: the copy at ``goal`` (started from ``seed``, a
        directory and its version, if there is no copy yet), the tensors a
        model holding ``held`` must be handed (:func:`plan`), read and
        verified. A copy found changed while it is read is pulled again
        (restored), once."""
        with self.locked():
            if seed is not None:
                self.seed(*seed)
            target = self.bring_to(goal)
            names = plan(held, target)
            try:
                return target, self.stage(target, names)
            except IntegrityError:
                self._pull(goal)
                target = self._table(goal, guess=False)
                if target is None:
                    raise
                return target, self.stage(target, names)
