"""A signed multi-rank publish: every rank signs its staged part with the
publisher's key, so the commit (which now merges only parts signed by a
trusted key) publishes each step, and a puller trusting the key gets it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from test_gc import cli
from test_live_ranks import STATE, full, same

from wdiff.format.chain import Chain

RANK = STATE + r"""
import json, os, sys
import torch.distributed as dist
from wdiff.live.ranks import RankPublisher

rank, world, init, remote, root, key = sys.argv[1:7]
rank, world = int(rank), int(world)
dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
pub = RankPublisher(remote, os.path.join(root, f"mirror{rank}"), sign_key=key,
                    files={"config.json": b"{}\n"} if rank == 0 else None)
out = []
for cur in range(2):
    try:
        out.append(pub.publish(state(rank, cur), label=f"step-{cur}").version)
    except Exception as e:
        out.append(f"{type(e).__name__}: {e}")
        break
with open(os.path.join(root, f"out{rank}.json"), "w") as f:
    json.dump(out, f)
os._exit(0)
"""


@pytest.mark.slow
def test_signed_ranks_publish_and_a_trusting_puller_gets_every_step(tmp_path):
    key = tmp_path / "release.key"
    cli("keygen", key, "-q")
    world, remote, init = 2, tmp_path / "remote", tmp_path / f"init-{time.monotonic_ns()}"
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(world), str(init), str(remote), str(tmp_path),
                               str(key)]) for r in range(world)]
    assert [p.wait(timeout=240) for p in procs] == [0] * world
    outs = [json.loads((tmp_path / f"out{r}.json").read_text()) for r in range(world)]
    assert outs[0] == outs[1] and len(outs[0]) == 2, outs
    chain = Chain.decode((remote / "chain.json").read_bytes(), where="remote")
    assert [e.version.hex() for e in chain.entries] == outs[0] and chain.lineage.signer is not None
    cli("pull", remote, tmp_path / "p", "--trusted-key", f"{key}.pub", "-q")
    from safetensors.numpy import load_file

    got = {}
    for f in sorted((tmp_path / "p").glob("*.safetensors")):
        got.update(load_file(str(f)))
    assert same(got, full(world, 1))
    assert not os.path.exists(remote / "stage") or not any((remote / "stage").rglob("*.json"))
