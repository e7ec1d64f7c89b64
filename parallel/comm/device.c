/* The device transport: comm.h's operations on device buffers (comm/private.h for how it
 * plugs into comm/mpi.c). Built with the CUDA backend (TR_HAVE_CUDA_COMM), linked against the
 * CUDA runtime and NCCL, or against the CUDA emulator and its NCCL over MPI in tests/.
 *
 * Each group gets, at its first device operation, a stream of its own and a transport agreed
 * by all its ranks:
 *  - NCCL: one communicator per group (its unique id broadcast over the group's MPI
 *    communicator), made at the group's first collective: a group that only sends and
 *    receives (the pipeline's) never makes it. An operation waits on an event recorded on the
 *    compute stream, runs on the group's stream, and records its completion event, on which
 *    tr_comm_wait makes the compute stream wait: the host never blocks, and the compute stream
 *    goes on with work that does not need the result (a gradient bucket reduces while the
 *    backward continues). Sends and receives run the same way on their channel's communicator
 *    of two ranks and stream (opened by tr_comm_open_channels), not the group's: NCCL matches
 *    them by posting order, not by tag, and runs a communicator's operations in order (whatever
 *    streams they are given), so on a shared one a receive posted ahead (the pipeline's) would
 *    hold back every message queued behind it, and take the data of another channel's message
 *    that came first. That rules out one communicator per pair of ranks too, and children of
 *    ncclCommSplit sharing their parent's resources (splitShare), which share its order. The
 *    channels of one tr_comm_open_channels are instead created together, by ncclCommInitRank
 *    in one NCCL group, which sets them up concurrently. Not by ncclCommSplit: a split is a
 *    collective of the whole group (a child without shared resources costs what a communicator
 *    of its own does), and NCCL runs the splits of one group call as concurrent jobs on the
 *    parent's one bootstrap ring (src/group.cc, src/init.cc: commGetSplitInfo), which it does
 *    not document as safe: one after another, 2 (P V - 1) of them for a pipeline of P x V.
 *  - staged: for ranks that share a GPU (NCCL refuses two ranks on one device), builds
 *    without NCCL, or TR_COMM_DEVICE=staged: the device buffer is copied to pinned host memory
 *    and the host operation runs over MPI; its wait copies the result back. The host waits for
 *    the copies (this transport is for tests and small machines, not speed).
 * A watchdog thread bounds every NCCL operation by the job's timeout, counted from when its
 * group's stream reached it (the host may enqueue it well before; a send or receive: from when
 * the compute stream reached its wait, as one posted ahead waits for the peer's compute until
 * then, and one never waited for is not timed): one still running at its
 * deadline (a rank stopped answering, a collective that does not match), or an asynchronous
 * NCCL error (ncclCommGetAsyncError), ends the job with the line host operations print. The
 * communicators are aborted (ncclCommAbort) only if MPI_Abort returns: an aborted one releases
 * this process's own waits, and training would go on with results that never came.
 * While operations are in flight it also answers the other ranks' census (this rank is
 * waiting on communication). */
#include "parallel/comm/comm.h"

#include <stdio.h>
#include <string.h>

#ifndef TR_HAVE_CUDA_COMM

int tr_comm_device_init(void *stream, char *err, size_t errlen) {
    (void)stream;
    snprintf(err, errlen, "this trainer was built without CUDA: no device communication");
    return -1;
}

int tr_comm_nccl_version(char *buf, size_t len) {
    if (len) buf[0] = 0;
    return -1;
}

#else

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#ifdef TR_HAVE_NCCL
#include <nccl.h>
#endif

#include "model/mutant.h"
#include "parallel/comm/private.h"

enum { T_LOCAL, T_STAGED, T_NCCL };
static const char *const transport_names[] = {"local", "staged", "nccl"};

/* An NCCL operation's timing events, kept until the device has passed them all: when it
 * started on the group's stream, when it completed, and when the compute stream reached the
 * point where it waits for it. */
typedef struct {
    cudaEvent_t start, done, need;
} timing;

/* One direction of point-to-point traffic on NCCL (comm.h): its own communicator of two ranks,
 * the sender rank 0, and a stream of its own, so that a receive posted ahead waits in its
 * channel only. */
typedef struct {
    int sender, receiver, tag; /* ranks of the group */
    cudaStream_t stream;
#ifdef TR_HAVE_NCCL
    ncclComm_t nc;
#endif
} channel;

typedef struct dgroup {
    tr_comm *c;
    int transport;
    cudaStream_t stream;
    channel **chans; /* NCCL: the channels opened, each allocated once (requests point at it) */
    int n_chans;
    timing *pend; /* timings not yet read */
    int n_pend, cap_pend;
    double span_s, exposed_s; /* read so far (tr_comm_device_time) */
#ifdef TR_HAVE_NCCL
    ncclComm_t nc;
#endif
    struct dgroup *next; /* every NCCL group, for the abort */
} dgroup;

typedef struct dreq {
    dgroup *g;
    channel *ch; /* NCCL send or receive: its channel, else NULL */
    tr_comm_desc o;
    cudaEvent_t done;  /* NCCL: complete on the device */
    cudaEvent_t start, need; /* NCCL: started on its stream; where the compute waits (set
                                holding d.mu: the watchdog reads it) */
    double deadline;         /* NCCL: the watchdog's, once its clock started (else 0) */
    int refs;          /* NCCL: the caller's and the watchdog's */
    struct dreq *next; /* the watchdog's list */
    /* staged */
    tr_comm_req *host;
    void *stage, *dst; /* pinned buffer; the device buffer the result goes to */
    size_t stage_bytes, dst_bytes, result_at;
} dreq;

static struct {
    cudaStream_t compute;
    int device;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t watchdog;
    int watchdog_on;
    dreq *inflight;   /* NCCL operations not yet seen complete by the watchdog */
    dgroup *groups;   /* NCCL groups */
    cudaEvent_t *free_ev; /* events for reuse */
    int n_free_ev, cap_free_ev;
    struct {
        void *p;
        size_t bytes;
    } stage[8]; /* pinned buffers for reuse */
    int n_stage;
} d = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* A CUDA or NCCL failure in a collective is not recoverable: the peers would wait on us. */
static void fail(const tr_comm *c, const tr_comm_desc *o, const char *what, const char *why) {
    char line[256];
    tr_comm_describe(line, sizeof line, c, o);
    fprintf(stderr, "trainer: rank %d: %s: %s failed: %s; aborting\n", tr_comm_world_rank(),
            line, what, why);
    fflush(stderr);
    abort();
}
#define CUDA_OR_FAIL(call, c, o)                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) fail(c, o, #call, cudaGetErrorString(e_));                          \
    } while (0)

static cudaEvent_t event_take(const tr_comm *c, const tr_comm_desc *o) {
    cudaEvent_t e = NULL;
    pthread_mutex_lock(&d.mu);
    if (d.n_free_ev > 0) e = d.free_ev[--d.n_free_ev];
    pthread_mutex_unlock(&d.mu);
    if (!e) CUDA_OR_FAIL(cudaEventCreate(&e), c, o); /* timed: tr_comm_device_time */
    return e;
}
static void event_give(cudaEvent_t e) { /* called holding d.mu */
    if (d.n_free_ev == d.cap_free_ev) {
        int cap = d.cap_free_ev ? 2 * d.cap_free_ev : 64;
        cudaEvent_t *p = realloc(d.free_ev, (size_t)cap * sizeof *p);
        if (!p) {
            cudaEventDestroy(e);
            return;
        }
        d.free_ev = p;
        d.cap_free_ev = cap;
    }
    d.free_ev[d.n_free_ev++] = e;
}

#ifdef TR_HAVE_NCCL /* NCCL operations only (the staged transport orders itself) */
/* Stream s waits for everything given to the compute stream so far. */
static void after_compute(dgroup *g, cudaStream_t s, const tr_comm_desc *o) {
    cudaEvent_t e = event_take(g->c, o);
    CUDA_OR_FAIL(cudaEventRecord(e, d.compute), g->c, o);
    TR_WAIT("comm.after_compute", CUDA_OR_FAIL(cudaStreamWaitEvent(s, e, 0), g->c, o));
    pthread_mutex_lock(&d.mu);
    event_give(e); /* reusable at once: a wait uses the event's state when it was enqueued */
    pthread_mutex_unlock(&d.mu);
}
#endif

static void read_timings(dgroup *g);

/* Both the caller and the watchdog are done with it: its timing waits to be read. */
static void unref(dreq *r) { /* called holding d.mu */
    if (--r->refs > 0) return;
    dgroup *g = r->g;
    if (r->done && r->need) {
        if (g->n_pend == g->cap_pend) {
            int cap = g->cap_pend ? 2 * g->cap_pend : 64;
            timing *p = realloc(g->pend, (size_t)cap * sizeof *p);
            if (p) g->pend = p, g->cap_pend = cap;
        }
        if (g->n_pend < g->cap_pend) {
            g->pend[g->n_pend++] = (timing){r->start, r->done, r->need};
            r->start = r->done = r->need = NULL;
        }
        if (g->n_pend > 1024) read_timings(g); /* nobody reads them: keep the list short */
    }
    if (r->start) event_give(r->start);
    if (r->done) event_give(r->done);
    if (r->need) event_give(r->need);
    free(r);
}

/* Seconds from a to b as the device timed them (negative when b came first). */
static double between(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    return cudaEventElapsedTime(&ms, a, b) == cudaSuccess ? 1e-3 * ms : 0.0;
}

/* Add the timings the device has passed to the group's totals: an operation's time in flight,
 * and of it what the compute stream waited (from reaching its wait to the completion). */
static void read_timings(dgroup *g) { /* called holding d.mu */
    int k = 0;
    for (int i = 0; i < g->n_pend; i++) {
        timing *t = &g->pend[i];
        if (cudaEventQuery(t->need) != cudaSuccess || cudaEventQuery(t->done) != cudaSuccess) {
            g->pend[k++] = *t;
            continue;
        }
        double span = between(t->start, t->done), exposed = between(t->need, t->done);
        g->span_s += span > 0 ? span : 0;
        g->exposed_s += exposed > 0 ? exposed : 0;
        event_give(t->start), event_give(t->done), event_give(t->need);
    }
    g->n_pend = k;
}

static void group_times(void *gv, double *span_s, double *exposed_s) {
    dgroup *g = gv;
    pthread_mutex_lock(&d.mu);
    read_timings(g);
    *span_s = g->span_s;
    *exposed_s = g->exposed_s;
    pthread_mutex_unlock(&d.mu);
}

/* ---- the watchdog ------------------------------------------------------------------------ */

#ifdef TR_HAVE_NCCL /* the watchdog bounds NCCL operations by the timeout */
static void abort_all(void) {
    for (dgroup *g = d.groups; g; g = g->next) {
        if (g->nc) ncclCommAbort(g->nc); /* NULL: no collective yet */
        for (int i = 0; i < g->n_chans; i++)
            ncclCommAbort(g->chans[i]->nc);
    }
}

static void *watchdog_main(void *arg) {
    (void)arg;
    cudaSetDevice(d.device); /* the calling thread's device, for the event queries */
    pthread_mutex_lock(&d.mu);
    for (;;) {
        while (!d.inflight) pthread_cond_wait(&d.cv, &d.mu);
        double now = tr_now();
        for (dreq **p = &d.inflight; *p;) {
            dreq *r = *p;
            cudaError_t q = cudaEventQuery(r->done);
            if (q == cudaSuccess) {
                *p = r->next;
                unref(r);
                continue;
            }
            if (q != cudaErrorNotReady) fail(r->g->c, &r->o, "cudaEventQuery", cudaGetErrorString(q));
#ifdef TR_HAVE_NCCL
            ncclResult_t ae = ncclSuccess;
            if (ncclCommGetAsyncError(r->ch ? r->ch->nc : r->g->nc, &ae) == ncclSuccess &&
                ae != ncclSuccess && ae != ncclInProgress)
                fail(r->g->c, &r->o, "NCCL", ncclGetErrorString(ae)); /* the launcher kills the rest */
#endif
            /* a collective's clock runs from when the group's stream reached it: the host may
               enqueue it long before the compute it follows is done, and that is not waiting.
               A send or receive's from when the compute stream reached its wait: one posted
               ahead waits for the peer's compute until then, and one never waited for is
               not timed */
            cudaEvent_t from = r->ch ? r->need : r->start;
            if (!r->deadline && from && cudaEventQuery(from) == cudaSuccess)
                r->deadline = now + tr_comm_timeout();
            if (r->deadline && now > r->deadline) tr_comm_die_timeout(r->g->c, &r->o, abort_all);
            p = &r->next;
        }
        int busy = d.inflight != NULL;
        pthread_mutex_unlock(&d.mu);
        if (busy) {
            tr_comm_serve_census();
            struct timespec ts = {0, 500000};
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&d.mu);
    }
    return NULL;
}

static void watch(dreq *r) {
    pthread_mutex_lock(&d.mu);
    if (!d.watchdog_on) {
        if (pthread_create(&d.watchdog, NULL, watchdog_main, NULL) == 0) {
            pthread_detach(d.watchdog);
            d.watchdog_on = 1;
        } else {
            fprintf(stderr, "trainer: rank %d: no watchdog thread: device operations are not "
                    "bounded by the timeout\n", tr_comm_world_rank());
            d.watchdog_on = -1;
        }
    }
    if (d.watchdog_on > 0) {
        r->refs++;
        r->next = d.inflight;
        d.inflight = r;
        pthread_cond_signal(&d.cv);
    }
    pthread_mutex_unlock(&d.mu);
}
#endif

/* ---- a group's transport ----------------------------------------------------------------- */

/* Do two ranks of c drive the same GPU? (Every rank's device UUID, gathered.) */
static int shares_a_gpu(tr_comm *c, const tr_comm_desc *o) {
    int p = tr_comm_size(c), shared = 0;
    struct cudaDeviceProp prop;
    CUDA_OR_FAIL(cudaGetDeviceProperties(&prop, d.device), c, o);
    unsigned char mine[16], *all = malloc((size_t)p * 16);
    memcpy(mine, prop.uuid.bytes, 16);
    if (!all || tr_comm_all_gather(c, mine, all, 16, TR_COMM_BYTE)) fail(c, o, "the GPU census",
                                                                        "out of memory");
    for (int i = 0; i < p && !shared; i++)
        for (int j = i + 1; j < p && !shared; j++)
            shared = !memcmp(all + 16 * i, all + 16 * j, 16);
    free(all);
    return shared;
}

/* The group's device state, made at its first device operation (every rank of the group
 * makes it at the same point of its sequence of operations on the group). */
static dgroup *group_of(tr_comm *c, const tr_comm_desc *o) {
    void **slot = tr_comm_device_slot(c);
    if (*slot) return *slot;
    dgroup *g = calloc(1, sizeof *g);
    if (!g) fail(c, o, "the device group", "out of memory");
    g->c = c;
    g->transport = T_LOCAL;
    int want = tr_comm_device_choice();
    /* TR_COMM_DEVICE=nccl: NCCL even in a group of one (tests on a machine with one GPU) */
    if (tr_comm_size(c) > 1 || want == 1) {
        int staged = tr_comm_size(c) > 1 && (shares_a_gpu(c, o) || want == 2);
#ifndef TR_HAVE_NCCL
        staged = 1;
#endif
        /* one answer for the group, whatever each rank's environment said */
        if (tr_comm_all_reduce(c, &staged, 1, TR_COMM_I32))
            fail(c, o, "agreeing on a transport", "the all_reduce failed");
        g->transport = staged ? T_STAGED : T_NCCL;
    }
    if (g->transport == T_NCCL) {
#ifdef TR_HAVE_NCCL
        CUDA_OR_FAIL(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking), c, o);
        pthread_mutex_lock(&d.mu);
        g->next = d.groups;
        d.groups = g;
        pthread_mutex_unlock(&d.mu);
#endif
    }
    *slot = g;
    return g;
}

#ifdef TR_HAVE_NCCL
/* The group's communicator, made at its first collective (every rank of the group starts its
 * collectives in the same order, so all reach this one together): its unique id broadcast
 * over the group's MPI communicator. For dp and tp that is their first device operation, as
 * before; the pipeline's group runs none. (A group that opened channels and later starts a
 * collective makes it then, maybe while a receive of its channels is in flight: NCCL's setup
 * must then not wait for the device, which the emulator cannot tell.) */
static ncclComm_t group_comm(dgroup *g, const tr_comm_desc *o) {
    if (g->nc) return g->nc;
    tr_comm *c = g->c;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t rc = tr_comm_rank(c) == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
    if (rc != ncclSuccess) fail(c, o, "ncclGetUniqueId", ncclGetErrorString(rc));
    if (tr_comm_broadcast(c, &id, sizeof id, TR_COMM_BYTE, 0))
        fail(c, o, "broadcasting the NCCL id", "the broadcast failed");
    ncclComm_t nc = NULL;
    rc = ncclCommInitRank(&nc, tr_comm_size(c), id, tr_comm_rank(c));
    if (rc != ncclSuccess) fail(c, o, "ncclCommInitRank", ncclGetErrorString(rc));
    pthread_mutex_lock(&d.mu); /* the watchdog's abort reads it */
    g->nc = nc;
    pthread_mutex_unlock(&d.mu);
    return nc;
}
#endif

static channel *channel_of(const dgroup *g, int sender, int receiver, int tag) {
    for (int i = 0; i < g->n_chans; i++) {
        channel *ch = g->chans[i];
        if (ch->sender == sender && ch->receiver == receiver && ch->tag == tag) return ch;
    }
    return NULL;
}

#ifdef TR_HAVE_NCCL
/* Is list[i] a channel of this rank that is neither open nor earlier in the list? (The same
 * answer on both its ends.) */
static int to_open(const dgroup *g, const tr_comm_channel *list, int i, int me) {
    const tr_comm_channel *l = &list[i];
    if ((l->sender != me && l->receiver != me) || channel_of(g, l->sender, l->receiver, l->tag))
        return 0;
    for (int j = 0; j < i; j++)
        if (list[j].sender == l->sender && list[j].receiver == l->receiver && list[j].tag == l->tag)
            return 0;
    return 1;
}

/* A channel (not yet in the group's list) on communicator id, as rank 0 when sending. */
static channel *channel_start(tr_comm *c, const tr_comm_channel *l, ncclUniqueId id, int me) {
    int sending = l->sender == me;
    tr_comm_desc o = {sending ? TR_COMM_OP_SEND : TR_COMM_OP_RECV, 0, TR_COMM_BYTE,
                      sending ? l->receiver : l->sender, l->tag};
    channel *ch = calloc(1, sizeof *ch);
    if (!ch) fail(c, &o, "opening its channel", "out of memory");
    ch->sender = l->sender;
    ch->receiver = l->receiver;
    ch->tag = l->tag;
    CUDA_OR_FAIL(cudaStreamCreateWithFlags(&ch->stream, cudaStreamNonBlocking), c, &o);
    ncclResult_t rc = ncclCommInitRank(&ch->nc, 2, id, sending ? 0 : 1);
    if (rc != ncclSuccess) fail(c, &o, "ncclCommInitRank of its channel", ncclGetErrorString(rc));
    return ch;
}
#endif

/* tr_comm_open_channels: the channels of the list that this rank is one end of and has not
 * opened are created together. Each sender makes the NCCL ids of its new channels, one
 * all_gather over the group's MPI communicator gives every rank all of them (row r: rank r's,
 * at the channels' places in the list, which every rank has the same), and one NCCL group
 * creates this rank's communicators, which NCCL sets up concurrently: in any order on each
 * rank, instead of a chain of blocking setups of pairs, one after another across the group. */
static void open_channels(tr_comm *c, const tr_comm_channel *list, int n) {
    tr_comm_desc o = {TR_COMM_OP_SEND, 0, TR_COMM_BYTE, -1, 0};
    dgroup *g = group_of(c, &o);
    if (g->transport != T_NCCL) return;
#ifdef TR_HAVE_NCCL
    int me = tr_comm_rank(c), p = tr_comm_size(c), n_new = 0;
    ncclUniqueId *mine = calloc((size_t)n, sizeof *mine), *all = calloc((size_t)n * p, sizeof *all);
    channel **made = calloc((size_t)n, sizeof *made);
    if (!mine || !all || !made) fail(c, &o, "opening its channels", "out of memory");
    for (int i = 0; i < n; i++) {
        ncclResult_t rc = list[i].sender == me && to_open(g, list, i, me)
                              ? ncclGetUniqueId(&mine[i])
                              : ncclSuccess;
        if (rc != ncclSuccess) fail(c, &o, "ncclGetUniqueId of a channel", ncclGetErrorString(rc));
    }
    if (tr_comm_all_gather(c, mine, all, (size_t)n * sizeof *mine, TR_COMM_BYTE))
        fail(c, &o, "exchanging its channels' NCCL ids", "the all_gather failed");
    ncclResult_t rc = ncclGroupStart();
    for (int i = 0; i < n && rc == ncclSuccess; i++)
        if (to_open(g, list, i, me))
            made[n_new++] = channel_start(c, &list[i], all[(size_t)list[i].sender * n + i], me);
    if (rc == ncclSuccess) rc = ncclGroupEnd();
    if (rc != ncclSuccess)
        fail(c, &o, "creating its channels' communicators (one NCCL group)",
             ncclGetErrorString(rc));
    pthread_mutex_lock(&d.mu); /* the watchdog's abort reads the list */
    channel **grown =
        n_new ? realloc(g->chans, (size_t)(g->n_chans + n_new) * sizeof *grown) : g->chans;
    if (n_new && !grown) fail(c, &o, "opening its channels", "out of memory");
    g->chans = grown;
    for (int i = 0; i < n_new; i++)
        g->chans[g->n_chans++] = made[i];
    pthread_mutex_unlock(&d.mu);
    free(mine), free(all), free(made);
#else
    (void)list, (void)n;
#endif
}

static const char *group_transport(const void *g) {
    return transport_names[((const dgroup *)g)->transport];
}

static void group_free(void *gv) {
    dgroup *g = gv;
    if (!g) return;
    int nccl = g->transport == T_NCCL;
    if (nccl) {
        TR_WAIT("comm.group_free", cudaStreamSynchronize(g->stream));
        for (int i = 0; i < g->n_chans; i++)
            TR_WAIT("comm.group_free", cudaStreamSynchronize(g->chans[i]->stream));
    }
    /* its operations are complete (the streams synchronized): whatever the watchdog has not
       yet seen of them goes now, with the timings nobody read, and the group leaves the
       abort's list, before the communicators and channels the watchdog reads go */
    pthread_mutex_lock(&d.mu);
    for (dgroup **p = &d.groups; *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            break;
        }
    for (dreq **p = &d.inflight; *p;) {
        dreq *r = *p;
        if (r->g != g) {
            p = &r->next;
            continue;
        }
        *p = r->next;
        unref(r);
    }
    for (int i = 0; i < g->n_pend; i++)
        event_give(g->pend[i].start), event_give(g->pend[i].done), event_give(g->pend[i].need);
    pthread_mutex_unlock(&d.mu);
    if (nccl) {
#ifdef TR_HAVE_NCCL
        if (g->nc) ncclCommDestroy(g->nc);
        for (int i = 0; i < g->n_chans; i++)
            ncclCommDestroy(g->chans[i]->nc);
#endif
        cudaStreamDestroy(g->stream);
        for (int i = 0; i < g->n_chans; i++) {
            cudaStreamDestroy(g->chans[i]->stream);
            free(g->chans[i]);
        }
    }
    free(g->chans);
    free(g->pend);
    free(g);
}

/* ---- operations -------------------------------------------------------------------------- */

/* Elements in and out of op o on p ranks. */
static size_t elems_in(const tr_comm_desc *o, int p) {
    return o->op == TR_COMM_OP_REDUCE_SCATTER ? (size_t)p * o->n
           : o->op == TR_COMM_OP_RECV         ? 0
                                              : o->n;
}
static size_t elems_out(const tr_comm_desc *o, int p) {
    return o->op == TR_COMM_OP_ALL_GATHER ? (size_t)p * o->n : o->op == TR_COMM_OP_SEND ? 0 : o->n;
}

#ifdef TR_HAVE_NCCL
static ncclDataType_t nccl_type(tr_comm_dtype t) {
    static const ncclDataType_t m[] = {ncclFloat32, ncclFloat64, ncclInt32,
                                       ncclInt64,   ncclUint8,   ncclBfloat16};
    return m[t];
}

/* A collective on the group's communicator and stream; a send or receive on its channel's,
 * where the peer is the channel's other rank (the sender is 0). */
static void start_nccl(dreq *r, const void *send, void *recv) {
    dgroup *g = r->g;
    const tr_comm_desc *o = &r->o;
    ncclDataType_t t = nccl_type(o->t);
    cudaStream_t s = r->ch ? r->ch->stream : g->stream;
    ncclComm_t nc = r->ch ? r->ch->nc : group_comm(g, o);
    after_compute(g, s, o); /* a receive too: its buffer may still be read before it */
    r->start = event_take(g->c, o);
    CUDA_OR_FAIL(cudaEventRecord(r->start, s), g->c, o);
    ncclResult_t rc = ncclSuccess;
    switch (o->op) {
    case TR_COMM_OP_ALL_REDUCE:
        rc = ncclAllReduce(recv, recv, o->n, t, ncclSum, nc, s);
        break;
    case TR_COMM_OP_REDUCE_SCATTER:
        rc = ncclReduceScatter(send, recv, o->n, t, ncclSum, nc, s);
        break;
    case TR_COMM_OP_ALL_GATHER:
        rc = ncclAllGather(send, recv, o->n, t, nc, s);
        break;
    case TR_COMM_OP_BROADCAST:
        rc = ncclBroadcast(recv, recv, o->n, t, o->peer, nc, s);
        break;
    case TR_COMM_OP_SEND:
        rc = ncclSend(send, o->n, t, 1, nc, s);
        break;
    case TR_COMM_OP_RECV:
        rc = ncclRecv(recv, o->n, t, 0, nc, s);
        break;
    }
    if (rc != ncclSuccess) fail(g->c, o, "the NCCL call", ncclGetErrorString(rc));
    r->done = event_take(g->c, o);
    CUDA_OR_FAIL(cudaEventRecord(r->done, s), g->c, o);
    watch(r);
}
#endif

/* A group of one: the result is the input, copied on the compute stream where it differs. */
static void start_local(dreq *r, const void *send, void *recv) {
    size_t bytes = r->o.n * tr_comm_dtype_bytes(r->o.t);
    if (r->o.op == TR_COMM_OP_SEND || r->o.op == TR_COMM_OP_RECV)
        fail(r->g->c, &r->o, "a device send or recv", "a group of one has no peer");
    if ((r->o.op == TR_COMM_OP_REDUCE_SCATTER || r->o.op == TR_COMM_OP_ALL_GATHER) && bytes &&
        send != recv)
        CUDA_OR_FAIL(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, d.compute),
                     r->g->c, &r->o);
}

/* Pinned buffers, kept for reuse (registering host memory costs milliseconds): the smallest
 * that fits, the one given back last among equals (warm in the caches; and the buffer whose
 * result copy to the device was queued last, so that a missing wait for that copy shows). */
static void *stage_take(size_t bytes, size_t *got, const tr_comm *c, const tr_comm_desc *o) {
    int best = -1;
    for (int i = d.n_stage - 1; i >= 0; i--)
        if (d.stage[i].bytes >= bytes && (best < 0 || d.stage[i].bytes < d.stage[best].bytes))
            best = i;
    if (best >= 0) {
        void *p = d.stage[best].p;
        *got = d.stage[best].bytes;
        memmove(&d.stage[best], &d.stage[best + 1],
                (size_t)(d.n_stage - best - 1) * sizeof d.stage[0]);
        d.n_stage--;
        return p;
    }
    void *p = NULL;
    CUDA_OR_FAIL(cudaMallocHost(&p, bytes ? bytes : 1), c, o);
    *got = bytes ? bytes : 1;
    return p;
}
static void stage_give(void *p, size_t bytes) {
    if (d.n_stage == (int)(sizeof d.stage / sizeof d.stage[0])) {
        int small = 0; /* keep the larger buffers */
        for (int i = 1; i < d.n_stage; i++)
            if (d.stage[i].bytes < d.stage[small].bytes) small = i;
        if (d.stage[small].bytes >= bytes) {
            cudaFreeHost(p);
            return;
        }
        cudaFreeHost(d.stage[small].p);
        d.stage[small] = d.stage[--d.n_stage];
    }
    d.stage[d.n_stage].p = p;
    d.stage[d.n_stage++].bytes = bytes;
}

static void start_staged(dreq *r, const void *send, void *recv) {
    tr_comm *c = r->g->c;
    const tr_comm_desc *o = &r->o;
    size_t es = tr_comm_dtype_bytes(o->t), in = elems_in(o, tr_comm_size(c)) * es,
           out = elems_out(o, tr_comm_size(c)) * es;
    int in_place = o->op == TR_COMM_OP_ALL_REDUCE || o->op == TR_COMM_OP_BROADCAST;
    size_t need = in_place ? in : in + out;
    char *h = stage_take(need, &r->stage_bytes, c, o);
    r->stage = h;
    const void *src = in_place ? recv : send;
    if (in) {
        CUDA_OR_FAIL(cudaMemcpyAsync(h, src, in, cudaMemcpyDeviceToHost, d.compute), c, o);
        TR_WAIT("comm.staged_d2h", CUDA_OR_FAIL(cudaStreamSynchronize(d.compute), c, o));
    }
    r->result_at = in_place ? 0 : in;
    r->dst = out ? recv : NULL;
    r->dst_bytes = out;
    r->host = tr_comm_start(c, o->op, h, h + r->result_at, o->n, o->t, o->peer, o->tag,
                            TR_COMM_HOST);
    if (!r->host) fail(c, o, "the staged operation", "MPI refused it");
}

static void *dev_start(tr_comm *c, const tr_comm_desc *o, const void *send, void *recv) {
    dgroup *g = group_of(c, o);
    dreq *r = calloc(1, sizeof *r);
    if (!r) fail(c, o, "a device operation", "out of memory");
    r->g = g;
    r->o = *o;
    r->refs = 1;
    if (g->transport == T_STAGED) {
        start_staged(r, send, recv); /* the host operation counts its bytes */
        return r;
    }
    /* on NCCL a send or receive goes through its channel (opened before: comm.h) */
    int sending = o->op == TR_COMM_OP_SEND, me = tr_comm_rank(c);
    if (g->transport == T_NCCL && (sending || o->op == TR_COMM_OP_RECV) &&
        !(r->ch = channel_of(g, sending ? me : o->peer, sending ? o->peer : me, o->tag)))
        fail(c, o, "a device send or recv over NCCL",
             "its channel was not opened (tr_comm_open_channels)");
    tr_comm_count_bytes(c, o);
    if (g->transport == T_LOCAL) start_local(r, send, recv);
#ifdef TR_HAVE_NCCL
    else if (g->transport == T_NCCL) start_nccl(r, send, recv);
#endif
    return r;
}

static int dev_test(void *rv) {
    dreq *r = rv;
    if (r->host) return tr_comm_test(r->host);
    if (!r->done) return 1;
    cudaError_t q = cudaEventQuery(r->done);
    if (q != cudaSuccess && q != cudaErrorNotReady)
        fail(r->g->c, &r->o, "cudaEventQuery", cudaGetErrorString(q));
    return q == cudaSuccess;
}

static double dev_wait(void *rv) {
    dreq *r = rv;
    double waited = 0;
    if (r->host) {
        waited = tr_comm_wait(r->host);
        if (r->dst) {
            CUDA_OR_FAIL(cudaMemcpyAsync(r->dst, (char *)r->stage + r->result_at, r->dst_bytes,
                                         cudaMemcpyHostToDevice, d.compute),
                         r->g->c, &r->o);
            TR_WAIT("comm.staged_h2d", CUDA_OR_FAIL(cudaStreamSynchronize(d.compute), r->g->c, &r->o)); /* then reusable */
        }
        stage_give(r->stage, r->stage_bytes);
        free(r);
        return waited;
    }
    cudaEvent_t need = NULL;
    if (r->done) {
        need = event_take(r->g->c, &r->o);
        CUDA_OR_FAIL(cudaEventRecord(need, d.compute), r->g->c, &r->o);
        TR_WAIT("comm.wait", CUDA_OR_FAIL(cudaStreamWaitEvent(d.compute, r->done, 0), r->g->c, &r->o));
    }
    pthread_mutex_lock(&d.mu);
    r->need = need;
    unref(r);
    pthread_mutex_unlock(&d.mu);
    return 0;
}

/* NCCL's version code is 10000 * major + 100 * minor + patch from 2.9, 1000 * major + 100 *
 * minor + patch before. */
int tr_comm_nccl_version(char *buf, size_t len) {
    if (len) buf[0] = 0;
#ifdef TR_HAVE_NCCL
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) return -1;
    int big = v >= 10000;
    snprintf(buf, len, "%d.%d.%d", big ? v / 10000 : v / 1000,
             big ? v % 10000 / 100 : v % 1000 / 100, v % 100);
    return 0;
#else
    return -1;
#endif
}

static const tr_comm_device_ops ops = {dev_start,       dev_test,    dev_wait,     group_free,
                                       group_transport, group_times, open_channels};

int tr_comm_device_init(void *stream, char *err, size_t errlen) {
    cudaError_t e = cudaGetDevice(&d.device);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "device communication: no current CUDA device: %s",
                 cudaGetErrorString(e));
        return -1;
    }
    d.compute = (cudaStream_t)stream;
    tr_comm_register_device(&ops);
    return 0;
}

#endif
