// Shared helpers for guild's CUDA kernels (compiled by NVRTC: no system headers, so fixed-width types,
// half conversions and reductions are defined here).
//
// Numerics: sources are compiled with --fmad=false, so every a*b+c that is meant to fuse says fmaf(); the
// rest rounds each operation like the NumPy twins do. Reductions run in a fixed order (a per-thread chain,
// then a fixed xor butterfly / tree): a row's result never depends on how many rows a launch carries.
#pragma once

#ifdef GUILD_EMU
// tests/cuda_emu: these sources built as C++ and run on the CPU, one thread per CUDA thread
#include "guild_emu.h"
#endif

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float h2f(u16 h) {
#ifdef GUILD_EMU
    return guild_emu_h2f(h);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));  // exact, subnormals included
    return f;
#endif
}

__device__ __forceinline__ u16 f2h(float f) {
#ifdef GUILD_EMU
    return guild_emu_f2h(f);
#else
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));  // round to nearest even, as NumPy's astype(float16)
    return h;
#endif
}

// dynamic shared memory (the launch's shared_mem bytes)
#ifdef GUILD_EMU
#define GUILD_DYNAMIC_SHARED(type, name) type* name = (type*)guild_emu_dynamic_shared()
#else
#define GUILD_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((u32)h) << 16); }

// little-endian loads from byte pointers of unknown alignment (GGUF blocks are 2-byte aligned at best)
__device__ __forceinline__ u16 ld_u16(const u8* p) { return (u16)(p[0] | (p[1] << 8)); }
__device__ __forceinline__ u32 ld_u32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// the IQ4_NL / IQ4_XS non-linear grid (ggml-common.h kvalues_iq4nl)
__device__ __constant__ float KVALUES_IQ4NL[16] = {-127.f, -104.f, -83.f, -65.f, -49.f, -35.f, -22.f, -10.f,
                                                   1.f,    13.f,   25.f,  38.f,  53.f,  69.f,  89.f,  113.f};
// MXFP4 e2m1 values, doubled (ggml-common.h kvalues_mxfp4)
__device__ __constant__ float KVALUES_MXFP4[16] = {0.f, 1.f, 2.f, 3.f, 4.f, 6.f, 8.f, 12.f,
                                                   0.f, -1.f, -2.f, -3.f, -4.f, -6.f, -8.f, -12.f};

__device__ __forceinline__ float warp_sum(float v) {
    // xor butterfly: at every stage lanes i and i^m add the same two values (a+b == b+a), so all lanes end
    // with bitwise the same sum, in an order fixed by the lane layout alone
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(FULL_MASK, v, m);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(FULL_MASK, v, m);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, m));
    return v;
}

// Block reductions for blockDim.x a multiple of 32 (<= 1024): warp butterflies, then warp 0 reduces the
// per-warp values in warp order. `red` is __shared__ scratch of >= 32 entries; every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // red may still be read by a previous reduction
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < nw ? red[lane] : 0.f;
        w = warp_sum(w);
        if (lane == 0) red[0] = w;
    }
    __syncthreads();
    return red[0];
}

__device__ __forceinline__ double block_sum_d(double v, double* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double w = lane < nw ? red[lane] : 0.0;
        w = warp_sum_d(w);
        if (lane == 0) red[0] = w;
    }
    __syncthreads();
    return red[0];
}

__device__ __forceinline__ float block_max(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < nw ? red[lane] : NEG_INF;
        w = warp_max(w);
        if (lane == 0) red[0] = w;
    }
    __syncthreads();
    return red[0];
}
