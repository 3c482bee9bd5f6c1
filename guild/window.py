"""The verification window: T = 1 + k input rows [root, d1..dk], k <= MAX_DRAFT (docs/contracts.md "Window"). Every
component that sizes a window (drafters, scheduler, session, calibration) reads these two numbers."""

MAX_WINDOW = 8  # rows T of one verification window (the kernels promise row invariance up to this)
MAX_DRAFT = MAX_WINDOW - 1  # draft tokens k per window
