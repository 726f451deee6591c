"""Threat model, bundle format 3: codec v2 records (MSPARSE ... RSPARSE, the
range-coded value section), DELTA records of companion files, and apply's
O_DIRECT writes, attacked from outside through the real command line.

What is promised (README, man/wdiff.1, man/wdiff-format.5): a bundle refuses
any base but its own (5); a damaged or hostile bundle is refused (4) with
nothing written; a full disk or a file-size limit is an I/O error (9) with
nothing left behind; a v3 bundle moves through remotes, rollbacks and
squashes as any other, mixed with v1 bundles; odd names go through.

Bundles are edited with tests/specbundle.py (an independent reader/writer of
the published format): every record digest, the chain digest, the index
digest and the footer are recomputed, so only a check of what the payload
means can catch the edit. Small file systems are tmpfs mounts in a user and
mount namespace (``unshare -Urm``), skipped where the system has none.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import specbundle as sb
from factory import T, rand, tree, write_ckpt
from kit.cli import argv
from kit.system import namespaces_work
from kit.trees import digests
from threatlib import ok, user_env, wdiff, wdiff_many

#: a companion file this long is shipped as DELTA records (pack's FILE_DELTA_MIN is 1 MiB)
TOK_BYTES = (1 << 20) + 123_457  # not a multiple of any block size


def _bf16(x: np.ndarray) -> bytes:
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


def _step(rng, m: np.ndarray, lr: float, *, rows=None, density: float = 1.0) -> np.ndarray:
    """An optimizer-like step: +-lr on some elements (of some rows)."""
    u = m.copy()
    mask = rng.random(m.shape) < density
    if rows is not None:
        keep = np.zeros(m.shape[0], bool)
        keep[rows] = True
        mask &= keep[:, None]
    u[mask] += np.float32(lr) * np.where(rng.random(int(mask.sum())) < 0.5, -1, 1).astype(np.float32)
    return u


def _text(rng, n: int) -> bytes:
    return bytes(rng.integers(97, 123, n, dtype=np.uint8))


@dataclass
class World:
    root: Path
    A: Path
    B: Path
    C: Path
    ab: Path  # format 3: codec v2 CHUNK records and DELTA records
    ab1: Path  # the same step, --format 1
    bc1: Path  # the next step, --format 1
    env: dict


def _ckpt(root: Path, emb, w, norm, frozen, tok: bytes, step: int) -> Path:
    tensors = {"emb": T("BF16", emb.shape, _bf16(emb)), "w": T("F32", w.shape, w.tobytes()),
               "norm": T("F32", norm.shape, norm.tobytes()), "frozen": frozen}
    # frozen alone in the second shard: a tensor file whose source is the base, no record
    return Path(write_ckpt(root, tensors, groups=[["emb", "norm", "w"], ["frozen"]], companions={
        "tokenizer.json": tok, "keep.txt": b"the same in every version\n", "config.json": b'{"step": %d}' % step}))


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    t = tmp_path_factory.mktemp("v3")
    rng = np.random.default_rng(303)
    emb = (rng.standard_normal((512, 256)) * 0.02).astype(np.float32)
    w = (rng.standard_normal((256, 256)) * 0.02).astype(np.float32)
    norm = (rng.standard_normal(1001) * 0.02).astype(np.float32)
    frozen = rand(rng, "F32", (64, 64))
    tok = _text(rng, TOK_BYTES)
    A = _ckpt(t / "A", emb, w, norm, frozen, tok, 1)
    emb, w, norm = _step(rng, emb, 3e-4, rows=rng.choice(512, 6, replace=False)), _step(rng, w, 1e-6, density=0.3), norm + np.float32(1e-6)
    # the edit past the first MiB: the DELTA records leave [0, 1 MiB) to the base
    tok = tok[:1_100_001] + b"EDIT" + tok[1_100_005:] + b"+tail"
    B = _ckpt(t / "B", emb, w, norm, frozen, tok, 2)
    emb, w = _step(rng, emb, 3e-4, rows=rng.choice(512, 6, replace=False)), _step(rng, w, 1e-6, density=0.3)
    C = _ckpt(t / "C", emb, w, norm, frozen, tok[:700_000] + tok[700_100:], 3)
    env = user_env(t / "user", extra={"WDIFF_THREADS": "2", "NO_COLOR": "1"})
    paths = {}
    for name, args in (("ab", (A, B)), ("ab1", ("--format", "1", A, B)), ("bc1", ("--format", "1", B, C))):
        paths[name] = t / f"{name}.wdb"
        ok(wdiff("pack", "-q", *args, "-o", paths[name], env=env))
    return World(t, A, B, C, env=env, **paths)


def info(world: World, bundle: Path) -> dict:
    return json.loads(ok(wdiff("info", "--json", bundle, env=world.env)).stdout)


def test_world_holds_what_is_attacked(world):
    """The step is packed as format 3 with codec v2 records and DELTA
    records, the --format 1 bundle without them; otherwise the attacks
    below would test nothing new."""
    i3, i1 = info(world, world.ab), info(world, world.ab1)
    assert i3["format_version"] == 3 and i1["format_version"] == 1
    v2 = {"msparse", "mbitmap", "mdense", "csparse", "cdense", "rsparse"}
    assert v2 & set(i3["records"]), i3["records"]
    assert any(k.startswith("file-") for k in i3["records"]), i3["records"]  # DELTA records
    assert not (v2 & set(i1["records"])), i1["records"]
    assert {f["path"]: f["source"] for f in i3["files"]}["tokenizer.json"] == "delta"


# -- helpers ---------------------------------------------------------------------------------


def leftovers(parent: Path, name: str) -> list[str]:
    """Anything of an apply -o OUT left beside OUT (its hidden temp dir)."""
    return sorted(n for n in os.listdir(parent) if n.startswith(f".{name}.wdiff-"))


def refused(run, code: int, parent: Path, name: str):
    assert run.rc == code, str(run)
    assert "unexpected error" not in run.stderr and "Traceback" not in run.stderr, str(run)
    assert not (parent / name).exists(), f"{name} appeared: {run}"
    assert leftovers(parent, name) == [], str(run)


# -- truncated downloads: every section boundary ----------------------------------------------


def boundaries(data: bytes) -> list[int]:
    """Offsets of the section boundaries of a bundle: the preamble, the
    fields of the first record's header, the end of its first section and
    of every record, the index and the footer's fields."""
    b = sb.parse(data)
    cuts = {0, 12, 16, 16 + 64, 16 + 111, 16 + 112 + len(b.records[0].sections[0])}
    off = 16
    for r in b.records:
        off += 112 + sum(len(s) for s in r.sections)
        cuts.add(off)
    cuts |= {off + 1, len(data) - 48, len(data) - 8, len(data) - 1}
    return sorted(c for c in cuts if 0 <= c < len(data))


def test_truncated_at_every_section_boundary_is_refused(world, tmp_path):
    """A bundle cut at a section boundary (a download that stopped) is
    refused, 4, with no output and no temp dir, the base untouched."""
    data = world.ab.read_bytes()
    cuts = boundaries(data)
    assert len(cuts) >= 12
    before = tree(world.A)
    cmds = []
    for c in cuts:
        (tmp_path / f"cut{c}.wdb").write_bytes(data[:c])
        cmds.append(["apply", "-q", tmp_path / f"cut{c}.wdb", world.A, "-o", tmp_path / f"out{c}"])
    for k in range(0, len(cmds), 7):
        for c, run in zip(cuts[k:k + 7], wdiff_many(cmds[k:k + 7], world.env, timeout=60)):
            refused(run, 4, tmp_path, f"out{c}")
    assert tree(world.A) == before


# -- payload edits with every digest recomputed -----------------------------------------------


V2 = {sb.MSPARSE, sb.MBITMAP, sb.MDENSE, sb.CSPARSE, sb.CDENSE, sb.RSPARSE}


def edited(data: bytes, pick) -> list[tuple[str, bytes]]:
    """Bundles each with one bit flipped in one record that ``pick(rec)``
    chooses (its last non-empty section: the value section of codec v2,
    the zstd frame of ZSTD_BASE; and section 0 of RSPARSE, its row list),
    every digest recomputed."""
    out = []
    b = sb.parse(data)
    for i, r in enumerate(b.records):
        if not pick(r):
            continue
        secs = [max(s for s in range(3) if r.sections[s])] + ([0] if r.codec == sb.RSPARSE else [])
        for s in secs:
            c = b.copy()
            flipped = bytearray(r.sections[s])
            flipped[len(flipped) // 2] ^= 0x10
            c.records[i].sections[s] = bytes(flipped)
            out.append((f"record {i} type {r.type} codec {r.codec} section {s}", sb.serialize(c, fix_index=False)))
    return out


def test_v3_payload_edits_with_valid_digests_are_refused(world, tmp_path):
    """One bit of any section of a codec v2 or DELTA record, with the record
    digest, the chain digest, the index digest and the footer recomputed:
    only decoding and the target digests can tell, and they must (4)."""
    data = world.ab.read_bytes()
    cases = edited(data, lambda r: (r.type == sb.CHUNK and r.codec in V2) or r.type == sb.DELTA)
    assert len(cases) >= 4, "the world has too few v3 records"
    # the edit is framed right: the spec reader takes the edited bundle's
    # framing and digests (sb.parse raises otherwise)
    for _, raw in cases:
        sb.parse(raw)
    cmds = []
    for k, (_, raw) in enumerate(cases):
        (tmp_path / f"e{k}.wdb").write_bytes(raw)
        cmds.append(["apply", "-q", tmp_path / f"e{k}.wdb", world.A, "-o", tmp_path / f"out{k}"])
    for k0 in range(0, len(cmds), 8):
        for k, run in zip(range(k0, k0 + 8), wdiff_many(cmds[k0:k0 + 8], world.env, timeout=60)):
            assert run.rc == 4, f"{cases[k][0]}: {run}"
            refused(run, 4, tmp_path, f"out{k}")


# -- a base that differs only where no record reaches -------------------------------------------


def _poke(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


@pytest.mark.parametrize("where", ["frozen tensor", "delta companion, between records", "companion from the base"])
def test_base_edited_where_no_record_reaches_is_another_base(world, tmp_path, where):
    """A base that is another version only in bytes the bundle takes from
    the base as they are (a tensor no record covers, the unchanged ranges
    of a DELTA file, a companion file whose source is the base) is not the
    bundle's base: 5, as when a record's base digest catches it, not 4
    ("the bundle is damaged"), which blames the wrong file.
    (Before the fix: 4, "does not match the target digest".)"""
    X = tmp_path / "X"
    shutil.copytree(world.A, X)
    if where == "frozen tensor":
        shard = X / "model-00002-of-00002.safetensors"
        (n,) = struct.unpack("<Q", shard.read_bytes()[:8])
        _poke(shard, 8 + n + 5)
    elif where == "delta companion, between records":
        _poke(X / "tokenizer.json", 1000)  # the edit is at 1100001: byte 1000 is copied from the base
    else:
        _poke(X / "keep.txt", 3)
    before = tree(X)
    run = wdiff("apply", world.ab, X, "-o", tmp_path / "out", env=world.env)
    refused(run, 5, tmp_path, "out")
    assert "base" in run.stderr, str(run)
    assert tree(X) == before  # (test_direct_and_buffered_writes applies the bundle to its own base)


# -- O_DIRECT writes: tmpfs, full disks, file-size limits, another file system ----------------


def in_tmpfs(world: World, size: str, script: str) -> dict:
    """Run ``script`` (sh, with $M the mount point of a fresh tmpfs of
    ``size`` and $WD the wdiff command) in a user and mount namespace; it
    prints one JSON line."""
    if not namespaces_work():
        pytest.skip("this system allows no user and mount namespaces (unshare -Urm)")
    m = world.root / "mnt"
    m.mkdir(exist_ok=True)
    sh = f'mount -t tmpfs -o size={size} tmpfs "$M" && {script}'
    env = dict(world.env, M=str(m), WD=" ".join(argv()))
    r = subprocess.run(["unshare", "-Urm", "sh", "-c", sh], capture_output=True, text=True, env=env, timeout=120)
    return {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr}


DIGESTS_PY = ("import hashlib,json,os,sys; r=sys.argv[1]; print(json.dumps({os.path.relpath(os.path.join(d,f),r): "
              "hashlib.sha256(open(os.path.join(d,f),'rb').read()).hexdigest() for d,_,fs in os.walk(r) for f in fs}))")


def test_apply_onto_tmpfs_from_another_file_system(world):
    """The output on a tmpfs (which has O_DIRECT from Linux 6.6 on, none
    before: apply writes through the cache there), the base and the bundle
    on another file system: the target, bit for bit."""
    r = in_tmpfs(world, "64m", f'$WD apply -q "{world.ab}" "{world.A}" -o "$M/out" && '
                               f'{sys.executable} -c "{DIGESTS_PY}" "$M/out"')
    assert r["rc"] == 0, r
    assert json.loads(r["stdout"].strip().splitlines()[-1]) == digests(world.B)


@pytest.mark.parametrize("fits", ["half the tensor file", "the tensor file and half the DELTA file"])
def test_full_tmpfs_is_an_io_error_and_leaves_nothing(world, fits):
    """A disk that fills up in the tensor file or in the DELTA companion
    file (the tensor file fits): 9, no OUT, no temp dir, the space given
    back."""
    shard, tok = (os.path.getsize(world.B / p) for p in ("model-00001-of-00002.safetensors", "tokenizer.json"))
    size = f"{(shard // 2 if fits.startswith('half') else shard + 64 * 1024 + tok // 2) // 1024}k"
    script = (f'$WD apply -q "{world.ab}" "{world.A}" -o "$M/out"; echo "rc=$?"; ls -A "$M"; '
              'df -k "$M" | tail -1')
    r = in_tmpfs(world, size, script)
    out = r["stdout"].splitlines()
    assert "rc=9" in out, r
    assert "unexpected error" not in r["stderr"], r
    assert [l for l in out[out.index("rc=9") + 1:-1] if l] == [], f"left in the full file system: {r}"
    used = int(out[-1].split()[2])
    assert used < 64, r  # KiB still in use after the refusal


@pytest.mark.parametrize("limit", [4096 + 7, 500_000, 900_000])
def test_file_size_limit_is_an_io_error_and_leaves_nothing(world, tmp_path, limit):
    """RLIMIT_FSIZE cuts a write short (EFBIG) in a header, in the O_DIRECT
    middle of the tensor file, or in the DELTA companion file: 9, no OUT,
    no temp dir."""
    sizes = sorted(os.path.getsize(world.B / p) for p in ("model-00001-of-00002.safetensors", "tokenizer.json"))
    assert limit < sizes[-1]
    run = wdiff("apply", world.ab, world.A, "-o", tmp_path / "out", env=world.env, max_file_bytes=limit)
    refused(run, 9, tmp_path, "out")


def test_direct_and_buffered_writes_give_the_same_bytes(world, tmp_path):
    """O_DIRECT (the default) and WDIFF_DIRECT=0 write the same bytes, on
    files whose sizes and tensor offsets are not block-aligned."""
    for f in ("model-00001-of-00002.safetensors", "tokenizer.json"):
        assert os.path.getsize(world.B / f) % 512, f
    ok(wdiff("apply", "-q", world.ab, world.A, "-o", tmp_path / "d", env=world.env))
    ok(wdiff("apply", "-q", world.ab, world.A, "-o", tmp_path / "b", env=dict(world.env, WDIFF_DIRECT="0")))
    assert tree(tmp_path / "d") == tree(tmp_path / "b") == tree(world.B)


# -- remotes: the same step twice, v1 and v3 mixed, rollbacks and squashes ----------------------


def test_push_of_a_step_the_chain_has(world, tmp_path):
    """Another bundle of a step the chain has (the same step as format 1
    where the chain has it as format 3) is already there: 0 and nothing
    written; the same step damaged (a bit of a v3 record, every digest
    recomputed) or cut short is never stored, the chain unchanged."""
    R = tmp_path / "R"
    env = world.env
    ok(wdiff("push", "-q", "--anchor", world.A, R, env=env))
    ok(wdiff("push", "-q", world.ab, R, env=env))
    ok(wdiff("push", "-q", world.bc1, R, env=env))
    before = (R / "chain.json").read_bytes()
    objects = sorted(p.relative_to(R) for p in R.rglob("*.wdb"))
    run = ok(wdiff("push", world.ab1, R, env=env))
    assert "already on the remote" in run.stdout + run.stderr, str(run)
    data = world.ab.read_bytes()
    _, flipped = edited(data, lambda r: r.type == sb.CHUNK and r.codec in V2)[0]
    bad = {"flipped.wdb": flipped, "cut.wdb": data[:len(data) - 100]}
    for name, raw in bad.items():
        (tmp_path / name).write_bytes(raw)
        run = wdiff("push", tmp_path / name, R, env=env)
        if name == "flipped.wdb" and run.rc == 0:
            # push may take a same-step bundle as 'already there' unread; what
            # it must never do is store it
            assert "already on the remote" in run.stdout + run.stderr, str(run)
        else:
            assert run.rc == 4, str(run)
    assert (R / "chain.json").read_bytes() == before
    assert sorted(p.relative_to(R) for p in R.rglob("*.wdb")) == objects


@pytest.mark.slow
def test_mixed_v1_v3_chain_pull_rollback_squash(world, tmp_path):
    """A chain anchor (A) -> v3 (B) -> v1 (C), packed without the DELTA file
    (--exclude): pulled from nothing, rolled back to A by undoing both
    bundles (the v1 record and the v3 codec v2 records reversed from the
    target side, not a rebuild from the anchor), and squashed (a v3 and a
    v1 bundle as one): every result is bit for bit the version."""
    R, env, ex = tmp_path / "R", world.env, ("--exclude", "tokenizer.json")
    packs = {"anchor": ("--anchor", world.A), "ab": (world.A, world.B), "bc1": ("--format", "1", world.B, world.C)}
    for name, args in packs.items():
        ok(wdiff("pack", "-q", *ex, *args, "-o", tmp_path / f"{name}.wdb", env=env))
        ok(wdiff("push", "-q", tmp_path / f"{name}.wdb", R, env=env))
    versions = {name: info(world, tmp_path / f"{name}.wdb") for name in ("ab", "bc1")}
    assert versions["ab"]["format_version"] == 3 and versions["bc1"]["format_version"] == 1
    assert not {"raw", "sparse", "bitmap", "dense"} & set(versions["ab"]["records"]), versions["ab"]["records"]

    def want(ckpt):
        t = tree(ckpt)
        del t["tokenizer.json"]
        return t

    P = tmp_path / "P"
    ok(wdiff("pull", "-q", R, P, env=env))
    assert tree(P) == want(world.C)
    run = ok(wdiff("pull", R, P, "--to", versions["ab"]["base_fingerprint"], env=env))
    assert "undoing 2 bundles" in run.stdout and "cannot step back" not in run.stderr, str(run)
    assert tree(P) == want(world.A)
    S = tmp_path / "s.wdb"
    ok(wdiff("squash", "-q", tmp_path / "ab.wdb", tmp_path / "bc1.wdb", "--base", P, "-o", S, env=env))
    ok(wdiff("apply", "-q", S, P, "-o", tmp_path / "sq", env=env))
    assert tree(tmp_path / "sq") == want(world.C)


# -- odd names through a v3 bundle ------------------------------------------------------------


ODD = ["-leading dash.json", "two  spaces.json", "ünïcödé 😀.json", "--x", "L" * 200 + ".json"]


def test_odd_names_through_v3_pack_and_apply(world, tmp_path):
    """Names with a leading dash, spaces, non-ASCII, 200 characters,
    on DELTA companion files and a tensor file in an odd directory: packed
    as format 3 and applied, given after --, bit for bit."""
    src = {}
    for side, base in (("A", world.A), ("B", world.B)):
        d = tmp_path / side
        shutil.copytree(base, d)
        sub = d / "-sub dir ü"
        sub.mkdir()
        shutil.copy(d / "model-00001-of-00002.safetensors", sub / "-model ü.safetensors")
        for n in ODD:
            shutil.copy(d / "tokenizer.json", d / n)
        src[side] = d
    env = world.env
    bundle = tmp_path / "-odd ü.wdb"
    ok(wdiff("pack", "-q", "-o", bundle, "--", src["A"], src["B"], env=env, cwd=tmp_path))
    i = json.loads(ok(wdiff("info", "--json", "--", bundle.name, env=env, cwd=tmp_path)).stdout)
    assert i["format_version"] == 3
    sources = {f["path"]: f["source"] for f in i["files"]}
    assert all(sources[n] == "delta" for n in ODD), sources
    ok(wdiff("apply", "-q", "-o", "-out ü", "--", bundle.name, "A", env=env, cwd=tmp_path))
    assert tree(tmp_path / "-out ü") == tree(src["B"])
    W = tmp_path / "-in place"
    shutil.copytree(src["A"], W)
    ok(wdiff("apply", "-q", "--in-place", "--", bundle.name, W.name, env=env, cwd=tmp_path))
    assert tree(W) == tree(src["B"])


# -- memory: a decompression bomb in a value frame --------------------------------------------


def _rle_frame(declared: int, n: int, block: int = 1 << 17) -> bytes:
    """A zstd frame (RFC 8878) declaring ``declared`` bytes and holding RLE
    blocks of ``n`` zero bytes in all: a few bytes that inflate to n."""
    out = bytearray(b"\x28\xb5\x2f\xfd") + bytes([(3 << 6) | (1 << 5)]) + struct.pack("<Q", declared)
    blocks = [block] * (n // block) + ([n % block] if n % block else [])
    for k, size in enumerate(blocks):
        out += struct.pack("<I", (1 if k == len(blocks) - 1 else 0) | (1 << 1) | (size << 3))[:3] + b"\0"
    return bytes(out)


def test_value_frame_bomb_is_refused_in_bounded_memory(world, tmp_path):
    """The CDENSE magnitude frame (or an RSPARSE/MDENSE zstd section)
    replaced by a frame that declares the right size but inflates to 1 GiB,
    every digest recomputed: refused (4) with the peak RSS far below what
    it inflates to."""
    b = sb.parse(world.ab.read_bytes())
    k = next(i for i, r in enumerate(b.records) if r.type == sb.CHUNK and r.codec == sb.CDENSE)
    r = b.records[k]
    sec = r.sections[1]
    L, p = sb.read_varint(sec, 0, "L")
    n = (r.hi - r.lo) // r.word
    mags = _rle_frame(n * r.word, 1 << 30)
    r.sections[1] = sec[:p + L] + mags
    bomb = tmp_path / "bomb.wdb"
    bomb.write_bytes(sb.serialize(b, fix_index=False))
    run = wdiff("apply", bomb, world.A, "-o", tmp_path / "out", env=world.env, timeout=60)
    refused(run, 4, tmp_path, "out")
    assert run.maxrss_kib < 300 * 1024, str(run)


# -- resuming or rolling back an in-place apply: memory -----------------------------------------


def test_undo_log_load_holds_one_entry_not_the_log(tmp_path):
    """Resume and --abort load the undo log of an interrupted in-place
    apply, which grows with the step (the old values of every word
    changed: gigabytes for a dense step of a large model). Loading it must
    keep the entries' values in the file, reading one entry at a time:
    here 48 MiB of entries load with under 8 MiB of Python memory, and
    restore what they hold; an entry changed after loading is refused.
    (Before the fix: the whole log in memory, twice, while loading.)"""
    import tracemalloc

    from wdiff.errors import FormatError
    from wdiff.format.undo import UndoEntry, UndoLog
    from wdiff.statedir import StateDir

    rng = np.random.default_rng(7)
    d = StateDir.at(str(tmp_path))
    log = UndoLog(d)
    olds = {}
    for k in range(12):  # 12 chunks of 4 MiB of random words, every one changed: 4 MiB of values each
        old = rng.integers(0, 2**32, 1 << 20, dtype=np.uint32)
        new = old ^ np.uint32(1)
        log.append([UndoEntry.make(0, k << 22, (k + 1) << 22, old, new, b"\1" * 16, b"\2" * 16)])
        olds[k << 22] = old
    log.close()
    assert os.path.getsize(tmp_path / "undo.log") > 48 << 20
    del old, new
    tracemalloc.start()
    try:
        entries = UndoLog(d).load()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sorted(entries) == [(0, lo) for lo in sorted(olds)]
    assert peak < 8 << 20, f"loading a {os.path.getsize(tmp_path / 'undo.log') >> 20} MiB undo log took {peak >> 20} MiB"
    for (_, lo), e in entries.items():
        words = olds[lo] ^ np.uint32(1)
        e.restore(words)
        assert np.array_equal(words, olds[lo])
    # an entry's bytes changed after it was loaded: refused, never restored from
    entries = UndoLog(d).load()
    with open(tmp_path / "undo.log", "r+b") as f:
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(FormatError):
        entries[(0, 0)].restore(np.zeros(1 << 20, dtype=np.uint32))
    d.close()


def test_delta_records_against_a_long_base_listing_are_walked_in_linear_time(tmp_path):
    """A bundle lists as many base files as it likes (up to 100,000: its
    base fingerprint is checked against that listing), and a companion file
    of S bytes may be rebuilt by up to S one-byte DELTA records. Each
    record's check looked its file up in the listing row by row: 99,990
    made-up rows and 3,000 records of 115 bytes (a 0.4 MB bundle) cost 17 s
    of CPU in every command that walks the records (info, push, sign,
    apply). Looked up by path, the walk is the cost of reading the index."""
    rng = np.random.default_rng(1)
    size = (1 << 20) + 4096
    w = rand(rng, "F32", (64, 64))
    data = bytearray(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    A = Path(write_ckpt(tmp_path / "A", {"w": w}, companions={"zzz.bin": bytes(data)}))
    data[size // 2] ^= 0xFF
    w2 = T("F32", w.shape, bytes(x ^ 1 if i == 40 else x for i, x in enumerate(w.data)))
    B = Path(write_ckpt(tmp_path / "B", {"w": w2}, companions={"zzz.bin": bytes(data)}))
    env = user_env(tmp_path / "user", extra={"WDIFF_THREADS": "1", "NO_COLOR": "1"})
    ok(wdiff("pack", "-q", A, B, "-o", tmp_path / "ab.wdb", env=env))
    b = sb.parse((tmp_path / "ab.wdb").read_bytes())
    b.index["base"]["files"] = [[f"a{k:06d}", "file", 1, "00" * 16] for k in range(99_990)] + b.index["base"]["files"]
    delta = next(r for r in b.records if r.type == 4)
    records = []
    for k in range(3000):  # one-byte XOR records (SPARSE, word 1), in order
        r = delta.copy()
        r.codec, r.word, r.param, r.count, r.lo, r.hi = 1, 1, 0, 1, k, k + 1
        r.sections = [b"\x80", b"", b"\x01"]
        records.append(r)
    b.records = [r for r in b.records if r.type == sb.CHUNK] + records
    bad = tmp_path / "bad.wdb"
    bad.write_bytes(sb.serialize(b, fix_index=True, level=3))
    run = ok(wdiff("info", bad, env=env))
    assert "3,000" in run.stdout
    assert run.cpu_s < 6, run
