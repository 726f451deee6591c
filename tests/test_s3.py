"""S3 remotes against a real S3 implementation on 127.0.0.1 (moto's server,
tests/s3fake.py), through the real command line: faults on the wire (a 503
on a multipart part, a connection dropped mid-download), concurrent pushes
decided by the store's conditional write, refused credentials. The whole
conformance suite runs against S3 too (tests/test_sync.py, kind ``s3``).
Other fsspec stores go through the generic store, tested on fsspec's
in-memory file system."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from factory import rand, tree, write_ckpt
from kit.cli import run
from s3fake import FaultProxy, configure

import wdiff
from wdiff.errors import ExitCode
from wdiff.format.chain import Chain
from wdiff.remotes import open_remote
from wdiff.remotes.objstore import CHUNK, PIECE

BIG = 12_000_000  # random bytes: an anchor bundle of two multipart chunks, three download pieces


@pytest.fixture
def s3(moto_s3, monkeypatch):
    configure(monkeypatch, moto_s3.endpoint)
    return moto_s3


@pytest.fixture
def proxy(s3, monkeypatch):
    with FaultProxy(s3.endpoint) as p:
        monkeypatch.setenv("AWS_ENDPOINT_URL", p.endpoint)
        yield p


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    return write_ckpt(root / "ckpt", {"w": rand(np.random.default_rng(5), "U8", (BIG,))})


def _parts(url: str) -> list:
    return [p for e in wdiff.log(url).entries for p in e.parts]


@pytest.mark.slow
def test_503_on_a_part_is_retried_and_a_failed_push_resumes_its_upload(s3, proxy, big, tmp_path):
    url = f"s3://{s3.new_bucket()}/run"
    assert CHUNK < BIG < 2 * CHUNK
    # one 503 on the second part: the client retries it, the push goes through
    proxy.fail("PUT", "partNumber=2", status=503, times=1)
    r = run("push", "--anchor", big, url)
    assert r.returncode == 0, r.stderr
    part2 = [row for row in proxy.log if row[0] == "PUT" and "partNumber=2" in row[1]]
    assert [row[3] for row in part2] == [503, 200]
    d = tmp_path / "d"
    wdiff.pull(url, d)
    assert tree(d) == tree(big)

    # the second part keeps failing: the push fails with the remote code, and
    # a rerun sends only the part the store lacks
    url2 = f"s3://{s3.new_bucket()}/run"
    proxy.log.clear()
    proxy.fail("PUT", "partNumber=2", status=503, times=1000)
    r = run("push", "--anchor", big, url2, env={"AWS_MAX_ATTEMPTS": "2"})  # give up soon
    assert r.returncode == ExitCode.REMOTE, r.stderr
    assert "503" in r.stderr or "ServiceUnavailable" in r.stderr
    assert open_remote(url2).read_chain()[0] is None  # nothing published
    proxy.clear()
    proxy.log.clear()
    r = run("push", "--anchor", big, url2)
    assert r.returncode == 0, r.stderr
    puts = [row[1] for row in proxy.log if row[0] == "PUT" and "partNumber=" in row[1]]
    assert len(puts) == 1 and "partNumber=2" in puts[0], puts  # part 1 was kept from the failed run
    e = tmp_path / "e"
    wdiff.pull(url2, e)
    assert tree(e) == tree(big)


@pytest.mark.slow
def test_dropped_connection_mid_download_resumes(s3, proxy, big, tmp_path):
    url = f"s3://{s3.new_bucket()}/run"
    wdiff.push(big, url, anchor=True)
    (part,) = _parts(url)
    key = part.path.rsplit("/", 1)[-1]
    # one cut in the middle of the second piece: the client asks for that piece again
    proxy.log.clear()
    proxy.drop("GET", key, after=PIECE // 3, times=1)
    d = tmp_path / "d"
    r = run("pull", url, d)
    assert r.returncode == 0, r.stderr
    assert tree(d) == tree(big)
    gets = [row for row in proxy.log if row[0] == "GET" and key in row[1]]
    assert [row[4] for row in gets].count(PIECE // 3) == 1  # the cut happened
    assert sum(row[4] for row in gets) <= part.size + PIECE  # never the whole part again

    # the connection keeps dropping from the second piece on: the pull fails
    # with the remote code, keeps the first piece, and the rerun starts after it
    proxy.log.clear()
    proxy.drop("GET", key + f" bytes={PIECE}-", after=1000, times=1000)
    e = tmp_path / "e"
    r = run("pull", url, e)
    assert r.returncode == ExitCode.REMOTE, r.stderr
    assert not e.exists() or tree(e) == {}
    proxy.clear()
    proxy.log.clear()
    r = run("pull", url, e)
    assert r.returncode == 0, r.stderr
    assert tree(e) == tree(big)
    ranges = [row[2] for row in proxy.log if row[0] == "GET" and key in row[1]]
    assert ranges and ranges[0].startswith(f"bytes={PIECE}-"), ranges


RACER = textwrap.dedent("""
    # one pusher for every round: the command line's main() per round, in
    # one process (its start-up paid once); a gate before each chain write
    import json, os, sys, time
    from wdiff.remotes import stores
    from wdiff.cli import main
    side, url, gates, bundles = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    real = stores.S3Store._write_chain
    gate = [None]
    def raced(self, chain, token):
        open(os.path.join(gate[0], side), "w").close()
        deadline = time.monotonic() + 30
        while len(os.listdir(gate[0])) < 2 and time.monotonic() < deadline:
            time.sleep(0.002)
        return real(self, chain, token)
    stores.S3Store._write_chain = raced
    for k, bundle in enumerate(bundles):
        gate[0] = os.path.join(gates, str(k))
        os.makedirs(gate[0], exist_ok=True)
        code = main(["push", "-q", bundle, url, "--label", f"r{k}{side}"])
        print("ROUND", k, code, flush=True)
""")


@pytest.mark.slow
def test_concurrent_pushes_one_wins_the_other_exits_with_conflict(s3, tmp_path):
    """Two pushers, each round: both read the same chain and upload their
    parts, then both write the chain at once (a gate in each process), and
    the store's conditional write decides; 50 rounds (WDIFF_S3_RACE_ROUNDS
    sets another count)."""
    rounds = int(os.environ.get("WDIFF_S3_RACE_ROUNDS", "50"))
    url = f"s3://{s3.new_bucket()}/run"
    rng = np.random.default_rng(7)
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    bundles = {"a": [], "b": []}
    for k in range(rounds):
        for side in "ab":
            ck = write_ckpt(tmp_path / f"c{k}{side}", {"w": rand(rng, "F32", (256,))})
            wdiff.pack(None, ck, tmp_path / f"{k}{side}.wdb")
            bundles[side].append(str(tmp_path / f"{k}{side}.wdb"))
    procs = {side: subprocess.Popen([sys.executable, str(script), side, url, str(tmp_path / "gates"),
                                     json.dumps(bundles[side])], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
             for side in "ab"}
    outs = {side: p.communicate(timeout=300) for side, p in procs.items()}
    codes = {side: {int(k): int(c) for _, k, c in (line.split() for line in out.splitlines()
                                                    if line.startswith("ROUND "))}
             for side, (out, _) in outs.items()}
    assert all(p.returncode == 0 for p in procs.values()), outs
    winners = []
    for k in range(rounds):
        got = sorted((codes["a"].get(k), codes["b"].get(k)), key=str)
        assert got == sorted([ExitCode.OK, ExitCode.BUSY]), (k, codes)
        winners.append("a" if codes["a"][k] == ExitCode.OK else "b")
    for side in "ab":  # each lost round said why
        assert outs[side][1].count("changed since it was read") == winners.count("b" if side == "a" else "a")
    raw, _ = open_remote(url).read_chain()
    chain = Chain.decode(raw, where=url)  # every round's chain built on the one before: none corrupt
    assert [e.label for e in chain.entries] == [f"r{k}{w}" for k, w in enumerate(winners)]
    d = tmp_path / "d"
    wdiff.pull(url, d)
    assert tree(d) == tree(tmp_path / f"c{rounds - 1}{winners[-1]}")


@pytest.mark.slow
def test_refused_credentials_exit_with_the_auth_code_and_never_print_the_secret(s3, monkeypatch, tmp_path):
    import moto.settings

    url = f"s3://{s3.new_bucket()}/run"
    ck = write_ckpt(tmp_path / "c", {"w": rand(np.random.default_rng(3), "F32", (64,))})
    wdiff.push(ck, url, anchor=True)
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # moto checks every key from now on
    secret = "wdiff-SECRET-do-not-print-4f2a9c"
    env = {"AWS_ACCESS_KEY_ID": "AKIAUNKNOWNKEY000000", "AWS_SECRET_ACCESS_KEY": secret}
    for args in (("log", url), ("log", "--json", url), ("pull", url, tmp_path / "d"),
                 ("push", "--anchor", ck, url + "2")):
        r = run(*args, env=env)
        assert r.returncode == ExitCode.AUTH, (args, r.returncode, r.stderr)
        assert secret not in r.stdout + r.stderr
        assert "refused the credentials" in r.stdout + r.stderr
        if "--json" in args:
            assert json.loads(r.stdout)["error"]["kind"] == "auth"
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_missing_bucket_and_missing_remote(s3, tmp_path):
    r = run("log", "s3://no-such-bucket-wdiff/run")
    assert r.returncode == ExitCode.NOT_FOUND, r.stderr
    bucket = s3.new_bucket()
    r = run("log", f"s3://{bucket}/nothing-here")
    assert r.returncode == ExitCode.NOT_FOUND, r.stderr
    ck = write_ckpt(tmp_path / "c", {"w": rand(np.random.default_rng(4), "F32", (64,))})
    r = run("push", "--anchor", ck, "s3://no-such-bucket-wdiff/run")
    assert r.returncode == ExitCode.NOT_FOUND, r.stderr


def test_list_store_delete(s3, tmp_path):
    from wdiff.remotes import Upload

    url = f"s3://{s3.new_bucket()}/run"
    store = open_remote(url)
    assert store.list() == []
    src = tmp_path / "src"
    src.write_bytes(b"x" * 100 + b"y" * 50)
    store.store([Upload("objects/a/1", str(src), 0, 100), Upload("objects/b/2", str(src), 100, 50)])
    assert store.list() == [("objects/a/1", 100), ("objects/b/2", 50)]
    assert store.list("objects/b") == [("objects/b/2", 50)]
    assert store.read_chain()[0] is None  # store() never writes the chain
    assert store.fetch_range("objects/b/2", 10, 5, size=50) == b"yyyyy"
    with pytest.raises(ValueError):
        store.delete(["chain.json"])
    store.delete(["objects/a/1", "objects/missing"])
    assert store.list() == [("objects/b/2", 50)]


def test_generic_fsspec_store_works_and_push_warns_without_conditional_writes(tmp_path):
    """memory:// goes through the generic store: no conditional write, so
    the push says so; pull, log and resume work as on any remote."""
    rng = np.random.default_rng(9)
    a = write_ckpt(tmp_path / "a", {"w": rand(rng, "U8", (2_500_000,))})
    r = run("push", "--anchor", a, "memory://bucket/run")
    assert r.returncode == 0, r.stderr
    assert "no conditional write" in r.stderr
    url = "memory://wdiff-tests/run"
    wdiff.push(a, url, anchor=True, label="v0", part_size=1024 * 1024)
    assert len(_parts(url)) > 1
    d = tmp_path / "d"
    wdiff.pull(url, d)
    assert tree(d) == tree(a)
    store = open_remote(url)
    assert [p for p, _ in store.list()][0] == "chain.json"


@pytest.mark.slow
def test_stores_whose_library_is_missing_say_which_extra_installs_it():
    import importlib.util

    for url, extra, module in (("gs://bucket/run", "gcs", "gcsfs"), ("az://container/run", "azure", "adlfs")):
        if importlib.util.find_spec(module) is not None:
            continue  # installed here: nothing to say
        r = run("log", url)
        assert r.returncode == ExitCode.USAGE, r.stderr
        assert f"wdiff[{extra}]" in r.stderr
    for bad in ("http://example.com/x", "s3://b/a/../c", "s3://b/x?versionId=1", "nosuchscheme://b/x",
                "s3://AKIDEXAMPLE:wdiff-url-secret@bucket/run"):
        r = run("log", bad)
        assert r.returncode == ExitCode.USAGE, (bad, r.stderr)
        assert "wdiff-url-secret" not in r.stdout + r.stderr


@pytest.mark.slow
def test_signed_chain_on_s3(s3, tmp_path):
    """A signed push and a trusting pull: signatures are small objects of
    unknown size (fetched with a bound), and the remote's record is kept
    under its s3:// name."""
    from factory import simple_pair

    from wdiff.errors import IntegrityError
    from wdiff.format import signature as signing
    from wdiff.sync.trust import remote_key

    signing.generate(str(tmp_path / "key"))
    signing.generate(str(tmp_path / "other"))
    url = f"s3://{s3.new_bucket()}/signed/"
    assert remote_key(url) == url.rstrip("/")
    A, B = simple_pair(tmp_path)
    wdiff.push(A, url, anchor=True, sign_key=tmp_path / "key")
    wdiff.push(B, url, base=A, sign_key=tmp_path / "key")
    wdiff.pull(url, tmp_path / "d", trusted_keys=[tmp_path / "key.pub"])
    assert tree(tmp_path / "d") == tree(B)
    with pytest.raises(IntegrityError):
        wdiff.pull(url, tmp_path / "e", trusted_keys=[tmp_path / "other.pub"])
    assert not (tmp_path / "e").exists()
