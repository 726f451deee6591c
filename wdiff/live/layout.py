"""Where live tensors go in a checkpoint: the files ``save_pretrained``
writes (``model.safetensors``, or shards ``model-0000K-of-0000N.safetensors``
with ``model.safetensors.index.json``), the tensors of each file in the
order of their names (:func:`canonical`), ``{"format": "pt"}`` as
metadata. A pure function of the tensors' names, dtypes and shapes, never
of the order a dict holds them in, so that a receiver holding the same
tensors in any order rebuilds the same headers (see :func:`headers_like`)."""

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


def canonical(lives: list[Live]) -> list[Live]:
    """The tensors in the order a publisher lays them out: by name (as
    UTF-8 bytes), whatever order they were given in, so that a receiver
    holding the same tensors in any order (a ``state_dict``,
    ``safetensors.torch.load_file``, a dict built by hand) rebuilds the
    same files."""
    return sorted(lives, key=lambda t: t.name.encode("utf-8", "surrogatepass"))


#: the order the safetensors library (0.4 on) writes a file's tensors in:
#: by dtype, in this order, then by name (``save_file``, ``save_pretrained``)
_SAFETENSORS_DTYPES = ("U64", "I64", "F64", "C64", "F32", "U32", "I32", "BF16", "F16", "U16", "I16", "F8_E4M3",
                       "F8_E5M2", "I8", "U8", "BOOL")


def _safetensors_order(lives: list[Live]) -> list[Live]:
    rank = {d: k for k, d in enumerate(_SAFETENSORS_DTYPES)}
    return sorted(lives, key=lambda t: (rank.get(t.dtype, len(rank)), t.name.encode("utf-8", "surrogatepass")))


def headers_like(index, lives: list[Live]) -> dict[int, bytes]:
    """The raw header of every tensor file the bundle's target takes from
    its base (index file number -> bytes), rebuilt from the receiver's own
    tensors and checked against the digest the index holds. The header
    fixes the order of the tensors in the file, which a receiver's dict
    need not share: these layouts are tried, each split across the tensor
    files by their tensor counts: the publisher's (by name, see
    :func:`canonical`), the order given (a publisher before name order, or
    a multi-rank publisher: rank by rank), and the safetensors library's
    (by dtype, then name: a checkpoint ``save_pretrained`` wrote as one
    file), each with the publisher's metadata or none; the digest decides,
    never the order. Refuses (BaseMismatchError) tensors that give none."""
    tensor_files = [(i, f) for i, f in enumerate(index.files) if f.kind == "safetensors"]
    wanted = [(i, f) for i, f in tensor_files if f.source == "base"]
    if not wanted:
        return {}
    out: dict[int, bytes] = {}
    same = list
    # (the order split across the files, the order inside each file, metadata)
    for split, inside, metadata in ((canonical, same, METADATA), (same, same, METADATA),
                                    (canonical, _safetensors_order, METADATA), (canonical, _safetensors_order, None),
                                    (canonical, same, None), (same, same, None)):
        groups, pos, order = {}, 0, split(lives)
        for i, f in tensor_files:
            groups[i] = order[pos : pos + len(f.tensor_digests)]
            pos += len(f.tensor_digests)
        for i, f in wanted:
            if i in out:
                continue
            raw = build_header(mem_tensors(inside(groups[i])), metadata)
            if len(raw) == f.header_size and xxhash.xxh3_128_digest(raw) == f.header_digest:
                out[i] = raw
        if len(out) == len(wanted):
            return out
    f = next(f for i, f in wanted if i not in out)
    raise BaseMismatchError(
        f"{f.path}: the tensors given are not those of the bundle's base (names, dtypes and shapes; "
        "their header is not the one the bundle names)",
        hint="give the tensors of the version the bundle starts from (any order), or iter_patches(base=MIRROR_DIR) "
             "with the checkpoint of that version",
    )
