"""What one window's forward returns: the engine's contract with every architecture (guild/models/), read by
the session's verifier and the forward's consumers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ForwardResult:
    """One window's output: what the session verifies and what its consumers read (MTP head, calibration)."""

    logits: np.ndarray  # [T, vocab] ([1, vocab] with last_only)
    # [T, dim] final residual rows before the output norm: an array, or a guild.engine.backends.DeviceRows when
    # they end on a device (moved to the host only when a consumer reads them: np.asarray, slicing stays put)
    hidden: object
    distinct_experts: np.ndarray  # [n_layers] union of routed experts over the forward's rows (zeros: dense)
    # the residual rows [T, dim] after each layer the MTP head fuses (model.mtp_features), in that order: arrays
    # or DeviceRows as `hidden`; empty unless a head with fused features is loaded
    features: tuple = ()
