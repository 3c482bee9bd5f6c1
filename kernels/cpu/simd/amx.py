"""Intel AMX tile intrinsics (Sapphire Rapids and later): the tile configuration, loads and stores of tiles at
int64 addresses, and the int8 tile product tdpbsud (signed rows of A times unsigned columns of B, four bytes a
step, summed into int32: exact). Tile registers are literal numbers, as the instructions take them.

AMX is used where the host has AMX-INT8 and Linux grants the process its tile state (arch_prctl
ARCH_REQ_XCOMP_PERM, asked once at import); GUILD_NO_AMX=1 turns it off (tests compare the two paths)."""

from __future__ import annotations

import ctypes
import os

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .isa import _host_features

_I8 = ir.IntType(8)
_I64 = ir.IntType(64)
_P8 = _I8.as_pointer()

_SYS_ARCH_PRCTL = 158  # x86-64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def _tile_state_granted() -> bool:
    """Ask Linux for the AMX tile data state (without it the first tile instruction faults)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):  # pragma: no cover - not Linux / no syscall
        return False


def _amx_wanted(features: str, env: str) -> bool:
    return "+amx-int8" in features and "+amx-tile" in features and env in ("", "0")


AMX = _amx_wanted(_host_features(), os.environ.get("GUILD_NO_AMX", "").strip()) and _tile_state_granted()

@njit(cache=True)
def tile_shape(cfg, t, rows, colsb):
    """Tile register t of the palette-1 configuration cfg (64 bytes, zeroed first) ← rows x colsb bytes."""
    cfg[0] = 1
    cfg[16 + 2 * t] = colsb  # a little-endian u16 (colsb ≤ 64)
    cfg[48 + t] = rows


def _void(builder, name: str, args: list):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), args), name)


def _tile(t) -> ir.Constant:
    """A tile register's number (the typers accept only literal integers) as the instructions' immediate."""
    return ir.Constant(_I8, t.literal_value)


@intrinsic
def tile_load_config(typingctx, addr):
    """ldtilecfg from the 64 bytes at addr."""

    def codegen(context, builder, signature, args):
        builder.call(_void(builder, "llvm.x86.ldtilecfg", [_P8]), [builder.inttoptr(args[0], _P8)])
        return context.get_dummy_value()

    return types.none(types.int64), codegen


@intrinsic
def tile_release(typingctx):
    """tilerelease: the tile state back to its initial (unused) form."""

    def codegen(context, builder, signature, args):
        builder.call(_void(builder, "llvm.x86.tilerelease", []), [])
        return context.get_dummy_value()

    return types.none(), codegen


@intrinsic(prefer_literal=True)
def tile_zero(typingctx, t):
    if not isinstance(t, types.IntegerLiteral):
        return None

    def codegen(context, builder, signature, args):
        builder.call(_void(builder, "llvm.x86.tilezero", [_I8]), [_tile(signature.args[0])])
        return context.get_dummy_value()

    return types.none(t), codegen


def _mem(name: str):
    @intrinsic(prefer_literal=True)
    def op(typingctx, t, addr, stride):
        if not isinstance(t, types.IntegerLiteral):
            return None

        def codegen(context, builder, signature, args):
            fn = _void(builder, name, [_I8, _P8, _I64])
            builder.call(fn, [_tile(signature.args[0]), builder.inttoptr(args[1], _P8), args[2]])
            return context.get_dummy_value()

        return types.none(t, types.int64, types.int64), codegen

    return op


tile_load = _mem("llvm.x86.tileloadd64")
"""tile_load(t, addr, stride): tile t's rows from addr, `stride` bytes apart."""
tile_store = _mem("llvm.x86.tilestored64")
"""tile_store(t, addr, stride): tile t's rows to addr, `stride` bytes apart."""


def _dp(name: str):
    @intrinsic(prefer_literal=True)
    def op(typingctx, c, a, b):
        if not all(isinstance(t, types.IntegerLiteral) for t in (c, a, b)):
            return None

        def codegen(context, builder, signature, args):
            builder.call(_void(builder, name, [_I8, _I8, _I8]), [_tile(t) for t in signature.args])
            return context.get_dummy_value()

        return types.none(c, a, b), codegen

    return op


tile_dpbsud = _dp("llvm.x86.tdpbsud")
"""tile_dpbsud(c, a, b): C += A·B over tiles c, a, b, A's rows signed bytes, B's (four bytes of a column per 32-bit
entry) unsigned."""
tile_dpbssd = _dp("llvm.x86.tdpbssd")
"""tile_dpbssd(c, a, b): the same with B's bytes signed."""
