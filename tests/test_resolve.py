"""Versions from a user's words: HEAD~N walks back the pushes, past squash
entries, and stops at the first anchor."""

from __future__ import annotations

import pytest

from wdiff.errors import NotFoundError
from wdiff.format.chain import Chain, Entry, Part


def _v(i: int) -> bytes:
    return bytes([i]) * 16


def _e(i: int, parent: int | None, label=None, n=None) -> Entry:
    b = bytes([n if n is not None else i + 100]) * 16
    return Entry(bundle=b, version=_v(i), parent=_v(parent) if parent is not None else None,
                 parts=(Part(f"objects/{b.hex()[:2]}/{b.hex()}.wdb", 10, b),), created="2026-01-01T00:00:00Z",
                 label=label, signature=None)


@pytest.fixture
def chain() -> Chain:
    # anchor v1, pushes v2, v3, v4; then a squash shortcut v1 -> v4 and a fresh anchor of v4
    return Chain(head=_v(4), entries=(
        _e(1, None, "v1"), _e(2, 1, "v2"), _e(3, 2), _e(4, 3, "v4"), _e(4, 1, n=201), _e(4, None, n=202),
    ))


@pytest.mark.parametrize("spec,want", [("HEAD", 4), ("head", 4), ("HEAD~0", 4), ("HEAD~1", 3), ("head~2", 2),
                                       ("HEAD~3", 1), ("v2", 2), (None, 4)])
def test_resolve(chain, spec, want):
    assert chain.resolve(spec) == _v(want)


def test_past_the_first_anchor_is_not_found(chain):
    with pytest.raises(NotFoundError, match="begins 3 version"):
        chain.resolve("HEAD~4")


def test_a_label_that_looks_like_head_n_is_the_label():
    c = Chain(head=_v(2), entries=(_e(1, None), _e(2, 1, "HEAD~1")))
    assert c.resolve("HEAD~1") == _v(2)
