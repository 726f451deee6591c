"""Follow a remote from an inference worker: keep live tensors at the
remote's head, one short pause per update.

``state_dir`` holds the follower's own copy of the version its tensors
hold, ``state_dir/checkpoint`` (an ordinary checkpoint, updated by the same
crash-safe in-place apply as ``wdiff apply --in-place``, which records its
version), and ``state_dir/work`` (downloads). A poll:

1. reads the remote's chain (verified with the trusted keys, if any);
2. finds the cheapest run of bundles from the version held to the head, or
   from nothing (an anchor) when there is none, or when more than
   ``max_behind`` bundles would be needed, or when nothing is held yet;
3. downloads them while the engine keeps serving, and squashes a run of
   several into one bundle (one apply);
4. pauses the engine (``hook``) only for :func:`apply_into`;
5. brings its checkpoint to the same version, then forgets the bundles.

Bundles are applied only along the chain, each from the version held, so
never out of order. After a crash (SIGKILL at any point) the checkpoint is
the old or the new version (an interrupted in-place apply is finished on
the next start) and a new Follower loads it into the tensors it is given.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass

import numpy as np

from ..errors import NotFoundError
from ..format import signature as signing
from ..format.bundle import BundleReader
from ..format.journal import Txn
from ..ops.apply.inplace import apply_in_place
from ..sync.fetch import download, read_verified
from ..ops.squash import squash_from
from ..parallel import default_threads
from ..progress import SILENT, Reporter
from ..remotes import open_remote
from ..statedir import StateDir
from ..store import manifest
from ..store.checkpoint import KIND_TENSORS, read_into, scan
from ..store.hashing import hexd
from ._tensors import Prepared
from .apply import _apply_into

#: more bundles than this behind: restart from the newest anchor instead
MAX_BEHIND = 64
PIECE = 16 * 1024 * 1024


@dataclass(frozen=True)
class FollowResult:
    version: str  # the version the tensors hold now
    previous: str | None  # the version they held before (None: nothing)
    bundles: int  # bundles of the chain this update covers
    squashed: bool  # several bundles were composed into one apply
    anchor: bool  # the update started from an anchor
    bytes_fetched: int
    pause_seconds: float  # time the tensors were being patched (the engine paused)
    seconds: float  # the whole poll
    label: str | None = None


class Follower:
    """Keep ``tensors`` (a state dict: torch tensors on any device, numpy
    arrays) at the head of ``remote``. ``hook``: what the engine must hold
    while its tensors are patched: a lock (anything with ``__enter__``) or
    a callable returning a context manager (pause serving, resume after).
    With a non-empty ``state_dir`` the version its checkpoint holds is loaded into
    the tensors now (``load=False``: the caller loaded that checkpoint
    itself)."""

    def __init__(self, remote, tensors, state_dir, *, hook=None, token: str | None = None,
                 trusted_keys: list | None = None, require_signature: bool = False, max_behind: int = MAX_BEHIND,
                 load: bool = True, threads: int | None = None, reporter: Reporter = SILENT) -> None:
        self.remote = os.fspath(remote) if isinstance(remote, os.PathLike) else remote
        self.tensors = Prepared(tensors)
        self.state_dir = os.path.abspath(os.fspath(state_dir))
        self.ckpt = os.path.join(self.state_dir, "checkpoint")
        self.hook = hook
        self.token = token
        self.keys = signing.required_keys(trusted_keys, require_signature)
        self.max_behind = max_behind
        self.threads = threads or default_threads()
        self.reporter = reporter
        self._store = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.last_error: BaseException | None = None
        self._disk: tuple[str, bool] | None = None
        os.makedirs(self.ckpt, exist_ok=True)
        self.version: bytes | None = self._recover()
        if self.version is not None and load:
            self._load()

    # -- state ---------------------------------------------------------------

    def _recover(self) -> bytes | None:
        """Finish an in-place apply of the checkpoint that a crash
        interrupted (its bundle waits in work/), and return the version the
        checkpoint holds (None: none yet), measured: the record an in-place
        apply writes comes after its commit, so a crash between the two
        leaves the new files under the old record."""
        with StateDir.open(self.ckpt) as st:
            journal = Txn(st).read_journal()
        if journal is not None:
            if os.path.isfile(journal.bundle_path):
                apply_in_place(journal.bundle_path, self.ckpt, abort=False, threads=self.threads,
                               over=journal.base_fingerprint is None)
            else:
                apply_in_place(journal.bundle_path, self.ckpt, abort=True, threads=self.threads)
        A = scan(self.ckpt)
        if not A.files:
            return None
        return manifest.compute(A, threads=self.threads).fingerprint

    def _load(self) -> None:
        """Copy the checkpoint's tensors into the live tensors."""
        A = scan(self.ckpt)
        lives = {t.name: t for t in self.tensors.lives}
        buf = np.empty(PIECE, dtype=np.uint8)
        for f in A.files:
            if f.kind != KIND_TENSORS:
                continue
            fd = os.open(f.abspath, os.O_RDONLY)
            try:
                for t in f.header.tensors:
                    live = lives.get(t.name)
                    if live is None or live.dtype != t.dtype or live.shape != t.shape:
                        raise NotFoundError(f"tensor {t.name!r} of {f.path} is not among the tensors given "
                                            "with that dtype and shape")
                    live.writable()
                    for lo in range(0, t.nbytes, PIECE):
                        n = min(PIECE, t.nbytes - lo)
                        read_into(fd, f.header.data_start + t.start + lo, memoryview(buf[:n]), where=f.abspath)
                        live.write(lo, buf[:n])
                    live.sync()
            finally:
                os.close(fd)

    def _finish_disk(self) -> None:
        """Bring the checkpoint to the version the tensors hold (the last
        update's bundle; retried by the next poll if it failed)."""
        if self._disk is None:
            return
        bundle, anchor = self._disk
        apply_in_place(bundle, self.ckpt, abort=False, threads=self.threads, over=anchor)
        self._disk = None
        with StateDir.open(self.state_dir, "work") as work:
            for name in work.names():
                work.unlink(name)

    def _pause(self):
        if self.hook is None:
            return contextlib.nullcontext()
        if hasattr(self.hook, "__enter__"):
            return self.hook
        return self.hook()

    # -- polling -------------------------------------------------------------

    @property
    def store(self):
        if self._store is None:
            self._store = open_remote(self.remote, token=self.token)
        return self._store

    def poll(self) -> FollowResult | None:
        """Bring the tensors to the remote's head; None when they are there."""
        t0 = time.perf_counter()
        self._finish_disk()
        chain = read_verified(self.store, self.keys).chain
        if chain.head is None or chain.head == self.version:
            return None
        goal = chain.head
        run = chain.path(self.version, goal) if self.version is not None else None
        if run is None or len(run) > self.max_behind:
            run = chain.path(None, goal)
        if not run:
            raise NotFoundError(f"{self.store.url}: no run of bundles leads to the head {hexd(goal)[:12]}")
        anchor = run[0].parent is None
        fetched = 0
        with StateDir.open(self.state_dir, "work") as work:
            paths = []
            for e in run:
                p, n = download(self.store, e, work, self.reporter)
                paths.append(p)
                fetched += n
            bundle = paths[0]
            if len(paths) > 1:
                bundle = work.where("squash.wdb")
                work.unlink("squash.wdb")
                squash_from(paths, None if anchor else self.ckpt, bundle, threads=self.threads, check_out=False)
            with self._pause():
                t1 = time.perf_counter()
                # the chain was verified (signed, where keys are trusted) and every
                # part checked against it: the bundle needs no signature of its own
                # (a squash has none)
                with BundleReader(bundle) as reader:
                    # its checkpoint holds the base version: its headers place the tensors,
                    # whatever the order of the dict it was given (checked against the bundle)
                    _apply_into(reader, self.tensors, base_version=None if anchor else self.version,
                                threads=self.threads, layout=None if anchor else self.ckpt)
                t2 = time.perf_counter()
            previous, self.version = self.version, goal
            self._disk = (bundle, anchor)
            self._finish_disk()
        return FollowResult(
            version=hexd(goal), previous=hexd(previous) if previous else None, bundles=len(run),
            squashed=len(run) > 1, anchor=anchor, bytes_fetched=fetched, pause_seconds=t2 - t1,
            seconds=time.perf_counter() - t0, label=run[-1].label,
        )

    def start(self, interval: float = 10.0, on_update=None) -> None:
        """Poll every ``interval`` seconds in a background thread until
        :meth:`stop`; ``on_update(result)`` after each update. An error is
        kept in ``last_error`` and the next poll tries again."""
        if self._thread is not None:
            return
        self._stop.clear()

        def loop():
            while not self._stop.is_set():
                try:
                    res = self.poll()
                    self.last_error = None
                    if res is not None and on_update is not None:
                        on_update(res)
                except Exception as e:  # noqa: BLE001 - kept for the caller; the loop goes on
                    self.last_error = e
                self._stop.wait(interval)

        self._thread = threading.Thread(target=loop, name="wdiff-follower", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def version_hex(self) -> str | None:
        return hexd(self.version) if self.version else None
