// Runs kernels/cuda/*.cu on the CPU for tests (see guild_emu.h). Built by tests/cuda_emu/__init__.py as a
// shared library; guild_emu_launch(name, grid, block, shared bytes, argument bits, type codes) launches a
// kernel by name and checks each argument's type code against the kernel's parameter type, so a launch that
// CuPy would silently misread (an int passed where a double is expected, a missing argument) is an error.
#include <setjmp.h>
#include <ucontext.h>

#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "guild_emu.h"
#include "quant.cu"
#include "ops.cu"
#include "attention.cu"
#include "deltanet.cu"

dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {
// fibers: one per CUDA thread of the block being run; a barrier parks the fiber and returns to the scheduler
enum State { RUN, AT_BLOCK, AT_WARP, DONE };
// makecontext starts a fiber on its stack; _setjmp/_longjmp switch (no signal-mask syscall, unlike swapcontext)
struct Fiber {
    ucontext_t ctx;
    jmp_buf jb;
    State state = RUN;
    std::vector<char> stack;
};
std::vector<Fiber> g_fib;
ucontext_t g_start;
jmp_buf g_sched;
unsigned g_cur = 0;
double g_slot[2][32][32];  // double-buffered: a shuffle needs one barrier, not two
std::vector<unsigned char> g_dyn;
const void* g_entry = nullptr;
const uint64_t* g_args = nullptr;

template <class T>
char code() {
    if constexpr (std::is_pointer_v<T>) return 'p';
    else if constexpr (std::is_same_v<T, float>) return 'f';
    else if constexpr (std::is_same_v<T, double>) return 'd';
    else if constexpr (std::is_same_v<T, long long>) return 'l';
    else if constexpr (std::is_same_v<T, int>) return 'i';
    else return '?';
}

template <class T>
T from_bits(uint64_t b) {
    if constexpr (std::is_pointer_v<T>) {
        return reinterpret_cast<T>(b);
    } else if constexpr (std::is_same_v<T, float>) {
        uint32_t u = (uint32_t)b;
        float f;
        memcpy(&f, &u, 4);
        return f;
    } else if constexpr (std::is_same_v<T, double>) {
        double d;
        memcpy(&d, &b, 8);
        return d;
    } else {
        return (T)(int64_t)b;
    }
}

struct Entry {
    std::string name;
    std::string codes;
    std::function<void(const uint64_t*)> call;
};

template <class... A, size_t... I>
void invoke(void (*f)(A...), const uint64_t* a, std::index_sequence<I...>) {
    f(from_bits<A>(a[I])...);
}

template <class... A>
Entry entry(const char* name, void (*f)(A...)) {
    return Entry{name, std::string{code<A>()...},
                 [f](const uint64_t* a) { invoke(f, a, std::index_sequence_for<A...>{}); }};
}

#define Q(NAME) entry("matmul_" #NAME, matmul_##NAME), entry("get_rows_" #NAME, get_rows_##NAME)
#define KV_ENTRIES(KN, KT, VN, VT) \
    entry("attention_" #KN "_" #VN, attention_##KN##_##VN), entry("kv_write_" #KN "_" #VN, kv_write_##KN##_##VN),
const std::vector<Entry>& table() {
    static const std::vector<Entry> t = {
        Q(f32), Q(f16), Q(bf16), Q(q8_0), Q(q4_0), Q(q4_1), Q(q5_0), Q(q4_k), Q(q5_k), Q(q6_k), Q(iq4_nl), Q(iq4_xs),
        Q(q5_1), Q(q2_k), Q(q3_k), Q(mxfp4), Q(iq2_xxs), Q(iq2_xs), Q(iq2_s), Q(iq3_xxs), Q(iq3_s), Q(iq1_s), Q(iq1_m),
        entry("rmsnorm", rmsnorm), entry("rmsnorm_heads", rmsnorm_heads), entry("rope", rope),
        entry("swiglu", swiglu), entry("add_rows", add_rows), entry("softmax_topk", softmax_topk),
        GUILD_KV_PAIRS(KV_ENTRIES)
        entry("gdn_gates", gdn_gates), entry("conv1d_silu", conv1d_silu), entry("l2norm_heads", l2norm_heads),
        entry("gdn_recurrence", gdn_recurrence), entry("gated_rmsnorm", gated_rmsnorm),
        entry("sigmoid_mul", sigmoid_mul),
    };
    return t;
}
}  // namespace

static void park(State s) {
    g_fib[g_cur].state = s;
    if (_setjmp(g_fib[g_cur].jb) == 0) _longjmp(g_sched, 1);
}

void __syncthreads() { park(AT_BLOCK); }

// lanes of a warp run the same shuffles in the same order; each lane counts its own shuffles (g_lane_phase),
// so the buffer a lane writes is never the one a slower lane may still read
static unsigned g_lane_phase[1024];

double guild_emu_shfl_xor(double v, int m) {
    const unsigned t = threadIdx.x, w = t / 32, l = t % 32, ph = g_lane_phase[t]++ & 1;
    g_slot[ph][w][l] = v;
    park(AT_WARP);
    return g_slot[ph][w][l ^ (unsigned)m];
}

static void fiber_main() {
    if (_setjmp(g_fib[g_cur].jb) == 0) _longjmp(g_sched, 1);  // first entry: register, back to the scheduler
    static_cast<const Entry*>(g_entry)->call(g_args);
    g_fib[g_cur].state = DONE;
    _longjmp(g_sched, 1);
}

// Runs one block to completion; false on a deadlock (a barrier some live thread never reaches).
static bool run_block(unsigned bx) {
    for (unsigned t = 0; t < bx; ++t) {
        Fiber& f = g_fib[t];
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = f.stack.size();
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, fiber_main, 0);
        f.state = RUN;
        g_lane_phase[t] = 0;
        g_cur = t;
        if (_setjmp(g_sched) == 0) swapcontext(&g_start, &f.ctx);  // runs fiber_main up to its first _setjmp
    }
    for (;;) {
        for (unsigned t = 0; t < bx; ++t)
            while (g_fib[t].state == RUN) {
                g_cur = t;
                threadIdx = dim3{t, 0, 0};
                if (_setjmp(g_sched) == 0) _longjmp(g_fib[t].jb, 1);
            }
        // release a warp whose live lanes all wait at its barrier, else the block barrier if all live wait there
        bool released = false;
        for (unsigned w = 0; w < bx / 32; ++w) {
            bool all = true, any = false;
            for (unsigned l = 0; l < 32; ++l) {
                const State s = g_fib[32 * w + l].state;
                if (s == DONE) continue;
                any = true;
                all = all && s == AT_WARP;
            }
            if (any && all) {
                for (unsigned l = 0; l < 32; ++l)
                    if (g_fib[32 * w + l].state == AT_WARP) g_fib[32 * w + l].state = RUN;
                released = true;
            }
        }
        if (!released) {
            bool all = true, any = false;
            for (unsigned t = 0; t < bx; ++t) {
                if (g_fib[t].state == DONE) continue;
                any = true;
                all = all && g_fib[t].state == AT_BLOCK;
            }
            if (!any) return true;
            if (!all) return false;
            for (unsigned t = 0; t < bx; ++t)
                if (g_fib[t].state == AT_BLOCK) g_fib[t].state = RUN;
        }
    }
}

void* guild_emu_dynamic_shared() { return g_dyn.data(); }

float guild_emu_h2f(unsigned short h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 31, man = h & 1023;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            int e = -1;
            uint32_t m = man;
            do {
                ++e;
                m <<= 1;
            } while (!(m & 1024));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((m & 1023) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// float32 -> f16 bits, rounding to nearest even (PTX cvt.rn.f16.f32; NumPy's astype(float16))
unsigned short guild_emu_f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (unsigned short)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN stays NaN
    if (ax >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // >= 65520 (and inf): inf
    if (ax < 0x38800000u) {  // below 2^-14: a subnormal half, in units of 2^-24 (1024 is the smallest normal)
        float a;
        memcpy(&a, &ax, 4);
        return (unsigned short)(sign | (uint32_t)nearbyintf(a * 16777216.0f));
    }
    // rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even; a carry moves up the exponent
    return (unsigned short)(sign | ((ax - 0x38000000u + 0xfffu + ((ax >> 13) & 1u)) >> 13));
}

extern "C" int guild_emu_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, long shared,
                                const uint64_t* args, const char* codes) {
    const Entry* e = nullptr;
    for (const auto& x : table())
        if (x.name == name) e = &x;
    if (!e) return 1;  // no such kernel
    if (e->codes != codes) return 2;  // argument count or types differ from the kernel's parameters
    if (bx == 0 || bx > 1024 || bx % 32) return 3;  // our kernels use whole warps
    gridDim = dim3{gx, gy, gz};
    blockDim = dim3{bx, 1, 1};
    g_dyn.assign((size_t)shared, 0);
    g_entry = e;
    g_args = args;
    if (g_fib.size() < bx) g_fib.resize(bx);
    for (unsigned t = 0; t < bx; ++t)
        if (g_fib[t].stack.empty()) g_fib[t].stack.resize(256 * 1024);
    for (unsigned z = 0; z < gz; ++z)
        for (unsigned y = 0; y < gy; ++y)
            for (unsigned x = 0; x < gx; ++x) {
                blockIdx = dim3{x, y, z};
                if (!run_block(bx)) return 4;  // deadlock: threads wait at barriers that others skip
            }
    return 0;
}
