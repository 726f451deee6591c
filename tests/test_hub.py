"""Hub-specific behaviour of push and pull, against the local stand-in Hub
(hubfake.py) that the real huggingface_hub client talks to: faults, races,
credentials, and the command line end to end."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from factory import mutate, rand, tree, write_ckpt
from hubfake import FakeHub, block_internet, configure_client

import wdiff
from wdiff.errors import AuthError, IntegrityError, NotFoundError, RemoteError

URL = "hf://acme/deltas"


@pytest.fixture(params=["xet", "lfs"])
def hub(request, tmp_path, monkeypatch):
    refused = block_internet(monkeypatch)
    with FakeHub(tmp_path / "hub") as h:
        configure_client(monkeypatch, h, xet=request.param == "xet", home=tmp_path / "hf_home")
        yield h
        assert not h.unhandled, h.unhandled
    assert not refused, refused


@pytest.fixture
def versions(tmp_path):
    rng = np.random.default_rng(5)
    v = {"w": rand(rng, "BF16", (600, 600)), "b": rand(rng, "F32", (100,))}
    out = []
    for k in range(3):
        out.append(write_ckpt(tmp_path / f"v{k}", v, companions={"config.json": f"{k}".encode()}))
        v = {n: mutate(t, 0.02, rng) for n, t in v.items()}
    return out


def test_commit_503_is_retried_then_reported(hub, versions):
    hub.faults.fail("commit", status=503, times=1)
    wdiff.push(versions[0], URL, anchor=True)  # one 503: our own retry gets through
    assert wdiff.log(URL).head is not None
    hub.faults.fail("commit", status=503, times=10)
    with pytest.raises(RemoteError):
        wdiff.push(versions[1], URL, base=versions[0])
    assert len(wdiff.log(URL).entries) == 1  # nothing half-pushed is visible
    hub.faults.clear()
    wdiff.push(versions[1], URL, base=versions[0])
    assert len(wdiff.log(URL).entries) == 2


def test_upload_503_once_is_survived(hub, versions):
    hub.faults.fail("upload", status=503, times=1)
    wdiff.push(versions[0], URL, anchor=True)
    assert len(wdiff.log(URL).entries) == 1


def test_concurrent_pushes_one_wins(hub, versions, tmp_path):
    import wdiff

    wdiff.push(versions[0], URL, anchor=True)
    wdiff.pack(versions[0], versions[1], tmp_path / "a.wdb")
    wdiff.pack(versions[0], versions[2], tmp_path / "b.wdb", level=5)
    results = {}
    barrier = threading.Barrier(2)

    from wdiff.remotes.hub import RepoStore

    real = RepoStore.publish

    def synced(self, *a, **kw):
        barrier.wait(timeout=30)  # both have read the chain before either writes
        return real(self, *a, **kw)

    RepoStore.publish = synced
    try:
        def go(name):
            try:
                results[name] = wdiff.push(tmp_path / f"{name}.wdb", URL)
            except Exception as e:  # noqa: BLE001
                results[name] = e

        ts = [threading.Thread(target=go, args=(n,)) for n in ("a", "b")]
        [t.start() for t in ts]
        [t.join(60) for t in ts]
    finally:
        RepoStore.publish = real
    outcomes = sorted(type(r).__name__ for r in results.values())
    assert outcomes == ["ConflictError", "PushResult"], results
    assert len(wdiff.log(URL).entries) == 2


def test_truncated_and_corrupted_downloads(hub, versions, tmp_path):
    wdiff.push(versions[0], URL, anchor=True)
    part = wdiff.log(URL).entries[0].parts[0].path
    hub.faults.corrupt_download(part)
    d = tmp_path / "d"
    with pytest.raises(IntegrityError):
        wdiff.pull(URL, d)
    assert not d.exists()  # the pull created d and failed: nothing of it is left
    hub.faults.short_download(part, 1000)
    with pytest.raises((RemoteError, IntegrityError)):
        wdiff.pull(URL, d)
    hub.faults.clear()
    wdiff.pull(URL, d)
    assert tree(d) == tree(versions[0])


def test_up_to_date_pull_downloads_no_part(hub, versions, tmp_path):
    wdiff.push(versions[0], URL, anchor=True)
    d = tmp_path / "d"
    wdiff.pull(URL, d)
    before = len(hub.log)
    r = wdiff.pull(URL, d)
    assert r.up_to_date and r.downloaded == 0
    fetched = [rec.path for rec in hub.log[before:] if "/objects/" in rec.path]
    assert fetched == []  # the chain index only, no part


def test_credentials_and_missing_remotes(hub, versions, tmp_path, monkeypatch):
    with pytest.raises(NotFoundError):
        wdiff.pull("hf://acme/nothing-here", tmp_path / "d")
    with pytest.raises(NotFoundError):
        wdiff.log("hf://acme/nothing-here@no-such-branch")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(AuthError):
        wdiff.push(versions[0], URL, anchor=True)


def test_cli_against_the_hub(hub, versions, tmp_path):
    """The installed console script, in a subprocess, with the environment
    configure_client set (HF_ENDPOINT, HF_TOKEN, ...)."""
    exe = Path(sys.executable).parent / "wdiff"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "wdiff"]

    def run(*args):
        return subprocess.run(cmd + [str(a) for a in args], capture_output=True, env=os.environ.copy(), timeout=300)

    r = run("push", "--anchor", versions[0], URL, "--label", "v0")
    assert r.returncode == 0, r.stderr
    r = run("push", versions[1], URL, "--base", versions[0], "--label", "v1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["schema"] == "wdiff.push/1"
    r = run("push", versions[2], URL, "--base", versions[0])  # not the head
    assert r.returncode == 5
    r = run("pull", "-q", URL, tmp_path / "d")
    assert r.returncode == 0 and r.stdout == b"" and r.stderr == b"", r.stderr
    assert tree(tmp_path / "d") == tree(versions[1])
    r = run("log", URL)
    assert r.returncode == 0 and b"v1" in r.stdout and b"anchor" in r.stdout
    r = run("status", "--exit-code", tmp_path / "d", URL)
    assert r.returncode == 0 and b"up to date" in r.stdout
    r = run("pull", "hf://acme/missing", tmp_path / "e")
    assert r.returncode == 3
    assert b"hf_fake_token" not in r.stderr + r.stdout
    env = dict(os.environ, HF_TOKEN="hf_bad_token")
    r = subprocess.run(cmd + ["push", "--anchor", str(versions[2]), "hf://acme/other"], capture_output=True, env=env, timeout=300)
    assert r.returncode == 7 and b"hf_bad_token" not in r.stderr
