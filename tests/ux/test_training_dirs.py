"""A command line that never surprises on the directories training really
writes: a broken shard or an unsigned push is not published, two models in
one directory are two models, trainer state stays home unless asked for,
single files diff, and rolling back costs a delta, not a whole anchor.

One test per item of the issue; each drives the real command line."""

from __future__ import annotations

import os

import numpy as np
import pytest

from factory import mutate, rand, tree, write_ckpt
from uxkit import Promises, copy_ckpt, json_docs, ok, one_json_doc, weights_tree, wdiff


def _head(remote) -> str | None:
    (log,) = json_docs(ok("log", "--json", remote).out)
    return log["head"]


@pytest.mark.slow
def test_push_refuses_what_it_cannot_verify(chain):
    with Promises() as p:
        # a shard cut short (a full disk, a killed copy) is not published
        q = copy_ckpt(chain.B, chain.tmp / "step-3")
        shard = q / "model-00001-of-00002.safetensors"
        os.truncate(shard, shard.stat().st_size // 2)
        head = _head(chain.R)
        r = wdiff("push", "-q", q, chain.R, "--base", chain.B)
        p.check(r.rc != 0, "push -q of a checkpoint with a truncated shard is refused", r)
        p.check("model-00001-of-00002.safetensors" in r.err, "the message names the broken shard", r)
        p.check(_head(chain.R) == head, "the remote's head is unchanged", r)
        r = wdiff("push", "-q", "--allow-opaque", q, chain.R, "--base", chain.B)
        p.check(r.rc == 0, "--allow-opaque publishes it anyway, as asked", r)

        # an unsigned push onto a signed chain is refused
        keys = chain.tmp / "keys"
        keys.mkdir()
        ok("keygen", "-q", keys / "release.key")
        signed = chain.tmp / "signed"
        ok("push", "-q", "--anchor", chain.A, signed, "--sign", keys / "release.key")
        head = _head(signed)
        r = wdiff("push", "-q", chain.B, signed, "--base", chain.A)
        p.check(r.rc != 0, "an unsigned push onto a signed chain is refused", r)
        p.check(_head(signed) == head, "the signed chain's head is unchanged", r)


def test_two_models_in_one_directory_are_two_models(tmp_path):
    rng = np.random.default_rng(3)
    policy = {"model.embed": rand(rng, "BF16", (128, 64)), "model.norm": rand(rng, "F32", (64,))}
    ref = {"model.embed": rand(rng, "BF16", (128, 64)), "model.norm": rand(rng, "F32", (64,))}
    policy2 = dict(policy, **{"model.embed": mutate(policy["model.embed"], 0.02, rng)})
    for step, pol in (("step-1", policy), ("step-2", policy2)):  # RLHF: the policy moves, the reference does not
        write_ckpt(tmp_path / step / "policy", pol, companions={"config.json": b'{"role": "policy"}'})
        write_ckpt(tmp_path / step / "ref", ref, companions={"config.json": b'{"role": "ref"}'})
    a, b = tmp_path / "step-1", tmp_path / "step-2"
    with Promises() as p:
        r = wdiff("diff", "--json", a, b)
        p.check(r.rc == 0, "a directory holding policy/ and ref/ with the same tensor names is diffed", r)
        doc = one_json_doc(r.out) or {}
        modified = [t["name"] for t in doc.get("tensors", []) if t.get("status") == "modified"]
        p.check(len(modified) == 1 and "policy" in modified[0],
                f"exactly the policy's embedding changed, named within policy/: {modified}", r)
        r = wdiff("pack", "-q", a, b, "-o", tmp_path / "step-2.wdb")
        p.check(r.rc == 0, "it packs", r)
        r = wdiff("apply", "-q", tmp_path / "step-2.wdb", a, "-o", tmp_path / "rebuilt")
        p.check(r.rc == 0 and tree(tmp_path / "rebuilt") == tree(b), "and applies, bit for bit", r)


TRAINER_STATE = ["optimizer.pt", "scheduler.pt", "rng_state_0.pth", "rng_state_1.pth"]


@pytest.mark.slow
def test_trainer_state_stays_home_unless_asked_for(tmp_path):
    rng = np.random.default_rng(4)
    w = {"lm_head.weight": rand(rng, "BF16", (256, 64)), "model.norm": rand(rng, "F32", (64,))}
    w2 = dict(w, **{"lm_head.weight": mutate(w["lm_head.weight"], 0.01, rng)})

    def step(name, weights, seed):
        extra = {f: np.random.default_rng(seed).bytes(4096) for f in TRAINER_STATE}
        extra.update({
            "config.json": b'{"model_type": "llama"}',
            "trainer_state.json": b'{"global_step": %d}' % seed,
            "events.out.tfevents.1700000000.host": b"tensorboard",
            "scratch.txt": b"debug dump",
            ".wdiffignore": b"scratch.txt\n",
        })
        return write_ckpt(tmp_path / name, weights, companions=extra)

    a, b = step("checkpoint-100", w, 100), step("checkpoint-200", w2, 200)

    def shipped(bundle) -> set[str]:
        r = wdiff("info", "--json", bundle)
        return {f["path"] for f in (one_json_doc(r.out) or {}).get("files", [])}

    with Promises() as p:
        r = wdiff("pack", a, b, "-o", tmp_path / "d.wdb")
        p.check(r.rc == 0, "pack of a Trainer checkpoint works", r)
        files = shipped(tmp_path / "d.wdb")
        p.check("config.json" in files and "model.safetensors" in files, f"the model is shipped: {sorted(files)}", r)
        for f in TRAINER_STATE:
            p.check(f not in files, f"{f} is left out by default", r)
        p.check("optimizer.pt" in r.text, "a line names what was left out (optimizer.pt, ...)", r)
        p.check("scratch.txt" not in files, ".wdiffignore is honoured (scratch.txt)", r)

        r = wdiff("apply", "-q", tmp_path / "d.wdb", a, "-o", tmp_path / "rebuilt")
        p.check(r.rc == 0, "the bundle applies to the training directory it came from (its trainer state ignored)", r)
        got = set(weights_tree(tmp_path / "rebuilt")) if r.rc == 0 else set()
        p.check(r.rc == 0 and not got & set(TRAINER_STATE), f"the result holds no trainer state: {sorted(got)}", r)

        r = wdiff("pack", "--exclude", "events.out.*", a, b, "-o", tmp_path / "e.wdb")
        p.check(r.rc == 0, "--exclude is an option of pack", r)
        p.check(r.rc == 0 and "events.out.tfevents.1700000000.host" not in shipped(tmp_path / "e.wdb"),
                "--exclude leaves matching files out", r)

        r = wdiff("pack", "--include", "optimizer.pt", a, b, "-o", tmp_path / "i.wdb")
        p.check(r.rc == 0, "--include is an option of pack", r)
        p.check(r.rc == 0 and "optimizer.pt" in shipped(tmp_path / "i.wdb"),
                "--include brings a default exclusion back", r)


def test_diff_accepts_two_safetensors_files(tmp_path):
    rng = np.random.default_rng(5)
    w = {"lm_head.weight": rand(rng, "BF16", (128, 64)), "model.norm": rand(rng, "F32", (64,))}
    a = write_ckpt(tmp_path / "a", w)
    b = write_ckpt(tmp_path / "b", dict(w, **{"lm_head.weight": mutate(w["lm_head.weight"], 0.05, rng)}))
    fa, fb = os.path.join(a, "model.safetensors"), os.path.join(b, "model.safetensors")
    with Promises() as p:
        r = wdiff("diff", fa, fb)
        p.check(r.rc == 0, "wdiff diff a.safetensors b.safetensors is accepted", r)
        p.check("lm_head.weight" in r.out and "modified" in r.out, "and reports the modified tensor", r)
        r = wdiff("diff", "--exit-code", fa, fb)
        p.check(r.rc == 1, "--exit-code says they differ", r)
        r = wdiff("diff", "--exit-code", fa, fa)
        p.check(r.rc == 0, "and that a file equals itself", r)


@pytest.mark.parametrize("spec", ["HEAD~1", "v1"])
def test_rolling_back_uses_deltas(chain, spec):
    d = chain.pull("live")  # at v2
    r = wdiff("pull", "--json", "--to", spec, chain.R, d)
    with Promises() as p:
        p.check(r.rc == 0, f"pull --to {spec} rolls back to v1", r)
        p.check(weights_tree(d) == tree(chain.A), "the directory is v1 bit for bit", r)
        doc = one_json_doc(r.out) or {}
        p.check(doc.get("downloaded_bytes", chain.anchor_bytes) < chain.anchor_bytes,
                f"rolling back one step downloads about a delta ({chain.delta_bytes} bytes), "
                f"not the whole anchor ({chain.anchor_bytes} bytes)", r)
        p.check(doc.get("from_anchor") is False, "and is not rebuilt from an anchor", r)
