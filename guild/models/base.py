"""What every architecture shares: its hyperparameters (ModelArgs, from GGUF metadata) and what an architecture
class declares for the loader, the validator and the GPU placement (Architecture). What a forward returns is the
engine's (guild.engine.forward.ForwardResult)."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, replace

import numpy as np

from ..engine.backends import Layout
from ..errors import GuildError, MetadataError, NumericsError  # noqa: F401  (re-exported)
from ..formats.gguf import GGUFFile
from ..kernels.rope import NO_SCALING, RopeScaling, rope_tables
from ..kvtypes import F32_KV, KVTypes

# ModelArgs field -> the GGUF metadata key (under the architecture's prefix) it comes from, for error messages
_KEYS = {"n_layers": "block_count", "dim": "embedding_length", "n_heads": "attention.head_count",
         "n_kv_heads": "attention.head_count_kv", "head_dim": "attention.key_length",
         "vocab_size": "vocab_size (or tokenizer.ggml.tokens)", "context_length": "context_length"}


@dataclass(frozen=True)
class ModelArgs:
    arch: str
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    context_length: int
    rope_base: float = 10000.0
    rope_dim: int = 0  # rotated dims per head; 0 = head_dim
    rope_neox: bool = False  # rotate halves (NEOX) instead of adjacent pairs
    rope_scaling: RopeScaling = NO_SCALING  # its orig_ctx 0 becomes context_length
    norm_eps: float = 1e-5
    qk_norm: bool = False
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn_dim: int = 0
    norm_topk_prob: bool = True

    def __post_init__(self):
        for f, key in _KEYS.items():
            if getattr(self, f) <= 0:
                raise GuildError(f"{self.arch}.{key} must be positive, got {getattr(self, f)}")
        if self.n_heads % self.n_kv_heads:
            raise GuildError(f"{self.arch}.attention.head_count {self.n_heads} not a multiple of head_count_kv")
        if self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise GuildError(f"model {self.arch}: rope dimension_count {self.rope_dim} invalid for head_dim")
        if self.n_experts and not 0 < self.n_experts_used <= self.n_experts:
            raise GuildError(f"model {self.arch}: expert_used_count {self.n_experts_used} not in 1..expert_count")
        if not self.rope_scaling.orig_ctx:  # llama.cpp's n_ctx_orig_yarn defaults to the trained context
            object.__setattr__(self, "rope_scaling", replace(self.rope_scaling, orig_ctx=self.context_length))

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @classmethod
    def from_gguf(cls, g: GGUFFile, **overrides) -> ModelArgs:
        a = g.architecture
        dim = g.get(f"{a}.embedding_length", int)
        n_heads = g.get(f"{a}.attention.head_count", int)
        head_dim = g.get(f"{a}.attention.key_length", int, dim // n_heads if n_heads > 0 else 0)
        vocab = g.get(f"{a}.vocab_size", int, None) or len(g.get("tokenizer.ggml.tokens", list, [])) or None
        if vocab is None:
            vocab = g.tensor("token_embd.weight").shape[0]
        n_experts = g.get(f"{a}.expert_count", int, 0)
        kw = dict(
            arch=a,
            n_layers=g.get(f"{a}.block_count", int),
            dim=dim,
            n_heads=n_heads,
            n_kv_heads=g.get(f"{a}.attention.head_count_kv", int, n_heads),
            head_dim=head_dim,
            ffn_dim=g.get(f"{a}.feed_forward_length", int, 0),
            vocab_size=vocab,
            context_length=g.get(f"{a}.context_length", int, 2048),
            rope_base=g.get(f"{a}.rope.freq_base", float, cls.rope_base),
            rope_dim=g.get(f"{a}.rope.dimension_count", int, head_dim),
            norm_eps=g.get(f"{a}.attention.layer_norm_rms_epsilon", float, 1e-5),
            n_experts=n_experts,
            n_experts_used=g.get(f"{a}.expert_used_count", int, 0) if n_experts else 0,
            expert_ffn_dim=g.get(f"{a}.expert_feed_forward_length", int, 0),
            norm_topk_prob=bool(g.get(f"{a}.expert_weights_norm", int, 1)),
        )
        kw["rope_scaling"] = rope_scaling_from_gguf(g)
        kw.update(overrides)
        return cls(**kw)

    def rope_settings(self) -> dict:
        """The rope a run uses, recorded with its results (run --json, bench.jsonl)."""
        return {"freq_base": self.rope_base, **asdict(self.rope_scaling)}

    @property
    def trained_context(self) -> int:
        """Positions the model's rope covers as trained, or as its scaling stretches it (llama.cpp's n_ctx_train,
        adjusted for a YaRN factor set at run time): --context past it runs, with a warning."""
        s = self.rope_scaling
        return max(self.context_length, round(s.orig_ctx * s.factor) if s.type != "none" else 0)


def gguf_rope(g: GGUFFile) -> dict:
    """The rope a file asks for (base frequency and scaling) as `ModelArgs.rope_settings` records it: what
    `guild inspect` shows before any flag changes it."""
    base = g.get(f"{g.architecture}.rope.freq_base", float, ModelArgs.rope_base)
    return {"freq_base": base, **asdict(rope_scaling_from_gguf(g))}


def rope_scaling_from_gguf(g: GGUFFile) -> RopeScaling:
    """{arch}.rope.scaling.* as llama.cpp reads them: a factor of 0 (or none) means 1, the older
    rope.scale_linear key stands in for rope.scaling.factor, original_context_length 0 (or none) is the
    context_length (ModelArgs fills it in); the YaRN betas default to 32 and 1."""
    a = g.architecture
    k = f"{a}.rope.scaling."
    factor = g.get(k + "factor", float, None)
    if factor is None:
        factor = g.get(f"{a}.rope.scale_linear", float, 0.0)
    ext = g.get(k + "yarn_ext_factor", float, -1.0)
    try:
        return RopeScaling(type=g.get(k + "type", str, "none") or "none", factor=factor if factor != 0 else 1.0,
                           orig_ctx=g.get(k + "original_context_length", int, 0),
                           attn_factor=g.get(k + "attn_factor", float, 1.0),
                           beta_fast=g.get(k + "yarn_beta_fast", float, 32.0),
                           beta_slow=g.get(k + "yarn_beta_slow", float, 1.0),
                           ext_factor=None if ext < 0 else ext)  # negative: unset, as llama.cpp reads it
    except GuildError as e:
        raise MetadataError(f"{g.path}: {a}.{e}") from None


def check_finite(x: np.ndarray, where: str) -> None:
    """At run time: the model produced NaN/inf (overflow in the weights' arithmetic)."""
    if not np.isfinite(x).all():
        raise NumericsError(f"{where}: the model produced non-finite (NaN/inf) values; the weights overflow "
                            "in float32")


class Architecture(ABC):
    """The declarations the rest of guild reads off an architecture class (guild/models/__init__.py REGISTRY):
    whether guild.engine.gpu can place it (`GPU`: kernels/cuda has every op its forward calls), whether `guild
    train-mtp` trains heads for it (`MTP_TRAINABLE`: guild/tools/train_mtp/model.py's PyTorch block mirrors its
    block), the arguments and per-layer tensor rules the validator checks a file against (models/validate.py),
    and what one block holds and what its state costs, for the GPU placement and the device twins."""

    GPU = False
    MTP_TRAINABLE = False
    placement = None  # the GpuSplit guild.engine.gpu placed this model with; None on the CPU
    mtp_features: tuple[int, ...] = ()  # layers whose output rows forwards keep for a loaded MTP head (fused input)

    @classmethod
    @abstractmethod
    def validation_args(cls, g: GGUFFile, overrides: dict) -> tuple[ModelArgs, object]:
        """(ModelArgs, the architecture's extra arguments or None) as from_gguf will build them, loading
        nothing."""

    @classmethod
    @abstractmethod
    def layer_rules(cls, g: GGUFFile, prefix: str, args: ModelArgs, extra, layer: int | None) -> list:
        """models/validate.py rules for block `layer` (None: an MTP head's block) under prefix."""

    @abstractmethod
    def state_bytes(self, n_ctx: int, kv: KVTypes = F32_KV) -> list[int]:
        """Bytes of each layer's state in a session of n_ctx tokens with the KV cache's stored types `kv`, as
        new_state allocates it on a GPU (what the placement, guild/engine/placement.py, puts there with the
        layer)."""

    @abstractmethod
    def blocks(self) -> list:
        """The model's blocks in layer order, as `map_block` and `set_blocks` take them."""

    @abstractmethod
    def set_blocks(self, blocks: list) -> None:
        """Replace the model's blocks (a placed copy's device twins)."""

    @staticmethod
    @abstractmethod
    def map_block(blk, layer_object, vector):
        """The block with each layer object (a class holding weights) passed through layer_object and each bare
        float32 vector through vector: how guild.engine.gpu makes a block's device twin."""

    def prefill_row_invariant(self) -> bool:
        """Whether a prompt's rows come out bitwise the same whatever the prefill chunk size, so a cache built
        by any chunking (or by decoding) serves as a prefix of any later prompt. Architectures that can tell
        override this; the default promises it only up to ROW_INVARIANT_ROWS rows per chunk."""
        return False

    def build_rope(self, n_ctx: int = 0) -> None:
        """The cos/sin tables (kernels/rope.py rope_tables) for positions 0..max(n_ctx, context_length)-1 under the
        args' base and scaling; a layout already built (a placed model's devices) gets the new ones."""
        a = self.args
        self.cos, self.sin = rope_tables(max(n_ctx, a.context_length), self.n_rot, a.rope_base, a.rope_scaling)
        lay = self.__dict__.get("_layout")
        if lay is not None:
            lay.set_rope(self.cos, self.sin)

    def set_rope(self, base: float, scaling: RopeScaling, n_ctx: int = 0) -> None:
        """Run with another rope base and scaling (the --rope-* flags), tables for n_ctx positions."""
        self.args = replace(self.args, rope_base=base, rope_scaling=scaling)
        self.build_rope(n_ctx)

    def rope_positions(self, n_ctx: int) -> int:
        """A state of n_ctx positions (None or 0: the trained context) needs that many rows of rope tables:
        grown here when --context goes past the trained context, never capped."""
        n_ctx = n_ctx or self.args.context_length
        if n_ctx > self.cos.shape[0]:
            self.build_rope(n_ctx)
        return n_ctx

    def on_layout(self, layout: Layout):
        """A shallow copy of this model (the same weights and blocks) whose parts run where layout says."""
        m = copy.copy(self)
        m._layout = layout
        return m

    @property
    def layout(self) -> Layout:
        """Where each part runs: the CPU everywhere unless guild.engine.gpu placed this model."""
        lay = self.__dict__.get("_layout")
        if lay is None:
            lay = self._layout = Layout.host(self.args.n_layers, self.cos, self.sin)
        return lay
