"""A minimal GGUF v2/v3 reader/writer that keeps whatever the file says (wrong types, nested arrays, wrapping
offsets): the fuzzer edits the header, metadata and tensor index as data, then writes the bytes back.
Layout per https://github.com/ggml-org/ggml/blob/master/docs/gguf.md ("File Structure")."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

# GGUF metadata value types (gguf.md "gguf_metadata_value_type")
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "B", U64: "Q", I64: "q", F64: "d"}
_INT_BITS = {U8: 8, I8: 8, U16: 16, I16: 16, U32: 32, I32: 32, BOOL: 8, U64: 64, I64: 64}


@dataclass
class TensorInfo:
    name: bytes
    dims: list[int]  # GGUF order (fastest-varying first)
    qtype: int
    offset: int


@dataclass
class Gguf:
    version: int = 3
    kv: list[tuple[bytes, int, object]] = field(default_factory=list)  # (key, value type, value)
    tensors: list[TensorInfo] = field(default_factory=list)
    data: bytes = b""
    alignment: int = 32
    n_tensors: int | None = None  # header counts when they should lie; None = the real counts
    n_kv: int | None = None
    magic: bytes = b"GGUF"

    def get(self, key: str):
        for k, t, v in self.kv:
            if k == key.encode():
                return t, v
        return None

    def set(self, key: str, typ: int, value) -> None:
        for i, (k, _, _) in enumerate(self.kv):
            if k == key.encode():
                self.kv[i] = (k, typ, value)
                return
        self.kv.append((key.encode(), typ, value))

    def tensor(self, name: str) -> TensorInfo | None:
        return next((t for t in self.tensors if t.name == name.encode()), None)


class _Reader:
    def __init__(self, b: bytes):
        self.b, self.pos = b, 0

    def take(self, fmt: str):
        (v,) = struct.unpack_from("<" + fmt, self.b, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> bytes:
        n = self.take("Q")
        s = self.b[self.pos : self.pos + n]
        self.pos += n
        return s

    def value(self, t: int):
        if t == STR:
            return self.string()
        if t == ARR:
            sub, n = self.take("I"), self.take("Q")
            return (sub, [self.value(sub) for _ in range(n)])
        return self.take(_FMT[t])


def parse(b: bytes) -> Gguf:
    r = _Reader(b)
    magic = b[:4]
    r.pos = 4
    g = Gguf(version=r.take("I"), magic=magic)
    n_t, n_kv = r.take("Q"), r.take("Q")
    for _ in range(n_kv):
        k = r.string()
        t = r.take("I")
        g.kv.append((k, t, r.value(t)))
    for _ in range(n_t):
        name = r.string()
        nd = r.take("I")
        dims = [r.take("Q") for _ in range(nd)]
        g.tensors.append(TensorInfo(name, dims, r.take("I"), r.take("Q")))
    al = g.get("general.alignment")
    g.alignment = int(al[1]) if al else 32
    start = -(-r.pos // g.alignment) * g.alignment
    g.data = b[start:]
    return g


def _pack(t: int, v) -> bytes:
    if t == STR:
        s = v if isinstance(v, bytes) else str(v).encode("utf-8", "surrogateescape")
        return struct.pack("<Q", len(s)) + s
    if t == ARR:
        sub, items = v
        return struct.pack("<IQ", sub, len(items)) + b"".join(_pack(sub, x) for x in items)
    if t in _INT_BITS:  # wrap into the field's width: the fuzzer writes -1 as a UINT64 on purpose
        bits = _INT_BITS[t]
        u = int(v) & ((1 << bits) - 1)
        fmt = _FMT[t].upper() if t not in (BOOL,) else "B"
        return struct.pack("<" + fmt, u)
    if t == F32:
        return np.float32(v).tobytes()  # 1e308 becomes inf, as a converter's cast would make it
    if t == F64:
        return struct.pack("<d", float(v))
    return struct.pack("<I", 0)  # an unknown value type: its id was already written


def serialize(g: Gguf) -> bytes:
    out = [g.magic, struct.pack("<I", g.version & 0xFFFFFFFF),
           struct.pack("<QQ", (len(g.tensors) if g.n_tensors is None else g.n_tensors) & (2**64 - 1),
                       (len(g.kv) if g.n_kv is None else g.n_kv) & (2**64 - 1))]
    for k, t, v in g.kv:
        out.append(struct.pack("<Q", len(k)) + k + struct.pack("<I", t & 0xFFFFFFFF) + _pack(t, v))
    for ti in g.tensors:
        out.append(struct.pack("<Q", len(ti.name)) + ti.name + struct.pack("<I", len(ti.dims) & 0xFFFFFFFF)
                   + b"".join(struct.pack("<Q", d & (2**64 - 1)) for d in ti.dims)
                   + struct.pack("<IQ", ti.qtype & 0xFFFFFFFF, ti.offset & (2**64 - 1)))
    head = b"".join(out)
    al = g.alignment if g.alignment > 0 else 32
    pad = (-len(head)) % al
    return head + b"\0" * pad + g.data
