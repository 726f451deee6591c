"""Many writers, one version, as a fleet runs it: the committed bundle is
byte for byte `wdiff pack A B` and applies onto A (apply, pull into a
directory at A, pull into an empty one), whatever the shards look like;
and a commit signs only parts its trusted writers signed, never resolving
two parts of one file by which is newer.

Every command is the real CLI in a subprocess; hostile parts are planted in
the remote's stage as whoever controls its storage would."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from factory import mutate, rand, tree, write_ckpt
from kit.cli import argv, environment
from test_gc import cli
from test_sync import remote, versions  # noqa: F401 - fixtures of the remote kinds

from wdiff.format.chain import Chain


def shard(k: int, n: int = 4) -> str:
    return f"model-{k + 1:05d}-of-{n:05d}.safetensors"


def pair(tmp_path: Path, shape: str) -> tuple[Path, Path]:
    """A 4-shard pair, 1% of elements changed, shaped as ``shape`` says:
    "moved" (shards of different sizes, a tensor larger than a unit of 4 MiB,
    a tensor that moves to another shard), "fp32" (one shard unchanged)."""
    rng = np.random.default_rng(33)
    dt = "F32" if shape == "fp32" else "BF16"
    t = {"a.big": rand(rng, dt, (1200, 1800) if dt == "BF16" else (600, 1800)),  # two units of 4 MiB
         "a.s": rand(rng, dt, (64, 64)), "b.w": rand(rng, dt, (512, 256)), "b.n": rand(rng, dt, (512,)),
         "c.w": rand(rng, dt, (256, 256)), "d.w": rand(rng, dt, (128, 64)), "d.e": rand(rng, dt, (32, 32))}
    ga = [["a.big", "a.s"], ["b.w", "b.n"], ["c.w"], ["d.w", "d.e"]]
    A = Path(write_ckpt(tmp_path / "A", t, groups=ga, companions={"config.json": b'{"step": 1}',
                                                                  "tokenizer.json": b"{}"}))
    keep = {"d.w", "d.e"} if shape == "fp32" else set()
    t = {n: x if n in keep else mutate(x, 0.01, rng) for n, x in t.items()}
    gb = [["a.big"], ["a.s", "b.w", "b.n"], ["c.w"], ["d.w", "d.e"]] if shape == "moved" else ga
    B = Path(write_ckpt(tmp_path / "B", t, groups=gb, companions={"config.json": b'{"step": 2}',
                                                                  "tokenizer.json": b"{}"}))
    return A, B


def stage_all(B: Path, A: Path, remote: Path, stage: str, *extra, bases=None) -> list[dict]:
    """Four writers, one shard each; the first also takes the *.json files."""
    docs = []
    for k in range(4):
        only = ["--only", shard(k)] + (["--only", "*.json"] if k == 0 else [])
        src, base = (B, A) if bases is None else bases[k]
        docs.append(json.loads(cli("push", src, remote, "--base", base, *only, "--stage", stage, "--json",
                                   *extra).stdout))
    return docs


def committed(remote: Path, bundle_id: str) -> Path:
    return remote / "objects" / bundle_id[:2] / f"{bundle_id}.wdb"


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["moved", "fp32", "same-layout"])
def test_committed_version_is_the_single_host_bundle_and_applies_onto_its_base(tmp_path, shape):
    A, B = pair(tmp_path, shape)
    remote = tmp_path / "r"
    cli("push", "--anchor", A, remote, "-q")
    stage_all(B, A, remote, "s1")
    doc = json.loads(cli("commit", remote, "--stage", "s1", "--expect", 4, "--json").stdout)
    whole = tmp_path / "whole.wdb"
    cli("pack", A, B, "-o", whole, "-q")
    # byte for byte what one host holding every file packs
    assert committed(remote, doc["bundle_id"]).read_bytes() == whole.read_bytes()
    # it applies onto A, and pulls onto A and from nothing, exactly
    cli("apply", committed(remote, doc["bundle_id"]), A, "-o", tmp_path / "applied", "-q")
    assert tree(tmp_path / "applied") == tree(B)
    shutil.copytree(A, tmp_path / "at-a")
    pulled = json.loads(cli("pull", remote, tmp_path / "at-a", "--json").stdout)
    assert not pulled["from_anchor"] and pulled["bundles"] == [doc["bundle_id"]]
    assert tree(tmp_path / "at-a") == tree(B)
    cli("pull", remote, tmp_path / "empty", "-q")
    assert tree(tmp_path / "empty") == tree(B)


@pytest.mark.slow
def test_a_writer_without_the_base_of_a_moved_tensor_is_refused_at_commit(tmp_path):
    """Hosts that each hold only their own shards of A and B: the tensor that
    moved into shard 2 has its base in shard 1, which that writer lacks. Its
    part cannot hold the record a single host writes, so the commit refuses
    (and names the tensor and the file) instead of publishing a version that
    no base accepts."""
    A, B = pair(tmp_path, "moved")
    remote = tmp_path / "r"
    cli("push", "--anchor", A, remote, "-q")
    bases = []
    for k in range(4):
        h = tmp_path / f"host{k}"
        for side, src in (("A", A), ("B", B)):
            (h / side).mkdir(parents=True)
            for f in [shard(k)] + (["config.json", "tokenizer.json", "model.safetensors.index.json"] if k == 0 else []):
                shutil.copy(src / f, h / side / f)
        bases.append((h / "B", h / "A"))
    before = (remote / "chain.json").read_bytes()
    stage_all(B, A, remote, "s1", bases=bases)
    r = cli("commit", remote, "--stage", "s1", "--expect", 4, want=5)
    assert "tensor a.s" in r.stderr and shard(0) in r.stderr
    assert (remote / "chain.json").read_bytes() == before
    # the host given shard 1 of A as well stages a part that fits
    shutil.copy(A / shard(0), tmp_path / "host1" / "A" / shard(0))
    stage_all(B, A, remote, "s2", bases=bases)
    doc = json.loads(cli("commit", remote, "--stage", "s2", "--expect", 4, "--json").stdout)
    cli("pack", A, B, "-o", tmp_path / "whole.wdb", "-q")
    assert committed(remote, doc["bundle_id"]).read_bytes() == (tmp_path / "whole.wdb").read_bytes()


@pytest.fixture
def keys(tmp_path):
    out = {}
    for name in ("writer", "release", "mallory"):
        cli("keygen", tmp_path / f"{name}.key", "-q")
        out[name] = tmp_path / f"{name}.key"
    return out


def other_checkpoint(tmp_path: Path, B: Path) -> Path:
    """What an attacker would rather publish: B with shard 1 replaced."""
    C = tmp_path / "C"
    shutil.copytree(B, C)
    rng = np.random.default_rng(666)
    t = {"a.big": rand(rng, "BF16", (1200, 1800)), "a.s": rand(rng, "BF16", (64, 64))}
    write_ckpt(tmp_path / "evil", t, groups=[["a.big", "a.s"]])
    shutil.copy(tmp_path / "evil" / "model.safetensors", C / shard(0))
    return C


@pytest.mark.slow
def test_a_part_planted_in_the_stage_is_never_signed_nor_chosen_by_date(tmp_path, keys):
    A, B = pair(tmp_path, "same-layout")
    C = other_checkpoint(tmp_path, B)
    remote = tmp_path / "r"
    release_pub = f"{keys['release']}.pub"
    cli("push", "--anchor", A, remote, "-q", "--sign", keys["release"])
    before = (remote / "chain.json").read_bytes()
    docs = stage_all(B, A, remote, "s1", "--sign", keys["writer"])
    assert all(d["signed"] for d in docs)
    # storage stages a third part for shard 1, packed from another checkpoint: unsigned, then signed by a
    # key nobody trusts; the commit that signs refuses both and publishes nothing
    cli("push", C, remote, "--base", A, "--only", shard(0), "--only", "*.json", "--stage", "s1", "-q")
    r = cli("commit", remote, "--stage", "s1", "--expect", 4, "--sign", keys["release"], "--trusted-key",
            f"{keys['writer']}.pub", want=4)
    assert "not signed" in r.stderr
    assert (remote / "chain.json").read_bytes() == before
    planted = [p for p in (remote / "stage" / "s1").glob("part-*.json")
               if p.stem.split("-", 1)[1] not in {d["bundle_id"] for d in docs}]
    assert len(planted) == 1
    # a trusted writer's signature (of another part) beside the planted manifest
    shutil.copy(remote / "stage" / "s1" / f"part-{docs[1]['bundle_id']}.json.minisig",
                planted[0].with_name(planted[0].name + ".minisig"))
    r = cli("commit", remote, "--stage", "s1", "--expect", 4, "--sign", keys["release"], "--trusted-key",
            f"{keys['writer']}.pub", want=4)
    assert "signature does not match" in r.stderr
    # without signatures the two parts of one file are refused, never resolved by their dates
    r = cli("commit", remote, "--stage", "s1", "--expect", 4, want=5)
    assert "in two parts" in r.stderr
    assert (remote / "chain.json").read_bytes() == before
    # the planted part gone (storage is honest again), the writers' parts are published, signed, and pull
    for p in remote.glob(f"stage/s1/*{planted[0].stem.split('-', 1)[1]}*"):
        p.unlink()
    doc = json.loads(cli("commit", remote, "--stage", "s1", "--expect", 4, "--sign", keys["release"],
                         "--trusted-key", f"{keys['writer']}.pub", "--json").stdout)
    cli("pull", remote, tmp_path / "p", "--trusted-key", release_pub, "-q")
    assert tree(tmp_path / "p") == tree(B)
    assert Chain.decode((remote / "chain.json").read_bytes(), where="r").head.hex() == doc["version"]


@pytest.mark.slow
def test_a_part_signed_by_an_untrusted_key_or_edited_after_signing_is_refused(tmp_path, keys):
    A, B = pair(tmp_path, "same-layout")
    remote = tmp_path / "r"
    cli("push", "--anchor", A, remote, "-q")
    before = (remote / "chain.json").read_bytes()
    docs = stage_all(B, A, remote, "s1", "--sign", keys["writer"])
    trust = ["--sign", keys["release"], "--trusted-key", f"{keys['writer']}.pub"]
    # the first writer's part re-signed by mallory: her key is not trusted
    m = remote / "stage" / "s1" / f"part-{docs[0]['bundle_id']}.json"
    honest = m.with_name(m.name + ".minisig").read_bytes()
    cli("push", B, remote, "--base", A, "--only", shard(0), "--only", "*.json", "--stage", "s1", "-q",
        "--sign", keys["mallory"])  # the same part, stored again: its signature is kept (same size)
    m.with_name(m.name + ".minisig").unlink()
    cli("push", B, remote, "--base", A, "--only", shard(0), "--only", "*.json", "--stage", "s1", "-q",
        "--sign", keys["mallory"])
    r = cli("commit", remote, "--stage", "s1", "--expect", 4, *trust, want=4)
    assert "not trusted" in r.stderr
    # the manifest edited (it now says the part holds one file less) under the writer's signature
    m.with_name(m.name + ".minisig").write_bytes(honest)
    d = json.loads(m.read_bytes())
    d["files"] = d["files"][1:]
    m.write_text(json.dumps(d, sort_keys=True, separators=(",", ":")) + "\n")
    r = cli("commit", remote, "--stage", "s1", "--expect", 4, *trust, want=4)
    assert "signature does not match" in r.stderr
    # unsigned, the edited manifest no longer describes its bundle
    r = cli("commit", remote, "--stage", "s1", "--expect", 4, want=4)
    assert "not the one the manifest describes" in r.stderr
    assert (remote / "chain.json").read_bytes() == before


@pytest.mark.slow
def test_parts_replayed_from_another_stage_remote_or_base_are_refused(tmp_path, keys):
    A, B = pair(tmp_path, "same-layout")
    trust = ["--sign", keys["release"], "--trusted-key", f"{keys['writer']}.pub"]
    r1, r2 = tmp_path / "r1", tmp_path / "r2"
    for r in (r1, r2):
        cli("push", "--anchor", A, r, "-q", "--sign", keys["release"])
    stage_all(B, A, r1, "s0", "--sign", keys["writer"])
    stage_all(B, A, r2, "s1", "--sign", keys["writer"])
    before = (r1 / "chain.json").read_bytes()
    # another stage's signed parts copied into stage s1 of the same remote
    shutil.copytree(r1 / "stage" / "s0", r1 / "stage" / "s1")
    r = cli("commit", r1, "--stage", "s1", "--expect", 4, *trust, want=4)
    assert "outside its stage" in r.stderr
    # the parts of the same stage name on another remote (its own identity)
    shutil.rmtree(r1 / "stage" / "s1")
    shutil.copytree(r2 / "stage" / "s1", r1 / "stage" / "s1")
    r = cli("commit", r1, "--stage", "s1", "--expect", 4, *trust, want=4)
    assert "not of stage s1 of this remote" in r.stderr
    assert (r1 / "chain.json").read_bytes() == before
    # once s0 is committed, parts signed by the writer but packed against the old head (another checkpoint,
    # from A) do not make the next version
    cli("commit", r1, "--stage", "s0", "--expect", 4, *trust, "-q")
    shutil.rmtree(r1 / "stage" / "s1")
    stage_all(other_checkpoint(tmp_path, B), A, r1, "s1", "--sign", keys["writer"])
    moved = (r1 / "chain.json").read_bytes()
    r = cli("commit", r1, "--stage", "s1", "--expect", 4, *trust, want=5)
    assert "not the head" in r.stderr
    assert (r1 / "chain.json").read_bytes() == moved


@pytest.mark.slow
def test_two_unsigned_parts_of_one_file_are_refused_whichever_is_newer(tmp_path):
    """No keys anywhere: a part planted later for the files of a writer's part
    (packed from another checkpoint) was chosen by its newer `created`; now
    the commit refuses the pair and publishes nothing."""
    A, B = pair(tmp_path, "same-layout")
    C = other_checkpoint(tmp_path, B)
    remote = tmp_path / "r"
    cli("push", "--anchor", A, remote, "-q")
    before = (remote / "chain.json").read_bytes()
    stage_all(B, A, remote, "s1")
    cli("push", C, remote, "--base", A, "--only", shard(0), "--only", "*.json", "--stage", "s1", "-q")
    r = cli("commit", remote, "--stage", "s1", "--expect", 4, want=5)
    assert "in two parts" in r.stderr
    assert (remote / "chain.json").read_bytes() == before


@pytest.mark.slow
def test_two_models_in_one_tree_staged_by_two_writers(tmp_path):
    """policy/ and ref/ hold tensors of the same names, one writer each: a
    part alone sees unique names (format version 1), the whole tree does
    not (version 2, names scoped by directory). The commit gives the merged
    bundle the version the whole needs, so it is pack's bundle and applies."""
    rng = np.random.default_rng(5)
    t = {"w": rand(rng, "F32", (128, 64)), "n": rand(rng, "F32", (64,))}
    u = {"w": rand(rng, "F32", (128, 64)), "n": rand(rng, "F32", (64,))}
    for side in ("A", "B"):
        write_ckpt(tmp_path / side / "policy", t)
        write_ckpt(tmp_path / side / "ref", u)
        (tmp_path / side / "config.json").write_text(f'{{"side": "{side}"}}')
        t = {n: mutate(x, 0.02, rng) for n, x in t.items()}
        u = {n: mutate(x, 0.02, rng) for n, x in u.items()}
    A, B, remote = tmp_path / "A", tmp_path / "B", tmp_path / "r"
    cli("push", "--anchor", A, remote, "-q")
    cli("push", B, remote, "--base", A, "--only", "policy/*", "--only", "*.json", "--stage", "s", "-q")
    cli("push", B, remote, "--base", A, "--only", "ref/*", "--stage", "s", "-q")
    doc = json.loads(cli("commit", remote, "--stage", "s", "--expect", 2, "--json").stdout)
    cli("pack", A, B, "-o", tmp_path / "whole.wdb", "-q")
    assert committed(remote, doc["bundle_id"]).read_bytes() == (tmp_path / "whole.wdb").read_bytes()
    shutil.copytree(A, tmp_path / "at-a")
    cli("pull", remote, tmp_path / "at-a", "-q")
    assert tree(tmp_path / "at-a") == tree(B)


@pytest.mark.slow
@pytest.mark.parametrize("remote", ["hub-model-xet", "s3"], indirect=True)
def test_signed_parts_through_the_hub_and_s3(remote, versions, tmp_path, keys):
    """The signed stage on the other kinds of remote, through the public API:
    a part planted without a signature stops the commit, the writers' parts
    alone are published and a puller trusting the release key gets them."""
    import wdiff
    from wdiff.errors import IntegrityError
    from wdiff.remotes import open_remote

    release, writer = keys["release"], keys["writer"]
    wdiff.push(versions[0], remote, anchor=True, sign_key=release)
    parts = [wdiff.push_part(versions[1], remote, base=versions[0], only=only, stage="s", sign_key=writer)
             for only in (["model-00001-*", "*.json"], ["model-00002-*"])]
    assert all(p.signed for p in parts)
    planted = wdiff.push_part(versions[2], remote, base=versions[0], only=["model-00002-*"], stage="s")
    with pytest.raises(IntegrityError, match="not signed"):
        wdiff.commit(remote, stage="s", expect=2, sign_key=release, trusted_keys=[f"{writer}.pub"])
    assert len(wdiff.log(remote).entries) == 1
    store = open_remote(remote)
    store.delete([p for p, _ in store.list("stage/s") if planted.bundle_id.hex() in p])
    res = wdiff.commit(remote, stage="s", expect=2, sign_key=release, trusted_keys=[f"{writer}.pub"])
    assert res.parts == 2 and res.push.uploaded
    wdiff.pull(remote, tmp_path / "p", trusted_keys=[f"{release}.pub"])
    assert tree(tmp_path / "p") == tree(versions[1])


@pytest.mark.slow
def test_a_commit_killed_after_publishing_and_two_commits_at_once(tmp_path):
    """Class 7: the stage still there after the version is published (a
    commit killed before it deleted the stage) is finished by a rerun, which
    publishes nothing new; two commits of one stage at once publish the
    version once (the other finds it published, or lost the race: 8)."""
    import subprocess

    from test_gc import GC_ENV

    A, B = pair(tmp_path, "fp32")
    remote = tmp_path / "r"
    cli("push", "--anchor", A, remote, "-q")
    stage_all(B, A, remote, "s1")
    shutil.copytree(remote / "stage" / "s1", tmp_path / "kept")
    first = json.loads(cli("commit", remote, "--stage", "s1", "--expect", 4, "--json").stdout)
    shutil.copytree(tmp_path / "kept", remote / "stage" / "s1", dirs_exist_ok=True)  # as if killed before the stage was deleted
    after = (remote / "chain.json").read_bytes()
    again = json.loads(cli("commit", remote, "--stage", "s1", "--expect", 4, "--json").stdout)
    assert again["bundle_id"] == first["bundle_id"] and not again["uploaded"]
    assert (remote / "chain.json").read_bytes() == after and not list((remote / "stage" / "s1").glob("*"))
    # two commits of one stage at once
    remote2 = tmp_path / "r2"
    cli("push", "--anchor", A, remote2, "-q")
    stage_all(B, A, remote2, "s1")
    procs = [subprocess.Popen(argv("commit", remote2, "--stage", "s1", "--expect", "4", "--json"),
                              env=environment(GC_ENV), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    codes = [p.wait(timeout=300) for p in procs]
    assert sorted(codes) in ([0, 0], [0, 8], [0, 3]), [p.stderr.read() for p in procs]
    chain = Chain.decode((remote2 / "chain.json").read_bytes(), where="r2")
    assert len(chain.entries) == 2 and chain.head.hex() == first["version"]
    cli("pull", remote2, tmp_path / "p", "-q")
    assert tree(tmp_path / "p") == tree(B)
