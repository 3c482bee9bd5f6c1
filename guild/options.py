"""The options every command's flags become: one frozen dataclass per concern, each flag validated here, once,
with the flag's name in the message. Light on purpose (no numba): `guild --help` imports it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .engine.sampling import GREEDY, SamplingParams
from .errors import BadFlagError
from .window import MAX_DRAFT

DEVICES = ("auto", "cpu", "cuda")  # --device


@dataclass(frozen=True)
class StrategyNeeds:
    uses_head: bool = False  # drafts with the model's MTP head when it has one
    needs_head: bool = False  # cannot run without one
    uses_corpus: bool = False  # ingests --retrieval-corpus


# --decode-strategy: the strategies and what each needs (guild.speculative.BUILDERS builds their drafters)
STRATEGIES = {
    "normal": StrategyNeeds(),
    "lookup": StrategyNeeds(),
    "retrieval": StrategyNeeds(uses_corpus=True),
    "mtp": StrategyNeeds(uses_head=True, needs_head=True),
    "adaptive": StrategyNeeds(uses_head=True, uses_corpus=True),
}
HEAD_STRATEGIES = tuple(k for k, v in STRATEGIES.items() if v.uses_head)
CORPUS_STRATEGIES = tuple(k for k, v in STRATEGIES.items() if v.uses_corpus)

MTP_K = 1  # default MTP draft depth: the head is trained for one step; chaining it is seldom right past draft 1
MTP_VOCAB = 8192  # draft LM head rows by default (0 = the whole vocabulary); see README "MTP heads"


@dataclass(frozen=True)
class MtpOptions:
    """How the MTP head drafts (`--mtp-head`, `--spec-mtp-k`, `--spec-min-p`, `--spec-mtp-vocab`)."""

    head: str | None = None  # a head GGUF (default: the model's nextn block, a sidecar beside it, a shipped one)
    k: int = MTP_K  # drafts per window at most
    min_p: float = 0.0  # fixed mtp: a plain step when the head's top-1 probability is below this
    vocab: int = MTP_VOCAB  # score only the head's most frequent `vocab` tokens (0 = all)

    def __post_init__(self):
        if not 1 <= self.k <= MAX_DRAFT:
            raise BadFlagError(f"--spec-mtp-k must be in 1..{MAX_DRAFT}, got {self.k}")
        if not 0.0 <= self.min_p < 1.0:
            raise BadFlagError(f"--spec-min-p must be in [0, 1), got {self.min_p}")
        if self.vocab < 0:
            raise BadFlagError(f"--spec-mtp-vocab must be >= 0, got {self.vocab}")


@dataclass(frozen=True)
class SpecOptions:
    """Which strategy drafts and its knobs (`--decode-strategy`, `--spec-*`, `--retrieval-corpus`)."""

    strategy: str = "adaptive"
    max_draft: int = 4
    min_match: int = 3
    lookup_window: int = 65536
    corpus: tuple[str, ...] = ()  # documents the retrieval drafter ingests
    mtp: MtpOptions = field(default_factory=MtpOptions)

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise BadFlagError(f"--decode-strategy must be one of {', '.join(STRATEGIES)}, got '{self.strategy}'")
        if not 0 <= self.max_draft <= MAX_DRAFT:
            raise BadFlagError(f"--spec-max-draft must be in 0..{MAX_DRAFT}, got {self.max_draft}")
        if self.min_match not in (2, 3):
            raise BadFlagError(f"--spec-min-match must be 2 or 3, got {self.min_match}")
        if self.lookup_window < 64:
            raise BadFlagError(f"--spec-lookup-window must be >= 64, got {self.lookup_window}")
        s = STRATEGIES[self.strategy]
        if self.mtp.head is not None and not s.uses_head:
            raise BadFlagError(f"--mtp-head needs --decode-strategy {' or '.join(HEAD_STRATEGIES)}")
        if self.corpus and not s.uses_corpus:
            raise BadFlagError(f"--retrieval-corpus needs --decode-strategy {' or '.join(CORPUS_STRATEGIES)}")
        for f in self.corpus:
            if not Path(f).is_file():
                raise BadFlagError(f"--retrieval-corpus: no such file: {f}")


MAX_SESSIONS = 8  # concurrent sessions whose windows share one forward (kernels' row-invariant batch)


@dataclass(frozen=True)
class DecodeOptions(SpecOptions):
    """How `guild run` decodes: the strategy and its knobs (SpecOptions), sampling, limits. Every flag is
    validated here, once."""

    sampling: SamplingParams = GREEDY
    max_tokens: int = 128
    context: int = 4096
    prefill_batch: int = 512
    gexec: str | None = None  # a `guild optimize` plan: its spec costs seed the scheduler, its threads apply
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


