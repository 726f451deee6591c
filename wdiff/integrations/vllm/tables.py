"""What a version of a checkpoint holds, tensor by tensor (:class:`Table`),
and which tensors an update hands a model (:func:`plan`). No torch, no vLLM."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import BaseMismatchError, IntegrityError, UsageError
from ...paths import printable
from ...store import manifest
from ...store.checkpoint import KIND_TENSORS, Checkpoint, scan
from ...store.hashing import Manifest, short, tree


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
