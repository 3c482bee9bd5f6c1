"""Model architectures, one file each, chosen from a registry keyed on GGUF `general.architecture`."""

from __future__ import annotations

from ..errors import UnsupportedArchitectureError
from ..formats.gguf import GGUFFile
from .base import ModelArgs
from .llama import Llama
from .qwen3 import Qwen3
from .qwen3moe import Qwen3Moe
from .qwen3next import Qwen3Next
from .qwen35moe import Qwen35Moe
from .validate import validate_file

REGISTRY = {"llama": Llama, "qwen3": Qwen3, "qwen3moe": Qwen3Moe, "qwen3next": Qwen3Next, "qwen35moe": Qwen35Moe}
__all__ = ["REGISTRY", "ModelArgs", "load_model"]


def load_model(path_or_file, **overrides):
    """Open a GGUF and build its architecture's model (weights packed for the CPU kernels)."""
    g = path_or_file if isinstance(path_or_file, GGUFFile) else GGUFFile(path_or_file)
    cls = REGISTRY.get(g.architecture)
    if cls is None:
        raise UnsupportedArchitectureError(
            f"{g.path}: unsupported architecture '{g.architecture}' (supported: {', '.join(sorted(REGISTRY))})"
        )
    validate_file(g, cls, overrides)  # shapes, ranges, allocations, finite weights: before any kernel runs
    return cls.from_gguf(g, **overrides)
