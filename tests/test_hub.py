"""Hub-specific behaviour of push and pull, against the local stand-in Hub
(hubfake.py) that the real huggingface_hub client talks to: faults, races,
credentials, and the command line end to end."""

import json
import threading
from functools import partial

import kit.cli
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_cli_against_the_hub(hub, versions, tmp_path):
    """The installed console script, in a subprocess, with the environment
    configure_client set (HF_ENDPOINT, HF_TOKEN, ...)."""
    run = partial(kit.cli.run, script=True, text=False)

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
    r = run("push", "--anchor", versions[2], "hf://acme/other", env={"HF_TOKEN": "hf_bad_token"})
    assert r.returncode == 7 and b"hf_bad_token" not in r.stderr


# -- the Hub as its users know it: visibility, tokens, branches, folders, card, progress, resume --


class Recording(wdiff.Reporter):
    """Every progress event, in order, through the library's Reporter interface."""

    def __init__(self):
        self.events = []
        self.threads = set()

    def phase(self, name, total=None):
        self.events.append(("phase", name, total))

    def file(self, name, size):
        self.events.append(("file", name, size))

    def advance(self, n):
        self.threads.add(threading.get_ident())
        self.events.append(("advance", n))

    def warn(self, message):
        self.events.append(("warn", message))

    def advances_in(self, phase):
        """The byte counts advanced during the phase called ``phase`` (each time it starts)."""
        out, inside = [], False
        for ev in self.events:
            if ev[0] == "phase":
                inside = ev[1] == phase
            elif ev[0] == "advance" and inside:
                out.append(ev[1])
        return out


def test_first_push_creates_a_private_repository_and_says_so(hub, versions, tmp_path, monkeypatch):
    rec = Recording()
    wdiff.push(versions[0], URL, anchor=True, reporter=rec)
    assert hub.repo("acme/deltas").private is True
    assert any(ev[0] == "warn" and "private" in ev[1] and "--public" in ev[1] for ev in rec.events)
    # the Hub hides it from anyone without a token: an anonymous pull finds nothing
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(NotFoundError) as e:
        wdiff.pull(URL, tmp_path / "anon")
    # as the Hub answers a request without a token: 401 "RepoNotFound", private or missing alike
    assert any(r.status == 401 and not r.authorized and "/api/models/acme/deltas" in r.path for r in hub.log)
    # so the message says it may be private and the hint how to log in (`hf download` says as much)
    assert "private" in e.value.message and "no Hub token was sent" in e.value.message
    assert "hf auth login" in e.value.hint and "HF_TOKEN" in e.value.hint

    wdiff.push(versions[0], "hf://acme/open", anchor=True, private=False, token=hub.token)
    assert hub.repo("acme/open").private is False
    wdiff.pull("hf://acme/open", tmp_path / "anon")  # no token at all: public
    assert tree(tmp_path / "anon") == tree(versions[0])


@pytest.mark.slow
def test_token_is_used_and_never_printed(hub, versions, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")  # the explicit token wins over the environment
    wdiff.push(versions[0], URL, anchor=True, token=hub.token)
    wdiff.pull(URL, tmp_path / "d", token=hub.token)
    assert tree(tmp_path / "d") == tree(versions[0])
    with pytest.raises(AuthError):
        wdiff.pull(URL, tmp_path / "e")  # HF_TOKEN alone is still honoured (and is wrong here)

    run = partial(kit.cli.run, script=True, text=False, env={"HF_TOKEN": None})
    r = run("push", versions[1], URL, "--base", versions[0], "--token", hub.token, "--commit-message", "step one", "-v")
    assert r.returncode == 0, r.stderr
    assert hub.token.encode() not in r.stdout + r.stderr
    assert hub.repo("acme/deltas").commits[hub.head("acme/deltas")].title == "step one"
    r = run("pull", URL, tmp_path / "d", "--token", "hf_not_this_one")
    assert r.returncode == 7 and b"hf_not_this_one" not in r.stdout + r.stderr
    r = run("pull", "-q", URL, tmp_path / "d", "--token", hub.token)
    assert r.returncode == 0 and r.stdout == b"" and r.stderr == b"", r.stderr
    assert tree(tmp_path / "d") == tree(versions[1])


def test_at_branch_creates_it_from_main_and_keeps_main_alone(hub, versions, tmp_path):
    wdiff.push(versions[0], URL, anchor=True)
    main_before = hub.head("acme/deltas")
    with pytest.raises(NotFoundError):
        wdiff.log(URL + "@dev")  # reading a branch that does not exist does not create it
    wdiff.push(versions[1], URL + "@dev", base=versions[0], label="v1")  # starts from main's chain
    repo = hub.repo("acme/deltas")
    # two commits on main's head: the parts, then the chain that names that commit
    assert "dev" in repo.branches and repo.commits[repo.commits[repo.branches["dev"]].parent].parent == main_before
    assert hub.head("acme/deltas") == main_before
    assert [e.label for e in wdiff.log(URL + "@dev").entries] == ["v1", None]
    assert len(wdiff.log(URL).entries) == 1
    wdiff.pull(URL + "@dev", tmp_path / "d")
    assert tree(tmp_path / "d") == tree(versions[1])
    # a new repository pushed at a branch gets both main and the branch
    wdiff.push(versions[0], "hf://acme/fresh@exp", anchor=True)
    assert set(hub.repo("acme/fresh").branches) == {"main", "exp"}
    assert wdiff.log("hf://acme/fresh@exp").head is not None
    assert not any(p.startswith("wdiff/") for p in hub.files("acme/fresh", "main"))


@pytest.mark.parametrize("kind", ["model", "dataset"])
def test_subfolder_round_trips(hub, versions, tmp_path, kind):
    prefix = "datasets/" if kind == "dataset" else ""
    url = f"hf://{prefix}acme/multi@main/policies/small"
    wdiff.push(versions[0], url, anchor=True)
    wdiff.push(versions[1], url, base=versions[0])
    other = f"hf://{prefix}acme/multi/policies/large"  # another chain beside it, no @REV
    wdiff.push(versions[2], other, anchor=True)
    files = hub.files("acme/multi", repo_type=kind)
    assert "policies/small/chain.json" in files and "policies/large/chain.json" in files
    assert not any(p.startswith("wdiff/") for p in files)
    wdiff.pull(url, tmp_path / "s")
    wdiff.pull(other, tmp_path / "l")
    assert tree(tmp_path / "s") == tree(versions[1]) and tree(tmp_path / "l") == tree(versions[2])
    assert len(wdiff.log(url).entries) == 2 and len(wdiff.log(other).entries) == 1
    with pytest.raises(wdiff.WdiffError):
        wdiff.log(f"hf://{prefix}acme/multi/../x")


def test_model_card_is_written_once_in_the_first_commit(hub, versions):
    wdiff.push(versions[0], URL, anchor=True)
    files = hub.files("acme/deltas")
    assert "README.md" in files
    head = hub.repo("acme/deltas").commits[hub.head("acme/deltas")]
    assert "wdiff/chain.json" in head.files and "README.md" in hub.repo("acme/deltas").commits[head.oid].files
    first_commit_files = set(head.files) - set(hub.repo("acme/deltas").commits[head.parent].files)
    assert {"README.md", "wdiff/chain.json"} <= first_commit_files  # one commit: card and chain together
    card = hub.read_file("acme/deltas", "README.md").decode()
    assert "wdiff pull hf://acme/deltas" in card
    from huggingface_hub import HfApi

    info = HfApi(endpoint=hub.endpoint, token=hub.token).model_info("acme/deltas")
    assert "wdiff" in info.tags and info.card_data is not None and "wdiff" in info.card_data.tags

    # the owner edits it; later pushes, and a new chain in a subfolder, leave it alone
    from huggingface_hub import CommitOperationAdd

    HfApi(endpoint=hub.endpoint, token=hub.token).create_commit(
        "acme/deltas", operations=[CommitOperationAdd("README.md", b"# our policy\n")], commit_message="card")
    wdiff.push(versions[1], URL, base=versions[0])
    wdiff.push(versions[2], URL + "/other", anchor=True)
    assert hub.read_file("acme/deltas", "README.md") == b"# our policy\n"


def test_progress_moves_with_the_bytes(tmp_path, monkeypatch):
    """Upload and download report bytes as they move (several growing events
    per part, not one at the end), on the operation's thread, with the
    client's own progress bars left on for the rest of the process."""
    from huggingface_hub import constants
    from huggingface_hub.utils import are_progress_bars_disabled

    rng = np.random.default_rng(9)
    big = write_ckpt(tmp_path / "big", {"w": rand(rng, "BF16", (1200, 1200))})  # ~2.9 MB, incompressible
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    for mode in ("xet", "lfs"):
        block_internet(monkeypatch)
        with FakeHub(tmp_path / f"hub-{mode}") as h:
            configure_client(monkeypatch, h, xet=mode == "xet", home=tmp_path / f"home-{mode}", progress_bars=True)
            url = f"hf://acme/{mode}"
            rec = Recording()
            res = wdiff.push(big, url, anchor=True, reporter=rec)
            up = rec.advances_in("upload")
            assert sum(up) == res.bytes and len(up) >= 2, (mode, up)
            assert ("file", wdiff.log(url).entries[0].parts[0].path, res.bytes) in rec.events
            rec = Recording()
            wdiff.pull(url, tmp_path / f"d-{mode}", reporter=rec)
            down = rec.advances_in("download")
            assert sum(down) == res.bytes and len(down) >= res.bytes // (64 * 1024), (mode, len(down))
            assert rec.threads == {threading.get_ident()}
            assert not are_progress_bars_disabled()
            assert not h.unhandled, h.unhandled


def test_killed_download_resumes_from_the_bytes_it_has(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    rng = np.random.default_rng(11)
    big = write_ckpt(tmp_path / "big", {"w": rand(rng, "BF16", (1200, 1200))})
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    res = wdiff.push(big, URL, anchor=True)
    part = wdiff.log(URL).entries[0].parts[0].path

    class Killer(Recording):
        def advance(self, n):
            super().advance(n)
            if sum(self.advances_in("download")) > res.bytes // 2:
                raise KeyboardInterrupt  # Ctrl-C (or a SIGKILL) in the middle of the part

    d = tmp_path / "d"
    with pytest.raises(KeyboardInterrupt):
        wdiff.pull(URL, d, reporter=Killer())
    partial = [p for p in (d / ".wdiff" / "pull").iterdir() if ".part" in p.name]
    assert len(partial) == 1
    have = partial[0].stat().st_size  # what reached the file (the fake sent a little more into the socket)
    served = lambda recs: sum(r.sent for r in recs if r.path.endswith(part))  # noqa: E731
    assert res.bytes // 3 < have < res.bytes and served(hub.log) >= have
    before = len(hub.log)
    wdiff.pull(URL, d)
    again = [r for r in hub.log[before:] if r.path.endswith(part) and r.method == "GET"]
    assert [r.range for r in again] == [f"bytes={have}-"]
    assert served(again) == res.bytes - have
    assert tree(d) == tree(big)


def test_damaged_partial_download_is_discarded(hub, tmp_path, monkeypatch):
    rng = np.random.default_rng(12)
    big = write_ckpt(tmp_path / "big", {"w": rand(rng, "BF16", (600, 600))})
    res = wdiff.push(big, URL, anchor=True)
    part = wdiff.log(URL).entries[0].parts[0].path
    hub.faults.short_download(part, res.bytes // 3)  # a clean but short answer: the run fails, the prefix stays
    d = tmp_path / "d"
    with pytest.raises(RemoteError):
        wdiff.pull(URL, d)
    partial = [p for p in (d / ".wdiff" / "pull").iterdir() if ".part" in p.name]
    assert len(partial) == 1 and partial[0].stat().st_size == res.bytes // 3
    data = bytearray(partial[0].read_bytes())
    data[10] ^= 0x40  # the disk (or a bad earlier answer) damaged what was kept
    partial[0].write_bytes(bytes(data))
    before = len(hub.log)
    rec = Recording()
    wdiff.pull(URL, d, reporter=rec)
    gets = [r for r in hub.log[before:] if r.path.endswith(part) and r.method == "GET"]
    assert [r.range for r in gets] == [f"bytes={res.bytes // 3}-", None]  # resumed, refused, fetched whole
    assert any(ev[0] == "warn" and "again" in ev[1] for ev in rec.events)
    assert tree(d) == tree(big)


def _fail_chain_commits(monkeypatch):
    """Every commit that writes chain.json fails as a dropped connection
    would; commits of parts go through: a push that dies between its two
    commits."""
    from wdiff.remotes.hub import RepoStore

    real = RepoStore._commit_once

    def commit_once(self, ops, parent, message):
        if any(op.path_in_repo.endswith("/chain.json") for op in ops):
            raise RemoteError(f"{self.url}: commit: the connection dropped (test)")
        return real(self, ops, parent, message)

    monkeypatch.setattr(RepoStore, "_commit_once", commit_once)


def test_push_that_dies_between_its_commits_leaves_only_unreferenced_parts(hub, versions, tmp_path,
                                                                           monkeypatch):
    wdiff.push(versions[0], URL, anchor=True)
    before = wdiff.log(URL)
    with monkeypatch.context() as m:
        _fail_chain_commits(m)
        with pytest.raises(RemoteError):
            wdiff.push(versions[1], URL, base=versions[0])
    after = wdiff.log(URL)
    assert after.entries == before.entries and after.head == before.head  # readers see the old chain
    named = {f"wdiff/{p.path}" for e in after.entries for p in e.parts}
    stray = {p for p in hub.files("acme/deltas") if p.startswith("wdiff/objects/")} - named
    assert stray  # the parts went up, and no chain names them
    # the rerun finds them on the branch (huggingface_hub then commits nothing and
    # answers with the head): the chain it writes names a commit that holds them
    wdiff.push(versions[1], URL, base=versions[0])
    repo = hub.repo("acme/deltas")
    for p in wdiff.log(URL).entries[-1].parts:
        assert f"wdiff/{p.path}" in repo.commits[p.commit].files
    wdiff.pull(URL, tmp_path / "d")
    assert tree(tmp_path / "d") == tree(versions[1])


def test_rerun_whose_parts_commit_is_empty_still_refuses_a_newer_chain(hub, versions, tmp_path, monkeypatch):
    """A commit of parts the branch already has is no commit: huggingface_hub
    answers with the branch's head, past any chain pushed meanwhile. The
    chain commit built on it must not overwrite that chain."""
    from wdiff.remotes.hub import RepoStore

    wdiff.push(versions[0], URL, anchor=True)
    wdiff.pack(versions[0], versions[1], tmp_path / "a.wdb")
    wdiff.pack(versions[0], versions[2], tmp_path / "b.wdb")
    with monkeypatch.context() as m:
        _fail_chain_commits(m)
        with pytest.raises(RemoteError):
            wdiff.push(tmp_path / "a.wdb", URL)  # a's parts are on the branch, unreferenced
    real = RepoStore.publish_placed
    raced = []

    def racing(self, *a, **kw):
        if not raced:  # a has read the chain; b gets in first
            raced.append(1)
            wdiff.push(tmp_path / "b.wdb", URL)
        return real(self, *a, **kw)

    monkeypatch.setattr(RepoStore, "publish_placed", racing)
    with pytest.raises(wdiff.errors.ConflictError):
        wdiff.push(tmp_path / "a.wdb", URL)
    log = wdiff.log(URL)
    assert len(log.entries) == 2 and log.head == wdiff.inspect(tmp_path / "b.wdb").target_fingerprint


def test_hub_chain_is_read_with_one_bounded_get(hub, versions, monkeypatch):
    from wdiff.errors import FormatError
    from wdiff.remotes.hub import transfer

    wdiff.push(versions[0], URL, anchor=True)
    start = len(hub.log)
    wdiff.log(URL)
    routes = [r.route for r in hub.log[start:]]
    assert routes.count("resolve") == 1 and "paths_info" not in routes
    assert not any(r.method == "HEAD" for r in hub.log[start:])
    monkeypatch.setattr(transfer, "MAX_CHAIN_OBJECT", 100)  # a chain larger than the limit is refused
    with pytest.raises(FormatError, match="larger than this wdiff accepts"):
        wdiff.log(URL)
