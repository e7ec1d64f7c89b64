/* parallel/comm/comm.h over MPI (host memory), and the world of one that every build has: a
 * process not started by mpirun/srun, or a build without MPI (TR_HAVE_MPI undefined), never
 * touches MPI and every collective is a copy. Every MPI wait is a poll of MPI_Test against a
 * deadline, so a dead or stuck peer ends the job with one line instead of a hang. */
#include "parallel/comm/comm.h"
#include "parallel/comm/base.h"
#include "parallel/comm/census.h"
#include "parallel/comm/cores.h"
#include "parallel/comm/env.h"
#include "parallel/comm/mpi_types.h"
#include "parallel/comm/private.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef TR_HAVE_MPI
#include <limits.h>
#include <mpi.h>
#endif

struct tr_comm {
    char name[8]; /* "world", "dp", "pp", "tp" */
    int rank, size;
    int is_world;
    double bytes_sent; /* tr_comm_bytes_sent */
    void *dev;         /* the device transport's state of this group (comm/private.h) */
    struct tr_comm_req *dev_reqs; /* its device operations not yet waited for: the group owns
                                     them, and completes and frees them when it goes */
#ifdef TR_HAVE_MPI
    MPI_Comm mc; /* MPI_COMM_NULL in the world of one */
#endif
};

/* What an operation is, for the one line printed when it fails or times out. */
typedef enum {
    OP_ALL_REDUCE,
    OP_REDUCE_SCATTER,
    OP_ALL_GATHER,
    OP_BROADCAST,
    OP_SEND,
    OP_RECV,
    OP_BARRIER,
    OP_SPLIT
} op_kind;
static const char *const op_names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                       "send",       "recv",           "barrier",    "mesh split"};

typedef struct {
    op_kind op;
    size_t n;
    tr_comm_dtype t;
    int peer; /* send/recv: the other rank; broadcast: the root; else -1 */
    int tag;
} op_info;

struct tr_comm_req {
    tr_comm *c;
    void *dev;      /* a device operation (the device transport's), else NULL */
    op_info o;
    int done;       /* complete (set by the agent under g_mu) */
    int registered; /* non-blocking: the progress agent polls it */
    double t_done;  /* when its completion was first seen (0: not yet) */
    struct tr_comm_req *prev, *next; /* a device one: its group's list (the caller's thread) */
#ifdef TR_HAVE_MPI
    MPI_Request rq;
#endif
};

/* A message sent to oneself in the world of one, waiting for its recv. */
typedef struct mail {
    struct mail *next;
    int tag;
    size_t bytes;
    unsigned char data[];
} mail;

static struct {
    int mpi;             /* MPI is initialized and the world is an MPI communicator */
    int we_initialized;  /* we called MPI_Init (so we call MPI_Finalize) */
    int finalized;       /* MPI_Finalize ran: MPI cannot start again */
    int world_rank;      /* for messages */
    double timeout;      /* seconds every wait is bounded by */
    double wait_seconds; /* tr_comm_wait_seconds */
    int local_rank, local_size; /* tr_comm_local_rank */
    mail *mailbox;       /* world of one: sent, not yet received */
    int progress;        /* TR_COMM_PROGRESS: 1, 0, or -1 auto (the default): agent_start */
    char progress_note[256]; /* tr_comm_progress_note */
    int device_choice;   /* TR_COMM_DEVICE: tr_comm_device_choice */
} g = {.timeout = 300.0, .local_size = 1, .progress = -1};

static const tr_comm_device_ops *g_dev; /* registered by tr_comm_device_init */

static const char *const dtype_names[] = {"float", "double", "int32", "int64", "byte", "bf16"};
size_t tr_comm_dtype_bytes(tr_comm_dtype t) {
    static const size_t bytes[] = {4, 8, 4, 8, 1, 2};
    return bytes[t];
}

/* "all_reduce of 1024 floats on group dp (size 2)" */
static void describe(char *buf, size_t len, const tr_comm *c, const op_info *o) {
    size_t k = 0;
    int w;
    if (o->op != OP_BARRIER && o->op != OP_SPLIT) {
        w = snprintf(buf, len, "%s of %zu %s%s", op_names[o->op], o->n, dtype_names[o->t],
                     o->n == 1 ? "" : "s");
    } else {
        w = snprintf(buf, len, "%s", op_names[o->op]);
    }
    k = w > 0 ? (size_t)w : 0;
    if (k < len && o->peer >= 0) {
        if (o->op == OP_SEND)
            w = snprintf(buf + k, len - k, " to rank %d (tag %d)", o->peer, o->tag);
        else if (o->op == OP_RECV)
            w = snprintf(buf + k, len - k, " from rank %d (tag %d)", o->peer, o->tag);
        else
            w = snprintf(buf + k, len - k, " from root %d", o->peer);
        k += w > 0 ? (size_t)w : 0;
    }
    if (k < len) snprintf(buf + k, len - k, " on group %s (size %d)", c->name, c->size);
}

/* A caller's mistake (bad root, bad dtype, ...): one line, and -1 or NULL to the caller. */
static int usage_error(const tr_comm *c, const op_info *o, const char *why) {
    char d[256];
    describe(d, sizeof d, c, o);
    fprintf(stderr, "trainer: rank %d: %s: %s\n", g.world_rank, d, why);
    return -1;
}

static int check_args(const tr_comm *c, const op_info *o) {
    if (!c) {
        fprintf(stderr, "trainer: rank %d: %s on a NULL group\n", g.world_rank, op_names[o->op]);
        return -1;
    }
    if ((unsigned)o->t > TR_COMM_BF16) return usage_error(c, o, "unknown dtype");
#ifdef TR_HAVE_MPI
    /* MPI counts are int; split larger buffers into several calls. */
    if (o->n > (size_t)INT_MAX) return usage_error(c, o, "more than 2^31-1 elements in one call");
#endif
    return 0;
}

static void account(double t0) {
    g.wait_seconds += tr_now() - t0;
}

/* ---- the world of one ----------------------------------------------------------------- */

static tr_comm *group_new(const char *name, int rank, int size) {
    tr_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    snprintf(c->name, sizeof c->name, "%s", name);
    c->rank = rank;
    c->size = size;
#ifdef TR_HAVE_MPI
    c->mc = MPI_COMM_NULL;
#endif
    return c;
}

static int single_send(const void *buf, size_t bytes, int tag) {
    mail *m = malloc(sizeof *m + bytes);
    if (!m) return -1;
    m->next = NULL;
    m->tag = tag;
    m->bytes = bytes;
    if (bytes && buf) memcpy(m->data, buf, bytes);
    mail **p = &g.mailbox;
    while (*p)
        p = &(*p)->next;
    *p = m; /* FIFO per tag, like MPI's non-overtaking rule */
    return 0;
}

static int single_recv(const tr_comm *c, const op_info *o, void *buf, size_t bytes) {
    for (mail **p = &g.mailbox; *p; p = &(*p)->next) {
        mail *m = *p;
        if (m->tag != o->tag) continue;
        if (m->bytes != bytes) return usage_error(c, o, "the matching send had a different size");
        if (bytes && buf) memcpy(buf, m->data, bytes);
        *p = m->next;
        free(m);
        return 0;
    }
    return usage_error(c, o, "no message was sent to this rank with this tag (world of one)");
}

/* ---- MPI ------------------------------------------------------------------------------ */

#ifdef TR_HAVE_MPI
/* Open MPI's non-blocking all-reduce (coll/libnbc, which MPI_Iallreduce reaches) picks a
 * binomial tree for an in-place buffer, or for fewer than 4 ranks, whatever its size: the
 * whole buffer goes to rank 0 and back, 2 log2(p) transfers of all of it. Its ring, which
 * libnbc also has, moves 2 (p - 1) / p of the buffer through each rank, both directions of
 * every link at once. Measured with 4 MiB between two hosts of the cluster in a box at
 * 100 Mbit/s (tests/cluster/cluster.sh; a one-off program): 0.62 s binomial, 0.37 s ring; 4 ranks
 * on the two hosts, 0.89 s and 0.59 s (the ring's results equal, in place and for counts below the
 * rank count too). So ask for the ring, as the planner prices it (plan_cost.c), unless the
 * user chose an algorithm: MCA parameters are read from the environment by MPI_Init. */
static void ring_all_reduce(void) {
#ifdef OPEN_MPI
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
#endif
}

/* ---- the progress agent ------------------------------------------------------------------
 * Open MPI advances a non-blocking collective only inside MPI calls of the ranks taking part:
 * one started before a product would move only once every rank waits for it, after the
 * product, and a rank that finishes first waits for the slowest one's compute as well. A
 * thread of each process polls the operations in flight every PROGRESS_NS while the training
 * thread computes, so that they complete behind the compute. MPI calls are serialized by g_mu
 * (MPI_THREAD_SERIALIZED): every MPI call below is made holding it, except on the paths that
 * abort the job. It runs where it has a core of its own (comm/cores.h: the node's ranks'
 * threads leave one idle); elsewhere its wake-ups and its turns at g_mu take the compute's
 * cores and delay the very collectives it polls: on 2 cores, tp 4 over 4 ranks of
 * bench/pp_gpt.lua at micro-batch 1 took 0.66 s a step with it and 0.34 s without, and no
 * layout measured was faster with it (README: "The progress agent"). TR_COMM_PROGRESS=1 or 0
 * decides instead. */
#define PROGRESS_NS 20000
#define MAX_INFLIGHT 256
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static pthread_t g_agent;
static int g_agent_on, g_agent_quit;
static tr_comm_req *g_inflight[MAX_INFLIGHT]; /* polled by the agent */
static int g_n_inflight;

static void lock(void) {
    pthread_mutex_lock(&g_mu);
}
static void unlock(void) {
    pthread_mutex_unlock(&g_mu);
}

static void *agent_main(void *arg) {
    (void)arg;
    lock();
    while (!g_agent_quit) {
        if (!g_n_inflight) {
            pthread_cond_wait(&g_cv, &g_mu);
            continue;
        }
        for (int k = 0; k < g_n_inflight;) {
            tr_comm_req *r = g_inflight[k];
            int flag = 0;
            /* an error is left for the waiting thread, whose own test reports it */
            if (MPI_Test(&r->rq, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
                r->done = 1;
                r->t_done = tr_now();
                g_inflight[k] = g_inflight[--g_n_inflight];
            } else {
                k++;
            }
        }
        unlock();
        struct timespec ts = {0, PROGRESS_NS};
        nanosleep(&ts, NULL);
        lock();
    }
    unlock();
    return NULL;
}

/* A non-blocking operation just started (holding g_mu): the agent polls it until it completes
 * or is waited for. */
static void agent_add(tr_comm_req *r) {
    if (!g_agent_on || g_n_inflight == MAX_INFLIGHT) return; /* then tests and waits move it */
    g_inflight[g_n_inflight++] = r;
    pthread_cond_signal(&g_cv);
}

static void agent_remove(tr_comm_req *r) {
    for (int k = 0; k < g_n_inflight; k++)
        if (g_inflight[k] == r) {
            g_inflight[k] = g_inflight[--g_n_inflight];
            return;
        }
}

static void agent_start(int provided) {
    char why[96];
    tr_node_cores nc = tr_node_cores_here(g.local_size);
    int spare = tr_spare_core(&nc, why, sizeof why);
    int on = g.progress < 0 ? spare : g.progress;
    const char *lost = ""; /* why an agent the rule or the setting wants does not run */
    if (on && provided < MPI_THREAD_SERIALIZED) on = 0, lost = "; MPI grants no thread for it";
    if (on) {
        g_agent_quit = 0;
        g_agent_on = pthread_create(&g_agent, NULL, agent_main, NULL) == 0;
        if (!g_agent_on) on = 0, lost = "; its thread did not start";
    }
    snprintf(g.progress_note, sizeof g.progress_note, "progress agent %s (%s: %s%s%s)",
             on ? "on" : "off", why, spare ? "a core to spare" : "no core to spare",
             g.progress >= 0 ? "; TR_COMM_PROGRESS set" : "", lost);
}

static void agent_stop(void) {
    if (!g_agent_on) return;
    lock();
    g_agent_quit = 1;
    pthread_cond_signal(&g_cv);
    unlock();
    pthread_join(g_agent, NULL);
    g_agent_on = 0;
    g_n_inflight = 0;
}

/* An MPI call failed: the group is unusable and peers would wait for us, so end the job. */
static void die_mpi(const tr_comm *c, const op_info *o, int rc) {
    char d[256], e[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, e, &len) != MPI_SUCCESS) snprintf(e, sizeof e, "MPI error %d", rc);
    describe(d, sizeof d, c, o);
    fprintf(stderr, "trainer: rank %d: %s failed: %s; aborting\n", g.world_rank, d, e);
    fflush(stderr);
    char line[MPI_MAX_ERROR_STRING + 300];
    snprintf(line, sizeof line, "%s failed: %s", d, e);
    tr_census_tell_abort(-1, line);
    MPI_Abort(MPI_COMM_WORLD, 1);
    abort(); /* not reached */
}

/* A wait past the deadline: the census of who is waiting (parallel/comm/census.c), one line,
 * and the end of the job. */
static void die_timeout(const tr_comm *c, const op_info *o) {
    char d[256];
    describe(d, sizeof d, c, o);
    lock(); /* kept: the job ends below */
    tr_census_die(d, NULL);
}

/* Spin on MPI_Test for a while (Open MPI progresses non-blocking operations only inside MPI
 * calls, so polling fast keeps large collectives moving), then back off with short sleeps so
 * that a long wait for a slow or stuck peer does not burn a core; give up at the deadline. */
enum { SPIN_US = 20000, SLEEP_MIN_NS = 20000, SLEEP_MAX_NS = 500000 };

static void wait_mpi(const tr_comm *c, const op_info *o, MPI_Request *rq, MPI_Status *st) {
    double t0 = tr_now(), deadline = t0 + g.timeout;
    long sleep_ns = SLEEP_MIN_NS;
    for (;;) {
        int flag = 0;
        lock(); /* the agent may have completed it meanwhile: a null request tests complete */
        int rc = MPI_Test(rq, &flag, st ? st : MPI_STATUS_IGNORE);
        unlock();
        if (rc != MPI_SUCCESS) die_mpi(c, o, rc);
        if (flag) return;
        double t = tr_now();
        if (t > deadline) die_timeout(c, o);
        if (t - t0 < SPIN_US * 1e-6) {
            sched_yield(); /* lets an oversubscribed peer run */
            continue;
        }
        lock();
        tr_census_serve(); /* a long wait: another rank may be asking who waits (not while
                              spinning) */
        unlock();
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        sleep_ns = sleep_ns * 2 > SLEEP_MAX_NS ? SLEEP_MAX_NS : sleep_ns * 2;
    }
}

#endif

/* Started by mpirun (Open MPI), mpiexec.hydra (MPICH: PMI_*) or srun (PMI/PMIx)? */
static const char *launcher_var(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return vars[i];
    return NULL;
}

/* What a bandwidth-optimal algorithm makes this rank send for o (tr_comm_bytes_sent). */
static double ring_bytes(const tr_comm *c, const op_info *o) {
    double p = c->size, b = (double)o->n * (double)tr_comm_dtype_bytes(o->t);
    if (c->size <= 1) return 0;
    switch (o->op) {
    case OP_ALL_REDUCE:
        return 2 * (p - 1) / p * b;
    case OP_REDUCE_SCATTER: /* n elements out of p * n in */
    case OP_ALL_GATHER:     /* n elements in, p * n out */
        return (p - 1) * b;
    case OP_BROADCAST:
        return c->rank == o->peer ? b : 0;
    case OP_SEND:
        return b;
    default:
        return 0;
    }
}

/* Start op; on return either r->done (world of one) or r->rq is in flight. 0 or -1. */
static int start(tr_comm_req *r, void *buf, const void *send, void *recv) {
    tr_comm *c = r->c;
    const op_info *o = &r->o;
    size_t esz = tr_comm_dtype_bytes(o->t);
    if (check_args(c, o)) return -1;
    c->bytes_sent += ring_bytes(c, o);
    if (o->op == OP_BROADCAST && (o->peer < 0 || o->peer >= c->size))
        return usage_error(c, o, "bad root");
    if ((o->op == OP_SEND || o->op == OP_RECV) && (o->peer < 0 || o->peer >= c->size || o->tag < 0))
        return usage_error(c, o, "bad peer rank or negative tag");
    if (o->op == OP_REDUCE_SCATTER && o->n) {
        const char *s = send, *d = recv;
        size_t sb = (size_t)c->size * o->n * esz, rb = o->n * esz;
        if (s < d + rb && d < s + sb) return usage_error(c, o, "send and recv overlap");
    }
#ifdef TR_HAVE_MPI
    if (c->mc != MPI_COMM_NULL) {
        MPI_Datatype dt = comm_mpi_type(o->t);
        int n = (int)o->n, rc = MPI_SUCCESS;
        const char *in_place = (const char *)recv + (size_t)c->rank * o->n * esz;
        lock();
        switch (o->op) {
        case OP_ALL_REDUCE:
            rc = MPI_Iallreduce(MPI_IN_PLACE, buf, n, dt, comm_mpi_sum(o->t), c->mc, &r->rq);
            break;
        case OP_REDUCE_SCATTER:
            rc = MPI_Ireduce_scatter_block(send, recv, n, dt, comm_mpi_sum(o->t), c->mc, &r->rq);
            break;
        case OP_ALL_GATHER:
            rc = MPI_Iallgather(o->n && send == in_place ? MPI_IN_PLACE : send, n, dt, recv, n, dt,
                                c->mc, &r->rq);
            break;
        case OP_BROADCAST:
            rc = MPI_Ibcast(buf, n, dt, o->peer, c->mc, &r->rq);
            break;
        case OP_SEND:
            rc = MPI_Isend(send, n, dt, o->peer, o->tag, c->mc, &r->rq);
            break;
        case OP_RECV:
            rc = MPI_Irecv(buf, n, dt, o->peer, o->tag, c->mc, &r->rq);
            break;
        case OP_BARRIER:
        case OP_SPLIT:
            rc = MPI_Ibarrier(c->mc, &r->rq);
            break;
        }
        if (rc != MPI_SUCCESS) die_mpi(c, o, rc);
        if (r->registered) agent_add(r);
        unlock();
        return 0;
    }
#endif
    /* The world of one: rank 0 of 1. */
    size_t bytes = o->n * esz;
    if (o->op == OP_REDUCE_SCATTER || o->op == OP_ALL_GATHER) {
        if (bytes && send && recv && send != recv) memmove(recv, send, bytes);
    } else if (o->op == OP_SEND) {
        if (single_send(send, bytes, o->tag)) return usage_error(c, o, "out of memory");
    } else if (o->op == OP_RECV) {
        if (single_recv(c, o, buf, bytes)) return -1;
    }
    r->done = 1;
    return 0;
}

/* Blocking: start, then wait against the deadline. */
static int run_blocking(tr_comm *c, op_info o, void *buf, const void *send, void *recv) {
    double t0 = tr_now();
    tr_comm_req r = {.c = c, .o = o};
    int rc = start(&r, buf, send, recv);
#ifdef TR_HAVE_MPI
    if (rc == 0 && !r.done) {
        MPI_Status st;
        wait_mpi(c, &r.o, &r.rq, &st);
        if (o.op == OP_RECV) {
            int got = 0;
            lock();
            MPI_Get_count(&st, comm_mpi_type(o.t), &got);
            unlock();
            if ((size_t)got != o.n) {
                char why[96];
                snprintf(why, sizeof why, "the matching send had %d elements", got);
                rc = usage_error(c, &r.o, why);
            }
        }
    }
#endif
    account(t0);
    return rc;
}

static tr_comm_req *run_nonblocking(tr_comm *c, op_info o, void *buf, const void *send,
                                    void *recv) {
    tr_comm_req *r = calloc(1, sizeof *r);
    if (!r) {
        if (c) usage_error(c, &o, "out of memory");
        return NULL;
    }
    r->c = c;
    r->o = o;
    /* the agent moves collectives and sends; not receives: a pipeline always has one posted
       ahead, and polling it every PROGRESS_NS would take a core's share from the compute for
       as long (a send completes once its receiver is there, which it is, posted ahead) */
    r->registered = o.op != OP_RECV;
    if (start(r, buf, send, recv)) {
        free(r);
        return NULL;
    }
    return r;
}

/* ---- public --------------------------------------------------------------------------- */

int tr_comm_init(tr_comm **world, int *argc, char ***argv, double timeout_s, char *err,
                 size_t errlen) {
    *world = NULL;
    if (g.mpi) {
        tr_errf(err, errlen, "tr_comm_init: already initialized");
        return -1;
    }
    /* TR_COMM_DEVICE is used by the device transport (comm/device.c) only where it is
       built: checked here, on every build, so that a mistyped value is never ignored */
    static const char *const devices[] = {"nccl", "staged", NULL};
    static const char *const progress[] = {"0", "1", "auto", NULL};
    int dev = -1, prog = 2;
    if (tr_env_word("TR_COMM_DEVICE", devices, &dev, err, errlen) < 0 ||
        tr_env_word("TR_COMM_PROGRESS", progress, &prog, err, errlen) < 0)
        return -1;
    g.progress = prog == 2 ? -1 : prog;
    g.progress_note[0] = 0;
    g.device_choice = dev + 1;
    g.timeout = timeout_s > 0 ? timeout_s : 300.0;
    g.wait_seconds = 0;
    g.world_rank = 0;
    const char *var = launcher_var();
    tr_comm *w = NULL;
    if (!var) {
        w = group_new("world", 0, 1);
    } else {
#ifdef TR_HAVE_MPI
        if (g.finalized) {
            tr_errf(err, errlen, "tr_comm_init: MPI was finalized and cannot start again");
            return -1;
        }
        int inited = 0, provided = 0, rc;
        MPI_Initialized(&inited);
        if (!inited) {
            ring_all_reduce();
            /* comm/mpi.c calls MPI holding g_mu (its progress agent is a second thread); the
             * device transport's watchdog, and NCCL emulated over MPI in tests, call it from
             * other threads too: ask for MPI_THREAD_MULTIPLE. */
            rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
            if (rc != MPI_SUCCESS) {
                tr_errf(err, errlen, "MPI_Init failed (error %d; started with %s set)", rc, var);
                return -1;
            }
            g.we_initialized = 1;
        }
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        comm_mpi_sums_create();
        MPI_Comm node = MPI_COMM_NULL; /* the ranks on this host */
        if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) ==
            MPI_SUCCESS) {
            MPI_Comm_rank(node, &g.local_rank);
            MPI_Comm_size(node, &g.local_size);
            MPI_Comm_free(&node);
        }
        w = group_new("world", 0, 1);
        if (!w || MPI_Comm_dup(MPI_COMM_WORLD, &w->mc) != MPI_SUCCESS) {
            tr_errf(err, errlen, "tr_comm_init: cannot create the world communicator");
            free(w);
            return -1;
        }
        MPI_Comm_set_errhandler(w->mc, MPI_ERRORS_RETURN);
        tr_census_open(MPI_COMM_WORLD);
        MPI_Comm_rank(w->mc, &w->rank);
        MPI_Comm_size(w->mc, &w->size);
        g.mpi = 1;
        g.world_rank = w->rank;
        MPI_Query_thread(&provided);
        if (w->size > 1) agent_start(provided);
#else
        (void)argc, (void)argv;
        const char *v = getenv(var);
        if (!(v && !strcmp(var, "OMPI_COMM_WORLD_SIZE") && atoi(v) == 1) &&
            !(v && !strcmp(var, "PMI_SIZE") && atoi(v) == 1)) {
            tr_errf(err, errlen,
                    "started by a parallel launcher (%s=%s) but this trainer was built "
                    "without MPI; install libopenmpi-dev and rebuild, or run it without mpirun",
                    var, v ? v : "");
            return -1;
        }
        w = group_new("world", 0, 1);
#endif
    }
    if (!w) {
        tr_errf(err, errlen, "tr_comm_init: out of memory");
        return -1;
    }
    w->is_world = 1;
    *world = w;
    return 0;
}

void tr_comm_free(tr_comm *c) {
    if (!c) return;
    while (c->dev_reqs) /* started and never waited for: completed (stream-ordered), freed */
        tr_comm_wait(c->dev_reqs);
    if (c->dev && g_dev) g_dev->group_free(c->dev);
    c->dev = NULL;
#ifdef TR_HAVE_MPI
    if (c->mc != MPI_COMM_NULL && g.mpi) {
        if (c->is_world) {
            /* MPI_Finalize waits for every rank without a deadline: meet first, bounded. */
            tr_comm_barrier(c);
            agent_stop();
            tr_census_close();
            MPI_Comm_free(&c->mc);
            comm_mpi_sums_free();
            if (g.we_initialized) MPI_Finalize();
            g.mpi = 0;
            g.finalized = 1;
            g.we_initialized = 0;
        } else {
            lock();
            MPI_Comm_free(&c->mc);
            unlock();
        }
    }
#endif
    if (c->is_world) {
        while (g.mailbox) {
            mail *m = g.mailbox;
            g.mailbox = m->next;
            free(m);
        }
    }
    free(c);
}

int tr_comm_rank(const tr_comm *c) {
    return c->rank;
}
int tr_comm_size(const tr_comm *c) {
    return c->size;
}
const char *tr_comm_name(const tr_comm *c) {
    return c->name;
}
const char *tr_comm_transport(void) {
    return g.mpi ? "mpi" : "single";
}

void tr_comm_library_version(char *buf, size_t len) {
    if (!len) return;
#ifdef TR_HAVE_MPI
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0;
    if (MPI_Get_library_version(v, &n) != MPI_SUCCESS) n = 0;
    v[n < (int)sizeof(v) ? n : (int)sizeof(v) - 1] = 0;
    v[strcspn(v, "\r\n")] = 0; /* the first line */
    snprintf(buf, len, "%s", v[0] ? v : "MPI (no version)");
#else
    snprintf(buf, len, "none");
#endif
}

int tr_comm_local_rank(int *local_size) {
    if (local_size) *local_size = g.local_size;
    return g.local_rank;
}

int tr_comm_mesh(tr_comm *world, tr_mesh m, tr_comm **dp, tr_comm **pp, tr_comm **tp, char *err,
                 size_t errlen) {
    *dp = *pp = *tp = NULL;
    if (m.dp < 1 || m.pp < 1 || m.tp < 1 || (long)m.dp * m.pp * m.tp != world->size) {
        tr_errf(err, errlen,
                "mesh dp=%d x pp=%d x tp=%d needs %ld ranks but the world has %d (mpirun -np)",
                m.dp, m.pp, m.tp, (long)m.dp * m.pp * m.tp, world->size);
        return -1;
    }
    /* world rank = (d * pp + p) * tp + t */
    int r = world->rank;
    int t = r % m.tp, p = (r / m.tp) % m.pp, d = r / (m.tp * m.pp);
    tr_comm *g3[3] = {group_new("dp", d, m.dp), group_new("pp", p, m.pp), group_new("tp", t, m.tp)};
    if (!g3[0] || !g3[1] || !g3[2]) {
        for (int i = 0; i < 3; i++)
            free(g3[i]);
        tr_errf(err, errlen, "tr_comm_mesh: out of memory");
        return -1;
    }
#ifdef TR_HAVE_MPI
    if (world->mc != MPI_COMM_NULL) {
        /* MPI_Comm_split has no deadline: a bounded barrier first catches a missing rank. */
        tr_comm_barrier(world);
        /* Ranks in one group share the other two coordinates; the key orders them by theirs. */
        int color[3] = {p * m.tp + t, d * m.tp + t, d * m.pp + p}, key[3] = {d, p, t};
        for (int i = 0; i < 3; i++) {
            op_info o = {.op = OP_SPLIT, .peer = -1};
            lock();
            int rc = MPI_Comm_split(world->mc, color[i], key[i], &g3[i]->mc);
            if (rc != MPI_SUCCESS) die_mpi(world, &o, rc);
            MPI_Comm_set_errhandler(g3[i]->mc, MPI_ERRORS_RETURN);
            int gr = -1, gs = -1;
            MPI_Comm_rank(g3[i]->mc, &gr);
            MPI_Comm_size(g3[i]->mc, &gs);
            unlock();
            if (gr != g3[i]->rank || gs != g3[i]->size) { /* an invariant of the split */
                fprintf(stderr,
                        "trainer: rank %d: mesh group %s is rank %d of %d, expected "
                        "%d of %d\n",
                        g.world_rank, g3[i]->name, gr, gs, g3[i]->rank, g3[i]->size);
                abort();
            }
        }
    }
#endif
    *dp = g3[0];
    *pp = g3[1];
    *tp = g3[2];
    return 0;
}

int tr_comm_split(tr_comm *c, int color, int key, const char *name, tr_comm **out, char *err,
                  size_t errlen) {
    *out = NULL;
    if (color < 0) {
        tr_errf(err, errlen, "tr_comm_split: color %d must not be negative", color);
        return -1;
    }
    /* the world of one (or a group of one): the only rank is its own subgroup */
    int rank = 0, size = 1;
#ifdef TR_HAVE_MPI
    MPI_Comm mc = MPI_COMM_NULL;
    if (c->mc != MPI_COMM_NULL) {
        /* MPI_Comm_split has no deadline: a bounded barrier first catches a missing rank */
        tr_comm_barrier(c);
        op_info o = {.op = OP_SPLIT, .peer = -1};
        lock();
        int rc = MPI_Comm_split(c->mc, color, key, &mc);
        if (rc != MPI_SUCCESS) die_mpi(c, &o, rc);
        MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
        MPI_Comm_rank(mc, &rank);
        MPI_Comm_size(mc, &size);
        unlock();
    }
#endif
    tr_comm *g2 = group_new(name, rank, size);
    if (!g2) {
#ifdef TR_HAVE_MPI
        lock();
        if (mc != MPI_COMM_NULL) MPI_Comm_free(&mc);
        unlock();
#endif
        tr_errf(err, errlen, "tr_comm_split: out of memory");
        return -1;
    }
#ifdef TR_HAVE_MPI
    g2->mc = mc;
#endif
    *out = g2;
    return 0;
}

double tr_comm_bytes_sent(const tr_comm *c) {
    return c ? c->bytes_sent : 0.0;
}

int tr_comm_all_reduce(tr_comm *c, void *buf, size_t n, tr_comm_dtype t) {
    return run_blocking(c, (op_info){OP_ALL_REDUCE, n, t, -1, 0}, buf, NULL, NULL);
}
int tr_comm_reduce_scatter(tr_comm *c, const void *send, void *recv, size_t n, tr_comm_dtype t) {
    return run_blocking(c, (op_info){OP_REDUCE_SCATTER, n, t, -1, 0}, NULL, send, recv);
}
int tr_comm_all_gather(tr_comm *c, const void *send, void *recv, size_t n, tr_comm_dtype t) {
    return run_blocking(c, (op_info){OP_ALL_GATHER, n, t, -1, 0}, NULL, send, recv);
}
int tr_comm_broadcast(tr_comm *c, void *buf, size_t n, tr_comm_dtype t, int root) {
    return run_blocking(c, (op_info){OP_BROADCAST, n, t, root, 0}, buf, NULL, NULL);
}
int tr_comm_send(tr_comm *c, const void *buf, size_t n, tr_comm_dtype t, int peer, int tag) {
    return run_blocking(c, (op_info){OP_SEND, n, t, peer, tag}, NULL, buf, NULL);
}
int tr_comm_recv(tr_comm *c, void *buf, size_t n, tr_comm_dtype t, int peer, int tag) {
    return run_blocking(c, (op_info){OP_RECV, n, t, peer, tag}, buf, NULL, NULL);
}
int tr_comm_barrier(tr_comm *c) {
    return run_blocking(c, (op_info){OP_BARRIER, 0, TR_COMM_BYTE, -1, 0}, NULL, NULL, NULL);
}

tr_comm_req *tr_comm_iall_reduce(tr_comm *c, void *buf, size_t n, tr_comm_dtype t) {
    return run_nonblocking(c, (op_info){OP_ALL_REDUCE, n, t, -1, 0}, buf, NULL, NULL);
}
tr_comm_req *tr_comm_ireduce_scatter(tr_comm *c, const void *send, void *recv, size_t n,
                                     tr_comm_dtype t) {
    return run_nonblocking(c, (op_info){OP_REDUCE_SCATTER, n, t, -1, 0}, NULL, send, recv);
}
tr_comm_req *tr_comm_iall_gather(tr_comm *c, const void *send, void *recv, size_t n,
                                 tr_comm_dtype t) {
    return run_nonblocking(c, (op_info){OP_ALL_GATHER, n, t, -1, 0}, NULL, send, recv);
}

tr_comm_req *tr_comm_isend(tr_comm *c, const void *buf, size_t n, tr_comm_dtype t, int peer,
                           int tag) {
    return run_nonblocking(c, (op_info){OP_SEND, n, t, peer, tag}, NULL, buf, NULL);
}
tr_comm_req *tr_comm_irecv(tr_comm *c, void *buf, size_t n, tr_comm_dtype t, int peer, int tag) {
    return run_nonblocking(c, (op_info){OP_RECV, n, t, peer, tag}, buf, NULL, NULL);
}

int tr_comm_test(tr_comm_req *r) {
    if (!r) return 1;
    if (r->dev) return g_dev->test(r->dev);
    int done = 0;
#ifdef TR_HAVE_MPI
    lock();
    done = r->done;
    if (!done) {
        int rc = MPI_Test(&r->rq, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) die_mpi(r->c, &r->o, rc);
        r->done = done;
        if (done) r->t_done = tr_now();
    }
    unlock();
#else
    done = r->done;
#endif
    return done;
}

double tr_comm_wait(tr_comm_req *r) {
    double done_at;
    return tr_comm_wait_done(r, &done_at);
}

const char *tr_comm_progress_note(void) {
    return g.progress_note;
}

int tr_comm_progress_agent(void) {
#ifdef TR_HAVE_MPI
    return g_agent_on;
#else
    return 0;
#endif
}

double tr_comm_wait_done(tr_comm_req *r, double *done_at) {
    double t0 = tr_now(), seen = 0;
    *done_at = t0;
    if (!r) return 0.0;
    if (r->dev) { /* stream-ordered: the host does not wait (but on the staged transport) */
        double w = g_dev->wait(r->dev);
        if (r->prev) r->prev->next = r->next;
        else r->c->dev_reqs = r->next;
        if (r->next) r->next->prev = r->prev;
        free(r);
        *done_at = tr_now();
        return w;
    }
#ifdef TR_HAVE_MPI
    lock();
    int done = r->done;
    unlock();
    if (!done) wait_mpi(r->c, &r->o, &r->rq, NULL);
    lock();
    agent_remove(r);
    seen = r->t_done;
    unlock();
#endif
    free(r);
    double t1 = tr_now();
    *done_at = seen > 0 ? seen : t1; /* else it completed in the wait */
    g.wait_seconds += t1 - t0;
    return t1 - t0;
}

double tr_comm_wait_seconds(void) {
    return g.wait_seconds;
}

/* ---- one entry for host and device memory ----------------------------------------------- */

tr_comm_req *tr_comm_start(tr_comm *c, tr_comm_op op, const void *send, void *recv, size_t n,
                           tr_comm_dtype t, int peer, int tag, tr_comm_mem mem) {
    op_info o = {(op_kind)op, n, t, op == TR_COMM_OP_SEND || op == TR_COMM_OP_RECV ||
                                            op == TR_COMM_OP_BROADCAST ? peer : -1, tag};
    if (mem == TR_COMM_HOST) {
        int in_place = op == TR_COMM_OP_ALL_REDUCE || op == TR_COMM_OP_BROADCAST ||
                       op == TR_COMM_OP_RECV;
        return run_nonblocking(c, o, in_place ? recv : NULL, in_place ? NULL : send,
                               in_place ? NULL : recv);
    }
    if (check_args(c, &o)) return NULL;
    if (!g_dev) {
        usage_error(c, &o, "device memory before tr_comm_device_init");
        return NULL;
    }
    tr_comm_req *r = calloc(1, sizeof *r);
    tr_comm_desc d = {op, n, t, o.peer, tag};
    if (!r || !(r->dev = g_dev->start(c, &d, send, recv))) {
        free(r);
        return NULL;
    }
    r->c = c;
    r->o = o;
    r->next = c->dev_reqs;
    if (r->next) r->next->prev = r;
    c->dev_reqs = r;
    return r;
}

int tr_comm_open_channels(tr_comm *c, const tr_comm_channel *list, int n, tr_comm_mem mem,
                          char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        const tr_comm_channel *l = &list[i];
        if (l->sender < 0 || l->sender >= c->size || l->receiver < 0 || l->receiver >= c->size ||
            l->sender == l->receiver) {
            snprintf(err, errlen,
                     "channel %d of group %s (size %d): rank %d to rank %d (tag %d): %s", i,
                     c->name, c->size, l->sender, l->receiver, l->tag,
                     l->sender == l->receiver ? "a rank does not send to itself over a channel"
                                              : "no such rank");
            return -1;
        }
    }
    if (mem == TR_COMM_HOST || n == 0) return 0;
    if (!g_dev) {
        snprintf(err, errlen, "channels on device memory of group %s before tr_comm_device_init",
                 c->name);
        return -1;
    }
    g_dev->open_channels(c, list, n);
    return 0;
}

const char *tr_comm_device_transport(const tr_comm *c) {
    return c && c->dev && g_dev ? g_dev->transport(c->dev) : "none";
}

int tr_comm_device_time(tr_comm *c, double *span_s, double *exposed_s) {
    *span_s = *exposed_s = 0;
    if (!c || !c->dev || !g_dev || strcmp(g_dev->transport(c->dev), "nccl")) return 0;
    g_dev->times(c->dev, span_s, exposed_s);
    return 1;
}

/* ---- for the device transport (comm/private.h) ------------------------------------------ */

void tr_comm_register_device(const tr_comm_device_ops *ops) {
    g_dev = ops;
}
void **tr_comm_device_slot(tr_comm *c) {
    return &c->dev;
}
void tr_comm_count_bytes(tr_comm *c, const tr_comm_desc *d) {
    op_info o = {(op_kind)d->op, d->n, d->t, d->peer, d->tag};
    c->bytes_sent += ring_bytes(c, &o);
}
int tr_comm_device_choice(void) {
    return g.device_choice;
}

double tr_comm_timeout(void) {
    return g.timeout;
}
void tr_comm_describe(char *buf, size_t len, const tr_comm *c, const tr_comm_desc *d) {
    op_info o = {(op_kind)d->op, d->n, d->t, d->peer, d->tag};
    describe(buf, len, c, &o);
}
int tr_comm_world_rank(void) {
    return g.world_rank;
}
void tr_comm_serve_census(void) {
#ifdef TR_HAVE_MPI
    lock();
    tr_census_serve();
    unlock();
#endif
}
void tr_comm_die_timeout(const tr_comm *c, const tr_comm_desc *d, void (*before)(void)) {
    char line[256];
    tr_comm_describe(line, sizeof line, c, d);
#ifdef TR_HAVE_MPI
    if (g.mpi) {
        lock(); /* kept: the job ends */
        tr_census_die(line, before);
    }
#endif
    fprintf(stderr, "trainer: rank %d: %s did not complete within %g s; aborting\n",
            g.world_rank, line, g.timeout);
    fflush(stderr);
    if (before) before();
    abort();
}
