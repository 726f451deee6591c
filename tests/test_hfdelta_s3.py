"""``wdiff export`` into an object store (ModelExpress reads S3 prefixes) and
``pull --layout hf-delta`` from one, against moto's S3 server on 127.0.0.1
(tests/s3fake.py): the same versions as in a directory, incremental, and
the debris of an interrupted export replaced while anything else without a
ledger is refused."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from factory import tree, write_ckpt
from hfdelta_ref import Receiver, load_full
from s3fake import configure
from test_hfdelta import push_all, steps, wd

pytestmark = pytest.mark.slow  # real trainings / a real S3 server: minutes


@pytest.fixture
def s3(moto_s3, monkeypatch):
    configure(monkeypatch, moto_s3.endpoint)
    return moto_s3


def test_export_to_s3_and_pull_from_it(s3, tmp_path):
    versions = [write_ckpt(tmp_path / f"v{i}", t, shards=2, companions={"config.json": b"{}"})
                for i, t in enumerate(steps(np.random.default_rng(33)))]
    R = tmp_path / "R"
    bucket = s3.new_bucket()
    url = f"s3://{bucket}/policy"
    push_all(R, versions[:3])
    doc = json.loads(wd("export", R, url, "--layout", "hf-delta", "--json").stdout)
    assert [w["full"] for w in doc["written"]] == [True, False, False]
    fs = s3._fs()
    keys = sorted(k.split("/policy/", 1)[1] for k in fs.find(f"{bucket}/policy"))
    assert ".wdiff/export-pending.json" not in keys
    assert {k.split("/")[0] for k in keys} == {"weight_v000000", "weight_v000001", "weight_v000002"}
    # the prefix, copied down as is, replays exactly in the reference receiver
    local = tmp_path / "copy"
    fs.get(f"{bucket}/policy/", str(local), recursive=True)
    rx = Receiver(str(local), str(tmp_path / "engine"))
    for i in range(3):
        rx.pull(i)
        assert rx.tensors == load_full(versions[i])
    # and wdiff pulls it straight from the store
    wd("pull", url, tmp_path / "D", "--layout", "hf-delta", "-q")
    assert tree(tmp_path / "D") == tree(versions[2])
    assert json.loads(wd("export", R, url, "--json").stdout)["up_to_date"] is True
    # an export killed after its marker and a partial object: the next one replaces them
    marker = tmp_path / "m"
    marker.write_bytes(json.dumps({"version": 3}).encode())
    fs.put(str(marker), f"{bucket}/policy/.wdiff/export-pending.json")
    fs.pipe(f"{bucket}/policy/weight_v000003/model-00000-of-00001.safetensors", b"partial")
    wd("push", versions[3], R, "--base", versions[2], "-q")
    doc = json.loads(wd("export", R, url, "--json").stdout)
    assert [w["name"] for w in doc["written"]] == ["weight_v000003"]
    assert not fs.exists(f"{bucket}/policy/weight_v000003/model-00000-of-00001.safetensors")
    assert not fs.exists(f"{bucket}/policy/.wdiff/export-pending.json")
    wd("pull", url, tmp_path / "D", "--layout", "hf-delta", "-q")
    assert tree(tmp_path / "D") == tree(versions[3])
    # a version folder no export was writing is someone else's: refused, nothing deleted
    fs.pipe(f"{bucket}/policy/weight_v000004/config.json", b"{}")
    wd("push", versions[4], R, "--base", versions[3], "-q")
    r = wd("export", R, url, check=False)
    assert r.returncode == 4 and "no ledger" in r.stderr
    assert fs.cat(f"{bucket}/policy/weight_v000004/config.json") == b"{}"
    assert os.environ["AWS_ENDPOINT_URL"] == s3.endpoint
