"""The bundle index and chain index parsers, fuzzed: whatever the bytes,
they return a value or raise wdiff's own error, never anything else."""

import json

import pytest
from factory import simple_pair
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdiff
from wdiff.errors import WdiffError
from wdiff.format import records as fmt
from wdiff.format.bundle import BundleReader
from wdiff.format.chain import Chain

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=4),
    max_leaves=20,
)


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    t = tmp_path_factory.mktemp("fuzz")
    A, B = simple_pair(t)
    wdiff.pack(A, B, t / "d.wdb")
    with BundleReader(t / "d.wdb") as r:
        index = json.loads(r.index.encode())
    remote = str(t / "remote")
    wdiff.push(A, remote, anchor=True, label="a")
    wdiff.push(B, remote, base=A, label="b")
    chain = json.loads((t / "remote" / "chain.json").read_bytes())
    return index, chain


def mutate(obj, path: list, value):
    """Replace (or delete, for value ...) the member at ``path``."""
    cur = obj
    for key in path[:-1]:
        cur = cur[key]
    if value is ...:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value


def paths(obj, prefix=()):
    yield list(prefix)
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from paths(v, prefix + (i,))


def check(decode, raw: bytes):
    try:
        decode(raw)
    except WdiffError:
        pass


@pytest.mark.slow
@SETTINGS
@given(data=st.data())
def test_fuzz_bundle_index(samples, data):
    index, _ = samples
    doc = json.loads(json.dumps(index))
    candidates = [p for p in paths(doc) if p]
    for _ in range(data.draw(st.integers(1, 3))):
        p = data.draw(st.sampled_from(candidates))
        try:
            mutate(doc, p, data.draw(st.one_of(st.just(...), json_values)))
        except (KeyError, IndexError, TypeError):
            pass
        candidates = [q for q in paths(doc) if q]
        if not candidates:
            break
    raw = fmt.canonical_json(doc) if data.draw(st.booleans()) else json.dumps(doc).encode()
    check(lambda b: fmt.decode_index(b, where="fuzz"), raw)


@SETTINGS
@given(data=st.data())
def test_fuzz_chain_index(samples, data):
    _, chain = samples
    doc = json.loads(json.dumps(chain))
    for _ in range(data.draw(st.integers(1, 3))):
        candidates = [p for p in paths(doc) if p]
        if not candidates:
            break
        p = data.draw(st.sampled_from(candidates))
        try:
            mutate(doc, p, data.draw(st.one_of(st.just(...), json_values)))
        except (KeyError, IndexError, TypeError):
            pass
    check(lambda b: Chain.decode(b, where="fuzz"), json.dumps(doc).encode())


@SETTINGS
@given(raw=st.binary(max_size=512))
def test_fuzz_random_bytes(raw):
    check(lambda b: fmt.decode_index(b, where="fuzz"), raw)
    check(lambda b: Chain.decode(b, where="fuzz"), raw)
