"""Qwen3 dense: the Llama block with per-head RMSNorm on Q and K (QK-norm) and NEOX (half-split) rope."""

from .llama import Llama


class Qwen3(Llama):
    ROPE_NEOX = True
    QK_NORM = True
