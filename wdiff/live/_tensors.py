"""Live tensors as raw bytes: torch tensors (CPU or CUDA) and numpy arrays
seen as flat runs of bytes and words, read and patched without any float
conversion (a bf16 tensor is 16-bit words, nothing else). torch is
imported only when a torch tensor is given."""

from __future__ import annotations

import sys

import numpy as np

from ..codec.dtypes import uint_type
from ..errors import UsageError
from ..paths import printable

_NUMPY = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}
_TORCH = {
    "torch.float64": "F64", "torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16",
    "torch.int64": "I64", "torch.int32": "I32", "torch.int16": "I16", "torch.int8": "I8",
    "torch.uint64": "U64", "torch.uint32": "U32", "torch.uint16": "U16", "torch.uint8": "U8", "torch.bool": "BOOL",
    "torch.float8_e4m3fn": "F8_E4M3", "torch.float8_e5m2": "F8_E5M2", "torch.complex64": "C64",
}
_SIGNED = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}
_NP_BY_DTYPE = {np.dtype(k): v for k, v in _NUMPY.items() if hasattr(np, k)}
_TORCH_BY_DTYPE: dict = {}


def _torch_dtype(dt) -> str | None:
    hit = _TORCH_BY_DTYPE.get(dt)
    if hit is None:
        hit = _TORCH_BY_DTYPE[dt] = _TORCH.get(str(dt))
    return hit


def is_torch(x) -> bool:
    return type(x).__module__.startswith("torch") and "torch" in sys.modules


class Live:
    """One tensor: its safetensors dtype, shape and byte size, and byte-level
    reads and writes. CPU memory is reached through a numpy view (no copy);
    a CUDA tensor through torch ops on its device, a chunk at a time."""

    __slots__ = ("name", "obj", "dtype", "shape", "nbytes", "word", "u8", "device", "contiguous")

    def __init__(self, name: str, obj) -> None:
        self.name, self.obj = name, obj
        if is_torch(obj):
            dt = _torch_dtype(obj.dtype)
            if dt is None:
                raise UsageError(f"tensor {printable(name)}: dtype {obj.dtype} has no safetensors name")
            if obj.device.type == "meta":
                raise UsageError(f"tensor {printable(name)} is on the meta device: it has no memory to patch "
                                 "(nothing was written)", hint="load the model's weights first, then apply")
            self.shape = tuple(int(d) for d in obj.shape)
            self.word = obj.element_size()
            self.nbytes = obj.numel() * self.word
            self.contiguous = obj.is_contiguous()
            self.device = None if obj.device.type == "cpu" else obj.device
            self.u8 = None
            if self.contiguous and self.nbytes:
                import torch

                # two tensor objects, not three: at 20,000 tensors each costs
                t = obj.detach()
                if t.dim() == 0:
                    t = t.reshape(1)
                if self.device is None:
                    self.u8 = t.view(torch.uint8).numpy().reshape(-1)
                else:
                    self.u8 = t.view(torch.uint8).reshape(-1)
        elif isinstance(obj, np.ndarray):
            dt = _NP_BY_DTYPE.get(obj.dtype) or _NUMPY.get(obj.dtype.name)
            if dt is None:
                raise UsageError(f"tensor {printable(name)}: dtype {obj.dtype} has no safetensors name")
            if obj.dtype.byteorder == ">" or (obj.dtype.byteorder == "=" and sys.byteorder == "big"):
                # its name is the dtype's, its bytes are not: patched byte for byte it would hold other numbers
                raise UsageError(f"tensor {printable(name)}: dtype {obj.dtype.str} is big-endian, and a bundle's "
                                 "bytes are in safetensors' byte order (little-endian); nothing was written",
                                 hint="give the array in little-endian order: a.astype(a.dtype.newbyteorder('<'))")
            self.shape = tuple(int(d) for d in obj.shape)
            self.word = obj.dtype.itemsize
            self.nbytes = obj.nbytes
            self.contiguous = obj.flags.c_contiguous
            self.device = None
            self.u8 = obj.reshape(-1).view(np.uint8) if self.contiguous and self.nbytes else None
        else:
            raise UsageError(f"tensor {printable(name)}: a {type(obj).__name__}, not a torch tensor or numpy array")
        self.dtype = dt

    def key(self):
        """What identifies the memory (aliases: tied weights share it)."""
        if is_torch(self.obj):
            if self.nbytes == 0:
                return None
            return (str(self.obj.device), self.obj.data_ptr(), self.nbytes, self.dtype, self.shape,
                    tuple(self.obj.stride()))
        if self.nbytes == 0:
            return None
        return (self.obj.__array_interface__["data"][0], self.nbytes, self.dtype, self.shape, self.obj.strides)

    def span(self):
        """(device, first byte, one past the last byte) of the memory the
        tensor's elements lie in; None for an empty tensor."""
        if self.nbytes == 0:
            return None
        if is_torch(self.obj):
            where, ptr = str(self.obj.device), self.obj.data_ptr()
            steps = [st * self.word for st in self.obj.stride()]
        else:
            where, ptr, steps = "cpu", self.obj.__array_interface__["data"][0], list(self.obj.strides)
        reach = [(d - 1) * st for d, st in zip(self.shape, steps)]
        return (where, ptr + sum(r for r in reach if r < 0), ptr + sum(r for r in reach if r > 0) + self.word)

    def read(self, lo: int, hi: int, out: np.ndarray) -> None:
        """Copy bytes [lo, hi) of the tensor's data (row-major) into ``out``."""
        if hi <= lo:
            return
        if self.u8 is None:  # not contiguous: a contiguous copy of this tensor alone
            src = self.obj.detach().contiguous() if is_torch(self.obj) else np.ascontiguousarray(self.obj)
            tmp = Live(self.name, src)
            tmp.read(lo, hi, out)
            return
        if self.device is None:
            out[:] = self.u8[lo:hi]
        else:
            import torch

            torch.from_numpy(out).copy_(self.u8[lo:hi])

    def writable(self) -> None:
        if self.u8 is None and self.nbytes:
            raise UsageError(f"tensor {printable(self.name)} is not contiguous; it cannot be patched in place")
        if self.device is None and self.nbytes and not self.u8.flags.writeable:
            raise UsageError(f"tensor {printable(self.name)} is read-only")

    def scatter(self, at_word: int, positions: np.ndarray, values: np.ndarray) -> None:
        """Set the words at ``at_word + positions`` (word indices) to ``values``
        (unsigned words of the tensor's word size): one call per tensor."""
        if positions.size == 0:
            return
        if self.device is None:
            words = self.u8.view(uint_type(self.word))
            if at_word:
                words = words[at_word:]
            words[positions] = values
            return
        import torch

        signed = getattr(torch, _SIGNED[self.word])
        words = self.u8.view(signed)
        idx = torch.from_numpy(positions.astype(np.int64, copy=False)).to(self.device, non_blocking=False)
        if at_word:
            idx += at_word
        vals = torch.from_numpy(np.ascontiguousarray(values).view(_SIGNED[self.word])).to(self.device)
        words.index_copy_(0, idx, vals)

    def to_device(self, positions: np.ndarray, values: np.ndarray):
        """Word positions (int64) and values as tensors on this tensor's device."""
        import torch

        idx = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64)).to(self.device)
        vals = torch.from_numpy(np.ascontiguousarray(values).view(_SIGNED[self.word])).to(self.device)
        return idx, vals

    def scatter_device(self, idx, vals) -> None:
        """Set words ``idx`` (a device tensor of word indices) to ``vals``."""
        import torch

        self.u8.view(getattr(torch, _SIGNED[self.word])).index_copy_(0, idx, vals)

    def write(self, lo: int, src: np.ndarray) -> None:
        """Overwrite bytes [lo, lo + len(src)) with ``src``."""
        if src.size == 0:
            return
        if self.device is None:
            self.u8[lo : lo + src.size] = src
            return
        import torch

        self.u8[lo : lo + src.size].copy_(torch.from_numpy(np.ascontiguousarray(src)).to(self.device))

    def sync(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)


def live_tensors(tensors) -> list[Live]:
    """A state dict, or an iterable of (name, tensor), as :class:`Live`
    tensors in the order given; a name given twice is refused."""
    items = tensors.items() if hasattr(tensors, "items") else tensors
    out, seen = [], set()
    for name, obj in items:
        if not isinstance(name, str):
            raise UsageError(f"tensor names are strings, not {type(name).__name__}")
        if name in seen:
            raise UsageError(f"tensor {printable(name)} is given twice")
        seen.add(name)
        out.append(Live(name, obj))
    return out


class Prepared:
    """Tensors wrapped once for many applies (:func:`wdiff.live.prepare`):
    at 20,000 tensors, building the byte views costs more than a sparse
    apply. Valid while the tensors keep their memory: a tensor given a new
    storage (``t.data = ...``) or a dict given another tensor or name is
    refused at the next apply (:meth:`check`), never patched in memory the
    model no longer uses."""

    def __init__(self, tensors) -> None:
        self.source = tensors
        every = live_tensors(tensors)
        self.lives, self.aliases = without_aliases(every)
        self._names = [t.name for t in every]
        self._marks = [(t.name, t.obj, _memory(t.obj)) for t in every]

    def check(self) -> None:
        """Refuse (UsageError) tensors that changed since they were wrapped."""
        src = self.source
        if hasattr(src, "items") and (len(src) != len(self._names) or list(src) != self._names):
            raise UsageError("the tensors' names changed since prepare(): prepare them again")
        for name, obj, mark in self._marks:
            if (hasattr(src, "items") and src[name] is not obj) or _memory(obj) != mark:
                raise UsageError(f"tensor {printable(name)} is another tensor, or has other memory, than when it "
                                 "was prepared: prepare the tensors again")


def _memory(obj):
    """Where a tensor's bytes are: a torch tensor's storage can be swapped
    under the same object (``t.data = ...``); a numpy array's cannot."""
    if is_torch(obj):
        return obj.data_ptr(), obj.stride(), obj.dtype, obj.numel()  # with numel, stride fixes the shape
    return None


def prepared(tensors) -> list[Live]:
    """The live tensors, aliases left out, of a state dict or a Prepared."""
    if isinstance(tensors, Prepared):
        return tensors.lives
    return without_aliases(live_tensors(tensors))[0]


def prepared_aliased(tensors) -> tuple[list[Live], dict[str, str]]:
    """:func:`prepared`'s tensors, and alias -> the name kept."""
    if isinstance(tensors, Prepared):
        tensors.check()
        return tensors.lives, tensors.aliases
    return without_aliases(live_tensors(tensors))


def without_aliases(lives: list[Live]) -> tuple[list[Live], dict[str, str]]:
    """The tensors with every alias of an earlier one left out (tied
    weights: ``save_pretrained`` writes the memory once), and alias ->
    the name kept."""
    kept, aliases, first = [], {}, {}
    for t in lives:
        k = t.key()
        if k is not None and k in first:
            aliases[t.name] = first[k]
            continue
        if k is not None:
            first[k] = t.name
        kept.append(t)
    _no_overlap(kept)
    return kept, aliases


def _no_overlap(lives: list[Live]) -> None:
    """Refuse two names over overlapping memory that are not the same tensor
    (a reshaped view, an overlapping slice, the same bytes as another
    dtype): the bundle's target holds them as two tensors, and patching one
    would change the other, so the result would be no version at all."""
    spans = sorted((s, t.name) for t in lives if (s := t.span()) is not None)
    for (a, name_a), (b, name_b) in zip(spans, spans[1:]):
        if a[0] == b[0] and b[1] < a[2]:
            raise UsageError(f"tensors {printable(name_a)} and {printable(name_b)} share memory but are not the same "
                             "tensor (a view, a slice or another dtype of it); nothing was written",
                             hint="give each tensor of the model once, with its own memory (a tied weight as the "
                                  "same tensor under both names)")
