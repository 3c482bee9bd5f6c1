"""Numba kernels for the non-matmul parts of a transformer window: RMSNorm, RoPE, GQA attention, SwiGLU, routing.

All keep the row-invariance contract (docs/contracts.md "Row invariance"): work is split over rows/heads/
features, never inside one reduction, and every reduction runs in a fixed order that does not depend on T or
the thread count.
Twins: guild.kernels.ref (same names). rows.py: the row-wise ops; kv.py: the KV cache's stored forms; gqa.py: the
attention kernels over them; gqa_row.py: one row's (a decode step's) on AVX-512 hosts, heads in fours.
"""

from .gqa import KV_ROWS, PREFILL_ROWS, attention, attention_kv, scores_kv, softmax_window, values_kv
from .kv import KV_TILE, get_keys, key_tiles, kv_quantize_q8_0, put_keys, tile_keys
from .rows import expf, rmsnorm, rmsnorm_heads, rmsnorm_parallel, rope, softmax_topk, sum_fixed, swiglu

__all__ = [
    "KV_ROWS",
    "KV_TILE",
    "PREFILL_ROWS",
    "attention",
    "attention_kv",
    "expf",
    "get_keys",
    "key_tiles",
    "kv_quantize_q8_0",
    "put_keys",
    "rmsnorm",
    "rmsnorm_heads",
    "rmsnorm_parallel",
    "rope",
    "scores_kv",
    "softmax_topk",
    "softmax_window",
    "sum_fixed",
    "swiglu",
    "tile_keys",
    "values_kv",
]
