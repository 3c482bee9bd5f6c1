"""How drafting is configured (DraftOptions, MtpOptions), each flag validated once, with its name in the message.
Light on purpose (no numba): `guild --help` imports it; the registry is read when options are built."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import BadFlagError
from ..window import MAX_DRAFT

MTP_K = 0  # default MTP draft depth, 0: as deep as the head was trained to chain (guild train-mtp --depth)
MTP_VOCAB = 8192  # draft LM head rows by default (0 = the whole vocabulary); see README "MTP heads"


@dataclass(frozen=True)
class MtpOptions:
    """How the MTP head drafts (`--mtp-head`, `--spec-mtp-k`, `--spec-min-p`, `--spec-mtp-vocab`)."""

    head: str | None = None  # a head GGUF (default: the model's nextn block, a sidecar beside it, a shipped one)
    k: int = MTP_K  # drafts per window at most (0: the head's trained depth)
    min_p: float = 0.0  # fixed mtp: a plain step when the head's top-1 probability is below this
    vocab: int = MTP_VOCAB  # score only the head's most frequent `vocab` tokens (0 = all)

    def __post_init__(self):
        if not 0 <= self.k <= MAX_DRAFT:
            raise BadFlagError(f"--spec-mtp-k must be in 0..{MAX_DRAFT} (0: the head's trained depth), got {self.k}")
        if not 0.0 <= self.min_p < 1.0:
            raise BadFlagError(f"--spec-min-p must be in [0, 1), got {self.min_p}")
        if self.vocab < 0:
            raise BadFlagError(f"--spec-mtp-vocab must be >= 0, got {self.vocab}")

    def depth(self, head) -> int:
        """MTP drafts per window at most with `head` (guild.models.mtp.MtpHead or None): --spec-mtp-k, else the
        depth the head was trained to chain."""
        return self.k or (head.info.depth if head is not None else 1)


@dataclass(frozen=True)
class DraftOptions:
    """Which strategy drafts and its knobs (`--decode-strategy`, `--spec-*`, `--retrieval-corpus`)."""

    strategy: str = "adaptive"
    max_draft: int = 4
    min_match: int = 3
    lookup_window: int = 65536
    corpus: tuple[str, ...] = ()  # documents the retrieval drafter ingests
    mtp: MtpOptions = field(default_factory=MtpOptions)

    def __post_init__(self):
        from .registry import needs, strategies  # the drafters import numba: not at `guild --help`

        names = strategies()
        if self.strategy not in names:
            raise BadFlagError(f"--decode-strategy must be one of {', '.join(names)}, got '{self.strategy}'")
        if not 0 <= self.max_draft <= MAX_DRAFT:
            raise BadFlagError(f"--spec-max-draft must be in 0..{MAX_DRAFT}, got {self.max_draft}")
        if self.min_match not in (2, 3):
            raise BadFlagError(f"--spec-min-match must be 2 or 3, got {self.min_match}")
        if self.lookup_window < 64:
            raise BadFlagError(f"--spec-lookup-window must be >= 64, got {self.lookup_window}")
        s = needs(self.strategy)
        if self.mtp.head is not None and not s.uses_head:
            heads = (n for n in names if needs(n).uses_head)
            raise BadFlagError(f"--mtp-head needs --decode-strategy {' or '.join(heads)}")
        if self.corpus and not s.uses_corpus:
            corpora = (n for n in names if needs(n).uses_corpus)
            raise BadFlagError(f"--retrieval-corpus needs --decode-strategy {' or '.join(corpora)}")
        for f in self.corpus:
            if not Path(f).is_file():
                raise BadFlagError(f"--retrieval-corpus: no such file: {f}")

    def with_strategy(self, strategy: str, **changes):
        """These options for another strategy (a bench's or a server's several): the head and the corpus kept only
        where that strategy uses them, as a flag given for the others would be refused."""
        from .registry import needs

        s = needs(strategy)
        mtp = self.mtp if s.uses_head else replace(self.mtp, head=None)
        return replace(self, strategy=strategy, mtp=mtp, corpus=self.corpus if s.uses_corpus else (), **changes)
