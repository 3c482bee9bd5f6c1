"""GGUF file → metadata dict + memory-mapped tensors, through the `gguf` package's reader.

Quantized tensors stay memory-mapped as raw blocks ([rows, row_bytes] uint8); nothing is dequantised here.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from .errors import GgufFormatError, MetadataError, MissingTensorError, UnsupportedQuantTypeError
from .gguf_check import check_index
from .kernels.cpu.quant import KINDS

# Quant types the CPU kernels implement: one codec each (kernels/cpu/codecs.py).
SUPPORTED_QTYPES = frozenset(GGMLQuantizationType(q) for q in KINDS)


@dataclass(frozen=True)
class Tensor:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order, e.g. (n_out, n_in) for a matrix; (E, n_out, n_in) for experts
    data: np.ndarray  # raw: uint8 [..., row_bytes] for block quants, float dtype for F32/F16, uint16 view for BF16

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))


def _field_value(field) -> Any:
    """Python value of a reader field; strings decoded, arrays as lists."""
    t = field.types[0] if field.types else None
    if t == GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if t == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    return field.parts[field.data[0]].tolist()[0]


class GGUFFile:
    """An opened GGUF file: `metadata` (key → Python value) and `tensors` (name → Tensor), mmap-backed."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise GgufFormatError(f"{self.path}: no such file")

        check_index(self.path)  # bounded: the reader below trusts counts, lengths and offsets
        try:
            self._reader = GGUFReader(self.path, "r")
        except Exception as e:  # the reader raises ValueError/IndexError/struct errors on corrupt files
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            if "magic" in msg.lower():
                raise GgufFormatError(f"{self.path}: not a GGUF file (bad magic)") from None
            raise GgufFormatError(f"{self.path}: corrupt or truncated GGUF ({msg})") from None
        r = self._reader
        self.metadata: dict[str, Any] = {}
        for key, field in r.fields.items():
            if key.startswith("GGUF."):
                continue
            self.metadata[key] = _field_value(field)
        self.tensors: dict[str, Tensor] = {}
        for t in r.tensors:
            qtype = GGMLQuantizationType(int(t.tensor_type))
            shape = tuple(int(x) for x in reversed(t.shape.tolist()))
            self.tensors[t.name] = Tensor(t.name, qtype, shape, t.data)
        self.architecture = self.get("general.architecture", str)

    # -- metadata -----------------------------------------------------------------------------------
    def get(self, key: str, typ: type | None = None, default: Any = ...) -> Any:
        if key not in self.metadata:
            if default is ...:
                raise MetadataError(f"{self.path}: missing metadata key '{key}'")
            return default
        v = self.metadata[key]
        if typ is not None:
            try:
                v = typ(v)
            except (TypeError, ValueError, OverflowError):
                raise MetadataError(f"{self.path}: metadata '{key}' has the wrong type ({str(v)[:80]})") from None
        return v

    # -- tensors ------------------------------------------------------------------------------------
    def tensor(self, name: str) -> Tensor:
        t = self.tensors.get(name)
        if t is None:
            raise MissingTensorError(f"{self.path}: missing tensor '{name}'")
        if t.qtype not in SUPPORTED_QTYPES:
            raise UnsupportedQuantTypeError(
                f"{self.path}: tensor '{name}' has unsupported quant type {t.qtype.name}"
            )
        block, _ = GGML_QUANT_SIZES[t.qtype]
        if t.shape[-1] % block:
            raise GgufFormatError(f"{self.path}: tensor '{name}' row length {t.shape[-1]} is not a multiple of {block}")
        return t

    def has(self, name: str) -> bool:
        return name in self.tensors

    def identity_digest(self) -> str:
        """SHA-256 of the header and tensor index (everything before the tensor data): the model identity."""

        h = hashlib.sha256()
        with open(self.path, "rb") as f:
            h.update(f.read(int(self._reader.data_offset)))
        return h.hexdigest()


def f32(t: Tensor) -> np.ndarray:
    """A small float tensor (norm weights, biases, routers) as a contiguous float32 array."""
    if t.qtype == GGMLQuantizationType.F32:
        return np.ascontiguousarray(t.data, dtype=np.float32).reshape(t.shape)
    if t.qtype == GGMLQuantizationType.F16:
        return np.asarray(t.data, dtype=np.float16).astype(np.float32).reshape(t.shape)
    if t.qtype == GGMLQuantizationType.BF16:
        u = np.asarray(t.data).view(np.uint16).astype(np.uint32) << 16
        return u.view(np.float32).reshape(t.shape)
    return dequantize(np.asarray(t.data), t.qtype).astype(np.float32).reshape(t.shape)
