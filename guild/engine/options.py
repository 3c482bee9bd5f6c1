"""How a model decodes (DecodeOptions: the strategy and its knobs, sampling, limits, plan, device, sessions), each
setting validated once with the flag's name in the message; the command line builds its flags from these. Light on
purpose (no numba): `guild --help` imports it."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BadFlagError
from ..speculative.options import DraftOptions
from .sampling import GREEDY, SamplingParams

DEVICES = ("auto", "cpu", "cuda")  # --device


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
