"""Attacks on the fleet surfaces of issue 33 (many writers and commit, the
chain's per-part commit, the Hub's two-commit push, the bounded chain GET),
from outside: the real command line in a subprocess, hostile objects
planted by hand in the remote's storage as whoever controls it would.

Each test names its class of ../shared/THREATS.md-style attack in its
docstring. Where the attack found nothing, the test pins the refusal."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import kit.cli
import pytest
from factory import tree
from test_fleet_cache import hub  # noqa: F401 - the stand-in Hub, as the fleet tests start it
from test_gc import cli
from test_stage_fleet import committed, pair, shard, stage_all
from threatlib import OnOpen

HUB_URL = "hf://acme/fleet-attacks"


def _parts(remote: Path, stage: str) -> dict[str, list[Path]]:
    """The objects of each staged part, by bundle id."""
    out: dict[str, list[Path]] = {}
    for p in (remote / "stage" / stage).iterdir():
        bid = p.name.split(".", 1)[0].removeprefix("part-")
        out.setdefault(bid, []).append(p)
    return out


# -- class 7: a commit racing a writer ---------------------------------------------------------


@pytest.mark.slow
def test_a_part_stored_while_a_commit_runs_is_not_deleted_by_it(tmp_path):
    """Class 7: a writer that stores its part after the commit listed the
    stage is not in the version the commit publishes; the commit must not
    delete that part (the writer was told it is durable) but leave it for
    the next commit or gc. Before the fix the commit deleted everything
    under stage/NAME/ at the end, whatever it had read."""
    A, B = pair(tmp_path, "fp32")
    remote = tmp_path / "r"
    cli("push", "--anchor", A, remote, "-q")
    docs = stage_all(B, A, remote, "s1")
    # a fifth writer's part (a file the version does not need), stored beforehand and held aside, so
    # that it can land in the stage at a known point of the commit: once the commit reads a part
    extra = tmp_path / "B5"
    shutil.copytree(B, extra)
    (extra / "notes.txt").write_bytes(b"late writer\n")
    late = json.loads(cli("push", extra, remote, "--base", A, "--only", "notes.txt", "--stage", "s1",
                          "--json").stdout)["bundle_id"]
    aside = tmp_path / "aside"
    aside.mkdir()
    for p in _parts(remote, "s1")[late]:
        p.rename(aside / p.name)

    def land() -> None:
        for p in sorted(aside.iterdir(), key=lambda p: p.name.startswith("part-")):  # the manifest last
            os.rename(p, remote / "stage" / "s1" / p.name)

    first = docs[0]["bundle_id"]
    with OnOpen(remote / "stage" / "s1", f"{first}.wdb", land) as watch:
        doc = json.loads(cli("commit", remote, "--stage", "s1", "--expect", 4, "--json").stdout)
    assert watch.fired.is_set()
    assert doc["merged"] == 4
    left = _parts(remote, "s1")
    assert set(left) == {late} and len(left[late]) == 2, left  # the late part, bundle and manifest, still there
    # the version published is the four writers' one, and pulls exactly
    cli("pull", remote, tmp_path / "p", "-q")
    assert tree(tmp_path / "p") == tree(B)
    assert committed(remote, doc["bundle_id"]).is_file()


# -- class 2: what a part's signature binds ------------------------------------------------------


@pytest.fixture
def keys(tmp_path):
    out = {}
    for name in ("writer", "release"):
        cli("keygen", tmp_path / f"{name}.key", "-q")
        out[name] = tmp_path / f"{name}.key"
    return out


@pytest.mark.slow
def test_a_signed_part_cannot_be_reused_for_another_parts_bundle_or_name(tmp_path, keys):
    """Class 2: a writer's signature binds its manifest (remote, stage,
    head, bundle id and digest, file lists). Storage swapping one signed
    part's bundle for another's, renaming one signed manifest (and its
    signature) to another part's name, or dropping a part so that the
    count is short, never gets a version signed."""
    A, B = pair(tmp_path, "same-layout")
    remote = tmp_path / "r"
    trust = ["--sign", keys["release"], "--trusted-key", f"{keys['writer']}.pub"]
    cli("push", "--anchor", A, remote, "-q", "--sign", keys["release"])
    docs = stage_all(B, A, remote, "s1", "--sign", keys["writer"])
    before = (remote / "chain.json").read_bytes()
    st = remote / "stage" / "s1"
    saved = tmp_path / "saved"
    shutil.copytree(st, saved)
    x, y = docs[0]["bundle_id"], docs[1]["bundle_id"]

    def restore() -> None:
        shutil.rmtree(st)
        shutil.copytree(saved, st)

    # X's bundle object replaced by Y's bytes (both signed by the writer)
    shutil.copy(st / f"{y}.wdb", st / f"{x}.wdb")
    r = cli("commit", remote, "--stage", "s1", "--expect", 4, *trust, want=4)
    assert "damaged" in r.stderr or "not the one the manifest describes" in r.stderr, r.stderr
    restore()
    # X's manifest and signature under Y's name (Y's own removed): the name does not match what it signs
    for suffix in ("", ".minisig"):
        shutil.copy(st / f"part-{x}.json{suffix}", st / f"part-{y}.json{suffix}")
    r = cli("commit", remote, "--stage", "s1", "--expect", 4, *trust, want=4)
    assert "not its own" in r.stderr, r.stderr
    restore()
    # a part dropped: the count is the commit's own (--expect), never the stage's
    for p in _parts(remote, "s1")[y]:
        p.unlink()
    r = cli("commit", remote, "--stage", "s1", "--expect", 4, *trust, want=3)
    assert (remote / "chain.json").read_bytes() == before
    restore()
    doc = json.loads(cli("commit", remote, "--stage", "s1", "--expect", 4, *trust, "--json").stdout)
    cli("pull", remote, tmp_path / "p", "--trusted-key", f"{keys['release']}.pub", "-q")
    assert tree(tmp_path / "p") == tree(B) and doc["merged"] == 4


# -- class 1: the stage is input -------------------------------------------------------------------


@pytest.mark.slow
def test_a_stage_that_is_a_link_or_names_paths_outside_is_refused(tmp_path):
    """Class 1: stage/NAME/ as a link to a folder outside the remote, and
    a manifest whose bundle path climbs out of its stage, are refused; the
    commit reads, writes and deletes nothing outside the remote."""
    A, B = pair(tmp_path, "fp32")
    remote = tmp_path / "r"
    cli("push", "--anchor", A, remote, "-q")
    stage_all(B, A, remote, "s1")
    before = (remote / "chain.json").read_bytes()
    outside = tmp_path / "outside"
    (remote / "stage" / "s1").rename(outside)
    (remote / "stage" / "s1").symlink_to(outside, target_is_directory=True)
    snapshot = tree(outside)
    r = cli("commit", remote, "--stage", "s1", "--expect", 4, want=None)
    assert r.returncode != 0 and "link" in r.stderr, r.stderr
    assert tree(outside) == snapshot and (remote / "chain.json").read_bytes() == before
    (remote / "stage" / "s1").unlink()
    outside.rename(remote / "stage" / "s1")
    # a manifest naming a bundle outside its stage (unsigned: storage trusted, but not past the stage)
    m = next((remote / "stage" / "s1").glob("part-*.json"))
    doc = json.loads(m.read_bytes())
    doc["path"] = "stage/s1/../../objects/" + doc["bundle"] + ".wdb"
    m.write_text(json.dumps(doc))
    r = cli("commit", remote, "--stage", "s1", "--expect", 4, want=4)
    assert "outside its stage" in r.stderr
    assert (remote / "chain.json").read_bytes() == before


# -- class 2 and 3: the chain's per-part commit on the Hub ------------------------------------------


def _hub_commit(files: dict[str, bytes], message: str) -> str:
    from huggingface_hub import CommitOperationAdd, HfApi

    info = HfApi().create_commit(HUB_URL.removeprefix("hf://"), operations=[
        CommitOperationAdd(path, data) for path, data in files.items()], commit_message=message)
    return info.oid


def _set_commit(chain: dict, path: str, commit: str) -> int:
    n = 0
    for e in chain["entries"]:
        for p in e["parts"]:
            if p["path"] == path:
                p["commit"], n = commit, n + 1
    return n


@pytest.mark.slow
def test_a_hub_chain_pointing_a_part_at_a_commit_with_other_bytes_is_refused(hub, tmp_path):
    """Class 2/3: whoever can write the Hub repository records, for a
    part, a commit where the part's path holds other bytes (or nothing).
    The commit is only where to read: the part's digest from the chain
    still decides, the pull fails with status 4 and leaves no directory."""
    A, B = pair(tmp_path, "fp32")
    cli("push", "--anchor", A, HUB_URL, "-q")
    cli("push", B, HUB_URL, "--base", A, "-q")
    raw = kit.cli.ok("log", "--json", HUB_URL, timeout=120).stdout
    part = json.loads(raw)["entries"][0]["parts"][0]
    from huggingface_hub import hf_hub_download

    chain = json.loads(Path(hf_hub_download(HUB_URL.removeprefix("hf://"), "wdiff/chain.json",
                                            local_dir=tmp_path / "dl")).read_bytes())
    # a commit holding other bytes of the same size at the part's path
    evil = _hub_commit({f"wdiff/{part['path']}": b"\0" * part["size"]}, "other bytes")
    assert _set_commit(chain, part["path"], evil) == 1
    _hub_commit({"wdiff/chain.json": json.dumps(chain).encode()}, "planted chain")
    r = cli("pull", HUB_URL, tmp_path / "p", want=None)
    assert r.returncode == 4 and not (tmp_path / "p").exists(), (r.returncode, r.stderr)
    # and a commit that does not hold the part at all (the repository's first commit has no objects)
    from huggingface_hub import HfApi

    first = HfApi().list_repo_commits(HUB_URL.removeprefix("hf://"))[-1].commit_id
    assert _set_commit(chain, part["path"], first) == 1
    _hub_commit({"wdiff/chain.json": json.dumps(chain).encode()}, "planted chain 2")
    r = cli("pull", HUB_URL, tmp_path / "p", want=None)
    assert r.returncode != 0 and not (tmp_path / "p").exists(), (r.returncode, r.stderr)


@pytest.mark.slow
def test_a_hub_chain_over_the_cap_is_refused_by_the_bounded_get(hub, tmp_path):
    """Class 5: the chain is read in one GET bounded by wdiff's limit
    (32 MiB), whatever the server announces; a bigger chain.json at the
    head is refused (status 4) by log and pull, in bounded memory."""
    A, _ = pair(tmp_path, "fp32")
    cli("push", "--anchor", A, HUB_URL, "-q")
    _hub_commit({"wdiff/chain.json": b" " * (33 * 1024 * 1024) + b"{}"}, "a chain past the cap")
    for args in (("log", HUB_URL), ("pull", HUB_URL, tmp_path / "p")):
        r = cli(*args, want=None)
        assert r.returncode == 4 and "larger than" in r.stderr, (args, r.returncode, r.stderr)
    assert not (tmp_path / "p").exists()


# -- class 7 and 8: a writer killed mid-pack -----------------------------------------------------


def test_a_staged_push_killed_mid_pack_leaves_nothing_beside_the_checkpoint(tmp_path):
    """Class 7/8: a writer host dies (or cron kills it) while it packs its
    part. Before the fix the partial bundle stayed in a hidden
    ``.wdiff-stage-*`` folder beside the user's checkpoint for ever, one
    more per killed run; now it is packed in a scratch folder of TMPDIR that
    the next staged push removes once its owner is gone."""
    import signal
    import time

    from threatlib import finish, ok, start, user_env, wdiff

    env = user_env(tmp_path / "user")
    tmp = Path(env["TMPDIR"])
    A, B = pair(tmp_path / "data", "fp32")
    remote = tmp_path / "r"
    ok(wdiff("push", "--anchor", A, remote, "-q", env=env))
    parent = B.parent

    def debris() -> list[str]:
        beside = [n for n in os.listdir(parent) if n.startswith(".wdiff-stage-")]
        return beside + [n for n in os.listdir(tmp) if n.startswith("wdiff-stage-")]

    args = ["push", B, remote, "--base", A, "--only", "*.safetensors", "--stage", "s1", "--level", "19", "-q"]
    t0 = time.monotonic()
    p = start(args, env)
    while not debris() and p.poll() is None and time.monotonic() < t0 + 60:
        time.sleep(0.001)
    caught = p.poll() is None and bool(debris())
    if caught:
        os.killpg(p.pid, signal.SIGKILL)
    finish(p, args, t0, 60)
    assert caught, "the staged push ended before it was caught packing"
    assert not [n for n in os.listdir(parent) if n.startswith(".")], os.listdir(parent)  # nothing beside B
    # the rerun removes the dead run's scratch and stores the part
    ok(wdiff("push", B, remote, "--base", A, "--only", "*.safetensors", "--stage", "s1", "-q", env=env))
    assert debris() == []
    assert len(list((remote / "stage" / "s1").glob("part-*.json"))) == 1


# -- class 6: a part as if it were the whole; two parts that disagree on a base file -------------------


@pytest.mark.slow
def test_one_part_is_never_the_whole_version_and_parts_must_agree_on_their_base(tmp_path):
    """Class 6: a stage holding one writer's part, committed with
    ``--expect 1``, is refused (its bases are not the head): a part never
    publishes as the version. Two writers that hold the same base file
    (the old shard of a tensor that moved) with different bytes are
    refused, never merged under either's row."""
    A, B = pair(tmp_path, "moved")
    remote = tmp_path / "r"
    cli("push", "--anchor", A, remote, "-q")
    before = (remote / "chain.json").read_bytes()
    cli("push", B, remote, "--base", A, "--only", shard(1), "--stage", "one", "-q")
    r = cli("commit", remote, "--stage", "one", "--expect", 1, want=5)
    assert "not the head" in r.stderr, r.stderr
    # the writer of shard 2 holds shard 1 of the base too (a.s moved), but another copy of it
    other = tmp_path / "A-other"
    shutil.copytree(A, other)
    raw = bytearray((other / shard(0)).read_bytes())
    raw[-1] ^= 0xFF  # one byte of the shard's data: same name and size, other bytes
    (other / shard(0)).write_bytes(bytes(raw))
    bases = [(B, A), (B, other), (B, A), (B, A)]
    stage_all(B, A, remote, "two", bases=bases)
    r = cli("commit", remote, "--stage", "two", "--expect", 4, want=5)
    assert "different base files" in r.stderr, r.stderr
    assert (remote / "chain.json").read_bytes() == before
