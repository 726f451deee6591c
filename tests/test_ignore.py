"""What is part of a checkpoint: gitignore-style patterns (defaults for
trainer state, .wdiffignore, --exclude/--include), checked against git's
own matcher where git is installed; excluded files are never read, shipped
or deleted."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

import wdiff
from factory import mutate, rand, tree, write_ckpt
from wdiff.errors import UsageError
from wdiff.store.checkpoint import scan
from wdiff.store.ignore import compile_pattern, rules

PATTERNS = [
    "*.log", "!keep.log", "/top.txt", "build/", "docs/**/*.md", "**/cache", "a/**", "!a/b", "x?y", "[ab]c.bin",
    "[!z]z.dat", "deep/er/", "name\\ with\\ space ", "\\#hash", "\\!bang", "sub/*.tmp", "# a comment", "",
    "**/secrets/**", "trail/**/", "*.pt", "!*.keep.pt",
]
FILES = [
    "x.log", "keep.log", "d/x.log", "d/keep.log", "top.txt", "d/top.txt", "build/out.o", "d/build/o", "build.txt",
    "docs/a.md", "docs/x/y/b.md", "docs/readme.txt", "cache/f", "z/cache/f", "cachex/f", "a/b", "a/c", "a/d/e",
    "xzy", "xy", "ac.bin", "bc.bin", "cc.bin", "az.dat", "zz.dat", "deep/er/f", "deep/erx/f", "name with space",
    "#hash", "!bang", "sub/a.tmp", "sub/d/a.tmp", "s/secrets/k", "secrets/k", "trail/a/b/f", "trail/f",
    "opt.pt", "opt.keep.pt", "d/e/f/opt.pt",
]


def _tree_of(root, files):
    for f in files:
        p = os.path.join(root, f)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as fh:
            fh.write(b"x")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to compare with")
def test_patterns_match_as_git_matches(tmp_path):
    root = tmp_path / "t"
    _tree_of(root, FILES)
    (root / ".wdiffignore").write_text("\n".join(PATTERNS) + "\n")
    ours = {f.path for f in scan(root, rules=rules(defaults=False)).files} - {".wdiffignore"}
    shutil.copy(root / ".wdiffignore", root / ".gitignore")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    r = subprocess.run(["git", "-C", str(root), "check-ignore", "--stdin"], input="\n".join(FILES) + "\n",
                       capture_output=True, text=True)
    ignored = set(r.stdout.splitlines())
    assert ours == set(FILES) - ignored


@pytest.mark.parametrize("pattern,path,is_dir,hit", [
    ("foo", "a/b/foo", False, True), ("/foo", "a/foo", False, False), ("/foo", "foo", False, True),
    ("a/*/c", "a/b/c", False, True), ("a/*/c", "a/b/d/c", False, False), ("a/**/c", "a/b/d/c", False, True),
    ("a/**/c", "a/c", False, True), ("**/c", "c", False, True), ("d/", "x/d", True, True), ("d/", "x/d", False, False),
    ("*.pt", "x.pt", False, True), ("*", "a/b", False, True), ("?", "ab", False, False), ("[0-9]x", "5x", False, True),
])
def test_one_pattern(pattern, path, is_dir, hit):
    assert compile_pattern(pattern).matches(path, is_dir) is hit


def test_comments_blanks_and_bad_patterns():
    assert compile_pattern("# x") is None and compile_pattern("   ") is None
    with pytest.raises(UsageError):
        rules(["# only a comment"])
    with pytest.raises(UsageError):
        rules(["a\nb"])


def test_defaults_leave_trainer_state_out_and_include_brings_it_back(tmp_path):
    state = ["optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state_0.pth", "rng_state.pth", "trainer_state.json",
             "training_args.bin", "global_step100/zero_pp_rank_0_mp_rank_00_optim_states.pt", "optimizer.bin",
             "random_states_0.pkl", "policy/optimizer.pt"]
    kept = ["config.json", "pytorch_model.bin", "optimizer.py", "global_step.txt", "rng_state.json"]
    _tree_of(tmp_path, state + kept)
    c = scan(tmp_path)
    assert {f.path for f in c.files} == set(kept)
    assert "global_step100/" in c.excluded and "optimizer.pt" in c.excluded
    c = scan(tmp_path, rules=rules(include=["optimizer.pt"]))
    assert {"optimizer.pt", "policy/optimizer.pt"} <= {f.path for f in c.files}
    c = scan(tmp_path, rules=rules(exclude=["*.json"], include=["/policy/optimizer.pt"]))
    assert {f.path for f in c.files} == {"pytorch_model.bin", "optimizer.py", "global_step.txt", "policy/optimizer.pt"}


def test_an_excluded_file_is_never_read(tmp_path):
    _tree_of(tmp_path, ["config.json"])
    os.mkfifo(tmp_path / "optimizer.pt")  # reading it would block; a FIFO is refused when scanned
    os.symlink("/nonexistent", tmp_path / "dangling.log")
    (tmp_path / ".wdiffignore").write_text("*.log\n")
    assert {f.path for f in scan(tmp_path).files} == {"config.json", ".wdiffignore"}


@pytest.fixture
def training(tmp_path):
    rng = np.random.default_rng(21)
    w = {"lm_head.weight": rand(rng, "BF16", (128, 64))}
    dirs = []
    for step, weights in ((100, w), (200, {"lm_head.weight": mutate(w["lm_head.weight"], 0.01, rng)})):
        d = write_ckpt(tmp_path / f"checkpoint-{step}", weights, companions={
            "config.json": b"{}", "optimizer.pt": os.urandom(5000), "rng_state_0.pth": os.urandom(100),
            "notes/scratch.txt": b"x", ".wdiffignore": b"notes/\n",
        })
        dirs.append(d)
    return dirs


def test_pack_apply_around_trainer_state(training, tmp_path):
    a, b = training
    r = wdiff.pack(a, b, tmp_path / "d.wdb")
    assert set(r.excluded) == {"optimizer.pt", "rng_state_0.pth", "notes/"}
    with wdiff.format.bundle.BundleReader(tmp_path / "d.wdb") as rd:
        assert {f.path for f in rd.index.files} == {"model.safetensors", "config.json", ".wdiffignore"}
    wdiff.apply(tmp_path / "d.wdb", a, tmp_path / "out")
    assert set(tree(tmp_path / "out")) == {"model.safetensors", "config.json", ".wdiffignore"}
    # in place: the trainer state of the directory stays as it was, untouched
    before = tree(a)
    wdiff.apply(tmp_path / "d.wdb", a, in_place=True)
    after = tree(a)
    for f in ("optimizer.pt", "rng_state_0.pth", "notes/scratch.txt"):
        assert after[f] == before[f]
    assert after["model.safetensors"] == tree(b)["model.safetensors"]


def test_included_trainer_state_is_shipped_and_a_clash_is_refused(training, tmp_path):
    a, b = training
    wdiff.pack(a, b, tmp_path / "i.wdb", include=["optimizer.pt"])
    with wdiff.format.bundle.BundleReader(tmp_path / "i.wdb") as rd:
        assert "optimizer.pt" in {f.path for f in rd.index.files} and "optimizer.pt" in {f.path for f in rd.index.base_files}
    # the bundle's base lists optimizer.pt: it is part of the base, whatever the applier's rules
    wdiff.apply(tmp_path / "i.wdb", a, tmp_path / "out")
    assert tree(tmp_path / "out")["optimizer.pt"] == tree(b)["optimizer.pt"]
    # an anchor that ships optimizer.pt, applied in place onto a directory
    # that holds its own (left out there): refused, not overwritten
    wdiff.pack(None, b, tmp_path / "anchor.wdb", include=["optimizer.pt"])
    empty = tmp_path / "e"
    _tree_of(empty, ["optimizer.pt"])
    with pytest.raises(UsageError, match="left out"):
        wdiff.apply(tmp_path / "anchor.wdb", empty, in_place=True)
    assert tree(empty) == {"optimizer.pt": b"x"}
    wdiff.apply(tmp_path / "anchor.wdb", empty, tmp_path / "out2")  # a copy writes elsewhere: no clash
    assert tree(tmp_path / "out2") == {k: v for k, v in tree(b).items() if k in tree(tmp_path / "out2")}
