"""Numba CPU kernels. Each has a plain-NumPy twin in guild.kernels.ref."""

from . import cache_lock  # noqa: F401 - before any kernel compiles: Numba's cache saved under a lock
