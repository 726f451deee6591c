"""pack + apply rebuild the target bit for bit; diff reports what changed."""

import numpy as np
import pytest
from factory import mutate, rand, simple_pair, tree, write_ckpt

import wdiff
from wdiff.errors import BaseMismatchError, UsageError


def test_pack_apply_roundtrip(tmp_path):
    A, B = simple_pair(tmp_path)
    res = wdiff.pack(A, B, tmp_path / "d.wdb")
    out = wdiff.apply(tmp_path / "d.wdb", A, tmp_path / "C")
    assert tree(tmp_path / "C") == tree(B)
    assert out.target_fingerprint == res.target_fingerprint
    assert tree(A) == tree(tmp_path / "A")  # the base is never touched


def test_bundles_are_reproducible(tmp_path):
    A, B = simple_pair(tmp_path)
    wdiff.pack(A, B, tmp_path / "1.wdb", threads=1)
    wdiff.pack(A, B, tmp_path / "2.wdb", threads=4)
    assert (tmp_path / "1.wdb").read_bytes() == (tmp_path / "2.wdb").read_bytes()


def test_anchor_builds_from_nothing(tmp_path):
    _, B = simple_pair(tmp_path)
    res = wdiff.pack(None, B, tmp_path / "anchor.wdb")
    assert res.base_fingerprint is None
    wdiff.apply(tmp_path / "anchor.wdb", None, tmp_path / "C")
    assert tree(tmp_path / "C") == tree(B)


def test_anchor_refuses_a_nonempty_base(tmp_path):
    A, B = simple_pair(tmp_path)
    wdiff.pack(None, B, tmp_path / "anchor.wdb")
    with pytest.raises(BaseMismatchError):
        wdiff.apply(tmp_path / "anchor.wdb", A, tmp_path / "C")
    assert not (tmp_path / "C").exists()


def test_identical_checkpoints_diff_empty_and_pack_tiny(tmp_path):
    A, _ = simple_pair(tmp_path)
    d = wdiff.diff(A, A)
    assert d.identical and not d.differs
    assert all(t.status == "unchanged" for t in d.tensors)
    p = wdiff.pack(A, A, tmp_path / "same.wdb")
    assert p.changed_elements == 0 and p.files_stored == 0
    assert p.bundle_bytes < 2000


def test_diff_statuses(tmp_path):
    A, B = simple_pair(tmp_path)
    d = wdiff.diff(A, B)
    status = {t.name: t.status for t in d.tensors}
    assert status["embed"] == "unchanged"
    assert status["layer.0.w"] == "modified"
    assert status["scale"] == "modified"
    assert status["gone"] == "removed"
    assert status["new"] == "added"
    assert status["retype"] == "retyped"
    assert status["empty"] == "unchanged"
    files = {f.path: f.status for f in d.files}
    assert files == {"config.json": "changed", "tokenizer.json": "added", "model.safetensors.index.json": "changed"}
    assert d.differs and not d.identical
    t = next(t for t in d.tensors if t.name == "layer.0.w")
    assert t.changed == round(0.01 * t.elements)
    assert t.max_abs is not None and t.max_abs > 0 and t.rel_l2 > 0


def test_frozen_tensor_costs_only_digests(tmp_path):
    rng = np.random.default_rng(1)
    big = rand(rng, "BF16", (2048, 1024))  # 4 MiB
    small = rand(rng, "BF16", (64, 64))
    A = write_ckpt(tmp_path / "A", {"frozen": big, "moving": small})
    B = write_ckpt(tmp_path / "B", {"frozen": big, "moving": mutate(small, 0.01, rng)})
    p = wdiff.pack(A, B, tmp_path / "d.wdb")
    assert p.bundle_bytes < 1500  # the 4 MiB frozen tensor adds nothing but a digest
    wdiff.apply(tmp_path / "d.wdb", A, tmp_path / "C")
    assert tree(tmp_path / "C") == tree(B)


def test_resharded_checkpoint_diffs_unchanged(tmp_path):
    rng = np.random.default_rng(2)
    ts = {f"t{i}": rand(rng, "F32", (100, 10)) for i in range(6)}
    A = write_ckpt(tmp_path / "A", ts, shards=1)
    B = write_ckpt(tmp_path / "B", ts, shards=3)
    d = wdiff.diff(A, B)
    assert all(t.status == "unchanged" for t in d.tensors)
    assert d.layout_changed
    p = wdiff.pack(A, B, tmp_path / "d.wdb")
    assert p.changed_elements == 0
    wdiff.apply(tmp_path / "d.wdb", A, tmp_path / "C")
    assert tree(tmp_path / "C") == tree(B)


def test_wrong_base_is_refused_and_nothing_written(tmp_path):
    A, B = simple_pair(tmp_path)
    wdiff.pack(A, B, tmp_path / "d.wdb")
    with pytest.raises(BaseMismatchError):
        wdiff.apply(tmp_path / "d.wdb", B, tmp_path / "C")
    assert not (tmp_path / "C").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".C.")]


def test_same_listing_different_bytes_is_refused(tmp_path):
    """A base with the same files and sizes but other bytes fails on digests."""
    A, B = simple_pair(tmp_path)
    wdiff.pack(A, B, tmp_path / "d.wdb")
    fake = tmp_path / "fake"
    import shutil

    shutil.copytree(A, fake)
    shard = sorted(p for p in fake.iterdir() if p.suffix == ".safetensors")[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x40
    shard.write_bytes(bytes(data))
    with pytest.raises(BaseMismatchError):
        wdiff.apply(tmp_path / "d.wdb", fake, tmp_path / "C")
    assert not (tmp_path / "C").exists()


def test_output_must_not_exist(tmp_path):
    A, B = simple_pair(tmp_path)
    wdiff.pack(A, B, tmp_path / "d.wdb")
    (tmp_path / "C").mkdir()
    (tmp_path / "C" / "keep").write_text("mine")
    with pytest.raises(UsageError):
        wdiff.apply(tmp_path / "d.wdb", A, tmp_path / "C")
    assert (tmp_path / "C" / "keep").read_text() == "mine"
    (tmp_path / "C" / "keep").unlink()
    wdiff.apply(tmp_path / "d.wdb", A, tmp_path / "C")  # an empty directory is fine
    assert tree(tmp_path / "C") == tree(B)


def test_chain_of_bundles_stays_exact(tmp_path):
    rng = np.random.default_rng(3)
    v = {"w": rand(rng, "BF16", (300, 300)), "b": rand(rng, "F32", (300,))}
    dirs = []
    for step in range(4):
        dirs.append(write_ckpt(tmp_path / f"v{step}", v))
        v = {k: mutate(t, 0.05, rng) for k, t in v.items()}
    cur = dirs[0]
    for step in range(1, 4):
        wdiff.pack(dirs[step - 1], dirs[step], tmp_path / f"{step}.wdb")
        nxt = tmp_path / f"r{step}"
        wdiff.apply(tmp_path / f"{step}.wdb", cur, nxt)
        cur = nxt
    assert tree(cur) == tree(dirs[-1])


def test_subdirectories_and_odd_companions(tmp_path):
    rng = np.random.default_rng(4)
    ts = {"w": rand(rng, "F32", (10, 10))}
    A = write_ckpt(tmp_path / "A", ts, companions={"original/params.json": b"1", "notes.txt": b"a" * 3_000_000})
    B = write_ckpt(tmp_path / "B", {"w": mutate(ts["w"], 0.5, rng)},
                   companions={"original/params.json": b"2", "notes.txt": b"b" * 3_000_000, "x/y/z.bin": bytes(range(256))})
    wdiff.pack(A, B, tmp_path / "d.wdb")
    wdiff.apply(tmp_path / "d.wdb", A, tmp_path / "C")
    assert tree(tmp_path / "C") == tree(B)


def test_empty_files_and_tensorless_shards(tmp_path):
    rng = np.random.default_rng(5)
    A = write_ckpt(tmp_path / "A", {"w": rand(rng, "F32", (8,))}, companions={"empty.txt": b""})
    B = write_ckpt(tmp_path / "B", {"w": rand(rng, "F32", (8,)), "z": rand(rng, "F32", (0,))},
                   companions={"empty.txt": b"", "also-empty": b""})
    (tmp_path / "B" / "nothing.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    wdiff.pack(A, B, tmp_path / "d.wdb")
    wdiff.apply(tmp_path / "d.wdb", A, tmp_path / "C")
    assert tree(tmp_path / "C") == tree(B)
    wdiff.pack(None, B, tmp_path / "anchor.wdb")
    wdiff.apply(tmp_path / "anchor.wdb", None, tmp_path / "D")
    assert tree(tmp_path / "D") == tree(B)


def test_invalid_safetensors_is_shipped_as_an_opaque_file(tmp_path):
    rng = np.random.default_rng(6)
    A = write_ckpt(tmp_path / "A", {"w": rand(rng, "F32", (8,))})
    B = write_ckpt(tmp_path / "B", {"w": rand(rng, "F32", (8,))})
    (tmp_path / "B" / "broken.safetensors").write_bytes(b"\xff" * 100)
    d = wdiff.diff(A, B)
    assert any("opaque" in w for w in d.warnings)
    assert {f.path for f in d.files} == {"broken.safetensors"}
    wdiff.pack(A, B, tmp_path / "d.wdb")
    wdiff.apply(tmp_path / "d.wdb", A, tmp_path / "C")
    assert tree(tmp_path / "C") == tree(B)


def test_same_tensor_name_in_two_shards_is_refused(tmp_path):
    from wdiff.errors import FormatError

    rng = np.random.default_rng(7)
    t = rand(rng, "F32", (8,))
    A = write_ckpt(tmp_path / "A", {"w": t})
    write_ckpt(tmp_path / "B", {"w": t})
    write_ckpt(tmp_path / "extra", {"w": t})
    (tmp_path / "extra" / "model.safetensors").rename(tmp_path / "B" / "second.safetensors")
    with pytest.raises(FormatError):
        wdiff.diff(A, tmp_path / "B")
    with pytest.raises(FormatError):
        wdiff.pack(A, tmp_path / "B", tmp_path / "d.wdb")
    assert not (tmp_path / "d.wdb").exists()


def test_verify_against_a_bundle(tmp_path):
    from wdiff.sync.verify import verify

    A, B = simple_pair(tmp_path)
    wdiff.pack(A, B, tmp_path / "d.wdb")
    assert verify(B, bundle=tmp_path / "d.wdb").ok
    r = verify(A, bundle=tmp_path / "d.wdb")
    assert not r.ok
    assert {p.tensor for p in r.problems if p.tensor} >= {"layer.0.w", "layer.1.w"}
    assert any(p.path == "tokenizer.json" and p.what == "missing" for p in r.problems)


def test_scan_reuses_a_byte_identical_header(tmp_path):
    """B's header is taken from A where its bytes and the file's size are
    the same (the usual RL step), and parsed again where either differs."""
    from wdiff.store.checkpoint import scan

    rng = np.random.default_rng(5)
    t = {"w": rand(rng, "BF16", (64, 64)), "b": rand(rng, "F32", (64,))}
    a = write_ckpt(tmp_path / "A", t, shards=2)
    changed = {"w": mutate(t["w"], 0.1, rng), "b": t["b"]}
    b = write_ckpt(tmp_path / "B", changed, shards=2)
    A = scan(a)
    B = scan(b, reuse=A)
    assert [f.path for f in B.files] == [f.path for f in A.files]
    for fa, fb in zip(A.files, B.files):
        if fa.header is not None:
            assert fb.header is fa.header  # the same bytes: not parsed again
            assert fb.header == scan(b).file(fb.path).header
    # a shard whose header bytes stay but whose size does not is parsed anew, and refused
    shard = next(f for f in B.files if f.header is not None)
    with open(shard.abspath, "ab") as fh:
        fh.write(b"\0" * 2)
    again = scan(b, reuse=A).file(shard.path)
    assert again.header is None and again.note  # handled as an opaque file, as without reuse
