"""Bounded pre-read of a GGUF's header, metadata and tensor index, before the `gguf` reader or any kernel sees
the file: every count and length is checked against the bytes that remain, nested arrays are refused, and
each tensor's dimensions, type, offset, alignment and extent are checked against the file's data section.
Layout: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (limits as ggml's gguf.cpp applies them:
GGML_MAX_DIMS = 4, power-of-two alignment, no arrays of arrays)."""

from __future__ import annotations

import mmap
import os
import struct

from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES

from .errors import GgufFormatError

MAX_DIMS = 4  # GGML_MAX_DIMS (ggml.h)
MAX_NAME = 64  # GGML_MAX_NAME (ggml.h): tensor names
MAX_KEY = 65535
# value type id -> size in bytes (strings and arrays are variable); gguf.md "gguf_metadata_value_type"
_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
_U64 = struct.Struct("<Q")


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

    def skip_value(self, t: int, what: str):
        """Skips one value; returns it when it is a scalar (alignment is read from the metadata)."""
        if t == STRING:
            self.string(what)
            return None
        if t == ARRAY:
            sub = self.u("I", what)
            n = self.u("Q", what)
            if sub == ARRAY:
                raise self.fail(f"{what}: arrays of arrays are not supported")
            if sub == STRING:  # each element is at least its 8-byte length: the count is bounded by the file
                self.need(n * 8, what)
                pos, b, size, unpack = self.pos, self.b, self.size, _U64.unpack_from
                for _ in range(n):
                    if pos + 8 > size:
                        break
                    pos += 8 + unpack(b, pos)[0]
                self.pos = pos
                self.need(0, what)
                return None
            if sub not in _SIZE:
                raise self.fail(f"{what}: unknown array element type {sub}")
            self.need(n * _SIZE[sub], what)
            self.pos += n * _SIZE[sub]
            return None
        if t not in _SIZE:
            raise self.fail(f"{what}: unknown value type {t}")
        fmt = {1: "B", 2: "H", 4: "I", 8: "Q"}[_SIZE[t]]
        return self.u(fmt, what)


def check_index(path: str) -> None:
    """Raise GgufFormatError (one line, naming the key or tensor) unless the file's index is self-consistent."""
    size = os.path.getsize(path)
    if size < 24:
        raise GgufFormatError(f"{path}: not a GGUF file ({size} bytes)")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        c = _Cursor(path, mm, size)
        if mm[:4] != b"GGUF":
            raise GgufFormatError(f"{path}: not a GGUF file (bad magic)")
        c.pos = 4
        version = c.u("I", "version")
        if version not in (2, 3):
            raise c.fail(f"GGUF version {version} is not supported (2 or 3)")
        n_tensors, n_kv = c.u("Q", "tensor count"), c.u("Q", "metadata count")
        if n_kv > size // 13 or n_tensors > size // 32:  # smallest key/value and tensor-info entries
            raise c.fail(f"header counts ({n_kv} metadata, {n_tensors} tensors) do not fit in {size} bytes")
        alignment = 32
        for i in range(n_kv):
            key = c.string(f"metadata key #{i}", MAX_KEY)
            name = key.decode("utf-8", "replace")
            t = c.u("I", f"metadata '{name}' type")
            v = c.skip_value(t, f"metadata '{name}'")
            if name == "general.alignment":
                if t != 4 or not v or v & (v - 1):
                    raise c.fail(f"metadata 'general.alignment' must be a power of two (uint32), got {v}")
                alignment = v
        infos = []
        names = set()
        for i in range(n_tensors):
            raw = c.string(f"tensor #{i} name", MAX_NAME)
            name = raw.decode("utf-8", "replace")
            if name in names:
                raise c.fail(f"tensor '{name}' appears twice in the index")
            names.add(name)
            nd = c.u("I", f"tensor '{name}' dimension count")
            if not 1 <= nd <= MAX_DIMS:
                raise c.fail(f"tensor '{name}' has {nd} dimensions (1..{MAX_DIMS})")
            dims = [c.u("Q", f"tensor '{name}' dimensions") for _ in range(nd)]
            t = c.u("I", f"tensor '{name}' type")
            off = c.u("Q", f"tensor '{name}' offset")
            infos.append((name, dims, t, off))
        data0 = -(-c.pos // alignment) * alignment
        spans = []
        for name, dims, t, off in infos:
            try:
                qt = GGMLQuantizationType(t)
                block, tsize = GGML_QUANT_SIZES[qt]
            except (ValueError, KeyError):
                raise c.fail(f"tensor '{name}' has unknown type id {t}") from None
            n = 1
            for d in dims:
                if d < 1:
                    raise c.fail(f"tensor '{name}' has a zero dimension ({dims})")
                n *= d
            if n > 2**50:
                raise c.fail(f"tensor '{name}' has {n} elements (dimensions {dims})")
            if dims[0] % block:
                raise c.fail(f"tensor '{name}' row length {dims[0]} is not a multiple of the {qt.name} block ({block})")
            nbytes = n // block * tsize
            if off % alignment:
                raise c.fail(f"tensor '{name}' offset {off} is not a multiple of the alignment {alignment}")
            if data0 + off + nbytes > size:
                raise c.fail(f"tensor '{name}' ({nbytes} bytes at data offset {off}) runs past the end of the file "
                             f"({size - data0} data bytes)")
            spans.append((off, off + nbytes, name))
        spans.sort()
        for (a0, a1, an), (b0, _, bn) in zip(spans, spans[1:], strict=False):
            if b0 < a1:
                raise c.fail(f"tensors '{an}' and '{bn}' overlap in the file (offsets {a0} and {b0})")
