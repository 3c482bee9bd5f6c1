// Quantized matrix x window rows on the GPU: out[t, n] (+)= sum_k W[n, k] * x[t, k], and get_rows (embedding
// lookup). Twins: kernels/ref_quant.py (dequantize, matmul_ref); CPU kernels: kernels/cpu/quant.py.
//
// Weights stay in their GGUF bytes, row-major (row n = n_blocks blocks of the type). A row is read in "units"
// of 8 weights: unit u of a row is dequantised to w[0..7] (fp32, the ref_quant.dequantize arithmetic, so
// get_rows is bit-exact with it), elements 0..3 at columns base..base+3 and 4..7 at base+split..base+split+3
// (nibble types keep low/high nibbles 16 or 32 columns apart).
//
// Row invariance: one warp per output feature; lane l takes units l, l+32, ... and runs one fmaf chain per
// row over them, then a fixed xor butterfly sums the 32 lanes. A block covers WARPS features x ROWS rows
// (blockIdx.y picks the rows); larger windows add blocks along y. No atomics, no split-K across warps, and
// the arithmetic of row t is the same instruction sequence whatever T is: out[t] is bitwise independent of
// the window size and of the other rows.
#include "common.cuh"
#include "grids.cuh"

#define ROWS 8
#define WARPS 4

// ---------------------------------------------------------------------------------------------------------
// per-type units. UNITS_PER_BLOCK * 8 = elements per block.
struct TF32 {
    static constexpr int BYTES = 32, UPB = 1;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const float* p = (const float*)row + 8 * u;
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = p[i];
        base = 8 * u;
        split = 4;
    }
};

struct TF16 {
    static constexpr int BYTES = 16, UPB = 1;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const u16* p = (const u16*)row + 8 * u;
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = h2f(p[i]);
        base = 8 * u;
        split = 4;
    }
};

struct TBF16 {
    static constexpr int BYTES = 16, UPB = 1;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const u16* p = (const u16*)row + 8 * u;
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = bf2f(p[i]);
        base = 8 * u;
        split = 4;
    }
};

// block of 32: d (f16), qs[32] int8
struct TQ8_0 {
    static constexpr int BYTES = 34, UPB = 4;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 2, s = u & 3;
        const u8* blk = row + b * BYTES;
        const float d = h2f(ld_u16(blk));
        const i8* q = (const i8*)(blk + 2 + 8 * s);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = (float)q[i] * d;
        base = 32 * b + 8 * s;
        split = 4;
    }
};

// block of 32: d, qs[16]; element j <- low nibble of byte j, j + 16 <- high nibble; (q - 8) * d
struct TQ4_0 {
    static constexpr int BYTES = 18, UPB = 4;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 2, s = u & 3;
        const u8* blk = row + b * BYTES;
        const float d = h2f(ld_u16(blk));
        const u8* q = blk + 2 + 4 * s;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w[i] = d * (float)((int)(q[i] & 15) - 8);
            w[4 + i] = d * (float)((int)(q[i] >> 4) - 8);
        }
        base = 32 * b + 4 * s;
        split = 16;
    }
};

// block of 32: d, m, qs[16]; d * q + m
struct TQ4_1 {
    static constexpr int BYTES = 20, UPB = 4;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 2, s = u & 3;
        const u8* blk = row + b * BYTES;
        const float d = h2f(ld_u16(blk)), m = h2f(ld_u16(blk + 2));
        const u8* q = blk + 4 + 4 * s;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w[i] = d * (float)(q[i] & 15) + m;
            w[4 + i] = d * (float)(q[i] >> 4) + m;
        }
        base = 32 * b + 4 * s;
        split = 16;
    }
};

// block of 32: d, qh (u32: bit j = 5th bit of element j), qs[16]; (q - 16) * d
struct TQ5_0 {
    static constexpr int BYTES = 22, UPB = 4;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 2, s = u & 3;
        const u8* blk = row + b * BYTES;
        const float d = h2f(ld_u16(blk));
        const u32 qh = ld_u32(blk + 2);
        const u8* q = blk + 6 + 4 * s;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int j = 4 * s + i;
            const int lo = (int)((q[i] & 15) | (((qh >> j) & 1) << 4)) - 16;
            const int hi = (int)((q[i] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            w[i] = d * (float)lo;
            w[4 + i] = d * (float)hi;
        }
        base = 32 * b + 4 * s;
        split = 16;
    }
};

// block of 32: d, qs[16]; d * kvalues[q]
struct TIQ4_NL {
    static constexpr int BYTES = 18, UPB = 4;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 2, s = u & 3;
        const u8* blk = row + b * BYTES;
        const float d = h2f(ld_u16(blk));
        const u8* q = blk + 2 + 4 * s;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w[i] = d * KVALUES_IQ4NL[q[i] & 15];
            w[4 + i] = d * KVALUES_IQ4NL[q[i] >> 4];
        }
        base = 32 * b + 4 * s;
        split = 16;
    }
};

// Q4_K / Q5_K 6-bit scale and min of sub-block j (ggml get_scale_min_k4)
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int& sc, int& mn) {
    if (j < 4) {
        sc = q[j] & 63;
        mn = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// super-block of 256: d, dmin, scales[12], qs[128]; sub-block 2i <- low nibbles of qs[32i..32i+31],
// 2i+1 <- high nibbles; (d * sc) * q - (dmin * mn)
struct TQ4_K {
    static constexpr int BYTES = 144, UPB = 32;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 5, s = u & 31, i4 = s >> 3, r = s & 7;
        const u8* blk = row + b * BYTES;
        const float d = h2f(ld_u16(blk)), dmin = h2f(ld_u16(blk + 2));
        int sc0, mn0, sc1, mn1;
        scale_min_k4(2 * i4, blk + 4, sc0, mn0);
        scale_min_k4(2 * i4 + 1, blk + 4, sc1, mn1);
        const float ds0 = d * (float)sc0, dm0 = dmin * (float)mn0;
        const float ds1 = d * (float)sc1, dm1 = dmin * (float)mn1;
        const u8* q = blk + 16 + 32 * i4 + 4 * r;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w[i] = ds0 * (float)(q[i] & 15) - dm0;
            w[4 + i] = ds1 * (float)(q[i] >> 4) - dm1;
        }
        base = 256 * b + 64 * i4 + 4 * r;
        split = 32;
    }
};

// super-block of 256: d, dmin, scales[12], qh[32] (bit s of qh[j] = 5th bit of element j of sub-block s),
// qs[128] as in Q4_K
struct TQ5_K {
    static constexpr int BYTES = 176, UPB = 32;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 5, s = u & 31, i4 = s >> 3, r = s & 7;
        const u8* blk = row + b * BYTES;
        const float d = h2f(ld_u16(blk)), dmin = h2f(ld_u16(blk + 2));
        int sc0, mn0, sc1, mn1;
        scale_min_k4(2 * i4, blk + 4, sc0, mn0);
        scale_min_k4(2 * i4 + 1, blk + 4, sc1, mn1);
        const float ds0 = d * (float)sc0, dm0 = dmin * (float)mn0;
        const float ds1 = d * (float)sc1, dm1 = dmin * (float)mn1;
        const u8* qh = blk + 16 + 4 * r;
        const u8* q = blk + 48 + 32 * i4 + 4 * r;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int lo = (q[i] & 15) | (((qh[i] >> (2 * i4)) & 1) << 4);
            const int hi = (q[i] >> 4) | (((qh[i] >> (2 * i4 + 1)) & 1) << 4);
            w[i] = ds0 * (float)lo - dm0;
            w[4 + i] = ds1 * (float)hi - dm1;
        }
        base = 256 * b + 64 * i4 + 4 * r;
        split = 32;
    }
};

// super-block of 256: ql[128], qh[64], scales[16] (int8, one per 16 elements), d. Half h (128 elements),
// group g (32), position l: low 4 bits from ql[64h + 32(g&1) + l] (low nibble for g < 2, high for g >= 2),
// high 2 bits (qh[32h + l] >> 2g) & 3; (d * sc) * (q - 32)
struct TQ6_K {
    static constexpr int BYTES = 210, UPB = 32;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 5, s = u & 31, h = s >> 4, g = (s >> 2) & 3, l0 = (s & 3) * 8;
        const u8* blk = row + b * BYTES;
        const float d = h2f(ld_u16(blk + 208));
        const float ds = d * (float)((const i8*)blk)[192 + 8 * h + 2 * g + (l0 >> 4)];
        const u8* ql = blk + 64 * h + 32 * (g & 1) + l0;
        const u8* qh = blk + 128 + 32 * h + l0;
        const int shift = (g >> 1) * 4;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int q = (int)(((ql[i] >> shift) & 15) | (((qh[i] >> (2 * g)) & 3) << 4)) - 32;
            w[i] = ds * (float)q;
        }
        base = 256 * b + 128 * h + 32 * g + l0;
        split = 4;
    }
};

// super-block of 256: d, scales_h (u16), scales_l[4], qs[128]; sub-block ib (32 elements) has the 6-bit
// scale (scales_l nibble | 2 bits of scales_h) - 32 and bytes 16ib..16ib+15 as in IQ4_NL
struct TIQ4_XS {
    static constexpr int BYTES = 136, UPB = 32;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 5, s = u & 31, ib = s >> 2, r = s & 3;
        const u8* blk = row + b * BYTES;
        const float d = h2f(ld_u16(blk));
        const int sh = ld_u16(blk + 2);
        const int ls = (((blk[4 + (ib >> 1)] >> (4 * (ib & 1))) & 15) | (((sh >> (2 * ib)) & 3) << 4)) - 32;
        const float dl = d * (float)ls;
        const u8* q = blk + 8 + 16 * ib + 4 * r;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w[i] = dl * KVALUES_IQ4NL[q[i] & 15];
            w[4 + i] = dl * KVALUES_IQ4NL[q[i] >> 4];
        }
        base = 256 * b + 32 * ib + 4 * r;
        split = 16;
    }
};

// ---------------------------------------------------------------------------------------------------------
// types beyond the first twelve: layouts ggml-common.h block_*, arithmetic ggml-quants.c dequantize_row_*

// block of 32: d, m, qh (u32: bit j = 5th bit of element j), qs[16]; q * d + m (dequantize_row_q5_1)
struct TQ5_1 {
    static constexpr int BYTES = 24, UPB = 4;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 2, s = u & 3;
        const u8* blk = row + b * BYTES;
        const float d = h2f(ld_u16(blk)), m = h2f(ld_u16(blk + 2));
        const u32 qh = ld_u32(blk + 4);
        const u8* q = blk + 8 + 4 * s;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int j = 4 * s + i;
            w[i] = (float)((q[i] & 15) | (((qh >> j) & 1) << 4)) * d + m;
            w[4 + i] = (float)((q[i] >> 4) | (((qh >> (j + 16)) & 1) << 4)) * d + m;
        }
        base = 32 * b + 4 * s;
        split = 16;
    }
};

// Q2_K / Q3_K unit s of a super-block: 8 consecutive elements 128h + 32g + l0.. of sub-block 8h + 2g + l0/16,
// 2 bits at shift 2g of qs[32h + l0 + i]
struct KHalf {
    int h, g, l0, sub;
    __device__ __forceinline__ KHalf(int s) : h(s >> 4), g((s >> 2) & 3), l0((s & 3) * 8) {
        sub = 8 * h + 2 * g + (l0 >> 4);
    }
};

// super-block of 256: scales[16] (4-bit scale | 4-bit min << 4), qs[64], d, dmin (dequantize_row_q2_K)
struct TQ2_K {
    static constexpr int BYTES = 84, UPB = 32;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 5, s = u & 31;
        const KHalf k(s);
        const u8* blk = row + b * BYTES;
        const float d = h2f(ld_u16(blk + 80)), dmin = h2f(ld_u16(blk + 82));
        const u8 sc = blk[k.sub];
        const float dl = d * (float)(sc & 15), ml = dmin * (float)(sc >> 4);
        const u8* q = blk + 16 + 32 * k.h + k.l0;
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = dl * (float)((q[i] >> (2 * k.g)) & 3) - ml;
        base = 256 * b + 8 * s;
        split = 4;
    }
};

// super-block of 256: hmask[32], qs[64], scales[12] (6-bit signed, packed as in dequantize_row_q3_K), d;
// q = 2 low bits - (hmask bit 4h + g of byte l ? 0 : 4)
struct TQ3_K {
    static constexpr int BYTES = 110, UPB = 32;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 5, s = u & 31;
        const KHalf k(s);
        const u8* blk = row + b * BYTES;
        const u8* sc = blk + 96;
        const int c = k.sub;
        const int ls = (((sc[c & 7] >> (4 * (c >> 3))) & 15) | (((sc[8 + (c & 3)] >> (2 * (c >> 2))) & 3) << 4)) - 32;
        const float dl = h2f(ld_u16(blk + 108)) * (float)ls;
        const u8* q = blk + 32 + 32 * k.h + k.l0;
        const u8* hm = blk + k.l0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int lo = (q[i] >> (2 * k.g)) & 3;
            const int hb = (hm[i] >> (4 * k.h + k.g)) & 1;
            w[i] = dl * (float)(lo - (hb ? 0 : 4));
        }
        base = 256 * b + 8 * s;
        split = 4;
    }
};

// block of 32: e (e8m0 exponent), qs[16]; kvalues_mxfp4[nibble] * 2^(e - 128) (dequantize_row_mxfp4)
__device__ __forceinline__ float e8m0_half(u32 e) { return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23); }

struct TMXFP4 {
    static constexpr int BYTES = 17, UPB = 4;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 2, s = u & 3;
        const u8* blk = row + b * BYTES;
        const float d = e8m0_half(blk[0]);
        const u8* q = blk + 1 + 4 * s;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w[i] = KVALUES_MXFP4[q[i] & 15] * d;
            w[4 + i] = KVALUES_MXFP4[q[i] >> 4] * d;
        }
        base = 32 * b + 4 * s;
        split = 16;
    }
};

// IQ grids: byte j of a table entry is element j; sign bit j of `signs` negates it (kmask_iq2xs)
__device__ __forceinline__ void grid8(const u64 g, const u8 signs, const float db, float* w) {
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = db * (float)(u8)(g >> (8 * j)) * ((signs >> j) & 1 ? -1.f : 1.f);
}

__device__ __forceinline__ void grid44(const u32 g1, const u32 g2, const u8 signs, const float db, float* w) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        w[j] = db * (float)(u8)(g1 >> (8 * j)) * ((signs >> j) & 1 ? -1.f : 1.f);
        w[4 + j] = db * (float)(u8)(g2 >> (8 * j)) * ((signs >> (4 + j)) & 1 ? -1.f : 1.f);
    }
}

// super-block of 256: d, then per 32 elements 4 grid bytes + u32 (4 x 7-bit sign index, 4-bit scale)
struct TIQ2_XXS {
    static constexpr int BYTES = 66, UPB = 32;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 5, s = u & 31, ib = s >> 2, l = s & 3;
        const u8* blk = row + b * BYTES;
        const u8* q = blk + 2 + 8 * ib;
        const u32 aux = ld_u32(q + 4);
        const float db = h2f(ld_u16(blk)) * (0.5f + (float)(aux >> 28)) * 0.25f;
        grid8(IQ2XXS_GRID[q[l]], KSIGNS_IQ2XS[(aux >> (7 * l)) & 127], db, w);
        base = 256 * b + 8 * s;
        split = 4;
    }
};

// super-block of 256: d, qs[32] u16 (9-bit grid index | 7-bit sign index << 9), scales[8] (two 4-bit)
struct TIQ2_XS {
    static constexpr int BYTES = 74, UPB = 32;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 5, s = u & 31, ib = s >> 2, l = s & 3;
        const u8* blk = row + b * BYTES;
        const u16 v = ld_u16(blk + 2 + 2 * s);
        const float db = h2f(ld_u16(blk)) * (0.5f + (float)((blk[66 + ib] >> (4 * (l >> 1))) & 15)) * 0.25f;
        grid8(IQ2XS_GRID[v & 511], KSIGNS_IQ2XS[v >> 9], db, w);
        base = 256 * b + 8 * s;
        split = 4;
    }
};

// super-block of 256: d, qs[32] (grid index low bytes), signs[32], qh[8] (2 high bits per 8), scales[8]
struct TIQ2_S {
    static constexpr int BYTES = 82, UPB = 32;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 5, s = u & 31, ib = s >> 2, l = s & 3;
        const u8* blk = row + b * BYTES;
        const int idx = blk[2 + s] | ((blk[66 + ib] << (8 - 2 * l)) & 0x300);
        const float db = h2f(ld_u16(blk)) * (0.5f + (float)((blk[74 + ib] >> (4 * (l >> 1))) & 15)) * 0.25f;
        grid8(IQ2S_GRID[idx], blk[34 + s], db, w);
        base = 256 * b + 8 * s;
        split = 4;
    }
};

// super-block of 256: d, qs[64] (grid bytes, 2 per 8 elements), 8 u32 (4 x 7-bit sign index, 4-bit scale)
struct TIQ3_XXS {
    static constexpr int BYTES = 98, UPB = 32;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 5, s = u & 31, ib = s >> 2, l = s & 3;
        const u8* blk = row + b * BYTES;
        const u32 aux = ld_u32(blk + 66 + 4 * ib);
        const float db = h2f(ld_u16(blk)) * (0.5f + (float)(aux >> 28)) * 0.5f;
        const u8* q = blk + 2 + 2 * s;
        grid44(IQ3XXS_GRID[q[0]], IQ3XXS_GRID[q[1]], KSIGNS_IQ2XS[(aux >> (7 * l)) & 127], db, w);
        base = 256 * b + 8 * s;
        split = 4;
    }
};

// super-block of 256: d, qs[64], qh[8] (9th index bit per grid entry), signs[32], scales[4] (odd: 1 + 2s)
struct TIQ3_S {
    static constexpr int BYTES = 110, UPB = 32;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 5, s = u & 31, ib = s >> 2, l = s & 3;
        const u8* blk = row + b * BYTES;
        const int qh = blk[66 + ib];
        const u8* q = blk + 2 + 2 * s;
        const int i1 = q[0] | ((qh << (8 - 2 * l)) & 256), i2 = q[1] | ((qh << (7 - 2 * l)) & 256);
        const float db = h2f(ld_u16(blk)) * (float)(1 + 2 * ((blk[106 + (ib >> 1)] >> (4 * (ib & 1))) & 15));
        grid44(IQ3S_GRID[i1], IQ3S_GRID[i2], blk[74 + s], db, w);
        base = 256 * b + 8 * s;
        split = 4;
    }
};

// IQ1: dl * (grid[j] + delta), grid entries of -1/0/+1 bytes, delta = -/+ IQ1S_DELTA
__device__ __forceinline__ void grid_iq1(const u64 g, const float dl, const float delta, float* w) {
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = dl * ((float)(i8)(u8)(g >> (8 * j)) + delta);
}

// super-block of 256: d, qs[32], qh[8] u16 (3 index bits per 8 elements, 3-bit scale, delta sign)
struct TIQ1_S {
    static constexpr int BYTES = 50, UPB = 32;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 5, s = u & 31, ib = s >> 2, l = s & 3;
        const u8* blk = row + b * BYTES;
        const int qh = ld_u16(blk + 34 + 2 * ib);
        const float dl = h2f(ld_u16(blk)) * (float)(2 * ((qh >> 12) & 7) + 1);
        const int idx = blk[2 + s] | (((qh >> (3 * l)) & 7) << 8);
        grid_iq1(IQ1S_GRID[idx], dl, qh & 0x8000 ? -0.125f : 0.125f, w);
        base = 256 * b + 8 * s;
        split = 4;
    }
};

// super-block of 256: qs[32], qh[16] (3 index bits + delta sign per 8), scales[8] = 4 u16 of 3-bit scales
// per 16 elements, the f16 d in their top nibbles
struct TIQ1_M {
    static constexpr int BYTES = 56, UPB = 32;
    __device__ static __forceinline__ void unit(const u8* row, int u, float* w, int& base, int& split) {
        const int b = u >> 5, s = u & 31, ib = s >> 2, l = s & 3;
        const u8* blk = row + b * BYTES;
        const u8* scb = blk + 48;
        const int s0 = ld_u16(scb), s1 = ld_u16(scb + 2), s2 = ld_u16(scb + 4), s3 = ld_u16(scb + 6);
        const float d = h2f((u16)((s0 >> 12) | ((s1 >> 8) & 0x00f0) | ((s2 >> 4) & 0x0f00) | (s3 & 0xf000)));
        const int sw = ld_u16(scb + 2 * (ib >> 1));
        const float dl = d * (float)(2 * ((sw >> (6 * (ib & 1) + 3 * (l >> 1))) & 7) + 1);
        const int h = blk[32 + 2 * ib + (l >> 1)] >> (4 * (l & 1));
        grid_iq1(IQ1S_GRID[blk[s] | ((h & 7) << 8)], dl, h & 8 ? -0.125f : 0.125f, w);
        base = 256 * b + 8 * s;
        split = 4;
    }
};

// ---------------------------------------------------------------------------------------------------------
template <class Q>
__device__ __forceinline__ void gemv(const u8* __restrict__ W, i64 row_bytes, int N, int K,
                                     const float* __restrict__ x, i64 ldx, float* __restrict__ out, i64 ldo, int T,
                                     int accumulate) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int t0 = blockIdx.y * ROWS;
    if (n >= N) return;  // the whole warp: no block-wide synchronisation below
    const int nt = min(ROWS, T - t0);
    const u8* row = W + (i64)n * row_bytes;
    const float* xb = x + (i64)t0 * ldx;
    float acc[ROWS];
#pragma unroll
    for (int t = 0; t < ROWS; ++t) acc[t] = 0.f;
    const int units = K >> 3;
    for (int u = lane; u < units; u += 32) {
        float w[8];
        int base, split;
        Q::unit(row, u, w, base, split);
#pragma unroll
        for (int t = 0; t < ROWS; ++t) {
            if (t < nt) {
                const float* xa = xb + t * ldx + base;
                const float* xc = xa + split;
                float a = acc[t];
                a = fmaf(w[0], xa[0], a);
                a = fmaf(w[1], xa[1], a);
                a = fmaf(w[2], xa[2], a);
                a = fmaf(w[3], xa[3], a);
                a = fmaf(w[4], xc[0], a);
                a = fmaf(w[5], xc[1], a);
                a = fmaf(w[6], xc[2], a);
                a = fmaf(w[7], xc[3], a);
                acc[t] = a;
            }
        }
    }
    float mine = 0.f;
#pragma unroll
    for (int t = 0; t < ROWS; ++t) {
        if (t < nt) {  // nt is uniform over the warp, so every lane joins the shuffles
            const float s = warp_sum(acc[t]);
            if (lane == t) mine = s;
        }
    }
    if (lane < nt) {
        float* o = out + (i64)(t0 + lane) * ldo + n;
        *o = accumulate ? *o + mine : mine;
    }
}

template <class Q>
__device__ __forceinline__ void get_rows(const u8* __restrict__ W, i64 row_bytes, int K, const i64* __restrict__ rows,
                                         float* __restrict__ out, i64 ldo) {
    const u8* row = W + rows[blockIdx.x] * row_bytes;
    float* o = out + (i64)blockIdx.x * ldo;
    for (int u = threadIdx.x; u < (K >> 3); u += blockDim.x) {
        float w[8];
        int base, split;
        Q::unit(row, u, w, base, split);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            o[base + i] = w[i];
            o[base + split + i] = w[4 + i];
        }
    }
}

#define GUILD_QUANT_KERNELS(NAME, Q)                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * WARPS)                                                      \
        matmul_##NAME(const u8* W, i64 row_bytes, int N, int K, const float* x, i64 ldx, float* out, i64 ldo,     \
                      int T, int accumulate) {                                                                    \
        gemv<Q>(W, row_bytes, N, K, x, ldx, out, ldo, T, accumulate);                                             \
    }                                                                                                             \
    extern "C" __global__ void get_rows_##NAME(const u8* W, i64 row_bytes, int K, const i64* rows, float* out,    \
                                               i64 ldo) {                                                         \
        get_rows<Q>(W, row_bytes, K, rows, out, ldo);                                                             \
    }

GUILD_QUANT_KERNELS(f32, TF32)
GUILD_QUANT_KERNELS(f16, TF16)
GUILD_QUANT_KERNELS(bf16, TBF16)
GUILD_QUANT_KERNELS(q8_0, TQ8_0)
GUILD_QUANT_KERNELS(q4_0, TQ4_0)
GUILD_QUANT_KERNELS(q4_1, TQ4_1)
GUILD_QUANT_KERNELS(q5_0, TQ5_0)
GUILD_QUANT_KERNELS(q4_k, TQ4_K)
GUILD_QUANT_KERNELS(q5_k, TQ5_K)
GUILD_QUANT_KERNELS(q6_k, TQ6_K)
GUILD_QUANT_KERNELS(iq4_nl, TIQ4_NL)
GUILD_QUANT_KERNELS(iq4_xs, TIQ4_XS)
GUILD_QUANT_KERNELS(q5_1, TQ5_1)
GUILD_QUANT_KERNELS(q2_k, TQ2_K)
GUILD_QUANT_KERNELS(q3_k, TQ3_K)
GUILD_QUANT_KERNELS(mxfp4, TMXFP4)
GUILD_QUANT_KERNELS(iq2_xxs, TIQ2_XXS)
GUILD_QUANT_KERNELS(iq2_xs, TIQ2_XS)
GUILD_QUANT_KERNELS(iq2_s, TIQ2_S)
GUILD_QUANT_KERNELS(iq3_xxs, TIQ3_XXS)
GUILD_QUANT_KERNELS(iq3_s, TIQ3_S)
GUILD_QUANT_KERNELS(iq1_s, TIQ1_S)
GUILD_QUANT_KERNELS(iq1_m, TIQ1_M)
