"""Parse and validate safetensors headers. Pure: bytes in, objects out.

A safetensors file is ``u64 little-endian N``, then ``N`` bytes of JSON (the
header), then the data region. wdiff accepts a file as a *tensor file* only if
its tensors cover the data region exactly, contiguously and without overlap
(the rule the safetensors library itself enforces on load), so that the file's
bytes are fully determined by its header and its tensors' bytes. Anything else
is handled as an opaque file.

Limits of our own protect against hostile headers: the JSON size and the
number of entries are capped before anything is parsed, and nesting deeper
than the JSON parser's recursion limit is refused by the parser itself.
"""

from __future__ import annotations

import json
import operator
import struct
import threading
from dataclasses import dataclass
from typing import NamedTuple

from ..codec.dtypes import dtype_info
from ..errors import FormatError

MAX_HEADER_BYTES = 64 * 1024 * 1024
MAX_TENSORS = 200_000
MAX_NDIM = 64
MAX_NAME_BYTES = 4096
_PREFIX = struct.Struct("<Q")


class HeaderError(FormatError):
    """A safetensors header that wdiff cannot use as a tensor file."""


class TensorInfo(NamedTuple):
    """One tensor of a header. A named tuple, not a dataclass: checkpoints
    hold hundreds of thousands of these, and they are built and read in the
    per-tensor loops of every command."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # byte offset inside the data region
    end: int
    nbytes: int  # end - start

    @property
    def word(self) -> int:
        return dtype_info(self.dtype).word


@dataclass(frozen=True, slots=True)
class Header:
    raw: bytes  # the complete header: 8-byte length prefix and JSON
    tensors: tuple[TensorInfo, ...]  # in data order (start, end, name)
    metadata: dict[str, str] | None

    @property
    def data_start(self) -> int:
        return len(self.raw)

    def scoped(self, scope: str) -> Header:
        """The same header with every tensor named by its qualified name,
        ``scope/name``, for a tensor file in directory ``scope`` (the top
        level, "", keeps bare names). Data order does not change: every name
        gains the same prefix."""
        if not scope:
            return self
        pre = scope + "/"
        return Header(self.raw, tuple(t._replace(name=pre + t.name) for t in self.tensors), self.metadata)

    @property
    def data_len(self) -> int:
        return self.tensors[-1].end if self.tensors else 0

    @property
    def file_size(self) -> int:
        return self.data_start + self.data_len


def header_length(prefix: bytes, file_size: int, *, where: str) -> int:
    """Validate the 8-byte prefix and return the JSON length it declares."""
    if len(prefix) < 8:
        raise HeaderError(f"{where}: too short to be a safetensors file")
    (n,) = _PREFIX.unpack_from(prefix)
    if n < 2 or n > MAX_HEADER_BYTES:
        raise HeaderError(f"{where}: header length {n} is out of range (2..{MAX_HEADER_BYTES})")
    if 8 + n > file_size:
        raise HeaderError(f"{where}: header length {n} runs past the end of the file")
    return n


def _no_duplicates(pairs):
    d = dict(pairs)
    if len(d) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise HeaderError(f"duplicate key {k!r} in header")
            seen.add(k)
    return d


def parse_header(raw: bytes, file_size: int, *, where: str) -> Header:
    """Parse a complete header (prefix + JSON) of a file of ``file_size`` bytes.

    Raises :class:`HeaderError` unless the file is a strict tensor file.
    """
    memo = len(raw) >= _MEMO_MIN
    if memo:
        with _MEMO_LOCK:
            hit = _MEMO.get((bytes(raw), file_size))
        if hit is not None:
            return hit
    n = header_length(raw, file_size, where=where)
    if len(raw) != 8 + n:
        raise HeaderError(f"{where}: header is truncated")
    if raw[8:9] != b"{":
        raise HeaderError(f"{where}: header is not a JSON object")
    # every tensor needs an object, and an object a literal "{": an upper
    # bound on the entries that costs nothing to check before parsing
    if raw.count(b"{", 8) > MAX_TENSORS + 2:
        raise HeaderError(f"{where}: more than {MAX_TENSORS} tensors in one file")
    try:
        obj = json.loads(raw[8:].decode("utf-8"), object_pairs_hook=_no_duplicates)
    except HeaderError as e:
        raise HeaderError(f"{where}: {e}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise HeaderError(f"{where}: header is not valid JSON ({type(e).__name__})") from None
    if not isinstance(obj, dict):
        raise HeaderError(f"{where}: header is not a JSON object")
    data_len = file_size - 8 - n
    metadata = obj.pop("__metadata__", None)
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise HeaderError(f"{where}: __metadata__ must map strings to strings")
    if len(obj) > MAX_TENSORS:
        raise HeaderError(f"{where}: more than {MAX_TENSORS} tensors in one file")
    tensors = [_tensor(name, spec, data_len, where) for name, spec in obj.items()]
    tensors.sort(key=_DATA_ORDER)
    pos = 0
    for t in tensors:
        if t.start != pos:
            what = "overlaps the previous tensor" if t.start < pos else "leaves a gap before it"
            raise HeaderError(f"{where}: tensor {t.name!r} {what}")
        pos = t.end
    if pos != data_len:
        raise HeaderError(
            f"{where}: tensors cover {pos} bytes but the data region holds {data_len}"
        )
    header = Header(raw=bytes(raw), tensors=tuple(tensors), metadata=metadata)
    if memo:
        with _MEMO_LOCK:
            _MEMO[(header.raw, file_size)] = header
            while len(_MEMO) > _MEMO_SIZE:
                del _MEMO[next(iter(_MEMO))]
    return header


#: Big headers parsed lately, by their bytes and file size: a pull of a
#: checkpoint of 25,000 tensors reads the same header of each file five or six
#: times (scans, checks, the apply), at ~0.8 s a parse. The key is the whole
#: header itself, never a name or a stat: a hit is the same input, and a Header
#: is immutable. Only successes are kept; a few, for memory.
_MEMO: dict = {}
_MEMO_LOCK = threading.Lock()
_MEMO_MIN = 256 * 1024
_MEMO_SIZE = 8

_SPEC_KEYS = frozenset(("dtype", "shape", "data_offsets"))
_DATA_ORDER = operator.attrgetter("start", "end", "name")


def _tensor(name: str, spec: object, data_len: int, where: str) -> TensorInfo:
    # written for speed: this runs once per tensor of every file read
    # a UTF-8 character is at most 4 bytes: encode only names that might be too long
    if 4 * len(name) > MAX_NAME_BYTES and len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise HeaderError(f"{where}: a tensor name is longer than {MAX_NAME_BYTES} bytes")
    if type(spec) is not dict or len(spec) != 3 or not _SPEC_KEYS.issuperset(spec):
        raise HeaderError(f"{where}: tensor {name!r} needs exactly dtype, shape, data_offsets")
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if type(dtype) is not str or not dtype or len(dtype) > 32:
        raise HeaderError(f"{where}: tensor {name!r} has an invalid dtype")
    if type(shape) is not list or len(shape) > MAX_NDIM:
        raise HeaderError(f"{where}: tensor {name!r} has an invalid shape")
    numel = 1
    for d in shape:
        if type(d) is not int or d < 0:
            raise HeaderError(f"{where}: tensor {name!r} has an invalid shape")
        numel *= d
    if type(offsets) is not list or len(offsets) != 2:
        raise HeaderError(f"{where}: tensor {name!r} has data offsets outside the file")
    start, end = offsets
    if type(start) is not int or type(end) is not int or not 0 <= start <= end <= data_len:
        raise HeaderError(f"{where}: tensor {name!r} has data offsets outside the file")
    info = dtype_info(dtype)
    if info.bits is not None:
        if numel * info.bits != (end - start) * 8:
            raise HeaderError(f"{where}: tensor {name!r} is {end - start} bytes, which does not fit {dtype}{shape}")
    elif (end - start) % info.word:
        raise HeaderError(f"{where}: tensor {name!r} has a size that is not whole words")
    return TensorInfo(name, dtype, tuple(shape), start, end, end - start)
