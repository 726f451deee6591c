"""Hypothesis properties of wdiff, from the codecs up to whole checkpoints.

* codecs: every encoding of a chunk decodes to exactly the new words, the
  codec is one allowed at the chunk's density, and the choice is a function
  of the data alone; Rice-coded positions round-trip.
* checkpoints: ``apply(A, pack(A, B)) == B`` bit for bit (into a new
  directory and in place) over dtypes, shapes, densities, added / removed /
  retyped tensors, companion files and shard layouts; ``diff`` counts what a
  direct numpy comparison counts; bundles are byte-for-byte reproducible;
  chains of bundles compose exactly.

Checkpoints are described by small *recipes* (seeds and edit operations) that
hypothesis draws and shrinks; their bytes are made by ``factory`` from the
seeds, in ``tempfile.mkdtemp()`` directories (pytest's ``tmp_path`` is shared
by every example of a test).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from factory import DTYPES, T, mutate, numel, rand, tree, write_ckpt
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import wdiff
from wdiff.codec import chunk as codecs
from wdiff.codec import kernels
from wdiff.codec.chunk import (
    BITMAP,
    DENSE,
    RAW,
    SPARSE,
    decode_into,
    encode_delta,
    encode_raw,
    rice_decode,
    rice_encode,
)
from wdiff.codec.dtypes import dtype_info, uint_type
from wdiff.defaults import DEFAULT_CHUNK
from wdiff.store.hashing import BLOCK_SIZE

FAST = settings(max_examples=300, deadline=None, derandomize=True, database=None)
CKPT = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)

WORDS = (1, 2, 4, 8)
LEVEL = 3
#: exact densities where the encoder's choice changes, and the ones around them
THRESHOLD_DENSITIES = (0.0, 1e-4, 5e-4, 9.99e-4, 0.019, 0.02, 0.021, 0.199, 0.2, 0.201,
                       0.499, 0.5, 0.501, 0.599, 0.6, 0.601, 0.99, 1.0)


@contextlib.contextmanager
def workdir():
    d = tempfile.mkdtemp(prefix="wdiff-prop-")
    try:
        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


# =============================================================================
# codecs
# =============================================================================


def gating_density(old: np.ndarray, new: np.ndarray) -> float:
    """The density of changed words that encode_delta picks its candidate
    codecs by: a large unit's sample's, when the sample holds a change."""
    if new.size >= codecs.SAMPLE_MIN_WORDS:
        so, sn = codecs.sample(old), codecs.sample(new)
        k = int(np.count_nonzero(so != sn))
        if k:
            return k / so.size
    return int(np.count_nonzero(old != new)) / new.size


def allowed_codecs(density: float) -> set[int]:
    """Which codecs encode_delta may pick at a density (see codecs.py)."""
    ok = set()
    if density <= 0.6:
        ok.add(SPARSE)
        if density >= 0.02:
            ok.add(BITMAP)
    if density >= 0.2:
        ok.add(DENSE)
    if density >= 0.5:
        ok.add(RAW)
    return ok


def check_delta_roundtrip(old: np.ndarray, new: np.ndarray) -> None:
    assert old.dtype == new.dtype and old.shape == new.shape
    n = new.size
    changed = int(np.count_nonzero(old != new))
    enc = encode_delta(old, new, LEVEL)
    if changed == 0:
        assert enc is None
        return
    assert enc is not None
    assert enc.codec in allowed_codecs(gating_density(old, new)), (enc.codec, changed, n)
    assert enc.count == (0 if enc.codec == RAW else changed)
    buf = old.copy()
    decode_into(enc.codec, enc.param, enc.count, list(enc.parts), buf, where="prop")
    assert buf.dtype == new.dtype and np.array_equal(buf, new)
    # the choice depends on the data only: again, and with the other kernels
    # (C or numpy): bundles do not depend on whether the extension is built
    assert encode_delta(old.copy(), new.copy(), LEVEL) == enc
    with other_kernels():
        assert encode_delta(old, new, LEVEL) == enc
        buf = old.copy()
        decode_into(enc.codec, enc.param, enc.count, list(enc.parts), buf, where="prop")
        assert np.array_equal(buf, new)
    assert np.array_equal(old, old.copy())  # inputs are not touched


@contextlib.contextmanager
def other_kernels():
    """Run with the C kernels if numpy ones are in use, and the other way round."""
    was = kernels.set_native(not kernels.native())
    try:
        yield
    finally:
        kernels.set_native(was)


def check_raw_roundtrip(new: np.ndarray) -> None:
    enc = encode_raw(new, LEVEL)
    assert enc.codec == RAW and enc.count == 0 and enc.param == 0
    buf = np.full(new.size, 0xA5, dtype=new.dtype)  # raw ignores the base
    decode_into(enc.codec, enc.param, enc.count, list(enc.parts), buf, where="prop")
    assert np.array_equal(buf, new)
    assert encode_raw(new.copy(), LEVEL) == enc


@st.composite
def listed_words(draw):
    """Small arrays given element by element: shrinks to minimal examples."""
    w = draw(st.sampled_from(WORDS))
    top = 2 ** (8 * w) - 1
    value = st.one_of(st.sampled_from([0, 1, top, 1 << (8 * w - 1)]), st.integers(0, top))
    old = draw(st.lists(value, min_size=1, max_size=48))
    # each new word is the old one or anything else
    new = [o if v is None else v for o, v in zip(old, draw(st.lists(st.none() | value, min_size=len(old), max_size=len(old))))]
    ut = uint_type(w)
    return np.array(old, dtype=ut), np.array(new, dtype=ut)


@st.composite
def seeded_words(draw):
    """Larger arrays at an exact number of changed words, made from a seed."""
    w = draw(st.sampled_from(WORDS))
    n = draw(st.one_of(st.sampled_from([1, 2, 7, 8, 9, 63, 64, 65, 1000, 1001, 5000, 20011]), st.integers(1, 4000)))
    density = draw(st.one_of(st.sampled_from(THRESHOLD_DENSITIES), st.floats(0.0, 1.0)))
    k = 0 if density == 0 else min(n, max(1, round(density * n)))
    base = draw(st.sampled_from(["random", "zeros", "constant", "smooth"]))
    change = draw(st.sampled_from(["random", "lowbit", "topbit", "allones"]))
    placement = draw(st.sampled_from(["scattered", "run", "head", "tail"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ut = uint_type(w)
    if base == "random":
        old = rng.integers(0, 2 ** (8 * w) - 1, n, dtype=ut, endpoint=True)
    elif base == "zeros":
        old = np.zeros(n, dtype=ut)
    elif base == "constant":
        old = np.full(n, rng.integers(0, 2 ** (8 * w) - 1, dtype=ut, endpoint=True), dtype=ut)
    else:
        old = (np.arange(n, dtype=np.uint64) // 7).astype(ut)
    if placement == "scattered":
        pos = np.sort(rng.choice(n, size=k, replace=False))
    elif placement == "run":
        start = int(rng.integers(0, n - k + 1))
        pos = np.arange(start, start + k)
    elif placement == "head":
        pos = np.arange(k)
    else:
        pos = np.arange(n - k, n)
    if change == "random":
        xor = rng.integers(1, 2 ** (8 * w) - 1, pos.size, dtype=ut, endpoint=True)
    elif change == "lowbit":
        xor = np.ones(pos.size, dtype=ut)
    elif change == "topbit":
        xor = np.full(pos.size, 1 << (8 * w - 1), dtype=ut)
    else:
        xor = np.full(pos.size, 2 ** (8 * w) - 1, dtype=ut)
    new = old.copy()
    new[pos] ^= xor
    return old, new


@pytest.mark.slow
@FAST
@given(listed_words())
@example((np.array([0], np.uint8), np.array([0], np.uint8)))
@example((np.array([7], np.uint64), np.array([8], np.uint64)))
@example((np.array([5, 5, 5], np.uint16), np.array([5, 5, 5], np.uint16)))
def test_codec_roundtrip_listed(pair):
    old, new = pair
    check_delta_roundtrip(old, new)
    check_raw_roundtrip(new)


@FAST
@given(seeded_words())
def test_codec_roundtrip_seeded(pair):
    old, new = pair
    check_delta_roundtrip(old, new)
    check_raw_roundtrip(new)


GRID = [(1, 0), (1, 1), (2, 1), (2, 2), (1000, 20), (1000, 19), (1000, 21), (1000, 199), (1000, 200),
        (1000, 201), (1000, 499), (1000, 500), (1000, 501), (1000, 599), (1000, 600), (1000, 601),
        (1000, 1000), (5000, 1), (5000, 3), (5000, 4), (100_000, 1), (100_000, 99), (4096, 4096)]


@pytest.mark.parametrize("w", WORDS)
@pytest.mark.parametrize("n,k", GRID)
def test_codec_exact_thresholds(w, n, k):
    """Exact densities k/n at and around every switch of the encoder."""
    rng = np.random.default_rng(n * 31 + k * 7 + w)
    ut = uint_type(w)
    old = rng.integers(0, 2 ** (8 * w) - 1, n, dtype=ut, endpoint=True)
    new = old.copy()
    pos = rng.choice(n, size=k, replace=False)
    new[pos] ^= rng.integers(1, 2 ** (8 * w) - 1, k, dtype=ut, endpoint=True)
    check_delta_roundtrip(old, new)
    check_raw_roundtrip(new)


def _weights(rng, n: int) -> np.ndarray:
    """bf16 bit patterns of normal weights (uint16)."""
    from wdiff.store.sample import bf16_normal

    return bf16_normal(rng, n)


def _unit(scenario: str, n: int = 1 << 17) -> tuple[np.ndarray, np.ndarray]:
    """A large bf16 unit (sampled by the encoder) and a changed version."""
    from wdiff.store.sample import rl_step

    rng = np.random.default_rng(sum(map(ord, scenario)))
    old = _weights(rng, n)
    if scenario.startswith("rl"):
        return old, rl_step(old, float(scenario[2:]), rng)
    if scenario == "new":
        return old, _weights(rng, n)
    if scenario == "half-new":  # one half rewritten, the other untouched
        new = old.copy()
        new[: n // 2] = _weights(rng, n // 2)
        return old, new
    if scenario == "rows":  # a third of the rows of 4096 change at 50%
        new = old.copy()
        for r in np.flatnonzero(rng.random(n // 4096) < 0.3):
            new[r * 4096 : (r + 1) * 4096] = rl_step(old[r * 4096 : (r + 1) * 4096], 0.5, rng)
        return old, new
    if scenario == "one-word":  # the sample holds no change
        new = old.copy()
        new[n - 1] ^= 1
        return old, new
    raise ValueError(scenario)


UNITS = ["rl0.01", "rl0.03", "rl0.1", "rl0.3", "rl0.5", "rl0.6", "rl0.7", "rl1.0", "new", "half-new", "rows", "one-word"]


@pytest.mark.parametrize("scenario", UNITS)
def test_large_unit_roundtrip(scenario):
    """Units large enough to be sampled: the codec is one that can win at
    the sample's density, and everything else holds as for small units."""
    old, new = _unit(scenario)
    assert new.size >= codecs.SAMPLE_MIN_WORDS
    check_delta_roundtrip(old, new)


@pytest.mark.parametrize("scenario", UNITS)
def test_sampled_choice_is_near_the_best(scenario):
    """Picking codecs on a sample costs at most 2% against encoding the unit
    with every codec that can win at its density and keeping the smallest."""
    old, new = _unit(scenario)
    enc = encode_delta(old, new, LEVEL)
    density = int(np.count_nonzero(old != new)) / new.size
    best = min(codecs.encode_as(c, old, new, LEVEL).size for c in codecs.candidates(density))
    assert enc.size <= best * 1.02, (scenario, codecs.CODEC_NAMES[enc.codec], enc.size, best)


def test_sparse_at_rice_zero_shares_the_bitmap():
    """At half density the Rice parameter is 0, SPARSE and BITMAP tie, and
    the unary stream is taken from the bitmap: the same bytes as the Rice
    coder's."""
    old, new = _unit("rl0.5")
    enc = encode_delta(old, new, LEVEL)
    assert enc.codec == SPARSE and enc.param == 0
    positions = np.flatnonzero(old != new)
    assert enc.parts[:2] == rice_encode(positions)[1:]
    with other_kernels():
        assert enc.parts[:2] == rice_encode(positions)[1:]


@st.composite
def position_sets(draw):
    kind = draw(st.sampled_from(["set", "dense", "runs", "huge"]))
    if kind == "set":
        n = draw(st.integers(1, 5000))
        ps = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=min(n, 200))))
    elif kind == "dense":
        n = draw(st.integers(1, 3000))
        lo = draw(st.integers(0, n - 1))
        ps = list(range(lo, n))
    elif kind == "runs":
        n = draw(st.integers(2, 100_000))
        starts = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=20)))
        ps = sorted({p for s in starts for p in range(s, min(n, s + draw(st.integers(1, 50))))})
    else:  # far apart: large gaps, large Rice parameters (chunks never come near 2**42 words;
        # beyond that rice_encode fails, see test_rice_encode_huge_gap)
        n = draw(st.integers(1, 2**42))
        ps = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=8)))
    slack = draw(st.sampled_from([0, 0, 1, 1000]))
    return np.array(ps, dtype=np.int64), n + slack


@FAST
@given(position_sets())
@example((np.array([0], dtype=np.int64), 1))
@example((np.array([2**40 - 1], dtype=np.int64), 2**40))
@example((np.arange(64, dtype=np.int64), 64))
def test_rice_roundtrip(case):
    positions, n = case
    r, unary, rem = rice_encode(positions)
    back = rice_decode(r, unary, rem, positions.size, n, where="prop")
    assert back.dtype.kind in "iu" and np.array_equal(back, positions)
    assert rice_encode(positions.copy()) == (r, unary, rem)
    with other_kernels():
        assert rice_encode(positions) == (r, unary, rem)
        assert np.array_equal(rice_decode(r, unary, rem, positions.size, n, where="prop"), positions)


def test_rice_encode_huge_gap():
    # _rice_param searches r in range(guess - 1, min(MAX_RICE, guess + 2) + 1), which is
    # empty once guess >= 42, so `best` stays None. Unreachable from pack (a chunk holds
    # at most 64 MiB), but the function accepts any strictly increasing positions.
    positions = np.array([2**43], dtype=np.int64)
    r, unary, rem = rice_encode(positions)
    assert np.array_equal(rice_decode(r, unary, rem, 1, 2**43 + 1, where="prop"), positions)


def test_rice_encode_no_positions():
    # Minor, unreachable from pack (encode_delta returns None first), but asymmetric.
    r, unary, rem = rice_encode(np.array([], dtype=np.int64))
    assert rice_decode(r, unary, rem, 0, 10, where="prop").size == 0


# =============================================================================
# checkpoint recipes
# =============================================================================

SHAPES = ((), (0,), (0, 5), (5, 0), (1,), (2,), (3,), (7,), (5, 3), (13, 11), (64,), (31, 33),
          (257,), (100, 17), (1000,), (3, 5, 7), (2, 1, 3), (128, 129), (20001,))
#: tensor names; safetensors allows any string, and a name must never become a path
NAMES = ("a", "emb.weight", "layer.0.w", "layer.1.b", "norm", "scale_inv", "z.9", "../ü w")
COMPANIONS = ("config.json", "tokenizer.json", "sub/params.json", "odd.safetensors", "empty.txt")
METADATA = (None, {"format": "pt", "step": "7"}, {})  # None: write_ckpt's default {"format": "pt"}
SAME_BITS = {8: ["I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2"], 16: ["BF16", "F16", "I16", "U16"],
             32: ["F32", "I32", "U32"], 64: ["F64", "I64", "U64", "C64"]}
DENSITIES = st.one_of(st.sampled_from([0.0, 0.0005, 0.01, 0.02, 0.05, 0.2, 0.5, 0.6, 0.9, 1.0]), st.floats(0.0, 1.0))

keep_op = st.just(("keep",))
mutate_op = st.tuples(st.just("mutate"), DENSITIES)
tensor_ops = st.one_of(  # mutate listed thrice: it is the common case
    keep_op,
    mutate_op,
    mutate_op,
    mutate_op,
    st.just(("remove",)),
    st.tuples(st.just("put"), st.sampled_from(DTYPES), st.sampled_from(SHAPES)),
    st.just(("reinterpret",)),  # same bytes, another dtype of the same width
    st.just(("reshape",)),  # same bytes and dtype, another shape
)
init_ops = st.one_of(st.tuples(st.just("put"), st.sampled_from(DTYPES), st.sampled_from(SHAPES)), st.just(("remove",)))
companion_ops = st.one_of(keep_op, st.just(("remove",)), st.tuples(st.just("put"), st.integers(0, 3000)))


@dataclass(frozen=True)
class Edit:
    """One version step: an operation per tensor name and per companion file,
    applied to the previous version; the bytes come from ``seed``."""

    seed: int
    tensors: tuple
    companions: tuple
    shards: int
    metadata: int = 0  # index into METADATA


def random_edit(seed: int, first: bool) -> Edit:
    """An edit drawn by numpy from one seed. Derandomized hypothesis draws
    recipes that look much alike; these widen the net (and shrink to the
    drawn kind, which is listed first)."""
    rng = np.random.default_rng(seed)
    ops = []
    for _ in NAMES:
        kind = "put" if first and rng.random() < 0.7 else "remove" if first else str(
            rng.choice(["keep", "mutate", "remove", "put", "reinterpret", "reshape"], p=[0.2, 0.35, 0.1, 0.15, 0.1, 0.1]))
        if kind == "put":
            ops.append(("put", DTYPES[rng.integers(len(DTYPES))], SHAPES[rng.integers(len(SHAPES))]))
        elif kind == "mutate":
            r = rng.random()
            d = (THRESHOLD_DENSITIES[rng.integers(len(THRESHOLD_DENSITIES))] if r < 0.4
                 else float(10 ** rng.uniform(-4, 0)) if r < 0.8 else float(rng.random()))
            ops.append(("mutate", d))
        else:
            ops.append((kind,))
    files = []
    for _ in COMPANIONS:
        r = rng.random()
        files.append(("keep",) if r < 0.5 else ("remove",) if r < 0.7 else ("put", int(rng.integers(0, 3000))))
    return Edit(seed, tuple(ops), tuple(files), int(rng.integers(1, 5)), int(rng.choice(3, p=[0.8, 0.1, 0.1])))


def edits(first: bool = False):
    drawn = st.builds(
        Edit,
        st.integers(0, 2**32 - 1),
        st.tuples(*[init_ops if first else tensor_ops for _ in NAMES]),
        st.tuples(*[companion_ops for _ in COMPANIONS]),
        st.integers(1, 4),
        st.sampled_from([0, 0, 0, 1, 2]),
    )
    return st.one_of(drawn, st.integers(0, 2**32 - 1).map(lambda s: random_edit(s, first)))


@dataclass
class Version:
    tensors: dict
    companions: dict
    shards: int
    metadata: int


def step(prev: Version | None, e: Edit) -> Version:
    rng = np.random.default_rng(e.seed)
    ts = dict(prev.tensors) if prev else {}
    for name, op in zip(NAMES, e.tensors):
        t = ts.get(name)
        kind = op[0]
        if kind == "put":
            ts[name] = rand(rng, op[1], op[2])
        elif t is None or kind == "keep":
            continue
        elif kind == "remove":
            del ts[name]
        elif kind == "mutate":
            ts[name] = mutate(t, op[1], rng)
        elif kind == "reinterpret":
            group = SAME_BITS[dtype_info(t.dtype).bits]
            ts[name] = T(group[(group.index(t.dtype) + 1) % len(group)], t.shape, t.data)
        elif kind == "reshape":
            flat = (numel(t.shape),)
            ts[name] = T(t.dtype, flat if t.shape != flat else (1,) + flat, t.data)
    files = dict(prev.companions) if prev else {}
    for path, op in zip(COMPANIONS, e.companions):
        if op[0] == "remove":
            files.pop(path, None)
        elif op[0] == "put":
            body = rng.integers(0, 256, op[1], dtype=np.uint8).tobytes()
            # an opaque *.safetensors: its header length is out of range
            files[path] = (b"\xff" * 8 + body) if path.endswith(".safetensors") else body
    return Version(ts, files, e.shards, e.metadata)


def materialize(root: Path, v: Version) -> str:
    return write_ckpt(root, v.tensors, shards=v.shards, companions=v.companions, metadata=METADATA[v.metadata])


pairs = st.tuples(edits(first=True), edits())

TENSOR_FILE = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors")


def companion_files(files: dict[str, bytes]) -> dict[str, bytes]:
    """The files of a checkpoint tree that write_ckpt did not write as tensor files."""
    return {p: b for p, b in files.items() if not TENSOR_FILE.fullmatch(p)}


def words(t: T) -> np.ndarray:
    return np.frombuffer(t.data, dtype=uint_type(dtype_info(t.dtype).word))


def changed_blocks(a: T, b: T) -> int:
    """Direct count of the BLOCK_SIZE blocks of a tensor that differ."""
    return sum(a.data[i : i + BLOCK_SIZE] != b.data[i : i + BLOCK_SIZE] for i in range(0, len(a.data), BLOCK_SIZE))


def roundtrip(d: Path, A: str, B: str, *, threads: int | None = None, chunk: int | None = None) -> None:
    """pack A->B; apply into a new directory and in place; both give B exactly."""
    want = tree(B)
    a_before = tree(A)
    bundle = d / "step.wdb"
    kw = {} if chunk is None else {"chunk": chunk}
    wdiff.pack(A, B, bundle, threads=threads, **kw)
    wdiff.apply(bundle, A, d / "out", threads=threads)
    assert tree(d / "out") == want
    assert tree(A) == a_before  # the base is never touched
    shutil.copytree(A, d / "inplace")
    wdiff.apply(bundle, d / "inplace", in_place=True, threads=threads)
    assert tree(d / "inplace") == want
    assert not (d / "inplace" / ".wdiff" / "txn").exists()


# =============================================================================
# pack + apply
# =============================================================================


@pytest.mark.slow
@CKPT
@given(pairs, st.sampled_from([None, 1, 3]))
def test_pack_apply_roundtrip(pair, threads):
    v0 = step(None, pair[0])
    v1 = step(v0, pair[1])
    with workdir() as d:
        A, B = materialize(d / "A", v0), materialize(d / "B", v1)
        roundtrip(d, A, B, threads=threads)


@settings(CKPT, max_examples=25)
@given(edits(first=True))
def test_anchor_roundtrip(e):
    v = step(None, e)
    with workdir() as d:
        B = materialize(d / "B", v)
        wdiff.pack(None, B, d / "anchor.wdb")
        wdiff.apply(d / "anchor.wdb", None, d / "out")
        assert tree(d / "out") == tree(B)


def _big(rng, dtype: str, nbytes: int) -> T:
    bits = dtype_info(dtype).bits
    return rand(rng, dtype, (nbytes * 8 // bits,))


def _mutate_range(t: T, lo: float, hi: float, density: float, rng) -> T:
    """Mutate only the words in [lo, hi) (fractions of the tensor)."""
    w = words(t).copy()
    a, b = int(lo * w.size), max(int(lo * w.size) + 1, int(hi * w.size))
    part = T(t.dtype, (b - a,), w[a:b].tobytes())
    w[a:b] = words(mutate(part, density, rng))
    return T(t.dtype, t.shape, w.tobytes())


# (dtype, bytes, region changed, density, shards A, shards B, pack chunk)
BIG_CASES = [
    ("BF16", DEFAULT_CHUNK + 14, (0.0, 1.0), 0.001, 1, 1, None),  # past one chunk, sparse everywhere
    ("BF16", DEFAULT_CHUNK + 14, (0.9999, 1.0), 0.5, 1, 2, None),  # only the short last chunk moves
    ("U8", BLOCK_SIZE + 3, (0.0, 1.0), 1.0, 2, 1, None),  # past one block, all changed
    ("F32", 2 * BLOCK_SIZE + 12, (0.45, 0.55), 0.05, 3, 3, BLOCK_SIZE),  # middle block only, 1 MiB chunks
    ("I64", DEFAULT_CHUNK + 8 * 3, (0.0, 0.0), 0.0, 1, 4, None),  # unchanged, re-sharded
]
#: a companion file past one block, changed in its last byte
BIG_FILE = bytes(range(256)) * (BLOCK_SIZE // 256) + b"tail"


@pytest.mark.parametrize("dtype,nbytes,region,density,sa,sb,chunk", BIG_CASES)
def test_large_tensor_roundtrip(dtype, nbytes, region, density, sa, sb, chunk):
    rng = np.random.default_rng(nbytes + len(dtype))
    big = _big(rng, dtype, nbytes)
    small = {f"s{i}": rand(rng, DTYPES[i % len(DTYPES)], (33, 3)) for i in range(5)}
    a = {"big": big, **small}
    b = {**small, "big": _mutate_range(big, *region, density, rng) if density else big,
         "s1": mutate(small["s1"], 0.3, rng)}
    with workdir() as d:
        A = write_ckpt(d / "A", a, shards=sa, companions={"big.bin": BIG_FILE})
        B = write_ckpt(d / "B", b, shards=sb, companions={"big.bin": BIG_FILE[:-1] + b"!"})
        roundtrip(d, A, B, chunk=chunk)
        got = {t.name: t for t in wdiff.diff(A, B).tensors}
    for name in ("big", "s1"):
        assert got[name].changed == int(np.count_nonzero(words(a[name]) != words(b[name])))
        assert got[name].blocks_changed == changed_blocks(a[name], b[name])


@settings(CKPT, max_examples=3)
@given(st.sampled_from(["BF16", "F8_E5M2", "C64"]), st.sampled_from([BLOCK_SIZE + 8, DEFAULT_CHUNK + 8]),
       st.floats(0.0, 1.0), st.floats(0.0, 0.02), st.integers(0, 2**32 - 1))
def test_large_tensor_roundtrip_drawn(dtype, nbytes, lo, density, seed):
    rng = np.random.default_rng(seed)
    big = _big(rng, dtype, nbytes)
    with workdir() as d:
        A = write_ckpt(d / "A", {"big": big})
        B = write_ckpt(d / "B", {"big": _mutate_range(big, lo, 1.0, density, rng)})
        roundtrip(d, A, B, threads=2)


@pytest.mark.parametrize("empty_side", ["A", "B"])
def test_empty_directory_on_either_side(empty_side):
    with workdir() as d:
        full = write_ckpt(d / "full", {"w": rand(np.random.default_rng(6), "BF16", (9,))}, companions={"c.json": b"{}"})
        (d / "empty").mkdir()
        A, B = (d / "empty", full) if empty_side == "A" else (full, d / "empty")
        roundtrip(d, A, B)
        assert wdiff.diff(A, B).differs


# =============================================================================
# diff
# =============================================================================


@pytest.mark.slow
@settings(CKPT, max_examples=30)
@given(edits(first=True))
def test_a_checkpoint_against_itself(e):
    """diff(A, A) is empty, and pack(A, A) applies to A as the identity."""
    v = step(None, e)
    with workdir() as d:
        A = materialize(d / "A", v)
        res = wdiff.diff(A, A)
        assert res.identical and not res.differs
        assert not res.files and not res.metadata_changed and not res.layout_changed
        assert sorted(t.name for t in res.tensors) == sorted(v.tensors)
        for t in res.tensors:
            assert t.status == "unchanged" and t.changed == 0 and t.blocks_changed == 0
            assert t.elements == len(v.tensors[t.name].data) // dtype_info(t.dtype).word
        p = wdiff.pack(A, A, d / "same.wdb")
        assert p.changed_elements == 0 and p.files_stored == 0
        roundtrip(d, A, A)


@pytest.mark.slow
@CKPT
@given(pairs)
def test_diff_matches_a_direct_comparison(pair):
    v0 = step(None, pair[0])
    v1 = step(v0, pair[1])
    a, b = v0.tensors, v1.tensors
    with workdir() as d:
        A, B = materialize(d / "A", v0), materialize(d / "B", v1)
        ta, tb = tree(A), tree(B)
        res = wdiff.diff(A, B)
    ca, cb = companion_files(ta), companion_files(tb)
    content = {n: (t.dtype, t.shape, t.data) for n, t in a.items()} != {n: (t.dtype, t.shape, t.data) for n, t in b.items()}
    meta = METADATA[v0.metadata] != METADATA[v1.metadata]
    if not meta or v0.shards == v1.shards:
        # __metadata__ is compared between tensor files of the same path only
        assert res.differs == (content or ca != cb or meta)
    else:
        assert res.differs or not (content or ca != cb)
    assert res.identical == (ta == tb)
    got = {t.name: t for t in res.tensors}
    assert sorted(got) == sorted(set(a) | set(b))
    for name, t in got.items():
        if name not in a:
            assert t.status == "added"
        elif name not in b:
            assert t.status == "removed"
        elif (a[name].dtype, a[name].shape) != (b[name].dtype, b[name].shape):
            assert t.status == "retyped"
        else:
            changed = int(np.count_nonzero(words(a[name]) != words(b[name])))
            assert t.changed == changed, name
            assert t.elements == words(b[name]).size
            assert t.blocks == -(-len(b[name].data) // BLOCK_SIZE)
            assert t.blocks_changed == changed_blocks(a[name], b[name])
            assert t.status == ("modified" if changed else "unchanged")
    want_files = {p: "changed" for p in ca.keys() & cb.keys() if ca[p] != cb[p]}
    want_files.update({p: "added" for p in cb.keys() - ca.keys()})
    want_files.update({p: "removed" for p in ca.keys() - cb.keys()})
    assert {f.path: f.status for f in res.files} == want_files


@pytest.mark.slow
@settings(CKPT, max_examples=30)
@given(edits(first=True), st.integers(1, 4))
def test_resharding_alone_is_no_difference(e, shards_b):
    v = step(None, e)
    with workdir() as d:
        meta = METADATA[v.metadata]
        A = write_ckpt(d / "A", v.tensors, shards=v.shards, companions=v.companions, metadata=meta)
        B = write_ckpt(d / "B", v.tensors, shards=shards_b, companions=v.companions, metadata=meta)
        for root in (A, B):  # the shard index is a companion file that names the shards
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(root, "model.safetensors.index.json"))
        res = wdiff.diff(A, B)
        assert not res.differs
        assert res.identical == (v.shards == shards_b)
        assert all(t.status == "unchanged" for t in res.tensors)
        p = wdiff.pack(A, B, d / "x.wdb")
        assert p.changed_elements == 0
        wdiff.apply(d / "x.wdb", A, d / "out")
        assert tree(d / "out") == tree(B)


# =============================================================================
# reproducible bundles
# =============================================================================


@pytest.mark.slow
@settings(CKPT, max_examples=30)
@given(pairs)
def test_bundles_are_reproducible(pair):
    v0 = step(None, pair[0])
    v1 = step(v0, pair[1])
    with workdir() as d:
        A, B = materialize(d / "A", v0), materialize(d / "B", v1)
        wdiff.pack(A, B, d / "t1.wdb", threads=1)
        wdiff.pack(A, B, d / "t3.wdb", threads=3)
        wdiff.pack(A, B, d / "again.wdb", threads=1)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("WDIFF_THREADS", "1")
            wdiff.pack(A, B, d / "env1.wdb")
            mp.setenv("WDIFF_THREADS", "3")
            wdiff.pack(A, B, d / "env3.wdb")
        # the same checkpoints elsewhere, written from dicts in reverse insertion order
        A2 = write_ckpt(d / "elsewhere" / "A", dict(reversed(v0.tensors.items())), shards=v0.shards,
                        companions=dict(reversed(v0.companions.items())), metadata=METADATA[v0.metadata])
        B2 = write_ckpt(d / "elsewhere" / "B", dict(reversed(v1.tensors.items())), shards=v1.shards,
                        companions=dict(reversed(v1.companions.items())), metadata=METADATA[v1.metadata])
        assert tree(A2) == tree(A) and tree(B2) == tree(B)
        wdiff.pack(A2, B2, d / "moved.wdb")
        ref = (d / "t1.wdb").read_bytes()
        for name in ("t3", "again", "env1", "env3", "moved"):
            assert (d / f"{name}.wdb").read_bytes() == ref, name


# =============================================================================
# chains
# =============================================================================


@pytest.mark.slow
@settings(CKPT, max_examples=60)
@given(edits(first=True), edits(), edits())
def test_chains_compose_exactly(e0, e1, e2):
    v0 = step(None, e0)
    v1 = step(v0, e1)
    v2 = step(v1, e2)
    with workdir() as d:
        dirs = [materialize(d / f"v{i}", v) for i, v in enumerate((v0, v1, v2))]
        wdiff.pack(dirs[0], dirs[1], d / "01.wdb")
        wdiff.pack(dirs[1], dirs[2], d / "12.wdb")
        wdiff.pack(dirs[1], dirs[0], d / "10.wdb")
        wdiff.apply(d / "01.wdb", dirs[0], d / "r1")
        wdiff.apply(d / "12.wdb", d / "r1", d / "r2")
        assert tree(d / "r2") == tree(dirs[2])
        wdiff.apply(d / "10.wdb", d / "r1", d / "back")  # and back again
        assert tree(d / "back") == tree(dirs[0])
        shutil.copytree(dirs[0], d / "live")  # the same chain in place
        wdiff.apply(d / "01.wdb", d / "live", in_place=True)
        wdiff.apply(d / "12.wdb", d / "live", in_place=True)
        assert tree(d / "live") == tree(dirs[2])
        assert not (d / "live" / ".wdiff" / "txn").exists()


# =============================================================================
# a companion file turns into a directory, or the other way round
# =============================================================================

SWAPS = [({"sub/params.json": b"1"}, {"sub": b"2"}), ({"sub": b"2"}, {"sub/params.json": b"1"})]


def _swap_pair(d: Path, ca: dict, cb: dict) -> tuple[str, str]:
    ts = {"w": rand(np.random.default_rng(5), "F32", (4,))}
    return write_ckpt(d / "A", ts, companions=ca), write_ckpt(d / "B", ts, companions=cb)


@pytest.mark.parametrize("ca,cb", SWAPS, ids=["dir-to-file", "file-to-dir"])
def test_file_and_directory_swap_copy_mode(ca, cb):
    with workdir() as d:
        A, B = _swap_pair(d, ca, cb)
        wdiff.pack(A, B, d / "x.wdb")
        wdiff.apply(d / "x.wdb", A, d / "out")
        assert tree(d / "out") == tree(B)


@pytest.mark.parametrize("ca,cb", SWAPS, ids=["dir-to-file", "file-to-dir"])
def test_file_and_directory_swap_in_place(ca, cb):
    with workdir() as d:
        A, B = _swap_pair(d, ca, cb)
        wdiff.pack(A, B, d / "x.wdb")
        wdiff.apply(d / "x.wdb", A, in_place=True)
        assert tree(A) == tree(B)
        assert not (Path(A) / ".wdiff" / "txn").exists()
