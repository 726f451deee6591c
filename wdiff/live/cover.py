"""What makes an apply into live tensors give a version: the bundle's
target holds exactly the tensors given (:class:`Cover`), and, where the
caller does not say which version the tensors hold, they hold the bundle's
base, every byte (:func:`verify_base`)."""

from __future__ import annotations

import numpy as np

from ..errors import BaseMismatchError, FormatError, UsageError
from ..parallel import ordered_map
from ..paths import printable
from ..store.checkpoint import KIND_TENSORS
from ..store.hashing import BLOCK_SIZE, block_digests, hexd, tensor_file_digest, tree
from ..store.header import Header
from ._tensors import Live

#: bytes of a device tensor brought to the host at a time to be hashed
PIECE = 64 * BLOCK_SIZE


class Cover:
    """The rule that makes an apply into live tensors give a version: the
    bundle's target holds exactly the tensors given (each name once, with
    its dtype and shape, none missing, none extra; tied aliases count as
    the tensor they share memory with). Checked file by file as each target
    header is known, and as a whole once every header is."""

    def __init__(self, lives: list[Live], index, where: str, aliases: dict[str, str] | None = None) -> None:
        self.want = {t.name: t for t in lives}
        self.aliases = aliases or {}  # a tied name: the target may hold either name of the memory, once
        self.seen: set[str] = set()
        self.seen_names: set[str] = set()
        self.where = where
        n = sum(len(f.tensor_digests) for f in index.files if f.kind == KIND_TENSORS)
        if n != len(self.want):
            self._refuse(f"the bundle's target (version {hexd(index.target_fingerprint)[:12]}) holds {n} tensors, "
                         f"and {len(self.want)} are given")

    def _refuse(self, what: str):
        raise BaseMismatchError(
            f"{self.where}: {what}; a bundle applies into live tensors only when its target holds exactly "
            "their names, dtypes and shapes (nothing was written)",
            hint="give every tensor of the model (a state dict, any order) and the bundle of that model; to load "
                 "a new model or layout, apply onto a checkpoint (wdiff pull) and load it",
        )

    def file(self, header: Header) -> None:
        for t in header.tensors:
            name = self.aliases.get(t.name, t.name)
            live = self.want.get(name)
            if live is None:
                self._refuse(f"its target holds tensor {printable(t.name)}, which is not among the tensors given")
            if live.dtype != t.dtype or live.shape != t.shape:
                self._refuse(f"tensor {printable(t.name)} is {t.dtype} {list(t.shape)} in its target, "
                             f"{live.dtype} {list(live.shape)} among the tensors given")
            if name in self.seen:
                if t.name in self.seen_names:
                    raise FormatError(f"{self.where}: its target holds tensor {printable(t.name)} twice")
                self._refuse(f"its target holds {printable(t.name)} and the tensor it is tied to as two tensors")
            self.seen.add(name)
            self.seen_names.add(t.name)

    def done(self) -> None:
        extra = [n for n in self.want if n not in self.seen]
        if extra:
            more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
            self._refuse(f"tensor {printable(extra[0])}{more} is not in its target")



def tensor_digest(live: Live) -> bytes:
    """The digest of a tensor's bytes (as a bundle's index names it): hashed
    in place on the CPU, a piece at a time through host memory on a device."""
    if live.device is None and live.u8 is not None:
        return tree(block_digests(live.u8))
    out = []
    buf = np.empty(min(PIECE, live.nbytes), dtype=np.uint8)
    for lo in range(0, live.nbytes, PIECE):
        hi = min(lo + PIECE, live.nbytes)
        live.read(lo, hi, buf[: hi - lo])
        out.append(block_digests(buf[: hi - lo]))
    return tree(b"".join(out))


def verify_base(index, headers: dict[int, Header], lives: list[Live], where: str, threads: int,
                aliases: dict[str, str] | None = None) -> None:
    """Check that ``lives`` hold the bundle's base, every byte: each of the
    base's tensor files, its header (``headers``: target file number ->
    header, for the files the target takes unchanged from the base) and
    every tensor hashed from the live tensors, must have the digest the
    base's listing gives. The base's companion files are not the tensors'
    and are not checked. Refuses a delta that changes a tensor file's
    header (its base header is not in the bundle)."""
    by_name = {t.name: t for t in lives}
    for a, k in (aliases or {}).items():
        by_name[a] = by_name[k]
    targets = {f.path: i for i, f in enumerate(index.files) if f.kind == KIND_TENSORS}
    for row in index.base_files:
        if row.kind != KIND_TENSORS:
            continue
        i = targets.get(row.path)
        if i is None or index.files[i].source != "base" or i not in headers:
            raise UsageError(f"{where}: changes the layout of {printable(row.path)}, so whether the tensors hold its "
                             "base cannot be checked from them", hint="give base_version= (the version the tensors hold)")
        missing = [t.name for t in headers[i].tensors if t.name not in by_name]
        if missing:
            raise BaseMismatchError(f"{where}: its base holds tensor {printable(missing[0])}, which is not among the "
                                    "tensors given (nothing was written)")
        tds = list(ordered_map(lambda t: tensor_digest(by_name[t.name]), headers[i].tensors, threads=threads))
        if tensor_file_digest(index.files[i].header_digest, tds) != row.digest:
            raise BaseMismatchError(
                f"{where}: the tensors do not hold its base version {hexd(index.base_fingerprint)[:12]} "
                f"(the bytes of {printable(row.path)} differ; nothing was written)",
                hint="apply the bundles in order from the version the tensors hold, or an anchor",
            )


__all__ = ["Cover", "tensor_digest", "verify_base"]
