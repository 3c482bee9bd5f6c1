"""kernels/cpu/intrinsics.py: the atomic counter the launchers hand work out with."""

import numba
import numpy as np
from numba import njit, prange

from guild.kernels.cpu.intrinsics import fetch_add


@njit(parallel=True, cache=True)
def _take_all(n, nth, got):
    """Every thread takes tickets from one counter until n are gone, marking each it took."""
    ctr = np.zeros(1, np.int64)
    for _ in prange(nth):
        i = fetch_add(ctr.ctypes.data, 1)
        while i < n:
            got[i] += 1
            i = fetch_add(ctr.ctypes.data, 1)
    return ctr[0]


def test_fetch_add_hands_each_ticket_out_once():
    """Two threads racing for 200,000 tickets: each taken exactly once (a plain load-add-store loses and repeats
    some), and the counter ends one past n per thread (each thread's last, refused take)."""
    nth = min(2, numba.config.NUMBA_NUM_THREADS)
    before = numba.get_num_threads()
    numba.set_num_threads(nth)
    n = 200_000
    got = np.zeros(n, np.int64)
    try:
        end = _take_all(n, nth, got)
    finally:
        numba.set_num_threads(before)
    assert (got == 1).all()
    assert end == n + nth
