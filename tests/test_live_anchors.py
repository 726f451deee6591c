"""The live API and the whole of a version: :func:`wdiff.live.apply_into` and
:func:`wdiff.live.iter_patches` from outside, with real torch tensors, bundles
made by ``wdiff pack`` and the Publisher, and hostile ones built by hand.

* A bundle applies into live tensors only when its target holds exactly
  their names, dtypes and shapes: an anchor of some of them, one with an
  extra tensor, another dtype or shape, a delta that adds or drops a
  tensor, a part of a many-writer version, a bundle of another model are
  refused, and every tensor is left as it was.
* Tensors are matched by name: a ``state_dict``, ``load_file``'s sorted
  dict, a reversed or shuffled dict all apply bit for bit.
* A record that fails after others were written (its target digest is
  checked after the scatter) puts every tensor back.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kit.cli import ok
from kit.digests import tensor_bytes as raw
from safetensors.torch import load_file, save_file

from wdiff.errors import BaseMismatchError, IntegrityError, WdiffError
from wdiff.live import Publisher, apply_into, iter_patches
from wdiff.sync.fetch import download, read_chain
from wdiff.progress import SILENT
from wdiff.remotes import open_remote

sys.path.insert(0, str(Path(__file__).parent))
import specbundle as sb  # noqa: E402


def model(seed: int) -> dict[str, torch.Tensor]:
    """Mixed dtypes, names whose sorted order is neither insertion order nor
    the safetensors library's (by dtype). The shape of one tensor depends on
    the seed: a process remembers a header it has checked by its digest, and
    each test must rebuild its own."""
    g = torch.Generator().manual_seed(seed)
    return {
        "z.embed": torch.randn(96 + seed, 40, generator=g).to(torch.bfloat16),
        "b.proj": torch.randn(50, 30, generator=g),
        "m.norm": torch.randn(64, generator=g).to(torch.float16),
        "a.bias": torch.randn(33, generator=g).to(torch.bfloat16),
        "k.step": torch.tensor(7, dtype=torch.int64),
    }


def step(sd: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, t in sd.items():
        t = t.clone()
        if t.dtype == torch.int64:
            t += 1
        else:
            m = torch.rand(t.shape, generator=g) < 0.05
            t[m] = (t[m].float() * 1.01 + 1e-3).to(t.dtype)
        out[k] = t
    return out


def snap(sd: dict) -> dict:
    return {k: raw(v) for k, v in sd.items()}


def holds(live: dict, want: dict) -> bool:
    return set(live) == set(want) and all(raw(live[k]) == raw(want[k]) for k in want)


def zeros_like(sd: dict) -> dict:
    return {k: torch.zeros_like(v) for k, v in sd.items()}


def save(d: Path, sd: dict, *, metadata=None) -> Path:
    d.mkdir(parents=True)
    save_file(sd, str(d / "model.safetensors"), metadata=metadata)
    return d


def pack(*args) -> dict:
    return json.loads(ok("pack", "--json", *args).out)


def head_bundle(remote: Path, tmp: Path, k: int = -1) -> str:
    store = open_remote(str(remote))
    e = read_chain(store).entries[k]
    work = tmp / f"dl-{e.bundle.hex()[:8]}"
    work.mkdir(exist_ok=True)
    return download(store, e, str(work), SILENT)[0]


def refused(bundle, live: dict, **kw) -> WdiffError:
    """apply_into refuses, and every tensor is exactly as it was; iter_patches
    with the same tensors refuses before its first patch."""
    before = snap(live)
    with pytest.raises(BaseMismatchError) as e:
        apply_into(bundle, live, **kw)
    assert snap(live) == before
    with pytest.raises(BaseMismatchError):
        next(iter(iter_patches(bundle, base=live)))
    return e.value


# -- the whole and its parts ---------------------------------------------------------------


def test_an_anchor_applies_only_into_exactly_its_tensors(tmp_path):
    full = model(0)
    anchor = tmp_path / "full.wdb"
    v = pack("--anchor", save(tmp_path / "full", full, metadata={"format": "pt"}), "-o", anchor)["target_fingerprint"]
    live = zeros_like(full)
    res = apply_into(anchor, live)
    assert holds(live, full) and res.version == v

    # the reported case: an anchor of 1 of the tensors, new values in it, over a model at V
    one = {"z.embed": torch.ones(96, 40, dtype=torch.bfloat16)}  # model(0)'s shape
    part = tmp_path / "part.wdb"
    pack("--anchor", save(tmp_path / "part", one), "-o", part)
    e = refused(part, live, base_version=v)
    assert "holds 1 tensors, and 5 are given" in e.message
    assert holds(live, full)

    # the full anchor into tensors it does not cover exactly
    extra = dict(live, **{"q.extra": torch.zeros(3)})
    refused(anchor, extra)
    fewer = {k: t for k, t in live.items() if k != "m.norm"}
    refused(anchor, fewer)
    retyped = dict(live, **{"b.proj": torch.zeros(50, 30, dtype=torch.float16)})
    assert "F32 [50, 30] in its target, F16 [50, 30]" in refused(anchor, retyped).message
    reshaped = dict(live, **{"b.proj": torch.zeros(30, 50)})
    refused(anchor, reshaped)
    renamed = {("y.embed" if k == "z.embed" else k): t for k, t in live.items()}
    assert "z.embed" in refused(anchor, renamed).message

    # the same anchor, exactly its tensors, in an order of their own
    back = {k: torch.zeros_like(full[k]) for k in reversed(list(full))}
    assert apply_into(anchor, back).version == v and holds(back, full)


def test_a_delta_applies_only_into_the_whole_of_its_base_and_target(tmp_path):
    A = model(1)
    B = step(A, 2)
    a = save(tmp_path / "A", A, metadata={"format": "pt"})
    va = pack("--anchor", a, "-o", tmp_path / "anchor.wdb")["target_fingerprint"]

    def live_at_a() -> dict:
        t = {k: v.clone() for k, v in A.items()}
        return t

    # a target that drops a tensor, or adds one: the live model would be no version
    dropped = {k: v for k, v in B.items() if k != "a.bias"}
    pack(a, save(tmp_path / "drop", dropped, metadata={"format": "pt"}), "-o", tmp_path / "drop.wdb")
    refused(tmp_path / "drop.wdb", live_at_a(), base_version=va)
    added = dict(B, **{"c.new": torch.ones(5)})
    pack(a, save(tmp_path / "add", added, metadata={"format": "pt"}), "-o", tmp_path / "add.wdb")
    refused(tmp_path / "add.wdb", live_at_a(), base_version=va)
    # a target that changes a tensor's dtype
    retyped = dict(B, **{"m.norm": B["m.norm"].float()})
    pack(a, save(tmp_path / "retype", retyped, metadata={"format": "pt"}), "-o", tmp_path / "retype.wdb")
    refused(tmp_path / "retype.wdb", live_at_a(), base_version=va)

    # a bundle of another model, with the caller asserting nothing
    X = {f"other.{k}": v for k, v in A.items()}
    x = save(tmp_path / "X", X, metadata={"format": "pt"})
    pack(x, save(tmp_path / "Y", step(X, 3), metadata={"format": "pt"}), "-o", tmp_path / "xy.wdb")
    refused(tmp_path / "xy.wdb", live_at_a())

    # the right delta applies, from load_file's dict (the file's order: by dtype, then name), bit for bit
    b = save(tmp_path / "B", B, metadata={"format": "pt"})
    ab = pack(a, b, "-o", tmp_path / "ab.wdb")
    live = load_file(str(a / "model.safetensors"))
    assert list(live) != list(A)
    res = apply_into(tmp_path / "ab.wdb", live, base_version=va)
    assert holds(live, B) and res.version == ab["target_fingerprint"]


def test_a_part_of_a_two_shard_version_is_not_the_version(tmp_path):
    """A part that holds one shard of two (what one writer of a many-writer
    version stages): its target is not the live model's whole."""
    A = model(4)
    B = step(A, 5)

    def two_shards(d: Path, sd: dict) -> Path:
        d.mkdir()
        names = sorted(sd)
        halves = {"model-00001-of-00002.safetensors": names[:3], "model-00002-of-00002.safetensors": names[3:]}
        for f, ns in halves.items():
            save_file({n: sd[n] for n in ns}, str(d / f), metadata={"format": "pt"})
        wm = {n: f for f, ns in halves.items() for n in ns}
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
        return d

    a, b = two_shards(tmp_path / "A", A), two_shards(tmp_path / "B", B)
    va = pack("--anchor", a, "-o", tmp_path / "anchor.wdb")["target_fingerprint"]
    live = zeros_like(A)
    assert apply_into(tmp_path / "anchor.wdb", live).version == va and holds(live, A)
    # the part: shard 1 only, on both sides (as `push --only` would pack it)
    pack("--exclude", "model-00002-of-00002.safetensors", a, b, "-o", tmp_path / "part.wdb")
    refused(tmp_path / "part.wdb", live)
    # and an anchor of shard 2 only
    pack("--anchor", "--exclude", "model-00001-of-00002.safetensors", b, "-o", tmp_path / "half.wdb")
    refused(tmp_path / "half.wdb", live, base_version=va)
    # the whole version applies, tensors given in any order
    pack(a, b, "-o", tmp_path / "ab.wdb")
    shuffled = dict(random.Random(1).sample(list(live.items()), len(live)))
    apply_into(tmp_path / "ab.wdb", shuffled, base_version=va)
    assert holds(shuffled, B)


# -- by name, in any order -----------------------------------------------------------------


class Net(torch.nn.Module):
    """Parameters registered in an order that is not sorted."""

    def __init__(self, sd: dict) -> None:
        super().__init__()
        for k in ("z.embed", "b.proj", "m.norm", "a.bias"):
            self.register_parameter(k.replace(".", "_"), torch.nn.Parameter(torch.zeros_like(sd[k]), requires_grad=False))
        self.register_buffer("k_step", torch.zeros_like(sd["k.step"]))


def orders(sd: dict) -> dict[str, dict]:
    """The same tensors (copies) in the orders users hold them in."""
    def items():
        return [(k, v.clone()) for k, v in sd.items()]

    # the order given last: a header rebuilt once is remembered by its digest
    # in this process, and the other orders must not lean on that
    return {
        "reversed": dict(reversed(items())),
        "sorted": dict(sorted(items())),
        "shuffled": dict(random.Random(7).sample(items(), len(sd))),
        "given": dict(items()),
    }


@pytest.mark.parametrize("max_shard", [None, 6000])
def test_publisher_bundles_apply_into_tensors_in_any_order(tmp_path, max_shard):
    sd = model(10)
    remote, mirror = tmp_path / "remote", tmp_path / "mirror"
    pub = Publisher(remote, mirror, **({"max_shard_size": max_shard} if max_shard else {}))
    v0 = pub.publish(sd).version
    anchor = head_bundle(remote, tmp_path)
    sd1 = step(sd, 11)
    v1 = pub.publish(sd1).version
    delta = head_bundle(remote, tmp_path)
    if max_shard:
        assert len([p for p in mirror.iterdir() if p.suffix == ".safetensors"]) > 1
    for name, live in orders(sd).items():
        assert apply_into(delta, live, base_version=v0).version == v1, name
        assert holds(live, sd1), name
    for name, live in orders(zeros_like(sd)).items():
        assert apply_into(anchor, live).version == v0 and holds(live, sd), name
    # a module's state_dict: its names, its order, its memory
    net = Net(sd)
    state = net.state_dict(keep_vars=True)
    mapping = {k.replace(".", "_"): k for k in sd}
    live = {mapping[k]: v.data for k, v in state.items()}
    apply_into(anchor, live)
    apply_into(delta, live, base_version=v0)
    assert holds(live, sd1)
    assert raw(net.z_embed.data) == raw(sd1["z.embed"])
    # iter_patches over tensors in another order yields the same patches
    for name, base in orders(sd).items():
        out = {k: v.clone() for k, v in sd.items()}
        for tname, idx, values, shape in iter_patches(delta, base=base):
            assert tuple(shape) == tuple(sd[tname].shape)
            out[tname].reshape(-1)[torch.from_numpy(idx).long()] = values
        assert holds(out, sd1), name


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}])
def test_cli_bundles_of_safetensors_files_apply_in_any_order(tmp_path, metadata):
    """Checkpoints written by the safetensors library (tensors laid out by
    dtype, then name), packed by the CLI: load_file's dict and any other order."""
    A = model(20)
    B = step(A, 21)
    a = save(tmp_path / "A", A, metadata=metadata)
    b = save(tmp_path / "B", B, metadata=metadata)
    va = pack("--anchor", a, "-o", tmp_path / "anchor.wdb")["target_fingerprint"]
    vb = pack(a, b, "-o", tmp_path / "ab.wdb")["target_fingerprint"]
    for name, live in orders(A).items():
        assert apply_into(tmp_path / "ab.wdb", live, base_version=va).version == vb, name
        assert holds(live, B), name
    for name, live in orders(zeros_like(A)).items():
        assert apply_into(tmp_path / "anchor.wdb", live).version == va and holds(live, A), name
    # and the result is the file B holds, read by the safetensors library
    got = load_file(str(b / "model.safetensors"))
    assert holds(live, A) and holds(got, B)


# -- a failure midway ----------------------------------------------------------------------


@pytest.mark.parametrize("budget", [1 << 28, 0])
def test_a_record_failing_after_others_were_written_puts_every_tensor_back(tmp_path, budget):
    """A hostile delta, every digest valid, whose last chunk record names a
    target digest its words do not give: records that list their changed
    words are scattered first and checked after, so the earlier chunks are
    already written when it fails. Every word goes back (undo in memory, or
    with budget 0 in a temporary file)."""
    sd = model(30)
    big = {f"w.{i}": torch.randn(700, 100, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)
           for i in range(4)}
    sd.update(big)
    remote = tmp_path / "remote"
    pub = Publisher(remote, tmp_path / "mirror")
    v0 = pub.publish(sd).version
    sd1 = step(sd, 31)
    pub.publish(sd1)
    good = Path(head_bundle(remote, tmp_path))
    b = sb.parse(good.read_bytes())
    chunks = [i for i, r in enumerate(b.records) if r.type == 1 and r.codec != 0]
    assert len(chunks) >= 3
    last = b.records[chunks[-1]]
    last.target = bytes([last.target[0] ^ 1]) + last.target[1:]
    bad = tmp_path / "bad.wdb"
    bad.write_bytes(sb.serialize(b, fix_index=False))
    live = {k: v.clone() for k, v in sd.items()}
    before = snap(live)
    with pytest.raises(IntegrityError, match="every tensor was put back"):
        apply_into(bad, live, base_version=v0, undo_budget=budget)
    assert snap(live) == before
    res = apply_into(good, live, base_version=v0, undo_budget=budget)
    assert holds(live, sd1) and res.changed_elements > 0


FOLLOW = """
import sys, torch
from safetensors.torch import load_file, save_file
from wdiff.live import Follower
remote, state, out = sys.argv[1:4]
import os
ck = os.path.join(state, "checkpoint")
sd = {}
for f in sorted(os.listdir(ck)):
    if f.endswith(".safetensors"):
        sd.update(load_file(os.path.join(ck, f)))
sd = {k: torch.zeros_like(v) for k, v in sorted(sd.items(), reverse=True)}
fol = Follower(remote, sd, state)  # loads its checkpoint into them
res = fol.poll()
assert res is not None and not res.anchor, res
save_file(sd, out)
"""


@pytest.mark.slow
def test_a_follower_restarted_with_tensors_in_another_order_follows(tmp_path):
    """A Follower restarted in a new process with its tensors in another
    order applies the next delta of a multi-file version."""
    from wdiff.live import Follower

    sd = model(40)
    remote = tmp_path / "remote"
    pub = Publisher(remote, tmp_path / "mirror", max_shard_size=6000)
    pub.publish(sd)
    fol = Follower(remote, zeros_like(sd), tmp_path / "state")
    assert fol.poll().anchor
    sd1 = step(sd, 41)
    pub.publish(sd1)
    r = subprocess.run([sys.executable, "-c", FOLLOW, str(remote), str(tmp_path / "state"), str(tmp_path / "out")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert holds(load_file(str(tmp_path / "out")), sd1)


# -- the base, when the caller does not say which version it is -----------------------------


def test_without_base_version_a_delta_applies_only_onto_its_base_every_byte(tmp_path):
    """Tensors that differ from the base only where the delta does not patch
    pass every chunk check; without base_version the library hashes every
    tensor and refuses them. With it, the caller's word is taken (documented)."""
    A = model(50)
    B = dict(A, **{"z.embed": A["z.embed"].clone()})
    B["z.embed"][0, 0] += 1  # the delta patches one chunk of one tensor
    a, b = save(tmp_path / "A", A, metadata={"format": "pt"}), save(tmp_path / "B", B, metadata={"format": "pt"})
    ab = pack(a, b, "-o", tmp_path / "ab.wdb")
    not_a = load_file(str(a / "model.safetensors"))  # the file's own order
    not_a["b.proj"][3, 3] += 1  # another version: a tensor the delta does not touch
    e = refused(tmp_path / "ab.wdb", not_a)
    assert "do not hold its base version" in e.message
    # tensors at A, in any order, on no one's word: applied and verified
    live = dict(reversed([(k, v.clone()) for k, v in A.items()]))
    assert apply_into(tmp_path / "ab.wdb", live).version == ab["target_fingerprint"]
    assert holds(live, B)


@pytest.mark.parametrize("receiver_first", ["embed", "lm_head"])
def test_tied_weights_in_either_order(tmp_path, receiver_first):
    """A tied pair: the publisher keeps the name its dict gives first; a
    receiver whose dict gives the other first applies all the same."""
    sd = model(60)
    sd["embed"] = torch.randn(20, 8).to(torch.bfloat16)
    sd["lm_head"] = sd["embed"]
    remote = tmp_path / "remote"
    pub = Publisher(remote, tmp_path / "mirror")
    v0 = pub.publish(sd).version
    anchor = head_bundle(remote, tmp_path)
    sd1 = step({k: v for k, v in sd.items() if k != "lm_head"}, 61)
    sd1["lm_head"] = sd1["embed"]
    pub.publish(sd1)
    delta = head_bundle(remote, tmp_path)
    other = "lm_head" if receiver_first == "embed" else "embed"
    names = [receiver_first, other] + [k for k in sd if k not in ("embed", "lm_head")]
    tied = torch.zeros(20, 8, dtype=torch.bfloat16)
    live = {k: (tied if k in ("embed", "lm_head") else torch.zeros_like(sd[k])) for k in names}
    assert apply_into(anchor, live).version == v0 and holds(live, sd)
    apply_into(delta, live, base_version=v0)
    assert holds(live, sd1)
    untied = {k: v.clone() for k, v in live.items()}  # two tensors where the target holds one
    refused(delta, untied)


def test_prepared_tensors_that_changed_memory_are_refused(tmp_path):
    """prepare() wraps the tensors once: a tensor given new storage since
    (``t.data = ...``) or a dict entry replaced is refused, not patched in
    memory the model no longer uses while the result claims the version."""
    from wdiff.live import prepare

    sd = model(70)
    remote = tmp_path / "remote"
    pub = Publisher(remote, tmp_path / "mirror")
    pub.publish(sd)
    anchor = head_bundle(remote, tmp_path)
    live = zeros_like(sd)
    prep = prepare(live)
    apply_into(anchor, prep)
    assert holds(live, sd)
    live["b.proj"].data = torch.zeros(50, 30)  # the model now reads other memory
    with pytest.raises(WdiffError, match="prepare"):
        apply_into(anchor, prep)
    assert not live["b.proj"].any()
    live2 = zeros_like(sd)
    prep2 = prepare(live2)
    live2["m.norm"] = torch.zeros_like(sd["m.norm"])  # the dict holds another tensor
    with pytest.raises(WdiffError, match="prepare"):
        apply_into(anchor, prep2)
    assert apply_into(anchor, prepare(live2)) and holds(live2, sd)
