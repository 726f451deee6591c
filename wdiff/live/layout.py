"""Where live tensors go in a checkpoint: the files ``save_pretrained``
writes (``model.safetensors``, or shards ``model-0000K-of-0000N.safetensors``
with ``model.safetensors.index.json``), the tensors of each file in the
order given, ``{"format": "pt"}`` as metadata. A pure function of the
tensors' names, dtypes, shapes and order, so that a receiver holding the
same tensors rebuilds the same headers (see :func:`headers_like`)."""

from __future__ import annotations

import json

import xxhash

from ..errors import BaseMismatchError
from ..ops.memsource import MemTensor, build_header
from ._tensors import Live

#: the shard size transformers 4.x writes by default ("5GB"; 5.x writes up to
#: "50GB" per file, above the Hub's recommended 20 GB): pass max_shard_size
#: to the Publisher to match another
MAX_SHARD = 5 * 10**9
METADATA = {"format": "pt"}
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def mem_tensors(lives: list[Live]) -> list[MemTensor]:
    return [MemTensor(t.name, t.dtype, t.shape, t.read) for t in lives]


def shard(lives: list[Live], max_shard: int = MAX_SHARD) -> list[tuple[str, list[Live]]]:
    """The tensor files and their tensors, as save_pretrained splits them."""
    groups: list[list[Live]] = [[]]
    size = 0
    for t in lives:
        if groups[-1] and size + t.nbytes > max_shard:
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += t.nbytes
    if len(groups) == 1:
        return [(SINGLE, groups[0])]
    n = len(groups)
    return [(f"model-{k + 1:05d}-of-{n:05d}.safetensors", g) for k, g in enumerate(groups)]


def index_json(files: list[tuple[str, list[Live]]]) -> bytes | None:
    """The shard index of a sharded layout (None for a single file)."""
    if len(files) == 1:
        return None
    wm = {t.name: path for path, ts in files for t in ts}
    doc = {"metadata": {"total_size": sum(t.nbytes for _, ts in files for t in ts)},
           "weight_map": dict(sorted(wm.items()))}
    return (json.dumps(doc, indent=2, sort_keys=False) + "\n").encode()


def headers_like(index, lives: list[Live]) -> dict[int, bytes]:
    """The raw header of every tensor file of a bundle's target (index file
    number -> bytes), rebuilt from the receiver's own tensors: split in the
    order given by each file's tensor count, each checked against the
    digest the index holds. Refuses (BaseMismatchError) tensors that do
    not give the target's headers."""
    out: dict[int, bytes] = {}
    pos = 0
    for i, f in enumerate(index.files):
        if f.kind != "safetensors":
            continue
        group = lives[pos : pos + len(f.tensor_digests)]
        pos += len(f.tensor_digests)
        raw = build_header(mem_tensors(group), METADATA)
        if len(raw) != f.header_size or xxhash.xxh3_128_digest(raw) != f.header_digest:
            raise BaseMismatchError(
                f"{f.path}: the tensors given do not have the names, dtypes, shapes and order of the bundle's "
                "target (their header differs)",
                hint="pass base=MIRROR_DIR (the checkpoint of the version the tensors hold), or the state dict "
                     "of the same model the publisher published",
            )
        out[i] = raw
    return out
