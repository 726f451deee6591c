"""The publisher's mirror update: the in-place apply takes the base digests
the publisher hashed itself (TrustedBase), so it reads only the chunks it
patches, and still refuses a mirror that changed behind its back."""

from __future__ import annotations

import os

import numpy as np
import pytest

from wdiff.errors import BaseMismatchError
from wdiff.live import Publisher
from wdiff.live._tensors import prepared
from wdiff.live.layout import METADATA, mem_tensors, shard
from wdiff.ops.apply import inplace
from wdiff.ops.memsource import MemoryTarget, pack_memory
from wdiff.store import manifest
from wdiff.store.checkpoint import scan
from wdiff.store.digests import Digests
from wdiff.store.hashing import hexd


def state(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"w{i}": rng.integers(0, 1 << 16, 1 << 19, dtype=np.uint16) for i in range(4)}


def bump(sd, seed: int, only=None) -> None:
    rng = np.random.default_rng(seed)
    for k, v in sd.items():
        if only is None or k in only:
            v[rng.integers(0, v.size, 50)] += 1


def _pack(mirror, sd, out):
    A = scan(str(mirror))
    files = shard(prepared(sd), 1 << 40)
    digests = Digests()
    packed = pack_memory(A, MemoryTarget([(p, mem_tensors(g)) for p, g in files], metadata=METADATA), str(out),
                         chunk=1 << 20, base_digests=digests)
    return inplace.TrustedBase(A, digests, packed.base_fingerprint), packed


class _Reads:
    """Counts the mirror bytes hashed by a whole-checkpoint pass, and the
    dry runs: what the trusted update leaves out."""

    def __init__(self, monkeypatch) -> None:
        self.whole = self.dry = 0
        complete, dry = manifest.complete, inplace._dry_run

        def spy_complete(ckpt, digests, **k):
            if not digests.tensors:  # nothing known: every byte is read
                self.whole += ckpt.total_bytes
            return complete(ckpt, digests, **k)

        def spy_dry(*a, **k):
            self.dry += 1
            return dry(*a, **k)

        monkeypatch.setattr(inplace.manifest, "complete", spy_complete)
        monkeypatch.setattr(inplace, "_dry_run", spy_dry)


def test_publish_updates_the_mirror_without_hashing_it_again(tmp_path, monkeypatch):
    sd = state(0)
    remote, mirror = tmp_path / "remote", tmp_path / "mirror"
    pub = Publisher(remote, mirror, chunk=1 << 20)
    pub.publish(sd)
    reads = _Reads(monkeypatch)
    for s in range(1, 3):
        bump(sd, s, only={"w1"})
        res = pub.publish(sd)
        assert reads.dry == 0 and reads.whole == 0
        assert manifest.compute(scan(str(mirror)), threads=1).fingerprint.hex() == res.version
        reads.whole = 0
    # the command line's apply --in-place hashes the whole base and runs the dry run, as it always did
    bump(sd, 9)
    _pack(mirror, sd, tmp_path / "b.wdb")
    reads.whole = 0
    inplace.apply_in_place(str(tmp_path / "b.wdb"), str(mirror), abort=False, threads=1)
    assert reads.dry == 1 and reads.whole >= 2 * (4 << 20)


def test_a_mirror_changed_after_it_was_hashed_is_checked_whole(tmp_path):
    """A byte flipped in a chunk the bundle does not patch, after the pack
    hashed the mirror: the stat keys differ, the digests are not trusted,
    the full check finds the mirror is not the base, nothing is written."""
    sd = state(1)
    remote, mirror = tmp_path / "remote", tmp_path / "mirror"
    Publisher(remote, mirror, chunk=1 << 20).publish(sd)
    bump(sd, 1, only={"w0"})
    trusted, _ = _pack(mirror, sd, tmp_path / "b.wdb")
    path = mirror / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-5] ^= 1  # in w3, which the bundle does not patch
    path.write_bytes(bytes(data))
    with pytest.raises(BaseMismatchError):
        inplace.apply_in_place(str(tmp_path / "b.wdb"), str(mirror), abort=False, threads=1, trusted=trusted)
    assert path.read_bytes() == bytes(data)
    assert not (mirror / ".wdiff" / "txn" / "journal.json").exists()


def test_trusted_digests_that_are_not_the_base_are_ignored(tmp_path):
    sd = state(2)
    remote, mirror = tmp_path / "remote", tmp_path / "mirror"
    Publisher(remote, mirror, chunk=1 << 20).publish(sd)
    bump(sd, 2)
    trusted, packed = _pack(mirror, sd, tmp_path / "b.wdb")
    false = Digests()
    false.tensors = {k: bytes(16) * (len(v) // 16) for k, v in trusted.digests.tensors.items()}
    false.files = dict(trusted.digests.files)
    bad = inplace.TrustedBase(trusted.checkpoint, false, trusted.fingerprint)  # claims the base fingerprint
    assert bad.holds(scan(str(mirror)), type("I", (), {"base_fingerprint": trusted.fingerprint})()) is None
    res = inplace.apply_in_place(str(tmp_path / "b.wdb"), str(mirror), abort=False, threads=1, trusted=bad)
    assert hexd(res.target_fingerprint) == hexd(packed.target_fingerprint)
    assert manifest.compute(scan(str(mirror)), threads=1).fingerprint == packed.target_fingerprint


def test_trusted_update_crashes_are_resumed_by_the_plain_apply(tmp_path, monkeypatch):
    """An interrupted trusted update leaves the same journal and undo log as
    any in-place apply: a plain apply (no trust) finishes it."""
    sd = state(3)
    remote, mirror = tmp_path / "remote", tmp_path / "mirror"
    Publisher(remote, mirror, chunk=1 << 20).publish(sd)
    bump(sd, 3)
    trusted, packed = _pack(mirror, sd, tmp_path / "b.wdb")
    from wdiff.ops.apply import patch as patching

    real, calls = patching.write_all, []

    def dies(fd, data, off):
        calls.append(off)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the process stops mid-patch
        real(fd, data, off)

    monkeypatch.setattr(patching, "write_all", dies)
    monkeypatch.setattr(patching, "BATCH_BYTES", 1)
    with pytest.raises(KeyboardInterrupt):
        inplace.apply_in_place(str(tmp_path / "b.wdb"), str(mirror), abort=False, threads=1, trusted=trusted)
    assert (mirror / ".wdiff" / "txn" / "journal.json").exists()
    monkeypatch.setattr(patching, "write_all", real)
    res = inplace.apply_in_place(str(tmp_path / "b.wdb"), str(mirror), abort=False, threads=1)
    assert res.resumed and res.target_fingerprint == packed.target_fingerprint
    assert manifest.compute(scan(str(mirror)), threads=1).fingerprint == packed.target_fingerprint
    assert os.listdir(mirror / ".wdiff").count("txn") == 0
