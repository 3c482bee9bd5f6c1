"""One record per GGUF tensor type: everything guild's kernels know of a type, validated where it is declared.

A `QuantType` holds the type's block facts (elements and bytes per block, sizeof(block_*) in ggml-common.h, and
the byte offsets of its f16 scale fields: d, then dmin where the type has one; none for the float types, MXFP4's
E8M0 exponent and IQ1_M's d spread over its scale words), its CPU kernels per numerics and its GPU kernels:
- `f32`: the codec of the fp32 dequant-dot path (kernels/cpu/codecs.py: packed fields as byte ranges of the
  block or decoded scales, and the decode), from which kernels/cpu/gen_quant.py writes the kernel `_k_<name>`
  and get_rows `_r_<name>` (kernels/cpu/quant_gen.py); every type the CPU runs has one;
- `i8`: the packed fields (name, role, dtype) of the int8 path (kernels/cpu/qdot/: roles in qdot/types.py),
  whose pack, get_rows and kernel `_k_<name>` are qdot's; () where the type has none (numerics "f32" only);
- `gpu`: the suffix of its kernels in kernels/cuda/quant.cu (`*_<gpu>`), or None.

Every per-type table derives from QUANT_TYPES: BLOCK, F16_SCALES, `row_bytes` and `act_block` (here), the
generated kernels (kernels/cpu/gen_quant.py), the CPU dispatch by (type, numerics) (kernels/cpu/quant.py), the
int8 layout and entry points (kernels/cpu/qdot/), the CUDA dispatch (kernels/cuda/ops.py), the validator's
finite-scale scan, the random test blocks, the tiny-model writer and the kernel benchmark. The NumPy twin
(kernels/ref_quant.py `dequantize`) decodes each type from ggml's layouts on its own: an oracle derived from
these records would not check them. Layouts: ggml-common.h block_*, arithmetic: ggml-quants.c dequantize_row_*.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from .blocks import QK, QK_K
from .cpu.codecs import (
    CTYPES,
    HALVES,
    IQ1M_D,
    IQ2_16,
    K_SCALES,
    NIB,
    OCT,
    Q3K_SCALE,
    Codec,
    blk8,
    f16_at,
    grid8,
    grid44,
    iq1,
    iq2_scale,
    iq4xs_sc,
    k_mn,
    k_sc,
)

U8, I8, U16, U32 = np.uint8, np.int8, np.uint16, np.uint32
# the int8 path's field roles (shapes in kernels/cpu/qdot/types.py): nibble and byte quads, bit-plane words,
# bytes, f16 per block or per 256, grid index bytes per 8 or per 4 elements
I8_ROLES = ("q4", "q8", "w", "w2", "b2", "b", "h", "hs", "g4", "g8")


@dataclass(frozen=True)
class QuantType:
    qtype: Q
    block: int  # elements per block
    nbytes: int  # bytes per block
    f16: tuple[int, ...] = ()  # byte offsets of the f16 scale fields in a block
    f32: Codec | None = None  # the fp32 path's codec: None, no CPU kernel
    i8: tuple = ()  # the int8 path's packed fields (name, role, dtype): (), numerics "f32" only
    gpu: str | None = None  # the kernels/cuda/quant.cu suffix: None, no GPU kernel

    def __post_init__(self):
        def bad(why: str):
            raise ValueError(f"{self.qtype.name}: {why}")

        if self.block < 1 or self.nbytes < 1 or any(not 0 <= o <= self.nbytes - 2 for o in self.f16):
            bad(f"bad block facts (block {self.block}, {self.nbytes} bytes, f16 at {self.f16})")
        c = self.f32
        if c is not None:
            end = 32 * self.nbytes if c.padded else self.nbytes  # float types: blocks of 32 elements
            for name, ct, _, src in c.fields:
                if ct not in CTYPES or not (callable(src) or 0 <= src[0] < src[1] <= end):
                    bad(f"codec field {name!r}: ctype {ct!r}, bytes {src} (a block has {end})")
            if self.f32_block % self.f32_unit:
                bad(f"codec units of {self.f32_unit} do not tile a block of {self.f32_block}")
        if self.i8:
            if c is None:
                bad("an int8 path needs an fp32 codec too (numerics 'f32')")
            if self.block not in (QK, QK_K):
                bad(f"the int8 path takes blocks of {QK} or {QK_K} elements, not {self.block}")
            names = [f[0] for f in self.i8]
            if len(set(names)) != len(names) or any(
                    r not in I8_ROLES or np.dtype(dt) not in (U8, I8, U16, U32) for _, r, dt in self.i8):
                bad(f"int8 fields {self.i8}: unique names, roles of {I8_ROLES}, u8/i8/u16/u32 dtypes")
        if self.gpu is not None and not re.fullmatch(r"[a-z0-9_]+", self.gpu):
            bad(f"GPU kernel suffix {self.gpu!r}")

    @property
    def name(self) -> str:
        return self.qtype.name.lower()

    @property
    def numerics(self) -> tuple[str, ...]:
        """The CPU numeric modes with a kernel for this type."""
        return (("i8",) if self.i8 else ()) + (("f32",) if self.f32 else ())

    @property
    def f32_block(self) -> int:
        """Elements per block of the fp32 codec (the float types: 32, the rows zero-padded)."""
        return 32 if self.f32.padded else self.block

    @property
    def f32_unit(self) -> int:
        """Elements per unit that the fp32 kernel dequantises at a time (T >= 3)."""
        return self.f32_block // (self.f32.units[1] if self.f32.units else 1)


QUANT_TYPES = {t.qtype: t for t in (
    QuantType(
        Q.F32, 1, 4,
        f32=Codec(
            (("w", "f32", (32,), (0, 128)),),
            (),
            ("u", 32),
            ("{j}",),
            ("w[g, b, {j}, n]",),
            fused=False,
            padded=True,
            direct=True,
        ),
        gpu="f32",
    ),
    QuantType(
        Q.F16, 1, 2,
        f32=Codec(
            (("w", "u16", (32,), (0, 64)),),
            (),
            ("u", 32),
            ("{j}",),
            ("h2f(w[g, b, {j}, n])",),
            fused=False,
            padded=True,
        ),
        gpu="f16",
    ),
    QuantType(
        Q.BF16, 1, 2,
        f32=Codec(
            (("w", "u16", (32,), (0, 64)),),
            (),
            ("u", 32),
            ("{j}",),
            ("bf2f(w[g, b, {j}, n])",),
            fused=False,
            padded=True,
        ),
        gpu="bf16",
    ),
    # block_q8_0 {d; qs[32]} (dequantize_row_q8_0)
    QuantType(
        Q.Q8_0, 32, 34, (0,),
        f32=Codec(
            (("qs", "i8", (32,), (2, 34)), ("d",) + f16_at(0)),
            (),
            ("u", 32),
            ("{j}",),
            ("i2f(qs[g, b, {j}, n]) * dd",),
            per_n=("dd = h2f(d[g, b, n])",),
            t1=8,
            t2=4,
        ),
        i8=(("qs", "q8", U8), ("d", "h", U16)),
        gpu="q8_0",
    ),
    # block_q4_0 {d; qs[16]} (dequantize_row_q4_0)
    QuantType(
        Q.Q4_0, 32, 18, (0,),
        f32=Codec(
            (("qs", "u8", (16,), (2, 18)), ("d",) + f16_at(0)),
            (),
            ("j", 16),
            NIB,
            ("dd * i2f((q{i} & 15) - 8)", "dd * i2f((q{i} >> 4) - 8)"),
            per_n=("dd = h2f(d[g, b, n])",),
            loads=("q{i} = qs[g, b, {j}, n]",),
            t1=4,
        ),
        i8=(("qs", "q4", U8), ("d", "h", U16)),
        gpu="q4_0",
    ),
    # block_q4_1 {d; m; qs[16]} (dequantize_row_q4_1: x*d + m, rounded twice)
    QuantType(
        Q.Q4_1, 32, 20, (0, 2),
        f32=Codec(
            (("qs", "u8", (16,), (4, 20)), ("d",) + f16_at(0), ("m",) + f16_at(2)),
            (),
            ("j", 16),
            NIB,
            ("fma32(i2f(q{i} & 15), dd, mm)", "fma32(i2f(q{i} >> 4), dd, mm)"),
            exact=("dd * i2f(q{i} & 15) + mm", "dd * i2f(q{i} >> 4) + mm"),
            per_n=("dd = h2f(d[g, b, n])", "mm = h2f(m[g, b, n])"),
            loads=("q{i} = qs[g, b, {j}, n]",),
            t1=4,
        ),
        i8=(("qs", "q4", U8), ("d", "h", U16), ("m", "h", U16)),
        gpu="q4_1",
    ),
    # block_q5_0 {d; qh[4]; qs[16]} (dequantize_row_q5_0): bit j of qh → 5th bit of element j
    QuantType(
        Q.Q5_0, 32, 22, (0,),
        f32=Codec(
            (("qs", "u8", (16,), (6, 22)), ("qh", "u32", (), (2, 6)), ("d",) + f16_at(0)),
            (),
            ("j", 16),
            NIB,
            ("dd * q5f(q{i}, 0, h, {j}, 1, 16)", "dd * q5f(q{i}, 4, h, {j} + 16, 1, 16)"),
            per_n=("dd = h2f(d[g, b, n])", "h = qh[g, b, n]"),
            loads=("q{i} = qs[g, b, {j}, n]",),
            t1=4,
        ),
        i8=(("qs", "q4", U8), ("qh", "w", U32), ("d", "h", U16)),
        gpu="q5_0",
    ),
    # block_q4_K {d; dmin; scales[12]; qs[128]} (dequantize_row_q4_K, get_scale_min_k4): unit = 64 elements,
    # byte j of pair i: low nibble → element 64i + j (sub-block 2i), high → 64i + 32 + j (sub-block 2i + 1)
    QuantType(
        Q.Q4_K, 256, 144, (0, 2),
        f32=Codec(
            (
                ("qs", "u8", (4, 32), (16, 144)),
                ("d",) + f16_at(0),
                ("dmin",) + f16_at(2),
                ("sc", "u8", (8,), k_sc),
                ("mn", "u8", (8,), k_mn),
            ),
            ("i", 4),
            ("j", 32),
            ("{j}", "32 + {j}"),
            ("fma32(i2f(q{i} & 15), dl, ml)", "fma32(i2f(q{i} >> 4), dh, mh)"),
            exact=("dl * i2f(q{i} & 15) + ml", "dh * i2f(q{i} >> 4) + mh"),
            per_n=("dl = sd[2 * i, n]", "ml = sm[2 * i, n]", "dh = sd[2 * i + 1, n]", "mh = sm[2 * i + 1, n]"),
            loads=("q{i} = qs[g, b, i, {j}, n]",),
            scales=K_SCALES,
        ),
        i8=(("qs", "q4", U8), ("sm", "b2", U8), ("d", "hs", U16), ("dmin", "hs", U16)),
        gpu="q4_k",
    ),
    # block_q5_K {d; dmin; scales[12]; qh[32]; qs[128]} (dequantize_row_q5_K): bit s of qh[j] → 5th bit of
    # element 32s + j
    QuantType(
        Q.Q5_K, 256, 176, (0, 2),
        f32=Codec(
            (
                ("qs", "u8", (4, 32), (48, 176)),
                ("qh", "u8", (32,), (16, 48)),
                ("d",) + f16_at(0),
                ("dmin",) + f16_at(2),
                ("sc", "u8", (8,), k_sc),
                ("mn", "u8", (8,), k_mn),
            ),
            ("i", 4),
            ("j", 32),
            ("{j}", "32 + {j}"),
            ("fma32(q5f(q{i}, 0, h{i}, 2 * i, 1, 0), dl, ml)", "fma32(q5f(q{i}, 4, h{i}, 2 * i + 1, 1, 0), dh, mh)"),
            exact=("dl * q5f(q{i}, 0, h{i}, 2 * i, 1, 0) + ml", "dh * q5f(q{i}, 4, h{i}, 2 * i + 1, 1, 0) + mh"),
            per_n=("dl = sd[2 * i, n]", "ml = sm[2 * i, n]", "dh = sd[2 * i + 1, n]", "mh = sm[2 * i + 1, n]"),
            loads=("q{i} = qs[g, b, i, {j}, n]", "h{i} = qh[g, b, {j}, n]"),
            scales=K_SCALES,
        ),
        i8=(("qs", "q4", U8), ("qh", "w", U32), ("sm", "b2", U8), ("d", "hs", U16), ("dmin", "hs", U16)),
        gpu="q5_k",
    ),
    # block_q6_K {ql[128]; qh[64]; scales[16]; d} (dequantize_row_q6_K): unit = half hf (128 elements); step l
    # yields elements l, l + 32, l + 64, l + 96 from ql[l], ql[l + 32] (low, then high nibbles) and qh[l]
    QuantType(
        Q.Q6_K, 256, 210, (208,),
        f32=Codec(
            (
                ("ql", "u8", (2, 64), (0, 128)),
                ("qh", "u8", (2, 32), (128, 192)),
                ("sc", "i8", (16,), (192, 208)),
                ("d",) + f16_at(208),
            ),
            ("hf", 2),
            ("ll", 32),
            ("{j}", "32 + {j}", "64 + {j}", "96 + {j}"),
            (
                "sd[s{i}, n] * q5f(q{i}, 0, h{i}, 0, 3, 32)",
                "sd[s{i} + 2, n] * q5f(r{i}, 0, h{i}, 2, 3, 32)",
                "sd[s{i} + 4, n] * q5f(q{i}, 4, h{i}, 4, 3, 32)",
                "sd[s{i} + 6, n] * q5f(r{i}, 4, h{i}, 6, 3, 32)",
            ),
            loads=("q{i} = ql[g, b, hf, {j}, n]", "r{i} = ql[g, b, hf, {j} + 32, n]", "h{i} = qh[g, b, hf, {j}, n]"),
            per_step=("s{i} = hf * 8 + ({j}) // 16",),
            scales=(("sd", 16, "h2f(d[g, b, n]) * i2f(sc[g, b, c, n])"),),
            t1=1,
            t2=1,
        ),
        i8=(("qs", "q4", U8), ("qh", "w2", U32), ("sc", "b2", I8), ("d", "hs", U16)),
        gpu="q6_k",
    ),
    # block_iq4_nl {d; qs[16]} (dequantize_row_iq4_nl): kvalues_iq4nl[nibble] * d
    QuantType(
        Q.IQ4_NL, 32, 18, (0,),
        f32=Codec(
            (("qs", "u8", (16,), (2, 18)), ("d",) + f16_at(0)),
            (),
            ("j", 16),
            NIB,
            ("dd * kvf(q{i} & 15)", "dd * kvf(q{i} >> 4)"),
            per_n=("dd = h2f(d[g, b, n])",),
            loads=("q{i} = qs[g, b, {j}, n]",),
            t1=4,
        ),
        i8=(("qs", "q4", U8), ("d", "h", U16)),
        gpu="iq4_nl",
    ),
    # block_iq4_xs {d; scales_h; scales_l[4]; qs[128]} (dequantize_row_iq4_xs): unit = sub-block s (32)
    QuantType(
        Q.IQ4_XS, 256, 136, (0,),
        f32=Codec(
            (("qs", "u8", (8, 16), (8, 136)), ("sc", "i8", (8,), iq4xs_sc), ("d",) + f16_at(0)),
            ("s", 8),
            ("j", 16),
            NIB,
            ("dl * kvf(q{i} & 15)", "dl * kvf(q{i} >> 4)"),
            per_n=("dl = sd[s, n]",),
            loads=("q{i} = qs[g, b, s, {j}, n]",),
            scales=(("sd", 8, "h2f(d[g, b, n]) * i2f(sc[g, b, c, n])"),),
        ),
        i8=(("qs", "q4", U8), ("ls", "b", I8), ("d", "hs", U16)),
        gpu="iq4_xs",
    ),
    # block_q5_1 {d; m; qh[4]; qs[16]} (dequantize_row_q5_1: x*d + m)
    QuantType(
        Q.Q5_1, 32, 24, (0, 2),
        f32=Codec(
            (("qs", "u8", (16,), (8, 24)), ("qh", "u32", (), (4, 8)), ("d",) + f16_at(0), ("m",) + f16_at(2)),
            (),
            ("j", 16),
            NIB,
            ("fma32(q5f(q{i}, 0, h, {j}, 1, 0), dd, mm)", "fma32(q5f(q{i}, 4, h, {j} + 16, 1, 0), dd, mm)"),
            exact=("q5f(q{i}, 0, h, {j}, 1, 0) * dd + mm", "q5f(q{i}, 4, h, {j} + 16, 1, 0) * dd + mm"),
            per_n=("dd = h2f(d[g, b, n])", "mm = h2f(m[g, b, n])", "h = qh[g, b, n]"),
            loads=("q{i} = qs[g, b, {j}, n]",),
            t1=4,
        ),
        i8=(("qs", "q4", U8), ("qh", "w", U32), ("d", "h", U16), ("m", "h", U16)),
        gpu="q5_1",
    ),
    # block_q2_K {scales[16]; qs[64]; d; dmin} (dequantize_row_q2_K): half hf, byte l, shift 2s → element
    # 128hf + 32s + l of sub-block 8hf + 2s + l // 16 (4-bit scale, 4-bit min)
    QuantType(
        Q.Q2_K, 256, 84, (80, 82),
        f32=Codec(
            (("sc", "u8", (16,), (0, 16)), ("qs", "u8", (2, 32), (16, 80)), ("d",) + f16_at(80),
             ("dmin",) + f16_at(82)),
            ("hf", 2),
            ("ll", 32),
            HALVES,
            tuple(
                f"fma32(i2f((q{{i}} >> {2 * s}) & 3), sd[s{{i}} + {2 * s}, n], sm[s{{i}} + {2 * s}, n])"
                for s in range(4)
            ),
            exact=tuple(
                f"sd[s{{i}} + {2 * s}, n] * i2f((q{{i}} >> {2 * s}) & 3) + sm[s{{i}} + {2 * s}, n]" for s in range(4)
            ),
            loads=("q{i} = qs[g, b, hf, {j}, n]",),
            per_step=("s{i} = hf * 8 + ({j}) // 16",),
            scales=(
                ("sd", 16, "h2f(d[g, b, n]) * i2f(sc[g, b, c, n] & 15)"),
                ("sm", 16, "-(h2f(dmin[g, b, n]) * i2f(sc[g, b, c, n] >> 4))"),
            ),
            t1=1,
            t2=1,
        ),
        i8=(("q2", "w2", U32), ("sm", "b2", U8), ("d", "hs", U16), ("dmin", "hs", U16)),
        gpu="q2_k",
    ),
    # block_q3_K {hmask[32]; qs[64]; scales[12]; d} (dequantize_row_q3_K): as Q2_K, minus 4 unless bit 4hf + s
    # of hmask[l] is set; 6-bit signed scales
    QuantType(
        Q.Q3_K, 256, 110, (108,),
        f32=Codec(
            (
                ("hm", "u8", (32,), (0, 32)),
                ("qs", "u8", (2, 32), (32, 96)),
                ("sc", "u8", (12,), (96, 108)),
                ("d",) + f16_at(108),
            ),
            ("hf", 2),
            ("ll", 32),
            HALVES,
            tuple(
                f"sd[s{{i}} + {2 * s}, n] * i2f(((q{{i}} >> {2 * s}) & 3) + 4 * ((h{{i}} >> (4 * hf + {s})) & 1) - 4)"
                for s in range(4)
            ),
            loads=("q{i} = qs[g, b, hf, {j}, n]", "h{i} = hm[g, b, {j}, n]"),
            per_step=("s{i} = hf * 8 + ({j}) // 16",),
            scales=(("sd", 16, Q3K_SCALE),),
            t1=1,
            t2=1,
        ),
        i8=(("q2", "w2", U32), ("qh", "w", U32), ("sc", "b2", I8), ("d", "hs", U16)),
        gpu="q3_k",
    ),
    # block_mxfp4 {e; qs[16]} (dequantize_row_mxfp4: kvalues_mxfp4[nibble] * e8m0_half(e))
    QuantType(
        Q.MXFP4, 32, 17,
        f32=Codec(
            (("qs", "u8", (16,), (1, 17)), ("e", "u8", (), (0, 1))),
            (),
            ("j", 16),
            NIB,
            ("mxf(q{i} & 15) * dd", "mxf(q{i} >> 4) * dd"),
            per_n=("dd = e8m0h(e[g, b, n])",),
            loads=("q{i} = qs[g, b, {j}, n]",),
            t1=4,
        ),
        i8=(("qs", "q4", U8), ("e", "b", U8)),
        gpu="mxfp4",
    ),
    # block_iq2_xxs {d; qs[32] u16}: per 32 elements 4 grid bytes, then a u32 of 4 x 7 sign bits + 4-bit scale
    QuantType(
        Q.IQ2_XXS, 256, 66, (0,),
        f32=Codec(
            (("gi", "u8", (8, 4), blk8(2, 66, 0, 4)), ("sg", "u32", (8,), blk8(2, 66, 4, 8, np.uint32)),
             ("d",) + f16_at(0)),
            ("s", 8),
            ("l", 4),
            OCT,
            grid8("sd[s, n]"),
            loads=("ge{i} = IQ2XXS_GRID[gi[g, b, s, {j}, n]]", "k{i} = KSIGNS[(sg[g, b, s, n] >> (7 * ({j}))) & 127]"),
            scales=(("sd", 8, iq2_scale("0.25", "sg[g, b, c, n] >> 28")),),
            t1=1,
            t2=1,
        ),
        i8=(("gi", "g4", U8), ("sg", "w", U32), ("sc", "b", U8), ("d", "hs", U16)),
        gpu="iq2_xxs",
    ),
    # block_iq2_xs {d; qs[32] u16 (9-bit grid index | 7-bit sign index); scales[8]}
    QuantType(
        Q.IQ2_XS, 256, 74, (0,),
        f32=Codec(
            (("qs", "u16", (8, 4), (2, 66)), ("sc", "u8", (8,), (66, 74)), ("d",) + f16_at(0)),
            ("s", 8),
            ("l", 4),
            OCT,
            grid8("sd[2 * s + ({j}) // 2, n]"),
            loads=("q{i} = qs[g, b, s, {j}, n]", "ge{i} = IQ2XS_GRID[q{i} & 511]", "k{i} = KSIGNS[q{i} >> 9]"),
            scales=(("sd", 16, IQ2_16),),
            t1=1,
            t2=1,
        ),
        i8=(("gi", "g4", U8), ("sg", "w", U32), ("sc", "b", U8), ("d", "hs", U16), ("gh", "b", U8)),
        gpu="iq2_xs",
    ),
    # block_iq2_s {d; qs[32] grid bytes; signs[32]; qh[8] (2 high index bits per 8 elements); scales[8]}
    QuantType(
        Q.IQ2_S, 256, 82, (0,),
        f32=Codec(
            (
                ("qs", "u8", (8, 4), (2, 34)),
                ("sn", "u8", (8, 4), (34, 66)),
                ("qh", "u8", (8,), (66, 74)),
                ("sc", "u8", (8,), (74, 82)),
                ("d",) + f16_at(0),
            ),
            ("s", 8),
            ("l", 4),
            OCT,
            grid8("sd[2 * s + ({j}) // 2, n]"),
            loads=(
                "ge{i} = IQ2S_GRID[qs[g, b, s, {j}, n] | ((qh[g, b, s, n] << (8 - 2 * ({j}))) & 0x300)]",
                "k{i} = sn[g, b, s, {j}, n]",
            ),
            scales=(("sd", 16, IQ2_16),),
            t1=1,
            t2=1,
        ),
        i8=(("gi", "g4", U8), ("sg", "w", U32), ("sc", "b", U8), ("d", "hs", U16), ("gh", "b", U8)),
        gpu="iq2_s",
    ),
    # block_iq3_xxs {d; qs[64] grid bytes; 8 u32 (4 x 7 sign bits + 4-bit scale)}: 2 grid entries per 8
    QuantType(
        Q.IQ3_XXS, 256, 98, (0,),
        f32=Codec(
            (("qs", "u8", (8, 8), (2, 66)), ("ss", "u32", (8,), (66, 98)), ("d",) + f16_at(0)),
            ("s", 8),
            ("l", 4),
            OCT,
            grid44(),
            loads=(
                "ge{i} = IQ3XXS_GRID[qs[g, b, s, 2 * ({j}), n]]",
                "gr{i} = IQ3XXS_GRID[qs[g, b, s, 2 * ({j}) + 1, n]]",
                "k{i} = KSIGNS[(ss[g, b, s, n] >> (7 * ({j}))) & 127]",
            ),
            scales=(("sd", 8, iq2_scale("0.5", "ss[g, b, c, n] >> 28")),),
            t1=1,
            t2=1,
        ),
        i8=(("gi", "g8", U8), ("sg", "w", U32), ("sc", "b", U8), ("d", "hs", U16)),
        gpu="iq3_xxs",
    ),
    # block_iq3_s {d; qs[64]; qh[8] (9th index bit of each grid entry); signs[32]; scales[4]}: odd scales
    QuantType(
        Q.IQ3_S, 256, 110, (0,),
        f32=Codec(
            (
                ("qs", "u8", (8, 8), (2, 66)),
                ("qh", "u8", (8,), (66, 74)),
                ("sn", "u8", (8, 4), (74, 106)),
                ("sc", "u8", (4,), (106, 110)),
                ("d",) + f16_at(0),
            ),
            ("s", 8),
            ("l", 4),
            OCT,
            grid44(),
            loads=(
                "ge{i} = IQ3S_GRID[qs[g, b, s, 2 * ({j}), n] | ((qh[g, b, s, n] << (8 - 2 * ({j}))) & 256)]",
                "gr{i} = IQ3S_GRID[qs[g, b, s, 2 * ({j}) + 1, n] | ((qh[g, b, s, n] << (7 - 2 * ({j}))) & 256)]",
                "k{i} = sn[g, b, s, {j}, n]",
            ),
            scales=(("sd", 8, "h2f(d[g, b, n]) * i2f(1 + 2 * ((sc[g, b, c // 2, n] >> (4 * (c % 2))) & 15))"),),
            t1=1,
            t2=1,
        ),
        i8=(("gi", "g8", U8), ("sg", "w", U32), ("sc", "b", U8), ("d", "hs", U16), ("gh", "b", U8)),
        gpu="iq3_s",
    ),
    # block_iq1_s {d; qs[32]; qh[8] u16 (3 index bits per 8, 3-bit scale, delta sign)}: dl * (grid + delta)
    QuantType(
        Q.IQ1_S, 256, 50, (0,),
        f32=Codec(
            (("qs", "u8", (8, 4), (2, 34)), ("qh", "u16", (8,), (34, 50)), ("d",) + f16_at(0)),
            ("s", 8),
            ("l", 4),
            OCT,
            iq1("sd[s, n]", "sm[s, n]"),
            loads=("q{i} = qs[g, b, s, {j}, n] | (((qh[g, b, s, n] >> (3 * ({j}))) & 7) << 8)",),
            scales=(
                ("sd", 8, "h2f(d[g, b, n]) * i2f(2 * ((qh[g, b, c, n] >> 12) & 7) + 1)"),
                ("sm", 8, "-DELTA if qh[g, b, c, n] & 0x8000 else DELTA"),
            ),
            t1=1,
            t2=1,
        ),
        i8=(("gi", "g4", U8), ("qh", "h", U16), ("d", "hs", U16)),  # qh: the GGUF's u16
        gpu="iq1_s",
    ),
    # block_iq1_m {qs[32]; qh[16] (3 index bits + delta sign per 8); scales[8] (3-bit scales per 16, and d)}
    QuantType(
        Q.IQ1_M, 256, 56,
        f32=Codec(
            (("qs", "u8", (8, 4), (0, 32)), ("qh", "u8", (8, 2), (32, 48)), ("sc", "u16", (4,), (48, 56))),
            ("s", 8),
            ("l", 4),
            OCT,
            iq1("sd[2 * s + ({j}) // 2, n]", "(-DELTA if h{i} & 8 else DELTA)"),
            loads=(
                "h{i} = qh[g, b, s, ({j}) // 2, n] >> (4 * (({j}) % 2))",
                "q{i} = qs[g, b, s, {j}, n] | ((h{i} & 7) << 8)",
            ),
            scales=(("sd", 16, IQ1M_D + " * i2f(2 * ((sc[g, b, c // 4, n] >> (3 * (c % 4))) & 7) + 1)"),),
            t1=1,
            t2=1,
        ),
        # qh: the GGUF's two bytes (per 8: 3 index bits, the delta's sign); sc: the two 3-bit scales in a byte
        i8=(("gi", "g4", U8), ("qh", "b2", U8), ("sc", "b", U8), ("d", "hs", U16)),
        gpu="iq1_m",
    ),
)}
BLOCK = {q: (t.block, t.nbytes) for q, t in QUANT_TYPES.items()}  # (elements, bytes) per block
F16_SCALES = {q: t.f16 for q, t in QUANT_TYPES.items() if t.block > 1}  # the quantised types' f16 fields


def row_bytes(qtype: int, n_cols: int) -> int:
    bs, ts = BLOCK[Q(qtype)]
    if n_cols % bs:
        raise ValueError(f"{Q(qtype).name}: row length {n_cols} is not a multiple of {bs}")
    return n_cols // bs * ts


def act_block(qtype: int) -> int:
    """Elements per activation scale on the int8 path for weights of this type: QK_K for the super-block types
    (ggml's Q8_K vec_dot type), else QK (Q8_0's)."""
    return QK_K if BLOCK[Q(int(qtype))][0] == QK_K else QK
