"""Per-session model state: the KV cache, written a window at a time and committed by `keep`."""

from __future__ import annotations

import numpy as np

from .errors import ContextOverflowError


class KVCache:
    """Keys as [n_layers, n_kv_heads, head_dim, n_ctx] (transposed for the attention kernel), values as
    [n_layers, n_kv_heads, n_ctx, head_dim], float32.

    `begin(T)` reserves rows pos..pos+T-1 for a window; `commit(keep)` keeps the first `keep` of them and
    clears the rest, so the cache is exactly what `keep` single-token steps would have left (DESIGN.md "Window").
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, n_ctx: int):
        self.n_ctx = n_ctx
        self.k = np.zeros((n_layers, n_kv_heads, head_dim, n_ctx), np.float32)
        self.v = np.zeros((n_layers, n_kv_heads, n_ctx, head_dim), np.float32)
        self.pos = 0  # committed rows
        self.pending = 0  # rows written by the open window
        self.distinct_experts = np.zeros(n_layers, np.int32)  # union size per layer in the last window

    def begin(self, T: int) -> int:
        if self.pending:
            raise RuntimeError("KVCache.begin: previous window not committed")
        if self.pos + T > self.n_ctx:
            raise ContextOverflowError(
                f"context full: {self.pos} + {T} tokens exceed --context {self.n_ctx}"
            )
        self.pending = T
        return self.pos

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        """k, v: [T, n_kv_heads, head_dim] for the open window's rows."""
        T = k.shape[0]
        self.k[layer, :, :, self.pos : self.pos + T] = k.transpose(1, 2, 0)
        self.v[layer, :, self.pos : self.pos + T] = v.transpose(1, 0, 2)

    def commit(self, keep: int) -> None:
        if not 0 <= keep <= self.pending:
            raise ValueError(f"commit({keep}) outside the open window of {self.pending} rows")
        end = self.pos + self.pending
        self.pos += keep
        if self.pos < end:  # rows >= keep must not survive
            self.k[:, :, :, self.pos : end] = 0.0
            self.v[:, :, self.pos : end] = 0.0
        self.pending = 0

    def truncate(self, n: int) -> None:
        """Forget committed rows >= n (a conversation re-tokenised differently from what was fed)."""
        if self.pending:
            raise RuntimeError("KVCache.truncate: a window is open")
        n = max(0, min(n, self.pos))
        self.k[:, :, :, n : self.pos] = 0.0
        self.v[:, :, n : self.pos] = 0.0
        self.pos = n

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
