/* The CUDA emulator's stream and event API: streams created, destroyed, synchronized and
 * queried; host functions; events recorded, queried, waited for and timed. Their queues and
 * the scheduler that runs them are in emu_sched.cc. Test-only. */
#include <mutex>
#include <vector>

#include "emu.h"
#include "emu_async.h"
#include "emu_runtime_private.h"

using namespace emu_rt;

/* destroyed ones stay allocated, idle: another thread's drain may still hold a snapshot that
 * names them (a plain list, which no destructor frees before the leak check at exit) */
static CUstream_st *dead_streams;

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

extern "C" {

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

} /* extern "C" */
