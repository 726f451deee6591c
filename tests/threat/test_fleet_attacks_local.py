"""Attacks from outside on the fleet surfaces of issue 33 (review round 2):
pull --atomic --keep, the live library's apply_into, the directory remote's
write paths and the scratch folders. Each test drives the real command line
or the public API and plants what an attacker (or a careless user) would."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))

from kit.cli import ok  # noqa: E402
from test_pull_atomic_keep import Head, cli, env, site_of, versions_beside  # noqa: E402,F401


@pytest.mark.slow
def test_keep_never_removes_a_version_holding_the_users_files(env, tmp_path):
    """A user writes eval results into an old version directory (or edits a
    file of it) after the pull. The README promises the only files a pull
    removes are files it lists: --keep leaves such a directory (and says
    so) instead of deleting the user's work with it."""
    head = Head(tmp_path)
    site, link = site_of(tmp_path)
    made = [head.next()]
    cli("pull", "-q", head.remote, link, "--atomic", env=env)
    made.append(head.next())
    cli("pull", "-q", head.remote, link, "--atomic", env=env)
    (site / made[0] / "eval").mkdir()
    (site / made[0] / "eval" / "results.json").write_text('{"acc": 0.9}')
    edited = sorted(p for p in os.listdir(site / made[1]) if p.endswith(".json"))[0]
    with open(site / made[1] / edited, "a") as f:
        f.write(" ")  # a local change to a file of the version
    made.append(head.next())
    r = cli("pull", head.remote, link, "--atomic", env=env)
    made.append(head.next())
    r2 = cli("pull", head.remote, link, "--atomic", env=env)
    assert (site / made[0] / "eval" / "results.json").read_text() == '{"acc": 0.9}'
    assert (site / made[1] / edited).read_text().endswith(" ")
    assert "not the version's" in r.stderr + r2.stderr, r.stderr + r2.stderr
    # the next pulls still remove the versions nobody touched
    made.append(head.next())
    cli("pull", "-q", head.remote, link, "--atomic", env=env)
    assert versions_beside(site) == {made[0], made[1], made[-2], made[-1]}


def _race_keep(monkeypatch, site: Path, victim: str, swap) -> None:
    """Run ``swap()`` (what whoever can write the link's parent does) at the
    instant the removal of ``victim`` renames it away: the worst moment
    between the checks and the removal."""
    real = os.rename

    def rename(src, dst, *a, **kw):
        if src == victim and str(dst).startswith(".current.wdiff-old-"):
            monkeypatch.setattr(os, "rename", real)
            swap()
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "rename", rename)


def test_keep_never_removes_a_directory_swapped_in_after_the_checks(env, tmp_path, monkeypatch):
    """Between the checks of an old version and its removal, whoever can
    write the link's parent renames it away and renames the user's own
    directory (the one the link pointed to first) into its place: the
    user's files stay, under their own name or the version's."""
    import wdiff

    head = Head(tmp_path)
    site, link = site_of(tmp_path)
    (site / "start" / "weights.bin").write_bytes(b"user's own work")
    made = []
    for _ in range(2):
        made.append(head.next())
        wdiff.pull(head.remote, link, atomic=True)

    def swap():
        os.rename(site / made[0], site / "moved-away")
        os.rename(site / "start", site / made[0])

    _race_keep(monkeypatch, site, made[0], swap)
    made.append(head.next())
    wdiff.pull(head.remote, link, atomic=True)
    monkeypatch.undo()
    survivors = [p for p in site.rglob("weights.bin")]
    assert [p.read_bytes() for p in survivors] == [b"user's own work"], sorted(os.listdir(site))


def test_keep_empties_nothing_put_at_the_temporary_name(env, tmp_path, monkeypatch):
    """The same race one step later: the old version is renamed to its
    temporary name (which the list, readable by all, names) and the user's
    directory is put there before the tree is deleted."""
    import wdiff

    head = Head(tmp_path)
    site, link = site_of(tmp_path)
    (site / "start" / "weights.bin").write_bytes(b"user's own work")
    made = []
    for _ in range(2):
        made.append(head.next())
        wdiff.pull(head.remote, link, atomic=True)
    real = os.rename

    def rename(src, dst, *a, **kw):
        r = real(src, dst, *a, **kw)
        if src == made[0] and str(dst).startswith(".current.wdiff-old-"):
            monkeypatch.setattr(os, "rename", real)
            real(site / dst, site / "moved-away")
            real(site / "start", site / dst)
        return r

    monkeypatch.setattr(os, "rename", rename)
    made.append(head.next())
    wdiff.pull(head.remote, link, atomic=True)
    monkeypatch.undo()
    survivors = [p for p in site.rglob("weights.bin")]
    assert [p.read_bytes() for p in survivors] == [b"user's own work"], sorted(os.listdir(site))


def _pack(tmp_path: Path, a: dict, b: dict) -> Path:
    from safetensors.torch import save_file

    for name, sd in (("A", a), ("B", b)):
        (tmp_path / name).mkdir()
        save_file({k: v.contiguous().clone() for k, v in sd.items()}, str(tmp_path / name / "model.safetensors"))
    out = tmp_path / "ab.wdiff"
    ok("pack", tmp_path / "A", tmp_path / "B", "-o", out)
    return out


@pytest.mark.parametrize("second", ["flat view", "shifted view", "dtype view"])
def test_apply_into_refuses_two_names_over_overlapping_memory(env, tmp_path, second):
    """A dict holding one memory under two names that are not the same
    tensor (a reshaped view, an overlapping slice, the same bytes read as
    another dtype). The checkpoint has them as two tensors; patching one
    changes the other, so the result would be no version at all. It is
    refused before a byte is written; a true tied alias (the same tensor)
    still applies."""
    import torch

    from wdiff.errors import WdiffError
    from wdiff.live import apply_into

    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 64, generator=g).to(torch.bfloat16)
    views = {"flat view": lambda t: t.view(-1), "shifted view": lambda t: t.view(-1)[64:4160],
             "dtype view": lambda t: t.view(torch.int16)}
    a = {"w": w, "x": views[second](w)}
    b = {"w": w.clone(), "x": a["x"].clone()}
    b["w"][0, :8] += 1  # the target changes w only
    bundle = _pack(tmp_path, a, b)
    before = w.clone()
    with pytest.raises(WdiffError, match="share memory"):
        apply_into(bundle, a)
    assert torch.equal(w, before)


@pytest.mark.parametrize("order", [">", "="])
def test_apply_into_refuses_a_byte_order_the_bundle_does_not_have(env, tmp_path, order):
    """A numpy array in big-endian order ('>f4') is float32 by name but not
    by its bytes: an anchor written into it byte for byte gives other
    numbers than the version it returns. It is refused, nothing written; a
    native-order array applies."""
    import numpy as np
    from safetensors.numpy import save_file

    from wdiff.errors import WdiffError
    from wdiff.live import apply_into

    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 7
    (tmp_path / "B").mkdir()
    save_file({"w": w}, str(tmp_path / "B" / "model.safetensors"))
    anchor = tmp_path / "b.anchor.wdb"
    ok("pack", "--anchor", tmp_path / "B", "-o", anchor)
    live = {"w": np.zeros((64, 64), dtype=np.dtype(f"{order}f4"))}
    if order == "=":
        apply_into(anchor, live)
        assert np.array_equal(live["w"], w)
        return
    with pytest.raises(WdiffError, match="byte order"):
        apply_into(anchor, live)
    assert not live["w"].any()


def test_apply_into_a_non_contiguous_tensor_changes_nothing(env, tmp_path):
    """A transposed (non-contiguous) tensor among contiguous ones, the
    bundle changing both: refused, and no tensor holds a byte of the new
    version (not the contiguous one patched before it either)."""
    import torch

    from wdiff.errors import WdiffError
    from wdiff.live import apply_into

    g = torch.Generator().manual_seed(5)
    a = {"a.first": torch.randn(64, 64, generator=g), "z.last": torch.randn(64, 64, generator=g)}
    b = {k: v.clone() for k, v in a.items()}
    for v in b.values():
        v[3, :9] += 1
    bundle = _pack(tmp_path, a, b)
    live = {"a.first": a["a.first"].clone(), "z.last": a["z.last"].t().contiguous().t()}
    before = {k: v.clone() for k, v in live.items()}
    with pytest.raises(WdiffError):
        apply_into(bundle, live)
    assert all(torch.equal(live[k], before[k]) for k in live)


@pytest.mark.slow
def test_a_pull_killed_between_its_build_and_its_listing_leaks_no_version(env, tmp_path):
    """SIGKILL after the new version directory is in place and before the
    pull lists it (the audit hook kills at the list's write once the
    directory exists): the next pulls still know it as theirs and remove it
    beyond --keep, instead of leaving a whole checkpoint for ever."""
    import subprocess

    from test_pull_atomic_keep import KILLER

    hook = ('if at == "list" and event == "open" and ".wdiff-versions-tmp-" in str(args[0]) '
            'and os.path.isdir(os.environ["KEEP_BUILT"]):')
    kill = KILLER.replace('if at == "rename" and event == "os.rename" and ".wdiff-old-" in str(args[1]):', hook)
    assert kill != KILLER
    head = Head(tmp_path)
    site, link = site_of(tmp_path)
    made = []
    for k in range(4):
        made.append(head.next())
        p = subprocess.run([sys.executable, "-c", kill, "pull", "-q", str(head.remote), str(link), "--atomic"],
                           env=env | {"KEEP_KILL_AT": "list" if k == 1 else "-", "KEEP_BUILT": str(site / made[-1])},
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == (-9 if k == 1 else 0), p.stderr
    assert versions_beside(site) == set(made[-2:]), sorted(os.listdir(site))


def test_apply_into_a_meta_tensor_changes_nothing(env, tmp_path):
    """A tensor with no memory (device 'meta', as a model built under
    init_empty_weights holds before loading) among CPU ones: refused, and
    the CPU tensors keep every byte."""
    import torch

    from wdiff.errors import WdiffError
    from wdiff.live import apply_into

    g = torch.Generator().manual_seed(6)
    a = {"a.first": torch.randn(64, 64, generator=g), "z.last": torch.randn(64, 64, generator=g)}
    b = {k: v.clone() for k, v in a.items()}
    for v in b.values():
        v[5, :9] += 1
    bundle = _pack(tmp_path, a, b)
    live = {"a.first": a["a.first"].clone(), "z.last": torch.empty(64, 64, device="meta")}
    before = live["a.first"].clone()
    with pytest.raises(WdiffError):
        apply_into(bundle, live)
    assert torch.equal(live["a.first"], before)
