"""Kernels: plain-NumPy twins in ref.py, Numba CPU kernels in cpu/, CUDA sources in cuda/."""
