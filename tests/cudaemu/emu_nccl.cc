/* NCCL for the CUDA emulator (tests/cudaemu/), written from NCCL's documented semantics on top
 * of MPI between real processes, so that the device transport (parallel/comm/device.c) runs
 * multi-rank in CI without GPUs. A collective, or any operation inside a group, starts its
 * non-blocking MPI counterpart when it is called (at ncclGroupEnd inside a group), after the
 * host has drained its stream; a send or receive called alone starts its MPI counterpart when
 * its stream reaches it, as a GPU would run it, so that the host does not block behind a
 * receive still waiting on the stream (the pipeline posts its receives ahead, one stream per
 * channel). Either stays pending on its stream (emu_async.h) until MPI says it is done; streams
 * and events order it like any device work. Its result appears in the receive buffer only when
 * the runtime sees it complete (MPI works on a private copy; adversarial runs fill the buffer
 * with NaN meanwhile and name a write to either buffer while it was in flight: start()). Sends and receives between two ranks of one
 * communicator match in the order each rank calls them (one MPI tag: MPI's messages do not
 * overtake), as NCCL's do, which has no tags. ncclCommInitRank inside a group creates its
 * communicator at ncclGroupEnd, with the group's others (and never with operations: NCCL does
 * not merge the two), so that a process may create several whose members reach them in any
 * order; emu_nccl.h counts what was created, and how.
 *
 * Needs MPI initialized by the program, with MPI_THREAD_MULTIPLE when another thread queries
 * events (progress tests MPI requests on whichever thread asks). MPI_COMM_WORLD itself carries
 * only ncclCommInitRank's rendezvous, on tags [INIT_TAG_BASE, 2 INIT_TAG_BASE). */
#include <limits.h>
#define OMPI_SKIP_MPICXX 1 /* the C API only: MPI's C++ bindings do not build with -Werror */
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "emu_async.h"
#include "emu_nccl.h"

#define COMM_MAGIC 0x6c63636eu /* "nccl" */
#define ID_MAGIC "EMUNCCL1"
#define INIT_TAG_BASE 16384 /* MPI guarantees tags up to 32767 */
#define P2P_TAG 1

struct ncclComm {
    unsigned magic;
    int rank, nranks;
    MPI_Comm mc;
    std::atomic<int> aborted;     /* by ncclCommAbort, maybe from another thread */
    std::atomic<int> async_error; /* an ncclResult_t an MPI test failed with */
    ncclComm *next_aborted;
};

/* ---- errors: ncclGetLastError's line -------------------------------------------------------- */

static std::mutex err_mu;
static char last_error[512];

static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static ncclResult_t fail(ncclResult_t r, const char *fmt, ...) {
    std::lock_guard<std::mutex> g(err_mu);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return r;
}

static ncclResult_t mpi_fail(const char *fn, const char *what, int rc) {
    char e[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, e, &len) != MPI_SUCCESS) snprintf(e, sizeof(e), "error %d", rc);
    return fail(ncclSystemError, "%s: %s failed: %s", fn, what, e);
}

/* ---- datatypes and sums ----------------------------------------------------------------------
 * Open MPI 4.1.4 adds 8-bit integers with saturation in some paths (its AVX reductions), and
 * MPI has no 16-bit floats: those sums are ours. bf16 and fp16 add in fp32 and round to
 * nearest even at every addition, as NCCL's do (the order of additions is MPI's). */

static void byte_sum(void *in, void *inout, int *len, MPI_Datatype *) {
    const uint8_t *a = (const uint8_t *)in;
    uint8_t *b = (uint8_t *)inout;
    for (int i = 0; i < *len; i++)
        b[i] = (uint8_t)(b[i] + a[i]);
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}
static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *) {
    const uint16_t *a = (const uint16_t *)in;
    uint16_t *b = (uint16_t *)inout;
    for (int i = 0; i < *len; i++)
        b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

#ifdef __FLT16_MAX__ /* the compiler's IEEE binary16, converted with round to nearest even */
#define EMU_HAVE_F16 1
static void f16_sum(void *in, void *inout, int *len, MPI_Datatype *) {
    const _Float16 *a = (const _Float16 *)in;
    _Float16 *b = (_Float16 *)inout;
    for (int i = 0; i < *len; i++)
        b[i] = (_Float16)((float)a[i] + (float)b[i]);
}
#endif

static MPI_Op op_byte = MPI_OP_NULL, op_bf16 = MPI_OP_NULL, op_f16 = MPI_OP_NULL;

struct dtype {
    MPI_Datatype mpi;
    size_t size;
    MPI_Op sum;
};

/* 0 when t is not emulated */
static int dtype_of(ncclDataType_t t, dtype *d) {
    switch (t) {
    case ncclInt8:
        *d = {MPI_INT8_T, 1, op_byte};
        return 1;
    case ncclUint8:
        *d = {MPI_UINT8_T, 1, op_byte};
        return 1;
    case ncclInt32:
        *d = {MPI_INT32_T, 4, MPI_SUM};
        return 1;
    case ncclUint32:
        *d = {MPI_UINT32_T, 4, MPI_SUM};
        return 1;
    case ncclInt64:
        *d = {MPI_INT64_T, 8, MPI_SUM};
        return 1;
    case ncclUint64:
        *d = {MPI_UINT64_T, 8, MPI_SUM};
        return 1;
    case ncclFloat32:
        *d = {MPI_FLOAT, 4, MPI_SUM};
        return 1;
    case ncclFloat64:
        *d = {MPI_DOUBLE, 8, MPI_SUM};
        return 1;
    case ncclBfloat16:
        *d = {MPI_UINT16_T, 2, op_bf16};
        return 1;
#ifdef EMU_HAVE_F16
    case ncclFloat16:
        *d = {MPI_UINT16_T, 2, op_f16};
        return 1;
#endif
    default:
        return 0;
    }
}

/* MPI is up (and our sums exist), or why not */
static ncclResult_t need_mpi(const char *fn) {
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (!up || down)
        return fail(ncclSystemError,
                    "%s: MPI is %s (the emulated NCCL runs over MPI: the "
                    "program must call MPI_Init_thread first)",
                    fn, down ? "finalized" : "not initialized");
    static std::once_flag once;
    std::call_once(once, [] {
        MPI_Op_create(byte_sum, 1, &op_byte);
        MPI_Op_create(bf16_sum, 1, &op_bf16);
#ifdef EMU_HAVE_F16
        MPI_Op_create(f16_sum, 1, &op_f16);
#endif
    });
    return ncclSuccess;
}

/* ---- communicators -------------------------------------------------------------------------- */

/* The unique id: the creator's world rank (the rendezvous root), its pid and a per-process
 * counter (the rendezvous tag). */
struct id_fields {
    char magic[8];
    int32_t root, pid;
    uint32_t counter;
};
static_assert(sizeof(id_fields) <= NCCL_UNIQUE_ID_BYTES, "id fields exceed ncclUniqueId");

/* what each member tells the root, and the root's answer (followed by nranks world ranks in
 * NCCL rank order when status is ncclSuccess) */
struct hello {
    int32_t nranks, rank, world;
    unsigned char uuid[16];
};
struct verdict {
    int32_t status;
    char msg[400];
};

static std::atomic<uint32_t> id_counter{0};

static int init_tag(const id_fields &f) {
    return INIT_TAG_BASE + (int)(f.counter % INIT_TAG_BASE);
}

static void uuid_hex(const unsigned char *u, char *out) {
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", u[i]);
}

/* The root's checks of what the members said: consistent sizes, distinct ranks, distinct
 * GPUs (NCCL refuses two ranks on one GPU). */
static verdict judge(const std::vector<hello> &h, int nranks) {
    verdict v = {ncclSuccess, ""};
    std::vector<int> seen((size_t)nranks, -1);
    for (size_t i = 0; i < h.size(); i++) {
        if (h[i].nranks != nranks) {
            v.status = ncclInvalidArgument;
            snprintf(v.msg, sizeof(v.msg),
                     "ncclCommInitRank: world rank %d says nranks=%d, the "
                     "root says %d",
                     h[i].world, h[i].nranks, nranks);
            return v;
        }
        if (h[i].rank < 0 || h[i].rank >= nranks || seen[(size_t)h[i].rank] >= 0) {
            v.status = ncclInvalidArgument;
            snprintf(v.msg, sizeof(v.msg),
                     "ncclCommInitRank: rank %d given twice (world ranks "
                     "%d and %d)",
                     h[i].rank, seen[(size_t)h[i].rank], h[i].world);
            return v;
        }
        seen[(size_t)h[i].rank] = h[i].world;
    }
    for (size_t i = 0; i < h.size(); i++)
        for (size_t j = i + 1; j < h.size(); j++)
            if (!memcmp(h[i].uuid, h[j].uuid, 16)) {
                char u[33];
                uuid_hex(h[i].uuid, u);
                v.status = ncclInvalidUsage;
                snprintf(v.msg, sizeof(v.msg),
                         "ncclCommInitRank: Duplicate GPU detected: rank "
                         "%d and rank %d both on the GPU with uuid %s (TR_EMU_DEVICE?)",
                         h[i].rank, h[j].rank, u);
                return v;
            }
    return v;
}

/* The root gathers every member's hello and answers each with the verdict and the members'
 * world ranks in NCCL rank order. */
static ncclResult_t rendezvous_root(const hello &mine, int tag, std::vector<int> *worlds,
                                    verdict *v) {
    std::vector<hello> h(1, mine);
    for (int i = 1; i < mine.nranks; i++) {
        hello x;
        int rc = MPI_Recv(&x, (int)sizeof(x), MPI_BYTE, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD,
                          MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail("ncclCommInitRank", "the rendezvous", rc);
        h.push_back(x);
    }
    *v = judge(h, mine.nranks);
    worlds->assign((size_t)mine.nranks, -1);
    if (v->status == ncclSuccess)
        for (const hello &x : h)
            (*worlds)[(size_t)x.rank] = x.world;
    std::vector<char> msg(sizeof(verdict) + worlds->size() * sizeof(int));
    memcpy(msg.data(), v, sizeof(verdict));
    memcpy(msg.data() + sizeof(verdict), worlds->data(), worlds->size() * sizeof(int));
    for (size_t i = 1; i < h.size(); i++) {
        int rc = MPI_Send(msg.data(), (int)msg.size(), MPI_BYTE, h[i].world, tag, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_fail("ncclCommInitRank", "the rendezvous", rc);
    }
    return ncclSuccess;
}

static ncclResult_t rendezvous_member(const hello &mine, int root, int tag,
                                      std::vector<int> *worlds, verdict *v) {
    int rc = MPI_Send(&mine, (int)sizeof(mine), MPI_BYTE, root, tag, MPI_COMM_WORLD);
    MPI_Status st;
    if (rc == MPI_SUCCESS) rc = MPI_Probe(root, tag, MPI_COMM_WORLD, &st);
    int bytes = 0;
    if (rc == MPI_SUCCESS) rc = MPI_Get_count(&st, MPI_BYTE, &bytes);
    if (rc != MPI_SUCCESS) return mpi_fail("ncclCommInitRank", "the rendezvous", rc);
    std::vector<char> msg((size_t)bytes);
    rc = MPI_Recv(msg.data(), bytes, MPI_BYTE, root, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail("ncclCommInitRank", "the rendezvous", rc);
    if ((size_t)bytes < sizeof(verdict))
        return fail(ncclInternalError, "ncclCommInitRank: short rendezvous answer");
    memcpy(v, msg.data(), sizeof(verdict));
    worlds->assign(((size_t)bytes - sizeof(verdict)) / sizeof(int), -1);
    memcpy(worlds->data(), msg.data() + sizeof(verdict), worlds->size() * sizeof(int));
    return ncclSuccess;
}

/* The members' MPI communicator, ordered by NCCL rank (collective over the members only). */
static ncclResult_t make_mpi_comm(const std::vector<int> &worlds, int tag, MPI_Comm *mc) {
    MPI_Group wg, g;
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    int rc = MPI_Group_incl(wg, (int)worlds.size(), worlds.data(), &g);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_create_group(MPI_COMM_WORLD, g, tag, mc);
    MPI_Group_free(&wg);
    if (rc == MPI_SUCCESS) MPI_Group_free(&g);
    if (rc != MPI_SUCCESS) return mpi_fail("ncclCommInitRank", "MPI_Comm_create_group", rc);
    MPI_Comm_set_errhandler(*mc, MPI_ERRORS_RETURN);
    return ncclSuccess;
}

/* ---- operations ----------------------------------------------------------------------------- */

enum kind { ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST, REDUCE, SEND, RECV };
static const char *kind_fn[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather",
                                "ncclBroadcast", "ncclReduce",        "ncclSend",
                                "ncclRecv"};

/* one call, as given */
struct call {
    kind k;
    const void *send;
    void *recv;
    size_t count;
    dtype t;
    int peer; /* root for broadcast and reduce */
    ncclComm *comm;
    cudaStream_t stream;
};

/* one operation pending on a stream (the async op's ctx) */
struct nccl_op {
    ncclComm *comm;
    MPI_Request rq;
    kind k;
    void *tmp; /* a copy of the input when it overlaps the output; freed at the end */
    void *out; /* the result, private until the operation completes (then copied to recv) */
    size_t out_bytes;
    void *watch_copy; /* the input as it was at the start, to see it written while in flight */
    size_t watch_bytes;
    nccl_op *next_abandoned;
    int started; /* its MPI operation; else it starts when its stream reaches it */
    call c;      /* what to start then */
};

static int start(const call &c, nccl_op *op);

static nccl_op *new_op(const call &c, int started) {
    nccl_op *op = new nccl_op();
    op->comm = c.comm;
    op->rq = MPI_REQUEST_NULL;
    op->k = c.k;
    op->started = started;
    op->c = c;
    return op;
}

/* Tested only once every earlier operation of its stream has finished (emu_async.h): an
 * operation not yet started starts there. */
static int op_test(void *ctx) {
    nccl_op *op = (nccl_op *)ctx;
    if (!op->started) {
        op->started = 1;
        int rc = start(op->c, op);
        if (rc != MPI_SUCCESS) {
            mpi_fail(kind_fn[op->k], "starting the MPI operation", rc);
            op->comm->async_error = ncclSystemError;
            return 1;
        }
    }
    int done = 0, rc = MPI_Test(&op->rq, &done, MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS) return done;
    mpi_fail(kind_fn[op->k], "MPI_Test", rc);
    op->comm->async_error = ncclSystemError;
    return 1;
}

static void op_finish(void *ctx) {
    nccl_op *op = (nccl_op *)ctx;
    free(op->tmp);
    free(op->out);
    free(op->watch_copy);
    delete op;
}

static int all_bytes(const void *p, size_t n, unsigned char v) {
    const unsigned char *q = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++)
        if (q[i] != v) return 0;
    return 1;
}

[[noreturn]] static void hazard(const nccl_op *op, const char *what, const void *p, size_t n) {
    fprintf(stderr,
            "cuda emulator: hazard: %s's %s %p (%zu bytes) was written while the operation was "
            "in flight on its stream (a missing wait: nothing ordered that write after the "
            "operation's completion)\n",
            kind_fn[op->k], what, p, n);
    fflush(stderr);
    abort();
}

/* Completed: the result appears in recv now, all at once. Adversarial runs check that nothing
 * wrote the operation's buffers meanwhile (the input against its copy, the output against the
 * poison it was filled with). */
static void op_complete(void *ctx) {
    nccl_op *op = (nccl_op *)ctx;
    if (op->watch_copy && memcmp(op->watch_copy, op->c.send, op->watch_bytes))
        hazard(op, "sendbuff", op->c.send, op->watch_bytes);
    if (op->out_bytes) {
        if (!emu_sched_eager() && !all_bytes(op->c.recv, op->out_bytes, 0xff))
            hazard(op, "recvbuff", op->c.recv, op->out_bytes);
        memcpy(op->c.recv, op->out, op->out_bytes);
    }
    op_finish(op);
}

static int op_of_comm(void *ctx, void *comm) {
    return ((nccl_op *)ctx)->comm == comm;
}

/* Dropped by ncclCommAbort: a receive is cancelled; a collective's request cannot be, and MPI
 * may still touch its buffers, so it and its copy stay allocated, reachable from these lists
 * (plain pointers: no destructor frees them before the leak check at exit). */
static nccl_op *abandoned_ops;  /* under the runtime's lock (emu_stream_drop) */
static ncclComm *aborted_comms; /* under err_mu; kept so that later calls can be refused */
static void op_abandon(void *ctx) {
    nccl_op *op = (nccl_op *)ctx;
    if (!op->started) {
        op_finish(op);
        return;
    }
    if (op->k == RECV && MPI_Cancel(&op->rq) == MPI_SUCCESS &&
        MPI_Request_free(&op->rq) == MPI_SUCCESS) {
        op_finish(op);
        return;
    }
    op->next_abandoned = abandoned_ops;
    abandoned_ops = op;
}

static size_t bytes_of(const call &c, size_t count) {
    return count * c.t.size;
}

static int overlap(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + nb && y < x + na;
}

static void *copy_of(const void *p, size_t n) {
    void *q = malloc(n ? n : 1);
    if (q) memcpy(q, p, n);
    return q;
}

/* Starts c's MPI operation into op. The stream was drained: c sees every earlier work on it.
 * MPI works on a private copy of the output (op->out, holding recv's contents for the
 * in-place forms), which op_complete copies to recv: the result appears only when the
 * operation is seen complete. Meanwhile (adversarial runs, emu_sched.cc) recv holds NaN
 * (0xff bytes), so that a read before the wait gives wrong numbers, and a copy of the input is
 * kept, to name a write to it before the completion. */
static int start(const call &c, nccl_op *op) {
    MPI_Comm mc = c.comm->mc;
    int n = (int)c.count, rank = c.comm->rank, size = c.comm->nranks;
    size_t b = bytes_of(c, c.count);
    int root = rank == c.peer;
    size_t inb = c.k == REDUCE_SCATTER ? b * (size_t)size
                 : c.k == RECV || (c.k == BROADCAST && !root) ? 0 : b;
    size_t rb = c.k == ALL_GATHER ? b * (size_t)size
                : c.k == SEND || (c.k == REDUCE && !root) ? 0 : b;
    void *recv = c.recv;
    if (rb) {
        op->out = malloc(rb);
        if (!op->out) return MPI_ERR_NO_MEM;
        memcpy(op->out, c.recv, rb);
        op->out_bytes = rb;
        recv = op->out;
    }
    int adversarial = !emu_sched_eager();
    const void *in = c.send;
    int in_place = (c.k == ALL_REDUCE || (c.k == REDUCE && root)) && c.send == c.recv;
    if (c.k == ALL_GATHER && c.send == (const char *)c.recv + (size_t)rank * b) in_place = 1;
    if (!in_place && inb && rb && overlap(c.send, inb, c.recv, rb))
        in = op->tmp = copy_of(c.send, inb);
    else if (!in_place && inb && adversarial) {
        op->watch_copy = copy_of(c.send, inb);
        op->watch_bytes = inb;
    }
    if (rb && adversarial) memset(c.recv, 0xff, rb);
    switch (c.k) {
    case ALL_REDUCE:
        return MPI_Iallreduce(in_place ? MPI_IN_PLACE : in, recv, n, c.t.mpi, c.t.sum, mc, &op->rq);
    case REDUCE_SCATTER:
        return MPI_Ireduce_scatter_block(in, recv, n, c.t.mpi, c.t.sum, mc, &op->rq);
    case ALL_GATHER:
        return MPI_Iallgather(in_place ? MPI_IN_PLACE : in, n, c.t.mpi, recv, n, c.t.mpi, mc,
                              &op->rq);
    case BROADCAST:
        if (root && c.send != c.recv) memmove(recv, in, b);
        return MPI_Ibcast(recv, n, c.t.mpi, c.peer, mc, &op->rq);
    case REDUCE:
        return MPI_Ireduce(in_place ? MPI_IN_PLACE : in, recv, n, c.t.mpi, c.t.sum, c.peer, mc,
                           &op->rq);
    case SEND:
        return MPI_Isend(in, n, c.t.mpi, c.peer, P2P_TAG, mc, &op->rq);
    case RECV:
        return MPI_Irecv(recv, n, c.t.mpi, c.peer, P2P_TAG, mc, &op->rq);
    }
    return MPI_ERR_OTHER;
}

/* Runs calls together: every stream they use is drained first, then every MPI operation is
 * started in the order given (the same on every rank, as MPI and NCCL need), then each is
 * left pending on its stream. A send or receive alone is only queued: it starts when its
 * stream reaches it (op_test), in the order of its stream, which is the order of the calls
 * as long as a communicator's point-to-point calls use one stream. */
static ncclResult_t run(const std::vector<call> &calls) {
    if (calls.size() == 1 && (calls[0].k == SEND || calls[0].k == RECV)) {
        nccl_op *op =
            new_op(calls[0], 0);
        emu_stream_enqueue(calls[0].stream, op_test, op_complete, op);
        return ncclSuccess;
    }
    std::vector<cudaStream_t> drained;
    for (const call &c : calls) {
        int seen = 0;
        for (cudaStream_t s : drained)
            seen |= s == c.stream;
        if (!seen) {
            emu_stream_drain(c.stream);
            drained.push_back(c.stream);
        }
    }
    std::vector<nccl_op *> ops;
    ncclResult_t r = ncclSuccess;
    for (const call &c : calls) {
        if (c.comm->aborted) continue; /* aborted by another thread meanwhile */
        nccl_op *op = new_op(c, 1);
        int rc = start(c, op);
        if (rc != MPI_SUCCESS) {
            r = mpi_fail(kind_fn[c.k], "starting the MPI operation", rc);
            op_finish(op);
            continue;
        }
        emu_stream_enqueue(c.stream, op_test, op_complete, op);
    }
    return r;
}

/* ncclGroupStart/End: per thread, nestable */
static thread_local int group_depth;
static thread_local std::vector<call> *group_calls;
static thread_local ncclResult_t group_error;

/* A checked call runs now, or at the outermost ncclGroupEnd. */
static ncclResult_t submit(const call &c) {
    if (c.count == 0) return ncclSuccess;
    if (!group_depth) return run(std::vector<call>(1, c));
    if (!group_calls) group_calls = new std::vector<call>();
    group_calls->push_back(c);
    return ncclSuccess;
}

static ncclResult_t check_comm(const char *fn, ncclComm *comm) {
    ncclResult_t r = need_mpi(fn);
    if (r != ncclSuccess) return r;
    if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    if (comm->magic != COMM_MAGIC)
        return fail(ncclInvalidArgument, "%s: comm %p is not a communicator (destroyed?)", fn,
                    (void *)comm);
    if (comm->aborted)
        return fail(ncclInvalidUsage, "%s: comm %p was aborted (ncclCommAbort)", fn, (void *)comm);
    return ncclSuccess;
}

/* buffers must be device memory: inside one cudaMalloc allocation */
static ncclResult_t check_buf(const char *fn, const char *what, const void *p, size_t bytes) {
    if (!bytes || emu_is_device(p, bytes)) return ncclSuccess;
    return fail(ncclInvalidArgument,
                "%s: %s %p (%zu bytes) is not inside one cudaMalloc "
                "allocation (NCCL buffers are device memory)",
                fn, what, p, bytes);
}

/* the checks every operation shares; fills c.t */
static ncclResult_t check_call(call *c, ncclDataType_t t, ncclRedOp_t op, int reduces) {
    const char *fn = kind_fn[c->k];
    ncclResult_t r = check_comm(fn, c->comm);
    if (r != ncclSuccess) return r;
    if (!dtype_of(t, &c->t))
        return fail(ncclInvalidArgument,
                    "%s: datatype %d is not emulated (int8/uint8/int32/"
                    "uint32/int64/uint64/float16/float32/float64/bfloat16 are)",
                    fn, (int)t);
    if (reduces && op != ncclSum)
        return fail(ncclInvalidArgument, "%s: reduction op %d is not emulated (only ncclSum)", fn,
                    (int)op);
    if (c->count > INT_MAX ||
        (c->k == ALL_GATHER || c->k == REDUCE_SCATTER ? c->count * (size_t)c->comm->nranks > INT_MAX
                                                      : 0))
        return fail(ncclInvalidArgument,
                    "%s: count %zu is over the emulator's limit (MPI's int "
                    "counts)",
                    fn, c->count);
    int needs_peer = c->k == BROADCAST || c->k == REDUCE || c->k == SEND || c->k == RECV;
    if (needs_peer && (c->peer < 0 || c->peer >= c->comm->nranks))
        return fail(ncclInvalidArgument, "%s: %s %d is not a rank of the communicator (size %d)",
                    fn, c->k == SEND || c->k == RECV ? "peer" : "root", c->peer, c->comm->nranks);
    size_t b = bytes_of(*c, c->count), all = b * (size_t)c->comm->nranks;
    int root = c->comm->rank == c->peer;
    size_t in = c->k == REDUCE_SCATTER ? all : c->k == RECV || (c->k == BROADCAST && !root) ? 0 : b;
    size_t out = c->k == ALL_GATHER ? all : c->k == SEND || (c->k == REDUCE && !root) ? 0 : b;
    if ((r = check_buf(fn, "sendbuff", c->send, in)) != ncclSuccess) return r;
    return check_buf(fn, "recvbuff", c->recv, out);
}

static ncclResult_t enqueue(call c, ncclDataType_t t, ncclRedOp_t op, int reduces) {
    ncclResult_t r = check_call(&c, t, op, reduces);
    if (r != ncclSuccess) {
        if (group_depth && group_error == ncclSuccess) group_error = r;
        return r;
    }
    return submit(c);
}

/* ---- communicator creation: alone, or several in one group ---------------------------------- */

/* one ncclCommInitRank, checked */
struct init_call {
    ncclComm_t *comm;
    int nranks;
    id_fields id;
    int rank;
};
static thread_local std::vector<init_call> *group_inits;

/* The rendezvous at the id's creator, then the members' MPI communicator. Blocking. */
static ncclResult_t init_comm(const init_call &ic) {
    const char *fn = "ncclCommInitRank";
    hello mine = {ic.nranks, ic.rank, 0, {0}};
    MPI_Comm_rank(MPI_COMM_WORLD, &mine.world);
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess)
        return fail(ncclUnhandledCudaError, "%s: cudaGetDeviceProperties failed", fn);
    memcpy(mine.uuid, p.uuid.bytes, sizeof(mine.uuid));
    int tag = init_tag(ic.id);
    std::vector<int> worlds;
    verdict v;
    ncclResult_t r = mine.world == ic.id.root
                         ? rendezvous_root(mine, tag, &worlds, &v)
                         : rendezvous_member(mine, ic.id.root, tag, &worlds, &v);
    if (r != ncclSuccess) return r;
    if (v.status != ncclSuccess) return fail((ncclResult_t)v.status, "%s", v.msg);
    if ((int)worlds.size() != ic.nranks)
        return fail(ncclInvalidArgument, "%s: nranks %d here, %zu at the root", fn, ic.nranks,
                    worlds.size());
    MPI_Comm mc;
    if ((r = make_mpi_comm(worlds, tag, &mc)) != ncclSuccess) return r;
    ncclComm *c = new ncclComm();
    c->magic = COMM_MAGIC;
    c->rank = ic.rank;
    c->nranks = ic.nranks;
    c->aborted = 0;
    c->mc = mc;
    c->async_error = ncclSuccess;
    c->next_aborted = NULL;
    *ic.comm = c;
    return ncclSuccess;
}

/* What this process created so far (emu_nccl.h), and TR_EMU_NCCL_LOG: a file that gets one
 * line per creation, "nccl-init world=W grouped=G comms=N" (N communicators made alone, G = 0,
 * or together by one ncclGroupEnd, G = 1), appended by every process of the job. */
static std::atomic<int> n_alone{0}, n_grouped{0}, n_groups{0};
static void census_note(int comms, int grouped) {
    (grouped ? n_grouped : n_alone) += comms;
    if (grouped) n_groups++;
    const char *path = getenv("TR_EMU_NCCL_LOG");
    if (!path || !*path) return;
    int world = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    char line[96];
    int len = snprintf(line, sizeof(line), "nccl-init world=%d grouped=%d comms=%d\n", world,
                       grouped, comms);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0) return;
    if (write(fd, line, (size_t)len) != len) { /* a test reading the log finds it short */
    }
    close(fd);
}

/* A group's communicators, made together. NCCL sets them up concurrently, so that a group may
 * hold them in any order on each rank; here each is made blocking, in the order of their ids
 * (creator's world rank, then its counter), the same on every process: the smallest one not
 * yet made has every member at it, so no two processes wait on each other in a cycle. */
static ncclResult_t init_group(std::vector<init_call> &inits) {
    std::sort(inits.begin(), inits.end(), [](const init_call &a, const init_call &b) {
        return a.id.root != b.id.root ? a.id.root < b.id.root : a.id.counter < b.id.counter;
    });
    int made = 0;
    ncclResult_t r = ncclSuccess;
    for (const init_call &ic : inits)
        if (r == ncclSuccess && (r = init_comm(ic)) == ncclSuccess) made++;
    census_note(made, 1);
    return r;
}

extern "C" {

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

/* the last error of any call, on any communicator (as NCCL's, not cleared by reading) */
const char *ncclGetLastError(ncclComm_t) {
    return last_error;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    ncclResult_t r = need_mpi("ncclGetUniqueId");
    if (r != ncclSuccess) return r;
    if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    id_fields f;
    memcpy(f.magic, ID_MAGIC, sizeof(f.magic));
    MPI_Comm_rank(MPI_COMM_WORLD, &f.root);
    f.pid = (int32_t)getpid();
    f.counter = id_counter++;
    memset(id, 0, sizeof(*id));
    memcpy(id->internal, &f, sizeof(f));
    return ncclSuccess;
}

/* Blocking outside a group: a rendezvous over MPI_COMM_WORLD at the id's creator, which must
 * be a member. Inside a group, only checked here: the communicator is made at the outermost
 * ncclGroupEnd (*comm is NULL until then), with the group's others (init_group). */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    const char *fn = "ncclCommInitRank";
    ncclResult_t r = need_mpi(fn);
    if (r != ncclSuccess) return r;
    if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    *comm = NULL;
    id_fields f;
    memcpy(&f, id.internal, sizeof(f));
    int world_size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (memcmp(f.magic, ID_MAGIC, sizeof(f.magic)) || f.root < 0 || f.root >= world_size)
        return fail(ncclInvalidArgument,
                    "%s: the unique id was not made by ncclGetUniqueId "
                    "(broadcast it from the rank that made it)",
                    fn);
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "%s: rank %d of nranks %d (need 0 <= rank < nranks)", fn,
                    rank, nranks);
    init_call c = {comm, nranks, f, rank};
    if (group_depth) {
        if (!group_inits) group_inits = new std::vector<init_call>();
        group_inits->push_back(c);
        return ncclSuccess;
    }
    r = init_comm(c);
    if (r == ncclSuccess) census_note(1, 0);
    return r;
}

/* every pending operation of comm completes (blocking) */
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    ncclResult_t r = check_comm("ncclCommFinalize", comm);
    if (r != ncclSuccess) return r;
    emu_stream_drain_matching(op_of_comm, comm);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    ncclResult_t r = ncclCommFinalize(comm);
    if (r != ncclSuccess) return r;
    MPI_Comm_free(&comm->mc);
    comm->magic = 0;
    delete comm;
    return ncclSuccess;
}

/* Safe from another thread (a watchdog) while the owner is blocked on comm's operations: they
 * are dropped from the streams, so that what waits for them goes on. The communicator stays
 * allocated, refusing later calls. */
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    if (comm->magic != COMM_MAGIC)
        return fail(ncclInvalidArgument, "ncclCommAbort: comm %p is not a communicator",
                    (void *)comm);
    if (comm->aborted) return ncclSuccess;
    comm->aborted = 1;
    emu_stream_drop(op_of_comm, comm, op_abandon);
    std::lock_guard<std::mutex> g(err_mu);
    comm->next_aborted = aborted_comms;
    aborted_comms = comm;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *e) {
    if (!comm || comm->magic != COMM_MAGIC || !e)
        return fail(ncclInvalidArgument, "ncclCommGetAsyncError: bad comm or asyncError");
    *e = (ncclResult_t)comm->async_error.load();
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    ncclResult_t r = check_comm("ncclCommCount", comm);
    if (r != ncclSuccess) return r;
    if (!count) return fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    ncclResult_t r = check_comm("ncclCommCuDevice", comm);
    if (r != ncclSuccess) return r;
    if (!device) return fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
    *device = 0; /* the emulator has one device per process */
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    ncclResult_t r = check_comm("ncclCommUserRank", comm);
    if (r != ncclSuccess) return r;
    if (!rank) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) {
    return enqueue({ALL_REDUCE, sendbuff, recvbuff, count, {}, 0, comm, s}, t, op, 1);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) {
    return enqueue({REDUCE_SCATTER, sendbuff, recvbuff, recvcount, {}, 0, comm, s}, t, op, 1);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t s) {
    return enqueue({ALL_GATHER, sendbuff, recvbuff, sendcount, {}, 0, comm, s}, t, ncclSum, 0);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                           int root, ncclComm_t comm, cudaStream_t s) {
    return enqueue({BROADCAST, sendbuff, recvbuff, count, {}, root, comm, s}, t, ncclSum, 0);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t s) {
    return enqueue({REDUCE, sendbuff, recvbuff, count, {}, root, comm, s}, t, op, 1);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t t, int peer,
                      ncclComm_t comm, cudaStream_t s) {
    return enqueue({SEND, sendbuff, NULL, count, {}, peer, comm, s}, t, ncclSum, 0);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t s) {
    return enqueue({RECV, NULL, recvbuff, count, {}, peer, comm, s}, t, ncclSum, 0);
}

void emu_nccl_census(int *alone, int *grouped, int *groups) {
    *alone = n_alone;
    *grouped = n_grouped;
    *groups = n_groups;
}

ncclResult_t ncclGroupStart(void) {
    if (!group_depth++) group_error = ncclSuccess;
    return ncclSuccess;
}

/* The outermost end starts the group's operations together (so a send and a receive between
 * the same ranks never wait for each other); a call the group refused is reported again. */
ncclResult_t ncclGroupEnd(void) {
    if (group_depth <= 0) return fail(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart is open");
    if (--group_depth) return ncclSuccess;
    std::vector<call> calls;
    if (group_calls) calls.swap(*group_calls);
    delete group_calls;
    group_calls = NULL;
    std::vector<init_call> inits;
    if (group_inits) inits.swap(*group_inits);
    delete group_inits;
    group_inits = NULL;
    /* NCCL's group calls: "calls to ncclCommInitRank() cannot be merged with others" */
    if (!inits.empty() && !calls.empty())
        return fail(ncclInvalidUsage,
                    "ncclGroupEnd: a group both creates communicators (%zu ncclCommInitRank) and "
                    "runs operations (%zu): NCCL does not merge them",
                    inits.size(), calls.size());
    ncclResult_t r = !inits.empty() ? init_group(inits) : calls.empty() ? ncclSuccess : run(calls);
    return group_error != ncclSuccess ? group_error : r;
}

} /* extern "C" */
