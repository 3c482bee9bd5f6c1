"""guild/engine/backends/host.py: the host backend's own choices around the CPU kernels."""

import numpy as np
import pytest

from guild.engine.backends import host
from guild.engine.backends.host import PARALLEL_ROWS, HostBackend


@pytest.mark.parametrize("rows", [1, 3, PARALLEL_ROWS])
def test_rmsnorm_into_columns_of_a_wider_array_gives_the_same_bits_through_one_layout(rows, monkeypatch):
    """Norms written into column slices (the MTP head's concatenation) equal the norm into a contiguous array,
    and the kernels only ever see C-contiguous outputs (one compiled layout: each other one is a cold compile)."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    w.flags.writeable = False
    seen = []
    for name in ("rmsnorm", "rmsnorm_parallel"):
        real = getattr(host.cpu_ops, name)
        monkeypatch.setattr(host.cpu_ops, name, lambda x, w, eps, out, real=real: seen.append(
            out.flags.c_contiguous) or real(x, w, eps, out))
    be = HostBackend()
    want = np.empty((rows, 64), np.float32)
    be.rmsnorm(x, w, 1e-6, want)
    cat = np.full((rows, 192), np.nan, np.float32)
    be.rmsnorm(x, w, 1e-6, cat[:, 64:128])
    assert np.array_equal(cat[:, 64:128], want)
    assert np.isnan(cat[:, :64]).all() and np.isnan(cat[:, 128:]).all()
    assert seen == [True, True]
