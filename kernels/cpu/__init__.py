"""Numba CPU kernels. Each has a plain-NumPy twin in guild.kernels.ref."""
