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
4. :func:`plan`: which tensors the model must be handed (every tensor of a
   layer in which any tensor changed: vLLM rebuilds a layer from all the
   checkpoint tensors it fuses, so a part of one is never handed alone);
5. :meth:`Mirror.stage`: read those tensors from the copy into private
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
from dataclasses import dataclass

import xxhash

from ...errors import BaseMismatchError, BusyError, IntegrityError, UsageError
from ...fsutil import fsync_dir, io_error, remove_tree
from ...ops.fetch import read_verified
from ...ops.pull import pull
from ...paths import printable
from ...remotes import open_remote
from ...statedir import StateDir
from ...store import manifest, record
from ...store.checkpoint import KIND_TENSORS, Checkpoint, read_into, scan
from ...store.hashing import Manifest, block_digests, hexd, short, tree
from ...store.ignore import DEFAULT_RULES

ENV_CACHE = "WDIFF_VLLM_CACHE"
#: how long a worker waits for the host's lock (another worker pulling)
LOCK_WAIT = 3600.0
#: staged tensors above this many bytes go to an unlinked file in the cache
#: folder (the page cache keeps it fast), not to anonymous memory
STAGE_IN_MEMORY = 1 << 30
PIECE = 16 * 1024 * 1024


@dataclass(frozen=True)
class Row:
    """One tensor of a version: where it lies and what it must hash to."""

    path: str  # its file, relative to the checkpoint
    offset: int  # of its first byte in that file
    nbytes: int
    dtype: str  # safetensors dtype name
    shape: tuple[int, ...]
    digest: bytes  # wdiff's tensor digest (block digests, then their tree)


@dataclass(frozen=True)
class Table:
    """The tensors of one version of a checkpoint, by name: those of its
    top-level tensor files (the ones vLLM loads)."""

    version: bytes
    rows: dict[str, Row]


def table_of(ckpt: Checkpoint, m: Manifest) -> Table:
    """The table of ``ckpt`` from its manifest ``m``."""
    rows: dict[str, Row] = {}
    for f in ckpt.files:
        if f.kind != KIND_TENSORS or "/" in f.path:
            continue
        fd = m.file(f.path)
        if fd is None or len(fd.blocks) != len(f.header.tensors):
            raise IntegrityError(f"{printable(f.path)}: its digests do not cover its tensors")
        for t, blocks in zip(f.header.tensors, fd.blocks):
            rows[t.name] = Row(f.path, f.header.data_start + t.start, t.nbytes, t.dtype, tuple(t.shape), tree(blocks))
    return Table(m.fingerprint, rows)


def hash_table(directory: str, *, threads: int) -> Table:
    """The table of the checkpoint in ``directory``, every byte read."""
    ckpt = scan(directory)
    if not ckpt.files:
        raise UsageError(f"{directory}: holds no checkpoint")
    return table_of(ckpt, manifest.compute(ckpt, threads=threads))


# -- which tensors an update hands the model --------------------------------------


def group_of(name: str) -> str:
    """The layer a checkpoint tensor belongs to: its name up to its first
    number (``model.layers.3`` for ``model.layers.3.mlp.experts.7.w1``: a
    mixture-of-experts layer is one layer), or "" for a name without one
    (embeddings, final norm, head): the grouping vLLM's own weight
    transfers use (``layerwise_groups``)."""
    parts = name.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return ""


def plan(held: Table, target: Table) -> list[str]:
    """The tensors of ``target`` to hand a model that holds ``held``: every
    tensor of each layer in which a tensor changed, in checkpoint order.
    The two must hold the same tensors with the same dtypes and shapes (a
    running model cannot add, drop or reshape one): anything else is
    refused before a byte is read."""
    a, b = held.rows, target.rows
    if a.keys() != b.keys():
        extra, missing = sorted(b.keys() - a.keys()), sorted(a.keys() - b.keys())
        name, what = (extra[0], "is not in the engine's model") if extra else (missing[0], "is missing")
        raise BaseMismatchError(f"version {short(target.version)} is not a version of the engine's model: tensor "
                                f"{printable(name)} {what} ({len(extra)} more, {len(missing)} fewer)",
                                hint="start an engine from a checkpoint of that model")
    for n, r in b.items():
        o = a[n]
        if (o.dtype, o.shape) != (r.dtype, r.shape):
            raise BaseMismatchError(f"version {short(target.version)} is not a version of the engine's model: "
                                    f"{printable(n)} is {r.dtype} {list(r.shape)} there, {o.dtype} {list(o.shape)} "
                                    "in the engine", hint="start an engine from a checkpoint of that model")
    groups = {group_of(n) for n, r in b.items() if r.digest != a[n].digest}
    names = [n for n in b if group_of(n) in groups]
    names.sort(key=lambda n: (b[n].path, b[n].offset))
    return names


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
            rec = record.read(st) if st is not None else None
        return rec.version if rec is not None else None

    def _table(self, goal: bytes, *, guess: bool) -> Table | None:
        """The copy's table if its files are version ``goal`` by their
        record and digests (with ``guess``, the manifest cache's digests
        where it has them: a guess that the fingerprint confirms or not,
        and staging reads every byte it hands on anyway)."""
        with StateDir.open(self.ckpt, create=False) or contextlib.nullcontext() as st:
            rec = record.read(st) if st is not None else None
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


class Staged:
    """Tensors read and verified, held where no other process can change
    them (anonymous memory, or an unlinked file): ``view(name)`` is a
    memoryview of one tensor's bytes."""

    def __init__(self, buf: mmap.mmap, where: dict[str, tuple[int, Row]]) -> None:
        self.buf = buf
        self.where = where
        #: where :meth:`close` hands the buffer for the next update (its pages are then
        #: in memory already: 105 MB of fresh pages cost 0.25 s to touch and unmap)
        self.give_back = None

    @property
    def names(self) -> list[str]:
        return list(self.where)

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for _, r in self.where.values())

    def view(self, name: str) -> memoryview:
        off, r = self.where[name]
        return memoryview(self.buf)[off : off + r.nbytes]

    def row(self, name: str) -> Row:
        return self.where[name][1]

    def close(self) -> None:
        # kept for the next update only if nothing still uses its memory: a loader that kept a
        # view of a tensor handed to it (instead of copying it) must never see it overwritten
        if self.give_back is not None and len(self.buf) <= STAGE_IN_MEMORY and not _exported(self.buf):
            self.give_back(self.buf)
            return
        with contextlib.suppress(BufferError):  # views still held: the mapping goes with them
            self.buf.close()

    @classmethod
    def read(cls, root: str, table: Table, names: list[str], *, spill_dir: str, threads: int,
             spare: mmap.mmap | None = None) -> Staged:
        from ...parallel import ordered_map

        where: dict[str, tuple[int, Row]] = {}
        total = 0
        for n in names:
            r = table.rows[n]
            where[n] = (total, r)
            total += -(-r.nbytes // 64) * 64  # aligned for any dtype
        buf = spare if spare is not None and total <= len(spare) <= STAGE_IN_MEMORY else _buffer(total, spill_dir)
        try:
            dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise io_error(root, e) from None
        fds: dict[str, int] = {}
        try:
            for n in names:
                path = where[n][1].path
                if path not in fds:
                    fds[path] = _open_file(dfd, path, root)

            def one(batch: list[str]) -> None:
                for n in batch:
                    off, r = where[n]
                    view = memoryview(buf)[off : off + r.nbytes]
                    for lo in range(0, r.nbytes, PIECE):
                        hi = min(r.nbytes, lo + PIECE)
                        read_into(fds[r.path], r.offset + lo, view[lo:hi], where=os.path.join(root, r.path))
                    got = tree(block_digests(view))
                    view.release()
                    if got != r.digest:
                        raise IntegrityError(f"{os.path.join(root, r.path)}: tensor {printable(n)} does not hold "
                                             "the bytes its version names (changed on disk?); the engine was not "
                                             "touched")

            # in checkpoint order (sequential reads), a few MB a task: 20,000 expert tensors of
            # a few kB are a few dozen tasks, not 20,000
            for _ in ordered_map(one, _batches(names, where), threads=threads, window=max(2, 2 * threads)):
                pass
        except BaseException:
            with contextlib.suppress(BufferError):
                buf.close()
            raise
        finally:
            for fd in fds.values():
                os.close(fd)
            os.close(dfd)
        return cls(buf, where)


def _batches(names: list[str], where: dict, size: int = 4 * PIECE // 16) -> Iterable[list[str]]:
    batch: list[str] = []
    n = 0
    for name in names:
        batch.append(name)
        n += where[name][1].nbytes
        if n >= size:
            yield batch
            batch, n = [], 0
    if batch:
        yield batch


def _open_file(dfd: int, path: str, root: str) -> int:
    """A top-level file of the copy, never through a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise IntegrityError(f"{os.path.join(root, path)}: a symbolic link in wdiff's copy") from None
        raise io_error(os.path.join(root, path), e) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IntegrityError(f"{os.path.join(root, path)}: not a regular file")
    return fd


def _exported(buf: mmap.mmap) -> bool:
    """Whether any buffer (a memoryview, a tensor made from one) still
    shares ``buf``'s memory: an mmap refuses to resize then."""
    try:
        buf.resize(len(buf))
    except BufferError:
        return True
    except (OSError, SystemError):  # cannot tell: do not reuse it
        return True
    return False


def _buffer(total: int, spill_dir: str) -> mmap.mmap:
    if total <= STAGE_IN_MEMORY:
        return mmap.mmap(-1, max(total, 1))
    import tempfile

    with tempfile.TemporaryFile(dir=spill_dir, prefix="stage-") as f:
        f.truncate(total)
        return mmap.mmap(f.fileno(), total)

