"""The manifest cache: block digests of files already hashed, kept as a
*hint* of which version a directory holds.

What it trusts, and what it may decide: an entry is looked up by the file's
stat (path, device, inode, size, modification and change times) and a probe
of its first and last 64 KiB. That cannot see every change: a second write
through a shared mmap to a page that is already dirty changes none of them,
and this kernel exposes no change cookie to userspace (``statx`` does not
report ``STATX_CHANGE_COOKIE``; ``i_version`` is internal). So a hit is a
guess, and no decision that can change an output rests on it: diff, pack,
apply (both modes), squash, verify and status read and hash every byte they
judge. ``pull`` alone uses a hit, to choose which bundles to fetch; the apply
that follows reads and checks the whole base, a pull that finds the
directory at the wanted version confirms that by reading, and a wrong guess
costs a refusal and a second plan, never a wrong result.

One cache entry per file, under ``$WDIFF_CACHE_DIR`` (default
``$XDG_CACHE_HOME/wdiff`` or ``~/.cache/wdiff``; ``none`` turns the cache
off). An entry is keyed by the file's real path, device, inode, size,
modification and change times (nanoseconds), and it also records a digest of
the file's first and last 64 KiB, read again on every lookup; a tensor file's
entry records its header digest and tensor list. Any mismatch, or a damaged
entry, is a miss. Entries are written atomically and can be deleted at any
time; the oldest are pruned past a limit.
"""

from __future__ import annotations

import json
import os

import xxhash

from .checkpoint import KIND_TENSORS, Checkpoint, FileEntry
from .digests import Digests
from .hashing import n_blocks

ENV = "WDIFF_CACHE_DIR"
MAGIC = b"WDIFF-MANIFEST-CACHE 2\n"
PROBE = 64 * 1024
MAX_ENTRIES = 20_000


def cache_dir() -> str | None:
    env = os.environ.get(ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "none", "off", "0") else env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "wdiff")


def _key(entry: FileEntry) -> dict:
    return {"path": os.path.realpath(entry.abspath), "stat": list(entry.stat_key)}


def _name(key: dict) -> str:
    return xxhash.xxh3_128_hexdigest(json.dumps(key, sort_keys=True).encode()) + ".mc"


def _probe(path: str, size: int) -> str:
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        h.update(f.read(PROBE))
        if size > PROBE:
            f.seek(max(PROBE, size - PROBE))
            h.update(f.read(PROBE))
    return h.hexdigest()


def _shape(entry: FileEntry) -> list:
    # the header's digest covers every tensor's name and extent
    if entry.kind == KIND_TENSORS:
        return [xxhash.xxh3_128_hexdigest(entry.header.raw), len(entry.header.tensors)]
    return [None, entry.size]


def lookup(entry: FileEntry) -> list[bytes] | None:
    """The block digests of ``entry`` (one bytes per tensor in data order, or
    one for a companion file), or None when the cache cannot vouch for them."""
    root = cache_dir()
    if root is None:
        return None
    key = _key(entry)
    try:
        with open(os.path.join(root, _name(key)), "rb") as f:
            data = f.read()
        if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 16:
            return None
        body, digest = data[:-16], data[-16:]
        if xxhash.xxh3_128_digest(body) != digest:
            return None
        nl = body.index(b"\n", len(MAGIC))
        meta = json.loads(body[len(MAGIC) : nl])
        blob = body[nl + 1 :]
        if meta.get("key") != key or meta.get("shape") != _shape(entry):
            return None
        if meta.get("probe") != _probe(entry.abspath, entry.size):
            return None
        out, pos = [], 0
        for n in meta["blocks"]:
            out.append(blob[pos : pos + 16 * n])
            pos += 16 * n
        if pos != len(blob):
            return None
        return out
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(entry: FileEntry, blocks: list[bytes], *, prune: bool = True) -> bool:
    """Remember ``entry``'s block digests. Failures are ignored: a cache.
    Returns whether the cache holds one entry more (not one replaced): only
    then can it have passed its limit. ``prune=False`` leaves pruning to the
    caller, which stores many entries and prunes once (listing the cache per
    entry is quadratic)."""
    root = cache_dir()
    if root is None:
        return False
    key = _key(entry)
    try:
        os.makedirs(root, exist_ok=True)
        meta = {"key": key, "shape": _shape(entry), "probe": _probe(entry.abspath, entry.size),
                "blocks": [len(b) // 16 for b in blocks]}
        body = MAGIC + json.dumps(meta, sort_keys=True).encode() + b"\n" + b"".join(blocks)
        path = os.path.join(root, _name(key))
        added = not os.path.exists(path)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(body + xxhash.xxh3_128_digest(body))
        os.replace(tmp, path)
    except OSError:
        return False
    if prune and added:
        _prune(root)
    return added


def prune() -> None:
    """Keep the cache within MAX_ENTRIES (one listing of the directory)."""
    root = cache_dir()
    if root is not None:
        _prune(root)


def _prune(root: str) -> None:
    try:
        names = [n for n in os.listdir(root) if n.endswith(".mc")]
        if len(names) <= MAX_ENTRIES:
            return
        paths = sorted((os.path.join(root, n) for n in names), key=lambda p: os.stat(p).st_mtime)
        for p in paths[: len(paths) - MAX_ENTRIES * 9 // 10]:
            os.unlink(p)
    except OSError:
        pass


# -- what the data passes ask of the cache ---------------------------------------


def fill(ckpt: Checkpoint, digests: Digests) -> set[str]:
    """Fill ``digests`` from the manifest cache for files it lacks entirely;
    returns the paths served from the cache."""
    served = set()
    for f in ckpt.files:
        if f.kind == KIND_TENSORS:
            if any(digests.has_tensor(t.name) for t in f.header.tensors if t.nbytes):
                continue
        elif f.path in digests.files:
            continue
        hit = lookup(f)
        if hit is None:
            continue
        if f.kind == KIND_TENSORS:
            for t, b in zip(f.header.tensors, hit):
                digests.tensors[t.name] = b
        else:
            digests.files[f.path] = hit[0]
        served.add(f.path)
    return served


def remember(ckpt: Checkpoint, digests: Digests, *, skip: set[str] = frozenset()) -> None:
    """Store in the manifest cache every file of ``ckpt`` that ``digests``
    covers completely (what a data pass or a hash pass just read); the
    cache is pruned once, at the end, if it grew. (A diff or pack of files
    seen before replaces their entries: no listing of a cache of thousands
    of entries, twice a command.)"""
    added = False
    for f in ckpt.files:
        if f.path in skip:
            continue
        if f.kind == KIND_TENSORS:
            blocks = [digests.tensors.get(t.name) for t in f.header.tensors]
            if any(b is None or len(b) != 16 * n_blocks(t.nbytes) for b, t in zip(blocks, f.header.tensors)):
                continue
            added |= store(f, [bytes(b) for b in blocks], prune=False)
        elif f.path in digests.files:
            added |= store(f, [digests.files[f.path]], prune=False)
    if added:
        prune()
