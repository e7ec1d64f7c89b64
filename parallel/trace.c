/* The step timeline of `trainer run --trace` (trace.h). */
#include "parallel/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm/base.h"

enum { F_KIND, F_STEP, F_MB, F_CHUNK, F_T0, F_T1, F_N }; /* a span: F_N doubles */

struct tr_trace {
    tr_comm *world;
    int first, steps, step, on, ended;
    double t_ref;
    double *ev; /* F_N per span */
    size_t n, cap;
    char path[4096];
};

static const char *const names[TR_SPAN_KINDS] = {
    "F",        "B",       "Bi",    "W",    "wait in", "wait out",
    "tp gather", "step end", "model", "grads", "update",  "step"};

const char *tr_span_name(tr_span_kind k) {
    return k >= 0 && k < TR_SPAN_KINDS ? names[k] : "?";
}

static const char *category(int k) {
    switch (k) {
    case TR_SPAN_WAIT_IN:
    case TR_SPAN_WAIT_OUT:
    case TR_SPAN_STEP_END:
    case TR_SPAN_GRADS: return "wait";
    case TR_SPAN_GATHER: return "comm";
    case TR_SPAN_STEP: return "step";
    default: return "compute";
    }
}

tr_trace *tr_trace_new(tr_comm *world, int first, int steps, const char *path, char *err,
                       size_t errlen) {
    tr_trace *t = calloc(1, sizeof *t);
    if (!t) {
        tr_errf(err, errlen, "trace: out of memory");
        return NULL;
    }
    t->world = world, t->first = first, t->steps = steps;
    snprintf(t->path, sizeof t->path, "%s", path);
    return t;
}

int tr_trace_step(tr_trace *t, int step) {
    if (!t || t->ended) return 0;
    t->step = step;
    if (step == t->first) {
        tr_comm_barrier(t->world);
        t->t_ref = tr_now();
        t->on = 1;
    }
    if (step >= t->first + t->steps) t->on = 0;
    return t->on;
}

void tr_trace_span(tr_trace *t, tr_span_kind kind, double t0, double t1, int mb, int chunk) {
    if (!t || !t->on) return;
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 256;
        double *ev = realloc(t->ev, cap * F_N * sizeof *ev);
        if (!ev) return; /* a trace short of spans, not a failed run */
        t->ev = ev, t->cap = cap;
    }
    double *e = t->ev + t->n++ * F_N;
    e[F_KIND] = kind, e[F_STEP] = t->step, e[F_MB] = mb, e[F_CHUNK] = chunk;
    e[F_T0] = t0 - t->t_ref, e[F_T1] = t1 - t->t_ref;
}

static void write_span(FILE *f, const double *e, int rank) {
    int k = (int)e[F_KIND];
    /* microseconds, to the nanosecond */
    fprintf(f,
            ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,"
            "\"dur\":%.3f,\"args\":{\"step\":%d",
            tr_span_name(k), category(k), rank, e[F_T0] * 1e6, (e[F_T1] - e[F_T0]) * 1e6,
            (int)e[F_STEP]);
    if (e[F_MB] >= 0) fprintf(f, ",\"mb\":%d", (int)e[F_MB]);
    if (e[F_CHUNK] >= 0) fprintf(f, ",\"chunk\":%d", (int)e[F_CHUNK]);
    fputs("}}", f);
}

/* rank 0: every rank's spans, all[r * most * F_N ...], n[r] of them */
static int write_file(const tr_trace *t, const double *all, const double *n, int ranks, size_t most,
                      char *err, size_t errlen) {
    tr_atomic a;
    if (tr_atomic_open(&a, t->path, err, errlen)) return -1;
    fprintf(a.f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"first_step\":%d,\"steps\":%d,"
                 "\"ranks\":%d},\n\"traceEvents\":[\n"
                 "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"trainer\"}}",
            t->first, t->steps, ranks);
    for (int r = 0; r < ranks; r++)
        fprintf(a.f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                     "\"args\":{\"name\":\"rank %d\"}}",
                r, r);
    for (int r = 0; r < ranks; r++)
        for (size_t i = 0; i < (size_t)n[r]; i++) write_span(a.f, all + (r * most + i) * F_N, r);
    fputs("\n]}\n", a.f);
    return tr_atomic_commit(&a, err, errlen);
}

int tr_trace_end(tr_trace *t, char *err, size_t errlen) {
    if (!t || t->ended) return 0;
    t->ended = 1, t->on = 0;
    int ranks = tr_comm_size(t->world), me = tr_comm_rank(t->world), rc = 0;
    double mine = (double)t->n, *n = calloc((size_t)ranks, sizeof *n);
    if (!n || tr_comm_all_gather(t->world, &mine, n, 1, TR_COMM_F64)) {
        free(n);
        return tr_errf(err, errlen, "trace: cannot gather the spans");
    }
    size_t most = 0;
    for (int r = 0; r < ranks; r++)
        if ((size_t)n[r] > most) most = (size_t)n[r];
    double *pad = calloc(most * F_N + 1, sizeof *pad);
    double *all = calloc((size_t)ranks * most * F_N + 1, sizeof *all);
    double short_of = !pad || !all; /* every rank learns whether one is out of memory */
    if (tr_comm_all_reduce(t->world, &short_of, 1, TR_COMM_F64) || short_of > 0) {
        rc = tr_errf(err, errlen, "trace: out of memory for %zu spans", most * (size_t)ranks);
    } else {
        if (t->n) memcpy(pad, t->ev, t->n * F_N * sizeof *pad);
        if (most && tr_comm_all_gather(t->world, pad, all, most * F_N, TR_COMM_F64))
            rc = tr_errf(err, errlen, "trace: cannot gather the spans");
        else if (me == 0)
            rc = write_file(t, all, n, ranks, most, err, errlen);
    }
    free(pad);
    free(all);
    free(n);
    return rc;
}

void tr_trace_free(tr_trace *t) {
    if (!t) return;
    free(t->ev);
    free(t);
}
