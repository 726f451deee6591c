"""gc and the anchor policy, from outside: the real command line, a real
pull process stopped in the middle of its downloads, and the remote's files.

The bar (issue 14): gc on a 200-version chain with labels; every kept
version pulls bit-exact before and after, and a pull running during the gc
completes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from factory import mutate, rand, tree, write_ckpt
from kit.cli import environment, run

import wdiff
from wdiff.errors import ConflictError, IntegrityError
from wdiff.format.chain import Chain

# a pull whose first object download stops until the test says go: a real
# process, holding the chain it read before the gc, in the middle of its run
PAUSED_PULL = r"""
import os, sys, time
from wdiff.remotes import local
real = local.LocalStore.fetch
state = {"n": 0}
def fetch(self, path, dest, **kw):
    state["n"] += path.startswith("objects/") and path.endswith(".wdb")
    if state["n"] == 2 and not os.path.exists(os.environ["WDIFF_TEST_PAUSED"]):
        open(os.environ["WDIFF_TEST_PAUSED"], "w").close()
        while not os.path.exists(os.environ["WDIFF_TEST_GO"]):
            time.sleep(0.02)
    return real(self, path, dest, **kw)
local.LocalStore.fetch = fetch
sys.argv = ["wdiff"] + sys.argv[1:]
from wdiff.cli import run
run()
"""


#: the environment of these tests' commands (and the stage tests'): one thread each, 100 columns
GC_ENV = {"COLUMNS": "100", "WDIFF_THREADS": "1"}
#: the command line in GC_ENV, which must exit 0 unless told another ``want``
cli = partial(run, want=0, env=GC_ENV)


def start_paused_pull(tmp_path: Path, *args) -> tuple[subprocess.Popen, Path, Path]:
    paused, go = tmp_path / "paused", tmp_path / "go"
    for p in (paused, go):
        p.unlink(missing_ok=True)
    env = environment({**GC_ENV, "WDIFF_TEST_PAUSED": paused, "WDIFF_TEST_GO": go})
    proc = subprocess.Popen([sys.executable, "-c", PAUSED_PULL, "pull", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not paused.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the pull never reached its second download"
        time.sleep(0.02)
    return proc, paused, go


def make_chain(tmp_path: Path, n: int, *, labels_every: int = 10, remote: str | None = None,
               sign=None) -> tuple[str, list[Path]]:
    """A chain of ``n`` tiny versions (a 64-element tensor, one element
    changing a step, and a companion file), labelled step-K every few."""
    rng = np.random.default_rng(14)
    t = {"w": rand(rng, "F32", (64,)), "b": rand(rng, "BF16", (8,))}
    remote = remote or str(tmp_path / "remote")
    dirs: list[Path] = []
    for k in range(n):
        d = write_ckpt(tmp_path / "v" / f"{k:03d}", t, companions={"config.json": f'{{"step": {k}}}'.encode()})
        label = f"step-{k}" if k % labels_every == 0 else None
        if k == 0:
            wdiff.push(d, remote, anchor=True, label=label, sign_key=sign)
        else:
            wdiff.push(d, remote, base=dirs[-1], label=label, sign_key=sign)
        dirs.append(Path(d))
        t = {"w": mutate(t["w"], 1 / 64, rng), "b": t["b"]}
    return remote, dirs


def objects(remote: str) -> dict[str, int]:
    root = Path(remote)
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*")
            if p.is_file() and not p.name.startswith(".")}


def pull_exact(remote: str, to: str, want: Path, dest: Path) -> None:
    cli("pull", remote, dest, "--to", to, "-q")
    assert tree(dest) == tree(want), f"{to} did not come back bit-exact"


@pytest.mark.slow
def test_gc_on_200_versions_keeps_every_kept_version_and_a_running_pull(tmp_path):
    remote, dirs = make_chain(tmp_path, 200)
    kept = {"step-50": dirs[50], "step-120": dirs[120]}
    for k in range(195, 200):
        kept[f"HEAD~{199 - k}"] = dirs[k]
    for k, (spec, d) in enumerate(kept.items()):  # before
        pull_exact(remote, spec, d, tmp_path / "before" / str(k))
    old = Chain.decode((Path(remote) / "chain.json").read_bytes(), where="test")
    fingerprints = {spec: old.resolve(spec) for spec in kept}
    size_before = sum(objects(remote).values())

    # a pull that read the old chain and stopped after its first part
    proc, _, go = start_paused_pull(tmp_path, remote, tmp_path / "running", "--to", "step-120")
    # the dry run says what would go, and changes nothing
    chain_bytes = (Path(remote) / "chain.json").read_bytes()
    listing = objects(remote)
    dry = json.loads(cli("gc", remote, "--keep-last", "5", "--keep", "step-50", "--keep", "step-120",
                         "--dry-run", "--json").stdout)
    assert (Path(remote) / "chain.json").read_bytes() == chain_bytes and objects(remote) == listing
    assert dry["dry_run"] and not dry["published"] and dry["deleted"]["objects"] == 0
    assert [(b["from"] is None, b["bundles"]) for b in dry["bridges"]] == [(True, 51), (False, 70), (False, 75)]
    assert len(dry["dropped"]) == 196  # every entry but the 4 deltas among the last 5 versions
    assert dry["pending"]["objects"] == dry["marked"]["objects"] > 190

    r = json.loads(cli("gc", remote, "--keep-last", "5", "--keep", "step-50", "--keep", "step-120",
                       "--json").stdout)
    assert r["published"] and r["deleted"]["objects"] == 0  # phase 2 waits for the grace period
    assert sorted(r["kept"]) == sorted(v.hex() for v in fingerprints.values())
    assert [b["from"] for b in r["bridges"]] == [None, fingerprints["step-50"].hex(), fingerprints["step-120"].hex()]
    pending_bytes = r["pending"]["bytes"]
    assert pending_bytes > 0
    new = Chain.decode((Path(remote) / "chain.json").read_bytes(), where="test")
    assert new.versions == set(fingerprints.values())
    assert len(new.garbage) == r["pending"]["objects"]

    go.touch()  # the running pull goes on with the chain it read before the gc
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (out, err)
    assert tree(tmp_path / "running") == tree(dirs[120])

    # a later gc, past the grace period (here: none), frees the garbage
    r2 = json.loads(cli("gc", remote, "--keep-last", "5", "--keep", "step-50", "--keep", "step-120",
                        "--grace", "0", "--json").stdout)
    assert r2["bridges"] == [] and r2["dropped"] == []
    assert r2["deleted"]["objects"] >= r["pending"]["objects"]
    after = objects(remote)
    assert sum(after.values()) < size_before
    final = Chain.decode((Path(remote) / "chain.json").read_bytes(), where="test")
    named = {p.path for e in final.entries for p in e.parts}
    assert {p for p in after if p.startswith("objects/")} == named  # nothing unreferenced is left
    for k, (spec, d) in enumerate(kept.items()):  # after, into fresh directories
        pull_exact(remote, fingerprints[spec].hex(), d, tmp_path / "after" / str(k))
    # a directory at a kept version catches up with the deltas, not an anchor
    pulled = json.loads(cli("pull", remote, tmp_path / "after" / "1", "--json").stdout)
    assert pulled["bundles"] and not pulled["from_anchor"] and tree(tmp_path / "after" / "1") == tree(dirs[199])
    # a removed version is gone, by name too
    assert cli("pull", remote, tmp_path / "gone", "--to", "step-10", want=3).returncode == 3
    # and gc again has nothing to do
    r3 = json.loads(cli("gc", remote, "--keep-last", "5", "--keep", "step-50", "--keep", "step-120",
                        "--grace", "0", "--json").stdout)
    assert not r3["published"] and r3["deleted"]["objects"] == 0 and r3["dropped"] == []


def test_without_the_grace_period_a_running_pull_loses_its_objects(tmp_path):
    """The control for the test above: --grace 0 deletes at once, and the
    pull that read the old chain fails cleanly (a rerun then succeeds)."""
    remote, dirs = make_chain(tmp_path, 12)
    proc, _, go = start_paused_pull(tmp_path, remote, tmp_path / "running", "--to", "step-10")
    cli("gc", remote, "--keep-last", "1", "--keep", "step-10", "--grace", "0", "-q")
    go.touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, (proc.returncode, out, err)  # not found: the object went
    pull_exact(remote, "step-10", dirs[10], tmp_path / "running")  # the rerun reads the new chain


@pytest.mark.slow
def test_gc_refuses_a_signed_chain_without_a_key_and_re_signs_with_one(tmp_path):
    cli("keygen", tmp_path / "k")
    key, pub = tmp_path / "k", tmp_path / "k.pub"
    remote, dirs = make_chain(tmp_path, 6, labels_every=3, sign=key)
    chain_bytes = (Path(remote) / "chain.json").read_bytes()
    r = cli("gc", remote, "--keep-last", "1", want=4)
    assert "signed" in r.stderr and "--sign" in r.stderr
    assert (Path(remote) / "chain.json").read_bytes() == chain_bytes
    cli("gc", remote, "--keep-last", "2", "--keep", "step-3", "--sign", key, "--grace", "0", "-q")
    for spec, d in (("step-3", dirs[3]), ("HEAD", dirs[5]), ("HEAD~1", dirs[4])):
        cli("pull", remote, tmp_path / spec, "--to", spec, "--trusted-key", pub, "--require-signature", "-q")
        assert tree(tmp_path / spec) == tree(d)
    with pytest.raises(IntegrityError):
        wdiff.gc(remote, keep_last=1)


def test_gc_loses_to_a_push_that_got_in_first(tmp_path, monkeypatch):
    """Phase 1 is a conditional write: a push between gc's read and its
    publish wins, gc exits with the conflict code and changes nothing."""
    remote, _ = make_chain(tmp_path, 5)
    extra = write_ckpt(tmp_path / "extra", {"w": rand(np.random.default_rng(1), "F32", (64,))})
    from wdiff.remotes.local import LocalStore

    real = LocalStore.publish
    raced = []

    def publish(self, uploads, chain, token, **kw):
        if kw.get("message", "").startswith("wdiff gc") and not raced:
            raced.append(1)
            wdiff.push(extra, remote, anchor=True)
        return real(self, uploads, chain, token, **kw)

    monkeypatch.setattr(LocalStore, "publish", publish)
    before = objects(remote)
    with pytest.raises(ConflictError):
        wdiff.gc(remote, keep_last=1, grace=0)
    after = objects(remote)
    assert set(before) <= set(after)  # nothing was deleted
    assert len(wdiff.log(remote).entries) >= 6


@pytest.mark.slow
def test_anchor_every_and_anchor_when(tmp_path):
    rng = np.random.default_rng(3)
    t = {"w": rand(rng, "F32", (4096,))}
    dirs = []
    remote = tmp_path / "r"
    for k in range(7):
        dirs.append(write_ckpt(tmp_path / "v" / str(k), t))
        t = {"w": mutate(t["w"], 0.01, rng)}
    cli("push", "--anchor", dirs[0], remote, "-q")
    anchored = []
    for k in range(1, 7):
        doc = json.loads(cli("push", dirs[k], remote, "--base", dirs[k - 1], "--anchor-every", "3", "--json").stdout)
        anchored.append(doc["anchored"] is not None)
    assert anchored == [False, False, True, False, False, True]
    log = json.loads(cli("log", remote, "--json").stdout)
    assert sum(1 for e in log["entries"] if e["parent"] is None) == 3
    # a fresh machine starts from the newest anchor: one bundle
    doc = json.loads(cli("pull", remote, tmp_path / "fresh", "--json").stdout)
    assert len(doc["bundles"]) == 1 and tree(tmp_path / "fresh") == tree(dirs[6])
    # a machine one version behind still downloads the delta
    cli("pull", remote, tmp_path / "behind", "--to", "HEAD~1", "-q")
    doc = json.loads(cli("pull", remote, tmp_path / "behind", "--json").stdout)
    assert len(doc["bundles"]) == 1 and not doc["from_anchor"] and tree(tmp_path / "behind") == tree(dirs[6])

    # --anchor-when: an anchor once the deltas since the last one pass the fraction of its size
    probe = wdiff.pack(dirs[0], dirs[1], tmp_path / "probe.wdb")
    anchor_probe = wdiff.pack(None, dirs[0], tmp_path / "probe-anchor.wdb")
    fraction = 2.5 * probe.bundle_bytes / anchor_probe.bundle_bytes  # about every third push
    remote2 = tmp_path / "r2"
    cli("push", "--anchor", dirs[0], remote2, "-q")
    anchor_size = json.loads(cli("log", remote2, "--json").stdout)["entries"][0]["size"]
    delta_sizes, anchored = [], []
    for k in range(1, 7):
        doc = json.loads(cli("push", dirs[k], remote2, "--base", dirs[k - 1], "--anchor-when", str(fraction),
                             "--json").stdout)
        delta_sizes.append(doc["bytes"])
        anchored.append(doc["anchored"] is not None)
    # the first push that takes the sum since the newest anchor past 5% gets one
    acc, want = 0, []
    for s in delta_sizes:
        acc += s
        want.append(acc > fraction * anchor_size)
        if want[-1]:
            acc = 0
    assert anchored == want and any(want) and not all(want)
    assert cli("push", dirs[1], remote2, "--anchor", "--anchor-every", "2", want=2).returncode == 2
    assert cli("push", dirs[1], remote2, "--anchor-every", "0", "--base", dirs[0], want=2).returncode == 2


def test_a_hostile_garbage_list_cannot_make_gc_delete_what_is_named_or_outside(tmp_path):
    from wdiff.errors import FormatError
    from wdiff.format.chain import Garbage
    from wdiff.format.records import canonical_json

    remote, dirs = make_chain(tmp_path, 4)
    path = Path(remote) / "chain.json"
    obj = json.loads(path.read_bytes())
    for bad in ("chain.json", "../outside", "objects/../chain.json", "notes.txt", "/etc/passwd", ""):
        hostile = dict(obj, garbage=[{"path": bad, "size": 1, "since": "2000-01-01T00:00:00Z"}])
        with pytest.raises(FormatError):
            Chain.decode(canonical_json(hostile) + b"\n", where="test")
    for bad in ({"path": "objects/x", "size": -1, "since": "2000-01-01T00:00:00Z"},
                {"path": "objects/x", "size": 1, "since": "yesterday"},
                {"path": "objects/x", "size": 1, "since": "2000-01-01T00:00:00Z", "extra": 1}):
        with pytest.raises(FormatError):
            Chain.decode(canonical_json(dict(obj, garbage=[bad])) + b"\n", where="test")
    # a list that says every object has long been garbage: gc still deletes only what no entry names
    chain = Chain.decode(path.read_bytes(), where="test")
    named = [p.path for e in chain.entries for p in e.parts]
    planted = Chain(chain.head, chain.entries, chain.lineage,
                    tuple(Garbage(p, s, "2000-01-01T00:00:00Z") for p, s in objects(remote).items() if p in named))
    path.write_bytes(planted.encode())
    (Path(remote) / "notes.txt").write_text("mine")
    cli("gc", remote, "--keep-last", "4", "--grace", "0", "-q")
    assert set(named) <= set(objects(remote)) and (Path(remote) / "notes.txt").read_text() == "mine"
    assert Chain.decode(path.read_bytes(), where="test").garbage == ()  # named again: off the list
    pull_exact(remote, "HEAD~3", dirs[0], tmp_path / "p")
