"""Multi-rank publishing over a real gloo process group: ranks in separate
processes each publish their own tensors as parts of one version, rank 0
commits once every part is durable; a reader polling the chain meanwhile
sees only whole versions; a rank killed before the commit leaves nothing
visible, and the next publish goes on from the same mirrors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

import wdiff
from wdiff.live import Follower
from wdiff.sync.fetch import read_chain
from wdiff.remotes import open_remote

STATE = r"""
import numpy as np

def state(rank, step):
    rng = np.random.default_rng(rank)
    sd = {f"r{rank}.w{i}": rng.integers(0, 1 << 16, 4096 + 512 * rank, dtype=np.uint16) for i in range(3)}
    for s in range(step):
        r = np.random.default_rng(1000 * rank + s)
        for v in sd.values():
            v[r.integers(0, v.size, 40)] += 1
    return sd

def shared(world, step):
    # two tensors split over the ranks: by rows, and by columns
    rng = np.random.default_rng(77)
    row = rng.integers(-(1 << 15), 1 << 15, (4 * world + 3, 300), dtype=np.int16)
    col = rng.integers(-(1 << 15), 1 << 15, (64, 5 * world), dtype=np.int16)
    for s in range(step):
        r = np.random.default_rng(5000 + s)
        row.reshape(-1)[r.integers(0, row.size, 30)] += 1
        col.reshape(-1)[r.integers(0, col.size, 30)] += 1
    return {"shared.row": row, "shared.col": col}

def rows_of(world, rank, n):
    # uneven row split: rank 0 takes the remainder
    base = n // world
    start = 0 if rank == 0 else base * rank + n % world
    return start, base + (n % world if rank == 0 else 0)
"""
RANK = STATE + r"""
import json, os, sys
import torch.distributed as dist
from wdiff.live.ranks import RankPublisher

rank, world, init, remote, root, steps, die = sys.argv[1:8]
rank, world, die = int(rank), int(world), int(die)
first, last = (int(x) for x in steps.split(":"))
dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
after = os.environ.get("WDIFF_TEST_AFTER", "store")
if rank == die and after in ("store", "commit"):  # this rank dies at step WDIFF_TEST_STEP: after storing its part, or after the commit
    import wdiff.live.ranks as ranks
    where = {"store": "store_part", "commit": "apply_in_place"}[after]
    real = getattr(ranks, where)
    def and_die(*a, **k):
        if int(os.environ.get("WDIFF_TEST_STEP", "-1")) == cur:
            if where == "store_part":
                real(*a, **k)
            os._exit(9)  # a mirror update that never started
        return real(*a, **k)
    setattr(ranks, where, and_die)
pub = RankPublisher(remote, os.path.join(root, f"mirror{rank}"), files={"config.json": b"{}\n"} if rank == 0 else None)
out = []
for cur in range(first, last):
    try:
        sd = state(rank, cur)
        if rank == die and after == "dup" and cur == int(os.environ["WDIFF_TEST_STEP"]):
            sd = {**sd, **state(0, cur)}  # this rank also gives rank 0's tensors: every rank refuses the step
        slices = None
        if os.environ.get("WDIFF_TEST_SLICES"):
            import torch
            from wdiff.live.ranks import Slice
            full = shared(world, cur)
            start, n = rows_of(world, rank, full["shared.row"].shape[0])
            sd["shared.row"] = torch.from_numpy(full["shared.row"][start : start + n].copy())
            sd["shared.col"] = torch.from_numpy(full["shared.col"][:, 5 * rank : 5 * rank + 5].copy())
            slices = {"shared.row": Slice(full["shared.row"].shape, 0, start),
                      "shared.col": Slice(full["shared.col"].shape, 1, 5 * rank)}
        res = pub.publish(sd, label=f"step-{cur}", slices=slices)
        out.append({"step": cur, "version": res.version, "anchor": res.anchor})
    except Exception as e:
        out.append({"step": cur, "error": f"{type(e).__name__}: {e}"})
        break
with open(os.path.join(root, f"out{rank}.json"), "w") as f:
    json.dump(out, f)
# no process-group teardown at exit: after a peer died it can abort ("terminate called ...")
os._exit(0)
"""

READER = r"""
import sys, time, json
from wdiff.sync.fetch import read_chain
from wdiff.remotes import open_remote
remote, stop, out = sys.argv[1:4]
seen = []
import os
while not os.path.exists(stop):
    try:
        head = read_chain(open_remote(remote)).head
    except Exception:
        head = None
    if head is not None and (not seen or seen[-1] != head.hex()):
        seen.append(head.hex())
    time.sleep(0.005)
json.dump(seen, open(out, "w"))
"""


_NS: dict = {}
exec(STATE, _NS)  # noqa: S102 - the state the rank processes build
state, shared = _NS["state"], _NS["shared"]


def run_ranks(tmp_path, world: int, steps: str, die: int = -1, env=None, reader=True):
    remote = tmp_path / "remote"
    init = tmp_path / f"init-{time.monotonic_ns()}"
    stop, seen_path = tmp_path / "stop", tmp_path / "seen.json"
    stop.unlink(missing_ok=True)
    rd = subprocess.Popen([sys.executable, "-c", READER, str(remote), str(stop), str(seen_path)]) if reader else None
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(world), str(init), str(remote), str(tmp_path),
                               str(steps), str(die)], env=env) for r in range(world)]
    codes = [p.wait(timeout=240) for p in procs]
    seen = []
    if rd is not None:
        stop.touch()
        rd.wait(timeout=60)
        seen = json.loads(seen_path.read_text())
    outs = {}
    for r in range(world):
        p = tmp_path / f"out{r}.json"
        outs[r] = json.loads(p.read_text()) if p.exists() else None
        p.unlink(missing_ok=True)
    return codes, outs, seen


def full(world: int, step: int) -> dict[str, np.ndarray]:
    out = {}
    for r in range(world):
        out.update(state(r, step))
    return out


def pulled(tmp_path, remote, version: str, name: str) -> dict[str, np.ndarray]:
    d = tmp_path / name
    wdiff.pull(str(remote), d, to=version)
    files = sorted(p.name for p in d.glob("*.safetensors"))
    got = {}
    for f in files:
        got.update(load_file(str(d / f)))
    return got, files


def same(a, b) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_three_ranks_publish_whole_versions_a_reader_sees_only_those(tmp_path):
    """Each rank its own tensors, and its slices of two tensors split over
    the ranks (by rows, unevenly, and by columns): rank 0 publishes those
    whole, assembled from every rank's slice."""
    world, steps = 3, 3
    codes, outs, seen = run_ranks(tmp_path, world, f"0:{steps}", env=dict(os.environ, WDIFF_TEST_SLICES="1"))
    assert codes == [0] * world
    versions = [o["version"] for o in outs[0]]
    assert all([o["version"] for o in outs[r]] == versions for r in range(world))  # one version per step, everywhere
    assert outs[0][0]["anchor"] and not outs[0][1]["anchor"]
    chain = read_chain(open_remote(str(tmp_path / "remote")))
    assert [e.version.hex() for e in chain.entries] == versions
    assert seen and set(seen) <= set(versions)  # the reader saw only published versions
    for step, v in enumerate(versions):
        got, files = pulled(tmp_path, tmp_path / "remote", v, f"pull{step}")
        assert same(got, {**full(world, step), **shared(world, step)})  # every rank's tensors of one step
    assert files == [f"model-{k:05d}-of-00003.safetensors" for k in (1, 2, 3)]
    index = json.loads((tmp_path / "pull2" / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["r2.w0"] == "model-00003-of-00003.safetensors"
    assert index["weight_map"]["shared.col"] == "model-00001-of-00003.safetensors"  # the lowest rank's
    assert (tmp_path / "pull2" / "config.json").read_bytes() == b"{}\n"
    # a follower of the remote, its tensors in the shards' order, catches up to the head
    want = {}
    for r in range(world):
        want.update(state(r, steps - 1))
        if r == 0:
            want.update(shared(world, steps - 1))
    tensors = {k: np.zeros_like(v) for k, v in want.items()}
    res = Follower(str(tmp_path / "remote"), tensors, str(tmp_path / "follower")).poll()
    assert res.version == versions[-1] and same(tensors, want)


@pytest.mark.slow
def test_a_rank_killed_before_the_commit_leaves_nothing_visible(tmp_path):
    world = 2
    codes, outs, _ = run_ranks(tmp_path, world, "0:1", reader=False)  # step 0: the anchor
    assert codes == [0, 0]
    v0 = outs[0][0]["version"]
    env = dict(os.environ, WDIFF_TEST_STEP="1")
    codes, outs, seen = run_ranks(tmp_path, world, "1:3", die=1, env=env)
    # rank 1 stored its part of step 1 and died; rank 0 did not commit
    assert codes[1] == 9 and outs[1] is None
    assert "error" in outs[0][-1], outs[0]
    chain = read_chain(open_remote(str(tmp_path / "remote")))
    versions = [e.version.hex() for e in chain.entries]
    assert versions == [v0] and set(seen) <= {v0} and len(outs[0]) == 1
    # rank 0's collective failed with its part stored: it stays, until the ranks find it was never committed
    assert (tmp_path / "mirror0" / ".wdiff" / "live" / "part.wdb").exists()
    # a rank that gives another rank's tensors: every rank refuses the step, none waits, nothing is published
    env = dict(os.environ, WDIFF_TEST_STEP="1", WDIFF_TEST_AFTER="dup")
    codes, outs, _ = run_ranks(tmp_path, world, "1:2", die=1, env=env, reader=False)
    assert codes == [0, 0]
    assert all("UsageError" in outs[r][0]["error"] and "is given by ranks 0 and 1" in outs[r][0]["error"]
               for r in range(world)), outs
    assert [e.version.hex() for e in read_chain(open_remote(str(tmp_path / "remote"))).entries] == [v0]
    # the same mirrors go on: steps 1 and 2, all ranks alive
    codes, outs, _ = run_ranks(tmp_path, world, "1:3", reader=False)
    assert codes == [0, 0], outs
    chain = read_chain(open_remote(str(tmp_path / "remote")))
    assert len(chain.entries) == 3 and not (tmp_path / "mirror0" / ".wdiff" / "live" / "part.wdb").exists()
    got, _ = pulled(tmp_path, tmp_path / "remote", chain.head.hex(), "pull-after")
    assert same(got, full(world, 2))


@pytest.mark.slow
def test_a_rank_killed_after_the_commit_finishes_its_mirror_next_time(tmp_path):
    world = 2
    codes, outs, _ = run_ranks(tmp_path, world, "0:1", reader=False)
    assert codes == [0, 0]
    env = dict(os.environ, WDIFF_TEST_STEP="1", WDIFF_TEST_AFTER="commit")
    codes, outs, _ = run_ranks(tmp_path, world, "1:3", die=1, env=env, reader=False)
    assert codes[1] == 9
    assert outs[0][0]["step"] == 1 and "version" in outs[0][0]  # step 1 was published
    assert (tmp_path / "mirror1" / ".wdiff" / "live" / "part.wdb").exists()  # rank 1's mirror is behind
    codes, outs, _ = run_ranks(tmp_path, world, "2:3", reader=False)
    assert codes == [0, 0], outs
    chain = read_chain(open_remote(str(tmp_path / "remote")))
    assert len(chain.entries) == 3 and chain.head.hex() == outs[0][0]["version"]
    got, _ = pulled(tmp_path, tmp_path / "remote", chain.head.hex(), "pull-after")
    assert same(got, full(world, 2))


def test_slices_must_tile_their_tensor():
    from wdiff.live.ranks import _tiling

    ok = [[("w", (10, 4), 0, 0, 6, "int16")], [("w", (10, 4), 0, 6, 4, "int16")]]
    owners, why = _tiling(ok)
    assert why is None and owners["w"] == (0, (10, 4), 0, "int16", [(0, 0, 6), (1, 6, 4)])
    gap = [[("w", (10, 4), 0, 0, 5, "int16")], [("w", (10, 4), 0, 6, 4, "int16")]]
    overlap = [[("w", (10, 4), 0, 0, 7, "int16")], [("w", (10, 4), 0, 6, 4, "int16")]]
    short = [[("w", (10, 4), 0, 0, 6, "int16")], []]
    other = [[("w", (10, 4), 0, 0, 6, "int16")], [("w", (10, 4), 0, 6, 4, "bfloat16")]]
    for bad in (gap, overlap, short, other):
        assert _tiling(bad)[1]
