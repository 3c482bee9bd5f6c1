// Causal GQA attention of a window over a device-resident KV cache, and the cache's writes. Layout: keys
// transposed [Hkv, hd, ctx] (the score loop reads consecutive positions across threads), values [Hkv, ctx, hd];
// each stored as float32, f16 bits, or q8_0 (int8 quants in those shapes and an f16 scale per 32 values along
// hd: keys' scales [Hkv, hd/32, ctx], values' [Hkv, ctx, hd/32]; llama.cpp's block_q8_0 in two arrays, as the
// host cache stores it, guild/engine/state.py). Twin: kernels/ref.py attention over the stored values; CPU
// kernel: kernels/cpu/ops.py attention_kv.
//
// One block of ATT_THREADS per (head, row). Row t reads positions 0..pos0+t and nothing else. Two passes over
// the positions in chunks of ATT_THREADS (thread j takes position c0 + j): pass 1 the maximum score, pass 2
// recomputes each score (the same instructions, so the same bits), e = exp(s - max), and accumulates
// e * v: the threads form G = ATT_THREADS / hd groups, group g takes a fixed slice of each chunk, thread
// (g, i) keeps one fmaf chain for output element i. At the end the G partial chains are added in group
// order and scaled by 1 / sum(e) (a fixed tree). Everything depends on (q row, absolute position) alone, so
// a row's output is bitwise independent of T and of the other rows. hd <= ATT_THREADS (checked on the host).
// A stored value is read as float32 exactly (f16 widened; q8_0 q * d, 8 bits times 11: exact in float32).
#include "common.cuh"

#define ATT_THREADS 256

enum KvType { KV_F32 = 0, KV_F16 = 1, KV_Q8_0 = 2 };

// Element e of a stored operand (q: its values or quants; s: q8_0 scale bits, d the scale of e's block).
template <int TY>
__device__ __forceinline__ float kv_at(const void* q, i64 e, float d) {
    if constexpr (TY == KV_F32) return ((const float*)q)[e];
    else if constexpr (TY == KV_F16) return h2f(((const u16*)q)[e]);
    else return (float)((const i8*)q)[e] * d;
}

template <int TY>
__device__ __forceinline__ float kv_scale(const u16* s, i64 b) {
    if constexpr (TY == KV_Q8_0) return h2f(s[b]);
    else return 1.f;  // unused
}

// The score of position j: one fmaf chain over i (q8_0: the scale read once per 32 dimensions).
template <int KT>
__device__ __forceinline__ float score(const float* qs, const void* K, const u16* Ks, int hd, int ctx, int j) {
    const int nb = KT == KV_Q8_0 ? 32 : hd;
    float s = 0.f;
    for (int i0 = 0; i0 < hd; i0 += nb) {
        const float d = kv_scale<KT>(Ks, (i64)(i0 / 32) * ctx + j);
        for (int i = i0; i < i0 + nb; ++i) s = fmaf(qs[i], kv_at<KT>(K, (i64)i * ctx + j, d), s);
    }
    return s;
}

template <int KT, int VT>
__device__ __forceinline__ void attention_t(const float* q, i64 ldq, const void* kq, const u16* ks, const void* vq,
                                            const u16* vs, float* out, i64 ldo, int H, int Hkv, int hd, int ctx,
                                            int pos0, float scale) {
    __shared__ float qs[ATT_THREADS];
    __shared__ float sp[ATT_THREADS];
    __shared__ float part[ATT_THREADS];
    __shared__ float red[32];
    const int h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
    const int g = h / (H / Hkv);
    const int L = pos0 + t + 1;
    const float* qr = q + (i64)t * ldq + (i64)h * hd;
    for (int i = tid; i < hd; i += ATT_THREADS) qs[i] = qr[i] * scale;
    __syncthreads();
    const int vb = VT == KV_Q8_0 ? hd / 32 : 0;  // value scales per position
    const void* K = KT == KV_F32 ? (const void*)((const float*)kq + (i64)g * hd * ctx)
                    : KT == KV_F16 ? (const void*)((const u16*)kq + (i64)g * hd * ctx)
                                   : (const void*)((const i8*)kq + (i64)g * hd * ctx);
    const u16* Ks = ks + (KT == KV_Q8_0 ? (i64)g * (hd / 32) * ctx : 0);
    const void* V = VT == KV_F32 ? (const void*)((const float*)vq + (i64)g * ctx * hd)
                    : VT == KV_F16 ? (const void*)((const u16*)vq + (i64)g * ctx * hd)
                                   : (const void*)((const i8*)vq + (i64)g * ctx * hd);
    const u16* Vs = vs + (i64)g * ctx * vb;

    float m = NEG_INF;
    for (int c0 = 0; c0 < L; c0 += ATT_THREADS) {
        const int j = c0 + tid;
        if (j < L) m = fmaxf(m, score<KT>(qs, K, Ks, hd, ctx, j));
    }
    m = block_max(m, red);

    const int G = ATT_THREADS / hd;
    const int CH = (ATT_THREADS + G - 1) / G;
    const int gi = tid / hd, i = tid - gi * hd;
    float acc = 0.f, lsum = 0.f;
    for (int c0 = 0; c0 < L; c0 += ATT_THREADS) {
        const int j = c0 + tid;
        float e = 0.f;
        if (j < L) e = expf(score<KT>(qs, K, Ks, hd, ctx, j) - m);
        lsum += e;
        sp[tid] = e;
        __syncthreads();
        if (gi < G) {
            const int j0 = gi * CH;
            const int j1 = min(min(j0 + CH, ATT_THREADS), L - c0);
            for (int jj = j0; jj < j1; ++jj) {
                const i64 p = c0 + jj;
                acc = fmaf(sp[jj], kv_at<VT>(V, p * hd + i, kv_scale<VT>(Vs, p * vb + i / 32)), acc);
            }
        }
        __syncthreads();
    }
    const float sum = block_sum(lsum, red);
    if (gi < G) part[gi * hd + i] = acc;
    __syncthreads();
    if (tid < hd) {
        float o = part[tid];
        for (int gg = 1; gg < G; ++gg) o += part[gg * hd + tid];
        out[(i64)t * ldo + (i64)h * hd + tid] = o * (1.f / sum);
    }
}

// x (row element e of a window) stored at element a of an operand (b: its q8_0 block's scale). q8_0 takes the
// host's rule (kernels/cpu/ops.py kv_quantize_q8_0): d = max|x| / 127 over the 32 values, q = rint(x * (1 / d)),
// d stored as f16; the 32 values of a block are one warp's lanes (hd a multiple of 32, checked on the host).
template <int TY>
__device__ __forceinline__ void kv_store(float x, void* q, u16* s, i64 a, i64 b) {
    if constexpr (TY == KV_F32) {
        ((float*)q)[a] = x;
    } else if constexpr (TY == KV_F16) {
        ((u16*)q)[a] = f2h(x);
    } else {
        const float d = warp_max(fabsf(x)) / 127.f;  // max is exact in any order
        const float inv = d > 0.f ? 1.f / d : 0.f;
        ((i8*)q)[a] = (i8)rintf(x * inv);
        if ((threadIdx.x & 31) == 0) s[b] = f2h(d);
    }
}

// Write a window's keys and values k, v (rows of Hkv x hd) into one layer's cache at rows pos0..pos0+T-1.
template <int KT, int VT>
__device__ __forceinline__ void kv_write_t(const float* k, i64 ldk, const float* v, i64 ldv, void* kq, u16* ks,
                                           void* vq, u16* vs, int Hkv, int hd, int ctx, int pos0) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= Hkv * hd) return;  // whole warps: Hkv * hd is a multiple of 32 wherever a q8_0 block needs a warp
    const int t = blockIdx.y, g = idx / hd, i = idx - g * hd;
    const i64 p = (i64)pos0 + t;
    kv_store<KT>(k[(i64)t * ldk + idx], kq, ks, ((i64)g * hd + i) * ctx + p, ((i64)g * (hd / 32) + i / 32) * ctx + p);
    kv_store<VT>(v[(i64)t * ldv + idx], vq, vs, ((i64)g * ctx + p) * hd + i, ((i64)g * ctx + p) * (hd / 32) + i / 32);
}

// One kernel per (K type, V type): attention_<k>_<v>, kv_write_<k>_<v>. Unused scale pointers may be anything.
#define GUILD_KV_PAIR(KN, KT, VN, VT)                                                                                 \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                                         \
        attention_##KN##_##VN(const float* q, i64 ldq, const void* kq, const u16* ks, const void* vq, const u16* vs, \
                              float* out, i64 ldo, int H, int Hkv, int hd, int ctx, int pos0, float scale) {         \
        attention_t<KT, VT>(q, ldq, kq, ks, vq, vs, out, ldo, H, Hkv, hd, ctx, pos0, scale);                         \
    }                                                                                                                 \
    extern "C" __global__ void kv_write_##KN##_##VN(const float* k, i64 ldk, const float* v, i64 ldv, void* kq,     \
                                                    u16* ks, void* vq, u16* vs, int Hkv, int hd, int ctx,            \
                                                    int pos0) {                                                       \
        kv_write_t<KT, VT>(k, ldk, v, ldv, kq, ks, vq, vs, Hkv, hd, ctx, pos0);                                      \
    }
#define GUILD_KV_PAIRS(X)                                                                                   \
    X(f32, KV_F32, f32, KV_F32) X(f32, KV_F32, f16, KV_F16) X(f32, KV_F32, q8_0, KV_Q8_0)                   \
    X(f16, KV_F16, f32, KV_F32) X(f16, KV_F16, f16, KV_F16) X(f16, KV_F16, q8_0, KV_Q8_0)                   \
    X(q8_0, KV_Q8_0, f32, KV_F32) X(q8_0, KV_Q8_0, f16, KV_F16) X(q8_0, KV_Q8_0, q8_0, KV_Q8_0)
GUILD_KV_PAIRS(GUILD_KV_PAIR)
