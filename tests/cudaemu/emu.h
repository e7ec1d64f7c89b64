/* A test-only CPU emulator of the CUDA the backend uses, so that model/cuda/ runs (slowly) on
 * machines without a GPU: CI checks every kernel's index arithmetic, synchronization, shared
 * memory use and launch configuration against the CPU backend, and under AddressSanitizer
 * every out-of-bounds "device" access. It says nothing about speed, and little about what only
 * the hardware decides (the order of a tensor-core product's sums, __expf's last bits).
 *
 * How: the build (tests/CMakeLists.txt) copies each .cu file of model/cuda/ to a .cc, turning
 * `k<<<grid, block, smem, stream>>>(args)` into `EMU_LAUNCH(k, grid, block, smem, stream)(args)`
 * and `extern __shared__ T name[];` into a pointer to this launch's dynamic shared memory, and
 * compiles it with g++ with this header force-included (-include) and TR_CUDA_EMU defined.
 *
 * A launch is queued on its stream and runs later, when the runtime's scheduler reaches it (by
 * default in a seeded random order across streams that keeps only what CUDA guarantees, so
 * that a missing wait gives wrong numbers: emu_sched.cc); it runs its blocks one after another; a block's threads are cooperative fibers
 * (emu_runtime.cc). A thread runs until it reaches __syncthreads, a warp shuffle or a
 * tensor-core product, or ends; when every live thread of the block (or of the warp) is
 * there, they go on. __shared__ variables become function statics (one block at a time, so one
 * copy per block is right). A barrier that can never complete (divergent __syncthreads, a
 * shuffle some lanes of a warp never reach) is reported as a deadlock naming the kernel.
 * TR_EMU_ORDER=reverse runs the threads of each block in reverse order, which changes the
 * outcome of a missing barrier. */
#ifndef TR_CUDA_EMU_H
#define TR_CUDA_EMU_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
/* Static __shared__ arrays become function statics. Outside AddressSanitizer they go to the
 * section emu_shared, which the runtime fills with NaN before every block as it does dynamic
 * shared memory (so a read before any write shows), and by which the profiler (emu_prof.cc)
 * tells shared from global addresses. Under AddressSanitizer they stay ordinary statics: it
 * guards those with red zones, and not globals placed in a named section. */
#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN_BUILD 1
#endif
#endif
#ifndef EMU_ASAN_BUILD
#define __shared__ static __attribute__((section("emu_shared")))
#else
#define __shared__ static
#endif
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)

/* ---- the current thread, block and grid ------------------------------------------------ */
extern uint3 *emu_tid; /* the running fiber's threadIdx */
extern uint3 emu_bid;
extern dim3 emu_bdim, emu_gdim;
#define threadIdx (*emu_tid)
#define blockIdx emu_bid
#define blockDim emu_bdim
#define gridDim emu_gdim
#define warpSize 32

/* ---- synchronization and warp exchange -------------------------------------------------- */
void emu_syncthreads(void);
#define __syncthreads() emu_syncthreads()
/* every live lane of the caller's warp hands in `bytes` (at most EMU_XCHG_MAX) at mine and
 * gets back 32 slots of EMU_XCHG_MAX bytes in lane order (lanes that have ended: zeros), valid
 * until the caller's next warp operation. `mask` must name every live lane. */
#define EMU_XCHG_MAX 64
const void *emu_warp_exchange(unsigned mask, const void *mine, size_t bytes, const char *op);
extern int emu_lane_now; /* the running thread's lane */
static inline int emu_lane(void) { return emu_lane_now; }
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    char c = 0;
    emu_warp_exchange(mask, &c, 1, "__syncwarp");
}

/* src: the source lane, already resolved by the caller per CUDA's rules for its shuffle */
template <class T> static inline T emu_shfl(unsigned mask, T v, int src, const char *op) {
    static_assert(sizeof(T) <= EMU_XCHG_MAX, "shuffled type too large for the emulator");
    const unsigned char *all = (const unsigned char *)emu_warp_exchange(mask, &v, sizeof(T), op);
    T r;
    memcpy(&r, all + (size_t)src * EMU_XCHG_MAX, sizeof(T));
    return r;
}
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return emu_shfl(mask, v, (emu_lane() & ~(width - 1)) + (src & (width - 1)), "__shfl_sync");
}
/* Offsets and lane masks count modulo 32 (PTX shfl.sync uses b[4:0]). __shfl_xor_sync may read
 * a lane of an earlier group of `width` lanes; one of a later group gives the caller its own
 * value (CUDA Programming Guide; PTX shfl.bfly: the source is valid up to the segment's end). */
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int lm, int width = 32) {
    int lane = emu_lane(), src = lane ^ (lm & 31);
    if (src >= (lane & ~(width - 1)) + width) src = lane;
    return emu_shfl(mask, v, src, "__shfl_xor_sync");
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    int lane = emu_lane(), src = lane + (int)(d & 31);
    if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
    return emu_shfl(mask, v, src, "__shfl_down_sync");
}
template <class T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    int lane = emu_lane(), src = lane - (int)(d & 31);
    if (src < (lane & ~(width - 1))) src = lane;
    return emu_shfl(mask, v, src, "__shfl_up_sync");
}

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, C += A B, with the fragment layouts of
 * the PTX ISA (emu_runtime.cc) */
void emu_mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);

/* ---- device intrinsics, with host meanings ----------------------------------------------- */
#define __expf expf /* glibc declares its own __expf and __logf */
#define __logf logf
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
template <class T> static inline T min(T a, T b) { return b < a ? b : a; }
template <class T> static inline T max(T a, T b) { return a < b ? b : a; }

/* ---- device memory accounting (emu_device.cc) --------------------------------------------
 * cudaMalloc's calls and bytes so far, cudaFree's calls, and the bytes held now and at most. */
typedef struct {
    unsigned long mallocs, frees;
    unsigned long long bytes, live, peak;
} emu_mem_stats;
extern "C" void emu_mem_counts(emu_mem_stats *s);
/* Training step `step` (1, 2, ...) is done: from then on a cudaMalloc aborts with one line
 * naming its size and the step. 0 allows them again (training is over: sampling's caches). */
extern "C" void emu_mem_step(int step);

/* ---- launches ---------------------------------------------------------------------------- */
void *emu_dyn_smem(void);
/* 1 when the configuration may launch (else cudaGetLastError's error is set, as a launch
 * refused by CUDA sets it at once) */
int emu_launch_ok(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem);
void emu_run(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem,
             void (*body)(void *), void *ctx);
/* Work given to stream s (emu_sched.cc): run(ctx) runs later, on the host, when the
 * emulator's scheduler reaches it in an order CUDA allows (TR_EMU_SCHED, TR_EMU_SEED); run
 * frees ctx. */
void emu_stream_exec(cudaStream_t s, const char *what, void (*run)(void *), void *ctx);

template <class L> static void emu_run_job(void *c) {
    L *l = (L *)c;
    (*l)();
    delete l;
}

template <class F> struct emu_launcher {
    F *f;
    const char *name;
    dim3 g, b;
    size_t smem;
    cudaStream_t s;
    template <class... A> void operator()(A... a) {
        F *fn = f;
        const char *nm = name;
        dim3 gg = g, bb = b;
        size_t sm = smem;
        if (!emu_launch_ok(nm, (const void *)fn, gg, bb, sm)) return;
        /* the arguments are copied now, as a launch copies them; the kernel runs later */
        auto job = [=]() {
            auto call = [&]() { fn(a...); };
            emu_run(
                nm, (const void *)fn, gg, bb, sm, [](void *c) { (*(decltype(call) *)c)(); },
                &call);
        };
        emu_stream_exec(s, nm, &emu_run_job<decltype(job)>, new decltype(job)(job));
    }
};
template <class F>
static inline emu_launcher<F> emu_launch(F *f, const char *name, dim3 g, dim3 b, size_t smem = 0,
                                         cudaStream_t s = 0) {
    /* every launch is queued on s, to run when the scheduler reaches it */
    return emu_launcher<F>{f, name, g, b, smem, s};
}
#define EMU_LAUNCH(k, ...) emu_launch(k, #k, __VA_ARGS__)

#endif
