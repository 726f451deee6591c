"""``python -m wdiff.bench.sections``: its parts add up to the CSPARSE
records, and its movers are the changed words whose exponent moved."""

from __future__ import annotations

import numpy as np
from factory import T, write_ckpt

from wdiff.bench import sections
from wdiff.codec.chunk import CSPARSE, encode_as


def test_sections_account_for_every_bit_and_every_mover(tmp_path, capsys):
    rng = np.random.default_rng(3)
    w = (rng.standard_normal(3 << 20) * 0.02).astype(np.float32)
    a = (w.view(np.uint32) >> 16).astype(np.uint16)  # bf16 words
    b = a.copy()
    pos = rng.choice(a.size, 30_000, replace=False)
    b[pos] += rng.choice(np.array([1, 0xFFFF, 2], dtype=np.uint16), pos.size)  # +-1, +2 ULP
    A = write_ckpt(tmp_path / "A", {"w": T("BF16", (3 << 20,), a.tobytes())})
    B = write_ckpt(tmp_path / "B", {"w": T("BF16", (3 << 20,), b.tobytes())})
    t = sections.sections(str(A), str(B))
    assert t["changed"] == int(np.count_nonzero(a != b))
    assert t["movers"] == int(np.count_nonzero((a >> 7 & 0xFF) != (b >> 7 & 0xFF))) > 0
    step = sections.CHUNK // 2
    want = sum(encode_as(CSPARSE, a[i:i + step], b[i:i + step], 1, bucket=1).size for i in range(0, a.size, step))
    assert t["table"] + t["mover_bits"] + t["positions"] + t["values"] == 8 * want
    assert t["records"] == 2
    assert sections.main([str(A), str(B)]) == 0
    assert f"| {B} | {t['changed']:,} |" in capsys.readouterr().out
