"""Qwen3-Next (Qwen3-Next-80B-A3B): hybrid Gated DeltaNet / gated attention MoE with a shared expert.

GGUF as llama.cpp's converter writes it: DeltaNet input projections `attn_qkv` + `attn_gate` (older files:
one `ssm_in` with [q, k, v, z] per key-head group, regrouped at load), `ssm_ba` with [b, a] per key-head
group, value heads grouped by key head (value head j reads key head j // (n_v / n_k)), NEOX partial rope.
The layer math lives in guild.models.deltanet.
"""

from .deltanet import HybridMoe


class Qwen3Next(HybridMoe):
    V_TILED = False
    BA_FUSED = True
