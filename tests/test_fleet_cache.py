"""A fleet's cache in front of the origin: 16 pullers (real processes of the
command line) through a real caching proxy (nginx from the distribution's
packages, started here on 127.0.0.1 with its own prefix, config and cache)
in front of the Hub stand-in (tests/hubfake.py, through HF_ENDPOINT) and
the S3 stand-in (moto behind s3fake's metering proxy, through
AWS_ENDPOINT_URL). The origin must serve each part's bytes about once,
before and after a second push (late joiners read the anchor at the URL the
first pullers warmed), and the chain must never come back stale.

The pullers hold no credentials: the Hub proxy adds the token, and S3
pullers read anonymously (``FSSPEC_S3_ANON=true``).

Skipped only where nginx is missing and ``CI`` is not set; under CI a
missing nginx fails (.ci/run installs it). Run as a script, it prints the
table of origin requests and bytes, direct and through the proxy::

    PYTHONPATH=. python tests/test_fleet_cache.py
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from factory import mutate, rand, tree, write_ckpt
from kit.cli import argv, environment, ok, run

#: a real caching proxy (nginx) in front of the stand-in Hub and S3, 16 pullers at once
pytestmark = pytest.mark.slow

PULLERS = 16
SIZE = 6_000_000  # random bytes: an anchor of one part, two S3 download pieces
HUB_URL = "hf://acme/fleet"
IMMUTABLE = "public, max-age=31536000, immutable"


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


@pytest.fixture
def nginx():
    found = nginx_binary()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("nginx is missing under CI (.ci/run installs it)")
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# the Hub: only URLs pinned to a commit are cached (they never change); the
# API and branch names are passed through. The proxy adds the token.
HUB_CONF = r"""
        location ~ "^/.+/resolve/[0-9a-f]{40}/" {
            proxy_pass ORIGIN;
            proxy_set_header Authorization "Bearer TOKEN";
            proxy_cache fleet;
            proxy_cache_valid 200 1y;
            proxy_ignore_headers Cache-Control Expires Set-Cookie;
            proxy_cache_lock on;
            proxy_cache_lock_timeout 120s;
            proxy_cache_lock_age 120s;
        }
        location / {
            proxy_pass ORIGIN;
            proxy_set_header Authorization "Bearer TOKEN";
        }
"""
# S3: a cache-everything proxy (every 200 kept a year) that honours the
# origin's Cache-Control: what wdiff writes decides what is kept
S3_CONF = r"""
        location / {
            proxy_pass ORIGIN;
            proxy_cache fleet;
            proxy_cache_valid 200 206 1y;
            proxy_cache_lock on;
            proxy_cache_lock_timeout 120s;
            proxy_cache_lock_age 120s;
        }
"""


@contextmanager
def caching_proxy(binary: str, origin: str, server: str, token: str = ""):
    """nginx on a free port of 127.0.0.1 in front of ``origin``; its
    prefix, temp folders and cache in a folder of its own; stopped (by its
    pid) and removed at the end."""
    prefix = Path(tempfile.mkdtemp(prefix="wdiff-nginx-"))
    port = _free_port()
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = f"""{user}worker_processes 2;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    proxy_cache_path {prefix}/cache levels=1:2 keys_zone=fleet:10m max_size=2g inactive=1d use_temp_path=off;
    client_max_body_size 0;
    server {{
        listen 127.0.0.1:{port};
{server.replace("ORIGIN", origin).replace("TOKEN", token)}
    }}
}}
"""
    (prefix / "nginx.conf").write_text(conf)
    proc = subprocess.Popen([binary, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e",
                             str(prefix / "error.log"), "-g", "daemon off;"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:  # wait for the listening socket (or for nginx to give up)
            if proc.poll() is not None:
                raise RuntimeError(f"nginx did not start: {proc.stderr.read().decode(errors='replace')}"
                                   f"{(prefix / 'error.log').read_text(errors='replace')}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("nginx did not listen within 30 s")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(prefix, ignore_errors=True)


def pull_many(url: str, dirs: list[Path], env: dict) -> None:
    """``wdiff pull URL DIR`` in PULLERS processes at once; ``env``: changes
    to the environment, as kit.cli.run takes them (None removes a variable)."""
    procs = [subprocess.Popen(argv("pull", url, d), env=environment(env),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for d in dirs]
    failed = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            failed.append(f"exit {p.returncode}: {err[-2000:]}")
    assert not failed, failed[0]


def make_versions(root: Path) -> tuple:
    """Two checkpoints: SIZE random bytes, then 1% of them changed."""
    rng = np.random.default_rng(33)
    v0 = {"w": rand(rng, "U8", (SIZE,))}
    v1 = {"w": mutate(v0["w"], 0.01, rng)}
    return (write_ckpt(root / "v0", v0, companions={"config.json": b"{}"}),
            write_ckpt(root / "v1", v1, companions={"config.json": b"{}"}))


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    return make_versions(tmp_path_factory.mktemp("fleet"))


# -- the Hub ----------------------------------------------------------------------------


def hub_rounds(hub, versions, work: Path, endpoint: str | None) -> list[dict]:
    """Push an anchor; PULLERS pulls; push a delta; PULLERS late joiners.
    Origin traffic of each round (the stand-in's request log); through the
    proxy when ``endpoint`` is given, which adds the token."""
    import wdiff

    wdiff.push(versions[0], HUB_URL, anchor=True)
    if endpoint is None:
        env = {"HF_TOKEN": hub.token}
    else:
        env = {"HF_ENDPOINT": endpoint, "HF_TOKEN": None, "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1"}
    rows = []
    for k, v in enumerate(versions):
        if k:
            wdiff.push(v, HUB_URL, base=versions[k - 1])
        parts = {f"wdiff/{p.path}": p.size for e in wdiff.log(HUB_URL).entries for p in e.parts}
        start = len(hub.log)
        dirs = [work / f"r{k}-{i}" for i in range(PULLERS)]
        pull_many(HUB_URL, dirs, env)
        for d in dirs:
            assert tree(d) == tree(v)
        log = hub.log[start:]
        rows.append({
            "requests": len(log),
            "bytes": sum(r.sent for r in log),
            "objects": {p: sum(r.sent for r in log if r.route == "resolve" and r.path.split("?")[0].endswith(p))
                        for p in parts},
            "sizes": parts,
            "paths_info": sum(r.route == "paths_info" for r in log),
            "head_resolve": sum(r.method == "HEAD" and r.route == "resolve" for r in log),
        })
    return rows


@pytest.fixture
def hub(tmp_path, monkeypatch):
    from hubfake import FakeHub, block_internet, configure_client

    block_internet(monkeypatch)
    with FakeHub(tmp_path / "hub") as h:
        configure_client(monkeypatch, h, xet=False, home=tmp_path / "hf_home")
        yield h


def test_hub_parts_cost_one_origin_read_before_and_after_a_push(hub, nginx, versions, tmp_path):
    with caching_proxy(nginx, hub.endpoint, HUB_CONF, token=hub.token) as endpoint:
        before, after = hub_rounds(hub, versions, tmp_path, endpoint)
    anchor = next(iter(before["sizes"]))
    # each part's bytes leave the origin once, whoever asks and whenever
    assert before["objects"][anchor] == before["sizes"][anchor]
    assert after["objects"][anchor] == 0, "late joiners read the anchor from the origin again"
    delta = next(p for p in after["sizes"] if p != anchor)
    assert after["objects"][delta] == after["sizes"][delta]
    # the chain is read with one GET, never with a paths-info call or a HEAD first
    assert before["paths_info"] == after["paths_info"] == 0
    assert before["head_resolve"] == after["head_resolve"] == 0


def test_hub_chain_records_the_commit_that_added_each_part(hub, versions):
    import wdiff

    wdiff.push(versions[0], HUB_URL, anchor=True)
    wdiff.push(versions[1], HUB_URL, base=versions[0])
    repo = hub.repo("acme/fleet")
    entries = wdiff.log(HUB_URL).entries
    for e in entries:
        for p in e.parts:
            commit = repo.commits[p.commit]
            assert f"wdiff/{p.path}" in commit.files  # the part is there, at that commit
            # the commit that added it: its parent did not have it
            assert commit.parent is None or f"wdiff/{p.path}" not in repo.commits[commit.parent].files
    assert entries[0].parts[0].commit != entries[1].parts[0].commit
    # and `wdiff log --json` shows it, as its schema documents
    import json

    from schemacheck import errors

    out = ok("log", "--json", HUB_URL, timeout=120).stdout
    doc = json.loads(out)
    schema = json.loads((Path(wdiff.__file__).parent / "cli" / "schemas" / "log.json").read_text())
    assert errors(schema, doc) == []
    shown = sorted(p["commit"] for e in doc["entries"] for p in e["parts"])
    assert shown == sorted(p.commit for e in entries for p in e.parts)


def test_a_parts_commit_is_checked_and_ignored_where_there_are_no_commits(versions, tmp_path):
    """A chain is input: a part's commit is 40 hex digits or the chain is
    refused (it becomes part of a URL); a directory remote has no commits
    and reads the part where it is."""
    import json

    import wdiff

    remote = tmp_path / "remote"
    wdiff.push(versions[0], remote, anchor=True)
    doc = json.loads((remote / "chain.json").read_bytes())
    for bad in ("../../../etc/passwd", "A" * 40, "0" * 39, 7, "main"):
        doc["entries"][0]["parts"][0]["commit"] = bad
        (remote / "chain.json").write_text(json.dumps(doc))
        r = run("pull", remote, tmp_path / "bad", timeout=120)
        assert r.returncode == 4 and "malformed commit" in r.stderr, (bad, r.returncode, r.stderr)
        assert not (tmp_path / "bad").exists()
    doc["entries"][0]["parts"][0]["commit"] = "0123456789abcdef0123456789abcdef01234567"
    (remote / "chain.json").write_text(json.dumps(doc))
    pull_many(str(remote), [tmp_path / "good"], {})
    assert tree(tmp_path / "good") == tree(versions[0])


# -- S3 ---------------------------------------------------------------------------------


def s3_rounds(s3, versions, work: Path, monkeypatch, endpoint: str | None, origin) -> list[dict]:
    """As hub_rounds, for S3: pushes go straight to the origin with the
    owner's credentials; pullers read through the proxy anonymously."""
    import wdiff

    bucket = s3.new_bucket()
    url = f"s3://{bucket}/fleet"
    wdiff.push(versions[0], url, anchor=True)
    if endpoint is None:
        env = {}
    else:
        s3.allow_anonymous_reads(bucket)
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None,
               "FSSPEC_S3_ANON": "true"}
    rows = []
    for k, v in enumerate(versions):
        if k:
            wdiff.push(v, url, base=versions[k - 1])
        parts = {p.path: p.size for e in wdiff.log(url).entries for p in e.parts}
        start = len(origin.log)
        dirs = [work / f"s{k}-{i}" for i in range(PULLERS)]
        pull_many(url, dirs, env)
        for d in dirs:
            assert tree(d) == tree(v)  # never a stale chain, cache-everything proxy or not
        log = origin.log[start:]
        rows.append({
            "requests": len(log),
            "bytes": sum(r[4] for r in log),
            "objects": {p: sum(r[4] for r in log if r[1].split("?")[0].endswith(p)) for p in parts},
            "sizes": parts,
            "url": url,
        })
    return rows


@pytest.fixture
def s3(moto_s3, monkeypatch):
    from s3fake import FaultProxy, configure

    with FaultProxy(moto_s3.endpoint) as origin:  # counts what the origin serves
        configure(monkeypatch, origin.endpoint)
        moto_s3.origin = origin
        yield moto_s3


def test_s3_parts_cost_one_origin_read_and_the_chain_stays_fresh(s3, nginx, versions, tmp_path, monkeypatch):
    with caching_proxy(nginx, s3.origin.endpoint, S3_CONF) as endpoint:
        before, after = s3_rounds(s3, versions, tmp_path, monkeypatch, endpoint, s3.origin)
    anchor = next(iter(before["sizes"]))
    assert before["objects"][anchor] == before["sizes"][anchor]
    assert after["objects"][anchor] == 0
    delta = next(p for p in after["sizes"] if p != anchor)
    assert after["objects"][delta] == after["sizes"][delta]


def test_s3_objects_carry_cache_control(s3, versions):
    import s3fs

    import wdiff

    url = f"s3://{s3.new_bucket()}/fleet"
    wdiff.push(versions[0], url, anchor=True)
    bucket, prefix = url[len("s3://"):].split("/", 1)
    fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)

    def cache_control(key: str) -> str | None:
        return fs.call_s3("head_object", Bucket=bucket, Key=f"{prefix}/{key}").get("CacheControl")

    assert cache_control(wdiff.log(url).entries[0].parts[0].path) == IMMUTABLE
    assert cache_control("chain.json") == "no-cache"


def test_s3_anonymous_read_needs_no_credentials(s3, nginx, versions, tmp_path):
    import wdiff

    bucket = s3.new_bucket()
    url = f"s3://{bucket}/fleet"
    wdiff.push(versions[0], url, anchor=True)
    s3.allow_anonymous_reads(bucket)
    with caching_proxy(nginx, s3.origin.endpoint, S3_CONF) as endpoint:
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None,
               "AWS_SHARED_CREDENTIALS_FILE": tmp_path / "none", "AWS_CONFIG_FILE": tmp_path / "none"}
        refused = run("pull", url, tmp_path / "a", env=env)
        assert refused.returncode == 7, refused.stderr  # no credentials, no anonymous switch: refused
        assert not (tmp_path / "a").exists()
        pull_many(url, [tmp_path / "b"], {**env, "FSSPEC_S3_ANON": "true"})
    assert tree(tmp_path / "b") == tree(versions[0])


# -- the table ----------------------------------------------------------------------------


def _main() -> None:  # pragma: no cover - a measurement, run by hand
    """Print origin requests and bytes, direct and through the proxy,
    before and after a push, for the Hub and S3."""
    sys.path.insert(0, os.path.dirname(__file__))
    from hubfake import FakeHub, configure_client
    from s3fake import FaultProxy, MotoS3, configure

    binary = nginx_binary()
    assert binary, "nginx is not installed"
    mp = pytest.MonkeyPatch()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        vs = make_versions(tmp)
        for via in ("direct", "proxy"):
            with FakeHub(tmp / f"hub-{via}") as hub:
                configure_client(mp, hub, xet=False, home=tmp / f"hf-{via}")
                if via == "proxy":
                    with caching_proxy(binary, hub.endpoint, HUB_CONF, token=hub.token) as ep:
                        rows = hub_rounds(hub, vs, tmp / f"h-{via}", ep)
                else:
                    rows = hub_rounds(hub, vs, tmp / f"h-{via}", None)
                out += [("Hub", via, r) for r in rows]
            mp.undo()
        with MotoS3() as moto:
            for via in ("direct", "proxy"):
                with FaultProxy(moto.endpoint) as origin:
                    configure(mp, origin.endpoint)
                    moto.origin = origin
                    if via == "proxy":
                        with caching_proxy(binary, origin.endpoint, S3_CONF) as ep:
                            rows = s3_rounds(moto, vs, tmp / f"s-{via}", mp, ep, origin)
                    else:
                        rows = s3_rounds(moto, vs, tmp / f"s-{via}", mp, None, origin)
                    out += [("S3", via, r) for r in rows]
                mp.undo()
    print(f"{PULLERS} pullers per round; origin traffic per round\n")
    print("| origin | pullers reach it | round | origin requests | origin bytes | anchor bytes | delta bytes |")
    print("|---|---|---|---:|---:|---:|---:|")
    for k, (origin, via, r) in enumerate(out):
        stage = "anchor pushed" if k % 2 == 0 else "after a 2nd push: late joiners"
        anchor = next(iter(out[k - k % 2][2]["sizes"]))  # the one part of the first round
        delta = sum(n for p, n in r["objects"].items() if p != anchor)
        print(f"| {origin} | {via} | {stage} | {r['requests']} | {r['bytes']:,} | {r['objects'][anchor]:,} "
              f"| {delta:,} |")
    sizes = out[1][2]["sizes"]
    anchor = next(iter(out[0][2]["sizes"]))
    print(f"\nanchor part {sizes[anchor]:,} bytes, delta part "
          f"{sum(n for p, n in sizes.items() if p != anchor):,} bytes")


if __name__ == "__main__":
    _main()
