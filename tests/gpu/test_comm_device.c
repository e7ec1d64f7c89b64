/* comm.h on device memory: every operation through the device transport (NCCL, or staged
 * through pinned host memory), on whatever world it is started in, against sums computed on
 * the host. fp32 and bf16; in- and out-of-place; sizes 1 to 65537; a result read back through
 * the backend (whose download waits on the compute stream) proves the stream ordering;
 * tr_comm_wait on NCCL does not block the host. Sends and receives through channels
 * (comm.h): receives posted ahead of the sends on both ends of a pair, in opposite directions
 * (what one NCCL stream per group would deadlock on), several messages per channel arriving
 * in order, two channels one way told apart by tag, and a late sender whose data the compute
 * stream must wait for, and receives one after another (each staged one's copy to the device
 * done before its host buffer takes the next). An operation never waited for is completed and
 * freed with its group.
 *   mpirun -np N test_comm_device   one rank per GPU (NCCL), or ranks sharing one (staged)
 *   TR_COMM_DEVICE=staged | nccl    the staged transport; NCCL even in a group of one
 *   --stuck-rank R --timeout T      for tests/mpi/dead_rank.sh: rank R sleeps instead of
 *                                   joining a device all_reduce; the others' watchdog must end
 *                                   the job within T s, naming it (their host is blocked
 *                                   reading the result, as a training step's would be)
 *   --stuck-recv-rank R --timeout T the same with a message on a channel that rank R never
 *                                   sends: rank 0 waits for it in a receive
 * Exits 77 (skipped) without a CUDA device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "model/backend.h"
#include "parallel/comm/comm.h"

static const size_t sizes[] = {1, 1000, 65537};

/* Rank r's element i: small integers and halves, exact in bf16 and in any sum order. */
static float val(int r, size_t i) {
    return (float)((int)((i * 7 + (size_t)r * 13) % 61) - 30) * 0.5f;
}

typedef struct {
    const tr_backend *be;
    tr_comm *w;
    int rank, size;
    const char *dt;
} ctx;

static void *up(const ctx *x, const float *host, size_t n) {
    void *d = x->be->alloc(n * tr_dtype_size(x->be->dtype));
    x->be->to_storage(d, host, n);
    return d;
}
static void down(const ctx *x, float *host, const void *d, size_t n) {
    x->be->from_storage(host, d, n);
}

/* got[i] == want(i) for every i; one check line. */
static void expect(const float *got, size_t n, float (*want)(const ctx *, size_t, void *),
                   const ctx *x, void *arg, const char *what, size_t size) {
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (got[i] != want(x, i, arg)) bad = i;
    check(bad == n, "rank %d: %s %s n=%zu%s%s", x->rank, what, x->dt, size,
          bad < n ? ": first wrong element " : "", bad < n ? "(see below)" : "");
    if (bad < n)
        printf("  element %zu: got %g expected %g\n", bad, got[bad], want(x, bad, arg));
}

static float want_sum(const ctx *x, size_t i, void *arg) {
    size_t off = arg ? *(size_t *)arg : 0;
    float s = 0;
    for (int r = 0; r < x->size; r++)
        s += val(r, off + i);
    return s;
}
static float want_gather(const ctx *x, size_t i, void *arg) {
    size_t n = *(size_t *)arg;
    return val((int)(i / n), i % n);
}
static float want_root(const ctx *x, size_t i, void *arg) {
    return val(x->size - 1, i);
}
static float want_peer(const ctx *x, size_t i, void *arg) {
    return val(*(int *)arg, i);
}

static void run_ops(const ctx *x, tr_comm_dtype t) {
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t n = sizes[k], p = (size_t)x->size;
        float *h = malloc(p * n * sizeof(float)), *g = malloc(p * n * sizeof(float));
        for (size_t i = 0; i < p * n; i++) h[i] = val(x->rank, i);
        /* all_reduce in place; the wait orders the compute stream, whose download reads it */
        void *a = up(x, h, n);
        double t0 = tr_now();
        tr_comm_req *rq = tr_comm_start(x->w, TR_COMM_OP_ALL_REDUCE, NULL, a, n, t, -1, 0,
                                        TR_COMM_DEVICE);
        double waited = tr_comm_wait(rq), host_s = tr_now() - t0;
        down(x, g, a, n);
        expect(g, n, want_sum, x, NULL, "all_reduce", n);
        if (!strcmp(tr_comm_device_transport(x->w), "nccl") && k == 2)
            check(waited == 0.0, "rank %d: NCCL's wait does not block the host (%.1f ms in all)",
                  x->rank, 1e3 * host_s);
        /* reduce_scatter: block r of every rank's p * n elements, summed, to rank r */
        void *s = up(x, h, p * n), *r = x->be->alloc(n * tr_dtype_size(x->be->dtype));
        tr_comm_wait(tr_comm_start(x->w, TR_COMM_OP_REDUCE_SCATTER, s, r, n, t, -1, 0,
                                   TR_COMM_DEVICE));
        down(x, g, r, n);
        size_t off = (size_t)x->rank * n;
        expect(g, n, want_sum, x, &off, "reduce_scatter", n);
        /* all_gather, out of place and in place (send = recv + rank * n) */
        void *all = x->be->alloc(p * n * tr_dtype_size(x->be->dtype));
        void *mine = up(x, h, n);
        tr_comm_wait(tr_comm_start(x->w, TR_COMM_OP_ALL_GATHER, mine, all, n, t, -1, 0,
                                   TR_COMM_DEVICE));
        down(x, g, all, p * n);
        expect(g, p * n, want_gather, x, &n, "all_gather", n);
        for (size_t i = 0; i < p * n; i++) g[i] = i / n == (size_t)x->rank ? h[i % n] : NAN;
        x->be->to_storage(all, g, p * n);
        void *in_place = tr_buf_at(x->be, all, (size_t)x->rank * n);
        tr_comm_wait(tr_comm_start(x->w, TR_COMM_OP_ALL_GATHER, in_place, all, n, t, -1, 0,
                                   TR_COMM_DEVICE));
        down(x, g, all, p * n);
        expect(g, p * n, want_gather, x, &n, "all_gather in place", n);
        /* broadcast from the last rank */
        x->be->to_storage(a, h, n);
        tr_comm_wait(tr_comm_start(x->w, TR_COMM_OP_BROADCAST, NULL, a, n, t, x->size - 1, 0,
                                   TR_COMM_DEVICE));
        down(x, g, a, n);
        expect(g, n, want_root, x, NULL, "broadcast", n);
        /* send and receive between pairs (0, 1), (2, 3), ...: even ranks send first, so that
           one stream per group never holds a send behind a receive that waits for it */
        int peer = x->rank ^ 1;
        if (x->size > 1 && peer < x->size) {
            void *rb = x->be->alloc(n * tr_dtype_size(x->be->dtype));
            for (int turn = 0; turn < 2; turn++) {
                int sending = (turn == 0) == (x->rank % 2 == 0);
                tr_comm_req *q = sending ? tr_comm_start(x->w, TR_COMM_OP_SEND, mine, NULL, n, t,
                                                         peer, 5, TR_COMM_DEVICE)
                                         : tr_comm_start(x->w, TR_COMM_OP_RECV, NULL, rb, n, t,
                                                         peer, 5, TR_COMM_DEVICE);
                tr_comm_wait(q);
            }
            down(x, g, rb, n);
            expect(g, n, want_peer, x, &peer, "send/recv", n);
            x->be->free(rb);
        }
        x->be->free(a), x->be->free(s), x->be->free(r), x->be->free(all), x->be->free(mine);
        free(h), free(g);
    }
}

/* The channels of the tests, the same list on every rank: between ranks 2k and 2k+1, tag 5
 * both ways (run_ops), tag 7 both ways and tag 8 from the even rank (run_channels). The
 * odd-to-even one first, so that the even rank's setups take both roles in turn. */
static void open_channels(const ctx *x) {
    tr_comm_channel list[64];
    int n = 0;
    for (int e = 0; e + 1 < x->size && n + 5 <= 64; e += 2) {
        list[n++] = (tr_comm_channel){e + 1, e, 7};
        list[n++] = (tr_comm_channel){e, e + 1, 7};
        list[n++] = (tr_comm_channel){e, e + 1, 8};
        list[n++] = (tr_comm_channel){e, e + 1, 5};
        list[n++] = (tr_comm_channel){e + 1, e, 5};
    }
    char err[256] = "";
    check(tr_comm_open_channels(x->w, list, n, TR_COMM_DEVICE, err, sizeof err) == 0,
          "rank %d: %d channels open %s", x->rank, n, err);
    tr_comm_channel self = {0, 0, 9};
    check(tr_comm_open_channels(x->w, &self, 1, TR_COMM_DEVICE, err, sizeof err) == -1 &&
              strstr(err, "does not send to itself"),
          "rank %d: a channel from a rank to itself is refused (%s)", x->rank, err);
}

/* Message k of channel (from, tag), element i: distinct per message and channel. */
static float msg_val(int from, int tag, int k, size_t i) {
    return val(from, i + (size_t)(k * 3 + tag) * 17);
}
typedef struct {
    int from, tag, k;
} msg_id;
static float want_msg(const ctx *x, size_t i, void *arg) {
    (void)x;
    const msg_id *m = arg;
    return msg_val(m->from, m->tag, m->k, i);
}

/* Between ranks 2k and 2k+1: each first posts its receives (K on tag 7 from its peer; the odd
 * rank also one on tag 8), then the odd rank, late, sends K on tag 7, and the even rank K on
 * tag 7, then tag 8's. The compute stream is made to wait for each receive (the host not), and
 * the results are read back through it: were it not made to wait, the even rank would read
 * the receive buffers before the late messages came. */
static void run_channels(const ctx *x, tr_comm_dtype t) {
    enum { K = 3 };
    const size_t n = 1000;
    int peer = x->rank ^ 1, odd = x->rank & 1;
    if (peer >= x->size) return;
    float *h = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    void *in[K + 1], *out[K + 1];
    tr_comm_req *rq[K + 1], *sq[K + 1];
    double span0, exposed0, span1, exposed1;
    tr_comm_device_time(x->w, &span0, &exposed0);
    for (size_t i = 0; i < n; i++)
        h[i] = -1000; /* what a receive not waited for leaves */
    for (int k = 0; k <= K; k++)
        in[k] = up(x, h, n);
    for (int k = 0; k < K; k++)
        rq[k] = tr_comm_start(x->w, TR_COMM_OP_RECV, NULL, in[k], n, t, peer, 7, TR_COMM_DEVICE);
    rq[K] = odd ? tr_comm_start(x->w, TR_COMM_OP_RECV, NULL, in[K], n, t, peer, 8, TR_COMM_DEVICE)
                : NULL;
    struct timespec late = {0, 300 * 1000 * 1000};
    if (odd) nanosleep(&late, NULL);
    for (int k = 0; k <= K; k++) {
        int tag = k < K ? 7 : 8;
        out[k] = NULL, sq[k] = NULL;
        if (tag == 8 && odd) continue;
        for (size_t i = 0; i < n; i++)
            g[i] = msg_val(x->rank, tag, k < K ? k : 0, i);
        out[k] = up(x, g, n);
        sq[k] = tr_comm_start(x->w, TR_COMM_OP_SEND, out[k], NULL, n, t, peer, tag, TR_COMM_DEVICE);
    }
    double waited = 0;
    for (int k = 0; k <= K; k++)
        if (rq[k]) waited += tr_comm_wait(rq[k]);
    if (!strcmp(tr_comm_device_transport(x->w), "nccl"))
        check(waited == 0.0,
              "rank %d: %s: waiting for a channel's receives does not block the "
              "host",
              x->rank, x->dt);
    for (int k = 0; k < K + odd; k++) {
        msg_id m = {peer, k < K ? 7 : 8, k < K ? k : 0};
        down(x, g, in[k], n);
        char what[64];
        snprintf(what, sizeof what, "channel %d->%d tag %d message %d", peer, x->rank, m.tag, m.k);
        expect(g, n, want_msg, x, &m, what, n);
    }
    /* the even rank's receives were in flight, and its compute stream waiting, for the odd
       rank's 0.3 s: the group's device time counts its channels' operations, once the
       watchdog has seen them complete (it polls: a second at most) */
    int timed = tr_comm_device_time(x->w, &span1, &exposed1);
    for (int tries = 0; timed && !odd && tries < 1000 && span1 - span0 <= 0.1; tries++) {
        struct timespec ms = {0, 1000 * 1000};
        nanosleep(&ms, NULL);
        tr_comm_device_time(x->w, &span1, &exposed1);
    }
    if (timed && !odd)
        check(span1 - span0 > 0.1 && exposed1 - exposed0 > 0.1,
              "rank %d: %s: the group's device time counts its channels (%.3f s in flight, "
              "%.3f s waited for)",
              x->rank, x->dt, span1 - span0, exposed1 - exposed0);
    for (int k = 0; k <= K; k++) {
        if (sq[k]) tr_comm_wait(sq[k]);
        x->be->free(in[k]);
        if (out[k]) x->be->free(out[k]);
    }
    free(h), free(g);
}

/* Receives one after another: rank 2k+1 sends K messages on tag 5 at once, and rank 2k,
 * once they are on their way, receives them one at a time, each started after the one before
 * was waited for. Staged, each receive lands in a pinned host buffer and its wait queues the
 * copy to the device; the next receive takes the same buffer back, so unless the wait also
 * waited for that copy (comm.staged_h2d), the next message overwrites what the copy is still
 * to read (the emulator names it). */
static void run_back_to_back(const ctx *x, tr_comm_dtype t) {
    enum { K = 3 };
    const size_t n = 1000;
    int peer = x->rank ^ 1, odd = x->rank & 1, one = 1;
    if (peer >= x->size) { /* the world's barrier below, without a peer */
        tr_comm_all_reduce(x->w, &one, 1, TR_COMM_I32);
        return;
    }
    float *h = malloc(n * sizeof(float));
    void *buf[K];
    tr_comm_req *sq[K] = {NULL};
    for (int k = 0; k < K; k++) {
        for (size_t i = 0; i < n; i++)
            h[i] = odd ? msg_val(x->rank, 5, k, i) : -1000;
        buf[k] = up(x, h, n);
        if (odd)
            sq[k] =
                tr_comm_start(x->w, TR_COMM_OP_SEND, buf[k], NULL, n, t, peer, 5, TR_COMM_DEVICE);
    }
    tr_comm_all_reduce(x->w, &one, 1, TR_COMM_I32); /* the sends are posted */
    for (int k = 0; k < K && !odd; k++)
        tr_comm_wait(
            tr_comm_start(x->w, TR_COMM_OP_RECV, NULL, buf[k], n, t, peer, 5, TR_COMM_DEVICE));
    for (int k = 0; k < K; k++) {
        if (sq[k]) tr_comm_wait(sq[k]);
        if (!odd) {
            msg_id m = {peer, 5, k};
            char what[64];
            down(x, h, buf[k], n);
            snprintf(what, sizeof what, "receive %d of %d one after another", k + 1, K);
            expect(h, n, want_msg, x, &m, what, n);
        }
        x->be->free(buf[k]);
    }
    free(h);
}

/* A device operation nobody waits for: the group owns it, and freeing the group completes
 * and frees it (before, its request stayed allocated for good: the sanitizers' leak check
 * of this test names it). The result is there once the group is gone. */
static void run_unwaited(const ctx *x) {
    const size_t n = 1000;
    char err[256];
    tr_comm *g = NULL;
    if (tr_comm_split(x->w, 0, x->rank, "dp", &g, err, sizeof err)) {
        check(0, "rank %d: split: %s", x->rank, err);
        return;
    }
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = val(x->rank, i);
    void *a = up(x, h, n);
    tr_comm_req *r = tr_comm_start(g, TR_COMM_OP_ALL_REDUCE, NULL, a, n, TR_COMM_F32, -1, 0,
                                   TR_COMM_DEVICE);
    check(r != NULL, "rank %d: an all_reduce started and never waited for", x->rank);
    tr_comm_free(g);
    down(x, h, a, n);
    expect(h, n, want_sum, x, NULL, "all_reduce completed by its group's free", n);
    x->be->free(a);
    free(h);
}

/* Rank 0 waits for a message on a channel that rank `stuck` never sends. */
static int stuck_recv(const ctx *x, int stuck, double timeout) {
    tr_comm_channel ch = {stuck, 0, 3};
    char err[256];
    if (tr_comm_open_channels(x->w, &ch, 1, TR_COMM_DEVICE, err, sizeof err)) {
        fprintf(stderr, "test_comm_device: %s\n", err);
        return 1;
    }
    float h[1024] = {0};
    void *a = up(x, h, 1024);
    if (x->rank == stuck) {
        sleep((unsigned)timeout + 30);
        return 0;
    }
    if (x->rank != 0) return 0;
    tr_comm_wait(
        tr_comm_start(x->w, TR_COMM_OP_RECV, NULL, a, 1024, TR_COMM_F32, stuck, 3, TR_COMM_DEVICE));
    down(x, h, a, 1024); /* blocks until the device has it: the watchdog ends it first */
    fprintf(stderr, "test_comm_device: rank %d: the receive returned though a peer is gone\n",
            x->rank);
    return 1;
}

/* A device all_reduce of 1024 floats that rank `stuck` never joins. */
static int stuck_rank(const ctx *x, int stuck, double timeout) {
    float h[1024] = {0};
    void *a = up(x, h, 1024);
    /* every rank sets up the group's transport first (itself a collective) */
    tr_comm_wait(tr_comm_start(x->w, TR_COMM_OP_ALL_REDUCE, NULL, a, 1, TR_COMM_F32, -1, 0,
                               TR_COMM_DEVICE));
    down(x, h, a, 1);
    if (x->rank == stuck) {
        sleep((unsigned)timeout + 30);
        return 0;
    }
    tr_comm_wait(tr_comm_start(x->w, TR_COMM_OP_ALL_REDUCE, NULL, a, 1024, TR_COMM_F32, -1, 0,
                               TR_COMM_DEVICE));
    down(x, h, a, 1024); /* blocks until the device has the sum: the watchdog ends it first */
    fprintf(stderr, "test_comm_device: rank %d: the all_reduce returned though a peer is gone\n",
            x->rank);
    return 1;
}

int main(int argc, char **argv) {
    char err[256];
    tr_comm *w;
    int stuck = -1, stuck_recv_rank = -1;
    double timeout = 60;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--stuck-rank")) stuck = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--stuck-recv-rank")) stuck_recv_rank = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--timeout")) timeout = atof(argv[i + 1]);
    }
    if (tr_comm_init(&w, &argc, &argv, timeout, err, sizeof err)) {
        printf("FAIL comm: %s\n", err);
        return 1;
    }
    const tr_backend *be32 = tr_backend_cuda(TR_DTYPE_F32, err, sizeof err);
    if (!be32) {
        printf("SKIP no CUDA device: %s\n", err);
        tr_comm_free(w);
        return 77;
    }
    if (tr_comm_device_init(tr_backend_cuda_stream(), err, sizeof err)) {
        printf("FAIL device comm: %s\n", err);
        return 1;
    }
    ctx x = {be32, w, tr_comm_rank(w), tr_comm_size(w), "f32"};
    if (stuck >= 0) return stuck_rank(&x, stuck, timeout);
    if (stuck_recv_rank >= 0) return stuck_recv(&x, stuck_recv_rank, timeout);
    open_channels(&x);
    run_ops(&x, TR_COMM_F32);
    run_channels(&x, TR_COMM_F32);
    run_back_to_back(&x, TR_COMM_F32);
    x.be = tr_backend_cuda(TR_DTYPE_BF16, err, sizeof err);
    x.dt = "bf16";
    open_channels(&x); /* again: the channels opened before are kept */
    run_ops(&x, TR_COMM_BF16);
    run_channels(&x, TR_COMM_BF16);
    x.be = be32;
    x.dt = "f32";
    run_unwaited(&x);
    const char *want = getenv("TR_COMM_DEVICE"), *got = tr_comm_device_transport(w);
    check(want ? !strcmp(got, want) || (x.size == 1 && !strcmp(want, "staged") &&
                                        !strcmp(got, "local"))
               : strcmp(got, "none") != 0,
          "rank %d of %d: transport %s (TR_COMM_DEVICE=%s)", x.rank, x.size, got,
          want ? want : "unset");
    int failed = n_fail;
    tr_comm_all_reduce(w, &failed, 1, TR_COMM_I32);
    printf("rank %d: %d ok, %d failed (%d on all ranks)\n", x.rank, n_ok, n_fail, failed);
    tr_comm_free(w);
    return failed ? 1 : 0;
}
