/* SPDX-License-Identifier: MIT */
// emu.h — the CUDA features the plug-in's kernels (cuda/fwd_mma.cu, cuda/fwd_simple.cu) use,
// emulated on the host so they run (slowly, exactly) on machines without a GPU: test_cuda_emu.cpp
// runs the tensor-core kernel, plugin_emu.cpp the whole plug-in (with emu_runtime.h).
//
// One CTA at a time; its threads run as fibers (Ctx below) in one OS thread. Warp-collective
// operations (ldmatrix, mma.sync, shfl, any, syncwarp) gather all 32 lanes' operands, then the
// last lane to arrive computes every lane's result from the PTX ISA's fragment layouts (mma.cuh
// in cuda/ lists them). __syncthreads and __syncthreads_or are a block barrier. Shared memory
// is a byte array poisoned with 0xFF (NaN in fp16 and bf16) with a per-4-byte shadow that
// reports read-after-write,
// write-after-read and write-after-write races between threads not separated by a barrier,
// reads of bytes with a cp.async in flight, out-of-range and misaligned accesses, and counts
// ldmatrix bank conflicts. cp.async checks its source (16-byte aligned, inside a registered
// device buffer) and lands its data only at the issuing thread's wait_group 0 (committed copies
// only), so a missing wait or barrier shows. The mma sums in fp64 and rounds once to fp32.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(x) alignas(x)

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorNotSupported = 801
};
typedef struct CUstream_st *cudaStream_t;
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
static inline float2 make_float2(float x, float y) { return float2{x, y}; }

namespace emu {

struct Dim3 {
    unsigned x, y, z;
};

static long g_errors = 0;
static long g_ldsm_phases = 0, g_ldsm_conflicted = 0;
static int g_cur = 0;     // current fiber = threadIdx.x
static unsigned g_bx = 0; // blockIdx.x
static unsigned g_gridx = 0;
static int g_nthreads = 0;
static int g_verbose_errs = 30;

/* The emulated device's compute capability, 10·major + minor: FA_EMU_SM (default 90), or set by
 * a test. Below 80 the sm_80 instructions (m16n8k16, cvt to f16x2/bf16x2) are errors, and the
 * copies of mma.cuh's fa_cp_async16 are synchronous, as the sm_75 build compiles them. */
static int g_sm = [] {
    const char *v = getenv("FA_EMU_SM");
    return v && *v ? atoi(v) : 90;
}();

/* The shared memory a block can have on a device of compute capability sm (opt-in, bytes). */
static inline int smem_optin(int sm) {
    return sm >= 90 && sm < 100   ? 227 * 1024
           : sm == 80 || sm == 87 ? 163 * 1024
           : sm >= 80             ? 99 * 1024
           : sm == 75             ? 64 * 1024
                                  : 96 * 1024;
}

#define EMU_ERR(...)                                                                               \
    do {                                                                                           \
        if (emu::g_errors++ < emu::g_verbose_errs) {                                               \
            fprintf(stderr, "EMU ERROR [block %u thread %d] ", emu::g_bx, emu::g_cur);             \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

// ---- fp16 / bf16 -------------------------------------------------------------------------
static inline float h2f(uint16_t h) { /* through a table: libgcc's conversion is slow */
    static const std::vector<float> table = [] {
        std::vector<float> t(65536);
        for (uint32_t i = 0; i < 65536; ++i) {
            const uint16_t b = (uint16_t)i;
            _Float16 x;
            memcpy(&x, &b, 2);
            t[i] = (float)x;
        }
        return t;
    }();
    return table[h];
}
static inline uint16_t f2h(float f) { // round to nearest even (hardware cvt)
    _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}
static inline float bf2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float lo_f(uint32_t r, bool bf) { return bf ? bf2f(r & 0xffff) : h2f(r & 0xffff); }
static inline float hi_f(uint32_t r, bool bf) { return bf ? bf2f(r >> 16) : h2f(r >> 16); }

// ---- global buffers (for cp.async source checks) ------------------------------------------
struct GBuf {
    const char *p;
    size_t n;
};
static std::vector<GBuf> g_bufs;
static inline void register_global(const void *p, size_t n) {
    g_bufs.push_back({(const char *)p, n});
}
static inline bool global_ok(const void *p, size_t n) {
    for (auto &b : g_bufs)
        if ((const char *)p >= b.p && (const char *)p + n <= b.p + b.n)
            return true;
    return false;
}

// ---- shared memory + shadow ------------------------------------------------------------------
enum { kMaxWarps = 4 };
struct Sh {
    int pend = -1; // thread with a cp.async in flight to this word
    int wt = -1;   // last writer
    uint32_t wbe = 0, wws = 0;
    uint32_t rmask[kMaxWarps] = {0, 0, 0, 0};
    uint32_t rws[kMaxWarps] = {0, 0, 0, 0};
    uint32_t rbe[kMaxWarps] = {0, 0, 0, 0};
};
static std::vector<uint8_t> g_smem;
static std::vector<Sh> g_sh;
static uint32_t g_bepoch = 0;
static uint32_t g_wsync[kMaxWarps];

static inline bool smem_range_ok(uint32_t off, uint32_t n, uint32_t align, const char *what) {
    if (off % align) {
        EMU_ERR("%s: smem offset %u not %u-byte aligned", what, off, align);
        return false;
    }
    if ((uint64_t)off + n > g_smem.size()) {
        EMU_ERR("%s: smem [%u, %u) outside the %zu bytes of dynamic smem", what, off, off + n,
                g_smem.size());
        return false;
    }
    return true;
}

static inline void smem_read_check(int t, uint32_t off, uint32_t n, const char *what) {
    const int w = t / 32, l = t % 32;
    for (uint32_t a = off / 4; a < (off + n + 3) / 4; ++a) {
        Sh &x = g_sh[a];
        if (x.pend >= 0)
            EMU_ERR(
                "%s: reads smem word %u (byte %u) while a cp.async of thread %d to it is in flight",
                what, a, a * 4, x.pend);
        if (x.wt >= 0 && x.wt != t) {
            const bool same = x.wt / 32 == w;
            if (same ? g_wsync[w] == x.wws : g_bepoch == x.wbe)
                EMU_ERR(
                    "%s: RAW race: reads smem byte %u written by thread %d with no barrier between",
                    what, a * 4, x.wt);
        }
        if (x.rws[w] != g_wsync[w])
            x.rmask[w] = 0;
        x.rws[w] = g_wsync[w];
        x.rbe[w] = g_bepoch;
        x.rmask[w] |= 1u << l;
    }
}

static inline void smem_write_check(int t, uint32_t off, uint32_t n, const char *what) {
    const int w = t / 32, l = t % 32;
    for (uint32_t a = off / 4; a < (off + n + 3) / 4; ++a) {
        Sh &x = g_sh[a];
        if (x.pend >= 0)
            EMU_ERR("%s: writes smem byte %u while a cp.async of thread %d to it is in flight",
                    what, a * 4, x.pend);
        if (x.wt >= 0 && x.wt != t) {
            const bool same = x.wt / 32 == w;
            if (same ? g_wsync[w] == x.wws : g_bepoch == x.wbe)
                EMU_ERR("%s: WAW race: smem byte %u last written by thread %d, no barrier between",
                        what, a * 4, x.wt);
        }
        for (int v = 0; v < kMaxWarps; ++v) {
            uint32_t m = x.rmask[v];
            if (v == w)
                m &= ~(1u << l);
            if (!m)
                continue;
            const bool race = v == w ? x.rws[v] == g_wsync[w] : x.rbe[v] == g_bepoch;
            if (race)
                EMU_ERR(
                    "%s: WAR race: smem byte %u read by warp %d lanes %08x with no barrier since",
                    what, a * 4, v, m);
        }
    }
}
static inline void smem_mark_written(int t, uint32_t off, uint32_t n) {
    for (uint32_t a = off / 4; a < (off + n + 3) / 4; ++a) {
        Sh &x = g_sh[a];
        x.wt = t;
        x.wbe = g_bepoch;
        x.wws = g_wsync[t / 32];
    }
}

// pointer-like handle for the kernel's direct smem accesses (the epilogue)
struct SmemPtr {
    uint32_t off;
    template <class I> SmemPtr operator+(I d) const { return SmemPtr{(uint32_t)(off + d)}; }
    template <class T> operator T *() const {
        const uint32_t n = (uint32_t)sizeof(T);
        if (smem_range_ok(off, n, n, "direct smem access")) {
            if (std::is_const<T>::value) {
                smem_read_check(g_cur, off, n, "direct smem load");
            } else {
                smem_write_check(g_cur, off, n, "direct smem store");
                smem_mark_written(g_cur, off, n);
            }
        }
        return (T *)(g_smem.data() + (off % g_smem.size()));
    }
};

// ---- fibers ----------------------------------------------------------------------------------
struct CpOp {
    uint32_t dst;
    uint8_t data[16];
    bool committed; // by cp.async.commit_group: the next wait_group 0 lands it
};
// A fiber's saved context. On x86-64 a switch saves the six callee-saved registers on the
// fiber's own stack and swaps stack pointers (emu_switch_stack, below): swapcontext would make a
// signal-mask system call per switch, most of the emulator's time. Under ASan each switch is
// announced to it (bottom, size: the stack switched to; fake: ASan's state for this one).
// Elsewhere, ucontext.
#if defined(__x86_64__)
#define EMU_FAST_SWITCH 1
struct Ctx {
    void *sp;
    const void *bottom;
    size_t size;
    void *fake;
};
#else
struct Ctx {
    ucontext_t uc;
};
#endif
struct Fiber {
    Ctx ctx;
    std::vector<char> stack;
    bool done = false;
    std::vector<CpOp> cp;
};
static std::vector<Fiber> g_fib;
static Ctx g_main;
static uint64_t g_progress = 0;
static int g_alive = 0;
static std::function<void()> g_body;

static inline void switch_to(Ctx &save, Ctx &load, bool last = false);
static inline void yield() { switch_to(g_fib[g_cur].ctx, g_main); }

// ---- block barrier -----------------------------------------------------------------------------
static int g_b_arrived = 0;
static uint64_t g_b_gen = 0;
static inline void block_barrier_complete() {
    g_b_arrived = 0;
    g_b_gen++;
    g_bepoch++;
    for (int w = 0; w < kMaxWarps; ++w)
        g_wsync[w]++;
}
// One barrier's arrivals are all __syncthreads (kind 1) or all __syncthreads_or (kind 2).
static int g_b_kind = 0;
static int g_b_or = 0, g_b_or_result = 0; // the OR so far, and that of the last completed one
static inline int syncthreads_kind(int kind, int pred) {
    const uint64_t gen = g_b_gen;
    g_progress++;
    if (g_b_kind && g_b_kind != kind)
        EMU_ERR("__syncthreads and __syncthreads_or arrive at one barrier");
    g_b_kind = kind;
    g_b_or |= pred != 0;
    if (++g_b_arrived == g_alive) {
        g_b_or_result = g_b_or;
        g_b_or = 0;
        g_b_kind = 0;
        block_barrier_complete();
    } else {
        while (g_b_gen == gen)
            yield();
    }
    return g_b_or_result;
}
static inline void syncthreads() { syncthreads_kind(1, 0); }
static inline int syncthreads_or(int pred) { return syncthreads_kind(2, pred); }

// ---- warp collectives ------------------------------------------------------------------------
enum Op {
    OP_LDSM = 1,
    OP_LDSM_T,
    OP_MMA_F16,
    OP_MMA_BF16,
    OP_MMA_F16_K8,
    OP_SHFL_XOR,
    OP_ANY,
    OP_SYNCWARP
};
struct CIn {
    int op;
    uint32_t u[4];
    uint32_t b0, b1;
    float c[4];
    float f;
    int i;
    unsigned mask;
};
struct COut {
    uint32_t r[4];
    float c[4];
    float f;
    int i;
};
struct WarpColl {
    int arrived = 0;
    uint64_t gen = 0;
    CIn in[32];
    COut out[32];
};
static WarpColl g_wc[kMaxWarps];

static inline void compute_collective(int w, WarpColl &W) {
    const int op = W.in[0].op;
    for (int l = 0; l < 32; ++l)
        if (W.in[l].op != op) {
            EMU_ERR("warp %d: divergent collectives, lane 0 op %d, lane %d op %d", w, op, l,
                    W.in[l].op);
            break;
        }
    for (int l = 0; l < 32; ++l)
        if ((op == OP_SHFL_XOR || op == OP_ANY || op == OP_SYNCWARP) && W.in[l].mask != 0xffffffffu)
            EMU_ERR("warp %d lane %d: partial member mask %08x", w, l, W.in[l].mask);
    const int base = w * 32;
    if (op == OP_LDSM || op == OP_LDSM_T) {
        // lane l gives the address of row l%8 of matrix l/8 (16 contiguous bytes)
        bool ok[32];
        for (int l = 0; l < 32; ++l) {
            ok[l] = smem_range_ok(W.in[l].u[0], 16, 16, "ldmatrix");
            if (ok[l]) {
                const int save = g_cur;
                g_cur = base + l;
                smem_read_check(base + l, W.in[l].u[0], 16, "ldmatrix");
                g_cur = save;
            }
        }
        // bank conflicts: each 8-lane phase (one matrix) should hit 8 distinct 16-byte bank groups
        for (int m = 0; m < 4; ++m) {
            int seen = 0, conf = 0;
            for (int r = 0; r < 8; ++r) {
                const int grp = (W.in[m * 8 + r].u[0] >> 4) & 7;
                if (seen & (1 << grp))
                    conf++;
                seen |= 1 << grp;
            }
            g_ldsm_phases++;
            if (conf)
                g_ldsm_conflicted++;
        }
        auto elem = [&](int m, int row, int col) -> uint16_t { // matrix m, row, col (b16)
            const int src = m * 8 + row;
            if (!ok[src])
                return 0xffff;
            uint16_t v;
            memcpy(&v, &g_smem[W.in[src].u[0] + 2 * col], 2);
            return v;
        };
        for (int l = 0; l < 32; ++l) {
            const int g = l >> 2, t = l & 3;
            for (int m = 0; m < 4; ++m) {
                uint16_t lo, hi;
                if (op == OP_LDSM) { // row g, cols 2t, 2t+1
                    lo = elem(m, g, 2 * t);
                    hi = elem(m, g, 2 * t + 1);
                } else { // transposed: rows 2t, 2t+1 of col g
                    lo = elem(m, 2 * t, g);
                    hi = elem(m, 2 * t + 1, g);
                }
                W.out[l].r[m] = (uint32_t)lo | ((uint32_t)hi << 16);
            }
        }
    } else if (op == OP_MMA_F16 || op == OP_MMA_BF16 || op == OP_MMA_F16_K8) {
        const bool bf = op == OP_MMA_BF16, k8 = op == OP_MMA_F16_K8;
        if (!k8 && g_sm < 80)
            EMU_ERR("mma.sync.m16n8k16 on an emulated sm_%d (needs sm_80)", g_sm);
        double A[16][16], B[16][8], C[16][8];
        for (int l = 0; l < 32; ++l) {
            const int g = l >> 2, t = l & 3;
            const CIn &x = W.in[l];
            // A: a0 (g, 2t..) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..); m16n8k8: a0, a1
            // B: b0 k rows 2t, 2t+1 col g; b1 k rows 2t+8, 2t+9 col g; m16n8k8: b0
            // (the PTX ISA's fragments; m16n8k8's columns 8..15 of A and rows 8..15 of B are 0)
            for (int r = 0; r < 4; ++r) {
                const int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
                A[row][col] = k8 && r >= 2 ? 0.0 : lo_f(x.u[r], bf);
                A[row][col + 1] = k8 && r >= 2 ? 0.0 : hi_f(x.u[r], bf);
            }
            B[2 * t][g] = lo_f(x.b0, bf);
            B[2 * t + 1][g] = hi_f(x.b0, bf);
            B[2 * t + 8][g] = k8 ? 0.0 : lo_f(x.b1, bf);
            B[2 * t + 9][g] = k8 ? 0.0 : hi_f(x.b1, bf);
            // C: c0,c1 (g, 2t, 2t+1) c2,c3 (g+8, 2t, 2t+1)
            C[g][2 * t] = x.c[0];
            C[g][2 * t + 1] = x.c[1];
            C[g + 8][2 * t] = x.c[2];
            C[g + 8][2 * t + 1] = x.c[3];
        }
        float D[16][8];
        for (int i = 0; i < 16; ++i)
            for (int j = 0; j < 8; ++j) {
                double s = C[i][j];
                for (int k = 0; k < 16; ++k)
                    s += A[i][k] * B[k][j];
                D[i][j] = (float)s;
            }
        for (int l = 0; l < 32; ++l) {
            const int g = l >> 2, t = l & 3;
            W.out[l].c[0] = D[g][2 * t];
            W.out[l].c[1] = D[g][2 * t + 1];
            W.out[l].c[2] = D[g + 8][2 * t];
            W.out[l].c[3] = D[g + 8][2 * t + 1];
        }
    } else if (op == OP_SHFL_XOR) {
        for (int l = 0; l < 32; ++l) {
            if (W.in[l].i != W.in[0].i)
                EMU_ERR("shfl_xor: lanes differ in laneMask");
            W.out[l].f = W.in[(l ^ W.in[l].i) & 31].f;
        }
    } else if (op == OP_ANY) {
        int any = 0;
        for (int l = 0; l < 32; ++l)
            any |= W.in[l].i != 0;
        for (int l = 0; l < 32; ++l)
            W.out[l].i = any;
    } else if (op == OP_SYNCWARP) {
        g_wsync[w]++;
    }
}

static inline COut collective(const CIn &x) {
    const int t = g_cur, w = t / 32, l = t % 32;
    WarpColl &W = g_wc[w];
    W.in[l] = x;
    const uint64_t gen = W.gen;
    g_progress++;
    if (++W.arrived == 32) {
        compute_collective(w, W);
        W.arrived = 0;
        W.gen++;
    } else {
        while (W.gen == gen)
            yield();
    }
    return W.out[l];
}

// ---- cp.async ------------------------------------------------------------------------------
// A 16-byte copy's checks (dst inside shared memory, src 16-byte aligned and, read or not,
// inside a buffer: the kernels pass a row that exists) and its data: src's bytes, zeros when
// !valid, NaN bytes from a bad source. False when dst is bad (nothing to copy).
static inline bool copy16_source(uint32_t dst, const void *src, bool valid, const char *what,
                                 uint8_t (&data)[16]) {
    if (!smem_range_ok(dst, 16, 16, what))
        return false;
    if ((uintptr_t)src % 16)
        EMU_ERR("%s: global src %p not 16-byte aligned", what, src);
    const bool inside = global_ok(src, 16);
    if (!inside)
        EMU_ERR("%s: global src %p (valid=%d) outside every buffer", what, src, (int)valid);
    smem_write_check(g_cur, dst, 16, what);
    if (valid && inside)
        memcpy(data, src, 16);
    else
        memset(data, valid ? 0xff : 0, 16);
    return true;
}
static inline void cp_async16(uint32_t dst, const void *src, bool valid) {
    const int t = g_cur;
    CpOp op;
    if (!copy16_source(dst, src, valid, "cp.async", op.data))
        return;
    op.dst = dst;
    op.committed = false;
    for (uint32_t a = dst / 4; a < dst / 4 + 4; ++a)
        g_sh[a].pend = t;
    memset(&g_smem[dst], 0xff, 16); // poison until it lands
    g_fib[t].cp.push_back(op);
}
// The sm_75 build's fa_cp_async16: ld.global then st.shared, done when it returns.
static inline void copy16_sync(uint32_t dst, const void *src, bool valid) {
    uint8_t data[16];
    if (!copy16_source(dst, src, valid, "16-byte copy", data))
        return;
    memcpy(&g_smem[dst], data, 16);
    smem_mark_written(g_cur, dst, 16);
}
static inline void cp_async_commit() {
    for (auto &op : g_fib[g_cur].cp)
        op.committed = true;
}
static inline void cp_async_wait_all() {
    const int t = g_cur;
    std::vector<CpOp> keep;
    for (auto &op : g_fib[t].cp) {
        if (!op.committed) { // not waited for by wait_group
            keep.push_back(op);
            continue;
        }
        memcpy(&g_smem[op.dst], op.data, 16);
        for (uint32_t a = op.dst / 4; a < op.dst / 4 + 4; ++a)
            g_sh[a].pend = -1;
        smem_mark_written(t, op.dst, 16);
    }
    g_fib[t].cp.swap(keep);
}

// ---- fibers, launch --------------------------------------------------------------------------
static std::vector<std::pair<const void *, int>> g_func_attr;

// Every fiber starts here and ends by switching back to the scheduler for good.
static void fiber_entry() {
#if defined(EMU_FAST_SWITCH) && defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(nullptr, &g_main.bottom, &g_main.size); // from the scheduler
#endif
    g_body();
    Fiber &f = g_fib[g_cur];
    if (!f.cp.empty())
        EMU_ERR("thread exits with %zu cp.async not waited for", f.cp.size());
    f.done = true;
    g_alive--;
    g_progress++;
    if (g_b_arrived > 0 && g_b_arrived == g_alive)
        block_barrier_complete();
    switch_to(f.ctx, g_main, true);
    abort(); // a finished fiber is never resumed
}

#ifdef EMU_FAST_SWITCH
} // namespace emu
// Saves rbp, rbx, r12-r15 on the current stack and the stack pointer in *save_sp, then loads
// load_sp and pops the same registers from it (a stack saved the same way, or a new one whose
// "return address" is fiber_entry).
extern "C" void emu_switch_stack(void **save_sp, void *load_sp);
asm(".text\n.globl emu_switch_stack\n.hidden emu_switch_stack\n"
    ".type emu_switch_stack,@function\nemu_switch_stack:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n  ret\n"
    ".size emu_switch_stack, .-emu_switch_stack\n");
namespace emu {
static inline void switch_to(Ctx &save, Ctx &load, bool last) {
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_start_switch_fiber(last ? nullptr : &save.fake, load.bottom, load.size);
#else
    (void)last;
#endif
    emu_switch_stack(&save.sp, load.sp);
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_finish_switch_fiber(save.fake, nullptr, nullptr); // back on save's stack
#endif
}
// A new stack that emu_switch_stack "returns" into fiber_entry from, 16-byte aligned as after
// a call; six zeros for the registers it pops first.
static inline void start(Fiber &f) {
#ifdef __SANITIZE_ADDRESS__
    /* a finished fiber left its frames' redzones poisoned: the stack is new again */
    __asan_unpoison_memory_region(f.stack.data(), f.stack.size());
#endif
    const uintptr_t top = ((uintptr_t)f.stack.data() + f.stack.size()) & ~(uintptr_t)15;
    void **at = (void **)(top - 16);
    at[1] = nullptr; // fiber_entry's own return address: it never returns
    at[0] = (void *)fiber_entry;
    for (int r = 1; r <= 6; ++r)
        at[-r] = nullptr;
    f.ctx.sp = at - 6;
    f.ctx.bottom = f.stack.data();
    f.ctx.size = f.stack.size();
    f.ctx.fake = nullptr;
}
#else
static inline void switch_to(Ctx &save, Ctx &load, bool) { swapcontext(&save.uc, &load.uc); }
static inline void start(Fiber &f) {
    getcontext(&f.ctx.uc);
    f.ctx.uc.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc.uc_stack.ss_size = f.stack.size();
    f.ctx.uc.uc_link = nullptr;
    makecontext(&f.ctx.uc, fiber_entry, 0);
}
#endif

static long g_blocks_run = 0;

static void run_block(unsigned bx, int nthreads, int smem_bytes) {
    g_bx = bx;
    g_nthreads = nthreads;
    g_smem.assign(smem_bytes, 0xff);
    g_sh.assign((smem_bytes + 3) / 4, Sh());
    g_bepoch = 1;
    for (int w = 0; w < kMaxWarps; ++w) {
        g_wsync[w] = 1;
        g_wc[w].arrived = 0;
    }
    g_b_arrived = 0;
    g_b_kind = g_b_or = 0;
    if ((int)g_fib.size() < nthreads)
        g_fib.resize(nthreads);
    g_alive = nthreads;
    for (int t = 0; t < nthreads; ++t) {
        Fiber &f = g_fib[t];
        f.done = false;
        f.cp.clear();
        if (f.stack.empty())
            f.stack.resize(256 * 1024);
        start(f);
    }
    while (g_alive > 0) {
        const uint64_t before = g_progress;
        for (int t = 0; t < nthreads; ++t) {
            if (g_fib[t].done)
                continue;
            g_cur = t;
            switch_to(g_main, g_fib[t].ctx);
        }
        if (g_progress == before && g_alive > 0) {
            EMU_ERR(
                "deadlock: %d threads alive, block barrier arrivals %d, warp arrivals %d %d %d %d",
                g_alive, g_b_arrived, g_wc[0].arrived, g_wc[1].arrived, g_wc[2].arrived,
                g_wc[3].arrived);
            fprintf(stderr, "aborting on deadlock\n");
            exit(3);
        }
    }
    g_blocks_run++;
}

template <class K, class... A>
static void launch(K kern, unsigned grid, int block, int smem_bytes, A... args) {
    int maxdyn = 48 * 1024;
    for (auto &a : g_func_attr)
        if (a.first == (const void *)kern)
            maxdyn = a.second;
    if (smem_bytes > maxdyn)
        EMU_ERR("launch: %d bytes of dynamic smem > the %d allowed", smem_bytes, maxdyn);
    if (smem_bytes > smem_optin(g_sm))
        EMU_ERR("launch: %d bytes of smem > the %d a block has on sm_%d", smem_bytes,
                smem_optin(g_sm), g_sm);
    if (block / 32 > kMaxWarps || block % 32) {
        EMU_ERR("launch: block %d unsupported by the emulator", block);
        return;
    }
    if (grid == 0) {
        EMU_ERR("launch: empty grid");
        return;
    }
    g_gridx = grid;
    g_body = [&]() { kern(args...); };
    for (unsigned bx = 0; bx < grid; ++bx)
        run_block(bx, block, smem_bytes);
}

// `kernel<<<grid, block, smem, stream>>>(args)` becomes (emu_kernel.cmake)
// `kernel ^ emu::LaunchCfg{grid, block, smem, stream}(args)`: the config binds the arguments,
// operator^ launches. Templated constructor: the launch's own argument types, no narrowing.
struct LaunchCfg {
    unsigned grid;
    int block, smem;
    template <class G, class B, class S = int, class T = cudaStream_t>
    LaunchCfg(G g, B b, S sm = 0, T = nullptr) : grid((unsigned)g), block((int)b), smem((int)sm) {}
    template <class... A> std::pair<LaunchCfg, std::tuple<A...>> operator()(A... a) const {
        return {*this, std::tuple<A...>(a...)};
    }
};

} // namespace emu

template <class... P, class... A>
static void operator^(void (*kern)(P...), const std::pair<emu::LaunchCfg, std::tuple<A...>> &l) {
    std::apply([&](A... a) { emu::launch(kern, l.first.grid, l.first.block, l.first.smem, a...); },
               l.second);
}

#define EMU_SMEM_DECL                                                                              \
    emu::SmemPtr smem { 0 }

template <class F> static cudaError_t cudaFuncSetAttribute(F f, cudaFuncAttribute attr, int v) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (v > emu::smem_optin(emu::g_sm))
            return cudaErrorInvalidValue; /* as the runtime: more than the device has */
        for (auto &a : emu::g_func_attr)
            if (a.first == (const void *)f) {
                a.second = v;
                return cudaSuccess;
            }
        emu::g_func_attr.push_back({(const void *)f, v});
    }
    return cudaSuccess;
}
static inline cudaError_t cudaGetLastError() { return cudaSuccess; }
static inline void __trap() {
    EMU_ERR("trap: a kernel with no body for the emulated sm_%d ran", emu::g_sm);
}

#define threadIdx (emu::Dim3{(unsigned)emu::g_cur, 0u, 0u})
#define blockIdx (emu::Dim3{emu::g_bx, 0u, 0u})
#define blockDim (emu::Dim3{(unsigned)emu::g_nthreads, 1u, 1u})
#define gridDim (emu::Dim3{emu::g_gridx, 1u, 1u})

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline float __fmul_rn(float a, float b) { return a * b; } // no contraction in C++
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline void __syncthreads() { emu::syncthreads(); }
static inline int __syncthreads_or(int pred) { return emu::syncthreads_or(pred); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    emu::CIn x{};
    x.op = emu::OP_SYNCWARP;
    x.mask = mask;
    emu::collective(x);
}
static inline float __shfl_xor_sync(unsigned mask, float v, int laneMask, int width = 32) {
    if (width != 32)
        EMU_ERR("shfl width %d", width);
    emu::CIn x{};
    x.op = emu::OP_SHFL_XOR;
    x.mask = mask;
    x.f = v;
    x.i = laneMask;
    return emu::collective(x).f;
}
static inline int __any_sync(unsigned mask, int pred) {
    emu::CIn x{};
    x.op = emu::OP_ANY;
    x.mask = mask;
    x.i = pred;
    return emu::collective(x).i;
}
static inline float __fdividef(float a, float b) {
    const float ab = fabsf(b);
    if (ab > 8.507059e37f && ab <= 3.4028235e38f)
        return 0.0f * a; // 2^126 < |b| < 2^128
    return a / b;
}
#define __log2f(x) log2f(x)
