"""The real huggingface_hub client (and hf_xet) against FakeHub, with Xet and with HF_HUB_DISABLE_XET=1.

These tests pin down the client behaviour wdiff's remote code relies on: how errors surface, what
``.oid``/``.sha`` look like, what is (not) verified on download, and how downloads resume.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import threading

import pytest
from hubfake import FakeHub, NetworkBlocked, block_internet, configure_client
from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    constants,
    hf_hub_download,
    snapshot_download,
)
from huggingface_hub.errors import (
    BucketNotFoundError,
    EntryNotFoundError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder

# the client's own LFS PUT passes a file object as `data=`, which httpx2 deprecates: not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")

SHA1 = re.compile(r"[0-9a-f]{40}")
REPO = "org/ckpt"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def no_internet(monkeypatch):
    attempts = block_internet(monkeypatch)
    yield attempts
    assert attempts == [], f"something tried to leave 127.0.0.1: {attempts}"


@pytest.fixture(params=["xet", "lfs"])
def hub(request, tmp_path, monkeypatch, no_internet):
    """A running FakeHub and a client configured for it: Xet uploads, or HF_HUB_DISABLE_XET=1."""
    with FakeHub(tmp_path / "hub") as hub:
        configure_client(monkeypatch, hub, xet=request.param == "xet", home=tmp_path / "hf_home")
        hub.mode = request.param
        yield hub
        assert hub.unhandled == [], hub.unhandled
        assert hub.errors == [], hub.errors


@pytest.fixture
def api(hub):
    return HfApi(endpoint=hub.endpoint, token=hub.token)


@pytest.fixture
def repo(api):
    api.create_repo(REPO, exist_ok=True)
    return REPO


def download(hub, filename, dest, revision=None, repo_type=None, token=None, repo_id=REPO) -> bytes:
    path = hf_hub_download(
        repo_id,
        filename,
        repo_type=repo_type,
        revision=revision,
        local_dir=dest,
        endpoint=hub.endpoint,
        token=token or hub.token,
    )
    with open(path, "rb") as f:
        return f.read()


def commit(api, ops, message="update", **kw):
    return api.create_commit(REPO, operations=ops, commit_message=message, **kw)


def assert_transport(hub, uploads: int):
    """Uploads went through the protocol the mode selects, and only that one."""
    if hub.mode == "xet":
        assert hub.count("xet_write_token") == uploads and hub.count("lfs_upload") == 0
    else:
        assert hub.count("lfs_upload") == uploads and hub.count("xet_write_token") == 0


# --------------------------------------------------------------------------------------------------
# repositories
# --------------------------------------------------------------------------------------------------


def test_create_repo_and_repo_info(api, hub):
    url = api.create_repo(REPO, exist_ok=True)
    assert url.repo_id == REPO and url.repo_type == "model"
    assert api.create_repo(REPO, exist_ok=True).repo_id == REPO  # 409 + exist_ok
    with pytest.raises(HfHubHTTPError) as e:
        api.create_repo(REPO)
    assert e.value.response.status_code == 409

    ds = api.create_repo("org/data", repo_type="dataset", private=True)
    assert ds.repo_type == "dataset"
    assert api.repo_info("org/data", repo_type="dataset").private is True

    info = api.repo_info(REPO, repo_type="model", revision="main")
    assert SHA1.fullmatch(info.sha)  # a fresh repo already has a commit (the Hub's .gitattributes)
    assert [s.rfilename for s in info.siblings] == [".gitattributes"]
    assert api.repo_info(REPO, revision=info.sha).sha == info.sha

    with pytest.raises(RepositoryNotFoundError):
        api.repo_info("org/missing")
    with pytest.raises(RepositoryNotFoundError):  # right id, wrong type
        api.repo_info(REPO, repo_type="dataset")
    with pytest.raises(RevisionNotFoundError):
        api.repo_info(REPO, revision="no-such-branch")
    with pytest.raises(RepositoryNotFoundError) as e:  # private repos are invisible without a token
        HfApi(endpoint=hub.endpoint, token=False).repo_info("org/data", repo_type="dataset")
    # as the Hub answers: 401 to a request without a token, private or missing alike; 404 with one
    assert e.value.response.status_code == 401
    with pytest.raises(RepositoryNotFoundError) as e:
        HfApi(endpoint=hub.endpoint, token=False).repo_info("org/missing")
    assert e.value.response.status_code == 401
    with pytest.raises(RepositoryNotFoundError) as e:
        api.repo_info("org/missing")
    assert e.value.response.status_code == 404


def test_commit_then_download_new_and_old_revisions(api, hub, repo, tmp_path):
    big_v1, meta_v1 = os.urandom(3_000_000), b'{"step": 1}'
    sha0 = api.repo_info(repo).sha

    info1 = commit(api, [CommitOperationAdd("model.bin", big_v1), CommitOperationAdd("meta.json", meta_v1)], "step 1")
    assert SHA1.fullmatch(info1.oid) and info1.oid != sha0
    assert api.repo_info(repo).sha == info1.oid == hub.head(repo)
    assert info1.commit_url.endswith(f"/{repo}/commit/{info1.oid}")
    assert_transport(hub, uploads=1)
    entries = hub.files(repo)
    assert entries["model.bin"].lfs and not entries["meta.json"].lfs  # big binary via LFS/Xet, JSON inline
    assert (entries["model.bin"].xet_hash is not None) == (hub.mode == "xet")

    # second commit from a local path this time, parent_commit = the head we know
    big_v2 = os.urandom(3_000_000)
    (tmp_path / "model.bin").write_bytes(big_v2)
    info2 = commit(
        api,
        [CommitOperationAdd("model.bin", str(tmp_path / "model.bin")), CommitOperationAdd("meta.json", b'{"step": 2}')],
        "step 2",
        parent_commit=info1.oid,
    )
    assert api.repo_info(repo).sha == info2.oid != info1.oid

    # latest (branch), pinned new sha, pinned old sha: each sees its own content
    assert download(hub, "model.bin", tmp_path / "main") == big_v2
    assert download(hub, "meta.json", tmp_path / "new", revision=info2.oid) == b'{"step": 2}'
    assert download(hub, "model.bin", tmp_path / "old", revision=info1.oid) == big_v1
    assert download(hub, "meta.json", tmp_path / "old", revision=info1.oid) == meta_v1
    with pytest.raises(RemoteEntryNotFoundError):  # the file did not exist at the first commit
        download(hub, "model.bin", tmp_path / "first", revision=sha0)

    # a pinned sha already in local_dir is not fetched again: no HTTP at all
    before = sum(hub.requests.values())
    assert download(hub, "model.bin", tmp_path / "old", revision=info1.oid) == big_v1
    assert sum(hub.requests.values()) == before

    # Xet clients fetch Xet files from the CAS (no GET on /resolve); LFS clients GET /resolve
    if hub.mode == "xet":
        assert hub.count("resolve", "GET") == 2 and hub.count("xet_read_token") >= 1  # the two meta.json
    else:
        assert hub.count("resolve", "GET") == 4 and hub.count("xet_read_token") == 0


def test_unchanged_files_are_skipped_by_the_client(api, hub, repo):
    data = os.urandom(100_000)
    first = commit(api, [CommitOperationAdd("a.bin", data)])
    # preupload reports the remote oid; the client drops the no-op add and makes NO commit at all,
    # returning the current head instead (even with a parent_commit: a stale one would not be noticed)
    again = commit(api, [CommitOperationAdd("a.bin", data)], parent_commit="0" * 40)
    assert again.oid == first.oid == hub.head(repo)
    assert hub.count("commit") == 1


def test_stale_parent_commit_is_refused_with_412(api, hub, repo, tmp_path):
    base = commit(api, [CommitOperationAdd("meta.json", b'{"v": 1}')]).oid
    winner = commit(api, [CommitOperationAdd("meta.json", b'{"v": 2}')], parent_commit=base).oid
    uploads = hub.count("lfs_upload") + hub.count("xet_write_token")

    with pytest.raises(HfHubHTTPError) as e:
        commit(
            api,
            [CommitOperationAdd("model.bin", os.urandom(200_000)), CommitOperationAdd("meta.json", b'{"v": 3}')],
            parent_commit=base,
        )
    assert e.value.response.status_code == 412
    assert not isinstance(e.value, (RepositoryNotFoundError, RevisionNotFoundError))
    # nothing changed: same head, same tree (the blob was uploaded before the commit was refused)
    assert api.repo_info(repo).sha == winner == hub.head(repo)
    assert sorted(api.list_repo_files(repo)) == [".gitattributes", "meta.json"]
    assert download(hub, "meta.json", tmp_path / "d") == b'{"v": 2}'
    assert hub.count("lfs_upload") + hub.count("xet_write_token") == uploads + 1


def test_commit_is_all_or_nothing(api, hub, repo):
    head = commit(api, [CommitOperationAdd("keep.json", b"{}")]).oid
    with pytest.raises(RemoteEntryNotFoundError) as e:  # the delete fails => the add is not applied either
        commit(api, [CommitOperationAdd("new.bin", os.urandom(50_000)), CommitOperationDelete("missing.json")])
    assert e.value.response.status_code == 404
    assert hub.head(repo) == head
    assert "new.bin" not in api.list_repo_files(repo)

    after = commit(api, [CommitOperationDelete("keep.json")], parent_commit=head).oid
    assert after != head and "keep.json" not in api.list_repo_files(repo)
    assert "keep.json" in hub.files(repo, head)  # the old commit's tree is untouched


def test_refs_and_history(api, hub, repo):
    first = api.repo_info(repo).sha
    c1 = commit(api, [CommitOperationAdd("a.json", b"1")], "step 1").oid
    c2 = commit(api, [CommitOperationAdd("a.json", b"2")], "step 2").oid
    refs = api.list_repo_refs(repo)
    assert [(b.name, b.target_commit) for b in refs.branches] == [("main", c2)]
    history = api.list_repo_commits(repo)
    assert [c.commit_id for c in history] == [c2, c1, first]
    assert [c.title for c in history][:2] == ["step 2", "step 1"]


def test_list_tree_and_paths_info(api, hub, repo):
    commit(
        api,
        [
            CommitOperationAdd("meta.json", b"{}"),
            CommitOperationAdd("deltas/000001.bin", os.urandom(20_000)),
            CommitOperationAdd("deltas/sub/000002.bin", os.urandom(20_000)),
        ],
    )
    tree = list(api.list_repo_tree(repo, recursive=True))
    assert sorted(f.path for f in tree if isinstance(f, RepoFile)) == [
        ".gitattributes",
        "deltas/000001.bin",
        "deltas/sub/000002.bin",
        "meta.json",
    ]
    assert sorted(f.path for f in tree if isinstance(f, RepoFolder)) == ["deltas", "deltas/sub"]
    files = {f.path: f for f in tree if isinstance(f, RepoFile)}
    assert files["deltas/000001.bin"].lfs.sha256 == sha256(hub.read_file(repo, "deltas/000001.bin"))
    assert files["meta.json"].lfs is None and files["meta.json"].blob_id == hub.files(repo)["meta.json"].git_oid

    top = list(api.list_repo_tree(repo))  # not recursive
    assert sorted(f.path for f in top) == [".gitattributes", "deltas", "meta.json"]
    sub = list(api.list_repo_tree(repo, path_in_repo="deltas", recursive=False))
    assert sorted(f.path for f in sub) == ["deltas/000001.bin", "deltas/sub"]
    with pytest.raises(RemoteEntryNotFoundError):
        list(api.list_repo_tree(repo, path_in_repo="nope"))

    assert sorted(api.list_repo_files(repo)) == sorted(files)
    info = api.get_paths_info(repo, ["meta.json", "deltas", "nope"])
    assert [(type(i).__name__, i.path) for i in info] == [("RepoFile", "meta.json"), ("RepoFolder", "deltas")]


def test_dataset_repo_round_trip(api, hub, tmp_path):
    api.create_repo("org/deltas", repo_type="dataset")
    data = os.urandom(300_000)
    info = api.create_commit(
        "org/deltas", [CommitOperationAdd("d/0001.bin", data)], commit_message="add", repo_type="dataset"
    )
    assert api.repo_info("org/deltas", repo_type="dataset").sha == info.oid
    assert info.repo_url.repo_type == "dataset"
    assert api.list_repo_files("org/deltas", repo_type="dataset") == [".gitattributes", "d/0001.bin"]
    got = download(hub, "d/0001.bin", tmp_path / "d", repo_type="dataset", repo_id="org/deltas")
    assert got == data


def test_cache_dir_and_snapshot_download(api, hub, repo, tmp_path):
    data = os.urandom(200_000)
    sha = commit(api, [CommitOperationAdd("a/model.bin", data), CommitOperationAdd("meta.json", b"{}")]).oid
    cached = hf_hub_download(repo, "a/model.bin", revision=sha)  # no local_dir: the (temporary) HF cache
    assert cached.startswith(constants.HF_HUB_CACHE) and f"/snapshots/{sha}/" in cached
    with open(cached, "rb") as f:
        assert f.read() == data
    snap = snapshot_download(repo, local_dir=tmp_path / "snap")
    assert sorted(os.listdir(snap)) == [".cache", ".gitattributes", "a", "meta.json"]
    assert (tmp_path / "snap" / "a" / "model.bin").read_bytes() == data


def test_failed_head_silently_returns_a_stale_local_file(api, hub, repo, tmp_path):
    commit(api, [CommitOperationAdd("meta.json", b'{"v": 1}')])
    assert download(hub, "meta.json", tmp_path) == b'{"v": 1}'
    commit(api, [CommitOperationAdd("meta.json", b'{"v": 2}')])
    # HEAD /resolve fails (5xx here; a 401 or a connection error do the same) while local_dir already has
    # the file: hf_hub_download logs a warning and returns the OLD file, without raising.
    hub.faults.fail("resolve", status=503, times=1)
    assert download(hub, "meta.json", tmp_path) == b'{"v": 1}'
    assert download(hub, "meta.json", tmp_path) == b'{"v": 2}'  # Hub reachable again: updated


def test_missing_file_is_entry_not_found(api, hub, repo, tmp_path):
    with pytest.raises(EntryNotFoundError) as e:
        download(hub, "nope.bin", tmp_path)
    assert isinstance(e.value, RemoteEntryNotFoundError) and e.value.response.status_code == 404
    with pytest.raises(RevisionNotFoundError):
        download(hub, "nope.bin", tmp_path, revision="no-such-branch")
    with pytest.raises(RepositoryNotFoundError):
        download(hub, "x.bin", tmp_path, repo_id="org/missing")
    assert not api.file_exists(repo, "nope.bin") and api.file_exists(repo, ".gitattributes")


def test_wrong_token_is_401(api, hub, repo, tmp_path):
    bad = HfApi(endpoint=hub.endpoint, token="hf_wrong")
    calls = [
        lambda: bad.repo_info(repo),
        lambda: bad.create_commit(repo, [CommitOperationAdd("x.json", b"{}")], commit_message="x"),
        lambda: download(hub, ".gitattributes", tmp_path / "a", token="hf_wrong"),
        lambda: bad.create_bucket("org/b"),
    ]
    for call in calls:
        with pytest.raises(HfHubHTTPError) as e:
            call()
        # a plain HfHubHTTPError: NOT mapped to RepositoryNotFoundError (the Hub says "Invalid credentials")
        assert e.value.response.status_code == 401 and type(e.value) is HfHubHTTPError
    # writing without any token is refused too; reading a public repo is fine
    anon = HfApi(endpoint=hub.endpoint, token=False)
    with pytest.raises(HfHubHTTPError) as e:
        anon.create_commit(repo, [CommitOperationAdd("x.json", b"{}")], commit_message="x")
    assert e.value.response.status_code == 401
    assert anon.repo_info(repo).sha == hub.head(repo)
    assert hub.files(repo).keys() == {".gitattributes"}


def test_503_on_commit_is_not_retried_by_the_client(api, hub, repo):
    head = hub.head(repo)
    hub.faults.fail("commit", status=503)
    ops = [CommitOperationAdd("model.bin", os.urandom(500_000))]
    with pytest.raises(HfHubHTTPError) as e:
        commit(api, ops)
    assert e.value.response.status_code == 503
    assert hub.count("commit") == 1  # create_commit posts the commit once, without backoff
    assert hub.head(repo) == head
    # retrying with the same operation objects works: the content is already uploaded, not sent again
    uploads = hub.count("lfs_upload") + hub.count("xet_write_token")
    assert commit(api, ops).oid == hub.head(repo) != head
    assert hub.count("lfs_upload") + hub.count("xet_write_token") == uploads


def test_upload_faults(api, hub, repo):
    # a transient 503 on the upload step is retried by the client (LFS PUT: http_backoff, 1 s;
    # Xet token: hf_xet's own backoff, shortened by configure_client)
    hub.faults.fail("upload", status=503, times=1)
    data = os.urandom(400_000)
    info = commit(api, [CommitOperationAdd("model.bin", data)])
    assert info.oid == hub.head(repo) and hub.read_file(repo, "model.bin") == data
    assert_transport(hub, uploads=2)

    # a non-retryable status surfaces, and nothing is committed. NOT an HfHubHTTPError:
    # LFS wraps it in RuntimeError("Error while uploading ..."), hf_xet raises a builtin ConnectionError.
    hub.faults.fail("upload", status=400, times=1)
    with pytest.raises((RuntimeError, ConnectionError)) as e:
        commit(api, [CommitOperationAdd("model2.bin", os.urandom(400_000))])
    if hub.mode == "xet":
        assert type(e.value) is ConnectionError and "400" in str(e.value)
    else:
        assert type(e.value) is RuntimeError and isinstance(e.value.__cause__, HfHubHTTPError)
        assert e.value.__cause__.response.status_code == 400
    assert hub.head(repo) == info.oid and hub.count("commit") == 1


def test_truncated_download_resumes_with_range(api, hub, repo, tmp_path, monkeypatch):
    data = os.urandom(3_000_000)
    commit(api, [CommitOperationAdd("model.bin", data)])
    # http_get only counts bytes it has handed to the file, in DOWNLOAD_CHUNK_SIZE pieces (10 MB): shrink it
    # so the 1 MB received before the cut survive and the retry asks for the rest with a Range header.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    hub.faults.truncate_download("model.bin", 1_000_000)
    assert download(hub, "model.bin", tmp_path / "a") == data  # the client sleeps 1 s, then resumes
    gets = [r.status for r in hub.log if r.route == "resolve" and r.method == "GET"]
    assert gets == [200, 206]
    assert hub.faults.fired == [("truncate", "model.bin")]


def test_truncated_download_below_chunk_size_restarts(api, hub, repo, tmp_path):
    data = os.urandom(1_000_000)
    commit(api, [CommitOperationAdd("model.bin", data)])
    hub.faults.truncate_download("model.bin", 500_000)
    assert download(hub, "model.bin", tmp_path / "a") == data
    assert [r.status for r in hub.log if r.route == "resolve" and r.method == "GET"] == [200, 200]


def test_short_download_is_detected_by_size(api, hub, repo, tmp_path):
    data = os.urandom(1_000_000)
    commit(api, [CommitOperationAdd("model.bin", data)])
    hub.faults.short_download("model.bin", 123)
    with pytest.raises(OSError, match="Consistency check failed"):
        download(hub, "model.bin", tmp_path / "a")
    # nothing is left behind: neither the target nor a partial temp file (no resume across calls)
    left = [p.name for p in (tmp_path / "a").rglob("*") if p.is_file()]
    assert "model.bin" not in left and not [n for n in left if n.endswith(".incomplete")]
    assert download(hub, "model.bin", tmp_path / "a") == data  # the next attempt starts from zero


def test_corrupted_download_is_not_detected_by_the_client(api, hub, repo, tmp_path):
    data = os.urandom(1_000_000)
    commit(api, [CommitOperationAdd("model.bin", data)])
    hub.faults.corrupt_download("model.bin")
    got = download(hub, "model.bin", tmp_path / "a")
    # right size, wrong bytes, no error: this is why wdiff verifies its own digests after download
    assert len(got) == len(data) and got != data
    assert sum(a != b for a, b in zip(got, data)) == 1
    expected = next(f for f in api.list_repo_tree(repo) if f.path == "model.bin").lfs.sha256
    assert sha256(got) != expected == sha256(data)


# --------------------------------------------------------------------------------------------------
# buckets (Xet only, whatever HF_HUB_DISABLE_XET says)
# --------------------------------------------------------------------------------------------------


def test_bucket_round_trip(api, hub, tmp_path):
    url = api.create_bucket("org/deltas", exist_ok=True)
    assert url.bucket_id == "org/deltas"
    api.create_bucket("org/deltas", exist_ok=True)
    info = api.bucket_info("org/deltas")
    assert (info.id, info.total_files, info.size) == ("org/deltas", 0, 0)
    with pytest.raises(BucketNotFoundError):
        api.bucket_info("org/missing")

    big, meta = os.urandom(2_000_000), b'{"base": "abc"}'
    (tmp_path / "p.bin").write_bytes(big)
    api.batch_bucket_files("org/deltas", add=[(str(tmp_path / "p.bin"), "run/000001.bin"), (meta, "run/meta.json")])
    assert hub.count("bucket_batch") == 1 and hub.count("xet_write_token") == 1

    tree = [f for f in api.list_bucket_tree("org/deltas", recursive=True)]
    files = {f.path: f for f in tree if f.type == "file"}
    assert sorted(files) == ["run/000001.bin", "run/meta.json"]
    assert files["run/000001.bin"].size == len(big) and re.fullmatch(r"[0-9a-f]{64}", files["run/000001.bin"].xet_hash)
    assert [f.path for f in api.list_bucket_tree("org/deltas")] == ["run"]  # not recursive: the folder
    assert [f.path for f in api.list_bucket_tree("org/deltas", prefix="run/meta")] == ["run/meta.json"]
    assert [f.path for f in api.get_bucket_paths_info("org/deltas", ["run/meta.json", "nope"])] == ["run/meta.json"]
    md = api.get_bucket_file_metadata("org/deltas", "run/000001.bin")
    assert md.size == len(big) and md.xet_file_data.file_hash == files["run/000001.bin"].xet_hash
    assert api.bucket_info("org/deltas").total_files == 2

    out = tmp_path / "out"
    api.download_bucket_files(
        "org/deltas",
        files=[("run/000001.bin", out / "p.bin"), ("run/meta.json", out / "meta.json")],
        raise_on_missing_files=True,
    )
    assert (out / "p.bin").read_bytes() == big and (out / "meta.json").read_bytes() == meta
    assert hub.count("bucket_resolve", "GET") == 0  # the bytes came from the Xet CAS, not over HTTP

    api.batch_bucket_files("org/deltas", delete=["run/meta.json"])
    assert [f.path for f in api.list_bucket_tree("org/deltas", recursive=True) if f.type == "file"] == [
        "run/000001.bin"
    ]
    with pytest.raises(EntryNotFoundError):
        api.download_bucket_files("org/deltas", files=[("run/meta.json", out / "x")], raise_on_missing_files=True)
    api.batch_bucket_files("org/deltas", delete=["run/meta.json"])  # deleting again is not an error


# --------------------------------------------------------------------------------------------------
# the fake itself
# --------------------------------------------------------------------------------------------------


def test_server_shuts_down_cleanly(tmp_path, monkeypatch, no_internet):
    threads_before = set(threading.enumerate())
    hub = FakeHub(tmp_path / "hub").start()
    configure_client(monkeypatch, hub, home=tmp_path / "home")
    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    api.create_repo(REPO)
    api.repo_info(REPO)  # leaves a keep-alive connection open in the client's pool
    port = int(hub.endpoint.rsplit(":", 1)[1])
    hub.stop()
    hub.stop()  # idempotent
    assert set(threading.enumerate()) <= threads_before
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_internet_guard_refuses_other_hosts(monkeypatch):
    attempts = block_internet(monkeypatch)
    with pytest.raises(NetworkBlocked):
        socket.create_connection(("huggingface.co", 443), timeout=1)
    with pytest.raises(NetworkBlocked):
        with socket.socket() as s:
            s.connect(("10.255.255.1", 80))
    assert attempts == ["getaddrinfo huggingface.co", "connect ('10.255.255.1', 80)"]


def test_fault_api_rejects_unknown_routes(tmp_path):
    hub = FakeHub(tmp_path)
    with pytest.raises(ValueError, match="unknown route"):
        hub.faults.fail("comit")
    hub.faults.fail("upload", times=2)
    hub.faults.corrupt_download("x")
    assert len(hub.faults.pending) == 2
    hub.faults.clear()
    assert hub.faults.pending == []
