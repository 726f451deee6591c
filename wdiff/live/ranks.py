"""Publish from many ranks: each rank of a ``torch.distributed`` process
group (gloo, or any backend with object collectives) publishes its own
tensors as one part of a version, and rank 0 makes the version visible only
once every part is durable on the remote.

Built on the staged parts of wdiff.sync.stage (the command line's ``push
--only --stage`` and ``commit``):

1. the ranks agree on a stage name, the remote's head, and whether this is
   an anchor (every mirror empty, no versions yet) or a delta;
2. each rank packs its tensors against its own mirror (a directory holding
   only its files of the last version: its shard, and on rank 0 the shard
   index and the companion files) and stores the bundle and its part
   manifest under ``stage/NAME/`` (the chain is not touched);
3. a gather of every rank's outcome is the barrier: rank 0 commits (checks
   count, disjoint files, bases that together are the head, merges the parts
   into one bundle, one conditional chain write) only when every rank stored
   its part, and tells every rank the result;
4. each rank brings its mirror up to date in place from its own part.

A reader sees a version whole or not at all: until the commit the parts are
objects under stage/ that no reader lists. A rank that fails or dies before
its part is stored, or before the gather, leaves nothing visible (the other
ranks' collectives fail, or they learn of the failure from rank 0, and the
stage's objects are debris for gc). A rank that dies after the commit and
before its mirror update keeps its part in ``MIRROR/.wdiff/live/part.wdb``:
the next publish finds, from every rank's files and the remote's head,
whether that version was committed, and either finishes the mirror update
or drops the part.

The layout is save_pretrained's sharded one, one shard per rank:
``model-0000K-of-0000N.safetensors`` (K = rank + 1, N = the group's size)
holds rank K-1's tensors by name (whatever order its dict gives), and
``model.safetensors.index.json`` maps every tensor to its shard. Whole
tensors in the files: a tensor split over ranks (a tensor-parallel
slice, given its place with :class:`Slice`) is sent to the lowest rank
holding a slice of it, which publishes it whole (one such tensor at a time
in its memory). FSDP's flattened parameters are not slices of one tensor:
pass their unflattened views (or gather them first).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
import time
from typing import NamedTuple

from ..defaults import DEFAULT_CHUNK, DEFAULT_LEVEL, DEFAULT_PART_SIZE
from ..errors import BaseMismatchError, NotFoundError, UsageError, WdiffError
from ..format.bundle import BundleReader
from ..format.chain import Chain
from ..fsutil import fsync_dir
from ..ops.apply.inplace import TrustedBase, apply_in_place
from ..ops.memsource import MemoryTarget, pack_memory
from ..parallel import default_threads
from ..paths import printable
from ..progress import SILENT, Reporter
from ..remotes import open_remote
from ..statedir import StateDir
from ..store import version_record
from ..store.checkpoint import path_sort_key, scan
from ..store.digests import Digests
from ..store.hashing import fingerprint, hexd
from ..sync.stage import commit, store_part
from ._tensors import prepared
from .layout import METADATA, SINGLE, canonical, mem_tensors
from .publisher import Publisher, PublishResult

PART = "part.wdb"


class Slice(NamedTuple):
    """Where a rank's tensor lies in a tensor split over ranks: the full
    tensor's ``shape``, the dimension it is split along, and the index of
    the rank's first row (column...) along it."""

    shape: tuple
    dim: int
    start: int


def shard_name(rank: int, world: int) -> str:
    """The tensor file of ``rank`` in a group of ``world`` ranks."""
    return SINGLE if world == 1 else f"model-{rank + 1:05d}-of-{world:05d}.safetensors"


class RankPublisher:
    """Publish this rank's tensors as its part of one version per step, with
    every rank of ``group`` (default: the default process group) calling
    :meth:`publish` in step. ``mirror_dir``: this rank's mirror (its own
    directory: one per rank, on any host). ``files``: companion files, written
    by rank 0 (as :class:`Publisher`'s). Returns the same
    :class:`PublishResult` on every rank: the version, and this rank's part
    of it (bundle bytes, changed elements)."""

    def __init__(self, remote, mirror_dir, *, group=None, files: dict | None = None, level: int = DEFAULT_LEVEL,
                 part_size: int = DEFAULT_PART_SIZE, sign_key=None, threads: int | None = None,
                 chunk: int = DEFAULT_CHUNK, reporter: Reporter = SILENT) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise UsageError("RankPublisher needs an initialised torch.distributed process group")
        self.dist, self.group = dist, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.root = dist.get_global_rank(group, 0) if group is not None else 0
        # the companion checks of a single publisher (names, no tensor files)
        self._files = Publisher(remote, mirror_dir, files=files if self.rank == 0 else None, threads=1)
        self._files._pool.shutdown(wait=False)
        self.remote, self.mirror = self._files.remote, self._files.mirror
        self.level, self.part_size, self.sign_key, self.chunk = level, part_size, sign_key, chunk
        self.threads = threads or default_threads()
        self.reporter = reporter
        self._scanned = None

    # -- collectives --------------------------------------------------------------

    def _gather(self, obj) -> list:
        out = [None] * self.world
        self.dist.all_gather_object(out, obj, group=self.group)
        return out

    def _bcast(self, obj):
        box = [obj]
        self.dist.broadcast_object_list(box, src=self.root, group=self.group)
        return box[0]

    # -- publish ------------------------------------------------------------------

    def publish(self, tensors, *, label: str | None = None, slices: dict | None = None) -> PublishResult:
        """Publish this rank's ``tensors`` (a state dict or (name, tensor)
        pairs) as its part of the next version; every rank of the group
        calls it with its own tensors. ``slices``: the tensors of
        ``tensors`` that are slices of a tensor split over ranks, by name:
        :class:`Slice` (full shape, dimension, start) of each (torch
        tensors); the slices of one name must tile the full tensor. The
        lowest rank holding a slice of it publishes the whole tensor,
        assembled there from every slice (sent to it over the group): that
        rank holds one such tensor at a time in memory. Raises on every rank
        if any rank failed, and then nothing was published."""
        t0 = time.perf_counter()
        os.makedirs(self.mirror, exist_ok=True)
        with StateDir.open(self.mirror, "live") as live, live.lock(what=f"{self.mirror} (publisher)",
                                                                    name="publisher.lock"):
            store = head = None
            try:  # a rank that fails here must not leave the others waiting in a collective
                if self.rank == 0:
                    store = open_remote(self.remote)
                    head = Chain.decode(store.read_chain()[0], where=store.url).head
                ok = None
            except Exception as e:  # noqa: BLE001 - every rank hears of it, then it is raised here
                ok = e
            late = self._recover(live, head, ok)
            tensors, late = self._assemble(tensors, slices, late)
            lives, A, ok = self._prepare(tensors) if late is None else ([], None, late)
            mine = {"names": [t.name for t in lives], "sizes": [t.nbytes for t in lives],
                    "empty": A is not None and not A.files, "error": None if ok is None else _say(ok)}
            everyone = self._gather(mine)
            plan = self._bcast(self._plan(everyone, head) if self.rank == 0 else None)
            if isinstance(plan, str):
                if ok is not None:
                    raise ok
                raise UsageError(plan)
            stage, head, anchor = plan["stage"], plan["head"], plan["anchor"]
            err, packed, digests = None, None, Digests()
            try:
                with tempfile.TemporaryDirectory(prefix=".wdiff-live-", dir=os.path.dirname(self.mirror)) as tmp:
                    path = shard_name(self.rank, self.world)
                    companions = {}
                    if self.rank == 0:
                        files = [(shard_name(k, self.world), [_Named(n, s) for n, s in zip(e["names"], e["sizes"])])
                                 for k, e in enumerate(everyone)]
                        companions = self._files._companions(tmp, files)  # the shard index and the files
                    target = MemoryTarget([(path, mem_tensors(lives))], companions, metadata=METADATA)
                    new = live.where(PART + ".new")
                    packed = pack_memory(None if anchor else A, target, new, level=self.level, threads=self.threads,
                                         chunk=self.chunk, reporter=self.reporter, base_digests=digests)
                    os.replace(new, live.where(PART))
                    fsync_dir(live.path)
                    store_part(live.where(PART), store or open_remote(self.remote), stage=stage, head=head,
                               reporter=self.reporter, sign_key=self.sign_key)
            except Exception as e:  # noqa: BLE001 - every rank must hear of it, then it is raised here
                err = e
            outcomes = self._gather(None if err is None else _say(err))
            t1 = time.perf_counter()
            result = self._bcast(self._commit(stage, outcomes, label) if self.rank == 0 else None)
            if isinstance(result, str):
                with contextlib.suppress(OSError):
                    os.unlink(live.where(PART))
                if err is not None:
                    raise err
                raise NotFoundError(f"{result}; nothing was published", hint="every rank publishes in step")
            t2 = time.perf_counter()
            trusted = None if anchor else TrustedBase(A, digests, packed.base_fingerprint)
            apply_in_place(live.where(PART), self.mirror, abort=False, threads=self.threads, over=anchor,
                           trusted=trusted)
            live.unlink(PART)
        t3 = time.perf_counter()
        return PublishResult(
            version=result["version"], parent=result["parent"], bundle_id=result["bundle_id"],
            bundle_bytes=packed.bundle_bytes, seconds=t3 - t0, anchor=anchor,
            changed_elements=packed.changed_elements, tensors_changed=packed.tensors_changed,
            uploaded=result["uploaded"], label=label, pack_seconds=t1 - t0, push_seconds=t2 - t1,
            mirror_seconds=t3 - t2,
        )

    def _assemble(self, tensors, slices: dict | None, failed: Exception | None):
        """Every rank's tensors with the slices of a split tensor replaced by
        the whole tensor on its owner (the lowest rank holding a slice of
        it) and left out elsewhere; or the error (checked on every rank
        alike, from every rank's slices)."""
        pairs = list(tensors.items()) if isinstance(tensors, dict) else list(tensors)
        mine, err = [], failed
        if err is None:
            try:
                mine = _describe(pairs, slices or {})
            except Exception as e:  # noqa: BLE001 - told to every rank
                err = e
        every = self._gather((mine, None if err is None else _say(err)))
        bad = [f"rank {k}: {e}" for k, (_, e) in enumerate(every) if e]
        owners, why = ({}, "; ".join(bad)) if bad else _tiling([d for d, _ in every])
        if why:
            return pairs, err if err is not None else UsageError(why)
        if not owners:
            return pairs, None
        import torch

        got = dict(pairs)
        whole = {}
        for name in sorted(owners):
            owner, shape, dim, dtype, parts = owners[name]
            if self.rank == owner:
                full = torch.empty(shape, dtype=getattr(torch, dtype))
                for k, start, n in parts:
                    view = full.narrow(dim, start, n)
                    if k == self.rank:
                        view.copy_(got[name])
                        continue
                    buf = torch.empty(view.shape, dtype=full.dtype)
                    self.dist.recv(buf.reshape(-1).view(torch.uint8), src=self._global(k), group=self.group)
                    view.copy_(buf)
                whole[name] = full
            elif any(k == self.rank for k, _, _ in parts):
                t = got[name].detach().to("cpu").contiguous()
                self.dist.send(t.reshape(-1).view(torch.uint8), dst=self._global(owner), group=self.group)
        out = []
        for name, t in pairs:
            if name not in owners:
                out.append((name, t))
            elif name in whole:
                out.append((name, whole[name]))
        return out, None

    def _global(self, k: int) -> int:
        return self.dist.get_global_rank(self.group, k) if self.group is not None else k

    def _prepare(self, tensors):
        """This rank's tensors and mirror, or the error that stops it."""
        try:
            lives = canonical(prepared(tensors))  # each rank's file by name, whatever its dict's order
            A = self._scanned = scan(self.mirror, reuse=self._scanned)
            return lives, A, None
        except Exception as e:  # noqa: BLE001 - told to every rank, then raised here
            return [], None, e

    def _plan(self, everyone: list[dict], head: bytes | None):
        """Rank 0: the stage, the head and anchor-or-delta, or why not (a
        string every rank raises)."""
        seen: dict[str, int] = {}
        failed = [f"rank {k}: {e['error']}" for k, e in enumerate(everyone) if e["error"]]
        if failed:
            return "; ".join(failed) + "; nothing was published"
        for k, e in enumerate(everyone):
            if not e["names"]:
                return f"rank {k} has no tensors to publish"
            for n in e["names"]:
                if n in seen:
                    return f"tensor {printable(n)} is given by ranks {seen[n]} and {k}: each rank publishes its own"
                seen[n] = k
        empties = {e["empty"] for e in everyone}
        if len(empties) != 1:
            return "some ranks' mirrors are empty and some are not: give every rank its mirror of the last version"
        anchor = empties == {True}
        if anchor and head is not None:
            return (f"{self.remote}: has versions already, and the mirrors are empty: multi-rank publishing starts "
                    "on an empty remote or from mirrors at its head")
        return {"stage": f"live-{secrets.token_hex(8)}", "head": head, "anchor": anchor}

    def _commit(self, stage: str, outcomes: list, label: str | None):
        """Rank 0: commit when every part is stored; the result, or why not."""
        failed = [(k, o) for k, o in enumerate(outcomes) if o is not None]
        if failed:
            return "; ".join(f"rank {k}: {o}" for k, o in failed)
        try:
            res = commit(self.remote, stage=stage, expect=self.world, label=label, sign_key=self.sign_key,
                         part_size=self.part_size, threads=self.threads, reporter=self.reporter)
        except WdiffError as e:
            return f"the commit failed: {e.message}"
        p = res.push
        return {"version": hexd(p.version), "parent": hexd(p.parent) if p.parent else None,
                "bundle_id": hexd(p.bundle_id), "uploaded": p.uploaded}

    def _recover(self, live: StateDir, head: bytes | None, failed: Exception | None) -> Exception | None:
        """A part left by a crash (after the commit, before this rank's
        mirror update; or before the commit): rank 0 decides, from every
        rank's files and the head, whether its version was committed; the
        ranks holding one then finish their mirror update, or drop it.
        ``failed``: rank 0 could not read the head (every rank raises).
        Returns the error of this rank's own recovery, for the next gather."""
        try:
            rows_now, rows_new, err = *self._rows(live), None
        except Exception as e:  # noqa: BLE001 - told to every rank, then raised here
            rows_now, rows_new, err = [], None, e
        every = self._gather((rows_now, rows_new, None if err is None else _say(err)))
        bad = [f"rank {k}: {e}" for k, (_, _, e) in enumerate(every) if e]
        if failed is not None:
            bad.insert(0, f"rank 0: {_say(failed)}")
        if bad:
            if failed is not None and self.rank == 0:
                raise failed
            if err is not None:
                raise err
            raise NotFoundError("; ".join(bad) + "; nothing was published")
        if all(new is None for _, new, _ in every):
            return None
        verdict = None
        if self.rank == 0:
            def fp(rows):
                return fingerprint(sorted(rows, key=lambda r: path_sort_key(r[0]))) if rows else None

            after = [r for now, new, _ in every for r in (new if new is not None else now)]
            before = [r for now, _, _ in every for r in now]
            verdict = "apply" if head is not None and fp(after) == head else \
                "drop" if fp(before) == head else "stuck"
        verdict = self._bcast(verdict)
        if verdict == "stuck":
            raise BaseMismatchError(
                f"{self.mirror}: the ranks' mirrors together are neither the remote's head nor the version "
                "before it", hint="start every rank from mirrors of one version (wdiff pull of the head, "
                "each rank keeping its files)")
        if rows_new is None:
            return None
        try:
            if verdict == "apply":
                with BundleReader(live.where(PART)) as r:
                    anchor = r.index.base_fingerprint is None
                apply_in_place(live.where(PART), self.mirror, abort=False, threads=self.threads, over=anchor)
            else:
                txn = os.path.join(self.mirror, ".wdiff", "txn", "journal.json")
                if os.path.exists(txn):  # an update starts only after a commit: this cannot be
                    raise BaseMismatchError(f"{self.mirror}: an unfinished mirror update of a version the remote "
                                            "lacks")
            live.unlink(PART)
        except Exception as e:  # noqa: BLE001 - told to every rank in the next gather
            return e
        return None

    def _rows(self, live: StateDir):
        """This rank's files now (the mirror's record) and, with a part left
        over, the files it makes: (path, kind, size, digest) rows."""
        with StateDir.open(self.mirror) as state:
            rec = version_record.read(state)
        now = [(r.path, r.kind, r.size, r.digest) for r in rec.files] if rec is not None else []
        if live.kind(PART) != "file":
            return now, None
        with BundleReader(live.where(PART)) as r:
            return now, [(f.path, f.kind, f.size, f.digest) for f in r.index.files]


def _describe(pairs, slices: dict) -> list:
    """(name, full shape, dim, start, length, dtype) of this rank's slices."""
    names = {n for n, _ in pairs}
    missing = sorted(set(slices) - names)
    if missing:
        raise UsageError(f"slices names {printable(missing[0])}, which is not among the tensors given")
    out = []
    for name, t in pairs:
        if name not in slices:
            continue
        shape, dim, start = Slice(*slices[name])
        shape = tuple(int(x) for x in shape)
        if not hasattr(t, "narrow") or t.dim() != len(shape) or not 0 <= dim < len(shape):
            raise UsageError(f"{printable(name)}: a slice is a torch tensor with the full tensor's number of "
                             "dimensions, split along one of them")
        if any(t.shape[d] != shape[d] for d in range(len(shape)) if d != dim) or start < 0 \
                or start + t.shape[dim] > shape[dim]:
            raise UsageError(f"{printable(name)}: a slice of shape {tuple(t.shape)} at {start} along dimension "
                             f"{dim} does not fit the full shape {shape}")
        out.append((name, shape, dim, start, int(t.shape[dim]), str(t.dtype).removeprefix("torch.")))
    return out


def _tiling(every: list[list]):
    """({name: (owner, shape, dim, dtype, [(rank, start, length)])}, None),
    or ({}, why) when the slices of a name do not tile its full tensor."""
    by: dict[str, list] = {}
    for k, descs in enumerate(every):
        for name, shape, dim, start, n, dtype in descs:
            by.setdefault(name, []).append((k, shape, dim, start, n, dtype))
    owners = {}
    for name, ds in by.items():
        if len({(shape, dim, dtype) for _, shape, dim, _, _, dtype in ds}) != 1:
            return {}, f"{printable(name)}: the ranks' slices disagree on its full shape, dimension or dtype"
        _, shape, dim, _, _, dtype = ds[0]
        at = 0
        for _k, _, _, start, n, _ in sorted(ds, key=lambda d: d[3]):
            if start != at:
                return {}, f"{printable(name)}: its slices do not cover it exactly (one starts at {start}, not {at})"
            at += n
        if at != shape[dim]:
            return {}, f"{printable(name)}: its slices cover {at} of its {shape[dim]} along dimension {dim}"
        owners[name] = (min(k for k, *_ in ds), shape, dim, dtype, sorted((k, st, n) for k, _, _, st, n, _ in ds))
    return owners, None


def _say(e: BaseException) -> str:
    return f"{type(e).__name__}: {getattr(e, 'message', None) or e}"


class _Named:
    """A tensor of another rank, as the shard index sees it (name, size)."""

    def __init__(self, name: str, nbytes: int) -> None:
        self.name, self.nbytes = name, nbytes


__all__ = ["PART", "RankPublisher", "Slice", "shard_name"]
