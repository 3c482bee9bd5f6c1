"""Bounded pre-read of a GGUF's header, metadata and tensor index, before the `gguf` reader or any kernel sees
the file: every count and length is checked against the bytes that remain, nested arrays are refused, and
each tensor's dimensions, type, offset, alignment and extent are checked against the file's data section.
Layout: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (limits as ggml's gguf.cpp applies them:
GGML_MAX_DIMS = 4, power-of-two alignment, no arrays of arrays)."""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES

from ..errors import GgufFormatError

MAX_DIMS = 4  # GGML_MAX_DIMS (ggml.h)
MAX_NAME = 64  # GGML_MAX_NAME (ggml.h): tensor names
MAX_KEY = 65535
# value type id -> size in bytes (strings and arrays are variable); gguf.md "gguf_metadata_value_type"
_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
_U64 = struct.Struct("<Q")
_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_DTYPE = {k: np.dtype("<" + f) if f not in "?Bb" else np.dtype(f) for k, f in _FMT.items()}


class _Cursor:
    def __init__(self, path: str, buf, size: int):
        self.path, self.b, self.size, self.pos = path, buf, size, 0

    def fail(self, msg: str) -> GgufFormatError:
        return GgufFormatError(f"{self.path}: {msg}")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size or self.pos < 0:
            raise self.fail(f"{what} runs past the end of the file (offset {self.pos}, {n} bytes, file {self.size})")

    def u(self, fmt: str, what: str) -> int:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from("<" + fmt, self.b, self.pos)
        self.pos += n
        return v

    def string(self, what: str, limit: int | None = None) -> bytes:
        n = self.u("Q", what)
        if limit is not None and n > limit:
            raise self.fail(f"{what} is {n} bytes long (at most {limit})")
        self.need(n, what)
        s = self.b[self.pos : self.pos + n]
        self.pos += n
        return s

    def name(self, what: str, limit: int) -> str:
        """A key or tensor name: a string that must be UTF-8 (as the `gguf` reader requires)."""
        try:
            return self.string(what, limit).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None

    def value(self, t: int, what: str):
        """Reads one value: a Python scalar, a str, or for an array (element type, elements); a numeric array is
        one NumPy array over its bytes (not read element by element), a string array a list of str."""
        if t == STRING:
            return self.string(what).decode("utf-8", errors="replace")
        if t == ARRAY:
            sub = self.u("I", what)
            n = self.u("Q", what)
            if sub == ARRAY:
                raise self.fail(f"{what}: arrays of arrays are not supported")
            if sub == STRING:  # each element is at least its 8-byte length: the count is bounded by the file
                self.need(n * 8, what)
                return sub, self._strings(n, what)
            if sub not in _SIZE:
                raise self.fail(f"{what}: unknown array element type {sub}")
            self.need(n * _SIZE[sub], what)
            end = self.pos + n * _SIZE[sub]
            arr = np.frombuffer(self.b[self.pos : end], _DTYPE[sub])  # one read of the whole array (a copy: the
            self.pos = end  # caller's mapping may close before the view dies)
            return sub, arr
        if t not in _SIZE:
            raise self.fail(f"{what}: unknown value type {t}")
        fmt = _FMT[t]
        return self.u(fmt, what)

    def _strings(self, n: int, what: str) -> list[str]:
        pos, b, size, unpack = self.pos, self.b, self.size, _U64.unpack_from
        out = []
        append = out.append
        for _ in range(n):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, what)
            m = unpack(b, pos)[0]
            pos += 8
            if m > size - pos:
                self.pos = pos
                self.need(m, what)
            append(b[pos : pos + m].decode("utf-8", errors="surrogateescape"))
            pos += m
        self.pos = pos
        return out


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order (row length first)
    qtype: GGMLQuantizationType
    offset: int  # from the start of the data section
    nbytes: int


@dataclass
class GgufIndex:
    """What precedes the tensor data, parsed and checked: metadata (key → Python value, arrays as lists),
    each key's GGUF value type (and element type for arrays), the tensor index, the data section's offset."""

    version: int
    metadata: dict[str, Any]
    types: dict[str, tuple[int, int | None]]
    tensors: list[TensorInfo]
    alignment: int
    data_offset: int
    size: int  # of the file


def _metadata_value(v):
    if isinstance(v, tuple):  # (element type, elements)
        sub, items = v
        return items if sub == STRING else items.tolist()
    return v


def check_index(path: str) -> GgufIndex:
    """The file's header, metadata and tensor index, checked: raises GgufFormatError (one line, naming the key
    or tensor) unless the index is self-consistent and every tensor lies inside the file."""
    size = os.path.getsize(path)
    if size < 24:
        raise GgufFormatError(f"{path}: not a GGUF file ({size} bytes)")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return read_index(path, mm, size)


def read_index(path: str, buf, size: int) -> GgufIndex:
    """check_index over bytes already mapped (`buf`, `size` bytes long)."""
    if size < 24:
        raise GgufFormatError(f"{path}: not a GGUF file ({size} bytes)")
    if buf[:4] != b"GGUF":
        raise GgufFormatError(f"{path}: not a GGUF file (bad magic)")
    c = _Cursor(path, buf, size)
    c.pos = 4
    version = c.u("I", "version")
    if version not in (2, 3):
        raise c.fail(f"GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = c.u("Q", "tensor count"), c.u("Q", "metadata count")
    if n_kv > size // 13 or n_tensors > size // 32:  # smallest key/value and tensor-info entries
        raise c.fail(f"header counts ({n_kv} metadata, {n_tensors} tensors) do not fit in {size} bytes")
    alignment = 32
    metadata: dict[str, Any] = {}
    types: dict[str, tuple[int, int | None]] = {}
    for i in range(n_kv):
        name = c.name(f"metadata key #{i}", MAX_KEY)
        if name in metadata:
            raise c.fail(f"metadata '{name}' appears twice")
        t = c.u("I", f"metadata '{name}' type")
        v = c.value(t, f"metadata '{name}'")
        types[name] = (t, v[0] if t == ARRAY else None)
        metadata[name] = _metadata_value(v)
        if name == "general.alignment":
            if t != 4 or not v or v & (v - 1):
                raise c.fail(f"metadata 'general.alignment' must be a power of two (uint32), got {v}")
            alignment = v
    infos = []
    names = set()
    for i in range(n_tensors):
        name = c.name(f"tensor #{i} name", MAX_NAME)
        if name in names:
            raise c.fail(f"tensor '{name}' appears twice in the index")
        names.add(name)
        nd = c.u("I", f"tensor '{name}' dimension count")
        if not 1 <= nd <= MAX_DIMS:
            raise c.fail(f"tensor '{name}' has {nd} dimensions (1..{MAX_DIMS})")
        dims = tuple(c.u("Q", f"tensor '{name}' dimensions") for _ in range(nd))
        t = c.u("I", f"tensor '{name}' type")
        off = c.u("Q", f"tensor '{name}' offset")
        infos.append((name, dims, t, off))
    data0 = -(-c.pos // alignment) * alignment
    spans = []
    tensors = []
    for name, dims, t, off in infos:
        try:
            qt = GGMLQuantizationType(t)
            block, tsize = GGML_QUANT_SIZES[qt]
        except (ValueError, KeyError):
            raise c.fail(f"tensor '{name}' has unknown type id {t}") from None
        n = 1
        for d in dims:
            if d < 1:
                raise c.fail(f"tensor '{name}' has a zero dimension ({list(dims)})")
            n *= d
        if n > 2**50:
            raise c.fail(f"tensor '{name}' has {n} elements (dimensions {list(dims)})")
        if dims[0] % block:
            raise c.fail(f"tensor '{name}' row length {dims[0]} is not a multiple of the {qt.name} block ({block})")
        nbytes = n // block * tsize
        if off % alignment:
            raise c.fail(f"tensor '{name}' offset {off} is not a multiple of the alignment {alignment}")
        if data0 + off + nbytes > size:
            raise c.fail(f"tensor '{name}' ({nbytes} bytes at data offset {off}) runs past the end of the file "
                         f"({size - data0} data bytes)")
        spans.append((off, off + nbytes, name))
        tensors.append(TensorInfo(name, dims, qt, off, nbytes))
    spans.sort()
    for (a0, a1, an), (b0, _, bn) in zip(spans, spans[1:], strict=False):
        if b0 < a1:
            raise c.fail(f"tensors '{an}' and '{bn}' overlap in the file (offsets {a0} and {b0})")
    return GgufIndex(version, metadata, types, tensors, alignment, data0, size)
