"""Publish live tensors: compare them, chunk by chunk, against a mirror (the
last published version, an ordinary safetensors checkpoint on disk), pack
one bundle from memory, push it, and bring the mirror up to date in place.

No full checkpoint is written per step: the target side of the pack is the
tensors themselves (wdiff.ops.memsource), read a unit at a time. The mirror
is updated by the same in-place apply as ``wdiff apply --in-place``
(journal, undo log, verified before commit), so a crash at any point
leaves it at the old or the new version. The bundle being published waits
in ``MIRROR/.wdiff/live/pending.wdb`` until the mirror holds its target: a
publisher that starts after a crash pushes it (a push of a bundle the
remote has is a no-op) and finishes the mirror first.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from ..defaults import DEFAULT_CHUNK, DEFAULT_LEVEL, DEFAULT_PART_SIZE
from ..errors import FormatError, UsageError
from ..fsutil import fsync_dir
from ..ops.apply.inplace import TrustedBase, apply_in_place
from ..ops.memsource import MemoryTarget, pack_memory
from ..ops.pack import pack
from ..parallel import default_threads
from ..paths import validate_relpath
from ..progress import SILENT, Reporter
from ..statedir import StateDir
from ..store.checkpoint import scan
from ..store.digests import Digests
from ..store.hashing import hexd
from ..sync.push import push_bundle
from ._tensors import prepared
from .layout import INDEX, MAX_SHARD, METADATA, canonical, index_json, mem_tensors, shard

PENDING = "pending.wdb"


@dataclass(frozen=True)
class PublishResult:
    version: str  # the new version's fingerprint (hex)
    parent: str | None  # the version it was packed against (None: an anchor)
    bundle_id: str
    bundle_bytes: int
    seconds: float
    anchor: bool
    changed_elements: int
    tensors_changed: int
    uploaded: bool | None  # False when the remote had this bundle already; None: still in the background
    label: str | None = None
    #: seconds of the three steps: pack (compare + encode), push, mirror update
    pack_seconds: float = 0.0
    push_seconds: float = 0.0
    mirror_seconds: float = 0.0


class Publisher:
    """Publish the tensors of a running trainer to ``remote`` (any wdiff
    remote URL or path), keeping the last published version in
    ``mirror_dir``. ``files``: companion files of the checkpoint, written
    into every version: ``{"config.json": content}``, the content as bytes
    or str, or a file's path as an ``os.PathLike`` (``pathlib.Path``).
    ``anchor_every``: every Nth publish also pushes a full anchor of its
    version (packed from the mirror, beside the delta: the deltas stay one
    chain), so that followers far behind restart from a recent one (None:
    only the first publish is an anchor).
    ``background``: see :meth:`publish`."""

    def __init__(self, remote, mirror_dir, *, files: dict | None = None, max_shard_size: int = MAX_SHARD,
                 anchor_every: int | None = None, level: int = DEFAULT_LEVEL, part_size: int = DEFAULT_PART_SIZE,
                 sign_key=None, threads: int | None = None, background: bool = False, chunk: int = DEFAULT_CHUNK,
                 reporter: Reporter = SILENT) -> None:
        self.remote = os.fspath(remote) if isinstance(remote, os.PathLike) else remote
        self.mirror = os.path.abspath(os.fspath(mirror_dir))
        self.files = dict(files or {})
        for name in self.files:
            try:
                validate_relpath(name, where="Publisher files")
            except FormatError as e:
                raise UsageError(e.message) from None
            if name.endswith(".safetensors") or name == INDEX:
                raise UsageError(f"{name}: the publisher writes the tensor files and their index itself")
        self.max_shard = max_shard_size
        if anchor_every is not None and anchor_every < 1:
            raise UsageError("anchor_every must be at least 1")
        self.anchor_every = anchor_every
        self.level, self.part_size, self.sign_key = level, part_size, sign_key
        self.threads = threads or default_threads()
        self.reporter = reporter
        self.published = 0
        self.background = background
        self._scanned = None
        if chunk <= 0 or chunk % (1 << 20):
            raise UsageError("the chunk size is a positive multiple of 1 MiB (the digest block)")
        self.chunk = chunk
        self._job: Future | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wdiff-publish")

    def publish(self, tensors, *, label: str | None = None, anchor: bool = False) -> PublishResult:
        """Publish ``tensors`` (a state dict, or an iterable of (name,
        tensor): torch tensors on any device, numpy arrays) as the remote's
        new head. The first publish into an empty mirror is an anchor.

        With ``background=True`` (the Publisher's), this returns once the
        bundle is packed, which is the only time the tensors are read: the
        push and the mirror update run in a thread while training goes on,
        and the next publish (or :meth:`wait`) waits for them and raises
        their error, if any. The result then has ``uploaded=None``."""
        self.wait()
        t0 = time.perf_counter()
        os.makedirs(self.mirror, exist_ok=True)
        stack = contextlib.ExitStack()
        try:
            live = stack.enter_context(StateDir.open(self.mirror, "live"))
            stack.enter_context(live.lock(what=f"{self.mirror} (publisher)", name="publisher.lock"))
            self._finish_pending(live)
            lives = prepared(tensors)
            if not lives:
                raise UsageError("nothing to publish: no tensors given")
            files = shard(canonical(lives), self.max_shard)  # by name: any receiver's order rebuilds it
            A = self._scanned = scan(self.mirror, reuse=self._scanned)  # same header bytes: not parsed again
            if not A.files:
                anchor = True
            with tempfile.TemporaryDirectory(prefix=".wdiff-live-", dir=os.path.dirname(self.mirror)) as tmp:
                companions = self._companions(tmp, files)
                target = MemoryTarget([(p, mem_tensors(g)) for p, g in files], companions, metadata=METADATA)
                out = live.where(PENDING)
                digests = Digests()
                packed = pack_memory(None if anchor else A, target, live.where(PENDING + ".new"),
                                     level=self.level, threads=self.threads, chunk=self.chunk,
                                     reporter=self.reporter, base_digests=digests)
                # the mirror as this pack read and hashed it: its update reads only the chunks it patches
                trusted = None if anchor else TrustedBase(A, digests, packed.base_fingerprint)
                os.replace(live.where(PENDING + ".new"), out)
                fsync_dir(live.path)
        except BaseException:
            stack.close()
            raise
        t1 = time.perf_counter()
        self.published += 1
        also_anchor = bool(self.anchor_every) and not anchor and self.published % self.anchor_every == 0

        def result(uploaded, t2, t3) -> PublishResult:
            return PublishResult(
                version=hexd(packed.target_fingerprint),
                parent=hexd(packed.base_fingerprint) if packed.base_fingerprint else None,
                bundle_id=hexd(packed.bundle_id), bundle_bytes=packed.bundle_bytes, seconds=t3 - t0, anchor=anchor,
                changed_elements=packed.changed_elements, tensors_changed=packed.tensors_changed,
                uploaded=uploaded, label=label, pack_seconds=t1 - t0, push_seconds=t2 - t1, mirror_seconds=t3 - t2,
            )

        def finish() -> PublishResult:
            with stack:
                pushed = push_bundle(out, self.remote, label=label, part_size=self.part_size, fork=False,
                                     sign_key=self.sign_key, reporter=self.reporter)
                t2 = time.perf_counter()
                self._update_mirror(live, anchor, trusted)
                if also_anchor:
                    self._push_anchor(label)
                return result(pushed.uploaded, t2, time.perf_counter())

        if not self.background:
            return finish()
        self._job = self._pool.submit(finish)
        return result(None, t1, t1)

    def wait(self) -> PublishResult | None:
        """Wait for a background push and mirror update; their result (None
        when none was running), or their error."""
        job, self._job = self._job, None
        return job.result() if job is not None else None

    def close(self) -> PublishResult | None:
        """:meth:`wait`, then stop the background thread."""
        try:
            return self.wait()
        finally:
            self._pool.shutdown(wait=True)

    def _companions(self, tmp: str, files) -> dict[str, str]:
        out = {}
        idx = index_json(files)
        items = dict(self.files)
        if idx is not None:
            items[INDEX] = idx
        for name, content in items.items():
            if isinstance(content, (bytes, bytearray, str)):
                data = content.encode() if isinstance(content, str) else bytes(content)
                p = os.path.join(tmp, f"c{len(out)}")
                with open(p, "wb") as f:
                    f.write(data)
                out[name] = p
            else:
                out[name] = os.fspath(content)
        return out

    def _push_anchor(self, label: str | None) -> None:
        """Add a full anchor of the version just published, packed from the
        mirror (the tensors are not read again), as a shortcut: the chain of
        deltas goes on through it, and a follower far behind starts there."""
        fd, tmp = tempfile.mkstemp(prefix=".wdiff-anchor-", suffix=".wdb", dir=os.path.dirname(self.mirror))
        os.close(fd)
        try:
            pack(None, self.mirror, tmp, level=self.level, threads=self.threads, chunk=self.chunk, overwrite=True)
            push_bundle(tmp, self.remote, label=label, part_size=self.part_size, fork=False, sign_key=self.sign_key,
                        reporter=self.reporter, shortcut=True)
        finally:
            for p in (tmp, tmp + ".minisig"):
                with contextlib.suppress(OSError):
                    os.unlink(p)

    def _update_mirror(self, live: StateDir, anchor: bool, trusted: TrustedBase | None = None) -> None:
        apply_in_place(live.where(PENDING), self.mirror, abort=False, threads=self.threads, over=anchor,
                       trusted=trusted)
        live.unlink(PENDING)

    def _finish_pending(self, live: StateDir) -> None:
        """A bundle left by a crash: push it (a no-op if the remote has it),
        then finish bringing the mirror to its target."""
        if live.kind(PENDING) != "file":
            return
        from ..format.bundle import BundleReader

        with BundleReader(live.where(PENDING)) as r:
            anchor = r.index.base_fingerprint is None
        push_bundle(live.where(PENDING), self.remote, label=None, part_size=self.part_size, fork=False,
                    sign_key=self.sign_key, reporter=self.reporter)
        self._update_mirror(live, anchor)
