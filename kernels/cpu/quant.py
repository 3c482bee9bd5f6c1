"""Quantized matrix kernels for the CPU (Numba): GEMV over windows of T <= 8 rows, prefill GEMM, get_rows.

Numeric modes (`NUMERICS`, chosen when a matrix is packed: `numerics()` context, `set_default_numerics`, the
CLI's --numerics):
- "i8" (default): for the types whose record has an int8 path (kernels/quant_types.py: Q4_0, Q4_1, Q5_0, Q5_1,
  Q8_0, the K-quants Q2_K..Q6_K, IQ4_NL, IQ4_XS, MXFP4, the IQ1/IQ2/IQ3 grids), activations quantised per row in
  blocks of 32 and integer dot products at every row count, prefill included (kernels/cpu/qdot/; llama.cpp's
  scheme, closer to its logits). Accuracy vs a float64 product with the activations quantised alike:
  |err| <= 1e-6 * (|W| @ |x̂|) (tests/kernels/test_qdot.py). Other types: as "f32".
- "f32": fp32 dequant-dot. Weights are dequantised to float32 in registers (or a per-thread scratch) and
  multiplied with float32 activations; every product is accumulated with a fused multiply-add (llvm.fma).
  Accuracy vs a float64 reference: |err| <= 1e-4 * (|W| @ |x|) elementwise (tests/kernels/test_quant.py).
The rest of this docstring describes the f32 kernels; kernels/cpu/qdot/__init__.py describes the int8 ones.

Layout ("feature tiles"). `pack` regroups the N output features into tiles of NT = 64 (N padded with zero
rows) and stores each tile feature-minor: quant byte j of block b of the tile's 64 features is contiguous,
`qs[tile, b, j, 0:64]`, and so are the block scales, kept as raw f16 bits (`d[tile, b, 0:64]`). The kernels
run their innermost loop over the 64 features of a tile: long, stride-1, branch-free loops that LLVM turns
into packed code (vpmovzxbd, vcvtdq2ps, vcvtph2ps, vfmadd231ps on ymm) without any fast-math flag. Integer
bit-fiddling goes through small intrinsics that stay in 32-bit lanes (Numba would widen it to int64). Quant
bytes keep their ggml bit-packing, so a packed matrix holds the GGUF bytes (K-quants: plus their sub-scales
decoded to bytes, < 3 %).

Row invariance (docs/contracts.md "Row invariance"). Output feature n of row t is one sequential fma chain over k in a
fixed per-type ("canonical") order and nothing else: no horizontal reductions, no re-association, no
fast-math. T = 1 and T = 2 dequantise in registers; T >= 3 dequantises each block once into a float32 scratch
and runs the chains of all rows from it, four rows at a time sharing the loads. All paths evaluate bitwise
the same weights and the same chains. Threads split the tiles (one parallel region per call) and never a
chain. So out[t] is bitwise the same whatever T <= GEMV_MAX_ROWS is, whatever the other rows are and however
many threads run.

Canonical order. Where a quant byte holds two elements (nibbles), the chain visits them in byte order (low
element, high element, next byte ...); the activations are permuted once per call (`perm`) into that order so
that the kernels read them with stride 1.

Codecs. Each type's record (kernels/quant_types.py) holds its fp32 codec (kernels/cpu/codecs.py: its packed
fields and its decode); its kernel and get_rows are generated from one template into kernels/cpu/quant_gen.py
(kernels/cpu/gen_quant.py).

Dispatch. A matrix's key is (type, numerics); each key's kernel is a Numba cfunc (compiled lazily, cached on
disk), called by address from a single parallel launcher: one small parallel region to compile, and no kernel
is re-optimised inside another function (this halves the cold compile time of the test suite). The f32 kernels
share their accumulation step (`drivers._use`) as one compiled C entry point that each kernel calls, rather
than a copy inlined into each.

Prefill (T > 64): the same kernels, in "dequantise" mode (T = 0), expand chunks of tiles to float32 [K, cols]
and BLAS (numpy matmul) multiplies; deterministic, not bitwise equal to the GEMV path. Windows of 9..64 rows
still take the GEMV kernels, which are faster there (measured). `dequantize_rows` / `dequantize` are
bit-exact with gguf.quants.dequantize.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache

import numba
import numpy as np
from gguf import GGMLQuantizationType as Q
from numba import cfunc, njit, prange
from threadpoolctl import threadpool_limits

from ..quant_types import QUANT_TYPES, row_bytes
from . import qdot, quant_gen
from .codecs import CTYPES, canonical_order
from .drivers import NT, _permute_x
from .intrinsics import _AVX512, _KSIG, _call_kernel, fetch_add, kvf, mxf  # noqa: F401  (calib reads _AVX512; tests kvf, mxf)

GEMV_MAX_ROWS = 8  # windows of T <= this use the fused, row-invariant path
_PREFILL_ROWS = 1024  # features dequantised per BLAS call in the prefill path
# fp32 kernels: calls of up to this many rows take the GEMV kernels too (row-invariant, as the server's batched
# rounds rely on): the BLAS path pays a dequantisation of the whole matrix per call and only wins beyond ~64
# rows here (measured on 1536x576 / 576x1536, Q4_1 and Q4_K). The int8 kernels are row-invariant at any count.
_GEMV_PATH_ROWS = 64
ROW_INVARIANT_ROWS = _GEMV_PATH_ROWS  # up to this many rows per call, every row is bitwise the same as alone
# fp matrices with at most this many output features (MoE routers, the shared expert's gate) take the GEMV
# kernels at every row count, 64 rows a call: BLAS would not pay on them, and their rows stay row-invariant
NARROW_ROWS = 512


# ---------------------------------------------------------------------------------------------------------
# packing (NumPy, once per matrix at load), driven by the records' codecs
def _tiles(a: np.ndarray, n_rows: int) -> np.ndarray:
    """[N, ...] → [tiles, ..., NT]: rows padded to a multiple of NT with zeros, feature axis last."""
    ntiles = -(-n_rows // NT)
    pad = ntiles * NT - n_rows
    if pad:
        a = np.concatenate([a, np.zeros((pad,) + a.shape[1:], a.dtype)], axis=0)
    a = a.reshape((ntiles, NT) + a.shape[1:])
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def _field(blk: np.ndarray, ctype: str, dims: tuple, source) -> np.ndarray:
    """One packed field of every block [N, nb, ...]: a byte range viewed as ctype, or a decoded array."""
    if callable(source):
        a = np.asarray(source(blk)).astype(CTYPES[ctype])
    else:
        a = np.ascontiguousarray(blk[..., source[0] : source[1]]).view(CTYPES[ctype])
    return a.reshape(blk.shape[:2] + tuple(dims))


_EMPTY = np.zeros(0, np.uint8)


class PackedMatrix:
    """Weights of one linear layer, repacked for the kernels; built once at model load.

    qtype, n_rows (N output features), n_cols (K input features). `arrays`: the packed arrays (typed, tiled,
    see kernels/cpu/codecs.py; in memory, or views of guild's repack cache file), `flat`: the same memory as six
    flat uint8 arrays (unused slots empty) handed to the drivers, `dims` = (tiles, blocks per row), `perm`: the
    canonical activation order (int64 [Kp], -1 = zero padding)."""

    __slots__ = ("qtype", "n_rows", "n_cols", "arrays", "flat", "dims", "perm", "key", "nbytes", "numerics", "_table",
                 "_addr")

    @property
    def row_invariant(self) -> bool:
        """Whether every output row is bitwise the same whatever the row count of the call (else only up to
        ROW_INVARIANT_ROWS rows: larger calls go through BLAS)."""
        return self.numerics == "i8" or self.n_rows <= NARROW_ROWS

    def __init__(self, qtype: int, n_rows: int, n_cols: int, arrays: tuple, perm: np.ndarray, n_blocks: int,
                 numerics: str = "f32"):
        self.qtype = int(qtype)
        self.n_rows = int(n_rows)
        self.n_cols = int(n_cols)
        self.numerics = numerics_for(self.qtype, numerics)  # "i8": int8 activations (kernels/cpu/qdot/)
        self.key = (self.qtype, self.numerics)  # the kernel's: _KPY, _KFUNC, _KADDR
        self.arrays = arrays
        flat = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays]
        self.flat = tuple(flat + [_EMPTY] * (6 - len(flat)))
        if self.numerics == "i8":  # the int8 kernels count 32-element blocks whatever the type's own block
            n_blocks = -(-self.n_cols // qdot.QB)
        self.dims = np.array([arrays[0].shape[0], n_blocks], np.int64)
        self.perm = np.ascontiguousarray(perm, dtype=np.int64)
        self.nbytes = int(sum(a.nbytes for a in arrays))

    @property
    def table(self) -> LinearTable:
        """This matrix as a one-part LinearTable (its int8 launch: linear_rows), built once."""
        try:
            return self._table
        except AttributeError:
            self._table = LinearTable([self])
            return self._table

    @property
    def addr(self) -> np.ndarray:
        """The kernel's address and the six flat arrays' (int64 [7]), as the launchers take them, built once."""
        try:
            return self._addr
        except AttributeError:
            self._addr = np.array([_kernel_address(self.key)] + [a.ctypes.data for a in self.flat], np.int64)
            return self._addr

    def __repr__(self) -> str:
        return (f"PackedMatrix({Q(self.qtype).name}, {self.n_rows}x{self.n_cols}, {self.nbytes} bytes, "
                f"{self.numerics})")

    @classmethod
    def from_arrays(cls, qtype: int, n_rows: int, n_cols: int, arrays, numerics: str = "f32") -> PackedMatrix:
        """A matrix over packed arrays made elsewhere (a cache file): each must have the dtype and shape that
        `layout` gives; the activation order is derived here, never taken from the arrays' source."""
        want = layout(qtype, n_rows, n_cols, numerics)
        arrays = tuple(arrays)
        if len(arrays) != len(want) or any(a.dtype != dt or a.shape != sh for a, (dt, sh) in zip(arrays, want,
                                                                                                    strict=False)):
            raise ValueError(f"packed arrays of a {Q(int(qtype)).name} {n_rows}x{n_cols} matrix: want "
                             f"{[(str(d), s) for d, s in want]}, got {[(str(a.dtype), a.shape) for a in arrays]}")
        t = QUANT_TYPES[Q(int(qtype))]
        return cls(qtype, n_rows, n_cols, arrays, _perm(int(qtype), int(n_cols)), -(-int(n_cols) // t.f32_block),
                   numerics=numerics)


@lru_cache(maxsize=4096)
def layout(qtype: int, n_rows: int, n_cols: int, numerics: str = "f32") -> tuple:
    """(dtype, shape) of each packed array of an [n_rows, n_cols] matrix of `qtype`, as `pack` makes them
    under `numerics` (the mode the matrix gets: see `numerics_for`)."""
    t = QUANT_TYPES.get(int(qtype))
    if t is None or t.f32 is None or n_rows < 1 or n_cols < 1:
        raise ValueError(f"no packed layout for quant type {qtype} and shape {n_rows}x{n_cols}")
    if numerics_for(qtype, numerics) == "i8":
        return qdot.layout(qtype, n_rows, n_cols)
    nt, nb = -(-int(n_rows) // NT), -(-int(n_cols) // t.f32_block)
    return tuple((np.dtype(CTYPES[ct]), (nt, nb) + tuple(dims) + (NT,)) for _, ct, dims, _ in t.f32.fields)


@lru_cache(maxsize=256)
def _perm(qtype: int, n_cols: int) -> np.ndarray:
    """The canonical activation order of a row of n_cols (shared by every matrix of that type and width)."""
    t = QUANT_TYPES[Q(qtype)]
    bs = t.f32_block
    Kp = -(-n_cols // bs) * bs
    perm = (np.arange(0, Kp, bs)[:, None] + canonical_order(t.f32, t.f32_unit)[None, :]).reshape(-1)
    perm[perm >= n_cols] = -1
    return perm  # left writeable, as the kernels' compiled signatures expect (nothing writes it)


# Numeric mode of the matrices packed in this context: "i8" (default: int8 activations and integer dot products
# for the types kernels/cpu/qdot/ covers, fp32 dequant-dot for the rest) or "f32" (fp32 dequant-dot for all).
NUMERICS = ("i8", "f32")
_NUMERICS: ContextVar = ContextVar("guild_numerics", default=None)
_DEFAULT_NUMERICS = ["i8"]  # the process default (the CLI's --numerics), under any `numerics` context


def _check_numerics(mode: str) -> str:
    if mode not in NUMERICS:
        raise ValueError(f"numerics must be one of {', '.join(NUMERICS)}, not {mode!r}")
    return mode


def numerics_for(qtype: int, numerics: str | None = None) -> str:
    """The mode a matrix of qtype gets under `numerics` (default: this context's, else the process default)."""
    mode = numerics or current_numerics()
    t = QUANT_TYPES.get(int(qtype))
    return "i8" if mode == "i8" and t is not None and t.i8 else "f32"


def current_numerics() -> str:
    return _NUMERICS.get() or _DEFAULT_NUMERICS[0]


def set_default_numerics(mode: str) -> None:
    """The mode of every matrix packed from now on outside a `numerics` context."""
    _DEFAULT_NUMERICS[0] = _check_numerics(mode)


@contextmanager
def numerics(mode: str | None) -> Iterator[None]:
    """Pack the matrices of this context under `mode` (one of NUMERICS; None: the current mode)."""
    token = _NUMERICS.set(_check_numerics(mode) if mode is not None else current_numerics())
    try:
        yield
    finally:
        _NUMERICS.reset(token)


def pack(qtype: int, raw, n_rows: int, n_cols: int) -> PackedMatrix:
    """Repack raw GGUF data of an [n_rows, n_cols] matrix into the tiled layout (quantized, same bits). `raw`: an
    array, or a sequence of arrays stacked along the rows."""
    return pack_checked(qtype, raw, n_rows, n_cols)[0]


def pack_checked(qtype: int, raw, n_rows: int, n_cols: int, outs: tuple | None = None) -> tuple:
    """`pack`, and per part of `raw` how many of its f16 block scales are inf or NaN, counted as the compiled
    packers (qdot.PACKERS) read them; None where the matrix packed otherwise (its scales not looked at). `outs`:
    zeroed arrays of qdot.layout for the compiled packers to write into (a kept repack's buffer), else new ones."""
    qt = Q(int(qtype))
    t = QUANT_TYPES.get(qt)
    if t is None or t.f32 is None:
        raise NotImplementedError(f"no CPU kernel for quant type {qt.name}")
    parts = tuple(raw) if isinstance(raw, (list, tuple)) else (raw,)
    N, K = int(n_rows), int(n_cols)
    rb = row_bytes(qt, K)
    if numerics_for(qt) == "i8" and qt in qdot.PACKERS:  # each part straight into its rows of the tiles
        outs = outs if outs is not None else tuple(np.zeros(shape, dt) for dt, shape in qdot.layout(qt, N, K))
        bad, r0 = [], 0
        for p in parts:
            b = np.ascontiguousarray(p).view(np.uint8)
            if b.size % rb or r0 + b.size // rb > N:
                raise ValueError(f"{qt.name} {N}x{K} matrix: a part of {b.size} bytes is not whole rows of {rb}")
            b = b.reshape(-1, rb)
            bad.append(int(qdot.pack_into(qt, outs, b, r0)))
            r0 += b.shape[0]
        if r0 != N:
            raise ValueError(f"{qt.name} {N}x{K} matrix: its parts hold {r0} rows")
        return PackedMatrix(qt, N, K, outs, _perm(int(qt), K), -(-K // t.f32_block), numerics="i8"), tuple(bad)
    raw = parts[0] if len(parts) == 1 else np.concatenate([np.asarray(r) for r in parts], axis=0)
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(N, rb)
    bs = t.f32_block
    Kp = -(-K // bs) * bs
    if t.f32.padded:  # float types: zero-pad each row to whole blocks of 32
        b = np.concatenate([b, np.zeros((N, (Kp - K) * t.nbytes), np.uint8)], axis=1)
    blk = b.reshape(N, Kp // bs, -1)
    if numerics_for(qt) == "i8":
        return PackedMatrix(qt, N, K, qdot.pack_numpy(qt, blk, N), _perm(int(qt), K), Kp // bs, numerics="i8"), None
    arrays = tuple(_tiles(_field(blk, ct, dims, src), N) for _, ct, dims, src in t.f32.fields)
    return PackedMatrix(qt, N, K, arrays, _perm(int(qt), K), Kp // bs), None


KINDS = tuple(q for q, t in QUANT_TYPES.items() if t.f32)  # the types with a CPU kernel


# ---------------------------------------------------------------------------------------------------------
# dispatch by (type, numerics): GEMV kernels are cfuncs called by address from one parallel launcher (so that
# each kernel is compiled once, lazily, and never re-optimised inside another function); get_rows are plain njit
# functions (the int8 path's: qdot.get_rows). Both derive from the records.
_KPY = {(q, "f32"): getattr(quant_gen, f"_k_{t.name}") for q, t in QUANT_TYPES.items() if t.f32}
_KPY |= {(q, "i8"): qdot.KERNELS[q] for q, t in QUANT_TYPES.items() if t.i8}
_ROWS = {q: getattr(quant_gen, f"_r_{t.name}") for q, t in QUANT_TYPES.items() if t.f32}
_KFUNC: dict[tuple, object] = {}  # key → compiled cfunc (kept alive: the launcher only sees its address)
_KADDR: dict[tuple, int] = {}


def _kernel(key: tuple):
    cf = _KFUNC.get(key)
    if cf is None:
        cf = cfunc(_KSIG, cache=True)(_KPY[key])
        _KFUNC[key] = cf
        _KADDR[key] = cf.address
    return cf


def _kernel_address(key: tuple) -> int:
    addr = _KADDR.get(key)
    if addr is None:
        _kernel(key)
        addr = _KADDR[key]
    return addr


@njit(parallel=True, cache=True)
def _launch(a, dims, perm, x, xp, out, nth):
    """out [T, N] = W x for T <= _GEMV_PATH_ROWS: one parallel region of nth threads running the kernel a[0] (an
    address; a[1:7] the packed arrays', PackedMatrix.addr) on ranges of tiles handed out on demand (_ranges). xp
    [T, Kp] is the caller's buffer for the permuted activations (owned by the caller, so that it outlives the
    kernels, which only see addresses)."""
    _permute_x(x, perm, xp)
    _ranges(a, dims, x.shape[0], perm.shape[0], xp, out, nth)


@njit(cache=True)
def _launch_one(a, dims, perm, x, xp, out):
    """_launch for a matrix of one tile (a router) on the calling thread: waking the others costs more."""
    _permute_x(x, perm, xp)
    _call_kernel(a[0], a[1], a[2], a[3], a[4], a[5], a[6], dims[0], dims[1], xp.ctypes.data, x.shape[0],
                 perm.shape[0], 0, dims[0], out.ctypes.data, out.shape[1])


# Tiles are handed out on demand (an atomic counter), so that a thread that starts late or streams slower (a VM's
# second core ran its static half ~8 % slower) takes less: first one long range a thread, _HEAD of an even share,
# which keeps each weight stream long, then the rest in ranges of about a _TAIL-th of a share.
_HEAD = 0.75
_TAIL = 8
_SPLIT = 4  # ranges a thread for a MoE layer's (expert, tiles) products (_launch_experts)


@njit(cache=True, inline="always")
def _bounds(i, nt, nth):
    """Tiles [g0, g1) of range i (g0 == g1 past the last): nth head ranges, then the tail's."""
    head = int(nt * _HEAD) // nth
    if i < nth:
        return i * head, (i + 1) * head
    h = nth * head
    step = max(1, (nt // nth) // _TAIL)
    g0 = h + (i - nth) * step
    return min(g0, nt), min(g0 + step, nt)


@njit(cache=True, inline="always")
def _ranges(a, dims, T, Kp, xp, out, nth):
    """The kernel a[0] (PackedMatrix.addr) over all tiles of out [T, N] in the ranges of _bounds, each taken by the
    next free thread (a range's arithmetic is the same whichever thread runs it). The loop body names xp and out,
    not only their addresses: an array whose last use is taking its address may be freed before the loop runs (a
    caller that allocates xp itself, moe._moe_row, then routed on freed memory: other bits, call to call)."""
    N = out.shape[1]
    nt, nb = dims[0], dims[1]
    ctr = np.empty(1, np.int64)  # np.zeros would be a parallel loop of its own here
    ctr[0] = 0
    for _ in prange(nth):
        g0, g1 = _bounds(fetch_add(ctr.ctypes.data, 1), nt, nth)
        while g0 < nt:
            if g1 > g0:
                _call_kernel(a[0], a[1], a[2], a[3], a[4], a[5], a[6], nt, nb, xp.ctypes.data, T, Kp, g0, g1,
                             out.ctypes.data, N)
            g0, g1 = _bounds(fetch_add(ctr.ctypes.data, 1), nt, nth)


@njit(parallel=True, cache=True)
def _launch_experts(addr, dims, eids, offs, buf, out, nth):
    """Every (expert, row group) product of a MoE layer in one parallel region: group g multiplies the rows
    offs[g]..offs[g+1] of the activations (already quantised into buf, group after group) by expert eids[g]
    (addr[e] = kernel, six packed arrays; dims[e] = tiles, blocks). Each group's tiles are cut into S ranges
    (nth * _SPLIT ranges in all, at least one a group), which the threads take on demand, group after group."""
    G = eids.shape[0]
    N = out.shape[1]
    pout0 = out.ctypes.data
    pbuf0 = buf.ctypes.data
    S = max(1, -(-nth * _SPLIT // G))
    ctr = np.empty(1, np.int64)  # np.zeros would be a parallel loop of its own here
    ctr[0] = 0
    for _ in prange(nth):
        task = fetch_add(ctr.ctypes.data, 1)
        while task < S * G:
            g = task // S
            c = task - g * S
            e = eids[g]
            nt, nb = dims[e, 0], dims[e, 1]
            nc = min(S, nt)
            if c < nc:
                T = offs[g + 1] - offs[g]
                Kp = nb * qdot.QB
                pxp = pbuf0 + offs[g] * (Kp + qdot.ACT_EXTRA * nb)  # qdot.act_bytes of the groups before
                _call_kernel(addr[e, 0], addr[e, 1], addr[e, 2], addr[e, 3], addr[e, 4], addr[e, 5], addr[e, 6], nt,
                             nb, pxp, T, Kp, c * nt // nc, (c + 1) * nt // nc, pout0 + 4 * offs[g] * N, N)
            task = fetch_add(ctr.ctypes.data, 1)


@njit(parallel=True, cache=True)
def _launch_parts(addr, dims, xoff, col, buf, T, out, nth):
    """The parts of a fused matrix (addr[p] = kernel, six packed arrays; dims[p] = tiles, blocks) over one input,
    quantised at buf + xoff[p], into out's columns col[p].. in one parallel region: the parts' tiles taken as one
    sequence of ranges (_bounds), a range cut where it crosses a part. Every part's n_rows a whole number of tiles
    (a kernel clips its last tile at out's width)."""
    P = addr.shape[0]
    N = out.shape[1]
    nt = 0
    for p in range(P):
        nt += dims[p, 0]
    ctr = np.empty(1, np.int64)  # np.zeros would be a parallel loop of its own here
    ctr[0] = 0
    for _ in prange(nth):
        g0, g1 = _bounds(fetch_add(ctr.ctypes.data, 1), nt, nth)
        while g0 < nt:
            base = 0
            for p in range(P):
                a, b = max(g0, base) - base, min(g1, base + dims[p, 0]) - base
                if b > a:
                    _call_kernel(addr[p, 0], addr[p, 1], addr[p, 2], addr[p, 3], addr[p, 4], addr[p, 5], addr[p, 6],
                                 dims[p, 0], dims[p, 1], buf.ctypes.data + xoff[p], T, dims[p, 1] * qdot.QB, a, b,
                                 out.ctypes.data + 4 * col[p], N)
                base += dims[p, 0]
            g0, g1 = _bounds(fetch_add(ctr.ctypes.data, 1), nt, nth)


@njit(cache=True)
def linear_rows(x, addr, dims, sg, col, out, nth):
    """out [T, col[-1]] = x [T, K] times a fused matrix's parts (LinearTable), side by side: x quantised once per
    activation group, then _launch_parts. Each part's columns are bitwise what `matmul` gives it."""
    T, K = x.shape
    P = addr.shape[0]
    per = T * (-(-K // qdot.QB)) * (qdot.QB + qdot.ACT_EXTRA)  # qdot.act_bytes(T, K)
    buf = np.empty(P * per, np.uint8)
    xoff = np.empty(P, np.int64)
    for p in range(P):
        j = p
        for r in range(p - 1, -1, -1):  # an earlier part with the same group shares its quantised rows
            if sg[r] == sg[p]:
                j = r
        xoff[p] = j * per
        if j == p:
            qdot.quantize_acts(x, buf[p * per : (p + 1) * per], sg[p])
    _launch_parts(addr, dims, xoff, col, buf, T, out, nth)


class LinearTable:
    """A fused matrix's parts (PackedMatrix list sharing an input, outputs side by side) as arrays for
    linear_rows: `ok` when every part runs on the int8 path, in whole tiles where there are several."""

    def __init__(self, parts: list):
        self.parts = list(parts)  # kept: the table holds their addresses
        whole = len(parts) == 1 or all(p.n_rows % NT == 0 for p in parts)  # a lone part clips at its own width
        self.ok = whole and all(p.numerics == "i8" and p.n_cols == parts[0].n_cols for p in parts)
        if self.ok:
            self.addr = np.array([p.addr for p in parts], np.int64)
            self.dims = np.array([p.dims for p in parts], np.int64)
            self.sg = np.array([qdot.act_group(p.qtype) for p in parts], np.int64)
            self.col = np.cumsum([0] + [p.n_rows for p in parts]).astype(np.int64)


class ExpertList(list):
    """A model's experts of one matrix kind: a list that carries its own ExpertTable (built on first use), so
    the table lives and dies with the model (a loaded model's weights are resident memory)."""

    _table: ExpertTable | None = None


class ExpertTable:
    """The experts of one MoE matrix kind (a list of PackedMatrix of one shape) as arrays for _launch_experts:
    `ok` when all of them run on the int8 path."""

    _CACHE: OrderedDict = OrderedDict()  # id(list) -> table for plain lists, least recently used first
    _MAX = 64  # tables kept; each holds its list, so a dropped list's experts stay alive until evicted

    def __init__(self, ws: list):
        w0 = ws[0]
        self.qtype = w0.qtype
        self.ok = all(w.numerics == "i8" and (w.n_rows, w.n_cols) == (w0.n_rows, w0.n_cols) for w in ws)
        if self.ok:
            self.addr = np.array([w.addr for w in ws], np.int64)
            self.dims = np.array([w.dims for w in ws], np.int64)
            self.n_rows, self.n_cols = w0.n_rows, w0.n_cols
            self.sg = qdot.act_group(w0.qtype)  # activation blocks per scale

    @classmethod
    def of(cls, ws: list) -> ExpertTable:
        if isinstance(ws, ExpertList):  # a model's: the table is the list's own
            if ws._table is None:
                ws._table = cls(ws)
            return ws._table
        t = cls._CACHE.get(id(ws))
        if t is None or t.ws is not ws:
            t = cls._CACHE[id(ws)] = cls(ws)
            t.ws = ws  # kept: the table holds their addresses
            while len(cls._CACHE) > cls._MAX:
                cls._CACHE.popitem(last=False)
        else:
            cls._CACHE.move_to_end(id(ws))
        return t


def experts_matmul(ws: list, eids: np.ndarray, offs: np.ndarray, x: np.ndarray, out: np.ndarray,
                   addr: np.ndarray | None = None) -> None:
    """out[offs[g]:offs[g+1]] = x[offs[g]:offs[g+1]] W_{eids[g]}^T for every group g (a MoE layer's experts, rows
    grouped by expert), bitwise what `matmul` gives each group. One parallel region on the int8 path. `addr`: a
    table like ExpertTable.addr whose rows for eids say where those experts' arrays are (an expert cache's slots)."""
    t = ExpertTable.of(ws)
    if addr is not None and not t.ok:
        raise ValueError("experts_matmul: an address table needs every expert on the int8 path")
    if not t.ok:
        for g, e in enumerate(eids):
            matmul(ws[e], x[offs[g] : offs[g + 1]], out[offs[g] : offs[g + 1]])
        return
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x, dtype=np.float32)
    buf = np.empty(qdot.act_bytes(x.shape[0], t.n_cols), np.uint8)
    offs = np.ascontiguousarray(offs, np.int64)
    qdot.quantize_groups(x, offs, buf, qdot.act_group(t.qtype))
    _launch_experts(t.addr if addr is None else addr, t.dims, np.ascontiguousarray(eids, np.int64), offs, buf, out,
                    numba.get_num_threads())


def matmul(w: PackedMatrix, x: np.ndarray, out: np.ndarray) -> None:
    """out[t, n] = sum_k W[n, k] * x[t, k]. x float32 [T, K] (C-contiguous), out float32 [T, N]."""
    T = x.shape[0]
    if x.ndim != 2 or x.shape[1] != w.n_cols or out.shape != (T, w.n_rows):
        raise ValueError(
            f"matmul: W is {w.n_rows}x{w.n_cols}, x {tuple(x.shape)}, out {tuple(out.shape)} "
            f"(want x [T, {w.n_cols}], out [T, {w.n_rows}])"
        )
    if T == 0:
        return
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x, dtype=np.float32)
    if w.numerics == "i8":  # every T: the integer kernels share each decoded weight group among the rows
        t = w.table
        dst = out if out.flags.c_contiguous and out.dtype == np.float32 else np.empty((T, w.n_rows), np.float32)
        linear_rows(x, t.addr, t.dims, t.sg, t.col, dst, numba.get_num_threads())
        if dst is not out:
            out[...] = dst
        return
    if T <= _GEMV_PATH_ROWS or w.n_rows <= NARROW_ROWS:
        dst = out if out.flags.c_contiguous and out.dtype == np.float32 else np.empty((T, w.n_rows), np.float32)
        for t0 in range(0, T, _GEMV_PATH_ROWS):
            xc = x[t0 : t0 + _GEMV_PATH_ROWS]
            xp = np.empty((xc.shape[0], w.perm.shape[0]), np.float32)
            if w.dims[0] == 1:
                _launch_one(w.addr, w.dims, w.perm, xc, xp, dst[t0 : t0 + _GEMV_PATH_ROWS])
            else:
                _launch(w.addr, w.dims, w.perm, xc, xp, dst[t0 : t0 + _GEMV_PATH_ROWS],
                        numba.get_num_threads())
        if dst is not out:
            out[...] = dst
        return
    # prefill: the same kernels dequantise chunks of tiles to float32 [K, cols] (mode T = 0), BLAS multiplies;
    # each worker thread takes a contiguous share of the chunks with its own scratch and single-threaded BLAS. The
    # chunks are the matrix's, not the threads': BLAS may sum a column differently in panels of another width (a
    # Zen 3's OpenBLAS did), so a chunk cut at a thread's share would change the bits with the thread count
    cf = _KFUNC.get(w.key) or _kernel(w.key)
    nt = int(w.dims[0])
    step = _prefill_step(nt)
    nc = -(-nt // step)
    n_workers = min(numba.get_num_threads(), nc)
    if out.flags.c_contiguous and out.dtype == np.float32:
        dst = out
    else:
        dst = np.empty((T, w.n_rows), np.float32)
    if n_workers == 1:
        _prefill_part(cf, w, x, dst, 0, nt)
    else:
        jobs = [
            _pool(n_workers).submit(_prefill_part, cf, w, x, dst, min(nt, c * nc // n_workers * step),
                                    min(nt, (c + 1) * nc // n_workers * step))
            for c in range(n_workers)
        ]
        for j in jobs:
            j.result()
    if dst is not out:
        out[...] = dst


def _prefill_step(nt: int) -> int:
    """Tiles per chunk of the prefill product of a matrix of nt tiles: up to _PREFILL_ROWS features, and at least
    eight chunks where the matrix has the tiles (so that threads share a small matrix too)."""
    return max(1, min(_PREFILL_ROWS // NT, -(-nt // 8)))


def _prefill_part(cf, w: PackedMatrix, x: np.ndarray, out: np.ndarray, t0: int, t1: int) -> None:
    """Tiles t0..t1 of the prefill product (t0 on a chunk boundary): dequantise a chunk of _prefill_step tiles,
    then x @ chunk (BLAS). The cfunc is called through ctypes and numpy's matmul runs in C: both release the GIL."""
    nt, nb = int(w.dims[0]), int(w.dims[1])
    Kp = w.perm.shape[0]
    step = _prefill_step(nt)
    buf = np.empty((Kp, min(step, t1 - t0) * NT), np.float32)
    ptrs = [a.ctypes.data for a in w.flat]
    for g0 in range(t0, t1, step):
        g1 = min(g0 + step, t1)
        cf.ctypes(*ptrs, nt, nb, w.perm.ctypes.data, 0, Kp, g0, g1, buf.ctypes.data, buf.shape[1])
        n0, n1 = g0 * NT, min(g1 * NT, w.n_rows)
        np.matmul(x, buf[: w.n_cols, : n1 - n0], out=out[:, n0:n1])


_POOL: list = [None, 0]


def _pool(n: int):
    """Worker threads for the prefill path (BLAS is kept single-threaded, see _limit_blas)."""
    if _POOL[1] < n:
        _POOL[0] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="guild-prefill")
        _POOL[1] = n
    return _POOL[0]


def _limit_blas() -> None:
    """One BLAS thread: OpenBLAS's own threads spin after each call and, on a machine with as many threads as
    cores, stall the next Numba parallel region by a scheduler slice."""
    threadpool_limits(1, user_api="blas")


_limit_blas()


def dequantize_rows(w: PackedMatrix, rows: np.ndarray, out: np.ndarray) -> None:
    """out[r] = W[rows[r]] as float32 (embedding lookup), bit-exact with gguf.quants.dequantize."""
    rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
    if out.shape != (rows.size, w.n_cols):
        raise ValueError(f"dequantize_rows: out is {tuple(out.shape)}, want ({rows.size}, {w.n_cols})")
    if rows.size and (rows.min() < 0 or rows.max() >= w.n_rows):
        raise IndexError(f"row index out of range for a matrix of {w.n_rows} rows")
    dst = out if out.flags.c_contiguous and out.dtype == np.float32 else np.empty((rows.size, w.n_cols), np.float32)
    _get_rows(w, rows, dst)
    if dst is not out:
        out[...] = dst


def _get_rows(w: PackedMatrix, rows: np.ndarray, out: np.ndarray) -> None:
    if w.numerics == "i8":
        qdot.get_rows(w.qtype, w.arrays, rows, out)
    else:
        _ROWS[w.qtype](*w.arrays, rows, out)


def dequantize(w: PackedMatrix) -> np.ndarray:
    """The whole matrix as float32 [N, K] (tests / reference)."""
    out = np.empty((w.n_rows, w.n_cols), np.float32)
    _get_rows(w, np.arange(w.n_rows, dtype=np.int64), out)
    return out
