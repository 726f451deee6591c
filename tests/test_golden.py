"""Golden files: bundles committed by an earlier wdiff (tests/golden/data/,
made by tests/golden/make.py) must stay byte-identical to what today's writer
makes from the same checkpoints, and readable by today's reader.

A failure of a writer test means the bytes of a bundle changed. If that was
meant (a new format version, a new zstd, a version bump: the index names its
writer), rerun `python tests/golden/make.py` and commit the new files with a
note saying why; otherwise it is a silent format change, and a bug.

Only the command line is used (python -m wdiff, in a subprocess). The
commands of this file all run at once, on a few threads, before the first test
that needs them (the module fixture `ran`); the tests then check their
results. That keeps the file at about a second on two cores."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kit.cli import run
from kit.trees import tree

GOLDEN = Path(__file__).resolve().parent / "golden"
DATA = GOLDEN / "data"
ROOT = GOLDEN.parent.parent

#: committed bundle -> the pack arguments that made it (relative to DATA)
BUNDLES = {
    "anchor.wdb": ["--anchor", "ckpt/base"],
    "sparse.wdb": ["--format", "1", "ckpt/base", "ckpt/sparse"],
    "dense.wdb": ["--format", "1", "ckpt/base", "ckpt/dense"],
    "struct.wdb": ["--format", "1", "ckpt/base", "ckpt/struct"],
    "signed.wdb": ["--format", "1", "ckpt/base", "ckpt/sparse", "--sign", "keys/test.key"],
    "v3-dense.wdb": ["ckpt/base", "ckpt/dense"],
    "v3-adam.wdb": ["ckpt/base", "ckpt/adam"],
    "v3-struct.wdb": ["ckpt/base", "ckpt/struct"],
    "v3-rows.wdb": ["ckpt/base", "ckpt/rows"],
}
#: committed bundle -> (base or None, target), relative to DATA
CHECKPOINTS = {
    "anchor.wdb": (None, "ckpt/base"),
    "sparse.wdb": ("ckpt/base", "ckpt/sparse"),
    "dense.wdb": ("ckpt/base", "ckpt/dense"),
    "struct.wdb": ("ckpt/base", "ckpt/struct"),
    "signed.wdb": ("ckpt/base", "ckpt/sparse"),
    "v3-dense.wdb": ("ckpt/base", "ckpt/dense"),
    "v3-adam.wdb": ("ckpt/base", "ckpt/adam"),
    "v3-struct.wdb": ("ckpt/base", "ckpt/struct"),
    "v3-rows.wdb": ("ckpt/base", "ckpt/rows"),
}
CORRUPT = ["corrupt/sparse-truncated.wdb", "corrupt/sparse-flipped.wdb"]
TRUSTED = ["--trusted-key", str(DATA / "keys/test.key.pub")]


def index_of(data: bytes) -> dict | None:
    """The index of a bundle, to explain a byte difference (None if unreadable)."""
    try:
        import zstandard

        off, length, raw = struct.unpack_from("<QQQ", data, len(data) - 48)
        return json.loads(zstandard.ZstdDecompressor().decompress(data[off:off + length], max_output_size=raw))
    except Exception:
        return None


def explain(new: bytes, old: bytes) -> str:
    at = next((i for i, (a, b) in enumerate(zip(new, old)) if a != b), min(len(new), len(old)))
    msg = [f"{len(new)} bytes now, {len(old)} committed; first difference at offset {at}"]
    a, b = index_of(new), index_of(old)
    if a and b:
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                msg.append(f"index member {k!r} differs: now {json.dumps(a.get(k))[:300]}, "
                           f"committed {json.dumps(b.get(k))[:300]}")
    return "\n".join(msg)


# -- the committed files are what the tests think they are ------------------

def test_every_committed_bundle_is_tested():
    committed = {p.relative_to(DATA).as_posix() for p in DATA.rglob("*.wdb")}
    assert committed == set(BUNDLES) | set(CORRUPT)


def test_the_golden_checkpoints_are_what_make_py_writes(tmp_path):
    """make.py and the committed checkpoints agree (the bundles are checked
    below): an edit of make.py must come with its regenerated data."""
    spec = importlib.util.spec_from_file_location("golden_make", GOLDEN / "make.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    make.checkpoints(tmp_path)
    assert tree(tmp_path, skip=()) == tree(DATA / "ckpt", skip=())


# -- every command of this file, run at once ---------------------------------

def flipped_copy(src: Path, dst: Path, offset: int) -> Path:
    b = bytearray(src.read_bytes())
    b[offset] ^= 0x01
    dst.write_bytes(bytes(b))
    return dst


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """{key: (CompletedProcess, the output path or None)}"""
    tmp = tmp_path_factory.mktemp("golden")
    jobs = {}
    # this checkout's wdiff, at the thread count each command names; its
    # compiled modules shared by every command of the session, never written
    # into the source tree
    common = {"PYTHONPYCACHEPREFIX": str(tmp_path_factory.getbasetemp() / "pycache"),
              "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
              "WDIFF_THREADS": None, "PYTHONDONTWRITEBYTECODE": None}

    def job(key, *args, env=None, out=None):
        jobs[key] = (args, {**common, **(env or {})}, out)

    for name, args in BUNDLES.items():          # (a) writer
        d = tmp / "pack" / name
        d.mkdir(parents=True)
        job(("pack", name), "pack", "-q", "-j", "1", *args, "-o", d / name, out=d / name)
    for threads, native in VARIANTS:
        for name in VARIANT_BUNDLES:
            d = tmp / f"pack-j{threads}-native{native}"
            d.mkdir(exist_ok=True)
            job(("variant", threads, native, name), "pack", "-q", "-j", threads, *BUNDLES[name], "-o", d / name,
                env={"WDIFF_NATIVE": native} if native else None, out=d / name)
    for name, (base, target) in CHECKPOINTS.items():   # (b) reader
        job(("info", name), "info", "--json", name)
        trust = TRUSTED if name == "signed.wdb" else []
        out = tmp / "apply" / name
        out.parent.mkdir(exist_ok=True)
        job(("apply", name), "apply", "-q", name, *([base] if base else []), "-o", out, *trust, out=out)
    for what, offset in (("bundle", 200), ("signature", -20)):
        d = tmp / f"signed-flipped-{what}"
        d.mkdir()
        for f in ("signed.wdb", "signed.wdb.minisig"):
            shutil.copyfile(DATA / f, d / f)
        flipped_copy(DATA / f"signed.wdb{'.minisig' if what == 'signature' else ''}",
                     d / f"signed.wdb{'.minisig' if what == 'signature' else ''}", offset)
        out = tmp / f"out-flipped-{what}"
        job(("flipped", what), "apply", d / "signed.wdb", "ckpt/base", "-o", out, *TRUSTED, out=out)
    out = tmp / "out-unsigned"
    job("unsigned", "apply", "sparse.wdb", "ckpt/base", "-o", out, *TRUSTED, out=out)
    out = tmp / "out-wrong-base"
    job("wrong-base", "apply", "sparse.wdb", "ckpt/dense", "-o", out, out=out)
    for name in CORRUPT:                        # (c) corrupt
        job(("corrupt-info", name), "info", name)
        out = tmp / "out-corrupt" / name
        out.parent.mkdir(parents=True, exist_ok=True)
        job(("corrupt-apply", name), "apply", name, "ckpt/base", "-o", out, out=out)

    with ThreadPoolExecutor(max(2, min(4, os.cpu_count() or 2))) as pool:
        futures = {k: pool.submit(run, *args, env=env, cwd=DATA, text=False, timeout=120)
                   for k, (args, env, _) in jobs.items()}
        return {k: (f.result(), jobs[k][2]) for k, f in futures.items()}


# -- (a) today's writer makes the committed bytes ----------------------------

# (threads, WDIFF_NATIVE): against the -j 1 bundles packed above with the
# kernels of the test run (the C ones where built), the numpy kernels on 4
# threads differ in both at once
VARIANTS = [("4", "0")]
VARIANT_BUNDLES = ["dense.wdb", "struct.wdb", "v3-adam.wdb", "v3-struct.wdb", "v3-rows.wdb"]   # between them every kind of record


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUNDLES))
def test_writer_makes_the_committed_bytes(name, ran):
    r, out = ran["pack", name]
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == b"" and r.stderr == b""
    old = (DATA / name).read_bytes()
    new = out.read_bytes()
    assert new == old, f"{name} changed (see tests/golden/make.py):\n" + explain(new, old)
    if "--sign" in BUNDLES[name]:
        # Ed25519 is deterministic: the same key and bytes give the same signature
        assert Path(f"{out}.minisig").read_bytes() == (DATA / (name + ".minisig")).read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("threads,native", VARIANTS)
def test_writer_bytes_do_not_depend_on_threads_or_kernels(threads, native, ran):
    """The same bytes with other thread counts, and with the numpy kernels
    (WDIFF_NATIVE=0) as well as the C ones."""
    for name in VARIANT_BUNDLES:
        r, out = ran["variant", threads, native, name]
        assert r.returncode == 0, r.stderr.decode()
        assert out.read_bytes() == (DATA / name).read_bytes(), explain(out.read_bytes(), (DATA / name).read_bytes())


def test_signing_does_not_change_the_bundle():
    assert (DATA / "signed.wdb").read_bytes() == (DATA / "sparse.wdb").read_bytes()


# -- (b) today's reader reads the committed bundles --------------------------

#: the kinds of records each golden bundle holds (info --json .records)
RECORD_KINDS = {
    "anchor.wdb": {"header", "file", "raw"},
    "sparse.wdb": {"sparse"},
    "signed.wdb": {"sparse"},
    "dense.wdb": {"dense"},
    "struct.wdb": {"header", "file", "raw", "sparse", "bitmap"},
    "v3-dense.wdb": {"dense", "mdense"},
    "v3-adam.wdb": {"csparse", "msparse"},
    "v3-struct.wdb": {"header", "file", "raw", "msparse", "bitmap"},
    "v3-rows.wdb": {"rsparse"},
}
#: committed bundle -> its format version (a v3 one only where a v3 codec won)
VERSIONS = {"v3-dense.wdb": 3, "v3-adam.wdb": 3, "v3-struct.wdb": 3, "v3-rows.wdb": 3}


def test_versions_are_the_lowest_that_hold_the_codecs():
    import struct as _struct

    for name in BUNDLES:
        version = _struct.unpack_from("<I", (DATA / name).read_bytes(), 8)[0]
        assert version == VERSIONS.get(name, 1), name
    # the range-coded values of MSPARSE beat SPARSE's zstd planes on the one
    # sparse chunk of struct: the only difference, and a smaller bundle
    assert (DATA / "v3-struct.wdb").stat().st_size < (DATA / "struct.wdb").stat().st_size


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUNDLES))
def test_reader_accepts_and_describes(name, ran):
    r, _ = ran["info", name]
    assert r.returncode == 0, r.stderr.decode()
    assert r.stderr == b""
    doc = json.loads(r.stdout)
    base, target = CHECKPOINTS[name]
    assert doc["schema"] == "wdiff.info/1" and doc["verified"] is True
    assert (doc["base_fingerprint"] is None) == (base is None)
    assert [f["path"] for f in doc["files"]] == sorted(tree(DATA / target, skip=()))
    assert doc["target_bytes"] == sum(map(len, tree(DATA / target, skip=()).values()))
    assert set(doc["records"]) == RECORD_KINDS[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUNDLES))
def test_reader_rebuilds_the_committed_target(name, ran):
    r, out = ran["apply", name]
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == b"" and r.stderr == b""
    assert tree(out, skip=()) == tree(DATA / CHECKPOINTS[name][1], skip=())


@pytest.mark.slow
@pytest.mark.parametrize("what", ["bundle", "signature"])
def test_signed_bundle_with_a_flipped_byte_is_refused(what, ran):
    r, out = ran["flipped", what]
    assert r.returncode == 4, r.stderr.decode()
    assert r.stdout == b"" and r.stderr.startswith(b"wdiff: error: ")
    assert not out.exists()


@pytest.mark.slow
def test_unsigned_bundle_is_refused_with_a_trusted_key(ran):
    r, out = ran["unsigned"]
    assert r.returncode == 4, r.stderr.decode()
    assert not out.exists()


@pytest.mark.slow
def test_wrong_base_is_refused(ran):
    r, out = ran["wrong-base"]
    assert r.returncode == 5, r.stderr.decode()
    assert not out.exists()


# -- (c) corrupt variants ----------------------------------------------------

def test_corrupt_variants_are_what_they_say():
    good = (DATA / "sparse.wdb").read_bytes()
    truncated = (DATA / "corrupt/sparse-truncated.wdb").read_bytes()
    flipped = (DATA / "corrupt/sparse-flipped.wdb").read_bytes()
    assert good.startswith(truncated) and len(truncated) == len(good) - 100
    assert len(flipped) == len(good) and sum(a != b for a, b in zip(flipped, good)) == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", CORRUPT)
def test_corrupt_bundle_is_refused(name, ran):
    r, _ = ran["corrupt-info", name]
    assert r.returncode == 4, r.stderr.decode()
    assert r.stdout == b"" and r.stderr.startswith(b"wdiff: error: ")
    r, out = ran["corrupt-apply", name]
    assert r.returncode == 4, r.stderr.decode()
    assert not out.exists()
