"""The options every command's flags become: one frozen dataclass per concern, each flag validated here, once,
with the flag's name in the message. Light on purpose (no numba): `guild --help` imports it."""

from __future__ import annotations

from dataclasses import dataclass

import typer

from ..engine.kvtypes import F32_KV, KV_TYPES, KVTypes
from ..engine.sampling import GREEDY, SamplingParams
from ..errors import BadFlagError
from ..speculative.options import DraftOptions

DEVICES = ("auto", "cpu", "cuda")  # --device


MAX_SESSIONS = 8  # concurrent sessions whose windows share one forward (kernels' row-invariant batch)

_KV_HELP = (f"{', '.join(KV_TYPES)} (llama.cpp's names and bytes per value; q8_0: 32 int8 and an f16 scale per 34 "
            "bytes). f32 keeps today's numbers; the GPU path takes f32 only.")
# the KV cache flags of run, chat, serve, bench and optimize (KVTypes checks their values)
CACHE_TYPE_K = typer.Option("f32", "-ctk", "--cache-type-k", help="Stored type of the KV cache's keys: " + _KV_HELP)
CACHE_TYPE_V = typer.Option("f32", "-ctv", "--cache-type-v", help="Stored type of the KV cache's values: " + _KV_HELP)


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


