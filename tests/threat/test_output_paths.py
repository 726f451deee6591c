"""Paths given on the command line: no output is, or lies inside, an input,
however it is spelled (symlinks, hard links, relative paths, trailing
slashes), and an existing bundle file is replaced only with --force. Every
refusal is a usage error (exit 2) naming both paths, and the inputs stay
byte-identical."""

import os
from functools import partial
from pathlib import Path

import kit.cli
import pytest
from factory import simple_pair, tree

SHARD = "model-00001-of-00002.safetensors"
#: the installed console script; output as bytes
run = partial(kit.cli.run, script=True, text=False)


@pytest.fixture
def setup(tmp_path):
    A, B = simple_pair(tmp_path)
    assert os.path.exists(os.path.join(A, SHARD)), os.listdir(A)
    bundle = tmp_path / "d.wdb"
    r = run("pack", "-q", A, B, "-o", bundle)
    assert r.returncode == 0, r.stderr.decode()
    (tmp_path / "linkA").symlink_to(A)
    (tmp_path / "linkB").symlink_to(B)
    (tmp_path / "linkshard").symlink_to(os.path.join(B, SHARD))
    os.link(os.path.join(A, SHARD), tmp_path / "hardshard")
    os.link(bundle, tmp_path / "hardbundle")
    snap = {"A": tree(A), "B": tree(B), "bundle": bundle.read_bytes()}
    return tmp_path, A, B, bundle, snap


def refused(r, *names):
    err = r.stderr.decode()
    assert r.returncode == 2, err
    for n in names:
        n = str(Path(n)) if not n.startswith("-") else n  # as the command line spells it back
        assert n in err, (n, err)


def unchanged(tmp, A, B, bundle, snap):
    assert tree(A) == snap["A"] and tree(B) == snap["B"] and bundle.read_bytes() == snap["bundle"]


@pytest.mark.parametrize("out", [
    "A/" + SHARD, "A/config.json", "A/new.wdb", "A", "A/", "B/" + SHARD, "B/sub/x.wdb",
    "linkB/" + SHARD, "linkA/config.json", "linkshard", "./linkA/../A/" + SHARD, "hardshard",
])
def test_pack_refuses_an_input(setup, out):
    tmp, A, B, bundle, snap = setup
    r = run("pack", "-q", "--force", "A", "B", "-o", out, cwd=tmp)
    refused(r, out)
    err = r.stderr.decode()
    assert "checkpoint A" in err or "checkpoint B" in err, err
    unchanged(tmp, A, B, bundle, snap)


def test_pack_names_both_paths(setup):
    tmp, A, B, bundle, snap = setup
    r = run("pack", "-q", "-f", A, B, "-o", tmp / "linkB" / SHARD)
    refused(r, str(tmp / "linkB" / SHARD), str(B))
    unchanged(tmp, A, B, bundle, snap)


def test_pack_replaces_a_file_only_with_force(setup):
    tmp, A, B, bundle, snap = setup
    other = tmp / "other.wdb"
    other.write_bytes(b"keep me")
    refused(run("pack", "-q", A, B, "-o", other), str(other), "--force")
    assert other.read_bytes() == b"keep me"
    assert run("pack", "-q", "--force", A, B, "-o", other).returncode == 0
    assert other.read_bytes() == snap["bundle"]  # the same inputs give the same bytes
    unchanged(tmp, A, B, bundle, snap)


@pytest.mark.slow
def test_apply_refuses_an_output_inside_the_base(setup):
    tmp, A, B, bundle, snap = setup
    for out in ("linkA", "linkA/", "linkA/sub", "A/sub", "./A/../A/new"):
        refused(run("apply", "-q", bundle, "A", "-o", out, cwd=tmp), out)
        unchanged(tmp, A, B, bundle, snap)
    r = run("apply", "-q", bundle, A, "-o", tmp / "linkA" / "x")
    refused(r, str(tmp / "linkA" / "x"), str(A))
    unchanged(tmp, A, B, bundle, snap)
    assert run("apply", "-q", bundle, "linkA", "-o", "C", cwd=tmp).returncode == 0
    assert tree(tmp / "C") == snap["B"]


@pytest.mark.slow
def test_squash_refuses_its_inputs_and_needs_force(setup):
    tmp, A, B, bundle, snap = setup
    for out in ("d.wdb", "hardbundle", "A/x.wdb", "linkA/" + SHARD):
        refused(run("squash", "-q", "-f", "d.wdb", "--base", "A", "-o", out, cwd=tmp), out)
        unchanged(tmp, A, B, bundle, snap)
    out = tmp / "s.wdb"
    out.write_bytes(b"keep me")
    refused(run("squash", "-q", bundle, "--base", A, "-o", out), str(out), "--force")
    assert out.read_bytes() == b"keep me"
    assert run("squash", "-q", "-f", bundle, "--base", A, "-o", out).returncode == 0
    assert run("apply", "-q", out, A, "-o", tmp / "C").returncode == 0
    assert tree(tmp / "C") == snap["B"]


@pytest.mark.slow
def test_sign_never_writes_over_its_key_or_bundle(setup):
    tmp, A, B, bundle, snap = setup
    key = tmp / "k.key"
    assert run("keygen", key).returncode == 0
    keep = key.read_bytes()
    sig = Path(str(bundle) + ".minisig")
    sig.symlink_to(key)
    refused(run("sign", bundle, "--key", key), str(sig), str(key))
    assert key.read_bytes() == keep
    sig.unlink()
    assert run("sign", "-q", bundle, "--key", key).returncode == 0
    assert key.read_bytes() == keep and sig.is_file() and not sig.is_symlink()
    unchanged(tmp, A, B, bundle, snap)


def test_the_library_refuses_too(setup):
    import wdiff
    from wdiff.errors import UsageError

    tmp, A, B, bundle, snap = setup
    with pytest.raises(UsageError):
        wdiff.pack(A, B, bundle)
    with pytest.raises(UsageError):
        wdiff.squash([bundle], A, bundle, overwrite=True)
    with pytest.raises(UsageError):
        wdiff.pack(A, B, tmp / "linkA" / "config.json", overwrite=True)
    wdiff.pack(A, B, bundle, overwrite=True)
    unchanged(tmp, A, B, bundle, snap)
