"""The value coder of codec v2, in pure Python: the twin of
``rc_values_encode`` and ``rc_values_decode`` in native/rangecoder.c, bit
for bit, for machines without the C extension (and as the reference the
tests hold the C code to). See man/wdiff-format.5, "Value section".

An adaptive binary range coder, LZMA's design (a 32-bit range, a 64-bit
low with a carry held back in a cache), with 16-bit probabilities that
learn at a rate of 1/(n + 2) for their n-th bit, down to 1/LIMIT. Each
listed word codes its sign (one model for the section), whether its
magnitude M = |d| - 1 is 0, whether it is 1, then for M >= 2 its bit
length L in unary and its L - 1 bits below the leading one (the first one
modelled per L, the rest at one half). Runs of words (CSPARSE: the movers,
then each bucket) start from fresh models, the sign's excepted.

Why this and not zstd: the magnitudes of an optimizer step are a small,
skewed alphabet whose distribution depends on the bucket. zstd's Huffman
stage cannot code a symbol in under one bit (0.68 bit per value against an
order-0 entropy of 0.33 given the bucket, bench adam0.5); this coder
reaches 0.40 with no table to store, and 1.00 for the near-random signs.
"""

from __future__ import annotations

import numpy as np

#: the slowest adaptation, 1/LIMIT of the way to each bit (the C extension's RC_LIMIT)
LIMIT = 256
PMIN = 64
_RATE = [65536 // min(i + 2, LIMIT) for i in range(LIMIT)]


class Bad(ValueError):
    """A stream that this coder cannot have written."""


class _Bit:
    __slots__ = ("p", "n")

    def __init__(self) -> None:
        self.p, self.n = 32768, 0

    def adapt(self, bit: int) -> None:
        r = _RATE[self.n]
        p = self.p - ((self.p * r) >> 16) if bit else self.p + (((65536 - self.p) * r) >> 16)
        self.p = min(max(p, PMIN), 65536 - PMIN)
        if self.n < LIMIT - 2:
            self.n += 1


class _Model:
    __slots__ = ("zero", "one", "len", "lead")

    def __init__(self) -> None:
        self.zero, self.one = _Bit(), _Bit()
        self.len = [_Bit() for _ in range(64)]
        self.lead = [_Bit() for _ in range(64)]


class Encoder:
    def __init__(self) -> None:
        self.low, self.range, self.cache, self.pending = 0, 0xFFFFFFFF, 0, 1
        self.out = bytearray()

    def _shift_low(self) -> None:
        if (self.low & 0xFFFFFFFF) < 0xFF000000 or self.low >> 32:
            carry, v = self.low >> 32, self.cache
            while True:
                self.out.append((v + carry) & 0xFF)
                v = 0xFF
                self.pending -= 1
                if not self.pending:
                    break
            self.cache = (self.low >> 24) & 0xFF
        self.pending += 1
        self.low = (self.low << 8) & 0xFFFFFFFF

    def code(self, p: int, bit: int) -> None:
        bound = (self.range >> 16) * p
        if bit:
            self.low += bound
            self.range -= bound
        else:
            self.range = bound
        while self.range < 1 << 24:
            self.range = (self.range << 8) & 0xFFFFFFFF
            self._shift_low()

    def bit(self, m: _Bit, bit: int) -> None:
        self.code(m.p, bit)
        m.adapt(bit)

    def finish(self) -> bytes:
        for _ in range(5):
            self._shift_low()
        return bytes(self.out)


class Decoder:
    def __init__(self, data: bytes) -> None:
        if len(data) < 5 or data[0] != 0:
            raise Bad("value stream does not start as the coder starts")
        self.data, self.at, self.range = data, 5, 0xFFFFFFFF
        self.code = int.from_bytes(data[1:5], "big")

    def decode(self, p: int) -> int:
        bound = (self.range >> 16) * p
        if self.code < bound:
            self.range, bit = bound, 0
        else:
            self.code -= bound
            self.range -= bound
            bit = 1
        while self.range < 1 << 24:
            if self.at >= len(self.data):
                raise Bad("value stream ends early")
            self.range = (self.range << 8) & 0xFFFFFFFF
            self.code = ((self.code << 8) | self.data[self.at]) & 0xFFFFFFFF
            self.at += 1
        return bit

    def bit(self, m: _Bit) -> int:
        bit = self.decode(m.p)
        m.adapt(bit)
        return bit

    def done(self) -> None:
        if self.at != len(self.data) or self.code >= self.range:
            raise Bad("value stream has bytes its values do not use")


def encode_values(neg: np.ndarray, mag: np.ndarray, bits: int, runs: list[int]) -> bytes:
    """The value stream of sign bits ``neg`` (0/1) and magnitudes ``mag``
    (each below 2^(bits - 1)) of words of ``bits`` bits, in ``runs``."""
    e, sign, i = Encoder(), _Bit(), 0
    neg, mag = neg.tolist(), [int(v) for v in mag.tolist()]
    for run in runs:
        m = _Model()
        for _ in range(run):
            e.bit(sign, neg[i])
            v = mag[i]
            i += 1
            e.bit(m.zero, v != 0)
            if v == 0:
                continue
            e.bit(m.one, v != 1)
            if v == 1:
                continue
            L = v.bit_length()
            for j in range(2, L):
                e.bit(m.len[j], 1)
            if L < bits - 1:
                e.bit(m.len[L], 0)
            e.bit(m.lead[L], (v >> (L - 2)) & 1)
            for j in range(L - 3, -1, -1):
                e.code(32768, (v >> j) & 1)
    return e.finish()


def decode_values(data: bytes, bits: int, runs: list[int]) -> tuple[list[int], list[int]]:
    """Inverse of :func:`encode_values`: (sign bits, magnitudes); Bad for a
    stream it cannot have written."""
    d, sign = Decoder(data), _Bit()
    neg, mag = [], []
    for run in runs:
        m = _Model()
        for _ in range(run):
            neg.append(d.bit(sign))
            if not d.bit(m.zero):
                mag.append(0)
                continue
            if not d.bit(m.one):
                mag.append(1)
                continue
            L = 2
            while L < bits - 1 and d.bit(m.len[L]):
                L += 1
            v = 2 | d.bit(m.lead[L])
            for _ in range(L - 3, -1, -1):
                v = (v << 1) | d.decode(32768)
            mag.append(v)
    d.done()
    return neg, mag
