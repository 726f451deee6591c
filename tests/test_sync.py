"""push / pull / log / status / squash through every kind of remote.

The same conformance suite runs against each remote kind (the ``remote``
fixture); the Hub kinds run against the local stand-in server in hubfake.py.
"""

import shutil

import numpy as np
import pytest
from factory import mutate, rand, tree, write_ckpt

import wdiff
from wdiff.errors import BaseMismatchError, BusyError, ConflictError, IntegrityError, LocalChangesError, NotFoundError, UsageError
from wdiff.format.chain import Chain
from wdiff.fsutil import locked
from wdiff.ops.squash import squash
from wdiff.remotes import open_remote

#: the kinds behind a real server (the stand-in Hub, moto's S3) take seconds a
#: test: slow; the development lane keeps the three local ones
SERVERS = ("hub-model-xet", "hub-model-lfs", "hub-dataset", "hub-bucket", "s3")


def kinds(*names) -> list:
    return [pytest.param(k, marks=pytest.mark.slow) if k in SERVERS else k for k in names]


KINDS = kinds("local", "file-url", *SERVERS, "fsspec-memory")


class Remote(str):
    """A remote URL, plus how the tests reach behind it."""

    kind: str
    hub = None
    root = None
    s3 = None  # the moto stand-in (s3fake.MotoS3)
    memfs = None  # fsspec's in-memory file system

    def corrupt_next_download(self, part_path: str) -> None:
        if self.s3 is not None:  # flip a stored byte; the test repairs it afterwards
            self.s3.flip_byte(self[len("s3://"):] + "/" + part_path)
        elif self.memfs is not None:
            key = self[len("memory://"):] + "/" + part_path
            data = bytearray(self.memfs.cat_file(key))
            data[len(data) // 2] ^= 1
            self.memfs.pipe_file(key, bytes(data))
        elif self.hub is None:  # flip a stored byte; the test repairs it afterwards
            p = self.root / part_path
            data = bytearray(p.read_bytes())
            data[len(data) // 2] ^= 1
            p.write_bytes(bytes(data))
        else:
            self.hub.faults.corrupt_download(part_path)

    def repair(self, part_path: str) -> None:
        if self.hub is None:  # flip the byte back
            self.corrupt_next_download(part_path)


@pytest.fixture(params=KINDS)
def remote(request, tmp_path, monkeypatch):
    kind = request.param
    if kind in ("local", "file-url"):
        r = Remote(("" if kind == "local" else "file://") + str(tmp_path / "remote"))
        r.kind, r.root = kind, tmp_path / "remote"
        yield r
        return
    if kind == "s3":
        from s3fake import configure

        moto = request.getfixturevalue("moto_s3")
        configure(monkeypatch, moto.endpoint)
        r = Remote(f"s3://{moto.new_bucket()}/run-1")
        r.kind, r.s3 = kind, moto
        yield r
        return
    if kind == "fsspec-memory":  # the generic fsspec store (no conditional write)
        import uuid

        import fsspec

        r = Remote(f"memory://wdiff-{uuid.uuid4().hex[:8]}/run-1")
        r.kind, r.memfs = kind, fsspec.filesystem("memory")
        yield r
        r.memfs.rm(r[len("memory://"):].split("/")[0], recursive=True)
        return
    from hubfake import FakeHub, block_internet, configure_client

    refused = block_internet(monkeypatch)
    with FakeHub(tmp_path / "hub") as hub:
        configure_client(monkeypatch, hub, xet=kind != "hub-model-lfs", home=tmp_path / "hf_home")
        url = {"hub-model-xet": "hf://acme/deltas", "hub-model-lfs": "hf://acme/deltas",
               "hub-dataset": "hf://datasets/acme/deltas", "hub-bucket": "hf://buckets/acme/deltas/run-1"}[kind]
        r = Remote(url)
        r.kind, r.hub = kind, hub
        yield r
        assert not hub.unhandled, hub.unhandled
    assert not refused, refused


@pytest.fixture
def versions(tmp_path):
    """Three versions: v1 mutates, v2 adds and removes tensors and changes a
    companion file."""
    rng = np.random.default_rng(21)
    v = {"w": rand(rng, "BF16", (1200, 1200)), "b": rand(rng, "F32", (300,)), "gone": rand(rng, "F16", (9,))}
    out = []
    for k in range(3):
        out.append(write_ckpt(tmp_path / f"v{k}", v, shards=2, companions={"config.json": f'{{"v": {k}}}'.encode()}))
        v = {n: mutate(t, 0.02, rng) for n, t in v.items()}
        if k == 1:
            v["new"] = rand(rng, "I32", (64,))
            del v["gone"]
    return out


def push_all(versions, remote, **kw):
    wdiff.push(versions[0], remote, anchor=True, label="v0", **kw)
    wdiff.push(versions[1], remote, base=versions[0], label="v1", **kw)
    wdiff.push(versions[2], remote, base=versions[1], label="v2", **kw)


def test_end_to_end(versions, remote, tmp_path):
    push_all(versions, remote)
    lg = wdiff.log(remote)
    assert [e.label for e in lg.entries] == ["v2", "v1", "v0"]
    assert lg.entries[-1].anchor and lg.head == lg.entries[0].version

    empty = tmp_path / "empty"
    r = wdiff.pull(remote, empty)
    assert r.from_anchor and len(r.bundles) == 3 and tree(empty) == tree(versions[2])

    behind = tmp_path / "behind"
    shutil.copytree(versions[1], behind)
    r = wdiff.pull(remote, behind)
    assert not r.from_anchor and len(r.bundles) == 1 and tree(behind) == tree(versions[2])

    r = wdiff.pull(remote, behind)
    assert r.up_to_date and r.downloaded == 0 and not r.bundles


def test_pull_to_older_version_and_by_prefix(versions, remote, tmp_path):
    push_all(versions, remote)
    d = tmp_path / "d"
    wdiff.pull(remote, d, to="v1")
    assert tree(d) == tree(versions[1])
    v0 = wdiff.log(remote).entries[-1].version.hex()
    back = wdiff.pull(remote, d, to=v0[:8])  # backwards: through the inverse of v0 -> v1, or from the anchor
    assert tree(d) == tree(versions[0])
    # every store that reads part of an object steps back (pieces of the
    # anchor where the inverse needs them), not downloading the whole anchor
    assert back.stepped_back or remote.startswith("hf://buckets/"), back
    with pytest.raises(NotFoundError):
        wdiff.pull(remote, d, to="no-such-label")


def test_pull_replaces_unknown_content(versions, remote, tmp_path):
    push_all(versions, remote)
    d = tmp_path / "d"
    d.mkdir()
    (d / "stray.bin").write_bytes(b"unknown")
    with pytest.raises(LocalChangesError):  # nothing says stray.bin is not someone's work
        wdiff.pull(remote, d)
    assert tree(d) == {"stray.bin": b"unknown"}
    r = wdiff.pull(remote, d, force=True)
    assert r.from_anchor and r.before is None
    assert tree(d) == tree(versions[2])
    assert [p.name for p in tmp_path.iterdir() if ".wdiff-old" in p.name or ".wdiff-new" in p.name] == []


def test_status(versions, remote, tmp_path):
    push_all(versions, remote)
    s = wdiff.status(versions[0], remote)
    assert not s.up_to_date and s.behind == 2 and s.known and not s.from_anchor
    assert wdiff.status(versions[2], remote).up_to_date
    s = wdiff.status(tmp_path / "nothing-here", remote)
    assert s.from_anchor and s.behind == 3


def test_push_rules(versions, remote):
    with pytest.raises(UsageError):  # the first push must be an anchor
        wdiff.push(versions[1], remote, base=versions[0])
    wdiff.push(versions[0], remote, anchor=True)
    with pytest.raises(BaseMismatchError):  # v1 -> v2 does not start at the head (v0)
        wdiff.push(versions[2], remote, base=versions[1])
    r = wdiff.push(versions[1], remote, base=versions[0])
    assert r.uploaded
    assert not wdiff.push(versions[1], remote, base=versions[0]).uploaded  # idempotent
    # another bundle of the same step (packed by an older format here) adds nothing either
    other = str(versions[1]) + "-v1.wdb"
    wdiff.pack(versions[0], versions[1], other, format_version=1)
    assert wdiff.inspect(other).bundle_id != r.bundle_id
    before = wdiff.log(remote)
    again = wdiff.push(other, remote)
    assert not again.uploaded and again.bundle_id == r.bundle_id
    assert wdiff.log(remote) == before
    # a fork from an older version is possible when asked for
    r = wdiff.push(versions[2], remote, base=versions[0], fork=True)
    assert r.uploaded and wdiff.log(remote).head == r.version


def test_multipart_bundles(versions, remote, tmp_path):
    r = wdiff.push(versions[0], remote, anchor=True, part_size=1024 * 1024)
    assert r.parts > 1
    d = tmp_path / "d"
    wdiff.pull(remote, d)
    assert tree(d) == tree(versions[0])


def test_concurrent_push_conflict(versions, remote, tmp_path):
    wdiff.push(versions[0], remote, anchor=True)
    wdiff.pack(versions[0], versions[1], tmp_path / "a.wdb")
    store = open_remote(remote)
    raw, token = store.read_chain()
    wdiff.push(tmp_path / "a.wdb", remote)  # someone else wins the race
    chain = Chain.decode(raw, where="t")
    with pytest.raises(ConflictError):
        store.publish([], chain.encode(), token, message="late")
    assert len(wdiff.log(remote).entries) == 2


def test_damaged_part_is_refused_and_directory_untouched(versions, remote, tmp_path):
    if remote.kind == "hub-bucket":
        pytest.skip("bucket downloads go through hf_xet, which HTTP faults cannot reach")
    push_all(versions, remote)
    e = wdiff.log(remote).entries[0]
    remote.corrupt_next_download(e.parts[0].path)
    d = tmp_path / "d"
    shutil.copytree(versions[1], d)
    with pytest.raises(IntegrityError):
        wdiff.pull(remote, d)
    assert tree(d) == tree(versions[1])
    remote.repair(e.parts[0].path)
    wdiff.pull(remote, d)
    assert tree(d) == tree(versions[2])


def test_interrupted_download_resumes_without_refetching(versions, remote, tmp_path, monkeypatch):
    wdiff.push(versions[0], remote, anchor=True, part_size=1024 * 1024)
    LocalStore = type(open_remote(remote))

    fetched = []
    real = LocalStore.fetch

    def flaky(self, path, dest, **kw):
        fetched.append(path)
        if len(fetched) == 2:
            raise KeyboardInterrupt
        return real(self, path, dest, **kw)

    monkeypatch.setattr(LocalStore, "fetch", flaky)
    d = tmp_path / "d"
    with pytest.raises(KeyboardInterrupt):
        wdiff.pull(remote, d)
    monkeypatch.setattr(LocalStore, "fetch", lambda self, path, dest, **kw: (fetched.append(path), real(self, path, dest, **kw))[1])
    wdiff.pull(remote, d)
    assert tree(d) == tree(versions[0])
    assert fetched.count(fetched[0]) == 1  # the first part was not fetched again


def test_pull_finishes_an_interrupted_apply(versions, remote, tmp_path, monkeypatch):
    push_all(versions, remote)
    d = tmp_path / "d"
    shutil.copytree(versions[1], d)
    from wdiff.ops.apply import patch as patching

    class Crash(Exception):
        pass

    real = patching.write_all
    calls = {"n": 0}

    def crash(fd, data, off):
        calls["n"] += 1
        if calls["n"] == 1:
            raise Crash
        real(fd, data, off)

    with monkeypatch.context() as m:
        m.setattr(patching, "write_all", crash)
        m.setattr(patching, "BATCH_BYTES", 1)
        try:
            wdiff.pull(remote, d)
        except Crash:
            pass
    if (d / ".wdiff" / "txn" / "journal.json").exists():
        with pytest.raises(BusyError):
            wdiff.diff(d, d)
    wdiff.pull(remote, d)
    assert tree(d) == tree(versions[2])


def test_two_pulls_never_both_write(versions, remote, tmp_path):
    push_all(versions, remote)
    d = tmp_path / "d"
    d.mkdir()
    with locked(str(tmp_path / ".d.wdiff-lock"), what="test"):
        with pytest.raises(BusyError):
            wdiff.pull(remote, d)
    assert list(d.iterdir()) == []


def test_squash_equals_the_chain(versions, tmp_path):
    b1, b2 = tmp_path / "1.wdb", tmp_path / "2.wdb"
    wdiff.pack(versions[0], versions[1], b1)
    wdiff.pack(versions[1], versions[2], b2)
    squash([b1, b2], versions[0], tmp_path / "s.wdb")
    wdiff.apply(tmp_path / "s.wdb", versions[0], tmp_path / "out")
    assert tree(tmp_path / "out") == tree(versions[2])
    wdiff.pack(None, versions[0], tmp_path / "a.wdb")
    squash([tmp_path / "a.wdb", b1, b2], None, tmp_path / "a2.wdb")  # materialise v2 as an anchor
    wdiff.apply(tmp_path / "a2.wdb", None, tmp_path / "out2")
    assert tree(tmp_path / "out2") == tree(versions[2])
    with pytest.raises(BaseMismatchError):
        squash([b2, b1], versions[1], tmp_path / "x.wdb")
    with pytest.raises(BaseMismatchError):
        squash([b1, b2], versions[1], tmp_path / "y.wdb")
    assert not (tmp_path / "x.wdb").exists() and not (tmp_path / "y.wdb").exists()


def test_remote_urls():
    from wdiff.remotes import parse_remote

    assert parse_remote("hf://acme/model") == {"kind": "model", "repo_id": "acme/model", "revision": "main",
                                               "subfolder": ""}
    assert parse_remote("hf://datasets/acme/d@dev")["kind"] == "dataset"
    assert parse_remote("hf://acme/m@dev/a/b/") == {"kind": "model", "repo_id": "acme/m", "revision": "dev",
                                                   "subfolder": "a/b"}
    assert parse_remote("hf://datasets/acme/d/sub")["subfolder"] == "sub"
    assert parse_remote("hf://buckets/acme/b/some/prefix") == {"kind": "bucket", "repo_id": "acme/b", "prefix": "some/prefix"}
    assert parse_remote("file:///tmp/x") == {"kind": "local", "path": "/tmp/x"}
    assert parse_remote("s3://bucket/a/b/") == {"kind": "objstore", "protocol": "s3", "bucket": "bucket", "prefix": "a/b"}
    assert parse_remote("gs://bucket")["protocol"] == "gs"
    for bad in ("s3://", "s3://bucket/a/../b", "hf://only-one", "hf://buckets/a/b/../c", "http://example.com/x",
                "hf://acme/m@dev/../x", "hf://acme/m/a//b"):
        with pytest.raises(UsageError):
            parse_remote(bad)


def test_verify_against_remote_and_bundle(versions, remote, tmp_path):
    from wdiff.sync.verify import verify

    push_all(versions, remote)
    d = tmp_path / "d"
    wdiff.pull(remote, d)
    assert verify(d, remote=remote).ok
    assert verify(versions[1], remote=remote, version="v1").ok
    r = verify(versions[1], remote=remote)
    assert not r.ok and any(p.what == "tensor differs" for p in r.problems)
    (d / "config.json").write_bytes(b"tampered")
    (d / "extra.txt").write_bytes(b"?")
    r = verify(d, remote=remote)
    assert {(p.path, p.what) for p in r.problems} == {("config.json", "differs"), ("extra.txt", "unexpected")}


def test_squash_on_the_remote(versions, remote, tmp_path):
    push_all(versions, remote)
    r = wdiff.squash_remote(remote)  # a fresh anchor at the head, from the chain alone
    assert r.uploaded and r.parent is None
    lg = wdiff.log(remote)
    assert lg.head == r.version and len(lg.entries) == 4
    e = tmp_path / "late"
    pulled = wdiff.pull(remote, e)
    assert pulled.bundles == (r.bundle_id,)  # one bundle instead of three
    assert tree(e) == tree(versions[2])
    # from a version: needs that checkpoint
    with pytest.raises(UsageError):
        wdiff.squash_remote(remote, start="v0")
    r2 = wdiff.squash_remote(remote, start="v0", base=versions[0])
    assert r2.parent == lg.entries[-1].version
    d = tmp_path / "d"
    shutil.copytree(versions[0], d)
    assert wdiff.pull(remote, d).bundles == (r2.bundle_id,)
    assert tree(d) == tree(versions[2])
    assert not wdiff.squash_remote(remote).uploaded  # idempotent: it is one bundle now


def test_list_store_delete(remote, versions, tmp_path):
    """The object interface below the chain (gc, staged parts): store puts
    objects without touching the chain, list sees them with their sizes,
    delete removes them, never the chain, and a missing path is no error."""
    wdiff.push(versions[0], remote, anchor=True)
    store = open_remote(remote)
    raw, _ = store.read_chain()
    before = dict(store.list())
    assert "chain.json" in before and before["chain.json"] == len(raw)
    chain = Chain.decode(raw, where=remote)
    for p in chain.entries[0].parts:
        assert before[p.path] == p.size
    assert store.list("objects") == sorted((k, v) for k, v in before.items() if k.startswith("objects/"))
    assert store.list("nothing-here") == []
    src = tmp_path / "blob"
    src.write_bytes(b"0123456789" * 1000)
    from wdiff.remotes import Upload

    ups = [Upload("stage/x/a.bin", str(src), 0, 10_000), Upload("stage/x/b.bin", str(src), 100, 500)]
    store = open_remote(remote)
    store.store(ups)
    store = open_remote(remote)
    assert store.list("stage") == [("stage/x/a.bin", 10_000), ("stage/x/b.bin", 500)]
    assert store.read_chain()[0] == raw  # the chain is untouched
    got = tmp_path / "got"
    store.fetch("stage/x/b.bin", str(got), size=500)
    assert got.read_bytes() == src.read_bytes()[100:600]
    with pytest.raises(ValueError):
        store.delete(["chain.json"])
    with pytest.raises(ValueError):
        store.delete(["../outside"])
    store.delete(["stage/x/a.bin", "stage/x/never-was"])
    store = open_remote(remote)
    assert store.list("stage") == [("stage/x/b.bin", 500)]
    store.delete(["stage/x/b.bin"])
    store = open_remote(remote)
    assert store.list("stage") == []
    assert store.read_chain()[0] == raw
    # a push after object-only writes still goes through (the Hub's branch moved meanwhile)
    wdiff.push(versions[1], remote, base=versions[0])
    assert len(wdiff.log(remote).entries) == 2
    wdiff.pull(remote, tmp_path / "out")
    assert tree(tmp_path / "out") == tree(versions[1])


def test_fetch_range(remote, versions):
    """Part of an object, exactly those bytes and never more than asked
    (rollback reads pieces of an anchor this way); a store that cannot read
    part of an object says so with NotImplementedError, nothing else."""
    wdiff.push(versions[0], remote, anchor=True)
    store = open_remote(remote)
    raw, _ = store.read_chain()
    part = Chain.decode(raw, where=remote).entries[0].parts[0]
    try:
        whole = store.fetch_range(part.path, 0, part.size, size=part.size)
    except NotImplementedError:
        assert remote.startswith("hf://buckets/"), f"{remote}: only Hub buckets read objects whole"
        return
    assert len(whole) == part.size
    for off, n in [(0, 1), (7, 100), (part.size - 3, 3), (part.size // 2, 0)]:
        assert store.fetch_range(part.path, off, n, size=part.size) == whole[off:off + n]
    with pytest.raises(ValueError):
        store.fetch_range(part.path, part.size - 1, 2, size=part.size)
    with pytest.raises(IntegrityError):  # the object is not the size the chain says
        store.fetch_range(part.path, 0, 10, size=part.size + 1)


@pytest.mark.parametrize("remote", kinds("local", "hub-model-xet", "hub-model-lfs", "hub-bucket", "s3"), indirect=True)
def test_push_after_a_store_by_someone_else(remote, versions, tmp_path):
    """A store between a push's chain read and its publish changes no chain:
    the push still wins (on the Hub it builds on the store's commit)."""
    wdiff.push(versions[0], remote, anchor=True)
    from wdiff.remotes import Upload

    src = tmp_path / "blob"
    src.write_bytes(b"x" * 100)
    other = open_remote(remote)
    store = open_remote(remote, create=True)
    raw, token = store.read_chain()
    other.store([Upload("stage/y/z.bin", str(src), 0, 100)])
    store.publish([], raw, token, message="same chain again")
    assert open_remote(remote).read_chain()[0] == raw


@pytest.mark.parametrize("remote", kinds("local", "hub-model-xet", "hub-bucket", "s3"), indirect=True)
def test_gc_and_staged_commit(remote, versions, tmp_path):
    """gc (bridge, phase 1, phase 2) and many-writers staging through every
    kind of remote."""
    from wdiff.sync.stage import commit, push_part

    wdiff.push(versions[0], remote, anchor=True, label="a")
    wdiff.push(versions[1], remote, base=versions[0], label="b")
    wdiff.push(versions[2], remote, base=versions[1], label="c")
    r = wdiff.gc(remote, keep_last=1, keep=["b"])  # default grace: nothing is deleted yet
    assert len(r.bridges) == 1 and r.bridges[0].start is None and r.published and not r.deleted
    store = open_remote(remote)
    chain = Chain.decode(store.read_chain()[0], where=remote)
    assert {e.label for e in chain.entries} == {"b", "c"} and len(chain.garbage) == len(r.pending) > 0
    r = wdiff.gc(remote, keep_last=1, keep=["b"], grace=0)
    assert r.deleted and not r.pending and not r.dropped
    store = open_remote(remote)
    named = {p.path for e in Chain.decode(store.read_chain()[0], where=remote).entries for p in e.parts}
    assert {p for p, _ in store.list("objects")} == named
    for spec, d in (("b", versions[1]), ("c", versions[2])):
        wdiff.pull(remote, tmp_path / spec, to=spec)
        assert tree(tmp_path / spec) == tree(d)
    # two writers, one version (back to v1's bytes, from the head v2)
    push_part(versions[1], remote, base=versions[2], only=["model-00001-*", "*.json"], stage="s")
    push_part(versions[1], remote, base=versions[2], only=["model-00002-*"], stage="s")
    assert len(wdiff.log(remote).entries) == 2
    res = commit(remote, stage="s", expect=2, label="d")
    assert res.parts == 2 and res.push.uploaded
    assert open_remote(remote).list("stage") == []
    wdiff.pull(remote, tmp_path / "c")
    assert tree(tmp_path / "c") == tree(versions[1])
