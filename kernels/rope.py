"""Rope tables: the cos/sin of every position and rotary pair that every architecture and backend rotates
queries and keys with (the GPU uploads these same tables), with llama.cpp's scalings past the trained context."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import GuildError

ROPE_SCALING_TYPES = ("none", "linear", "yarn")  # {arch}.rope.scaling.type values guild runs (llama.cpp's names)


@dataclass(frozen=True)
class RopeScaling:
    """How rope angles stretch past the trained context, as llama.cpp applies them: `linear` divides every angle
    by `factor` (Chen et al. 2023, position interpolation); `yarn` interpolates only the low frequencies, between
    the correction dimensions set by beta_fast/beta_slow over `orig_ctx`, and scales cos/sin by 0.1 ln(factor) + 1
    (Peng et al. 2023). `attn_factor` multiplies cos/sin under every type."""

    type: str = "none"
    factor: float = 1.0
    orig_ctx: int = 0  # the context the correction dimensions are computed for (0: the model's context_length)
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    ext_factor: float | None = None  # extrapolation mix of yarn's ramp; None: 1 for yarn, 0 otherwise

    def __post_init__(self):
        if self.type not in ROPE_SCALING_TYPES:
            raise GuildError(f"rope.scaling.type '{self.type}' is not one of {', '.join(ROPE_SCALING_TYPES)}")
        for key, v in (("factor", self.factor), ("attn_factor", self.attn_factor),
                       ("yarn_beta_fast", self.beta_fast), ("yarn_beta_slow", self.beta_slow)):
            if not (math.isfinite(v) and v > 0):
                raise GuildError(f"rope.scaling.{key} must be finite and > 0, got {v}")
        if self.ext_factor is not None and not (math.isfinite(self.ext_factor) and 0 <= self.ext_factor <= 1):
            raise GuildError(f"rope.scaling.yarn_ext_factor must be in [0, 1], got {self.ext_factor}")
        if self.orig_ctx < 0:
            raise GuildError(f"rope.scaling.original_context_length must be > 0, got {self.orig_ctx}")

    def describe(self) -> str:
        if self.type == "none":
            return "none"
        s = f"{self.type} x{self.factor:g}"
        return s + (f" from {self.orig_ctx}" if self.type == "yarn" else "")


NO_SCALING = RopeScaling()


def rope_tables(n_ctx, n_rot, base, scaling: RopeScaling = NO_SCALING):
    """cos/sin [n_ctx, n_rot/2] with theta_i = base^(-2i/n_rot) (RoFormer, Su et al. 2021), stretched by `scaling`
    as ggml's rope_yarn does (float64 here, float32 there; the same formulas)."""
    inv = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    ang = np.arange(n_ctx, dtype=np.float64)[:, None] * inv[None, :]
    mscale = scaling.attn_factor
    if scaling.type != "none":
        interp = ang / scaling.factor
        ext = (1.0 if scaling.type == "yarn" else 0.0) if scaling.ext_factor is None else scaling.ext_factor
        if ext:
            low, high = yarn_corr_dims(n_rot, scaling.orig_ctx, base, scaling.beta_fast, scaling.beta_slow)
            y = (np.arange(n_rot // 2, dtype=np.float64) - low) / max(0.001, high - low)
            mix = (1.0 - np.clip(y, 0.0, 1.0)) * ext  # 1: the dimension keeps its trained angle, 0: interpolated
            ang = interp * (1.0 - mix) + ang * mix
            if scaling.factor > 1:  # llama.cpp cancels its context-level factor: only the ramp's scale remains
                mscale *= 1.0 + 0.1 * math.log(scaling.factor)
        else:
            ang = interp
    cos, sin = np.cos(ang), np.sin(ang)
    if mscale != 1.0:
        cos, sin = cos * mscale, sin * mscale
    return cos.astype(np.float32), sin.astype(np.float32)


def yarn_corr_dims(n_rot, orig_ctx, base, beta_fast, beta_slow):
    """The first and last rotary pair YaRN's ramp blends over: where a pair turns beta_fast (beta_slow) times
    over orig_ctx positions (ggml_rope_yarn_corr_dims)."""
    def dim(beta):
        return n_rot * math.log(orig_ctx / (beta * 2 * math.pi)) / (2 * math.log(base))

    return max(0.0, math.floor(dim(beta_fast))), min(n_rot - 1.0, math.ceil(dim(beta_slow)))
