/* The CUDA emulator's streams as queues, events' completion, and the scheduler that runs the
 * queued work in an adversarial order (TR_EMU_SCHED, TR_EMU_SEED); the asynchronous operations
 * of emu_async.h. The stream and event API over them is in emu_streams.cc. Test-only. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "emu.h"
#include "emu_async.h"
#include "emu_runtime_private.h"

using namespace emu_rt;

/* the structures and the order they keep: emu_runtime_private.h */

namespace emu_rt {

std::mutex q_mu;
static std::atomic<long> n_pending{0}; /* operations in every queue: the launches' fast path */
CUstream_st legacy_stream = {STREAM_MAGIC, 0, 0, NULL, NULL, NULL};
std::vector<CUstream_st *> streams;   /* created and not destroyed */
std::vector<CUevent_st *> ev_waiting; /* recorded, not yet complete */

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

CUstream_st *stream_of(cudaStream_t s) {
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
void work_snapshot(CUstream_st *s, snapshot *out) {
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
void events_update(void) {
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
int query(const snapshot &sn) {
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

void strip(snapshot *sn, const CUstream_st *s) {
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
void enqueue(CUstream_st *s, async_op *op) {
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
void drain(const snapshot &sn) {
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

void drain_all(void) {
    snapshot all;
    {
        std::lock_guard<std::mutex> g(q_mu);
        all.push_back({&legacy_stream, legacy_stream.given});
        for (CUstream_st *s : streams)
            all.push_back({s, s->given});
    }
    drain(all);
}
} // namespace emu_rt

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

namespace emu_rt {

/* eager_wait: in eager mode, the host waits for the work to have run (a launch, a copy), or
 * else (a host function) only queues it when its stream is busy */
void exec_on(cudaStream_t s, const char *what, void (*run)(void *), void *ctx,
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

} // namespace emu_rt

void emu_stream_exec(cudaStream_t s, const char *what, void (*run)(void *), void *ctx) {
    if (!strcmp(what, "cublasLtMatmul") || !strcmp(what, "cudnnBackendExecute"))
        stats.library++; /* a kernel, or a few, on a GPU */
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
