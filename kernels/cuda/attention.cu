// Causal GQA attention of a window over a device-resident KV cache (layout of guild.state.KVCache):
// kt [Hkv, hd, ctx] (keys transposed: the score loop reads consecutive positions across threads),
// vc [Hkv, ctx, hd]. Twin: kernels/ref.py attention; CPU kernel: kernels/cpu/ops.py attention.
//
// One block of ATT_THREADS per (head, row). Row t reads positions 0..pos0+t and nothing else. Two passes over
// the positions in chunks of ATT_THREADS (thread j takes position c0 + j): pass 1 the maximum score, pass 2
// recomputes each score (the same instructions, so the same bits), e = exp(s - max), and accumulates
// e * v: the threads form G = ATT_THREADS / hd groups, group g takes a fixed slice of each chunk, thread
// (g, i) keeps one fmaf chain for output element i. At the end the G partial chains are added in group
// order and scaled by 1 / sum(e) (a fixed tree). Everything depends on (q row, absolute position) alone, so
// a row's output is bitwise independent of T and of the other rows. hd <= ATT_THREADS (checked on the host).
#include "common.cuh"

#define ATT_THREADS 256

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention(const float* q, i64 ldq, const float* kt, const float* vc, float* out, i64 ldo, int H, int Hkv, int hd,
              int ctx, int pos0, float scale) {
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
    const float* K = kt + (i64)g * hd * ctx;
    const float* V = vc + (i64)g * ctx * hd;

    float m = NEG_INF;
    for (int c0 = 0; c0 < L; c0 += ATT_THREADS) {
        const int j = c0 + tid;
        if (j < L) {
            float s = 0.f;
            for (int i = 0; i < hd; ++i) s = fmaf(qs[i], K[(i64)i * ctx + j], s);
            m = fmaxf(m, s);
        }
    }
    m = block_max(m, red);

    const int G = ATT_THREADS / hd;
    const int CH = (ATT_THREADS + G - 1) / G;
    const int gi = tid / hd, i = tid - gi * hd;
    float acc = 0.f, lsum = 0.f;
    for (int c0 = 0; c0 < L; c0 += ATT_THREADS) {
        const int j = c0 + tid;
        float e = 0.f;
        if (j < L) {
            float s = 0.f;
            for (int ii = 0; ii < hd; ++ii) s = fmaf(qs[ii], K[(i64)ii * ctx + j], s);
            e = expf(s - m);
        }
        lsum += e;
        sp[tid] = e;
        __syncthreads();
        if (gi < G) {
            const int j0 = gi * CH;
            const int j1 = min(min(j0 + CH, ATT_THREADS), L - c0);
            for (int jj = j0; jj < j1; ++jj) acc = fmaf(sp[jj], V[(i64)(c0 + jj) * hd + i], acc);
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
