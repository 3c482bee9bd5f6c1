"""GGUF file → metadata dict + memory-mapped tensors (guild.formats.gguf_check reads the header; the `gguf` package's
reader, which reads arrays element by element, is not used for loading).

Quantized tensors stay memory-mapped as raw blocks ([rows, row_bytes] uint8); nothing is dequantised here.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from ..errors import GgufFormatError, MetadataError, MissingTensorError, UnsupportedQuantTypeError
from ..kernels.cpu.quant import KINDS
from .gguf_check import TensorInfo, read_index

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


_ITEM = {GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F32: np.float32,
         GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8, GGMLQuantizationType.I16: np.int16,
         GGMLQuantizationType.I32: np.int32, GGMLQuantizationType.I64: np.int64}
_PAGE = mmap.PAGESIZE


def tensor_view(buf, info: TensorInfo, data_offset: int) -> np.ndarray:
    """A tensor's bytes in the mapped file as the `gguf` reader shapes them: numpy order, float/int types as
    their dtype, block quants (and BF16) as uint8 [..., row bytes]."""
    shape = tuple(reversed(info.dims))
    item = _ITEM.get(info.qtype)
    if item is None:
        block, tsize = GGML_QUANT_SIZES[info.qtype]
        item, shape = np.uint8, shape[:-1] + (shape[-1] // block * tsize,)
    count = info.nbytes // np.dtype(item).itemsize
    return np.frombuffer(buf, item, count, data_offset + info.offset).reshape(shape)


class GGUFFile:
    """An opened GGUF file: `metadata` (key → Python value), `types` (key → GGUF value type, element type) and
    `tensors` (name → Tensor), mmap-backed. The header is read by guild.formats.gguf_check (bounded, one pass; arrays
    are read whole, not element by element)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise GgufFormatError(f"{self.path}: no such file")
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 24:
                    raise GgufFormatError(f"{self.path}: not a GGUF file ({size} bytes)")
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise GgufFormatError(f"{self.path}: cannot read ({e.strerror or e})") from None
        self.index = idx = read_index(self.path, self._mm, size)  # bounded: counts, lengths, offsets checked
        self.size = size
        self.data_offset = idx.data_offset
        self.metadata: dict[str, Any] = {k: v for k, v in idx.metadata.items() if not k.startswith("GGUF.")}
        self.types = idx.types
        self.tensors: dict[str, Tensor] = {}
        for info in idx.tensors:
            data = tensor_view(self._mm, info, idx.data_offset)
            self.tensors[info.name] = Tensor(info.name, info.qtype, tuple(reversed(info.dims)), data)
        self._base = np.frombuffer(self._mm, np.uint8)  # the mapping's address, for release()
        self.finite_checked = False  # set once the float values and block scales were scanned (or a cache says so)
        self.scale_ledger = None  # while a repack checks the block scales as it packs (guild/formats/finite.py)
        self.architecture = self.get("general.architecture", str)

    def release(self, *arrays: np.ndarray, drop_cache: bool = False) -> None:
        """Drop this process's mapped pages under `arrays` (views of this file), once they have been read: the
        file stays in the page cache, but the pages stop counting towards this process's resident memory
        (madvise DONTNEED on a read-only file mapping; a later read maps them again). Other arrays: ignored.
        drop_cache: the page cache's copy goes too (posix_fadvise DONTNEED), for bytes read once (a repack), so
        that a model larger than memory does not push everything else out of it."""
        if not hasattr(self._mm, "madvise"):
            return
        base, size = self._base.ctypes.data, self.size
        try:
            fd = os.open(self.path, os.O_RDONLY) if drop_cache and hasattr(os, "posix_fadvise") else None
        except OSError:  # the file went away: its mapping stays readable, nothing to drop from the cache
            fd = None
        try:
            for a in arrays:
                if not isinstance(a, np.ndarray) or not a.size:
                    continue
                lo = a.__array_interface__["data"][0] - base
                hi = lo + a.nbytes
                if lo < 0 or hi > size:
                    continue
                lo -= lo % _PAGE
                hi = min(size, -(-hi // _PAGE) * _PAGE)
                self._mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
                if fd is not None:
                    os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)
        except (OSError, ValueError):
            return
        finally:
            if fd is not None:
                os.close(fd)

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

        return hashlib.sha256(self._mm[: self.data_offset]).hexdigest()


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
