/* The CUDA emulator's runtime (see emu.h): kernel launches on cooperative fibers, barriers,
 * warp exchanges and the tensor-core product, the launch configuration's checks and errors,
 * and the mutants of model/mutant.h. The rest of the CUDA runtime API subset is in
 * emu_sched.cc (the scheduler), emu_streams.cc (streams, events) and emu_device.cc (the device,
 * memory, copies); emu_runtime_private.h is what they share. Test-only. */
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <map>

#include "emu.h"
#include "emu_prof.h"
#include "emu_runtime_private.h"

using namespace emu_rt;

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

uint3 *emu_tid;
uint3 emu_bid;
dim3 emu_bdim, emu_gdim;

namespace emu_rt {
void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda emulator: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    abort();
}
} // namespace emu_rt

/* ---- fibers ------------------------------------------------------------------------------ */

enum { RUNNING, AT_BLOCK, AT_WARP, DONE };
#define STACK_BYTES ((size_t)512 << 10)
#define XCHG_MAX EMU_XCHG_MAX

/* Switching fibers: on x86-64 a hand-written switch of the callee-saved registers
 * (ucontext's swapcontext makes a system call per switch, which made it three quarters of the
 * emulator's time); elsewhere ucontext. The floating-point control words are not switched:
 * nothing the kernels do changes the rounding mode. */
#if defined(__x86_64__)
#define EMU_FAST_SWITCH 1
extern "C" void emu_switch(void **save_sp, void *new_sp);
asm(".text\n"
    ".globl emu_switch\n"
    ".type emu_switch,@function\n"
    "emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_switch, .-emu_switch\n");
#endif

struct fiber {
#ifdef EMU_FAST_SWITCH
    void *sp;
#else
    ucontext_t uc;
#endif
    void *stack;
    uint3 tid;
    int state;
    unsigned mask; /* the warp op's mask */
    const char *op;
};

/* Two buffers a warp: the lanes hand in to buf[in]; its release makes that buffer `out` and
 * the other one the next exchange's, which no lane writes before every lane has read `out`
 * (each reads it as it resumes, before its next warp operation). */
struct warp {
    unsigned char buf[2][32][XCHG_MAX];
    const unsigned char (*out)[XCHG_MAX]; /* the completed exchange, read after release */
    int in;
    size_t bytes;
};

static struct {
    const char *kernel;
    fiber th[MAX_THREADS];
    warp wp[MAX_THREADS / 32];
    int n, cur, reverse;
#ifdef EMU_FAST_SWITCH
    void *sched_sp;
#else
    ucontext_t sched;
#endif
    void (*body)(void *);
    void *ctx;
    unsigned char *dyn;
    size_t dyn_bytes;
#ifdef EMU_ASAN
    void *fake_stack;
    const void *sched_bottom; /* the scheduler's (the launching thread's) stack, for switches */
    size_t sched_size;        /* back to it */
    int by_fiber;             /* the last switch was a fiber's hand-over, not the scheduler's */
#endif
} E;

#ifdef EMU_FAST_SWITCH
#define SWITCH_TO_SCHED(f) emu_switch(&(f)->sp, E.sched_sp)
#define SWITCH_TO_FIBER(f) emu_switch(&E.sched_sp, (f)->sp)
#else
#define SWITCH_TO_SCHED(f) swapcontext(&(f)->uc, &E.sched)
#define SWITCH_TO_FIBER(f) swapcontext(&E.sched, &(f)->uc)
#endif

int emu_thread_now;
int emu_lane_now;

/* The fiber that runs now: what run_fiber and a hand-over set before switching to it. */
static void set_current(int i) {
    E.cur = i;
    emu_thread_now = i;
    emu_lane_now = i % 32;
    emu_tid = &E.th[i].tid;
}

#ifdef EMU_FAST_SWITCH
/* The lane that run_block would run next in the running warp's pass (its order, forward or
 * reverse), or -1: a fiber that stops hands over to it directly, one switch instead of two
 * through the scheduler, which then finds no lane of the pass left to run. */
static int next_in_pass(void) {
    int lo = E.cur / 32 * 32, hi = lo + 32 < E.n ? lo + 32 : E.n;
    if (E.reverse) {
        for (int i = E.cur - 1; i >= lo; i--)
            if (E.th[i].state == RUNNING) return i;
    } else {
        for (int i = E.cur + 1; i < hi; i++)
            if (E.th[i].state == RUNNING) return i;
    }
    return -1;
}
#endif

#ifdef EMU_ASAN
/* A fiber resumes, by the scheduler or by another fiber's hand-over: only the scheduler's
 * stack is the one to_scheduler returns to. */
static void resumed(void *fake_stack) {
    int sched = !E.by_fiber;
    __sanitizer_finish_switch_fiber(fake_stack, sched ? &E.sched_bottom : NULL,
                                    sched ? &E.sched_size : NULL);
}
#endif

static void to_scheduler(void) {
    fiber *f = &E.th[E.cur];
#ifdef EMU_ASAN
    void *fs = NULL;
#endif
#ifdef EMU_FAST_SWITCH
    int next = next_in_pass();
    if (next >= 0) {
        set_current(next);
#ifdef EMU_ASAN
        __sanitizer_start_switch_fiber(f->state == DONE ? NULL : &fs, E.th[next].stack,
                                       STACK_BYTES);
        E.by_fiber = 1;
        emu_switch(&f->sp, E.th[next].sp);
        resumed(fs);
#else
        emu_switch(&f->sp, E.th[next].sp);
#endif
        return;
    }
#endif
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(f->state == DONE ? NULL : &fs, E.sched_bottom, E.sched_size);
    SWITCH_TO_SCHED(f);
    resumed(fs);
#else
    SWITCH_TO_SCHED(f);
#endif
}

static void trampoline(void) {
#ifdef EMU_ASAN
    resumed(NULL);
#endif
    E.body(E.ctx);
    E.th[E.cur].state = DONE;
    to_scheduler();
    die("%s: a finished thread was resumed", E.kernel);
}

int emu_block_now(void) { return (int)(emu_bid.x + emu_gdim.x * (emu_bid.y + emu_gdim.y * emu_bid.z)); }

static void run_fiber(int i) {
    set_current(i);
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&E.fake_stack, E.th[i].stack, STACK_BYTES);
    E.by_fiber = 0;
    SWITCH_TO_FIBER(&E.th[i]);
    __sanitizer_finish_switch_fiber(E.fake_stack, NULL, NULL);
#else
    SWITCH_TO_FIBER(&E.th[i]);
#endif
}

void emu_syncthreads(void) {
    E.th[E.cur].state = AT_BLOCK;
    to_scheduler();
}

const void *emu_warp_exchange(unsigned mask, const void *mine, size_t bytes, const char *op) {
    if (bytes > XCHG_MAX) die("%s: %s exchanges more bytes than the emulator holds", E.kernel, op);
    int w = E.cur / 32, lane = E.cur % 32;
    fiber *f = &E.th[E.cur];
    f->state = AT_WARP;
    f->mask = mask;
    f->op = op;
    memcpy(E.wp[w].buf[E.wp[w].in][lane], mine, bytes);
    E.wp[w].bytes = bytes;
    to_scheduler();
    return E.wp[w].out; /* unchanged until this lane's next warp operation */
}

/* Warp w's exchange, when every live lane of it waits at a warp operation: the lanes' values
 * go to `out` and they run again. Returns 1 when it released them. */
static int release_warp(int w) {
    int lo = w * 32, hi = lo + 32 < E.n ? lo + 32 : E.n, first = -1;
    unsigned live_lanes = 0;
    for (int i = lo; i < hi; i++) {
        if (E.th[i].state == DONE) continue;
        if (E.th[i].state != AT_WARP) return 0;
        live_lanes |= 1u << (i - lo);
        if (first < 0) first = i;
    }
    if (first < 0) return 0;
    for (int i = lo; i < hi; i++) {
        fiber *f = &E.th[i];
        if (f->state != AT_WARP) continue;
        if ((f->mask & live_lanes) != live_lanes)
            die("%s: %s with a mask that leaves out live lanes of the warp (the emulator "
                "supports only whole-warp operations)", E.kernel, f->op);
        if (f->op != E.th[first].op && strcmp(f->op, E.th[first].op))
            die("%s: lanes of one warp are at different warp operations (%s)", E.kernel, f->op);
    }
    warp *wp = &E.wp[w];
    for (int i = lo; i < lo + 32; i++)
        if (i >= hi || E.th[i].state != AT_WARP) memset(wp->buf[wp->in][i - lo], 0, wp->bytes);
    wp->out = wp->buf[wp->in];
    wp->in ^= 1;
    emu_prof_flush_warp(w, E.n);
    for (int i = lo; i < hi; i++)
        if (E.th[i].state == AT_WARP) E.th[i].state = RUNNING;
    return 1;
}

/* One block: each warp in turn runs as far as it can (its lanes round-robin, its exchanges
 * completed as soon as all its live lanes arrive), which lets a warp run ahead of the others
 * up to the next __syncthreads; when no thread can run, the block barrier opens if every live
 * thread is at it, and otherwise the block is deadlocked. */
static void run_block(void) {
    int nw = (E.n + 31) / 32;
    for (;;) {
        for (int wk = 0; wk < nw; wk++) {
            int w = E.reverse ? nw - 1 - wk : wk;
            int lo = w * 32, hi = lo + 32 < E.n ? lo + 32 : E.n;
            for (;;) {
                int ran = 0;
                for (int k = lo; k < hi; k++) {
                    int i = E.reverse ? hi - 1 - (k - lo) : k;
                    if (E.th[i].state == RUNNING) {
                        run_fiber(i);
                        ran = 1;
                    }
                }
                if (!ran || !release_warp(w)) break;
            }
        }
        int live = 0, at_block = 0, at_warp = 0;
        for (int i = 0; i < E.n; i++) {
            live += E.th[i].state != DONE;
            at_block += E.th[i].state == AT_BLOCK;
            at_warp += E.th[i].state == AT_WARP;
        }
        if (!live || at_block == live)
            for (int w = 0; w < nw; w++) emu_prof_flush_warp(w, E.n);
        if (!live) return;
        if (at_block == live) {
            emu_prof_barrier();
            for (int i = 0; i < E.n; i++)
                if (E.th[i].state == AT_BLOCK) E.th[i].state = RUNNING;
            continue;
        }
        char what[128];
        snprintf(what, sizeof(what), "%d threads wait at __syncthreads, %d at warp operations",
                 at_block, at_warp);
        die("deadlock in kernel %s: %s (a barrier some threads never reach)", E.kernel, what);
    }
}

static void *stack_for(int i) {
    if (!E.th[i].stack) {
        void *s = mmap(NULL, STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (s == MAP_FAILED) die("%s: cannot map a fiber stack", E.kernel);
        E.th[i].stack = s;
    }
    return E.th[i].stack;
}

/* A fresh fiber that starts in trampoline(). For the fast switch its stack is laid out as
 * emu_switch leaves a suspended one: six registers, the return address
 * (trampoline), and above it a zero return address for trampoline's own frame. */
static void fiber_init(fiber *f, void *stack, int i) {
#ifdef EMU_FAST_SWITCH
    /* stack tops staggered by 192 B per fiber: at one page offset they would all fall in the
     * same few cache sets */
    uint64_t *top = (uint64_t *)((char *)stack + STACK_BYTES - (size_t)(i % 21) * 192);
    top[-1] = 0;
    top[-2] = (uint64_t)(uintptr_t)trampoline;
    for (int r = 3; r <= 8; r++) top[-r] = 0; /* rbp rbx r12 r13 r14 r15 */
    f->sp = &top[-8];
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = stack;
    f->uc.uc_stack.ss_size = STACK_BYTES;
    f->uc.uc_link = NULL;
    makecontext(&f->uc, trampoline, 0);
#endif
}

/* ---- launches ---------------------------------------------------------------------------- */

static cudaError_t last_error = cudaSuccess;

/* What the program asked of the device (see emu_runtime_private.h): tests use it to check,
 * for example, that training steps allocate no device memory. */
namespace emu_rt {
run_stats stats;
} // namespace emu_rt
__attribute__((destructor)) static void print_stats(void) {
    const char *e = getenv("TR_EMU_STATS");
    if (!e || !*e || !strcmp(e, "0")) return;
    fprintf(stderr,
            "cuda emulator stats: %lu launches, %lu cudaMalloc (%llu bytes), %lu cudaFree, "
            "%lu synchronizations, %lu host-to-device copies (%llu bytes), %lu device-to-host "
            "copies (%llu bytes), %lu library calls (cuBLASLt products, cuDNN graphs)\n",
            stats.launches, stats.mallocs, stats.malloc_bytes, stats.frees, stats.syncs, stats.h2d,
            stats.h2d_bytes, stats.d2h, stats.d2h_bytes, stats.library);
}
static std::map<const void *, int> max_dyn_smem; /* cudaFuncSetAttribute's opt-ins */

void *emu_dyn_smem(void) { return E.dyn; }

/* the static __shared__ arrays of every kernel (emu.h); absent under AddressSanitizer */
extern "C" char __start_emu_shared[] __attribute__((weak));
extern "C" char __stop_emu_shared[] __attribute__((weak));

int emu_launch_ok(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem) {
    size_t nt = (size_t)block.x * block.y * block.z;
    size_t limit = SMEM_DEFAULT;
    auto it = max_dyn_smem.find(fn);
    if (it != max_dyn_smem.end()) limit = (size_t)it->second;
    if (nt == 0 || nt > MAX_THREADS || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        grid.y > 65535 || grid.z > 65535 || block.z > 64) {
        fprintf(stderr, "cuda emulator: %s launched with grid (%u,%u,%u), block (%u,%u,%u)\n", name,
                grid.x, grid.y, grid.z, block.x, block.y, block.z);
        last_error = cudaErrorInvalidConfiguration;
        return 0;
    }
    if (smem > limit) {
        fprintf(stderr, "cuda emulator: %s asks %zu B of dynamic shared memory, over its limit %zu B\n",
                name, smem, limit);
        last_error = cudaErrorInvalidValue;
        return 0;
    }
    return 1;
}

/* the configuration was checked by emu_launch_ok when the kernel was launched */
void emu_run(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem,
             void (*body)(void *), void *ctx) {
    (void)fn;
    size_t nt = (size_t)block.x * block.y * block.z;
    if (E.kernel) die("%s launched from inside kernel %s", name, E.kernel);
    stats.launches++;
    E.kernel = name;
    E.body = body;
    E.ctx = ctx;
    E.n = (int)nt;
    const char *order = getenv("TR_EMU_ORDER");
    E.reverse = order && !strcmp(order, "reverse");
    if (smem != E.dyn_bytes || !E.dyn) {
        /* exactly the size asked for, so that AddressSanitizer sees an access past it */
        free(E.dyn);
        E.dyn = NULL;
        if (posix_memalign((void **)&E.dyn, 128, smem ? smem : 1))
            die("%s: out of memory for shared memory", name);
        E.dyn_bytes = smem;
    }
    emu_gdim = grid;
    emu_bdim = block;
    emu_prof_launch(name, E.dyn, smem);
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                emu_bid = make_uint3(bx, by, bz);
                /* unwritten shared memory reads as NaN, dynamic and static (emu.h) */
                if (smem) memset(E.dyn, 0xff, smem);
                if (__start_emu_shared)
                    memset(__start_emu_shared, 0xff, (size_t)(__stop_emu_shared - __start_emu_shared));
                for (int i = 0; i < E.n; i++) {
                    fiber *f = &E.th[i];
                    f->tid = make_uint3(i % block.x, i / block.x % block.y, i / (block.x * block.y));
                    f->state = RUNNING;
                    fiber_init(f, stack_for(i), i);
                }
                emu_prof_barrier();
                run_block();
            }
    emu_prof_launch(NULL, NULL, 0);
    E.kernel = NULL;
}

/* ---- mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 -------------------------------
 * PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type": with g = lane / 4
 * and t = lane % 4, a 16-bit A (16 x 16, row) register r holds elements (row g + 8 (r & 1),
 * columns 2t + 8 (r >> 1) + {0, 1}); B (16 x 8, col) register r holds (rows 2t + 8 r + {0, 1},
 * column g); C/D (16 x 8, f32) element i is (row g + 8 (i >> 1), column 2t + (i & 1)). The
 * lower element of a pair sits in the lower 16 bits. */
static float bf_lo(uint32_t u) {
    uint32_t v = u << 16;
    float f;
    memcpy(&f, &v, 4);
    return f;
}
static float bf_hi(uint32_t u) {
    uint32_t v = u & 0xffff0000u;
    float f;
    memcpy(&f, &v, 4);
    return f;
}

void emu_mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    uint32_t mine[6] = {a[0], a[1], a[2], a[3], b0, b1}, all[32][6];
    const unsigned char *out =
        (const unsigned char *)emu_warp_exchange(0xffffffffu, mine, sizeof(mine), "mma.sync");
    for (int l = 0; l < 32; l++) memcpy(all[l], out + (size_t)l * EMU_XCHG_MAX, sizeof(mine));
    float A[16][16], Bm[16][8];
    for (int l = 0; l < 32; l++) {
        int g = l / 4, t = l % 4;
        for (int r = 0; r < 4; r++) {
            int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
            A[row][col] = bf_lo(all[l][r]);
            A[row][col + 1] = bf_hi(all[l][r]);
        }
        for (int r = 0; r < 2; r++) {
            int row = 2 * t + 8 * r;
            Bm[row][g] = bf_lo(all[l][4 + r]);
            Bm[row + 1][g] = bf_hi(all[l][4 + r]);
        }
    }
    int lane = emu_lane(), g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float s = c[i];
        for (int k = 0; k < 16; k++) s += A[row][k] * Bm[k][col];
        c[i] = s;
    }
}

extern "C" {

cudaError_t cudaFuncSetAttribute(const void *fn, cudaFuncAttribute a, int v) {
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
    if (v < 0 || v > SMEM_OPTIN) return cudaErrorInvalidValue;
    max_dyn_smem[fn] = v;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    default: return "unknown error (emulator)";
    }
}

} /* extern "C" */

/* ---- mutants (model/mutant.h) ---------------------------------------------------------------
 * TR_EMU_MUTANT=site skips the wait TR_WAIT(site, ...) wraps; how many were skipped is printed
 * at exit, so that a test can tell a mutant that was never reached from one not caught. */
static std::atomic<unsigned long> mutant_skips{0};
static const char *mutant_site(void) {
    static const char *m = getenv("TR_EMU_MUTANT");
    return m && *m ? m : NULL;
}
__attribute__((destructor)) static void print_mutant(void) {
    if (mutant_site())
        fprintf(stderr, "cuda emulator: mutant %s: %lu waits skipped\n", mutant_site(),
                mutant_skips.load());
}
extern "C" int tr_emu_mutant(const char *site) {
    const char *m = mutant_site();
    if (!m || strcmp(m, site)) return 0;
    if (!mutant_skips++) { /* said now too: a hazard ends the program before the destructor */
        fprintf(stderr, "cuda emulator: mutant %s: skipping its wait\n", site);
        fflush(stderr);
    }
    return 1;
}
