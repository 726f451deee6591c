"""apply_into and iter_patches on bundles of every codec (format version 3):
records that list their changed words (SPARSE, BITMAP, and codec v2's
MSPARSE, MBITMAP, CSPARSE) are patched with one scatter per tensor per chunk
and never decoded whole; the others are decoded whole. Each case packs two
real checkpoints with `wdiff.pack` and checks, with `wdiff.inspect`, that
the bundle holds the codec the case is for."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import wdiff
import wdiff.live.apply as live_apply
import wdiff.live.changes as live_changes
from wdiff.codec.chunk import CODEC_NAMES
from wdiff.errors import BaseMismatchError, IntegrityError
from wdiff.live import apply_into, iter_patches
from wdiff.live.layout import METADATA

sys.path.insert(0, os.path.dirname(__file__))
import specbundle as sb  # noqa: E402

N = 1 << 16
LISTED = {"sparse", "bitmap", "msparse", "mbitmap", "csparse", "rsparse"}
#: rows of the one 2-D tensor of the rsparse case
ROW = 256


def _bf16(seed: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _case(name: str):
    """(base tensor, new tensor) on which pack picks codec ``name``."""
    rng = np.random.default_rng(1)
    a = _bf16(0)
    u = a.view(torch.int16)
    new = u.clone()
    blocks = torch.from_numpy(np.repeat(rng.random(N // 256) < 0.2, 256))
    exp = (u >> 7) & 0xFF
    if name == "msparse":  # a few words move by one ULP
        new[torch.from_numpy(rng.random(N) < 0.01)] += 1
    elif name == "mbitmap":  # runs of words move by one ULP
        new[blocks] += 1
    elif name == "csparse":  # only the large words move: their buckets give the positions
        new[torch.from_numpy(rng.random(N) < 0.5) & (exp >= 127)] += 1
    elif name == "rsparse":  # as csparse, in a few rows only (an embedding's seen tokens)
        rows = torch.from_numpy(np.repeat(rng.random(N // ROW) < 0.05, ROW))
        new[torch.from_numpy(rng.random(N) < 0.5) & (exp >= 127) & rows] += 1
    elif name == "cdense":
        sel = exp >= 126
        new[sel] += torch.from_numpy(rng.integers(1, 3, N).astype(np.int16))[sel]
    elif name == "mdense":  # every word moves
        new += 1
    elif name in ("sparse", "bitmap"):  # new random words: XOR beats differences
        rand = torch.from_numpy(rng.integers(-(1 << 15), 1 << 15, N).astype(np.int16))
        where = torch.from_numpy(rng.random(N) < 0.002) if name == "sparse" else blocks
        new = torch.where(where, rand, u)
    return a, new.view(torch.bfloat16)


def _split(t: torch.Tensor, small: bool, rows: bool = False) -> dict[str, torch.Tensor]:
    """One big tensor (``rows``: a 2-D one), or 64 small ones (one chunk of many spans)."""
    if not small:
        return {"w": t.clone().reshape(-1, ROW) if rows else t.clone()}
    return {f"s.{i:02d}": p.clone() for i, p in enumerate(t.chunk(64))}


def _bundle(tmp_path, name: str, small: bool):
    a, b = _case(name)
    A, B = _split(a, small, name == "rsparse"), _split(b, small, name == "rsparse")
    for d, sd in (("A", A), ("B", B)):
        os.makedirs(tmp_path / d, exist_ok=True)
        save_file(sd, str(tmp_path / d / "model.safetensors"), metadata=METADATA)
    out = tmp_path / "x.wdb"
    wdiff.pack(tmp_path / "A", tmp_path / "B", out, format_version=3)
    kinds = wdiff.inspect(out).records
    assert set(kinds) - {"header"} == {name}, kinds  # the case is the codec it is named for
    return str(out), A, B, kinds[name]["changed"]


def _raw(sd):
    return {k: v.view(torch.int16).numpy().tobytes() for k, v in sd.items()}


class _Spy:
    """Counts what the receiver does: codecs decoded whole, words scattered."""

    def __init__(self, monkeypatch) -> None:
        self.whole: list[str] = []
        self.written = 0
        decode, scatter = live_changes.decode_into, live_apply._scatter

        def spy_decode(codec, *a, **k):
            self.whole.append(CODEC_NAMES[codec])
            return decode(codec, *a, **k)

        def spy_scatter(unit, pos, vals):
            self.written += int(pos.size)
            return scatter(unit, pos, vals)

        monkeypatch.setattr(live_changes, "decode_into", spy_decode)
        monkeypatch.setattr(live_apply, "_scatter", spy_scatter)


CODECS = ["msparse", "mbitmap", "csparse", "mdense", "cdense", "sparse", "bitmap"]
#: (codec, small): every codec in one tensor and in 64; RSPARSE's rows are a
#: single tensor's (a chunk of many tensors has none)
CASES = [(c, s) for c in CODECS for s in (False, True)] + [("rsparse", False)]


@pytest.mark.parametrize("name,small", CASES, ids=[f"{c}-{'64-tensors' if s else 'one-tensor'}" for c, s in CASES])
def test_apply_into_and_iter_patches_for_every_codec(tmp_path, monkeypatch, name, small):
    bundle, A, B, changed = _bundle(tmp_path, name, small)
    spy = _Spy(monkeypatch)
    live = {k: v.clone() for k, v in A.items()}
    res = apply_into(bundle, live)
    assert _raw(live) == _raw(B)
    assert res.changed_elements == changed
    assert spy.written == changed  # only the changed words are written, whatever the codec
    if name in LISTED:
        assert spy.whole == []  # a listed record is never decoded whole
    else:
        assert spy.whole and set(spy.whole) == {name}
    # iter_patches, from the tensors and from a checkpoint on disk: the same patches
    for src in (A, str(tmp_path / "A")):
        spy.whole.clear()
        out = {k: v.clone() for k, v in A.items()}
        n = 0
        for tname, idx, values, shape in iter_patches(bundle, base=src):
            assert tuple(shape) == tuple(A[tname].shape) and idx.dtype == np.int32
            assert (np.diff(idx) > 0).all()  # sorted, each once (CSPARSE lists them by bucket)
            flat = out[tname].view(torch.int16).reshape(-1)
            if isinstance(values, torch.Tensor):
                flat[torch.from_numpy(idx).long()] = values.view(torch.int16)
            else:
                flat[torch.from_numpy(idx).long()] = torch.from_numpy(values.view(np.int16).copy())
            n += idx.size
        assert n == changed and _raw(out) == _raw(B)
        assert spy.whole == [] if name in LISTED else spy.whole


@pytest.mark.parametrize("budget", [1 << 28, 0])
@pytest.mark.parametrize("name", ["msparse", "mbitmap", "csparse", "mdense"])
def test_failed_v2_apply_restores_the_old_words_exactly(tmp_path, name, budget):
    """Two live tensors sharing memory: the first's patch changes the
    second's bytes, the read-back check fails, and every word written goes
    back (modular differences are undone from the saved old words)."""
    a, b = _case(name)
    A = {"x": a[: N // 2].clone(), "y": a[N // 4 :].clone()}
    B = {"x": b[: N // 2].clone(), "y": torch.cat([a[N // 4 : N // 2], b[N // 2 :]])}  # y keeps the overlap
    for d, sd in (("A", A), ("B", B)):
        os.makedirs(tmp_path / d)
        save_file(sd, str(tmp_path / d / "model.safetensors"), metadata=METADATA)
    bundle = str(tmp_path / "x.wdb")
    wdiff.pack(tmp_path / "A", tmp_path / "B", bundle, format_version=3)
    assert name in wdiff.inspect(bundle).records
    # two names over one buffer are refused up front; a record whose target
    # digest its words do not give fails after the first was written
    b_ = sb.parse(open(bundle, "rb").read())
    last = b_.records[[i for i, r in enumerate(b_.records) if r.type == 1][-1]]
    last.target = bytes([last.target[0] ^ 1]) + last.target[1:]
    bad = tmp_path / "bad.wdb"
    bad.write_bytes(sb.serialize(b_, fix_index=False))
    live = {"x": A["x"].clone(), "y": A["y"].clone()}
    before = {k: v.clone() for k, v in live.items()}
    # (an mdense pack here is one record over x and y, refused before it writes)
    with pytest.raises(IntegrityError, match="put back" if name != "mdense" else "do not match the target"):
        apply_into(bad, live, undo_budget=budget)
    assert all(torch.equal(live[k].view(torch.int16), before[k].view(torch.int16)) for k in live)


def test_v2_record_against_the_wrong_base_writes_nothing(tmp_path):
    bundle, A, _b, _ = _bundle(tmp_path, "csparse", small=True)
    live = {k: v.clone() for k, v in A.items()}
    live["s.63"].view(torch.int16)[-1] ^= 1
    before = _raw(live)
    with pytest.raises(BaseMismatchError):
        apply_into(bundle, live)
    assert _raw(live) == before
    with pytest.raises(BaseMismatchError):
        list(iter_patches(bundle, base=live))
