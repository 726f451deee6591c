"""What makes an apply into live tensors give a version (:class:`Cover`):
the bundle's target holds exactly the tensors given."""

from __future__ import annotations

from ..errors import BaseMismatchError, FormatError
from ..paths import printable
from ..store.checkpoint import KIND_TENSORS
from ..store.hashing import hexd
from ..store.header import Header
from ._tensors import Live


class Cover:
    """The rule that makes an apply into live tensors give a version: the
    bundle's target holds exactly the tensors given (each name once, with
    its dtype and shape, none missing, none extra; tied aliases count as
    the tensor they share memory with). Checked file by file as each target
    header is known, and as a whole once every header is."""

    def __init__(self, lives: list[Live], index, where: str) -> None:
        self.want = {t.name: t for t in lives}
        self.seen: set[str] = set()
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
            live = self.want.get(t.name)
            if live is None:
                self._refuse(f"its target holds tensor {printable(t.name)}, which is not among the tensors given")
            if live.dtype != t.dtype or live.shape != t.shape:
                self._refuse(f"tensor {printable(t.name)} is {t.dtype} {list(t.shape)} in its target, "
                             f"{live.dtype} {list(live.shape)} among the tensors given")
            if t.name in self.seen:
                raise FormatError(f"{self.where}: its target holds tensor {printable(t.name)} twice")
            self.seen.add(t.name)

    def done(self) -> None:
        extra = [n for n in self.want if n not in self.seen]
        if extra:
            more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
            self._refuse(f"tensor {printable(extra[0])}{more} is not in its target")


__all__ = ["Cover"]
