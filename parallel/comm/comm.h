/* Process groups and collectives. One interface, several transports: MPI on host memory
 * (parallel/comm/mpi.c); on device memory NCCL, or device buffers staged through pinned host
 * memory over MPI (parallel/comm/device.c). A process started without mpirun (or a build
 * without MPI) is a world of one, where every collective is a copy.
 *
 * Every operation has a deadline (the timeout given at init): a collective that does not
 * complete in time, or a peer that died, makes this process print one line naming its rank,
 * the operation, the group and how long it waited, and abort the whole job, so that no rank
 * hangs forever. Library code does not exit otherwise: errors come back as -1 with a message. */
#ifndef TR_COMM_H
#define TR_COMM_H

#include <stddef.h>

#include "parallel/comm/base.h"

typedef struct tr_comm tr_comm;         /* a group of processes */
typedef struct tr_comm_req tr_comm_req; /* an operation in flight */

/* BF16: bfloat16, summed in fp32 and rounded to nearest even at each addition */
typedef enum {
    TR_COMM_F32 = 0,
    TR_COMM_F64,
    TR_COMM_I32,
    TR_COMM_I64,
    TR_COMM_BYTE,
    TR_COMM_BF16
} tr_comm_dtype;

/* The world: MPI_COMM_WORLD under mpirun/srun, else one process. `timeout_s` bounds every
 * wait (0: 300 s). Returns -1 with a message when MPI fails to start. */
int tr_comm_init(tr_comm **world, int *argc, char ***argv, double timeout_s, char *err,
                 size_t errlen);
/* Free a group; freeing the world also finalizes MPI. NULL is a no-op. A device operation of
 * the group started and never waited for is completed (as tr_comm_wait would) and freed
 * first. */
void tr_comm_free(tr_comm *c);

int tr_comm_rank(const tr_comm *c);
int tr_comm_size(const tr_comm *c);
const char *tr_comm_name(const tr_comm *c); /* "world", "dp", "tp", "pp": used in messages */
const char *tr_comm_transport(void);        /* "mpi" or "single" */

/* The MPI library this build runs with (the first line of MPI_Get_library_version), or "none"
 * in a build without MPI: for provenance (trainer/report/provenance.h). */
void tr_comm_library_version(char *buf, size_t len);

/* This process's rank among the processes of the world on its host (MPI's shared-memory
 * split, done at init), and how many there are: the GPU a process drives is chosen from it. */
int tr_comm_local_rank(int *local_size);

/* The process mesh dp x pp x tp over the world, tp innermost (tensor-parallel ranks are
 * neighbours, so on one node), then pp, then dp: world rank = (d * pp + p) * tp + t.
 * Fills this rank's three groups; -1 when dp * pp * tp != world size. */
typedef struct {
    int dp, pp, tp;
} tr_mesh;
int tr_comm_mesh(tr_comm *world, tr_mesh mesh, tr_comm **dp, tr_comm **pp, tr_comm **tp,
                 char *err, size_t errlen);
/* A subgroup of c: the ranks that pass the same color, ordered by key (every rank of c calls
 * it, in the same order as its other operations on c). `name` (up to 7 characters) names the
 * group in messages. -1 with a message when out of memory. */
int tr_comm_split(tr_comm *c, int color, int key, const char *name, tr_comm **out, char *err,
                  size_t errlen);

/* Bytes this process sends for the collectives started on c since it was made, as a
 * bandwidth-optimal (ring) algorithm moves them: all_reduce of S bytes 2(p-1)/p S,
 * reduce_scatter of S bytes in and all_gather of S bytes out (p-1)/p S each, send n bytes,
 * broadcast (root) S. Counted from the calls, not read off the wire; 0 on a group of one. */
double tr_comm_bytes_sent(const tr_comm *c);

/* Blocking collectives (sum is the only reduction). Buffers are host memory. `n` counts
 * elements. reduce_scatter: send holds size * n elements, rank r receives the sum of block r
 * (n elements). all_gather: each rank contributes n elements, recv gets size * n in rank
 * order. send may equal recv + rank * n for an in-place all_gather. */
int tr_comm_all_reduce(tr_comm *c, void *buf, size_t n, tr_comm_dtype t);
int tr_comm_reduce_scatter(tr_comm *c, const void *send, void *recv, size_t n, tr_comm_dtype t);
int tr_comm_all_gather(tr_comm *c, const void *send, void *recv, size_t n, tr_comm_dtype t);
int tr_comm_broadcast(tr_comm *c, void *buf, size_t n, tr_comm_dtype t, int root);
/* The file at path as rank `root` of c reads it (at most max bytes), on every rank of c, so
 * that it need be on root's host only: 0 with *text (malloc'd, a NUL after its *len bytes);
 * 1 on every rank when root could not read it (absent, unreadable, over max: errno on root);
 * -1 on every rank when one had no memory for it. Every rank of c calls it; c NULL: this
 * process alone, as root. */
int tr_comm_read_file(tr_comm *c, int root, const char *path, size_t max, char **text, size_t *len);
int tr_comm_send(tr_comm *c, const void *buf, size_t n, tr_comm_dtype t, int peer, int tag);
int tr_comm_recv(tr_comm *c, void *buf, size_t n, tr_comm_dtype t, int peer, int tag);
int tr_comm_barrier(tr_comm *c);

/* Non-blocking versions: start the operation and return a handle; tr_comm_wait completes it
 * (and frees the handle). Buffers must not be touched until then. Operations on one group
 * must be started in the same order on every rank. */
tr_comm_req *tr_comm_iall_reduce(tr_comm *c, void *buf, size_t n, tr_comm_dtype t);
tr_comm_req *tr_comm_ireduce_scatter(tr_comm *c, const void *send, void *recv, size_t n,
                                     tr_comm_dtype t);
tr_comm_req *tr_comm_iall_gather(tr_comm *c, const void *send, void *recv, size_t n,
                                 tr_comm_dtype t);
/* Point to point (pipeline stages): messages between two ranks with the same tag arrive in
 * the order they were sent (on device memory: see channels below). The progress agent polls sends,
 * not receives (a pipeline keeps one posted ahead at all times): a receive moves in its tests and
 * wait. */
tr_comm_req *tr_comm_isend(tr_comm *c, const void *buf, size_t n, tr_comm_dtype t, int peer,
                           int tag);
tr_comm_req *tr_comm_irecv(tr_comm *c, void *buf, size_t n, tr_comm_dtype t, int peer, int tag);
/* Progress an operation without blocking: 1 when complete (the handle stays valid until
 * tr_comm_wait), 0 when not yet. */
int tr_comm_test(tr_comm_req *r);
/* Wait for completion (bounded by the timeout); returns seconds spent waiting. */
double tr_comm_wait(tr_comm_req *r);

/* The same, also giving when the operation completed (CLOCK_MONOTONIC seconds), as first
 * seen by the progress agent, a test or the wait itself. */
double tr_comm_wait_done(tr_comm_req *r, double *done_at);
/* 1 when a progress agent moves non-blocking operations while the caller computes (MPI with
 * more than one rank, where it has a core to spare or TR_COMM_PROGRESS=1; comm/mpi.c);
 * without it an operation moves only inside this process's communication calls, mostly its
 * wait. */
int tr_comm_progress_agent(void);
/* Whether it runs and why, as "progress agent off (4 ranks x 1 thread on 2 cores: no core to
 * spare)"; "" before an MPI world of several ranks. */
const char *tr_comm_progress_note(void);

/* ---- one entry for every operation, on host or device memory ------------------------------
 * What the layers, data parallelism and the pipeline call with their backend's buffers: mem
 * says where the buffers live. all_reduce sums recv in place (send is ignored); broadcast
 * sends recv from root `peer`; send reads send; recv writes recv; reduce_scatter and
 * all_gather as above. `peer` and `tag` only for send, recv (and broadcast's root).
 *
 * Device memory (after tr_comm_device_init): the operation is ordered after everything the
 * compute stream was given before it, runs on its group's own stream (a send or receive: its
 * channel's, below), and tr_comm_wait orders the compute stream after it without blocking the
 * host (returns 0 s); tr_comm_test asks whether it completed. A watchdog bounds every NCCL
 * collective by the timeout, counted from when its group's stream reaches it, and every NCCL
 * send or receive from when the compute stream reaches its wait (a receive posted ahead
 * waits for the peer's compute, which is not a hang): one that does not finish in time ends
 * the job with the line a host operation prints (operation, group, the ranks that did not
 * answer).
 *
 * Sends and receives on device memory go through channels: a channel is one direction of
 * traffic in a group, (sender, receiver, tag). On NCCL each channel has a communicator of its
 * two ranks and a stream on each side, so that a receive posted ahead holds back only later
 * messages of its own channel; there, as NCCL matches messages by the order they are posted
 * and not by tag, the messages of one channel match in posting order: the receiver must post
 * its receives of a channel in the order the sender posts the sends. (On MPI, host memory and
 * the staged transport, that order gives the same matching: MPI's messages do not overtake.)
 * A send or receive on NCCL whose channel was not opened ends the job with one line. */
typedef enum { TR_COMM_HOST = 0, TR_COMM_DEVICE = 1 } tr_comm_mem;
typedef enum {
    TR_COMM_OP_ALL_REDUCE = 0,
    TR_COMM_OP_REDUCE_SCATTER,
    TR_COMM_OP_ALL_GATHER,
    TR_COMM_OP_BROADCAST,
    TR_COMM_OP_SEND,
    TR_COMM_OP_RECV
} tr_comm_op;
tr_comm_req *tr_comm_start(tr_comm *c, tr_comm_op op, const void *send, void *recv, size_t n,
                           tr_comm_dtype t, int peer, int tag, tr_comm_mem mem);

/* One direction of point-to-point traffic in a group (see above). */
typedef struct {
    int sender, receiver, tag; /* ranks of the group */
} tr_comm_channel;
/* Open the channels in `list` for sends and receives on memory `mem`. Every rank of c calls it
 * with the same list, at the same point of its sequence of operations on c; each opens the
 * channels it is one end of, all at once: on NCCL one exchange of their ids over c, then one
 * NCCL group that sets up their communicators concurrently. Decides the group's device
 * transport if no device operation did yet. Nothing to open on host memory, on the staged
 * transport, in a group of one or in a build without NCCL; a channel opened before is kept.
 * -1 with a message for a list naming a rank outside c, or a rank sending to itself. */
int tr_comm_open_channels(tr_comm *c, const tr_comm_channel *list, int n, tr_comm_mem mem,
                          char *err, size_t errlen);

/* Bind device memory to the CUDA device this process uses (chosen by the backend from
 * tr_comm_local_rank) and `stream`, the backend's compute stream (a cudaStream_t). Each group
 * then picks its device transport at its first device operation, the same on all its ranks:
 * NCCL when every rank of the group has a GPU of its own, else (ranks sharing a GPU, a build
 * without NCCL, or TR_COMM_DEVICE=staged) the staged transport, which copies through pinned
 * host memory and runs the MPI operation. -1 with a message when this build has no CUDA. */
int tr_comm_device_init(void *stream, char *err, size_t errlen);
/* "nccl", "staged", "local" (a group of one) or "none" (no device operation on the group
 * yet): for banners and tests */
const char *tr_comm_device_transport(const tr_comm *c);
/* The NCCL this build runs with ("2.21.5"): 0, or -1 and "" in a build without NCCL. */
int tr_comm_nccl_version(char *buf, size_t len);
/* The NCCL operations on c so far (its channels' sends and receives too), as the GPU timed them:
 * the seconds they were in flight (summed) and, of those, the seconds the compute stream stood
 * waiting for them (from reaching its wait to their completion). Operations the device has not yet
 * passed count later. 1 when c's device operations are timed this way (NCCL), 0 otherwise (both
 * figures 0: the host's waits measure them, as on host memory). */
int tr_comm_device_time(tr_comm *c, double *span_s, double *exposed_s);

/* fn (NULL: none) runs once on a rank that gives up on the job, just before it aborts it: with
 * the first rank that its census found silent (dead, stuck or busy; -1 when unknown) and the
 * line it printed. For the run's records (trainer/report/ledger.c). */
void tr_comm_on_abort(void (*fn)(int silent_rank, const char *why));
/* The host of each world rank (n names, `stride` bytes apart, each NUL-terminated), copied: a
 * timeout's line then names the host of the ranks that did not answer ("ranks 2, 3 (host
 * b) did not answer"), the one a cut or dead host's ranks share. Not a collective. */
void tr_comm_set_host_names(const char *names, int n, size_t stride);

/* Time this process spent inside blocking operations and waits, in seconds, since init. */
double tr_comm_wait_seconds(void);

#endif
