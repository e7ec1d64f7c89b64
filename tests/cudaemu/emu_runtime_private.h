/* Private to the CUDA emulator's runtime and included by nothing else: what its pieces share.
 * emu_runtime.cc: kernel launches on fibers, warp exchanges, the tensor-core product, launch
 * errors, mutants; emu_sched.cc: the streams' queues, events' completion and the adversarial
 * scheduler (emu_async.h); emu_streams.cc: the stream and event API; emu_device.cc: the
 * device's identity and properties, memory, copies and memsets. */
#ifndef TR_EMU_RUNTIME_PRIVATE_H
#define TR_EMU_RUNTIME_PRIVATE_H
#include <stdint.h>

#include <mutex>
#include <vector>

#include "emu.h"

#define MAX_THREADS 1024
#define SMEM_DEFAULT (48 << 10)
#define SMEM_OPTIN (227 << 10) /* H100/H200 */

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

namespace emu_rt {

/* one line to stderr, "cuda emulator: ...", then abort (emu_runtime.cc) */
[[noreturn]] void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* What the program asked of the device, printed at exit when TR_EMU_STATS is set
 * (emu_runtime.cc) */
struct run_stats {
    unsigned long launches, mallocs, frees, syncs, h2d, d2h;
    unsigned long
        library; /* cuBLASLt products and cuDNN graphs run: a kernel, or a few, on a GPU */
    unsigned long long malloc_bytes, h2d_bytes, d2h_bytes;
};
extern run_stats stats;

/* emu_sched.cc: the lock, the queues and events (see above), and the scheduler's entries */
extern std::mutex q_mu;
extern CUstream_st legacy_stream;
extern std::vector<CUstream_st *> streams;   /* created and not destroyed */
extern std::vector<CUevent_st *> ev_waiting; /* recorded, not yet complete */
double now_s(void);
CUstream_st *stream_of(cudaStream_t s);
/* the lock is held by the callers of these five */
void work_snapshot(CUstream_st *s, snapshot *out);
void events_update(void);
int query(const snapshot &sn);
void strip(snapshot *sn, const CUstream_st *s);
void enqueue(CUstream_st *s, async_op *op);
/* these take the lock */
void drain(const snapshot &sn);
void drain_all(void);
void exec_on(cudaStream_t s, const char *what, void (*run)(void *), void *ctx, int eager_wait);

} // namespace emu_rt

#endif
