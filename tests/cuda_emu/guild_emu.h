// A CUDA execution model on the CPU, just enough for kernels/cuda/*.cu: blocks run one after another, every
// CUDA thread of a block is a fiber (ucontext) on the calling thread, __syncthreads is a block barrier,
// __shfl_xor_sync exchanges through per-warp slots between two warp barriers, __shared__ arrays are statics
// (one block at a time). Compiled with -ffp-contract=off like NVRTC's --fmad=false, so the sources'
// arithmetic is what they spell out.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __constant__
#define __shared__ static

struct dim3 {
    unsigned x = 0, y = 0, z = 0;
};
extern dim3 threadIdx;
extern dim3 blockIdx, blockDim, gridDim;

void __syncthreads();
double guild_emu_shfl_xor(double v, int lane_mask);
void* guild_emu_dynamic_shared();
float guild_emu_h2f(unsigned short h);
unsigned short guild_emu_f2h(float f);

inline float __shfl_xor_sync(unsigned, float v, int m) { return (float)guild_emu_shfl_xor(v, m); }
inline double __shfl_xor_sync(unsigned, double v, int m) { return guild_emu_shfl_xor(v, m); }
inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
inline float __uint_as_float(unsigned i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
template <class T>
inline T min(T a, T b) {
    return b < a ? b : a;
}
