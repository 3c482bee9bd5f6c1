"""Qwen3-MoE (Qwen3-30B-A3B): Qwen3 attention with routed experts, softmax → top-k → renormalise
(norm_topk_prob; llama.cpp hard-codes it for this architecture)."""

from .qwen3 import Qwen3


class Qwen3Moe(Qwen3):
    @classmethod
    def from_gguf(cls, g, **overrides):
        overrides.setdefault("norm_topk_prob", True)
        return super().from_gguf(g, **overrides)
