"""The KV cache's storage types (`--cache-type-k`, `--cache-type-v`, llama.cpp's names and byte counts): a table
of what each stores per element, and the pair a session's cache uses. Light (no numba): the CLI imports it."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import BadFlagError


@dataclass(frozen=True)
class KVType:
    name: str
    block: int  # elements per block along head_dim
    block_bytes: int  # bytes per block: the same as llama.cpp's ggml type

    def row_bytes(self, head_dim: int) -> int:
        return head_dim // self.block * self.block_bytes


# q8_0: llama.cpp's block_q8_0, an f16 scale and 32 int8 (34 bytes per 32 values)
KV_TYPES = {t.name: t for t in (KVType("f32", 1, 4), KVType("f16", 1, 2), KVType("q8_0", 32, 34))}


@dataclass(frozen=True)
class KVTypes:
    """The stored types of the keys and the values; f32 (the default) keeps the kernels' float32 numbers."""

    k: str = "f32"
    v: str = "f32"

    def __post_init__(self):
        for flag, name in (("--cache-type-k", self.k), ("--cache-type-v", self.v)):
            if name not in KV_TYPES:
                raise BadFlagError(f"{flag} must be one of {', '.join(KV_TYPES)}, got '{name}'")

    def check_head_dim(self, head_dim: int) -> None:
        """A blocked type needs whole blocks along head_dim (as llama.cpp requires)."""
        for flag, name in (("--cache-type-k", self.k), ("--cache-type-v", self.v)):
            b = KV_TYPES[name].block
            if head_dim % b:
                raise BadFlagError(f"{flag} {name} needs a head size that is a multiple of {b}; this model's is "
                                   f"{head_dim}")

    def token_bytes(self, n_layers: int, n_kv_heads: int, head_dim: int) -> int:
        """Bytes one position takes in every layer (keys and values)."""
        return n_layers * n_kv_heads * (KV_TYPES[self.k].row_bytes(head_dim) + KV_TYPES[self.v].row_bytes(head_dim))

    @property
    def is_f32(self) -> bool:
        return self.k == self.v == "f32"

    def describe(self) -> str:
        return f"K {self.k} · V {self.v}"


F32_KV = KVTypes()
