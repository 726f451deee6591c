"""apply writes the block-aligned middle of each unit with O_DIRECT and the
unaligned ends through the page cache: whatever the offsets, sizes and
header lengths, the file holds exactly the bytes, and an apply with direct
writes turned off (WDIFF_DIRECT=0) writes the same files."""

import os
import subprocess
import sys

import numpy as np
import pytest
from factory import tree

import wdiff
from wdiff.store import sample
from wdiff.store.blockio import DIRECT_ALIGN, open_direct, scratch, scratch_at, write_out

A_ = DIRECT_ALIGN


@pytest.mark.parametrize("offset", [0, 8, 4088, A_, A_ + 8, 3 * A_ - 8, 12344])
@pytest.mark.parametrize("size", [8, A_ - 8, A_, 2 * A_ + 16, 5 * A_, (1 << 20) + 24])
def test_write_out_puts_every_byte_in_place(tmp_path, offset, size):
    path = tmp_path / "f"
    total = offset + size + 2 * A_
    rng = np.random.default_rng(offset * 7 + size)
    before = rng.integers(0, 256, total, dtype=np.uint8)
    path.write_bytes(before.tobytes())
    fd = os.open(path, os.O_WRONLY)
    dfd = open_direct(str(path), fd)
    try:
        buf = scratch_at("test", size, offset)
        assert (buf.ctypes.data - offset) % A_ == 0
        buf[:] = rng.integers(0, 256, size, dtype=np.uint8)
        write_out(fd, dfd, buf, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
        if dfd >= 0:
            os.close(dfd)
    want = before.copy()
    want[offset : offset + size] = buf
    assert path.read_bytes() == want.tobytes()


def test_write_out_with_memory_not_laid_out_as_the_file(tmp_path):
    """A buffer whose address is not congruent to the offset goes through the
    page cache whole (an O_DIRECT write from it would fail or be wrong)."""
    path = tmp_path / "f"
    path.write_bytes(bytes(4 * A_))
    fd = os.open(path, os.O_WRONLY)
    dfd = open_direct(str(path), fd)
    try:
        buf = scratch("test2", 3 * A_ + 8)[8:]  # page-aligned + 8, written at 0
        buf[:] = 7
        write_out(fd, dfd, buf, 0)
    finally:
        os.close(fd)
        if dfd >= 0:
            os.close(dfd)
    assert path.read_bytes() == bytes([7]) * (3 * A_) + bytes(A_)


def test_direct_descriptor_must_be_the_file_created(tmp_path):
    """The O_DIRECT descriptor is opened by path: a file or a link put at the
    path after the create is never written through it."""
    made, other = tmp_path / "made", tmp_path / "other"
    made.write_bytes(b"")
    other.write_bytes(b"")
    fd = os.open(made, os.O_WRONLY)
    try:
        assert open_direct(str(other), fd) == -1  # another file at the path
        (tmp_path / "link").symlink_to(made)
        assert open_direct(str(tmp_path / "link"), fd) == -1  # a link, even to the file itself
        dfd = open_direct(str(made), fd)
        if dfd >= 0:
            os.close(dfd)
    finally:
        os.close(fd)


def _pair(root, shift: int):
    """Two versions of a checkpoint whose header length (and so every data
    offset) depends on ``shift``, with tensors of several MiB."""
    specs = [sample.Spec(f"layer.{i}.w{'x' * shift}", "BF16", ((1 << 20) + 3 * i,)) for i in range(5)]
    specs += [sample.Spec("tiny", "BF16", (3,)), sample.Spec("bytes", "U8", (4099,))]
    layout = sample.shard(specs, 2)
    a, b = root / "A", root / "B"
    sample.write_checkpoint(str(a), layout, lambda s: np.random.default_rng(len(s.name)).integers(
        0, 1 << 16, s.nbytes // 2, dtype=np.uint16).view(np.uint8) if s.dtype == "BF16" else
        np.arange(s.nbytes, dtype=np.uint8))
    sample.write_checkpoint(str(b), layout, lambda s: _moved(s))
    return a, b


def _moved(s):
    rng = np.random.default_rng(len(s.name))
    if s.dtype != "BF16":
        return np.arange(s.nbytes, dtype=np.uint8)[::-1].copy()
    w = rng.integers(0, 1 << 16, s.nbytes // 2, dtype=np.uint16)
    w[::97] += 1
    return w.view(np.uint8)


@pytest.mark.parametrize("shift", [0, 5])
def test_apply_writes_the_same_files_with_and_without_direct_writes(tmp_path, shift):
    a, b = _pair(tmp_path, shift)
    bundle = tmp_path / "d.wdb"
    wdiff.pack(a, b, bundle)
    wdiff.apply(bundle, a, tmp_path / "C1")
    assert tree(tmp_path / "C1") == tree(b)
    env = dict(os.environ, WDIFF_DIRECT="0")
    p = subprocess.run([sys.executable, "-m", "wdiff", "apply", "-q", str(bundle), str(a), "-o", str(tmp_path / "C0")],
                       env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert tree(tmp_path / "C0") == tree(b)
