"""Qwen3.5-MoE (Qwen3.5-35B-A3B and larger): the Qwen3-Next block with separate `ssm_beta` / `ssm_alpha`
projections and value heads reordered by the converter from grouped to tiled (value head j reads key head
j % n_k, so ggml can broadcast). Its rope is interleaved MRoPE (`rope.dimension_sections`), which for text
positions (the same position in every section) is exactly NEOX rope over `rope.dimension_count` dims.
MTP blocks (`nextn_predict_layers`) appended after the trunk are loaded by nothing here and not run.
"""

from .deltanet import HybridMoe


class Qwen35Moe(HybridMoe):
    V_TILED = True
    BA_FUSED = False
