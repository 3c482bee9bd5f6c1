// Non-matmul parts of a window on the GPU: RMSNorm, QK-norm, RoPE, SwiGLU, residual add, KV-cache writes and
// the MoE router. Twins: kernels/ref.py; CPU kernels: kernels/cpu/ops.py (same semantics).
// Every row (or head) is handled by its own block/warp; reductions run in a fixed order (row invariance).
// Row strides (ld*) are in elements, so views of fused buffers (q|k|v) need no copies.
#include "common.cuh"

// out[t] = (x[t] * scale) * w, scale = 1 / sqrt(mean(x[t]^2) + eps); one block per row, double sums.
// In place (out == x) is allowed: each element is read before it is written, by the same thread.
extern "C" __global__ void rmsnorm(const float* x, i64 ldx, const float* w, double eps, float* out, i64 ldo, int D) {
    __shared__ double red[32];
    const float* xr = x + (i64)blockIdx.x * ldx;
    float* o = out + (i64)blockIdx.x * ldo;
    double s = 0.0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        const double v = (double)xr[i];
        s += v * v;
    }
    s = block_sum_d(s, red);
    const float scale = (float)(1.0 / sqrt(s / D + eps));
    for (int i = threadIdx.x; i < D; i += blockDim.x) o[i] = (xr[i] * scale) * w[i];
}

// In-place RMSNorm of every head vector (Qwen3 QK-norm): x rows of H heads x hd; one warp per (head, row).
extern "C" __global__ void rmsnorm_heads(float* x, i64 ldx, int hd, const float* w, double eps) {
    float* v = x + (i64)blockIdx.y * ldx + (i64)blockIdx.x * hd;
    double s = 0.0;
    for (int i = threadIdx.x; i < hd; i += 32) {
        const double a = (double)v[i];
        s += a * a;
    }
    s = warp_sum_d(s);
    const float scale = (float)(1.0 / sqrt(s / hd + eps));
    for (int i = threadIdx.x; i < hd; i += 32) v[i] = (v[i] * scale) * w[i];
}

// In-place rotary embedding of x rows of H heads x hd at positions[t]; cos/sin tables [ctx, half]
// (half = n_rot / 2). neox rotates (i, i + half), otherwise adjacent pairs (2i, 2i + 1).
extern "C" __global__ void rope(float* x, i64 ldx, int H, int hd, const i64* positions, const float* cos_t,
                                const float* sin_t, int half, int neox) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= H * half) return;
    const int t = blockIdx.y, h = idx / half, i = idx - h * half;
    const i64 p = positions[t];
    const float c = cos_t[p * half + i], s = sin_t[p * half + i];
    float* v = x + (i64)t * ldx + (i64)h * hd;
    const int ia = neox ? i : 2 * i;
    const int ib = neox ? i + half : 2 * i + 1;
    const float a = v[ia], b = v[ib];
    v[ia] = a * c - b * s;
    v[ib] = a * s + b * c;
}

// out[r, i] = silu(gu[r, i]) * gu[r, F + i] (fused gate|up matmul output)
extern "C" __global__ void swiglu(const float* gu, i64 ldg, float* out, i64 ldo, int F) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= F) return;
    const float* g = gu + (i64)blockIdx.y * ldg;
    const float a = g[i];
    out[(i64)blockIdx.y * ldo + i] = a / (1.f + expf(-a)) * g[F + i];
}

// x[r, i] += y[r, i]
extern "C" __global__ void add_rows(float* x, i64 ldx, const float* y, i64 ldy, int D) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= D) return;
    x[(i64)blockIdx.y * ldx + i] += y[(i64)blockIdx.y * ldy + i];
}

// Router: softmax over E experts -> top-k (ties to the lower id) -> optional renormalise; one block per row.
// The sums and the selection run sequentially in thread 0, in the CPU kernel's order (E <= a few hundred).
// Dynamic shared memory: E floats.
extern "C" __global__ void softmax_topk(const float* logits, i64 ld, int E, int k, int renorm, i64* ids, i64 ldi,
                                        float* weights, i64 ldw) {
    GUILD_DYNAMIC_SHARED(float, p);
    __shared__ float red[32];
    const float* l = logits + (i64)blockIdx.x * ld;
    float m = NEG_INF;
    for (int e = threadIdx.x; e < E; e += blockDim.x) m = fmaxf(m, l[e]);
    m = block_max(m, red);  // max is exact in any order
    for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] = expf(l[e] - m);
    __syncthreads();
    if (threadIdx.x != 0) return;
    float s = 0.f;
    for (int e = 0; e < E; ++e) s += p[e];
    for (int e = 0; e < E; ++e) p[e] = p[e] / s;
    i64* id = ids + (i64)blockIdx.x * ldi;
    float* wt = weights + (i64)blockIdx.x * ldw;
    float tot = 0.f;
    for (int r = 0; r < k; ++r) {
        int best = -1;
        for (int e = 0; e < E; ++e)
            if (p[e] >= 0.f && (best < 0 || p[e] > p[best])) best = e;
        id[r] = best;
        wt[r] = p[best];
        tot += p[best];
        p[best] = -1.f;
    }
    if (renorm)
        for (int r = 0; r < k; ++r) wt[r] = wt[r] / tot;
}
