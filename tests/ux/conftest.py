"""Fixtures of the user-experience tests: small checkpoints from
tests/factory.py and a directory remote built with the real command line."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from factory import simple_pair
from uxkit import json_docs, ok


@dataclass
class Chain:
    tmp: Path
    A: Path  # version v1
    B: Path  # version v2
    R: Path  # a directory remote: anchor v1 (A), then the delta v1 -> v2 (B)
    anchor_bytes: int
    delta_bytes: int

    def pull(self, name: str, to: str | None = None) -> Path:
        """A directory brought to a version by `wdiff pull`, as a user has it."""
        d = self.tmp / name
        ok("pull", "-q", *(["--to", to] if to else []), self.R, d)
        return d


@pytest.fixture(scope="session")
def _chain_template(tmp_path_factory) -> tuple[Path, dict]:
    """Made once: every test gets its own copy (copying is much cheaper than
    three more runs of the command line per test)."""
    root = tmp_path_factory.mktemp("chain-template")
    A, B = simple_pair(root)
    R = root / "remote"
    ok("push", "-q", "--anchor", A, R, "--label", "v1")
    ok("push", "-q", B, R, "--base", A, "--label", "v2")
    (log,) = json_docs(ok("log", "--json", R).out)
    sizes = {("anchor" if e["anchor"] else "delta"): e["size"] for e in log["entries"]}
    return root, sizes


@pytest.fixture
def chain(tmp_path, _chain_template) -> Chain:
    root, sizes = _chain_template
    for name in ("A", "B", "remote"):
        shutil.copytree(root / name, tmp_path / name, symlinks=True)
    return Chain(tmp_path, tmp_path / "A", tmp_path / "B", tmp_path / "remote", sizes["anchor"], sizes["delta"])
