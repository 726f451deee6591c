"""wdiff.live end to end, with real processes: a tiny transformers model
(built from a config, random init, nothing downloaded) trained in bf16 with
AdamW, published after every step; followers in other processes end
bit-identical to the trainer after each step, catch up after missed steps,
start from nothing; SIGKILLed in the middle of an update, a follower comes
back as the old or the new version and recovers. And the Trainer callback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from kit.cli import ok
from kit.digests import state_digest

from wdiff.live import Publisher

transformers = __import__("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

#: real trainings (transformers, a Trainer) and follower processes
pytestmark = pytest.mark.slow

CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64)

WORKER = textwrap.dedent(
    """
    import hashlib, json, os, sys, time
    import torch
    remote, state, kind, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    torch.manual_seed(seed)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        model = LlamaForCausalLM(LlamaConfig(**json.loads(os.environ["CONFIG"]))).to(torch.bfloat16).eval()
        tensors = model.state_dict()
    else:  # the tensors of a spec: what an engine that is not transformers holds
        spec = json.loads(open(kind).read())
        tensors = {k: torch.randn(shape).to(getattr(torch, dt)) for k, (dt, shape) in spec.items()}
    if os.environ.get("SLOW"):
        from wdiff.live import _tensors
        from wdiff.ops.apply import patch as patching
        patching.BATCH_BYTES = 1
        real_write, real_scatter = patching.write_all, _tensors.Live.scatter
        def write(fd, data, off):
            time.sleep(0.02)
            real_write(fd, data, off)
        def scatter(self, *a):
            time.sleep(0.01)
            real_scatter(self, *a)
        patching.write_all, _tensors.Live.scatter = write, scatter
    from wdiff.live import Follower

    def digest():
        h = hashlib.sha256()
        for k in sorted(tensors):
            h.update(k.encode()); h.update(tensors[k].reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    fol = Follower(remote, tensors, state)
    print(json.dumps({"ready": fol.version_hex, "digest": digest()}), flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        res = fol.poll()
        out = {"version": fol.version_hex, "digest": digest()}
        if res is not None:
            out.update(bundles=res.bundles, squashed=res.squashed, anchor=res.anchor, pause=res.pause_seconds,
                       fetched=res.bytes_fetched)
        print(json.dumps(out), flush=True)
    """
)


class Worker:
    def __init__(self, tmp, remote, state, kind="llama", seed=1, slow=False):
        env = dict(os.environ, CONFIG=json.dumps(CONFIG))
        if slow:
            env["SLOW"] = "1"
        self.p = subprocess.Popen([sys.executable, "-c", WORKER, str(remote), str(state), kind, str(seed)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.ready = json.loads(self.p.stdout.readline())

    def poll(self) -> dict:
        self.p.stdin.write("poll\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        assert line, "the follower process died"
        return json.loads(line)

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
            self.p.wait(timeout=60)

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()


def train_steps(model, opt, n, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        ids = torch.randint(0, CONFIG["vocab_size"], (2, 16), generator=g)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()


def test_trainer_and_followers_stay_bit_identical(tmp_path):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    remote = tmp_path / "remote"
    pub = Publisher(remote, tmp_path / "mirror", files={"config.json": model.config.to_json_string()})
    versions = {}
    res = pub.publish(model.state_dict(), label="step-0")
    versions[res.version] = state_digest(model.state_dict())
    w = Worker(tmp_path, remote, tmp_path / "f1")
    try:
        assert w.ready["ready"] is None  # an empty state dir: nothing held yet
        out = w.poll()  # from nothing: the anchor, loaded into the tensors
        assert out["anchor"] and out["digest"] == state_digest(model.state_dict())
        for s in range(1, 7):
            train_steps(model, opt, 1, s)
            res = pub.publish(model.state_dict(), label=f"step-{s}")
            assert not res.anchor and res.changed_elements > 0
            versions[res.version] = state_digest(model.state_dict())
            if s in (3, 4):
                continue  # the follower misses two steps
            out = w.poll()
            assert out["version"] == res.version and out["digest"] == state_digest(model.state_dict()), s
            assert out["bundles"] == (3 if s == 5 else 1) and out["squashed"] == (s == 5)
            assert w.poll() == {"version": res.version, "digest": out["digest"]}  # up to date: nothing applied
    finally:
        w.close()
    # a restarted worker loads its own copy of the version it held, then follows on
    train_steps(model, opt, 1, 99)
    res = pub.publish(model.state_dict(), label="step-7")
    w = Worker(tmp_path, remote, tmp_path / "f1", seed=5)
    try:
        assert versions[w.ready["ready"]] == w.ready["digest"]
        assert w.poll()["digest"] == state_digest(model.state_dict())
    finally:
        w.close()
    # a late joiner with an empty state dir starts from the anchor and the run after it
    w = Worker(tmp_path, remote, tmp_path / "f2", seed=6)
    try:
        out = w.poll()
        assert out["anchor"] and out["digest"] == state_digest(model.state_dict())
    finally:
        w.close()
    # and the mirror is a checkpoint from_pretrained loads
    loaded = LlamaForCausalLM.from_pretrained(tmp_path / "mirror", torch_dtype=torch.bfloat16)
    assert state_digest(loaded.state_dict()) == state_digest(model.state_dict())


def test_sigkill_in_the_middle_of_an_update(tmp_path):
    """Kill the follower at random moments of a poll (download, squash,
    apply_into, the in-place update of its copy), several times: every
    restart finds the old or the new version (loaded into fresh tensors and
    checked bit for bit), and a poll brings it to the head."""
    g = torch.Generator().manual_seed(0)
    sd = {f"w{i}": torch.randn(128, 256, generator=g).to(torch.bfloat16) for i in range(6)}
    sd.update({f"b{i}": torch.randn(40, generator=g).to(torch.bfloat16) for i in range(30)})
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({k: ["bfloat16", list(v.shape)] for k, v in sd.items()}))
    remote = tmp_path / "remote"
    pub = Publisher(remote, tmp_path / "mirror")
    versions = {}

    def publish(n):
        for _ in range(n):
            with torch.no_grad():
                for t in sd.values():
                    m = torch.rand(t.shape, generator=g) < 0.02
                    t[m] = (t[m].float() * 1.01 + 1e-3).to(t.dtype)
            res = pub.publish(sd)
            versions[res.version] = state_digest(sd)
        return res.version

    publish(1)
    w = Worker(tmp_path, remote, tmp_path / "f", kind=str(spec), slow=True)
    t = time.perf_counter()
    w.poll()  # a probe: how long one update from nothing takes, slowed
    probe = time.perf_counter() - t
    w.close()
    rng = np.random.default_rng(3)
    moments = []
    for trial in range(6):
        head = publish(1 + trial % 2)
        txn = tmp_path / "f" / "checkpoint" / ".wdiff" / "txn" / "journal.json"
        moments.append("mid in-place update" if txn.exists() else "between updates or before one")
        w = Worker(tmp_path, remote, tmp_path / "f", kind=str(spec), seed=trial + 10, slow=True)
        held = w.ready["ready"]
        assert held in versions and versions[held] == w.ready["digest"], trial
        w.p.stdin.write("poll\n")
        w.p.stdin.flush()
        time.sleep(float(rng.uniform(0.05, 1.5 * probe)))
        w.kill()
    txn = tmp_path / "f" / "checkpoint" / ".wdiff" / "txn" / "journal.json"
    moments.append("mid in-place update" if txn.exists() else "between updates or before one")
    print("killed:", moments[1:])
    w = Worker(tmp_path, remote, tmp_path / "f", kind=str(spec), seed=99)
    try:
        assert versions[w.ready["ready"]] == w.ready["digest"]
        out = w.poll()
        assert out["version"] == head and out["digest"] == versions[head]
    finally:
        w.close()


def test_trainer_callback_publishes_every_n_steps(tmp_path):
    from transformers import Trainer, TrainingArguments

    from wdiff.integrations.transformers import WdiffCallback

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": (ids := torch.randint(0, 128, (16,), generator=g)), "labels": ids} for _ in range(16)]
    cb = WdiffCallback(tmp_path / "remote", tmp_path / "mirror", every=2)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=5, per_device_train_batch_size=2,
                             learning_rate=1e-3, report_to=[], save_strategy="no", logging_strategy="no",
                             use_cpu=True, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[cb]).train()
    assert [r.label for r in cb.results] == ["step-2", "step-4", "step-5"]  # every 2, and the last step
    assert cb.results[0].anchor and not cb.results[1].anchor
    ok("pull", tmp_path / "remote", tmp_path / "pulled")
    loaded = LlamaForCausalLM.from_pretrained(tmp_path / "pulled", torch_dtype=torch.bfloat16)
    assert state_digest(loaded.state_dict()) == state_digest(model.state_dict())
