"""train-mtp's configuration: the defaults, the data sources' exclusions, the run's key (TrainConfig), its error."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ...errors import BadFlagError
from ...models import REGISTRY

FORMAT_VERSION = 2  # bump when the data, the head or the checkpoint layout changes
SOURCES = ("Python standard library sources (*.py, PSF License) and pydoc_data.topics (Python documentation, "
           "PSF License); the base model's own greedy generations on guild's training prompts (Apache-2.0)")
SUPPORTED_ARCHS = tuple(name for name, cls in REGISTRY.items() if cls.MTP_TRAINABLE)

# defaults, sized for the embedded model on a 2-core machine (README "MTP heads" has the time of each phase)
DEFAULT_STEPS = 300
DEFAULT_TEXT_TOKENS = 200_000
DEFAULT_GEN_TOKENS = 60_000
DEFAULT_SEQ_LEN = 512
DEFAULT_BATCH = 8
DEFAULT_LR = 1e-3
DEFAULT_SEED = 0
DEFAULT_DEPTH = 2  # draft depths trained (training-time test): 1 = the first draft only
MAX_DEPTH = 4
DEPTH_WEIGHT = 0.5  # the loss of depth d weighs DEPTH_WEIGHT ** (d - 1)
HELDOUT_FRACTION = 0.05
GEN_MAX_TOKENS = 192  # per generated turn
GEN_BATCH = 8  # sessions decoded together
DRAFT_VOCAB = 8192
EMB_INIT_REL = 0.25  # eh_proj's embedding half starts N(0, EMB_INIT_REL / sqrt(dim)): ~25% of the hidden's share
CE_CHUNK = 1024  # rows per LM-head block in the fused cross-entropy
QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q8_0")

# Workload texts (workloads/texts/*.txt) come from these: leave them out of the training text.
EXCLUDED_STDLIB = frozenset({"colorsys.py", "sched.py"})
EXCLUDED_TOPICS = frozenset({"assert", "compound", "else", "exceptions", "execmodel", "for", "if", "raise", "try",
                             "while", "with"})


class TrainMtpError(BadFlagError):
    """A bad train-mtp argument or an input it cannot train on."""


@dataclass(frozen=True)
class TrainConfig:
    base_digest: str
    features: tuple[int, ...]  # the trunk layers the head fuses (feature_layers)
    depth: int
    text_tokens: int
    gen_tokens: int
    seq_len: int
    seed: int
    steps: int
    batch: int
    lr: float
    version: int = FORMAT_VERSION

    def data_key(self, part: str) -> dict:
        """What determines one part of the teacher data ("text" or "gen")."""
        budget = self.text_tokens if part == "text" else self.gen_tokens
        keys = ("base_digest", "seq_len", "seed", "version")
        return {"part": part, "budget": budget, "features": list(self.features), **{k: getattr(self, k) for k in keys}}

    def as_dict(self) -> dict:
        return {**asdict(self), "features": list(self.features)}


def feature_layers(n_layers: int) -> tuple[int, ...]:
    """The low, middle and high trunk layers a head fuses (EAGLE-3 reads layers 2, n/2 and n-3 of 32): for 30
    layers 2, 14 and 26; fewer on shallow models, none on one of under 3 layers."""
    cand = (2, n_layers // 2 - 1, n_layers - 4) if n_layers >= 8 else (0, n_layers - 2)
    return tuple(sorted({v for v in cand if 0 <= v < n_layers - 1}))
