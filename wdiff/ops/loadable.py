"""Whether a checkpoint directory is one a loader (transformers,
safetensors) can open: what a push checks before it publishes a version
that every puller will receive."""

from __future__ import annotations

import json
import os

from ..errors import IntegrityError
from ..fsutil import read_bounded
from ..paths import printable
from ..store.checkpoint import KIND_TENSORS, Checkpoint

INDEX_SUFFIX = ".safetensors.index.json"
MAX_INDEX = 64 * 1024 * 1024


def problems(ckpt: Checkpoint) -> list[str]:
    """What would stop a loader: a *.safetensors file that does not parse
    (wdiff would carry it as opaque bytes), and a sharded index whose
    weight_map names a file or a tensor the directory lacks, or misses a
    tensor a shard holds."""
    out = [f"{printable(f.path)}: not a loadable safetensors file ({f.note})" for f in ckpt.files if f.note]
    tensors = ckpt.tensors
    for f in ckpt.files:
        if not f.path.endswith(INDEX_SUFFIX):
            continue
        where = printable(f.path)
        try:
            doc = json.loads(read_bounded(f.abspath, MAX_INDEX, what=where))
        except (OSError, ValueError, IntegrityError) as e:
            out.append(f"{where}: not a readable index ({e})")
            continue
        wmap = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wmap, dict):
            out.append(f"{where}: has no weight_map")
            continue
        folder = os.path.dirname(f.path)
        shards = set()
        for name, shard in wmap.items():
            rel = f"{folder}/{shard}" if folder and isinstance(shard, str) else shard
            entry = ckpt.file(rel) if isinstance(rel, str) else None
            if entry is None:
                out.append(f"{where}: weight_map names {printable(str(shard))}, which is missing")
                continue
            if entry.kind != KIND_TENSORS:
                continue  # reported above as not loadable
            shards.add(rel)
            held = tensors.get(name)
            if held is None or held[0].path != rel:
                out.append(f"{where}: weight_map puts tensor {printable(name)} in {printable(shard)}, which lacks it")
        for name, (entry, _info) in tensors.items():
            if entry.path in shards and name not in wmap:
                out.append(f"{where}: {printable(entry.path)} holds tensor {printable(name)}, which weight_map omits")
    return out
