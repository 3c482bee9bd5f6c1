// Gated DeltaNet (linear attention) on the GPU: the gates, the causal depthwise conv with history + SiLU, per-head
// L2 norm, the gated delta rule recurrence (step form, a snapshot of S per row for rollback), the gated RMSNorm
// and x * sigmoid(gate). Twins: kernels/ref.py; CPU kernels: kernels/cpu/deltanet.py (same semantics, same
// reduction orders). Row invariance: row t reads only rows <= t and the state before the window; every
// reduction runs in a fixed order inside one thread. Row strides (ld*) are in elements.
#include "common.cuh"

// g = a * softplus(alpha + dt_bias), beta = sigmoid(b); alpha, b, g, beta [T, H]; one thread per (row, head).
extern "C" __global__ void gdn_gates(const float* alpha, i64 lda, const float* b, i64 ldb, const float* dt_bias,
                                     const float* a, float* g, i64 ldg, float* beta, i64 ldbeta, int H) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= H) return;
    const i64 t = blockIdx.y;
    const float u = alpha[t * lda + h] + dt_bias[h];
    const float sp = u > 20.f ? u : (float)log1p(exp((double)u));
    g[t * ldg + h] = a[h] * sp;
    beta[t * ldbeta + h] = 1.f / (1.f + expf(-b[t * ldb + h]));
}

// out[t, c] = silu(sum_k wt[k, c] * src[t + k - (K-1), c]), src = hist [K-1, C] before row 0; taps k ascending.
extern "C" __global__ void conv1d_silu(const float* x, i64 ldx, const float* hist, const float* wt, float* out,
                                       i64 ldo, int C, int K) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int t = blockIdx.y;
    float o = 0.f;
    for (int k = 0; k < K; k++) {
        const int i = t + k - (K - 1);
        const float s = i >= 0 ? x[(i64)i * ldx + c] : hist[(i64)(K - 1 + i) * C + c];
        o = o + wt[(i64)k * C + c] * s;
    }
    out[(i64)t * ldo + c] = o / (1.f + expf(-o));
}

// In place: x[t, h] *= 1 / sqrt(sum x[t, h]^2 + eps), double sum in index order; one thread per (row, head).
extern "C" __global__ void l2norm_heads(float* x, i64 ldx, int H, int d, double eps) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= H) return;
    float* v = x + (i64)blockIdx.y * ldx + (i64)h * d;
    double s = 0.0;
    for (int i = 0; i < d; i++) {
        const double a = (double)v[i];
        s += a * a;
    }
    const float inv = (float)(1.0 / sqrt(s + eps));
    for (int i = 0; i < d; i++) v[i] = v[i] * inv;
}

// The gated delta rule over T rows, one block per value head h, one thread per state column j (each column of S
// [dk, dv] evolves on its own: no barrier). pool [n_buf, Hv, dk, dv]: row 0 reads pool[src], row t writes
// pool[dst[t]], row t+1 reads it back. Per row: S = exp(g) S; delta = beta (v - S^T k); S += k delta^T;
// o = S^T (scale q), sums over i ascending. want_out = 0: no output (replaying kept rows at commit).
extern "C" __global__ void gdn_recurrence(const float* q, i64 ldq, const float* k, i64 ldk, const float* v, i64 ldv,
                                          const float* g, i64 ldg, const float* beta, i64 ldbeta, const i64* kmap,
                                          float scale, float* pool, int src, const i64* dst, float* out, i64 ldo,
                                          int T, int Hv, int dk, int dv, int want_out) {
    const int h = blockIdx.x;
    const i64 kh = kmap[h];
    const i64 plane = (i64)dk * dv, buf = (i64)Hv * plane;
    for (int j = threadIdx.x; j < dv; j += blockDim.x) {
        for (int t = 0; t < T; t++) {
            const float* S0 = pool + (t == 0 ? (i64)src : dst[t - 1]) * buf + h * plane;
            float* S = pool + dst[t] * buf + h * plane;
            const float eg = expf(g[(i64)t * ldg + h]);
            const float bt = beta[(i64)t * ldbeta + h];
            const float* kk = k + (i64)t * ldk + kh * dk;
            float kv = 0.f;
            for (int i = 0; i < dk; i++) {
                const float e = S0[(i64)i * dv + j] * eg;
                S[(i64)i * dv + j] = e;
                kv = kv + e * kk[i];
            }
            const float delta = (v[(i64)t * ldv + (i64)h * dv + j] - kv) * bt;
            const float* qq = q + (i64)t * ldq + kh * dk;
            float o = 0.f;
            for (int i = 0; i < dk; i++) {
                const float e = S[(i64)i * dv + j] + kk[i] * delta;
                S[(i64)i * dv + j] = e;
                if (want_out) o = o + e * (qq[i] * scale);
            }
            if (want_out) out[(i64)t * ldo + (i64)h * dv + j] = o;
        }
    }
}

// out[t, h] = rmsnorm(x[t, h]) * w * silu(z[t, h]) per head (norm before gate); one thread per (row, head).
extern "C" __global__ void gated_rmsnorm(const float* x, i64 ldx, const float* z, i64 ldz, const float* w, double eps,
                                         float* out, i64 ldo, int H, int d) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= H) return;
    const i64 t = blockIdx.y;
    const float* xr = x + t * ldx + (i64)h * d;
    const float* zr = z + t * ldz + (i64)h * d;
    float* o = out + t * ldo + (i64)h * d;
    double s = 0.0;
    for (int i = 0; i < d; i++) {
        const double a = (double)xr[i];
        s += a * a;
    }
    const float sc = (float)(1.0 / sqrt(s / d + eps));
    for (int i = 0; i < d; i++) {
        const float zi = zr[i];
        o[i] = ((xr[i] * sc) * w[i]) * (zi / (1.f + expf(-zi)));
    }
}

// out = x * sigmoid(gate), gate broadcast over the columns when it has one (G == 1); x, out [R, D].
extern "C" __global__ void sigmoid_mul(const float* x, i64 ldx, const float* gate, i64 ldg, int G, float* out, i64 ldo,
                                       int D) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= D) return;
    const i64 r = blockIdx.y;
    const float gv = gate[r * ldg + (G > 1 ? i : 0)];
    out[r * ldo + i] = x[r * ldx + i] * (1.f / (1.f + expf(-gv)));
}
