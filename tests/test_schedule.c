/* Tests for the pipeline schedules (parallel/schedule.c): the refusals with their messages;
 * every schedule the check accepts for pp 1-8, micro-batches 1-32 and virtual stages 1-4 runs
 * in the simulator, keeps each forward before its backward and its promise of activations
 * held, and has the expected bubble; hand-broken lists are caught. Plain C: ok/FAIL per
 * check (only failures and a summary per kind are printed), non-zero exit on failure. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/schedule.h"

static int n_fail, n_ok;
static char err[1024];

#ifdef __GNUC__
__attribute__((format(printf, 3, 4)))
#endif
static int
check(int cond, int quiet, const char *fmt, ...) {
    if (cond) {
        n_ok++;
        if (quiet) return 1;
    } else {
        n_fail++;
    }
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", cond ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    return cond;
}

static void test_names(void) {
    const char *names[] = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"};
    for (int k = 0; k < 5; k++)
        check(tr_pp_kind_parse(names[k]) == k && !strcmp(tr_pp_kind_name(k), names[k]), 0,
              "name %s parses and prints back", names[k]);
    check(tr_pp_kind_parse("zb-h2") == -1 && tr_pp_kind_parse("") == -1, 0,
          "unknown names parse to -1");
}

static void refused(tr_pp_kind k, int P, int V, int M, const char *expected) {
    err[0] = 0;
    int rc = tr_pp_check(k, P, V, M, err, sizeof(err));
    if (!check(rc == -1 && !strcmp(err, expected), 0, "refused: %s pp %d V %d M %d",
               tr_pp_kind_name(k), P, V, M))
        printf("     expected: %s\n     got (rc %d): %s\n", expected, rc, err);
}

static void test_refusals(void) {
    refused(TR_PP_INTERLEAVED, 4, 2, 6,
            "interleaved needs microbatches a multiple of pp 4 (4, 8, ...), not 6");
    refused(TR_PP_1F1B, 4, 2, 8, "virtual_stages 2 needs schedule \"interleaved\"");
    refused(TR_PP_ZBH1, 2, 3, 8, "virtual_stages 3 needs schedule \"interleaved\"");
    refused(TR_PP_ZBV, 2, 3, 8,
            "schedule \"zb-v\" needs virtual_stages 2 (its two chunks per rank), not 3");
    refused(TR_PP_ZBV, 2, 1, 8,
            "schedule \"zb-v\" needs virtual_stages 2 (its two chunks per rank), not 1");
    refused(TR_PP_ZBV, 4, 2, 3, "zb-v needs microbatches at least pp 4, not 3");
    refused(TR_PP_ZBV, 1, 2, 3, "schedule \"zb-v\" needs pp 2 or more, not 1");
    refused(TR_PP_INTERLEAVED, 4, 1, 8,
            "schedule \"interleaved\" needs virtual_stages 2 or more (or schedule \"1f1b\")");
    refused(TR_PP_INTERLEAVED, 64, 8, 64,
            "pp 64 x virtual_stages 8 = 512 chunks, more than 256 (virtual_stages 4 or less "
            "would)");
    refused(TR_PP_GPIPE, 65, 1, 8, "pp 65: pipeline ranks must be 1 to 64");
    refused(TR_PP_GPIPE, 0, 1, 8, "pp 0: pipeline ranks must be 1 to 64");
    refused(TR_PP_1F1B, 2, 1, 0, "microbatches 0: a step needs at least 1");
    refused(TR_PP_1F1B, 2, 0, 4, "virtual_stages 0: must be at least 1");
    check(!tr_pp_check(TR_PP_1F1B, 8, 1, 3, err, sizeof(err)) &&
              !tr_pp_check(TR_PP_INTERLEAVED, 64, 4, 128, err, sizeof(err)),
          0, "accepted: 1f1b with M < P, interleaved at 256 chunks");
}

/* Independently of the simulator: on each rank every forward comes before its backward (zb-h1:
 * input part, then weight part), and the micro-batches held never pass max_inflight. */
static int lists_keep_order(const tr_pp_schedule *s) {
    int C = s->P * s->V, ok = 1;
    int *seen = calloc((size_t)s->M * (size_t)C, sizeof(int)); /* parts done: 1 F, 2 B_in */
    for (int r = 0; r < s->P && ok; r++) {
        int held = 0;
        for (int i = 0; i < s->n[r] && ok; i++) {
            const tr_pp_action *a = &s->list[r][i];
            int *p = &seen[a->mb * C + a->chunk];
            if (a->op == TR_ACT_FWD)
                ok = *p == 0, *p = 1, held++;
            else if (a->op == TR_ACT_BWD_W)
                ok = *p == 2, *p = 3, held--;
            else
                ok = *p == 1, *p = 2, held -= a->op == TR_ACT_BWD;
            ok = ok && tr_pp_rank_of(s, a->chunk) == r && held <= s->max_inflight[r];
        }
    }
    free(seen);
    return ok;
}

/* Every chunk runs its forwards, and its backwards' input parts, oldest micro-batch first: the
 * executor's channels (parallel/pipeline.c) match a chunk's messages in that order. */
static int chunks_in_order(const tr_pp_schedule *s) {
    int C = s->P * s->V, ok = 1;
    int *last = malloc((size_t)(2 * C) * sizeof(int)); /* (direction, chunk) */
    for (int k = 0; k < 2 * C; k++)
        last[k] = -1;
    for (int r = 0; r < s->P && ok; r++)
        for (int i = 0; i < s->n[r] && ok; i++) {
            const tr_pp_action *a = &s->list[r][i];
            if (a->op == TR_ACT_BWD_W) continue;
            int *l = &last[(a->op != TR_ACT_FWD) * C + a->chunk];
            ok = a->mb > *l;
            *l = a->mb;
        }
    free(last);
    return ok;
}

/* The span on shared cores (tr_pp_span_shared): asking for no cores, the simulation's own
 * makespan; every rank asking for all of them, the ranks' whole work (someone is always busy:
 * a rank waits only for an action that is running or for its own); half of them, between the
 * two and at least half the work. */
static int shared_spans(const tr_pp_schedule *s, const double *span, const char *kind) {
    double none[TR_PP_MAX_RANKS] = {0}, all[TR_PP_MAX_RANKS], half[TR_PP_MAX_RANKS], end = 0;
    for (int r = 0; r < s->P; r++) {
        all[r] = 1, half[r] = 0.5;
        end = span[r] > end ? span[r] : end;
    }
    double work = 3.0 * s->V * s->M * s->P, tol = 1e-9 * work;
    double a = tr_pp_span_shared(s, none), b = tr_pp_span_shared(s, all);
    double h = tr_pp_span_shared(s, half);
    return check(fabs(a - end) <= tol, 1, "%s pp %d V %d M %d: shared span at no load %g = %g",
                 kind, s->P, s->V, s->M, a, end) &&
           check(fabs(b - work) <= tol, 1, "%s pp %d V %d M %d: shared span at full load %g = "
                 "the work %g", kind, s->P, s->V, s->M, b, work) &&
           check(h >= a - tol && h <= b + tol && h >= 0.5 * work - tol, 1,
                 "%s pp %d V %d M %d: shared span at half load %g in [%g, %g], >= %g", kind,
                 s->P, s->V, s->M, h, a, b, 0.5 * work);
}

/* One schedule the check accepted: simulated, ordered, slots within the promise. Returns its
 * bubble, or -1 after reporting a failure. */
static double run_one(tr_pp_kind k, int P, int V, int M) {
    tr_pp_schedule s;
    double span[TR_PP_MAX_RANKS];
    if (!check(!tr_pp_generate(&s, k, P, V, M), 1, "generate %s pp %d V %d M %d",
               tr_pp_kind_name(k), P, V, M))
        return -1;
    int rc = tr_pp_simulate(&s, span, err, sizeof(err));
    double bubble = tr_pp_bubble(&s);
    int slots_ok = 1;
    for (int c = 0; c < P * V; c++) {
        int n = tr_pp_chunk_slots(&s, c);
        slots_ok &= n >= 1 && n <= s.max_inflight[tr_pp_rank_of(&s, c)];
    }
    int ok = check(rc == 0, 1, "%s pp %d V %d M %d simulates (%s)", tr_pp_kind_name(k), P, V, M,
                   rc ? err : "") &&
             check(lists_keep_order(&s), 1,
                   "%s pp %d V %d M %d: forwards before backwards, "
                   "within max_inflight",
                   tr_pp_kind_name(k), P, V, M) &&
             check(slots_ok, 1, "%s pp %d V %d M %d: 1 <= chunk slots <= max_inflight",
                   tr_pp_kind_name(k), P, V, M) &&
             check(chunks_in_order(&s), 1,
                   "%s pp %d V %d M %d: each chunk's forwards and input gradients oldest "
                   "micro-batch first",
                   tr_pp_kind_name(k), P, V, M) &&
             check(bubble >= 0 && bubble < 1, 1, "%s pp %d V %d M %d: bubble %g in [0, 1)",
                   tr_pp_kind_name(k), P, V, M, bubble);
    if (ok) ok = shared_spans(&s, span, tr_pp_kind_name(k));
    tr_pp_free(&s);
    return ok ? bubble : -1;
}

/* Every accepted (kind, P, V, M) in the ranges, and its bubble against the formulas: gpipe and
 * 1f1b (P-1)/(M+P-1) exactly (also M < P); zb-h1 2(P-1)/(3M+2(P-1)) (also M < P); for M >= P
 * interleaved (P-1)/(V*M+P-1); the last two below 1f1b's. zb-v (M >= P, V 2): its lists are
 * a greedy's (schedule.c), the paper's (P-1)/(6M+P-1) exactly where P divides M, and with no
 * closed form otherwise: there below zb-h1's (so below 1f1b's) and above the paper's. */
static void test_all(void) {
    for (int k = 0; k < 5; k++) {
        int n_run = 0, fails = n_fail;
        for (int P = 1; P <= 8; P++)
            for (int V = 1; V <= 4; V++)
                for (int M = 1; M <= 32; M++) {
                    if (tr_pp_check(k, P, V, M, err, sizeof(err))) continue;
                    double b = run_one(k, P, V, M), b_1f1b = (P - 1.0) / (M + P - 1.0);
                    n_run++;
                    if (b < 0) continue;
                    if (k == TR_PP_GPIPE || k == TR_PP_1F1B)
                        check(fabs(b - b_1f1b) < 1e-9, 1,
                              "%s pp %d M %d: bubble %.6f = (P-1)/"
                              "(M+P-1) = %.6f",
                              tr_pp_kind_name(k), P, M, b, b_1f1b);
                    if (k == TR_PP_ZBV) {
                        double paper = (P - 1.0) / (6.0 * M + P - 1.0),
                               zbh1 = 2.0 * (P - 1.0) / (3.0 * M + 2.0 * (P - 1.0));
                        check(M % P ? b > paper - 1e-9 && b < zbh1 - 1e-9 : fabs(b - paper) < 1e-9,
                              1, "zb-v pp %d M %d: bubble %.6f %s %.6f (zb-h1 %.6f)", P, M, b,
                              M % P ? "between the paper's and zb-h1's" : "= (P-1)/(6M+P-1) =",
                              paper, zbh1);
                        continue;
                    }
                    if (k < 2 || (M < P && k == TR_PP_INTERLEAVED) || P < 2) continue;
                    double want = k == TR_PP_INTERLEAVED
                                      ? (P - 1.0) / (V * M + P - 1.0)
                                      : 2.0 * (P - 1.0) / (3.0 * M + 2.0 * (P - 1.0));
                    check(b < b_1f1b && fabs(b - want) < 1e-9, 1,
                          "%s pp %d V %d M %d: bubble "
                          "%.6f = %.6f, below 1f1b's %.6f",
                          tr_pp_kind_name(k), P, V, M, b, want, b_1f1b);
                }
        check(n_fail == fails, 0,
              "%s: %d schedules simulated, ordered, within their promises, "
              "bubbles as expected",
              tr_pp_kind_name(k), n_run);
    }
}

static void print_table(void) {
    printf("bubble (idle fraction of the step, unit costs):\n");
    printf("  schedule      pp  M=4     M=8\n");
    for (int k = 0; k < 5; k++)
        for (int P = 2; P <= 4; P += 2) {
            int V = k == TR_PP_INTERLEAVED || k == TR_PP_ZBV ? 2 : 1;
            printf("  %-11s%s %2d", tr_pp_kind_name(k), V > 1 ? "/2" : "  ", P);
            for (int M = 4; M <= 8; M += 4) {
                tr_pp_schedule s;
                if (tr_pp_generate(&s, k, P, V, M)) continue;
                printf("  %.4f", tr_pp_bubble(&s));
                tr_pp_free(&s);
            }
            printf("\n");
        }
}

/* The simulator on a hand-broken schedule must fail with exactly `expected`. */
static void caught(tr_pp_schedule *s, const char *what, const char *expected) {
    double span[TR_PP_MAX_RANKS];
    err[0] = 0;
    int rc = tr_pp_simulate(s, span, err, sizeof(err));
    if (!check(rc == -1 && !strcmp(err, expected), 0, "caught: %s", what))
        printf("     expected: %s\n     got (rc %d): %s\n", expected, rc, err);
    check(tr_pp_bubble(s) == -1, 1, "no bubble for a broken schedule (%s)", what);
    tr_pp_free(s);
}

static void swap(tr_pp_schedule *s, int r, int i, int j) {
    tr_pp_action t = s->list[r][i];
    s->list[r][i] = s->list[r][j];
    s->list[r][j] = t;
}

static void test_broken(void) {
    tr_pp_schedule s;
    /* gpipe pp 2, M 2; rank 0 runs F0 B0 F1 B1: its B0 needs rank 1's, which waits for F1 */
    tr_pp_generate(&s, TR_PP_GPIPE, 2, 1, 2);
    swap(&s, 0, 1, 2);
    caught(&s, "deadlock",
           "deadlock: rank 0 (action 1, backward of mb 0 chunk 0) waits for the backward of "
           "(mb 0, chunk 1) on rank 1; rank 1 (action 1, forward of mb 1 chunk 1) waits for the "
           "forward of (mb 1, chunk 0) on rank 0");
    /* one rank, two chunks: chunk 1's forward listed before chunk 0's */
    tr_pp_generate(&s, TR_PP_INTERLEAVED, 1, 2, 1);
    swap(&s, 0, 0, 1);
    caught(&s, "deadlock on one rank",
           "deadlock: rank 0 (action 0, forward of mb 0 chunk 1) waits for the forward of "
           "(mb 0, chunk 0) on rank 0");
    tr_pp_generate(&s, TR_PP_1F1B, 2, 1, 2);
    swap(&s, 1, 0, 1);
    caught(&s, "backward before its forward",
           "rank 1, action 0: backward of (mb 0, chunk 1) before its forward");
    tr_pp_generate(&s, TR_PP_1F1B, 2, 1, 2);
    s.list[0][0].chunk = 1;
    caught(&s, "action on the wrong rank",
           "rank 0, action 0: forward of (mb 0, chunk 1) belongs to rank 1");
    tr_pp_generate(&s, TR_PP_GPIPE, 2, 1, 2);
    s.list[0][3] = s.list[0][2];
    caught(&s, "repeated action", "rank 0, action 3: backward of (mb 0, chunk 0) repeated");
    tr_pp_generate(&s, TR_PP_GPIPE, 2, 1, 2);
    s.n[0]--;
    caught(&s, "missing action", "rank 0 has no backward of (mb 1, chunk 0)");
    tr_pp_generate(&s, TR_PP_GPIPE, 2, 1, 2);
    s.max_inflight[0] = 1;
    caught(&s, "more in flight than promised",
           "rank 0, action 1: forward of (mb 1, chunk 0) holds 2 micro-batches, more than the "
           "promised max_inflight 1");
    /* zb-h1 pp 1, M 1: F B_in W */
    tr_pp_generate(&s, TR_PP_ZBH1, 1, 1, 1);
    swap(&s, 0, 1, 2);
    caught(&s, "weight gradient before its input gradient",
           "rank 0, action 1: weight gradient of (mb 0, chunk 0) before its input gradient");
    tr_pp_generate(&s, TR_PP_ZBH1, 1, 1, 1);
    s.list[0][1].op = TR_ACT_BWD;
    caught(&s, "whole backward in a split schedule",
           "rank 0, action 1: backward (op 1) does not belong in a \"zb-h1\" schedule");

    tr_pp_schedule z;
    memset(&z, 0, sizeof(z));
    tr_pp_free(&z);
    tr_pp_free(NULL);
    check(1, 0, "tr_pp_free on a zeroed schedule and on NULL");
}

/* Activation slots per chunk: what each schedule promises, chunk by chunk. */
static void test_slots(void) {
    tr_pp_schedule s;
    int ok = 1;
    for (int k = 0; k < 4; k++) {
        if (k == TR_PP_INTERLEAVED) continue;
        tr_pp_generate(&s, k, 4, 1, 8);
        for (int c = 0; c < 4; c++)
            ok &= tr_pp_chunk_slots(&s, c) == (k == TR_PP_GPIPE ? 8 : 4 - c);
        tr_pp_free(&s);
    }
    check(ok, 0, "slots at pp 4, M 8: gpipe 8 on every chunk, 1f1b and zb-h1 4 - rank");
    /* zb-h1 holds 1f1b's micro-batches on every rank: min(P - r, M), M < P too */
    for (int P = 2; P <= 8; P++)
        for (int M = 1; M <= 2 * P; M++) {
            tr_pp_generate(&s, TR_PP_ZBH1, P, 1, M);
            for (int r = 0; r < P; r++)
                ok &= tr_pp_chunk_slots(&s, r) == (P - r < M ? P - r : M) &&
                      s.max_inflight[r] == (P - r < M ? P - r : M);
            tr_pp_free(&s);
        }
    check(ok, 0, "zb-h1 holds 1f1b's min(P - rank, M) on every rank, pp 2..8, M 1..2P");
    /* pp 2, V 2, M 4: rank 0 warms up with (2-0-1)*2 + (2-1)*2 = 4 forwards (mb 0, 1 on chunk
     * 0, then on chunk 2), and its fifth and sixth (mb 2, 3 on chunk 0) come before chunk 0's
     * first backward: 4 slots for chunk 0, 2 for chunk 2, 5 in all */
    tr_pp_generate(&s, TR_PP_INTERLEAVED, 2, 2, 4);
    check(s.max_inflight[0] == 5 && tr_pp_chunk_slots(&s, 0) == 4 &&
              tr_pp_chunk_slots(&s, 2) == 2 && tr_pp_chunk_slots(&s, 5) == 0,
          0,
          "slots of interleaved pp 2, V 2, M 4: rank 0 holds 5, chunk 0 4, chunk 2 2 "
          "(got %d, %d, %d)",
          s.max_inflight[0], tr_pp_chunk_slots(&s, 0), tr_pp_chunk_slots(&s, 2));
    tr_pp_free(&s);
}

/* ZB-V's V: chunk r and 2P-1-r on rank r; every rank holds at most P micro-batches of each of
 * its half-stage chunks, 2P halves (1F1B's rank 0: P whole stages), and rank 0 at most P-1 of
 * its second (where the final norm and the head are); gradient buffers: one each way between
 * ranks, at the turn (chunks P-1 and P on rank P-1) a pool shared by the two chunks. */
static void test_zbv(void) {
    int ok = 1, bufs = 1;
    for (int P = 2; P <= 8; P++)
        for (int M = P; M <= 4 * P; M++) {
            tr_pp_schedule s;
            if (tr_pp_generate(&s, TR_PP_ZBV, P, 2, M)) {
                ok = 0;
                continue;
            }
            for (int c = 0; c < 2 * P; c++)
                ok &= tr_pp_rank_of(&s, c) == (c < P ? c : 2 * P - 1 - c);
            for (int r = 0; r < P; r++)
                ok &= s.max_inflight[r] <= 2 * P - (r == 0) && tr_pp_chunk_slots(&s, r) <= P &&
                      tr_pp_chunk_slots(&s, 2 * P - 1 - r) <= P - (r == 0);
            for (int c = 0; c < 2 * P; c++) {
                int nr, ns, tr, ts;
                tr_pp_grad_bufs(&s, c, &nr, &ns);
                tr_pp_grad_bufs(&s, c == P ? P - 1 : c, &tr, &ts);
                bufs &= c == P - 1 ? nr >= 1 : c == P ? ns == tr : nr == 1 && (c == 0 || ns == 1);
            }
            tr_pp_free(&s);
        }
    check(ok, 0,
          "zb-v: chunks in a V, at most P micro-batches a chunk (rank 0's second P-1), pp 2..8");
    check(bufs, 0, "zb-v: one gradient buffer each way between ranks, a shared pool at the turn");
    tr_pp_schedule s;
    tr_pp_generate(&s, TR_PP_1F1B, 2, 1, 4);
    int nr, ns;
    tr_pp_grad_bufs(&s, 0, &nr, &ns);
    check(nr == 0 && ns == 0, 0, "1f1b: gradient buffers by slot (0, 0), got %d, %d", nr, ns);
    tr_pp_free(&s);
}

int main(void) {
    test_names();
    test_zbv();
    test_refusals();
    test_broken();
    test_slots();
    test_all();
    print_table();
    printf("%d ok, %d failed\n", n_ok, n_fail);
    return n_fail ? 1 : 0;
}
