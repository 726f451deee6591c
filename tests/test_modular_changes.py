"""chunk.modular_changes: the (positions, new words) a receiver scatters into
live tensors, for every MODULAR codec that lists its changed words; the same
result as decoding the whole chunk."""

import numpy as np
import pytest

from wdiff.codec import chunk


@pytest.mark.parametrize("dtype,word", [("BF16", 2), ("F32", 4), ("F64", 8), ("I16", 2), ("U8", 1)])
@pytest.mark.parametrize("density", [1e-4, 0.003, 0.05, 0.4])
def test_scattering_the_changes_is_decoding_the_chunk(dtype, word, density):
    rng = np.random.default_rng(hash((dtype, density)) % 2**32)
    ut = np.dtype(f"u{word}")
    old = rng.integers(0, np.iinfo(ut).max, size=50_000, dtype=ut, endpoint=True)
    new = old.copy()
    idx = rng.choice(old.size, max(1, int(old.size * density)), replace=False)
    new[idx] += rng.integers(1, 3, size=idx.size).astype(ut)
    fn = chunk.bucket_function(dtype, word)
    seen = 0
    for codec in sorted(chunk.MODULAR):
        if codec in chunk.CONDITIONED and fn is None:
            continue
        enc = chunk.encode_as(codec, old, new, 1, fn, (384, 100))
        got = chunk.modular_changes(codec, enc.param, enc.count, list(enc.parts), old, where="t")
        whole = old.copy()
        chunk.decode_into(codec, enc.param, enc.count, list(enc.parts), whole, where="t")
        assert np.array_equal(whole, new)
        if got is None:
            assert codec in (chunk.MDENSE, chunk.CDENSE)
            continue
        positions, values = got
        out = old.copy()
        out[positions] = values
        assert np.array_equal(out, new) and positions.size == idx.size
        seen += 1
    assert seen >= 2
    assert chunk.modular_changes(chunk.SPARSE, 0, 0, [b"", b"", b""], old, where="t") is None
