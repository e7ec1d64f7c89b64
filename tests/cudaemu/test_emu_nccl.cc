/* Test of the CUDA emulator's streams and events (emu_streams.cc) and of its NCCL over MPI
 * (emu_nccl.cc), under mpirun -np 2 and -np 3: every collective's values (in and out of place,
 * 1 and 100000 elements), sub-communicators, communicators created in one group, grouped
 * send/recv rings, the ordering of streams
 * and events around pending operations, abort, and the errors NCCL reports. Rank 0 prints one
 * "ok ..." line per check; any failure makes every rank exit 1. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#define OMPI_SKIP_MPICXX 1 /* the C API only */
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include "emu_async.h"
#include "emu_nccl.h"
#include "emu.h" /* last: its macros (threadIdx, min, max) are for the kernel below */

static int g_rank, g_size;
static MPI_Comm g_ctl; /* a duplicate of the world for the test's own barriers */
static int g_bad;      /* this rank saw a failure in the current check */
static int g_any_bad;  /* in any check */

static void bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void bad(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rank %d: FAIL: ", g_rank);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    g_bad = 1;
}
#define EXPECT(c, ...) ((c) ? (void)0 : bad(__VA_ARGS__))
#define NCK(x)                                                                                     \
    do {                                                                                           \
        ncclResult_t r_ = (x);                                                                     \
        if (r_ != ncclSuccess)                                                                     \
            bad("%s: %s (%s)", #x, ncclGetErrorString(r_), ncclGetLastError(NULL));                \
    } while (0)
#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) bad("%s: %s", #x, cudaGetErrorString(e_));                          \
    } while (0)

/* every rank ends the check here; rank 0 reports it */
static void done(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void done(const char *fmt, ...) {
    int any = 0;
    MPI_Allreduce(&g_bad, &any, 1, MPI_INT, MPI_MAX, g_ctl);
    if (g_rank == 0) {
        va_list ap;
        va_start(ap, fmt);
        printf("%s ", any ? "FAIL" : "ok");
        vprintf(fmt, ap);
        printf(" (%d ranks)\n", g_size);
        fflush(stdout);
        va_end(ap);
    }
    g_any_bad |= any;
    g_bad = 0;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    CK(cudaMalloc(&p, bytes));
    return p;
}

/* ---- element types ----------------------------------------------------------------------- */

static uint16_t to_bf16(float f) { /* round to nearest even */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

struct dtype {
    ncclDataType_t t;
    size_t size;
    const char *name;
};
static const dtype F32 = {ncclFloat32, 4, "fp32"}, BF16 = {ncclBfloat16, 2, "bf16"},
                   I32 = {ncclInt32, 4, "int32"};

static void put(const dtype &d, void *buf, size_t i, double v) {
    char *p = (char *)buf + i * d.size;
    switch (d.t) {
    case ncclFloat32: {
        float f = (float)v;
        memcpy(p, &f, 4);
        break;
    }
    case ncclFloat64:
        memcpy(p, &v, 8);
        break;
    case ncclBfloat16: {
        uint16_t h = to_bf16((float)v);
        memcpy(p, &h, 2);
        break;
    }
    case ncclFloat16: {
        _Float16 h = (_Float16)v;
        memcpy(p, &h, 2);
        break;
    }
    case ncclInt32: {
        int32_t x = (int32_t)v;
        memcpy(p, &x, 4);
        break;
    }
    case ncclUint32: {
        uint32_t x = (uint32_t)v;
        memcpy(p, &x, 4);
        break;
    }
    case ncclInt64: {
        int64_t x = (int64_t)v;
        memcpy(p, &x, 8);
        break;
    }
    case ncclUint64: {
        uint64_t x = (uint64_t)v;
        memcpy(p, &x, 8);
        break;
    }
    case ncclInt8: {
        int8_t x = (int8_t)v;
        memcpy(p, &x, 1);
        break;
    }
    case ncclUint8: {
        uint8_t x = (uint8_t)v;
        memcpy(p, &x, 1);
        break;
    }
    default:
        abort();
    }
}

static double get(const dtype &d, const void *buf, size_t i) {
    const char *p = (const char *)buf + i * d.size;
    switch (d.t) {
    case ncclFloat32: {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    case ncclFloat64: {
        double f;
        memcpy(&f, p, 8);
        return f;
    }
    case ncclBfloat16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return from_bf16(h);
    }
    case ncclFloat16: {
        _Float16 h;
        memcpy(&h, p, 2);
        return (double)h;
    }
    case ncclInt32: {
        int32_t x;
        memcpy(&x, p, 4);
        return x;
    }
    case ncclUint32: {
        uint32_t x;
        memcpy(&x, p, 4);
        return x;
    }
    case ncclInt64: {
        int64_t x;
        memcpy(&x, p, 8);
        return (double)x;
    }
    case ncclUint64: {
        uint64_t x;
        memcpy(&x, p, 8);
        return (double)x;
    }
    case ncclInt8: {
        int8_t x;
        memcpy(&x, p, 1);
        return x;
    }
    case ncclUint8: {
        uint8_t x;
        memcpy(&x, p, 1);
        return x;
    }
    default:
        abort();
    }
}

/* rank r's element i: small integers, exact in every type and in every sum of <= 3 of them */
static double val(size_t i, int r) {
    return (double)(i % 7) + r + 1;
}

/* a host array of n elements f(i) copied to a fresh device buffer of `cap` elements */
static void *dev_fill(const dtype &d, size_t cap, size_t n, double (*f)(size_t, int), int r) {
    std::vector<char> h(cap * d.size, 0);
    for (size_t i = 0; i < n; i++)
        put(d, h.data(), i, f(i, r));
    void *p = dev_alloc(cap * d.size);
    CK(cudaMemcpy(p, h.data(), cap * d.size, cudaMemcpyHostToDevice));
    return p;
}

/* n elements from device buffer p, after what stream s has pending */
static std::vector<char> dev_read(const dtype &d, const void *p, size_t n, cudaStream_t s) {
    std::vector<char> h(n * d.size);
    CK(cudaMemcpyAsync(h.data(), p, n * d.size, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    return h;
}

static void expect_values(const char *what, const dtype &d, const std::vector<char> &h, size_t n,
                          double (*want)(size_t)) {
    for (size_t i = 0; i < n; i++) {
        double got = get(d, h.data(), i), w = want(i);
        if (got != w) {
            bad("%s %s: element %zu is %g, want %g", what, d.name, i, got, w);
            return;
        }
    }
}

static ncclComm_t comm_world(void) {
    ncclUniqueId id;
    if (g_rank == 0) NCK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, g_ctl);
    ncclComm_t c = NULL;
    NCK(ncclCommInitRank(&c, g_size, id, g_rank));
    return c;
}

/* ---- streams and events, with operations whose completion the test controls ----------------- */

struct fake {
    std::atomic<int> ready{0};
    int finished = 0, order = 0;
};
static int fake_clock;
static int fake_test(void *c) {
    return ((fake *)c)->ready.load();
}
static void fake_finish(void *c) {
    fake *f = (fake *)c;
    f->finished++;
    f->order = ++fake_clock;
}
static int fake_match(void *c, void *key) {
    return c == key;
}

static void test_events_local(void) {
    cudaStream_t s1, s2, s3;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking));
    EXPECT(s1 != s2 && s2 != s3, "cudaStreamCreate gave the same stream twice");
    cudaEvent_t e0, e1, enotime;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventCreateWithFlags(&enotime, cudaEventDisableTiming));
    CK(cudaEventRecord(e0, s1));
    EXPECT(cudaEventQuery(e0) == cudaSuccess, "an event on an idle stream is not complete");
    fake a, b;
    emu_stream_enqueue(s1, fake_test, fake_finish, &a);
    emu_stream_enqueue(s1, fake_test, fake_finish, &b);
    b.ready = 1; /* b cannot finish before a */
    CK(cudaEventRecord(e1, s1));
    CK(cudaEventRecord(enotime, s1));
    EXPECT(cudaEventQuery(e1) == cudaErrorNotReady, "an event after a pending op is complete");
    EXPECT(cudaStreamQuery(s1) == cudaErrorNotReady, "a stream with a pending op is idle");
    EXPECT(!b.finished, "an op finished before the one ahead of it");
    EXPECT(cudaStreamQuery(s3) == cudaSuccess, "an unrelated stream is busy");
    float ms = 0;
    EXPECT(cudaEventElapsedTime(&ms, e0, e1) == cudaErrorNotReady,
           "elapsed time of a pending event");
    sleep_ms(30);
    a.ready = 1;
    EXPECT(cudaEventQuery(e1) == cudaSuccess, "the event did not complete with its ops");
    EXPECT(a.finished == 1 && b.finished == 1 && a.order < b.order, "ops finished out of order");
    CK(cudaEventElapsedTime(&ms, e0, e1));
    EXPECT(ms >= 25 && ms < 5000, "elapsed time %g ms, want about 30", ms);
    EXPECT(cudaEventElapsedTime(&ms, e0, enotime) == cudaErrorInvalidResourceHandle,
           "elapsed time of a cudaEventDisableTiming event");
    cudaEvent_t fresh;
    CK(cudaEventCreate(&fresh));
    EXPECT(cudaEventElapsedTime(&ms, e0, fresh) == cudaErrorInvalidResourceHandle,
           "elapsed time of an event never recorded");
    CK(cudaEventDestroy(fresh));
    done("events: record, query, FIFO finish, elapsed time, cudaEventDisableTiming");

    /* cudaStreamWaitEvent: s2 waits, s3 does not; a host function on s2 runs in order */
    fake c;
    emu_stream_enqueue(s1, fake_test, fake_finish, &c);
    CK(cudaEventRecord(e1, s1));
    CK(cudaStreamWaitEvent(s2, e1, 0));
    static int host_ran;
    host_ran = 0;
    CK(cudaLaunchHostFunc(
        s2, [](void *) { host_ran = 1; }, NULL));
    EXPECT(cudaStreamQuery(s2) == cudaErrorNotReady, "a stream waiting on a pending event is idle");
    EXPECT(!host_ran, "a host function ran before the event it follows");
    EXPECT(cudaStreamQuery(s3) == cudaSuccess, "a stream that waits on nothing is busy");
    std::thread t([&c] {
        sleep_ms(50);
        c.ready = 1;
    });
    CK(cudaStreamSynchronize(s2));
    EXPECT(host_ran && c.finished == 1, "cudaStreamSynchronize returned before the waited event");
    t.join();
    done("cudaStreamWaitEvent orders another stream; cudaLaunchHostFunc in stream order");

    /* the legacy default stream waits for blocking streams, not for non-blocking ones */
    cudaStream_t sb;
    CK(cudaStreamCreate(&sb));
    fake d, e;
    emu_stream_enqueue(s1, fake_test, fake_finish, &d);
    EXPECT(cudaStreamQuery(0) == cudaSuccess, "the default stream waits for a non-blocking stream");
    emu_stream_enqueue(sb, fake_test, fake_finish, &e);
    CK(cudaEventRecord(e0, 0));
    EXPECT(cudaEventQuery(e0) == cudaErrorNotReady, "the default stream ignores a blocking stream");
    e.ready = 1;
    EXPECT(cudaEventQuery(e0) == cudaSuccess, "the default stream's event did not complete");
    EXPECT(emu_stream_drop(fake_match, &d, NULL) == 1, "emu_stream_drop did not drop the op");
    CK(cudaStreamSynchronize(s1));
    EXPECT(!d.finished, "a dropped op was finished");
    CK(cudaStreamDestroy(sb));
    done("legacy default stream order; emu_stream_drop");

    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaEventDestroy(enotime));
    CK(cudaStreamDestroy(s1));
    CK(cudaStreamDestroy(s2));
    CK(cudaStreamDestroy(s3));
}

/* a kernel: x[i] *= 2 */
static void k_double(float *x, int n) {
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) x[i] *= 2;
}

static void set_three(void *p) {
    *(float *)p = 3.0f;
}

/* a launch completes its stream's pending ops first, and only its stream's */
static void test_launch_drains(void) {
    cudaStream_t s, other;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    float *x = (float *)dev_alloc(sizeof(float));
    CK(cudaMemset(x, 0, sizeof(float)));
    struct op {
        fake f;
        float *x;
    } o;
    o.x = x;
    emu_stream_enqueue(
        s, [](void *c) { return fake_test(&((op *)c)->f); },
        [](void *c) { set_three(((op *)c)->x); }, &o);
    emu_launch(k_double, "k_double", dim3(1), dim3(32), 0, other)(x, 1); /* must not block */
    std::thread t([&o] {
        sleep_ms(30);
        o.f.ready = 1;
    });
    emu_launch(k_double, "k_double", dim3(1), dim3(32), 0, s)(x, 1);
    t.join();
    float h = 0;
    CK(cudaMemcpy(&h, x, sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT(h == 6.0f, "the kernel on the stream saw %g, want 6 (3 from the pending op, doubled)",
           h);
    CK(cudaFree(x));
    CK(cudaStreamDestroy(s));
    CK(cudaStreamDestroy(other));
    done("a kernel launch waits for its stream's pending ops only");
}

/* ---- collectives ---------------------------------------------------------------------------- */

static int g_n; /* the count under test (for the want_* functions) */
static int g_root;
static double want_sum(size_t i) {
    double s = 0;
    for (int r = 0; r < g_size; r++)
        s += val(i, r);
    return s;
}
static double want_rs(size_t i) { /* reduce_scatter: my block of the sums */
    return want_sum((size_t)g_rank * (size_t)g_n + i);
}
static double want_gather(size_t i) {
    return val(i % (size_t)g_n, (int)(i / (size_t)g_n));
}
static double want_root(size_t i) {
    return val(i, g_root);
}

static void check_all_reduce(ncclComm_t c, cudaStream_t s, const dtype &d, size_t n, int inplace) {
    void *send = dev_fill(d, n, n, val, g_rank);
    void *recv = inplace ? send : dev_alloc(n * d.size);
    NCK(ncclAllReduce(send, recv, n, d.t, ncclSum, c, s));
    expect_values("all_reduce", d, dev_read(d, recv, n, s), n, want_sum);
    CK(cudaFree(send));
    if (!inplace) CK(cudaFree(recv));
}

static void check_reduce_scatter(ncclComm_t c, cudaStream_t s, const dtype &d, size_t n,
                                 int inplace) {
    size_t all = n * (size_t)g_size;
    void *send = dev_fill(d, all, all, val, g_rank);
    void *recv = inplace ? (char *)send + (size_t)g_rank * n * d.size : dev_alloc(n * d.size);
    NCK(ncclReduceScatter(send, recv, n, d.t, ncclSum, c, s));
    expect_values("reduce_scatter", d, dev_read(d, recv, n, s), n, want_rs);
    CK(cudaFree(send));
    if (!inplace) CK(cudaFree(recv));
}

static double val_mine(size_t i, int) {
    return val(i % (size_t)g_n, g_rank);
}

static void check_all_gather(ncclComm_t c, cudaStream_t s, const dtype &d, size_t n, int inplace) {
    size_t all = n * (size_t)g_size;
    void *recv, *send;
    if (inplace) { /* my block already in place, the rest garbage */
        std::vector<char> h(all * d.size, 0x5a);
        for (size_t i = 0; i < n; i++)
            put(d, h.data(), (size_t)g_rank * n + i, val(i, g_rank));
        recv = dev_alloc(all * d.size);
        CK(cudaMemcpy(recv, h.data(), h.size(), cudaMemcpyHostToDevice));
        send = (char *)recv + (size_t)g_rank * n * d.size;
    } else {
        send = dev_fill(d, n, n, val_mine, g_rank);
        recv = dev_alloc(all * d.size);
    }
    NCK(ncclAllGather(send, recv, n, d.t, c, s));
    expect_values("all_gather", d, dev_read(d, recv, all, s), all, want_gather);
    if (!inplace) CK(cudaFree(send));
    CK(cudaFree(recv));
}

static void check_broadcast(ncclComm_t c, cudaStream_t s, const dtype &d, size_t n, int inplace) {
    g_root = g_size - 1;
    void *send = dev_fill(d, n, n, val, g_rank);
    void *recv = inplace ? send : dev_alloc(n * d.size);
    NCK(ncclBroadcast(send, recv, n, d.t, g_root, c, s));
    expect_values("broadcast", d, dev_read(d, recv, n, s), n, want_root);
    CK(cudaFree(send));
    if (!inplace) CK(cudaFree(recv));
}

static void check_reduce(ncclComm_t c, cudaStream_t s, const dtype &d, size_t n, int inplace) {
    int root = 1 % g_size;
    void *send = dev_fill(d, n, n, val, g_rank);
    void *recv = inplace ? send : dev_alloc(n * d.size);
    NCK(ncclReduce(send, recv, n, d.t, ncclSum, root, c, s));
    if (g_rank == root) expect_values("reduce", d, dev_read(d, recv, n, s), n, want_sum);
    CK(cudaStreamSynchronize(s));
    CK(cudaFree(send));
    if (!inplace) CK(cudaFree(recv));
}

static void test_collectives(ncclComm_t c, cudaStream_t s) {
    const dtype types[] = {F32, BF16, I32};
    const size_t counts[] = {1, 100000};
    for (const dtype &d : types)
        for (size_t n : counts)
            for (int inplace = 0; inplace < 2; inplace++) {
                g_n = (int)n;
                check_all_reduce(c, s, d, n, inplace);
                check_reduce_scatter(c, s, d, n, inplace);
                check_all_gather(c, s, d, n, inplace);
                check_broadcast(c, s, d, n, inplace);
                check_reduce(c, s, d, n, inplace);
                done("all_reduce, reduce_scatter, all_gather, broadcast, reduce: %s, count %zu, %s",
                     d.name, n, inplace ? "in place" : "out of place");
            }
}

static double val_byte(size_t i, int) {
    return 200;
}

static void test_other_types(ncclComm_t c, cudaStream_t s) {
    const dtype more[] = {{ncclFloat64, 8, "fp64"},  {ncclFloat16, 2, "fp16"},
                          {ncclInt64, 8, "int64"},   {ncclUint64, 8, "uint64"},
                          {ncclUint32, 4, "uint32"}, {ncclInt8, 1, "int8"}};
    g_n = 1000;
    for (const dtype &d : more)
        check_all_reduce(c, s, d, 1000, 0);
    /* 8-bit sums wrap around (Open MPI's own can saturate) */
    dtype u8 = {ncclUint8, 1, "uint8"};
    void *p = dev_fill(u8, 64, 64, val_byte, 0);
    size_t block = 64 / (size_t)g_size;
    char *mine = (char *)p + (size_t)g_rank * block; /* in place */
    NCK(ncclAllReduce(p, p, 64, ncclUint8, ncclSum, c, s));
    NCK(ncclReduceScatter(p, mine, block, ncclUint8, ncclSum, c, s));
    std::vector<char> h = dev_read(u8, mine, 1, s);
    unsigned want = (200u * (unsigned)g_size * (unsigned)g_size) % 256u;
    EXPECT((unsigned char)h[0] == want, "uint8 sums: %u, want %u (mod 256)", (unsigned char)h[0],
           want);
    CK(cudaFree(p));
    done("fp64, fp16, int64, uint64, uint32, int8 all_reduce; uint8 sums wrap");
}

/* bf16 sums round to nearest even: 1 + 2^-8 is a tie (to 1), 1 + 2^-7 + 2^-8 a tie (to
 * 1 + 2^-6), 1 + 3 2^-9 above half (to 1 + 2^-7); truncation would give 1, 1 + 2^-7, 1.
 * Ranks 0 and 1 add; the others give zeros (exact in any order). */
static double bf_x(size_t i, int r) {
    static const double x[] = {1.0, 1.0 + 1.0 / 128, 1.0}, y[] = {1.0 / 256, 1.0 / 256, 3.0 / 512};
    return r == 0 ? x[i] : r == 1 ? y[i] : 0.0;
}
static double bf_want(size_t i) {
    static const double w[] = {1.0, 1.0 + 1.0 / 64, 1.0 + 1.0 / 128};
    return w[i];
}
static void test_bf16_rounding(ncclComm_t c, cudaStream_t s) {
    void *p = dev_fill(BF16, 3, 3, bf_x, g_rank);
    NCK(ncclAllReduce(p, p, 3, ncclBfloat16, ncclSum, c, s));
    expect_values("bf16 rounding", BF16, dev_read(BF16, p, 3, s), 3, bf_want);
    CK(cudaFree(p));
    done("bf16 all_reduce rounds each sum to nearest even");
}

/* A communicator whose NCCL ranks run opposite to the world's, made by the last world rank:
 * all_gather of each rank's NCCL rank must come back in NCCL rank order. */
static void test_reversed(cudaStream_t s) {
    ncclUniqueId id;
    if (g_rank == g_size - 1) NCK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, g_size - 1, g_ctl);
    ncclComm_t c = NULL;
    int me = g_size - 1 - g_rank, n = 0, r = -1, dev = -1;
    NCK(ncclCommInitRank(&c, g_size, id, me));
    NCK(ncclCommCount(c, &n));
    NCK(ncclCommUserRank(c, &r));
    NCK(ncclCommCuDevice(c, &dev));
    EXPECT(n == g_size && r == me && dev == 0, "count %d rank %d device %d", n, r, dev);
    int32_t *mine = (int32_t *)dev_alloc(4), *all = (int32_t *)dev_alloc(4 * (size_t)g_size);
    CK(cudaMemcpy(mine, &me, 4, cudaMemcpyHostToDevice));
    NCK(ncclAllGather(mine, all, 1, ncclInt32, c, s));
    std::vector<int32_t> h((size_t)g_size);
    CK(cudaMemcpyAsync(h.data(), all, 4 * (size_t)g_size, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (int i = 0; i < g_size; i++)
        EXPECT(h[(size_t)i] == i, "reversed comm: slot %d holds %d", i, h[(size_t)i]);
    CK(cudaFree(mine));
    CK(cudaFree(all));
    NCK(ncclCommDestroy(c));
    done("a communicator ordered by NCCL rank, not world rank; count, user rank, device");
}

/* A sub-communicator: world ranks {0, 2} of 3 (the others alone, a communicator of one), its
 * id broadcast over an MPI sub-communicator. */
static void test_sub(cudaStream_t s) {
    int member = g_size == 3 ? g_rank != 1 : 0;
    MPI_Comm sub;
    MPI_Comm_split(g_ctl, member ? 0 : 1 + g_rank, g_rank, &sub);
    int sr, ss;
    MPI_Comm_rank(sub, &sr);
    MPI_Comm_size(sub, &ss);
    ncclUniqueId id;
    if (sr == 0) NCK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, sub);
    ncclComm_t c = NULL;
    NCK(ncclCommInitRank(&c, ss, id, sr));
    float *p = (float *)dev_alloc(4);
    float v = (float)(g_rank + 1), h = 0;
    CK(cudaMemcpy(p, &v, 4, cudaMemcpyHostToDevice));
    NCK(ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, c, s));
    CK(cudaMemcpyAsync(&h, p, 4, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    float want = member ? 1.0f + 3.0f : v;
    EXPECT(h == want, "sub-communicator sum %g, want %g", h, want);
    CK(cudaFree(p));
    NCK(ncclCommDestroy(c));
    MPI_Comm_free(&sub);
    done("sub-communicator %s", g_size == 3 ? "{0, 2} of 3 (and {1} alone)" : "of one rank each");
}

/* Both directions of a ring in one group, 100000 floats each (beyond eager sizes): a send
 * and a receive with one peer never wait for each other. Nested groups count as one. */
static void test_ring(ncclComm_t c, cudaStream_t s) {
    const size_t n = 100000;
    int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
    g_n = (int)n;
    float *mine = (float *)dev_fill(F32, n, n, val_mine, 0);
    float *from_prev = (float *)dev_alloc(n * 4), *from_next = (float *)dev_alloc(n * 4);
    NCK(ncclGroupStart());
    NCK(ncclSend(mine, n, ncclFloat32, next, c, s));
    NCK(ncclGroupStart());
    NCK(ncclRecv(from_prev, n, ncclFloat32, prev, c, s));
    NCK(ncclRecv(from_next, n, ncclFloat32, next, c, s));
    NCK(ncclGroupEnd());
    NCK(ncclSend(mine, n, ncclFloat32, prev, c, s));
    NCK(ncclGroupEnd());
    std::vector<char> a = dev_read(F32, from_prev, n, s), b = dev_read(F32, from_next, n, s);
    for (size_t i = 0; i < n; i++) {
        if (get(F32, a.data(), i) != val(i, prev) || get(F32, b.data(), i) != val(i, next)) {
            bad("ring: element %zu: %g from %d, %g from %d", i, get(F32, a.data(), i), prev,
                get(F32, b.data(), i), next);
            break;
        }
    }
    CK(cudaFree(mine));
    CK(cudaFree(from_prev));
    CK(cudaFree(from_next));
    done("grouped send/recv ring in both directions (nested group)");
}

/* ---- ordering around pending operations ------------------------------------------------------ */

static void test_ordering(ncclComm_t c, cudaStream_t s) {
    /* the other ranks start late: a copy or kernel on the stream must still see the sum */
    const size_t n = 1000;
    g_n = (int)n;
    float *p = (float *)dev_fill(F32, n, n, val, g_rank);
    if (g_rank) sleep_ms(150);
    NCK(ncclAllReduce(p, p, n, ncclFloat32, ncclSum, c, s));
    expect_values("copy after all_reduce", F32, dev_read(F32, p, n, s), n, want_sum);
    if (g_rank) sleep_ms(150);
    NCK(ncclAllReduce(p, p, n, ncclFloat32, ncclSum, c, s));
    emu_launch(k_double, "k_double", dim3((unsigned)(n + 255) / 256), dim3(256), 0, s)(p, (int)n);
    std::vector<char> h = dev_read(F32, p, n, s);
    for (size_t i = 0; i < n; i++)
        if (get(F32, h.data(), i) != 2 * g_size * want_sum(i)) {
            bad("kernel after all_reduce: element %zu is %g", i, get(F32, h.data(), i));
            break;
        }
    CK(cudaFree(p));
    done("a copy and a kernel on the stream follow a pending all_reduce");

    /* an event after a receive completes only once the peer has sent; a stream made to wait
     * for it waits, another does not; a watchdog thread may query the event meanwhile */
    cudaStream_t s2, s3;
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking));
    cudaEvent_t e;
    CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    float *buf = (float *)dev_alloc(n * 4), *other = (float *)dev_alloc(4);
    std::atomic<int> seen{0};
    std::thread watchdog;
    if (g_rank == 0) {
        NCK(ncclRecv(buf, n, ncclFloat32, 1, c, s));
        CK(cudaEventRecord(e, s));
        CK(cudaStreamWaitEvent(s2, e, 0));
        EXPECT(cudaEventQuery(e) == cudaErrorNotReady, "the event after a receive completed early");
        EXPECT(cudaStreamQuery(s2) == cudaErrorNotReady, "the waiting stream is idle");
        float one = 1, h1 = 0;
        CK(cudaMemcpyAsync(other, &one, 4, cudaMemcpyHostToDevice, s3)); /* must not block */
        CK(cudaMemcpyAsync(&h1, other, 4, cudaMemcpyDeviceToHost, s3));
        EXPECT(h1 == 1, "copy on an unrelated stream");
        watchdog = std::thread([&] {
            while (cudaEventQuery(e) == cudaErrorNotReady)
                sleep_ms(1);
            seen = 1;
        });
    }
    MPI_Barrier(g_ctl); /* now rank 1 sends */
    if (g_rank == 1) {
        void *v = dev_fill(F32, n, n, val, 1);
        NCK(ncclSend(v, n, ncclFloat32, 0, c, s));
        CK(cudaStreamSynchronize(s));
        CK(cudaFree(v));
    }
    if (g_rank == 0) {
        std::vector<char> got = dev_read(F32, buf, n, s2);
        for (size_t i = 0; i < n; i++)
            if (get(F32, got.data(), i) != val(i, 1)) {
                bad("copy on the waiting stream: element %zu is %g", i, get(F32, got.data(), i));
                break;
            }
        watchdog.join();
        EXPECT(seen == 1, "the watchdog thread never saw the event complete");
    }
    CK(cudaFree(buf));
    CK(cudaFree(other));
    CK(cudaEventDestroy(e));
    CK(cudaStreamDestroy(s2));
    CK(cudaStreamDestroy(s3));
    done("event after a receive: NotReady until the peer sends; cudaStreamWaitEvent; a query "
         "thread");
}

/* ncclCommAbort with a receive whose peer never sends: the stream drains at once, the event
 * completes, the communicator refuses later calls. Rank 1 aborts from another thread while
 * its main thread waits on the stream, as a watchdog would. */
static void test_abort(cudaStream_t s) {
    ncclComm_t c = comm_world();
    float *buf = (float *)dev_alloc(4096 * 4);
    cudaEvent_t e;
    CK(cudaEventCreate(&e));
    int peer = (g_rank + 1) % g_size;
    if (g_rank <= 1) {
        NCK(ncclRecv(buf, 4096, ncclFloat32, peer, c, s));
        CK(cudaEventRecord(e, s));
        EXPECT(cudaEventQuery(e) == cudaErrorNotReady, "the receive completed with no sender");
    }
    if (g_rank == 1) {
        std::thread t([c] {
            sleep_ms(100);
            ncclCommAbort(c);
        });
        CK(cudaStreamSynchronize(s)); /* returns once the other thread has aborted */
        t.join();
    } else {
        NCK(ncclCommAbort(c));
        CK(cudaStreamSynchronize(s));
    }
    EXPECT(cudaEventQuery(e) == cudaSuccess, "the event after an aborted receive is pending");
    ncclResult_t r = ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, c, s);
    EXPECT(r == ncclInvalidUsage && strstr(ncclGetLastError(NULL), "abort"),
           "a call on an aborted comm gave %d (%s)", (int)r, ncclGetLastError(NULL));
    CK(cudaEventDestroy(e));
    CK(cudaFree(buf));
    done("ncclCommAbort drops a pending receive (also from another thread)");
}

/* ---- errors ---------------------------------------------------------------------------------- */

static void expect_error(ncclResult_t got, ncclResult_t want, const char *words, const char *what) {
    const char *msg = ncclGetLastError(NULL);
    EXPECT(got == want && strstr(msg, words),
           "%s: result %d (%s), want %d and a message with "
           "\"%s\"",
           what, (int)got, msg, (int)want, words);
}

static void test_errors(ncclComm_t c, cudaStream_t s) {
    ncclUniqueId id;
    if (g_rank == 0) NCK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, g_ctl);
    ncclComm_t bad_comm = NULL;
    expect_error(ncclCommInitRank(&bad_comm, g_size, id, g_size), ncclInvalidArgument, "rank",
                 "rank == nranks");
    expect_error(ncclCommInitRank(&bad_comm, 0, id, 0), ncclInvalidArgument, "nranks", "nranks 0");
    ncclUniqueId junk;
    memset(&junk, 7, sizeof(junk));
    expect_error(ncclCommInitRank(&bad_comm, g_size, junk, g_rank), ncclInvalidArgument,
                 "ncclGetUniqueId", "an id not from ncclGetUniqueId");

    float *p = (float *)dev_alloc(64 * 4);
    expect_error(ncclAllReduce(p, p, 4, ncclFloat32, ncclProd, c, s), ncclInvalidArgument,
                 "ncclSum", "ncclProd");
    expect_error(ncclAllReduce(p, p, 4, ncclFloat8e4m3, ncclSum, c, s), ncclInvalidArgument,
                 "datatype", "fp8");
    float host[4];
    expect_error(ncclAllReduce(host, host, 4, ncclFloat32, ncclSum, c, s), ncclInvalidArgument,
                 "cudaMalloc", "a host buffer");
    expect_error(ncclAllReduce(p, p, 65, ncclFloat32, ncclSum, c, s), ncclInvalidArgument,
                 "cudaMalloc", "past the allocation's end");
    expect_error(ncclSend(p, 4, ncclFloat32, g_size, c, s), ncclInvalidArgument, "peer",
                 "peer out of range");
    expect_error(ncclBroadcast(p, p, 4, ncclFloat32, -1, c, s), ncclInvalidArgument, "root",
                 "root out of range");
    expect_error(ncclAllReduce(p, p, 4, ncclFloat32, ncclSum, NULL, s), ncclInvalidArgument, "NULL",
                 "a NULL comm");
    expect_error(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart", "ncclGroupEnd alone");
    NCK(ncclGroupStart());
    ncclResult_t r = ncclAllReduce(p, p, 4, ncclFloat32, ncclMax, c, s);
    EXPECT(r == ncclInvalidArgument, "ncclMax in a group gave %d", (int)r);
    NCK(ncclAllReduce(p, p, 4, ncclFloat32, ncclSum, c, s));
    EXPECT(ncclGroupEnd() == ncclInvalidArgument, "ncclGroupEnd did not report the group's error");
    CK(cudaStreamSynchronize(s));
    CK(cudaFree(p));
    int v = 0;
    NCK(ncclGetVersion(&v));
    EXPECT(v == NCCL_VERSION_CODE, "ncclGetVersion %d", v);
    ncclResult_t ae = ncclInternalError;
    NCK(ncclCommGetAsyncError(c, &ae));
    EXPECT(ae == ncclSuccess, "ncclCommGetAsyncError %d", (int)ae);

    /* every rank on one GPU (TR_EMU_DEVICE): NCCL refuses */
    setenv("TR_EMU_DEVICE", "shared", 1);
    if (g_rank == 0) NCK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, g_ctl);
    expect_error(ncclCommInitRank(&bad_comm, g_size, id, g_rank), ncclInvalidUsage, "Duplicate GPU",
                 "ranks sharing a GPU");
    unsetenv("TR_EMU_DEVICE");
    done("errors: bad rank/nranks/id, unsupported op and type, host buffer, peer, root, group, "
         "duplicate GPU");
}

/* every process a GPU of its own: UUIDs and PCI bus ids differ between ranks */
/* ---- communicators created in one group ------------------------------------------------------ */

/* A communicator of two for each ordered pair (i, j) of ranks, its id made by i (as the
 * device transport's channels): every rank creates its 2 (size - 1) in one group, first those
 * it made the ids of. Made one after another in that order they would wait on each other in a
 * cycle (rank 0 at (0, 1) for rank 1, rank 1 at (1, 0) for rank 0); in a group they are made
 * together. Each then sums over its two ranks; the census counts them as grouped, in one group.
 * A group that would both create a communicator and run an operation is refused. */
static void test_grouped_init(ncclComm_t world, cudaStream_t s) {
    int alone0, grouped0, groups0;
    emu_nccl_census(&alone0, &grouped0, &groups0);
    std::vector<ncclUniqueId> mine((size_t)g_size), all((size_t)g_size * g_size);
    for (int j = 0; j < g_size; j++)
        if (j != g_rank) NCK(ncclGetUniqueId(&mine[(size_t)j]));
    MPI_Allgather(mine.data(), (int)(g_size * sizeof(ncclUniqueId)), MPI_BYTE, all.data(),
                  (int)(g_size * sizeof(ncclUniqueId)), MPI_BYTE, g_ctl);
    std::vector<ncclComm_t> pair((size_t)g_size * g_size, (ncclComm_t)NULL); /* [i * size + j] */
    NCK(ncclGroupStart());
    for (int pass = 0; pass < 2; pass++) /* mine first, then the others' */
        for (int k = 1; k < g_size; k++) {
            int peer = (g_rank + k) % g_size, i = pass ? peer : g_rank, j = pass ? g_rank : peer;
            size_t at = (size_t)i * g_size + j;
            NCK(ncclCommInitRank(&pair[at], 2, all[at], pass));
            EXPECT(pair[at] == NULL, "a communicator made in a group is there before ncclGroupEnd");
        }
    NCK(ncclGroupEnd());
    float *p = (float *)dev_alloc(4);
    for (int i = 0; i < g_size; i++) /* the same order on every rank */
        for (int j = 0; j < g_size; j++) {
            ncclComm_t c = pair[(size_t)i * g_size + j];
            if (i == j || (g_rank != i && g_rank != j)) continue;
            float v = (float)(g_rank + 1), h = 0;
            CK(cudaMemcpy(p, &v, 4, cudaMemcpyHostToDevice));
            NCK(ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, c, s));
            CK(cudaMemcpyAsync(&h, p, 4, cudaMemcpyDeviceToHost, s));
            CK(cudaStreamSynchronize(s));
            EXPECT(h == (float)(i + j + 2), "communicator (%d, %d): sum %g, want %d", i, j, h,
                   i + j + 2);
            NCK(ncclCommDestroy(c));
        }
    int alone, grouped, groups;
    emu_nccl_census(&alone, &grouped, &groups);
    EXPECT(alone == alone0 && grouped - grouped0 == 2 * (g_size - 1) && groups - groups0 == 1,
           "census: %d alone, %d grouped in %d groups; want %d alone, %d grouped in 1 group",
           alone - alone0, grouped - grouped0, groups - groups0, 0, 2 * (g_size - 1));
    /* creation and an operation in one group: refused, neither runs */
    ncclUniqueId id;
    NCK(ncclGetUniqueId(&id));
    ncclComm_t solo = NULL;
    NCK(ncclGroupStart());
    NCK(ncclCommInitRank(&solo, 1, id, 0));
    NCK(ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, world, s));
    expect_error(ncclGroupEnd(), ncclInvalidUsage, "ncclCommInitRank",
                 "a group creating a communicator and running an operation");
    EXPECT(solo == NULL, "the refused group created its communicator");
    CK(cudaFree(p));
    done("%d communicators of two created in one group, in an order that blocking creation "
         "deadlocks on; a group mixing creation and operations refused",
         2 * (g_size - 1));
}

static void test_identity(void) {
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    char bus[32] = "";
    CK(cudaDeviceGetPCIBusId(bus, sizeof(bus), 0));
    std::vector<char> all((size_t)g_size * 16), buses((size_t)g_size * 32);
    MPI_Allgather(p.uuid.bytes, 16, MPI_BYTE, all.data(), 16, MPI_BYTE, g_ctl);
    MPI_Allgather(bus, 32, MPI_BYTE, buses.data(), 32, MPI_BYTE, g_ctl);
    for (int i = 0; i < g_size; i++)
        for (int j = i + 1; j < g_size; j++) {
            EXPECT(memcmp(&all[(size_t)i * 16], &all[(size_t)j * 16], 16),
                   "ranks %d and %d have one uuid", i, j);
            EXPECT(strcmp(&buses[(size_t)i * 32], &buses[(size_t)j * 32]),
                   "ranks %d and %d have one PCI bus id %s", i, j, &buses[(size_t)i * 32]);
        }
    EXPECT(strlen(bus) == 12, "PCI bus id \"%s\" is not domain:bus:device.function", bus);
    done("each process a distinct device (uuid, PCI bus id %s on rank 0)", bus);
}

int main(int argc, char **argv) {
    /* before MPI_Init: the emulated NCCL has no transport yet */
    ncclUniqueId id;
    ncclResult_t early = ncclGetUniqueId(&id);
    char early_msg[512];
    snprintf(early_msg, sizeof(early_msg), "%s", ncclGetLastError(NULL));

    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_dup(MPI_COMM_WORLD, &g_ctl);
    MPI_Comm_rank(g_ctl, &g_rank);
    MPI_Comm_size(g_ctl, &g_size);
    if (provided < MPI_THREAD_MULTIPLE || g_size < 2) {
        if (g_rank == 0)
            fprintf(stderr,
                    "test_emu_nccl: run under mpirun -np 2 or more with "
                    "MPI_THREAD_MULTIPLE (have %d ranks, thread level %d)\n",
                    g_size, provided);
        MPI_Finalize();
        return 1;
    }
    EXPECT(early == ncclSystemError && strstr(early_msg, "MPI"),
           "ncclGetUniqueId before MPI_Init: %d (%s)", (int)early, early_msg);
    done("ncclGetUniqueId before MPI_Init is a system error naming MPI");

    test_events_local();
    test_launch_drains();
    test_identity();
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ncclComm_t c = comm_world();
    test_collectives(c, s);
    test_other_types(c, s);
    test_bf16_rounding(c, s);
    test_reversed(s);
    test_sub(s);
    test_ring(c, s);
    test_ordering(c, s);
    test_errors(c, s);
    test_grouped_init(c, s);
    test_abort(s);
    NCK(ncclCommDestroy(c));
    CK(cudaStreamDestroy(s));
    done("ncclCommDestroy");
    MPI_Comm_free(&g_ctl);
    MPI_Finalize();
    return g_any_bad ? 1 : 0;
}
