"""Calibration passes for `guild optimize`: probe, placement, CPU kernels, speculative costs."""
