/* The emulator's own test, continued (see test_emu_runtime.cu): the checks that run once, in
 * the default thread order: 4 dynamic shared memory's limits and poison and the launches that
 * must be refused, 6 the bugs the emulator must report, 7 the thread-order switch and a missing
 * barrier, 8 the runtime API's refusals, 9 the adversarial scheduler. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_emu_runtime.h"

#if defined(__SANITIZE_ADDRESS__)
#define HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HAVE_ASAN 1
#endif
#endif

/* ==== 4. dynamic shared memory and launch limits ========================================== */

/* every thread reads one byte before anything is written (the emulator poisons dynamic shared
 * memory with 0xff per block), then the block fills nbytes and sums them back to front */
__global__ void k_smem(unsigned *out, int nbytes) {
    extern __shared__ __align__(16) unsigned char smem[];
    int t = (int)threadIdx.x, n = (int)blockDim.x;
    unsigned before = smem[(t * 4099) % nbytes];
    unsigned aligned = ((uintptr_t)smem % 16) == 0;
    __syncthreads();
    for (int i = t; i < nbytes; i += n)
        smem[i] = (unsigned char)(i * 7 + (int)blockIdx.x);
    __syncthreads();
    unsigned sum = 0;
    for (int i = t; i < nbytes; i += n)
        sum += smem[nbytes - 1 - i];
    unsigned *o = out + (blockIdx.x * blockDim.x + threadIdx.x) * 3;
    o[0] = sum, o[1] = before, o[2] = aligned;
}

/* runs k_smem with 2 blocks of 128 threads; returns the launch's error, and in *ok whether
 * the results are right (untouched output for a refused launch) */
static cudaError_t run_smem(int nbytes, int *ok) {
    enum { NB = 2, NT = 128 };
    unsigned *d = (unsigned *)dev_alloc(NB * NT * 3 * sizeof(unsigned)), h[NB * NT * 3];
    CK(cudaMemset(d, 0, sizeof(h)));
    k_smem<<<NB, NT, nbytes>>>(d, nbytes);
    cudaError_t e = cudaGetLastError();
    to_host(h, d, sizeof(h));
    *ok = 1;
    for (int b = 0; b < NB; b++)
        for (int t = 0; t < NT; t++) {
            unsigned want = 0;
            for (int i = t; i < nbytes; i += NT)
                want += (unsigned char)((nbytes - 1 - i) * 7 + b);
            const unsigned *o = h + (b * NT + t) * 3;
            if (e == cudaSuccess ? (o[0] != want || o[1] != 0xff || o[2] != 1)
                                 : (o[0] || o[1] || o[2]))
                *ok = 0;
        }
    CK(cudaFree(d));
    return e;
}

/* a static __shared__ array read by every thread before any write, then written: in every
 * block the read must see the poison (0xff bytes), never what the block before wrote */
__global__ void k_static_poison(unsigned *out) {
    __shared__ unsigned st[128];
    unsigned before = st[threadIdx.x];
    __syncthreads();
    st[threadIdx.x] = blockIdx.x + 1;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = before;
}

__global__ void k_count(int *n) {
    n[blockIdx.x * blockDim.x * blockDim.y * blockDim.z +
      (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x] = 1;
}

static void check_launch_refused(dim3 g, dim3 b) {
    int *d = (int *)dev_alloc(4096 * sizeof(int)), h[4096];
    CK(cudaMemset(d, 0, sizeof(h)));
    k_count<<<g, b>>>(d);
    cudaError_t e = cudaGetLastError(), again = cudaGetLastError();
    to_host(h, d, sizeof(h));
    int ran = 0;
    for (int i = 0; i < 4096; i++)
        ran += h[i];
    check(e != cudaSuccess && again == cudaSuccess && !ran,
          "4 launch grid(%u,%u,%u) block(%u,%u,%u) refused: cudaGetLastError() = %d (%s), then "
          "%d; %d threads ran",
          g.x, g.y, g.z, b.x, b.y, b.z, (int)e, cudaGetErrorString(e), (int)again, ran);
    CK(cudaFree(d));
}

void check_smem(void) {
    int ok;
#ifndef HAVE_ASAN /* static shared arrays keep AddressSanitizer's red zones there (emu.h) */
    {
        enum { NB = 3, NT = 128 };
        unsigned *d = (unsigned *)dev_alloc(NB * NT * sizeof(unsigned)), h[NB * NT];
        k_static_poison<<<NB, NT>>>(d);
        to_host(h, d, sizeof(h));
        int poisoned = 0;
        for (int i = 0; i < NB * NT; i++)
            poisoned += h[i] == 0xffffffffu;
        check(poisoned == NB * NT,
              "4 static __shared__ read before any write: %d of %d reads see the poison in each "
              "of %d blocks (not the block before's values)",
              poisoned, NB * NT, NB);
        CK(cudaFree(d));
    }
#endif
    cudaError_t e = run_smem(48 * 1024, &ok);
    check(e == cudaSuccess && ok,
          "4 dynamic shared memory 48 KB without opt-in: launch %d, "
          "results %s (poisoned 0xff per block before writes, 16-byte aligned)",
          (int)e, ok ? "right" : "WRONG");
    e = run_smem(100 * 1024, &ok);
    check(e != cudaSuccess && ok,
          "4 dynamic shared memory 100 KB without opt-in: refused "
          "(cudaGetLastError() = %d, %s), kernel did %s",
          (int)e, cudaGetErrorString(e), ok ? "not run" : "RUN");
    cudaError_t a = cudaFuncSetAttribute((const void *)k_smem,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024);
    e = run_smem(100 * 1024, &ok);
    check(a == cudaSuccess && e == cudaSuccess && ok,
          "4 dynamic shared memory 100 KB after "
          "cudaFuncSetAttribute(MaxDynamicSharedMemorySize, 100 KB) = %d: launch %d, results %s",
          (int)a, (int)e, ok ? "right" : "WRONG");
    e = run_smem(100 * 1024 + 16, &ok);
    check(e != cudaSuccess && ok,
          "4 dynamic shared memory 100 KB + 16 B over the 100 KB opt-in: "
          "refused (%d), kernel did %s",
          (int)e, ok ? "not run" : "RUN");
    a = cudaFuncSetAttribute((const void *)k_smem, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             228 * 1024);
    check(a != cudaSuccess,
          "4 cudaFuncSetAttribute(MaxDynamicSharedMemorySize, 228 KB) over the "
          "device's 227 KB refused (%d)",
          (int)a);
    check_launch_refused(dim3(1), dim3(1025));
    check_launch_refused(dim3(2), dim3(32, 33));
    check_launch_refused(dim3(1), dim3(1, 1, 65));
    check_launch_refused(dim3(1), dim3(0));
    /* and the largest legal block runs */
    int *d = (int *)dev_alloc(1024 * sizeof(int)), h[1024], n = 0;
    CK(cudaMemset(d, 0, sizeof(h)));
    k_count<<<1, dim3(32, 32)>>>(d);
    e = cudaGetLastError();
    to_host(h, d, sizeof(h));
    for (int i = 0; i < 1024; i++)
        n += h[i];
    check(e == cudaSuccess && n == 1024,
          "4 launch block(32,32) = 1024 threads accepted: %d threads ran", n);
    CK(cudaFree(d));
}

/* ==== 6. bugs the emulator must report ===================================================== */

/* lanes 0-15 of each warp wait at __syncthreads, lanes 16-31 at a full-warp shuffle */
__global__ void k_divergent(int *out) {
    int v = (int)threadIdx.x;
    if (threadIdx.x % 32 < 16)
        __syncthreads();
    else
        v = __shfl_xor_sync(FULL, v, 1);
    out[threadIdx.x] = v;
}
/* a shuffle whose mask names only lanes 0-15 while all 32 lanes are live and call it */
__global__ void k_partial_mask(int *out) {
    int v = (int)threadIdx.x;
    v = __shfl_xor_sync(0x0000ffffu, v, 1);
    out[threadIdx.x] = v;
}
/* the lanes of one warp at two different shuffles */
__global__ void k_mixed_shuffles(int *out) {
    int v = (int)threadIdx.x;
    if (threadIdx.x < 16)
        v = __shfl_xor_sync(FULL, v, 1);
    else
        v = __shfl_down_sync(FULL, v, 1);
    out[threadIdx.x] = v;
}
/* one element past the end of a cudaMalloc'd buffer of 100 floats */
__global__ void k_oob_global(float *p, int n) {
    p[threadIdx.x] = 1.0f;
}
/* one byte past the dynamic shared memory asked for */
__global__ void k_oob_dynamic(int nbytes) {
    extern __shared__ __align__(16) unsigned char smem[];
    smem[threadIdx.x] = 1;
    if (threadIdx.x == 0) smem[nbytes] = 2;
}
/* one element past a static __shared__ array (a function static in the emulator: a global with
 * AddressSanitizer's redzones; UBSan's object-size check may report it first) */
__global__ void k_oob_static(int *out, int i) {
    __shared__ int sh[64];
    const int *p = sh;
    sh[threadIdx.x] = 1;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = p[i];
}

static void child_divergent(void) {
    int *d = (int *)dev_alloc(64 * sizeof(int));
    k_divergent<<<1, 64>>>(d);
}
static void child_partial_mask(void) {
    int *d = (int *)dev_alloc(32 * sizeof(int));
    k_partial_mask<<<1, 32>>>(d);
}
static void child_mixed(void) {
    int *d = (int *)dev_alloc(32 * sizeof(int));
    k_mixed_shuffles<<<1, 32>>>(d);
}
static void child_oob_global(void) {
    float *d = (float *)dev_alloc(100 * sizeof(float));
    k_oob_global<<<1, 101>>>(d, 100);
}
static void child_oob_dynamic(void) {
    CK(cudaFuncSetAttribute((const void *)k_oob_dynamic,
                            cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    k_oob_dynamic<<<1, 32, 64 * 1024>>>(64 * 1024 - 1000); /* a larger buffer existed before */
    k_oob_dynamic<<<1, 32, 1000>>>(1000);
}
static void child_oob_static(void) {
    int *d = (int *)dev_alloc(sizeof(int));
    k_oob_static<<<1, 64>>>(d, 64);
}

/* runs fn in a forked child with its stderr captured; the child's own time limit is 60 s */
static void in_child(void (*fn)(void), int *status, char *err, size_t cap) {
    int fd[2];
    if (pipe(fd)) {
        perror("pipe");
        exit(2);
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(2);
    }
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        close(fd[1]);
        alarm(60);
        fn();
        cudaDeviceSynchronize(); /* launches are queued: they run by here at the latest */
        fflush(stderr);
        _exit(0);
    }
    close(fd[1]);
    size_t len = 0;
    char buf[4096];
    for (;;) {
        ssize_t r = read(fd[0], buf, sizeof(buf));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        size_t k = (size_t)r < cap - 1 - len ? (size_t)r : cap - 1 - len;
        memcpy(err + len, buf, k);
        len += k;
    }
    err[len] = 0;
    close(fd[0]);
    while (waitpid(pid, status, 0) < 0 && errno == EINTR) {
    }
}

static void describe(int st, char *out, size_t n) {
    if (WIFSIGNALED(st))
        snprintf(out, n, "killed by signal %d%s", WTERMSIG(st),
                 WTERMSIG(st) == SIGABRT ? " (SIGABRT)" : "");
    else if (WIFEXITED(st))
        snprintf(out, n, "exited with %d", WEXITSTATUS(st));
    else
        snprintf(out, n, "status %d", st);
}

/* the first of the '|'-separated keys found in err, or NULL */
static const char *find_key(const char *err, const char *keys) {
    char k[128];
    for (const char *p = keys; *p;) {
        size_t len = strcspn(p, "|");
        snprintf(k, sizeof(k), "%.*s", (int)len, p);
        const char *hit = strstr(err, k);
        if (hit) return hit;
        p += len + (p[len] == '|');
    }
    return NULL;
}

/* the line of err with a key (or the first line), shortened */
static void quote(const char *err, const char *key, char *out, size_t n) {
    const char *p = find_key(err, key);
    if (p) {
        while (p > err && p[-1] != '\n')
            p--;
    } else {
        p = err;
    }
    size_t k = strcspn(p, "\n");
    if (k > 150) k = 150;
    snprintf(out, n, "%.*s", (int)k, p);
}

static void check_reported(const char *what, void (*fn)(void), const char *key, int want_abort) {
    static char err[1 << 16];
    int st;
    in_child(fn, &st, err, sizeof(err));
    char how[64], q[200];
    describe(st, how, sizeof(how));
    quote(err, key, q, sizeof(q));
    int died = want_abort ? WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT
                          : !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    check(died && find_key(err, key), "6 %s: child %s, stderr \"%s\"", what, how, q);
}

void check_detection(void) {
    check_reported("divergent __syncthreads (lanes 0-15) vs __shfl_xor_sync (lanes 16-31) reported "
                   "as a deadlock",
                   child_divergent, "deadlock in kernel k_divergent", 1);
    check_reported("shuffle with mask 0x0000ffff while all 32 lanes are live reported",
                   child_partial_mask, "mask", 1);
    check_reported("lanes of one warp at __shfl_xor_sync and __shfl_down_sync reported",
                   child_mixed, "different warp operations", 1);
#ifdef HAVE_ASAN
    check_reported("AddressSanitizer: write one float past a cudaMalloc'd buffer of 100",
                   child_oob_global, "heap-buffer-overflow", 0);
    check_reported("AddressSanitizer: write one byte past 1000 B of dynamic shared memory (after "
                   "a 64 KB launch)",
                   child_oob_dynamic, "heap-buffer-overflow", 0);
    check_reported("AddressSanitizer/UBSan: read one past a static __shared__ int[64]",
                   child_oob_static, "global-buffer-overflow|runtime error: load of address", 0);
#else
    printf(
        "SKIP 6 out-of-bounds device and shared memory accesses: not an AddressSanitizer build\n");
    (void)child_oob_global, (void)child_oob_dynamic, (void)child_oob_static;
#endif
}

/* ==== 7. the thread-order switch and a missing barrier ===================================== */

/* each thread writes its slot of dynamic shared memory and reads its right neighbour's;
 * with_barrier decides whether a __syncthreads separates the two (uniform in the block) */
__global__ void k_neighbour(int *out, int with_barrier) {
    extern __shared__ __align__(16) unsigned char smem[];
    int *s = (int *)smem;
    int t = (int)threadIdx.x, n = (int)blockDim.x;
    s[t] = 1000 * (int)blockIdx.x + t;
    if (with_barrier) __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = s[(t + 1) % n];
}

enum { NB_RACE = 2, NT_RACE = 64 };
static int run_neighbour(int with_barrier, int reverse, int *h) {
    if (reverse)
        setenv("TR_EMU_ORDER", "reverse", 1);
    else
        unsetenv("TR_EMU_ORDER");
    int *d = (int *)dev_alloc(NB_RACE * NT_RACE * sizeof(int));
    k_neighbour<<<NB_RACE, NT_RACE, NT_RACE * sizeof(int)>>>(d, with_barrier);
    CK(cudaGetLastError());
    to_host(h, d, NB_RACE * NT_RACE * sizeof(int));
    CK(cudaFree(d));
    int wrong = 0;
    for (int b = 0; b < NB_RACE; b++)
        for (int t = 0; t < NT_RACE; t++)
            wrong += h[b * NT_RACE + t] != 1000 * b + (t + 1) % NT_RACE;
    return wrong;
}

void check_order(void) {
    const char *saved = getenv("TR_EMU_ORDER");
    char *keep = saved ? strdup(saved) : NULL;
    int fwd[NB_RACE * NT_RACE], rev[NB_RACE * NT_RACE];
    int n = NB_RACE * NT_RACE;
    int wf = run_neighbour(0, 0, fwd), wr = run_neighbour(0, 1, rev);
    int differ = memcmp(fwd, rev, sizeof(fwd)) != 0;
    check(differ && (wf || wr),
          "7 missing __syncthreads between a shared write and a neighbour's "
          "read: default order %d of %d wrong, TR_EMU_ORDER=reverse %d of %d wrong, results %s",
          wf, n, wr, n, differ ? "differ" : "IDENTICAL");
    wf = run_neighbour(1, 0, fwd), wr = run_neighbour(1, 1, rev);
    differ = memcmp(fwd, rev, sizeof(fwd)) != 0;
    check(!differ && !wf && !wr,
          "7 the same kernel with __syncthreads: default order %d wrong, "
          "reverse %d wrong, results %s",
          wf, wr, differ ? "DIFFER" : "identical");
    if (keep)
        setenv("TR_EMU_ORDER", keep, 1);
    else
        unsetenv("TR_EMU_ORDER");
    free(keep);
}

/* ==== 8. the runtime API subset ============================================================ */

void check_api(void) {
    enum { N = 1000 };
    unsigned char *d = (unsigned char *)dev_alloc(N), h[N + 8];
    to_host(h, d, N);
    int ff = 0;
    for (int i = 0; i < N; i++)
        ff += h[i] == 0xff;
    check(ff == N, "8 cudaMalloc(1000): %d of %d bytes are 0xff", ff, N);

    memset(h, 0x11, sizeof(h));
    unsigned char src[N];
    memset(src, 0x22, sizeof(src));
    cudaError_t e1 = cudaMemcpy(h, src, N, cudaMemcpyHostToDevice); /* destination: host memory */
    int untouched = h[0] == 0x11 && h[N - 1] == 0x11;
    check(e1 != cudaSuccess && untouched,
          "8 cudaMemcpy HostToDevice to host memory: %d (%s), "
          "destination %s",
          (int)e1, cudaGetErrorString(e1), untouched ? "untouched" : "WRITTEN");
    cudaError_t e2 = cudaMemcpy(h, src, N, cudaMemcpyDeviceToHost);     /* source: host memory */
    cudaError_t e3 = cudaMemcpy(d, src, N + 1, cudaMemcpyHostToDevice); /* one byte too many */
    cudaError_t e4 = cudaMemcpy(d + 500, src, 500, cudaMemcpyHostToDevice); /* inside: fine */
    cudaError_t e5 = cudaMemcpy(d + 500, src, 501, cudaMemcpyHostToDevice);
    cudaError_t e6 = cudaMemset(h, 0, N);
    check(e2 != cudaSuccess && e3 != cudaSuccess && e4 == cudaSuccess && e5 != cudaSuccess &&
              e6 != cudaSuccess,
          "8 DeviceToHost from host memory %d, 1001 B into a 1000 B allocation "
          "%d, 500 B at offset 500 %d (must succeed), 501 B at offset 500 %d, cudaMemset of host "
          "memory %d",
          (int)e2, (int)e3, (int)e4, (int)e5, (int)e6);

    void *host = malloc(64);
    cudaError_t f1 = cudaFree(host), f2 = cudaFree(d + 1), f3 = cudaFree(d), f4 = cudaFree(d),
                f5 = cudaFree(NULL);
    free(host);
    check(f1 != cudaSuccess && f2 != cudaSuccess && f3 == cudaSuccess && f4 != cudaSuccess &&
              f5 == cudaSuccess,
          "8 cudaFree of malloc'd memory %d, of an interior pointer %d, of the "
          "allocation %d (must succeed), twice %d, of NULL %d (must succeed)",
          (int)f1, (int)f2, (int)f3, (int)f4, (int)f5);
    cudaGetLastError(); /* whatever the calls above left */
}

int emu_sched_eager(void);

static __global__ void k_fill(int *p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

/* 9: trials of a producer kernel on s1 and a copy of its output on s2, with or without the
 * wait that orders them; returns how many trials saw stale data */
static int stale_trials(int wait) {
    const int n = 64, trials = 16;
    cudaStream_t s1, s2;
    cudaEvent_t e;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e));
    int *a = (int *)dev_alloc(n * sizeof(int)), *b = (int *)dev_alloc(n * sizeof(int));
    int stale = 0, h[64];
    for (int t = 0; t < trials; t++) {
        k_fill<<<1, n, 0, s1>>>(a, n, t + 1);
        CK(cudaEventRecord(e, s1));
        if (wait) CK(cudaStreamWaitEvent(s2, e, 0));
        CK(cudaMemcpyAsync(b, a, n * sizeof(int), cudaMemcpyDeviceToDevice, s2));
        CK(cudaStreamSynchronize(s2));
        CK(cudaMemcpy(h, b, sizeof(h), cudaMemcpyDeviceToHost));
        stale += h[n - 1] != t + 1;
        CK(cudaStreamSynchronize(s1));
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaEventDestroy(e));
    CK(cudaStreamDestroy(s1));
    CK(cudaStreamDestroy(s2));
    return stale;
}

/* 9: a host buffer copied to the device on a stream, then written at once: the copy is still
 * queued (the adversarial scheduler runs nothing before the synchronization), and the
 * emulator names the write when the copy runs */
static void child_source_reused(void) {
    static float h[256];
    float *d = (float *)dev_alloc(sizeof h);
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    CK(cudaMemcpyAsync(d, h, sizeof h, cudaMemcpyHostToDevice, s));
    h[7] = 1.0f; /* too early */
    CK(cudaStreamSynchronize(s));
}

/* the same, synchronized before the write: the device has the values as they were */
static int source_synced(void) {
    static float h[256], back[256];
    float *d = (float *)dev_alloc(sizeof h);
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    h[7] = 2.0f;
    CK(cudaMemcpyAsync(d, h, sizeof h, cudaMemcpyHostToDevice, s));
    CK(cudaStreamSynchronize(s));
    h[7] = 1.0f;
    CK(cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost));
    CK(cudaFree(d));
    CK(cudaStreamDestroy(s));
    return back[7] == 2.0f;
}

void check_adversarial(void) {
    if (emu_sched_eager()) {
        printf("SKIP 9 the adversarial scheduler: TR_EMU_SCHED=eager\n");
        return;
    }
    int without = stale_trials(0), with = stale_trials(1);
    check(without > 0, "9 a copy that does not wait for the kernel writing its source: stale in %d of 16 trials", without);
    check(with == 0, "9 the same copy after cudaStreamWaitEvent: stale in %d of 16 trials", with);
    static char err[1 << 16];
    char how[64], q[200];
    int st;
    in_child(child_source_reused, &st, err, sizeof(err));
    describe(st, how, sizeof(how));
    quote(err, "host source", q, sizeof(q));
    check(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && find_key(err, "was written before the copy ran"),
          "9 a host buffer written while its cudaMemcpyAsync is queued: child %s, stderr \"%s\"",
          how, q);
    check(source_synced(), "9 the same after cudaStreamSynchronize: no hazard, the copied values");
}
