"""Units of work: block-aligned byte ranges of a tensor file's data region,
paired with the base tensors they are compared to or patched from.

A *unit* covers either whole consecutive tensors of one dtype (small tensors
are batched, so per-tensor overhead never dominates) or one block-aligned
piece of a single large tensor. Units are the grain of parallelism, of
memory, and of bundle CHUNK records. Pure: headers in, plans out.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from ..defaults import DEFAULT_CHUNK
from ..errors import FormatError
from ..paths import printable
from .hashing import BLOCK_SIZE
from .header import Header, TensorInfo

assert DEFAULT_CHUNK % BLOCK_SIZE == 0, "a unit is a whole number of digest blocks"


# BaseRef and Span are named tuples, not dataclasses: one of each is built
# per tensor in the planning loops of every command


class BaseRef(NamedTuple):
    """Where a target tensor's old bytes live: a file of the base and a tensor."""

    file: object  # checkpoint.FileEntry (or anything with .abspath and .header)
    tensor: TensorInfo


class Span(NamedTuple):
    index: int  # tensor position in its file (data order)
    tensor: TensorInfo
    lo: int  # byte range relative to the tensor's first byte
    hi: int
    base: BaseRef | None

    @property
    def nbytes(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True, slots=True)
class Unit:
    spans: tuple[Span, ...]
    word: int

    @property
    def lo(self) -> int:
        s = self.spans[0]
        return s.tensor.start + s.lo

    @property
    def hi(self) -> int:
        s = self.spans[-1]
        return s.tensor.start + s.hi

    @property
    def nbytes(self) -> int:
        return self.hi - self.lo

    @property
    def delta(self) -> bool:
        return self.spans[0].base is not None


def base_source(t: TensorInfo, base_tensors: dict) -> BaseRef | None:
    """The base tensor a target tensor is patched from: same name, dtype and
    shape. Anything else is shipped whole."""
    hit = base_tensors.get(t.name)
    if hit is None:
        return None
    entry, bt = hit
    if bt.dtype != t.dtype or bt.shape != t.shape or bt.nbytes != t.nbytes:
        return None
    return BaseRef(entry, bt)


def pack_units(header: Header, base_tensors: dict, chunk: int = DEFAULT_CHUNK) -> Iterator[Unit]:
    """Cut a target tensor file into units, in data order."""
    assert chunk % BLOCK_SIZE == 0 and chunk > 0
    batch: list[Span] = []
    batch_bytes = 0
    for i, t in enumerate(header.tensors):
        if t.nbytes == 0:
            continue
        src = base_source(t, base_tensors)
        if t.nbytes > chunk:
            if batch:
                yield Unit(tuple(batch), batch[0].tensor.word)
                batch, batch_bytes = [], 0
            for lo in range(0, t.nbytes, chunk):
                yield Unit((Span(i, t, lo, min(lo + chunk, t.nbytes), src),), t.word)
            continue
        if batch and (
            batch_bytes + t.nbytes > chunk
            or batch[0].tensor.dtype != t.dtype
            or (batch[0].base is None) != (src is None)
        ):
            yield Unit(tuple(batch), batch[0].tensor.word)
            batch, batch_bytes = [], 0
        batch.append(Span(i, t, 0, t.nbytes, src))
        batch_bytes += t.nbytes
    if batch:
        yield Unit(tuple(batch), batch[0].tensor.word)


class FileLayout:
    """Lookups in a target tensor file's header by data offset."""

    def __init__(self, header: Header, base_tensors: dict) -> None:
        self.header = header
        self.tensors = header.tensors
        self.starts = [t.start for t in self.tensors]
        self.sources = [base_source(t, base_tensors) for t in self.tensors]

    def spans(self, lo: int, hi: int) -> list[Span]:
        """Spans of the non-empty tensors that intersect [lo, hi)."""
        out = []
        i = bisect.bisect_right(self.starts, lo) - 1
        i = max(i, 0)
        while i < len(self.tensors) and self.tensors[i].start < hi:
            t = self.tensors[i]
            if t.nbytes and t.end > lo:
                out.append(Span(i, t, max(lo, t.start) - t.start, min(hi, t.end) - t.start, self.sources[i]))
            i += 1
        return out

    def record_unit(self, lo: int, hi: int, word: int, *, delta: bool, where: str) -> Unit:
        """The unit a CHUNK record covers, after checking the format's rules:
        whole tensors, or a block-aligned piece of one tensor; one word size;
        for delta codecs, a base source for every tensor."""
        spans = self.spans(lo, hi)
        if not spans:
            raise FormatError(f"{where}: chunk covers no tensor data")
        if len(spans) == 1:
            s = spans[0]
            if s.lo % BLOCK_SIZE or (s.hi != s.tensor.nbytes and s.hi % BLOCK_SIZE):
                raise FormatError(f"{where}: chunk is not aligned to blocks of {printable(s.tensor.name)}")
        elif spans[0].lo != 0 or spans[-1].hi != spans[-1].tensor.nbytes:
            raise FormatError(f"{where}: chunk splits a tensor")
        for s in spans:
            if s.tensor.word != word:
                raise FormatError(f"{where}: chunk word size does not match {printable(s.tensor.name)}")
            if delta and s.base is None:
                raise FormatError(f"{where}: delta for {printable(s.tensor.name)}, which has no base tensor")
        return Unit(tuple(spans), word)

    def check_gap(self, lo: int, hi: int, *, where: str) -> None:
        """Refuse bytes [lo, hi) that no record covers unless every tensor
        there has a base source to copy them from: a check of the headers
        alone, made before anything is allocated or written."""
        for s in self.spans(lo, hi):
            if s.base is None:
                raise FormatError(f"{where}: the bundle has no data for tensor {printable(s.tensor.name)}")

    def gap_units(self, lo: int, hi: int, chunk: int, *, where: str) -> Iterator[Unit]:
        """Copy units for bytes no record covers: base bytes, unchanged.
        Small tensors are batched like :func:`pack_units` does."""
        batch: list[Span] = []
        batch_bytes = 0
        for s in self.spans(lo, hi):
            if s.base is None:
                raise FormatError(f"{where}: the bundle has no data for tensor {printable(s.tensor.name)}")
            if batch and batch_bytes + s.nbytes > chunk:
                yield Unit(tuple(batch), 1)
                batch, batch_bytes = [], 0
            if s.nbytes > chunk:
                for a in range(s.lo, s.hi, chunk):
                    yield Unit((Span(s.index, s.tensor, a, min(a + chunk, s.hi), s.base),), 1)
                continue
            batch.append(s)
            batch_bytes += s.nbytes
        if batch:
            yield Unit(tuple(batch), 1)
