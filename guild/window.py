"""The verification window: T = 1 + k input rows [root, d1..dk], k <= MAX_DRAFT (docs/contracts.md "Window"). Every
component that sizes a window (drafters, scheduler, session, calibration) reads these two numbers."""

# rows T of one verification window; the kernels keep rows invariant up to ROW_INVARIANT_ROWS (kernels/cpu/quant.py)
# per call, which holds several sessions' windows (docs/contracts.md "Row invariance")
MAX_WINDOW = 8
MAX_DRAFT = MAX_WINDOW - 1  # draft tokens k per window
