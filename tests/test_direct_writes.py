"""apply writes the block-aligned middle of each unit with O_DIRECT and the
unaligned ends through the page cache: whatever the offsets, sizes and
header lengths, the file holds exactly the bytes, and an apply with direct
writes turned off (WDIFF_DIRECT=0) writes the same files. The writes run
behind the workers (WriteBehind): every byte lands, memory stays a fixed
number of buffers, and a failed write stops the run and is never lost."""

import errno
import os
import threading

import numpy as np
import pytest
from factory import tree
from kit.cli import ok

import wdiff
from wdiff.store import sample
from wdiff.errors import WdiffIOError
from wdiff.fsutil import write_all
from wdiff.store import blockio
from wdiff.store.blockio import DIRECT_ALIGN, WriteBehind, open_direct, scratch, scratch_at, write_out

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
    ok("apply", "-q", bundle, a, "-o", tmp_path / "C0", env={"WDIFF_DIRECT": "0"})
    assert tree(tmp_path / "C0") == tree(b)


@pytest.mark.parametrize("direct", [True, False])
def test_write_behind_puts_every_unit_in_place_with_a_few_buffers(tmp_path, monkeypatch, direct):
    """Units of odd sizes at odd offsets, produced by several threads at once
    into buffers that are reused: the file holds exactly the bytes, and no
    more than workers + writers buffers were ever out at once."""
    path = tmp_path / "f"
    rng = np.random.default_rng(1)
    sizes = rng.integers(1, 3 * A_, 200)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]) + 13
    want = rng.integers(0, 256, int(offsets[-1] + sizes[-1]), dtype=np.uint8)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    dfd = open_direct(str(path), fd) if direct else -1
    lock = threading.Lock()
    out = {"now": 0, "most": 0}

    def written(f, dfd_, buf, off, write):
        write_out(f, dfd_, buf, off, write=write)
        with lock:
            out["now"] -= 1

    try:
        monkeypatch.setattr(blockio, "write_out", written)
        with WriteBehind(workers=3, writers=2) as wb:
            def worker(k):
                for i in range(k, len(sizes), 3):
                    slot = wb.take(int(sizes[i]), int(offsets[i]), direct)
                    with lock:
                        out["now"] += 1
                        out["most"] = max(out["most"], out["now"])
                    slot.view[:] = want[offsets[i] : offsets[i] + sizes[i]]
                    wb.write(fd, dfd, slot, int(offsets[i]), where="f", write=write_all)
            ts = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            wb.wait(fd)
        monkeypatch.undo()
        os.fsync(fd)
    finally:
        os.close(fd)
        if dfd >= 0:
            os.close(dfd)
    assert path.read_bytes()[13:] == want[13:].tobytes()
    assert 1 <= out["most"] <= 5 and out["now"] == 0


def test_write_behind_holds_at_most_its_depth(tmp_path):
    """A worker that wants a buffer while every one is being written waits."""
    gate = threading.Event()
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def slow_write(f, data, off):
        gate.wait(10)
        os.pwrite(f, data, off)

    try:
        with WriteBehind(workers=1, writers=2) as wb:
            for i in range(3):  # depth 3: all taken and handed to the writers
                slot = wb.take(8, 8 * i, False)
                slot.view[:] = i
                wb.write(fd, -1, slot, 8 * i, where="f", write=slow_write)
            got = []
            t = threading.Thread(target=lambda: got.append(wb.take(8, 24, False)))
            t.start()
            t.join(0.3)
            assert t.is_alive() and not got, "a fourth buffer was made"
            gate.set()
            t.join(10)
            assert got
            wb.give(got[0])
            wb.wait(fd)
    finally:
        os.close(fd)
    assert path.read_bytes() == bytes([0] * 8 + [1] * 8 + [2] * 8)


def test_write_behind_failure_is_raised_where_it_is_waited_for(tmp_path):
    """A write that fails (a full disk) is raised from the next take, from
    wait and from leaving the block: the run stops, with the file's name."""
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def full(f, data, off):
        raise OSError(errno.ENOSPC, "No space left on device")

    try:
        with pytest.raises(WdiffIOError) as e:
            with WriteBehind(workers=1, writers=1) as wb:
                slot = wb.take(8, 0, False)
                wb.write(fd, -1, slot, 0, where="out/model.safetensors", write=full)
                with pytest.raises(WdiffIOError):
                    wb.wait(fd)
                with pytest.raises(WdiffIOError):
                    wb.take(8, 8, False)
        assert "out/model.safetensors" in str(e.value) and "space" in str(e.value.hint)
    finally:
        os.close(fd)
