"""diff's relative L2 norm is ||B - A|| / ||A|| over the whole tensor, also
for a tensor cut in several units of which only some changed (the pieces
whose digests match are not compared, but they count in ||A||)."""

import numpy as np
import pytest
from factory import T, write_ckpt

import wdiff


@pytest.mark.parametrize("threads", [1, 2])
def test_rel_l2_of_a_tensor_changed_in_one_of_its_units(tmp_path, threads):
    rng = np.random.default_rng(5)
    a = rng.standard_normal(3 * (1 << 20) + 777).astype(np.float32)  # 12 MiB: four units, the last short
    b = a.copy()
    b[(1 << 20) + 5 : (1 << 20) + 50] += 0.5  # inside the second unit only
    mk = lambda x: T("F32", (x.size,), x.tobytes())  # noqa: E731
    A = write_ckpt(tmp_path / "A", {"w": mk(a), "small": mk(a[:64])})
    B = write_ckpt(tmp_path / "B", {"w": mk(b), "small": mk(a[:64])})
    row = next(t for t in wdiff.diff(A, B, threads=threads).tensors if t.name == "w")
    want = np.linalg.norm((b - a).astype(np.float64)) / np.linalg.norm(a.astype(np.float64))
    assert row.status == "modified" and row.changed == 45 and row.blocks_changed == 1
    assert row.rel_l2 == pytest.approx(want, rel=1e-6)
