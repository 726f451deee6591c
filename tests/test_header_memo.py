"""store.header's memo of big headers: keyed by the header's bytes (and
the file's size), never by a name or a stat; failures are not kept."""

import json
import struct

import pytest

from wdiff.store import header as H


def _raw(n: int, *, shift: int = 0, bad: bool = False) -> tuple[bytes, int]:
    d = {f"t.{i}": {"dtype": "U8", "shape": [4], "data_offsets": [4 * i, 4 * i + 4]} for i in range(n)}
    if shift:
        d["t.0"]["shape"] = [3] if bad else [4]
        d[f"t.{shift}"]["dtype"] = "I8"
    raw = json.dumps(d).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, 8 + len(raw) + 4 * n


def test_a_big_header_is_parsed_once_and_only_for_the_same_bytes():
    raw, size = _raw(4000)
    assert len(raw) >= H._MEMO_MIN
    a = H.parse_header(raw, size, where="a")
    assert H.parse_header(bytearray(raw), size, where="b") is a  # the same bytes: the same Header
    other, size2 = _raw(4000, shift=5)  # one dtype differs, same length
    assert len(other) == len(raw) and size2 == size
    b = H.parse_header(other, size, where="c")
    assert b is not a and b.tensors[5].dtype == "I8"
    with pytest.raises(H.HeaderError):  # the same header in a file of another size: parsed, refused
        H.parse_header(raw, size + 4, where="d")


def test_refusals_are_not_kept_and_the_memo_stays_small():
    bad, size = _raw(4000, shift=7, bad=True)
    for _ in range(2):
        with pytest.raises(H.HeaderError, match="does not fit"):
            H.parse_header(bad, size, where="x")
    for k in range(1, H._MEMO_SIZE + 3):
        raw, size = _raw(4000 + k)
        H.parse_header(raw, size, where="y")
    assert len(H._MEMO) <= H._MEMO_SIZE
    small, size = _raw(10)
    H.parse_header(small, size, where="z")
    assert all(len(k[0]) >= H._MEMO_MIN for k in H._MEMO)
