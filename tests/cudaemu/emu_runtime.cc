/* The CUDA emulator's runtime (see emu.h): kernel launches on cooperative fibers, barriers,
 * warp exchanges and the tensor-core product, and the subset of the CUDA runtime API the
 * backend and the device transport call ("device" memory is host memory; kernels, copies,
 * memsets and host functions are queued on their stream and run later, in an adversarial order
 * that keeps only what CUDA guarantees: "the scheduler" below; streams, events and the
 * asynchronous operations of emu_async.h), and the mutants of model/mutant.h. Test-only. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include "emu.h"
#include "emu_async.h"
#include "emu_prof.h"
#undef warpSize /* a field of cudaDeviceProp below */

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

#include <stdarg.h>
[[noreturn]] static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda emulator: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    abort();
}

/* ---- fibers ------------------------------------------------------------------------------ */

enum { RUNNING, AT_BLOCK, AT_WARP, DONE };
#define STACK_BYTES ((size_t)512 << 10)
#define MAX_THREADS 1024
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

struct warp {
    unsigned char slots[32][XCHG_MAX]; /* what each lane handed in */
    unsigned char out[32][XCHG_MAX];   /* the completed exchange, read after release */
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
#endif
} E;

#ifdef EMU_FAST_SWITCH
#define SWITCH_TO_SCHED(f) emu_switch(&(f)->sp, E.sched_sp)
#define SWITCH_TO_FIBER(f) emu_switch(&E.sched_sp, (f)->sp)
#else
#define SWITCH_TO_SCHED(f) swapcontext(&(f)->uc, &E.sched)
#define SWITCH_TO_FIBER(f) swapcontext(&E.sched, &(f)->uc)
#endif

static void to_scheduler(void) {
    fiber *f = &E.th[E.cur];
#ifdef EMU_ASAN
    void *fs = NULL;
    __sanitizer_start_switch_fiber(f->state == DONE ? NULL : &fs, E.sched_bottom, E.sched_size);
    SWITCH_TO_SCHED(f);
    __sanitizer_finish_switch_fiber(fs, &E.sched_bottom, &E.sched_size);
#else
    SWITCH_TO_SCHED(f);
#endif
}

static void trampoline(void) {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &E.sched_bottom, &E.sched_size);
#endif
    E.body(E.ctx);
    E.th[E.cur].state = DONE;
    to_scheduler();
    die("%s: a finished thread was resumed", E.kernel);
}

int emu_thread_now;
int emu_block_now(void) { return (int)(emu_bid.x + emu_gdim.x * (emu_bid.y + emu_gdim.y * emu_bid.z)); }

static void run_fiber(int i) {
    E.cur = i;
    emu_thread_now = i;
    emu_lane_now = i % 32;
    emu_tid = &E.th[i].tid;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&E.fake_stack, E.th[i].stack, STACK_BYTES);
    SWITCH_TO_FIBER(&E.th[i]);
    __sanitizer_finish_switch_fiber(E.fake_stack, NULL, NULL);
#else
    SWITCH_TO_FIBER(&E.th[i]);
#endif
}

int emu_lane_now;

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
    memcpy(E.wp[w].slots[lane], mine, bytes);
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
        if (strcmp(f->op, E.th[first].op))
            die("%s: lanes of one warp are at different warp operations (%s)", E.kernel, f->op);
    }
    warp *wp = &E.wp[w];
    for (int i = lo; i < lo + 32; i++) {
        if (i < hi && E.th[i].state == AT_WARP)
            memcpy(wp->out[i - lo], wp->slots[i - lo], wp->bytes);
        else
            memset(wp->out[i - lo], 0, wp->bytes);
    }
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

/* What the program asked of the device, printed at exit when TR_EMU_STATS is set: tests use
 * it to check, for example, that training steps allocate no device memory. */
static struct {
    unsigned long launches, mallocs, frees, syncs, h2d, d2h;
    unsigned long long malloc_bytes, h2d_bytes, d2h_bytes;
} stats;
__attribute__((destructor)) static void print_stats(void) {
    const char *e = getenv("TR_EMU_STATS");
    if (!e || !*e || !strcmp(e, "0")) return;
    fprintf(stderr,
            "cuda emulator stats: %lu launches, %lu cudaMalloc (%llu bytes), %lu cudaFree, "
            "%lu synchronizations, %lu host-to-device copies (%llu bytes), %lu device-to-host "
            "copies (%llu bytes)\n",
            stats.launches, stats.mallocs, stats.malloc_bytes, stats.frees, stats.syncs, stats.h2d,
            stats.h2d_bytes, stats.d2h, stats.d2h_bytes);
}
static std::map<const void *, int> max_dyn_smem; /* cudaFuncSetAttribute's opt-ins */
#define SMEM_DEFAULT (48 << 10)
#define SMEM_OPTIN (227 << 10) /* H100/H200 */

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

/* ---- the CUDA runtime API subset ----------------------------------------------------------
 * Allocations are tracked so that copies name a bad device pointer instead of corrupting the
 * host heap; fresh allocations are filled with 0xff (NaN in fp32 and bf16). */

static std::map<uintptr_t, size_t> allocs;
static std::map<uintptr_t, size_t> host_allocs; /* cudaMallocHost's: host memory, not device */

static uintptr_t dev_lo, dev_hi; /* the allocation is_dev found last (cudaFree forgets it) */
static int is_dev(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    if (a >= dev_lo && a + n <= dev_hi) return 1;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin()) return 0;
    --it;
    if (a >= it->first && a + n <= it->first + it->second) {
        dev_lo = it->first, dev_hi = it->first + it->second;
        return 1;
    }
    return 0;
}
int emu_is_device(const void *p, size_t n) { return is_dev(p, n); }

/* ---- streams, events and asynchronous operations (emu_async.h) -----------------------------
 * Each stream has a FIFO of pending operations, numbered from 1 in the order given. A stream
 * has completed "through n" when every operation numbered n or less has finished (or was
 * dropped). A snapshot is a list of (stream, n): what an event recorded, or what a new piece
 * of work must wait for. An event completes when its snapshot has; cudaStreamWaitEvent puts
 * a wait entry into the stream's queue that completes with the event's snapshot, so later
 * work on that stream follows the event without the host blocking at the call.
 *
 * CUDA's legacy default stream (0, cudaStreamLegacy, and here cudaStreamPerThread too) is
 * ordered with every stream created without cudaStreamNonBlocking: work on it waits for
 * theirs, and theirs for its. One mutex guards the queues and events: a watchdog thread may
 * query an event while the main thread launches kernels. No one waits holding it: draining
 * tests, unlocks, and backs off. */

#define STREAM_MAGIC 0x6d727473u /* "strm" */
#define EVENT_MAGIC 0x746e7665u  /* "evnt" */

struct mark {
    CUstream_st *s;
    uint64_t n; /* complete when s has completed through n */
};
typedef std::vector<mark> snapshot;

struct async_op {
    int (*test)(void *);
    void (*finish)(void *);
    int done;            /* an asynchronous operation whose test said complete */
    void (*run)(void *); /* work the host runs (a kernel, a copy, a host function): test and
                            finish unused; run frees ctx */
    const char *what;
    void *ctx;
    snapshot *wait; /* a wait entry (cudaStreamWaitEvent, the legacy stream's order): test
                       and ctx unused */
    uint64_t n;     /* its number in its stream */
    async_op *next;
};

struct CUstream_st {
    unsigned magic, flags;
    uint64_t given; /* operations ever appended */
    async_op *head, *tail;
    CUstream_st *next_dead;
};

struct CUevent_st {
    unsigned magic, flags;
    int recorded, complete;
    snapshot snap; /* what it waits for while recorded and not complete */
    double t_done; /* CLOCK_MONOTONIC seconds when it was seen complete */
};

static std::mutex q_mu;
static std::atomic<long> n_pending{0}; /* operations in every queue: the launches' fast path */
static CUstream_st legacy_stream = {STREAM_MAGIC, 0, 0, NULL, NULL, NULL};
static std::vector<CUstream_st *> streams;   /* created and not destroyed */
/* destroyed ones stay allocated, idle: another thread's drain may still hold a snapshot that
 * names them (a plain list, which no destructor frees before the leak check at exit) */
static CUstream_st *dead_streams;
static std::vector<CUevent_st *> ev_waiting; /* recorded, not yet complete */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static CUstream_st *stream_of(cudaStream_t s) {
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread) return &legacy_stream;
    if (s->magic != STREAM_MAGIC)
        die("a stream that was destroyed or never created (%p)", (void *)s);
    return s;
}

static int blocking(const CUstream_st *s) {
    return s != &legacy_stream && !(s->flags & cudaStreamNonBlocking);
}

/* the lock is held by the callers of everything below up to the public functions */
static uint64_t done_through(const CUstream_st *s) {
    return s->head ? s->head->n - 1 : s->given;
}

/* What new work on s waits for: s's queue, and the legacy stream's order (see above). */
static void work_snapshot(CUstream_st *s, snapshot *out) {
    out->clear();
    if (done_through(s) < s->given) out->push_back({s, s->given});
    if (blocking(s) && done_through(&legacy_stream) < legacy_stream.given)
        out->push_back({&legacy_stream, legacy_stream.given});
    if (s == &legacy_stream)
        for (CUstream_st *o : streams)
            if (blocking(o) && done_through(o) < o->given) out->push_back({o, o->given});
}

static int snapshot_done(const snapshot &sn) {
    for (const mark &m : sn)
        if (done_through(m.s) < m.n) return 0;
    return 1;
}

/* Events whose snapshot has completed become complete, timed now. */
static void events_update(void) {
    double t = -1;
    for (size_t i = 0; i < ev_waiting.size();) {
        CUevent_st *e = ev_waiting[i];
        if (!snapshot_done(e->snap)) {
            i++;
            continue;
        }
        if (t < 0) t = now_s();
        e->complete = 1;
        e->t_done = t;
        e->snap.clear();
        ev_waiting[i] = ev_waiting.back();
        ev_waiting.pop_back();
    }
}

/* ---- the scheduler ----------------------------------------------------------------------
 * Work given to a stream (a kernel, a copy, a memset, a host function, a cuBLASLt product:
 * emu_stream_exec) is queued, as on a GPU, and runs later on the host. By default
 * (TR_EMU_SCHED=adversarial) a seeded random scheduler (TR_EMU_SEED, default 1) picks which
 * stream moves next among those whose head may: a wait entry whose snapshot has completed,
 * an asynchronous operation (NCCL) whose test says done, or host work. It runs only when the
 * program makes it: a synchronization runs work until what it waits for is done (mostly that
 * work, sometimes others'), cudaEventQuery and cudaStreamQuery run a random few steps and may
 * answer cudaErrorNotReady, and any new work runs a random few steps of others first. So
 * nothing is ordered that CUDA does not order (stream order, cudaStreamWaitEvent, the legacy
 * default stream, synchronous calls), and a missing wait, a read by the host before a
 * synchronization, or a buffer reused before the operation that reads it ran, gives wrong
 * numbers. TR_EMU_SCHED=eager runs each piece of work when it is given, after what it must
 * follow (the emulator's behaviour before; what a test of the emulator itself may want).
 *
 * Host work runs holding the lock, on the thread that gave work (the program's): another
 * thread (a watchdog querying events) moves only wait entries and NCCL operations, unless the
 * program's thread has not been into the runtime for half a second (it may be blocked in MPI
 * on something that the pending work leads to). The same seed gives the same order of host
 * work for a program whose own order does not depend on timing (NCCL over MPI does). */

static int sched_eager = -1;
static uint64_t rng_state;
static thread_local uint64_t rng_other = 0x2545f4914f6cdd1dull; /* threads other than exec's */
static thread_local int exec_thread;                             /* this thread gives work */
static double last_exec_touch;

static void sched_init(void) { /* the lock is held or the caller is the only thread */
    if (sched_eager >= 0) return;
    const char *m = getenv("TR_EMU_SCHED");
    if (m && *m && strcmp(m, "eager") && strcmp(m, "adversarial"))
        die("TR_EMU_SCHED=%s: expected adversarial (the default) or eager", m);
    sched_eager = m && !strcmp(m, "eager");
    const char *sd = getenv("TR_EMU_SEED");
    rng_state = sd && *sd ? strtoull(sd, NULL, 0) : 1;
}

static uint64_t rnd(void) { /* splitmix64 */
    uint64_t *st = exec_thread ? &rng_state : &rng_other;
    uint64_t x = (*st += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static unsigned rnd_below(unsigned n) { return (unsigned)(rnd() % n); }

static int may_exec(void) {
    if (exec_thread) {
        last_exec_touch = now_s();
        return 1;
    }
    return last_exec_touch > 0 && now_s() - last_exec_touch > 0.5;
}

static void op_free(async_op *op) {
    delete op->wait;
    delete op;
    n_pending--;
}

static void pop(CUstream_st *s) {
    async_op *op = s->head;
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    op_free(op);
    if (!ev_waiting.empty()) events_update();
}

/* Moves s's head if it may: returns 1 when something happened. lazy: an NCCL operation is
 * looked at (started, tested) only 1 time in 32: nothing waits for it yet. may_finish: it may
 * be seen complete now (else one that MPI has completed stays at the head, done, until
 * something waits for it: an operation's results appear, and its buffers are checked, as late
 * as the program's order allows). */
static int step_stream(CUstream_st *s, int exec_ok, int lazy, int may_finish) {
    async_op *op = s->head;
    if (op->wait) {
        if (!snapshot_done(*op->wait)) return 0;
        pop(s);
        return 1;
    }
    if (op->run) {
        if (!exec_ok) return 0;
        op->run(op->ctx);
        pop(s);
        return 1;
    }
    if (!op->done) {
        if (lazy && rnd_below(32)) return 0;
        if (!op->test(op->ctx)) return 0;
        op->done = 1;
        if (!sched_eager) return 1;
    }
    if (!may_finish) return 0;
    if (op->finish) op->finish(op->ctx);
    pop(s);
    return 1;
}

/* The streams that what sn waits for leads to: sn's, and those that wait entries at their
 * heads name, and so on. */
static void closure(const snapshot &sn, std::vector<CUstream_st *> *out) {
    out->clear();
    std::vector<const snapshot *> todo(1, &sn);
    while (!todo.empty()) {
        const snapshot *w = todo.back();
        todo.pop_back();
        for (const mark &m : *w) {
            if (done_through(m.s) >= m.n ||
                std::find(out->begin(), out->end(), m.s) != out->end())
                continue;
            out->push_back(m.s);
            if (m.s->head && m.s->head->wait) todo.push_back(m.s->head->wait);
        }
    }
}

/* One step of one stream: among those whose head may move, the streams that what want
 * waits for first (3 times in 4; adversarial mode), in a random order; then, when none moved,
 * the others. finish_odds: an operation that want waits for is seen complete 1 time in that
 * many (1: always). Returns 1 when something moved. */
static int step_one(const snapshot *want, int exec_ok, unsigned finish_odds = 1) {
    static thread_local std::vector<CUstream_st *> cand, need;
    cand.clear();
    if (legacy_stream.head) cand.push_back(&legacy_stream);
    for (CUstream_st *s : streams)
        if (s->head) cand.push_back(s);
    size_t n = cand.size();
    CUstream_st **all = cand.data();
    if (!n) return 0;
    if (!sched_eager)
        for (size_t i = n - 1; i > 0; i--)
            std::swap(all[i], all[rnd_below((unsigned)i + 1)]);
    need.clear();
    if (want) closure(*want, &need);
    auto wanted = [](CUstream_st *s) {
        return std::find(need.begin(), need.end(), s) != need.end();
    };
    if (sched_eager) {
        if (want) std::stable_partition(all, all + n, wanted);
        for (size_t i = 0; i < n; i++)
            if (step_stream(all[i], exec_ok, 0, 1)) return 1;
        return 0;
    }
    if (want && rnd_below(4)) std::stable_partition(all, all + n, wanted);
    for (size_t i = 0; i < n; i++) {
        int w = wanted(all[i]);
        if (step_stream(all[i], exec_ok, !w, w && rnd_below(finish_odds) == 0)) return 1;
    }
    for (size_t i = 0; i < n; i++) /* nothing else moved: start what nobody waits for yet */
        if (step_stream(all[i], exec_ok, 0, 0)) return 1;
    return 0;
}

/* What the program does at any call that gives work: a few steps of any stream, at random. */
static void wander(void) {
    if (sched_eager || rnd_below(4)) return;
    for (unsigned k = rnd_below(4) + 1; k > 0 && step_one(NULL, 1); k--) {
    }
}

/* A query of sn: a random few steps (all that can be done, eager), then whether it is done. */
static int query(const snapshot &sn) {
    sched_init();
    int ex = may_exec();
    if (sched_eager)
        while (!snapshot_done(sn) && step_one(&sn, ex)) {
        }
    else
        /* a query may see an operation complete later than it is: the program's own thread 1
           time in 4, another (a watchdog) 1 time in 64 */
        for (unsigned k = rnd_below(4); k > 0 && !snapshot_done(sn) && step_one(&sn, ex, exec_thread ? 4 : 64); k--) {
        }
    return snapshot_done(sn);
}

static void strip(snapshot *sn, const CUstream_st *s) {
    sn->erase(std::remove_if(sn->begin(), sn->end(), [s](const mark &m) { return m.s == s; }),
              sn->end());
}

static void append(CUstream_st *s, async_op *op) {
    op->n = ++s->given;
    op->next = NULL;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    n_pending++;
}

/* An operation for s, behind what the legacy stream's order puts before it (a wait entry
 * first when that is in other queues). */
static void enqueue(CUstream_st *s, async_op *op) {
    snapshot before;
    work_snapshot(s, &before);
    strip(&before, s);
    if (!before.empty()) {
        async_op *w = new async_op();
        w->wait = new snapshot(before);
        append(s, w);
    }
    append(s, op);
}

/* Blocks until sn has completed, running the work it needs (and, adversarially, some other):
 * steps under the lock, backing off without it when nothing can move (from yields to 0.2 ms
 * sleeps: an NCCL operation waits for another process). */
static void drain(const snapshot &sn) {
    if (sn.empty()) return;
    long ns = 0;
    for (;;) {
        {
            std::lock_guard<std::mutex> g(q_mu);
            sched_init();
            if (snapshot_done(sn)) return;
            if (step_one(&sn, may_exec())) {
                ns = 0;
                continue;
            }
        }
        if (ns < 1000) {
            sched_yield();
            ns += 100;
        } else {
            struct timespec ts = {0, ns};
            nanosleep(&ts, NULL);
            ns = ns * 2 > 200000 ? 200000 : ns * 2;
        }
    }
}

static void drain_all(void) {
    snapshot all;
    {
        std::lock_guard<std::mutex> g(q_mu);
        all.push_back({&legacy_stream, legacy_stream.given});
        for (CUstream_st *s : streams)
            all.push_back({s, s->given});
    }
    drain(all);
}

void emu_stream_drain(cudaStream_t s) {
    snapshot sn;
    {
        std::lock_guard<std::mutex> g(q_mu);
        work_snapshot(stream_of(s), &sn);
    }
    drain(sn);
}

void emu_stream_enqueue(cudaStream_t s, int (*test)(void *), void (*finish)(void *), void *ctx) {
    async_op *op = new async_op();
    op->test = test;
    op->finish = finish;
    op->ctx = ctx;
    std::lock_guard<std::mutex> g(q_mu);
    sched_init();
    enqueue(stream_of(s), op);
    if (exec_thread) wander();
}

/* eager_wait: in eager mode, the host waits for the work to have run (a launch, a copy), or
 * else (a host function) only queues it when its stream is busy */
static void exec_on(cudaStream_t s, const char *what, void (*run)(void *), void *ctx,
                    int eager_wait) {
    async_op *op = new async_op();
    op->run = run;
    op->what = what;
    op->ctx = ctx;
    exec_thread = 1;
    snapshot through;
    {
        std::lock_guard<std::mutex> g(q_mu);
        sched_init();
        last_exec_touch = now_s();
        CUstream_st *st = stream_of(s);
        enqueue(st, op);
        through.push_back({st, st->given});
        if (!sched_eager) {
            wander();
            return;
        }
        if (!eager_wait) {
            while (step_one(&through, 1) && !snapshot_done(through)) {
            }
            return;
        }
    }
    drain(through);
}

void emu_stream_exec(cudaStream_t s, const char *what, void (*run)(void *), void *ctx) {
    exec_on(s, what, run, ctx, 1);
}

/* may be called holding the lock (an operation's finish): set once, before any work queued */
int emu_sched_eager(void) {
    if (sched_eager < 0) {
        std::lock_guard<std::mutex> g(q_mu);
        sched_init();
    }
    return sched_eager;
}

/* the last operation of s with match(ctx, key), or NULL */
static async_op *last_match(CUstream_st *s, int (*match)(void *, void *), void *key) {
    async_op *last = NULL;
    for (async_op *op = s->head; op; op = op->next)
        if (!op->wait && match(op->ctx, key)) last = op;
    return last;
}

void emu_stream_drain_matching(int (*match)(void *, void *), void *key) {
    snapshot sn;
    {
        std::lock_guard<std::mutex> g(q_mu);
        async_op *op = last_match(&legacy_stream, match, key);
        if (op) sn.push_back({&legacy_stream, op->n});
        for (CUstream_st *s : streams)
            if ((op = last_match(s, match, key))) sn.push_back({s, op->n});
    }
    drain(sn);
}

static int drop_from(CUstream_st *s, int (*match)(void *, void *), void *key,
                     void (*dropped)(void *)) {
    int n = 0;
    async_op *prev = NULL, *op = s->head;
    while (op) {
        async_op *next = op->next;
        if (!op->wait && match(op->ctx, key)) {
            if (prev)
                prev->next = next;
            else
                s->head = next;
            if (s->tail == op) s->tail = prev;
            if (dropped) dropped(op->ctx);
            op_free(op);
            n++;
        } else {
            prev = op;
        }
        op = next;
    }
    return n;
}

int emu_stream_drop(int (*match)(void *, void *), void *key, void (*dropped)(void *)) {
    std::lock_guard<std::mutex> g(q_mu);
    int n = drop_from(&legacy_stream, match, key, dropped);
    for (CUstream_st *s : streams)
        n += drop_from(s, match, key, dropped);
    events_update();
    return n;
}

static CUevent_st *event_of(cudaEvent_t e) {
    if (!e || e->magic != EVENT_MAGIC)
        die("an event that was destroyed or never created (%p)", (void *)e);
    return e;
}

static void forget_event(CUevent_st *e) {
    for (size_t i = 0; i < ev_waiting.size(); i++)
        if (ev_waiting[i] == e) {
            ev_waiting[i] = ev_waiting.back();
            ev_waiting.pop_back();
            return;
        }
}

/* A stream is going away, drained: no wait entry or event may name it any more. */
static void forget_stream(CUstream_st *s) {
    auto strip_queue = [s](CUstream_st *q) {
        for (async_op *op = q->head; op; op = op->next)
            if (op->wait) strip(op->wait, s);
    };
    strip_queue(&legacy_stream);
    for (CUstream_st *q : streams)
        strip_queue(q);
    for (CUevent_st *e : ev_waiting)
        strip(&e->snap, s);
    events_update();
    for (size_t i = 0; i < streams.size(); i++)
        if (streams[i] == s) {
            streams.erase(streams.begin() + (long)i);
            break;
        }
}

/* ---- this process's device ---------------------------------------------------------------
 * Every emulated process is a GPU of its own, as NCCL and the device transport tell GPUs
 * apart: the UUID hashes the host name and the process id, and the PCI address spells the
 * process id (unique on a host). TR_EMU_DEVICE=<name> replaces the process id by the name's
 * hash: processes given one name play ranks sharing one GPU. Read at every call, so that a
 * test can change it. */
static uint64_t mix64(uint64_t x) { /* splitmix64's finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t hash_str(const char *p, uint64_t h) { /* FNV-1a */
    for (; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    return h;
}

struct device_id {
    cudaUUID_t uuid;
    int domain, bus, dev;
};

static device_id device_identity(void) {
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    const char *name = getenv("TR_EMU_DEVICE");
    uint64_t v =
        name && *name ? hash_str(name, 0xcbf29ce484222325ull) & 0x1fffffff : (uint64_t)getpid();
    uint64_t h = hash_str(host, 0xcbf29ce484222325ull);
    uint64_t u[2] = {mix64(h ^ v), mix64(h + 0x9e3779b97f4a7c15ull * (v + 1))};
    device_id d;
    memcpy(d.uuid.bytes, u, sizeof(d.uuid.bytes));
    d.bus = (int)(v & 0xff);
    d.dev = (int)((v >> 8) & 0x1f);
    d.domain = (int)((v >> 13) & 0xffff);
    return d;
}

extern "C" {

/* the toolkit whose headers the emulator is built with, as driver and runtime alike */
cudaError_t cudaDriverGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
    if (d != 0) return cudaErrorInvalidDevice;
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "CUDA emulator (CPU)");
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->totalGlobalMem = (size_t)8 << 30;
    p->sharedMemPerBlock = SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = SMEM_OPTIN;
    p->maxThreadsPerBlock = MAX_THREADS;
    p->warpSize = 32;
    device_id id = device_identity();
    p->uuid = id.uuid;
    p->pciDomainID = id.domain;
    p->pciBusID = id.bus;
    p->pciDeviceID = id.dev;
    return cudaSuccess;
}

/* "domain:bus:device.function" in hexadecimal, as CUDA writes it */
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int d) {
    if (d != 0) return cudaErrorInvalidDevice;
    if (!id || len <= 0) return cudaErrorInvalidValue;
    device_id di = device_identity();
    snprintf(id, (size_t)len, "%04x:%02x:%02x.0", di.domain, di.bus, di.dev);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d) {
    if (d != 0) return cudaErrorInvalidDevice;
    switch (a) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = SMEM_OPTIN; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = SMEM_DEFAULT; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *v = 132; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; return cudaSuccess;
    case cudaDevAttrPciBusId: *v = device_identity().bus; return cudaSuccess;
    case cudaDevAttrPciDeviceId: *v = device_identity().dev; return cudaSuccess;
    case cudaDevAttrPciDomainId: *v = device_identity().domain; return cudaSuccess;
    default:
        fprintf(stderr, "cuda emulator: cudaDeviceGetAttribute(%d) is not emulated\n", (int)a);
        return cudaErrorInvalidValue;
    }
}

cudaError_t cudaFuncSetAttribute(const void *fn, cudaFuncAttribute a, int v) {
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
    if (v < 0 || v > SMEM_OPTIN) return cudaErrorInvalidValue;
    max_dyn_smem[fn] = v;
    return cudaSuccess;
}

/* Device memory is planned (issue 33): the trainer allocates every device byte before its
 * first optimizer step ends and tells so (emu_mem_step, through tr_backend_cuda_step_done);
 * a cudaMalloc after that fails the run with one line naming its size and the step. */
static struct {
    int step;                     /* the last training step reported done; 0: none yet */
    unsigned long long live, peak; /* bytes held by cudaMalloc now, and at most */
} mem;

void emu_mem_step(int step) { mem.step = step; }

void emu_mem_counts(emu_mem_stats *s) {
    s->mallocs = stats.mallocs, s->frees = stats.frees;
    s->bytes = stats.malloc_bytes, s->live = mem.live, s->peak = mem.peak;
}

cudaError_t cudaMalloc(void **p, size_t n) {
    if (mem.step > 0)
        die("cudaMalloc of %zu bytes after training step %d: every device byte must be allocated "
            "before the first optimizer step ends (%llu bytes were, in %lu calls)",
            n, mem.step, stats.malloc_bytes, stats.mallocs);
    /* 256-byte aligned like cudaMalloc, and exactly n bytes (at least 1, so that every pointer
     * is distinct) so that AddressSanitizer sees an access past the end */
    void *q = NULL;
    if (posix_memalign(&q, 256, n ? n : 1)) return cudaErrorMemoryAllocation;
    memset(q, 0xff, n);
    allocs[(uintptr_t)q] = n;
    stats.mallocs++;
    stats.malloc_bytes += n;
    mem.live += n;
    if (mem.live > mem.peak) mem.peak = mem.live;
    *p = q;
    return cudaSuccess;
}

/* cudaFree and cudaFreeHost wait for the device, as CUDA's do: an operation still pending
 * may read or write the memory */
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end()) return cudaErrorInvalidValue;
    drain_all();
    stats.frees++;
    mem.live -= it->second;
    allocs.erase(it);
    dev_lo = dev_hi = 0;
    free(p);
    return cudaSuccess;
}

/* Pinned host memory is plain host memory here; tracked only so that cudaFreeHost can refuse
 * a pointer it did not give. */
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
    unsigned known = cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
    if (!p || (flags & ~known)) return cudaErrorInvalidValue;
    void *q = NULL;
    if (posix_memalign(&q, 256, n ? n : 1)) return cudaErrorMemoryAllocation;
    host_allocs[(uintptr_t)q] = n;
    *p = q;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) {
    return cudaHostAlloc(p, n, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    auto it = host_allocs.find((uintptr_t)p);
    if (it == host_allocs.end()) return cudaErrorInvalidValue;
    drain_all();
    host_allocs.erase(it);
    free(p);
    return cudaSuccess;
}

static int is_pinned(const void *p, size_t n) { /* inside one cudaMallocHost allocation */
    uintptr_t a = (uintptr_t)p;
    auto it = host_allocs.upper_bound(a);
    if (it == host_allocs.begin()) return 0;
    --it;
    return a >= it->first && a + n <= it->first + it->second;
}

struct copy_job {
    void *dst;
    const void *src;
    size_t n;
    void *staged; /* the source, copied when the call was made; freed after */
    int host_src; /* src is host memory read when the copy runs (in host_reads meanwhile) */
};
/* the host memory that queued copies are still to read (under the lock) */
static std::vector<copy_job *> host_reads;
static void run_copy(void *c) {
    copy_job *j = (copy_job *)c;
    memmove(j->dst, j->staged ? j->staged : j->src, j->n);
    free(j->staged);
    if (j->host_src)
        host_reads.erase(std::find(host_reads.begin(), host_reads.end(), j));
    delete j;
}
static int host_read_pending(const void *p, size_t n) {
    for (const copy_job *j : host_reads)
        if ((uintptr_t)j->src < (uintptr_t)p + n && (uintptr_t)p < (uintptr_t)j->src + j->n)
            return 1;
    return 0;
}

/* A copy on s, run when the scheduler reaches it; its source is read and its destination
 * written then. Host memory too: the host must synchronize before it reads a device-to-host
 * copy's result, or reuses a copy's source, pinned or pageable (CUDA: a copy with pageable
 * memory "might be synchronous"; the eager mode reads a pageable source at the call). The
 * host destination of a device-to-host copy holds NaN (0xff bytes) until the copy has run,
 * unless a queued copy still reads that memory. Host to host is synchronous. */
static cudaError_t copy_async(void *dst, const void *src, size_t n, cudaMemcpyKind k,
                              cudaStream_t s) {
    int dd = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
    int sd = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
    if (k == cudaMemcpyDefault) dd = is_dev(dst, n), sd = is_dev(src, n);
    if ((dd && !is_dev(dst, n)) || (sd && !is_dev(src, n))) {
        fprintf(stderr, "cuda emulator: cudaMemcpy kind %d with a %s pointer outside any "
                        "allocation (%zu bytes)\n", (int)k, dd && !is_dev(dst, n) ? "destination" : "source", n);
        return cudaErrorInvalidValue;
    }
    if (dd && !sd) stats.h2d++, stats.h2d_bytes += n;
    if (sd && !dd) stats.d2h++, stats.d2h_bytes += n;
    if (!n) return cudaSuccess;
    if (!dd && !sd) {
        emu_stream_drain(s);
        memmove(dst, src, n);
        return cudaSuccess;
    }
    copy_job *j = new copy_job{dst, src, n, NULL, 0};
    int eager = emu_sched_eager();
    if (!sd && eager && !is_pinned(src, n)) {
        j->staged = malloc(n);
        if (!j->staged) die("out of memory staging a copy of %zu bytes", n);
        memcpy(j->staged, src, n);
    } else if (!sd) {
        std::lock_guard<std::mutex> g(q_mu); /* run_copy erases under it */
        j->host_src = 1;
        host_reads.push_back(j);
    }
    if (!dd && !eager) {
        std::lock_guard<std::mutex> g(q_mu);
        if (!host_read_pending(dst, n)) memset(dst, 0xff, n);
    }
    emu_stream_exec(s, "cudaMemcpyAsync", run_copy, j);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s) {
    return copy_async(dst, src, n, k, s);
}
/* work on the legacy default stream, which the host waits for */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k) {
    cudaError_t e = copy_async(dst, src, n, k, 0);
    if (e == cudaSuccess) emu_stream_drain(0);
    return e;
}
struct memset_job {
    void *p;
    int v;
    size_t n;
};
static void run_memset(void *c) {
    memset_job *j = (memset_job *)c;
    memset(j->p, j->v, j->n);
    delete j;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    if (!is_dev(p, n)) return cudaErrorInvalidValue;
    if (n) emu_stream_exec(s, "cudaMemsetAsync", run_memset, new memset_job{p, v, n});
    return cudaSuccess;
}
/* asynchronous with respect to the host for device memory (CUDA's "API synchronization
 * behavior"), on the legacy default stream */
cudaError_t cudaMemset(void *p, int v, size_t n) {
    return cudaMemsetAsync(p, v, n, 0);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    if (!s || (flags & ~(unsigned)cudaStreamNonBlocking)) return cudaErrorInvalidValue;
    CUstream_st *st = new CUstream_st{STREAM_MAGIC, flags, 0, NULL, NULL, NULL};
    std::lock_guard<std::mutex> g(q_mu);
    streams.push_back(st);
    *s = st;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) {
    return cudaStreamCreateWithFlags(s, 0);
}

/* CUDA returns at once and releases the stream when its work is done; here the host waits for
 * its work first, so that no queue or event needs it afterwards. */
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    CUstream_st *st = stream_of(s);
    if (st == &legacy_stream) return cudaErrorInvalidResourceHandle;
    snapshot all;
    {
        std::lock_guard<std::mutex> g(q_mu);
        all.push_back({st, st->given});
    }
    drain(all);
    std::lock_guard<std::mutex> g(q_mu);
    if (st->head) die("stream %p was given work while it was being destroyed", (void *)s);
    forget_stream(st);
    st->magic = 0;
    st->next_dead = dead_streams;
    dead_streams = st;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    stats.syncs++;
    emu_stream_drain(s);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
    std::lock_guard<std::mutex> g(q_mu);
    snapshot sn;
    work_snapshot(stream_of(s), &sn);
    return query(sn) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize(void) {
    stats.syncs++;
    drain_all();
    return cudaSuccess;
}

/* host functions run in stream order like any operation, when the scheduler reaches them */
struct host_fn_job {
    cudaHostFn_t fn;
    void *data;
};
static void run_host_fn(void *c) {
    host_fn_job *j = (host_fn_job *)c;
    j->fn(j->data);
    delete j;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data) {
    if (!fn) return cudaErrorInvalidValue;
    exec_on(s, "cudaLaunchHostFunc", run_host_fn, new host_fn_job{fn, data}, 0);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
    if (!e || (flags & ~known)) return cudaErrorInvalidValue;
    *e = new CUevent_st{EVENT_MAGIC, flags, 0, 1, snapshot(), 0.0};
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    return cudaEventCreateWithFlags(e, 0);
}

/* CUDA releases a pending event's resources once it completes; nothing here depends on it */
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    CUevent_st *ev = event_of(e);
    std::lock_guard<std::mutex> g(q_mu);
    forget_event(ev);
    ev->magic = 0;
    delete ev;
    return cudaSuccess;
}

/* The event captures the work given to s so far (with the legacy stream's order); on an idle
 * stream it completes at once. */
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    CUevent_st *ev = event_of(e);
    std::lock_guard<std::mutex> g(q_mu);
    forget_event(ev);
    ev->recorded = 1;
    work_snapshot(stream_of(s), &ev->snap);
    ev->complete = ev->snap.empty();
    if (ev->complete)
        ev->t_done = now_s();
    else
        ev_waiting.push_back(ev);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    CUevent_st *ev = event_of(e);
    std::lock_guard<std::mutex> g(q_mu);
    if (!ev->complete) {
        snapshot sn = ev->snap; /* progress may complete the event, which clears its own */
        query(sn);
    }
    return ev->complete ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    CUevent_st *ev = event_of(e);
    snapshot sn;
    {
        std::lock_guard<std::mutex> g(q_mu);
        if (ev->complete) return cudaSuccess;
        sn = ev->snap;
    }
    drain(sn);
    return cudaSuccess;
}

/* A wait entry in s's queue (see above): the host does not block here; the next work on s,
 * or a synchronization of s, completes the event's snapshot first. */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    CUevent_st *ev = event_of(e);
    std::lock_guard<std::mutex> g(q_mu);
    CUstream_st *st = stream_of(s);
    if (ev->complete) return cudaSuccess;
    async_op *op = new async_op();
    op->wait = new snapshot(ev->snap);
    enqueue(st, op);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    CUevent_st *a = event_of(start), *b = event_of(end);
    if (!ms) return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> g(q_mu);
    if (!a->recorded || !b->recorded || ((a->flags | b->flags) & cudaEventDisableTiming))
        return cudaErrorInvalidResourceHandle;
    for (CUevent_st *ev : {a, b})
        if (!ev->complete) {
            snapshot sn = ev->snap;
            query(sn);
        }
    if (!a->complete || !b->complete) return cudaErrorNotReady;
    *ms = (float)((b->t_done - a->t_done) * 1e3);
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
