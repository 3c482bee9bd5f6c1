"""Calibration passes for `guild optimize` (issue 7)."""
