"""The host's instruction sets (chosen once at import, like the rest of Numba's code generation) and the
16-lane vector type that the intrinsics of kernels/cpu/simd pass between them, with their IR helpers."""

from __future__ import annotations

import os

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core.datamodel import models
from numba.extending import intrinsic, register_model


def _host_features() -> str:
    try:
        return llvm.get_host_cpu_features().flatten()
    except Exception:  # pragma: no cover - feature query unavailable
        return ""


def _host_cpu() -> str:
    try:
        return llvm.get_host_cpu_name()
    except Exception:  # pragma: no cover - name query unavailable
        return ""


# AMD Zen 4 (LLVM's znver4): its stream prefetchers want no help on streamed weights (kernels/cpu/qdot/kernels.py);
# Zen 3 and earlier, Zen 5 and Intel cores read them faster with software prefetch
def zen4(cpu: str) -> bool:
    """Whether an LLVM host CPU name is an AMD Zen 4 (znver4)."""
    return cpu == "znver4"


ZEN4 = zen4(_host_cpu())

# GUILD_NO_VNNI=1 forces the portable IR (tests compare the two on a VNNI host)
VNNI512 = ("+avx512vnni" in _host_features() and "+avx512bw" in _host_features()
           and os.environ.get("GUILD_NO_VNNI", "") in ("", "0"))

# AVX2's vpmaddubsw + vpmaddwd where the host lacks VNNI (GUILD_NO_AVX2=1: the portable IR instead)
AVX2 = "+avx2" in _host_features() and os.environ.get("GUILD_NO_AVX2", "") in ("", "0")
# vpshufb over 512 bits for the 16-entry byte tables (gather.lookup16)
AVX512BW = "+avx512bw" in _host_features() and os.environ.get("GUILD_NO_VNNI", "") in ("", "0")


class Vec(types.Type):
    """A 16-lane SIMD value: kind 'i32' or 'f32'."""

    def __init__(self, kind: str):
        self.kind = kind
        super().__init__(name=f"vec16_{kind}")


I32 = Vec("i32")
F32 = Vec("f32")
_i32 = ir.IntType(32)
_VI = ir.VectorType(_i32, 16)
_VF = ir.VectorType(ir.FloatType(), 16)
_b8x32 = ir.VectorType(ir.IntType(8), 32)
_i16x16 = ir.VectorType(ir.IntType(16), 16)
_i32x8 = ir.VectorType(_i32, 8)


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VI if fe_type.kind == "i32" else _VF)


def _at(builder, addr, ty):
    return builder.inttoptr(addr, ty.as_pointer())


def _splat(builder, val, vt):
    undef = ir.Constant(vt, None)
    v = builder.insert_element(undef, val, ir.Constant(_i32, 0))
    return builder.shuffle_vector(v, undef, ir.Constant(_VI, [0] * 16))


def _simple(sig, body):
    """An intrinsic of fixed signature whose codegen is body(builder, args)."""

    def typer(typingctx, *args):
        return sig, lambda context, builder, s, a: body(builder, a)

    return typer


@intrinsic
def inline_here(typingctx):
    """Marks the calling function `alwaysinline` for LLVM: helpers stay separate Numba functions (Numba's own
    inliner copies their IR at every call site and made the kernels compile ten times slower) yet are inlined
    into the kernel, where their vectors stay in registers."""

    def body(b, a):
        b.function.attributes.add("alwaysinline")
        return ir.Constant(ir.IntType(8), 0)

    return _simple(types.uint8(), body)(typingctx)
