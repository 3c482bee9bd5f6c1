"""How a model decodes (DecodeOptions: the strategy and its knobs, sampling, limits, plan, device, sessions), each
setting validated once with the flag's name in the message; the command line builds its flags from these. Light on
purpose (no numba): `guild --help` imports it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..errors import BadFlagError
from ..kernels.rope import ROPE_SCALING_TYPES, RopeScaling
from ..kvtypes import F32_KV, KVTypes
from ..speculative.options import DraftOptions
from .sampling import GREEDY, SamplingParams

DEVICES = ("auto", "cpu", "cuda")  # --device


@dataclass(frozen=True)
class RopeOptions:
    """llama.cpp's rope flags; None keeps what the model's GGUF metadata says."""

    scaling: str | None = None  # --rope-scaling
    scale: float | None = None  # --rope-scale: the context factor
    freq_base: float | None = None  # --rope-freq-base
    freq_scale: float | None = None  # --rope-freq-scale: 1 / the context factor
    yarn_orig_ctx: int | None = None  # --yarn-orig-ctx

    def __post_init__(self):
        if self.scaling is not None and self.scaling not in ROPE_SCALING_TYPES:
            raise BadFlagError(f"--rope-scaling must be one of {', '.join(ROPE_SCALING_TYPES)}, got '{self.scaling}'")
        for flag, v in (("--rope-scale", self.scale), ("--rope-freq-base", self.freq_base),
                        ("--rope-freq-scale", self.freq_scale)):
            if v is not None and not (math.isfinite(v) and v > 0):
                raise BadFlagError(f"{flag} must be finite and > 0, got {v}")
        if self.scale is not None and self.freq_scale is not None:
            raise BadFlagError("--rope-scale and --rope-freq-scale both set the scaling factor; give one")
        if self.yarn_orig_ctx is not None and self.yarn_orig_ctx < 1:
            raise BadFlagError(f"--yarn-orig-ctx must be >= 1, got {self.yarn_orig_ctx}")

    def resolve(self, base: float, scaling: RopeScaling) -> tuple[float, RopeScaling]:
        """(rope base, scaling) for a model whose metadata says (base, scaling), as llama.cpp's context
        parameters override the model's: a factor without a type scales linearly (llama.cpp's default type),
        and type none never scales."""
        kw = {}
        if self.scale is not None or self.freq_scale is not None:
            kw["factor"] = self.scale if self.scale is not None else 1.0 / self.freq_scale
            if self.scaling is None and scaling.type == "none":
                kw["type"] = "linear"
        if self.scaling is not None:
            kw["type"] = self.scaling
        if self.yarn_orig_ctx is not None:
            kw["orig_ctx"] = self.yarn_orig_ctx
        scaling = replace(scaling, **kw)
        if scaling.type == "none":
            scaling = replace(scaling, factor=1.0)
        return (base if self.freq_base is None else self.freq_base), scaling


MAX_SESSIONS = 8  # concurrent sessions whose windows share one forward (kernels' row-invariant batch)


@dataclass(frozen=True)
class DecodeOptions(DraftOptions):
    """How a model decodes: the strategy and its knobs (DraftOptions), sampling, limits. Every setting is
    validated here, once."""

    sampling: SamplingParams = GREEDY
    max_tokens: int = 128
    context: int = 4096
    prefill_batch: int = 512
    gexec: str | None = None  # a `guild optimize` plan: its draft costs seed the scheduler, its threads apply
    strict_plan: bool = False  # fail on a plan for another machine/model instead of regenerating one
    device: str = "cpu"  # auto | cpu | cuda (the CLI's default is auto)
    sessions: int = 1  # concurrent copies (seeds seed + i), batched into one forward per round
    rope: RopeOptions = field(default_factory=RopeOptions)
    kv: KVTypes = F32_KV  # the KV cache's stored types (--cache-type-k, --cache-type-v)

    def __post_init__(self):
        super().__post_init__()
        if self.context < 16:
            raise BadFlagError(f"--context must be >= 16, got {self.context}")
        if self.max_tokens < 1:
            raise BadFlagError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.prefill_batch < 1:
            raise BadFlagError(f"--prefill-batch must be >= 1, got {self.prefill_batch}")
        if self.strict_plan and self.gexec is None:
            raise BadFlagError("--strict-plan needs --gexec PLAN")
        if self.device not in DEVICES:
            raise BadFlagError(f"--device must be one of {', '.join(DEVICES)}, got '{self.device}'")
        if not 1 <= self.sessions <= MAX_SESSIONS:
            raise BadFlagError(f"--sessions must be in 1..{MAX_SESSIONS}, got {self.sessions}")
