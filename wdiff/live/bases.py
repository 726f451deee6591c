"""What a bundle is applied over in the live API: live tensors
(:class:`LiveBase`, matched by name) or a checkpoint directory
(:class:`DirBase`, the mirror), and the target headers parsed once per
process (:func:`header`)."""

from __future__ import annotations

import copy

import numpy as np
import xxhash

from ..errors import BaseMismatchError, IntegrityError
from ..paths import printable
from ..store.blockio import FdCache, read_base
from ..store.checkpoint import KIND_TENSORS, Checkpoint, scan, scope_of
from ..store.header import Header, TensorInfo, parse_header
from ..store.units import Unit
from ._tensors import Live
from .layout import headers_like


class LiveBase:
    """Live tensors as the base of a bundle: each tensor of the target is
    patched from the live tensor of the same name, dtype and shape."""

    def __init__(self, lives: list[Live], layout: str | None = None, aliases: dict[str, str] | None = None) -> None:
        self.lives = lives
        self.layout = layout
        self.aliases = aliases or {}
        self.by_name = {t.name: (t, TensorInfo(t.name, t.dtype, t.shape, 0, t.nbytes, t.nbytes)) for t in lives}
        for a, k in self.aliases.items():  # a tied name patches the memory of the name kept
            t = self.by_name[k][0]
            self.by_name[a] = (t, TensorInfo(a, t.dtype, t.shape, 0, t.nbytes, t.nbytes))

    def _namings(self):
        """The tensors under each choice of name for tied memory: as kept
        (the first given), then each group by its smallest name, then by
        its largest (which name a publisher kept is its dict's order)."""
        yield self.lives
        if not self.aliases:
            return
        groups: dict[str, list[str]] = {}
        for a, k in self.aliases.items():
            groups.setdefault(k, [k]).append(a)
        for pick in (min, max):
            out = []
            for t in self.lives:
                if t.name in groups:
                    t = copy.copy(t)
                    t.name = pick(groups[t.name], key=lambda n: n.encode("utf-8", "surrogatepass"))
                out.append(t)
            yield out

    def base_tensors(self, path: str, scoped: bool) -> dict:
        return self.by_name

    def headers(self, index) -> dict[int, bytes]:
        """The headers the target takes from the base: from ``layout`` (a
        checkpoint of the base version, a Follower's own), or rebuilt from
        the tensors. Either way each is checked against the index's digest
        (:func:`_header`) and the tensors against each header (:class:`Cover`)."""
        if not any(f.kind == KIND_TENSORS and f.source == "base" for f in index.files):
            return {}
        try:
            return first(lambda lives: headers_like(index, lives), self._namings())
        except BaseMismatchError:
            if self.layout is None:
                raise
            out = DirBase(scan(self.layout)).headers(index, missing_ok=True)
            if any(i not in out for i, f in enumerate(index.files) if f.kind == KIND_TENSORS and f.source == "base"):
                raise
            return out

    def read(self, unit: Unit, buf: np.ndarray) -> None:
        pos = 0
        for s in unit.spans:
            n = s.hi - s.lo
            s.base.file.read(s.lo, s.hi, buf[pos : pos + n])
            pos += n


def first(fn, choices):
    """fn of the first choice it does not refuse (BaseMismatchError), or the
    first refusal."""
    err = None
    for c in choices:
        try:
            return fn(c)
        except BaseMismatchError as e:
            err = err or e
    raise err


class DirBase:
    """A checkpoint directory (the mirror) as the base."""

    def __init__(self, A: Checkpoint) -> None:
        self.A = A
        self.fds = FdCache()

    def base_tensors(self, path: str, scoped: bool) -> dict:
        return self.A.base_tensors_for(path, scoped)

    def headers(self, index, *, missing_ok: bool = False) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        for i, f in enumerate(index.files):
            if f.kind == KIND_TENSORS and f.source == "base":
                old = self.A.file(f.path)
                if old is None or old.header is None:
                    if missing_ok:
                        continue
                    raise BaseMismatchError(f"{self.A.root}: lacks {printable(f.path)}, which the bundle's base has")
                out[i] = old.header.raw
        return out

    def read(self, unit: Unit, buf: np.ndarray) -> None:
        read_base(self.fds, unit, buf)


#: parsed headers by (digest, file size, scope): a follower applies bundles
#: of one model every step, and a header of 20,000 tensors takes 0.3 s to
#: parse. The key is the digest of the raw bytes, so a hit is those bytes.
HEADERS: dict[tuple, Header] = {}
HEADERS_MAX = 16


def header(raw: bytes | None, f, where: str) -> Header:
    key = (f.header_digest, f.size, scope_of(f.path))
    hit = HEADERS.get(key)
    if hit is not None:
        return hit
    if raw is None:
        raise IntegrityError(f"{where}: no header for {printable(f.path)}")
    if xxhash.xxh3_128_digest(raw) != f.header_digest:
        raise IntegrityError(f"{where}: the header of {printable(f.path)} is not the one the index names")
    h = parse_header(raw, f.size, where=where).scoped(scope_of(f.path))
    if len(HEADERS) >= HEADERS_MAX:
        HEADERS.pop(next(iter(HEADERS)))
    HEADERS[key] = h
    return h


__all__ = ["HEADERS", "DirBase", "LiveBase", "first", "header"]
