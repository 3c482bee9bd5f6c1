"""The options every command's flags become: one frozen dataclass per concern, each flag validated here, once,
with the flag's name in the message. Light on purpose (no numba): `guild --help` imports it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..engine.sampling import GREEDY, SamplingParams
from ..errors import BadFlagError
from ..speculative.options import DraftOptions

DEVICES = ("auto", "cpu", "cuda")  # --device

EXPERT_CACHE_HELP = ("Memory for a MoE's routed experts, read from disk as the router asks for them (for models "
                     "larger than memory): a size (3G, 512MiB), off, or auto (on only when the model does not fit "
                     "in the available memory with a quarter to spare).")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?", re.IGNORECASE)


def expert_cache_mem(text: str) -> str | int:
    """--expert-cache-mem: "auto", "off" or bytes (binary suffixes: 3G = 3 GiB)."""
    t = str(text).strip().lower()
    if t in ("auto", "off"):
        return t
    m = _SIZE.fullmatch(t)
    if m is None or (m.group(3) == "ib" and not m.group(2)):
        raise BadFlagError(f"--expert-cache-mem must be auto, off or a size such as 3G or 512MiB, got {text!r}")
    n = int(float(m.group(1)) * (1 << (10 * " kmgt".index(m.group(2) or " "))))
    if n < 1:
        raise BadFlagError(f"--expert-cache-mem must be a positive size, got {text!r}")
    return n


MAX_SESSIONS = 8  # concurrent sessions whose windows share one forward (kernels' row-invariant batch)


@dataclass(frozen=True)
class DecodeOptions(DraftOptions):
    """How `guild run` decodes: the strategy and its knobs (DraftOptions), sampling, limits. Every flag is
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


