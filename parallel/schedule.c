/* Pipeline schedules (schedule.h): each rank's action list for gpipe, 1f1b, Megatron's
 * interleaved 1F1B and ZB-H1, and an event simulation with unit costs that checks the lists
 * (order, completeness, activations held, deadlock) and measures their bubble. No MPI here:
 * the executor (pipeline.c) only reads the lists. */
#include "parallel/schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TR_PP_MAX_CHUNKS 256

static const char *const kind_names[] = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"};

int tr_pp_kind_parse(const char *s) {
    for (int k = 0; s && k < 5; k++)
        if (!strcmp(s, kind_names[k])) return k;
    return -1;
}

const char *tr_pp_kind_name(tr_pp_kind k) {
    return (unsigned)k < 5 ? kind_names[k] : "?";
}

int tr_pp_rank_of(const tr_pp_schedule *s, int chunk) {
    return tr_pp_rank_of_kind(s->kind, s->P, chunk);
}

int tr_pp_rank_of_kind(tr_pp_kind k, int P, int chunk) {
    if (P < 1) return 0;
    if (k == TR_PP_ZBV) return chunk < P ? chunk : 2 * P - 1 - chunk; /* the V */
    return chunk % P;
}

/* Whether the backward runs in two parts (input gradient, then weight gradient). */
static int split_kind(tr_pp_kind k) {
    return k == TR_PP_ZBH1 || k == TR_PP_ZBV;
}

int tr_pp_check(tr_pp_kind k, int P, int V, int M, char *err, size_t errlen) {
    if ((unsigned)k >= 5)
        snprintf(err, errlen,
                 "unknown pipeline schedule %d (gpipe, 1f1b, interleaved, zb-h1 or zb-v)", (int)k);
    else if (P < 1 || P > TR_PP_MAX_RANKS)
        snprintf(err, errlen, "pp %d: pipeline ranks must be 1 to %d", P, TR_PP_MAX_RANKS);
    else if (M < 1)
        snprintf(err, errlen, "microbatches %d: a step needs at least 1", M);
    else if (V < 1)
        snprintf(err, errlen, "virtual_stages %d: must be at least 1", V);
    else if (k == TR_PP_ZBV && V != 2)
        snprintf(err, errlen,
                 "schedule \"zb-v\" needs virtual_stages 2 (its two chunks per rank), not %d", V);
    else if (k == TR_PP_ZBV && P < 2)
        snprintf(err, errlen, "schedule \"zb-v\" needs pp 2 or more, not %d", P);
    else if (k == TR_PP_ZBV && M < P)
        snprintf(err, errlen, "zb-v needs microbatches at least pp %d, not %d", P, M);
    else if (V > 1 && k != TR_PP_INTERLEAVED && k != TR_PP_ZBV)
        snprintf(err, errlen, "virtual_stages %d needs schedule \"interleaved\"", V);
    else if (k == TR_PP_INTERLEAVED && V < 2)
        snprintf(err, errlen,
                 "schedule \"interleaved\" needs virtual_stages 2 or more (or schedule \"1f1b\")");
    else if (k == TR_PP_INTERLEAVED && M % P)
        snprintf(err, errlen,
                 "interleaved needs microbatches a multiple of pp %d (%d, %d, ...), not %d", P, P,
                 2 * P, M);
    else if (P * V > TR_PP_MAX_CHUNKS)
        snprintf(err, errlen,
                 "pp %d x virtual_stages %d = %d chunks, more than %d (virtual_stages %d or less "
                 "would)",
                 P, V, P * V, TR_PP_MAX_CHUNKS, TR_PP_MAX_CHUNKS / P);
    else
        return 0;
    return -1;
}

/* ---- generation ------------------------------------------------------------------------ */

static void push(tr_pp_schedule *s, int r, tr_pp_op op, int mb, int chunk) {
    s->list[r][s->n[r]++] = (tr_pp_action){.op = (unsigned char)op, .mb = mb, .chunk = chunk};
}

static int min_int(int a, int b) {
    return a < b ? a : b;
}

/* Every forward, then every backward, oldest micro-batch first (the order in which the last
 * rank can start them; reversing it would not change the makespan). All M held. */
static void gen_gpipe(tr_pp_schedule *s, int r) {
    for (int mb = 0; mb < s->M; mb++)
        push(s, r, TR_ACT_FWD, mb, r);
    for (int mb = 0; mb < s->M; mb++)
        push(s, r, TR_ACT_BWD, mb, r);
    s->max_inflight[r] = s->M;
}

/* 1F1B (PipeDream-Flush): warm-up forwards so that rank r's first backward finds its input
 * gradient ready, then one forward one backward, then the backwards left. */
static void gen_1f1b(tr_pp_schedule *s, int r) {
    int M = s->M, warm = min_int(s->P - 1 - r, M);
    for (int mb = 0; mb < warm; mb++)
        push(s, r, TR_ACT_FWD, mb, r);
    for (int i = 0; i < M - warm; i++) {
        push(s, r, TR_ACT_FWD, warm + i, r);
        push(s, r, TR_ACT_BWD, i, r);
    }
    for (int mb = M - warm; mb < M; mb++)
        push(s, r, TR_ACT_BWD, mb, r);
    s->max_inflight[r] = min_int(s->P - r, M);
}

/* Interleaved: the rank's k-th forward (k = 0 .. M*V-1). Micro-batches go through the rank's V
 * chunks in groups of P: P micro-batches on local chunk 0, the same P on local chunk 1, ...,
 * then the next group. Backwards take the same sequence with the local chunks reversed. */
static tr_pp_action interleaved_action(const tr_pp_schedule *s, int r, int k, int backward) {
    int P = s->P, V = s->V;
    int group = k / (P * V), idx = k % (P * V), local = idx / P;
    if (backward) local = V - 1 - local;
    return (tr_pp_action){.op = backward ? TR_ACT_BWD : TR_ACT_FWD,
                          .mb = group * P + idx % P,
                          .chunk = local * P + r};
}

/* Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, sec. 2.2; Megatron's
 * forward_backward_pipelining_with_interleaving): (P-r-1)*2 + (V-1)*P warm-up forwards, then
 * 1F1B, then the cool-down. Megatron runs every forward first when M = P; the capped count
 * gives the same bubble here (tests/test_schedule.c). */
static void gen_interleaved(tr_pp_schedule *s, int r) {
    int total = s->M * s->V;
    int warm = min_int((s->P - r - 1) * 2 + (s->V - 1) * s->P, total);
    for (int k = 0; k < warm; k++)
        s->list[r][s->n[r]++] = interleaved_action(s, r, k, 0);
    for (int i = 0; i < total - warm; i++) {
        s->list[r][s->n[r]++] = interleaved_action(s, r, warm + i, 0);
        s->list[r][s->n[r]++] = interleaved_action(s, r, i, 1);
    }
    for (int k = total - warm; k < total; k++)
        s->list[r][s->n[r]++] = interleaved_action(s, r, k, 1);
    s->max_inflight[r] = min_int(warm + 1, total);
}

/* ZB-H1 (Qi et al. 2024, sec. 2.1): 1F1B's warm-up, then forward and input gradient (B) in
 * turn, a weight gradient (W, oldest first) slipped in before a forward when the forward would
 * hold more than 1F1B's P-r micro-batches (counted from forward to W); in the cool-down a W
 * before each B, in the time the rank would otherwise wait for that B's input gradient, and
 * the W's left at the end. Every rank holds what it holds in 1F1B, so that its activation
 * memory is 1F1B's (the W's output gradients lie over activations only B read: model.c). The
 * critical path is 1F1B's with the backward's two units one: the last rank runs F B W from
 * its first forward (it may hold one micro-batch), its last B reaches rank 0 after P-1 more
 * B's, and rank 0's last W ends the step: 2(P-1) idle units against 1F1B's 3(P-1). (Letting
 * every rank hold P, 1F1B's first rank's count, takes the bubble to P-1 units but the later
 * ranks' memory above 1F1B's.) */
static void gen_zbh1(tr_pp_schedule *s, int r) {
    int M = s->M, bound = min_int(s->P - r, M), warm = min_int(s->P - 1 - r, M);
    int w = 0; /* next micro-batch whose W is due (W's go in B order: oldest first) */
    for (int mb = 0; mb < warm; mb++)
        push(s, r, TR_ACT_FWD, mb, r);
    for (int i = 0; i < M - warm; i++) {
        int mb = warm + i; /* forwards done before this one: mb; weights done: w */
        if (mb - w >= bound) push(s, r, TR_ACT_BWD_W, w++, r);
        push(s, r, TR_ACT_FWD, mb, r);
        push(s, r, TR_ACT_BWD_IN, i, r);
    }
    for (int mb = M - warm; mb < M; mb++) {
        if (w < mb) push(s, r, TR_ACT_BWD_W, w++, r);
        push(s, r, TR_ACT_BWD_IN, mb, r);
    }
    while (w < M)
        push(s, r, TR_ACT_BWD_W, w++, r);
    s->max_inflight[r] = bound;
}

/* ZB-V (Qi et al. 2024, sec. 6): chunk r and chunk 2P-1-r on rank r, so that a micro-batch
 * goes down the ranks and back up, and the backward split as in zb-h1. The lists come from a
 * greedy run in unit time (forward, input gradient and weight gradient one unit each, free
 * transfers), the paper's heuristic: a rank that is free runs the oldest input gradient that
 * is ready, else the next forward whose input is there and whose chunk holds fewer than its
 * cap of micro-batches (the second chunk first: it is nearer the loss), else its oldest weight
 * gradient left, else waits. The caps bound the activations: a chunk holds half a stage,
 * 1F1B's rank 0 P whole stages, so P micro-batches on each chunk match its blocks (the
 * paper's ZB-V). Rank 0, where 1F1B's peak is, keeps one fewer on its second chunk (P-1):
 * that chunk holds the final norm and the head's input too, and every second chunk keeps an
 * input stream of its own; on the others 1F1B holds P-r whole stages, so the V's extra
 * micro-batches stay under 1F1B's rank 0. That greedy gives the paper's (P-1)/(6M+P-1) when
 * P divides M (4.0% at pp 2 M 4, 5.9% at pp 4 M 8; 1F1B 20% and 27%), but not always
 * otherwise, so variants run beside it (ZBV_LEAN: P-1 on every second chunk; ZBV_FIRST: the
 * first chunk's forward first) and the lists with the smallest simulated bubble are kept, the
 * earliest on a tie: never more than the paper's caps, and never above 1F1B's bubble
 * (tests/test_schedule.c). Each runs first with the input part a hair longer than the others,
 * which only orders events that fall at one instant in unit time: the rank that ran an input
 * part decides after the ones that ran a forward or a weight part. Its lists have the same
 * bubble in unit time where P divides M, and they keep it when the parts' lengths differ: on
 * this machine's CPU (forward 7.6 ms, input part 8.4, weight part 6.9) they leave 4.8% idle at
 * pp 2 M 4 where the lists of equal parts (ZBV_EVEN, tried after) left 6.6%. */
enum { ZBV_LEAN = 1, ZBV_FIRST = 2, ZBV_EVEN = 4, ZBV_VARIANTS = 8 };

static void zbv_caps(int P, int M, int r, int variant, int *cap_first, int *cap_second) {
    /* the first chunk's micro-batches live from its forward down and up the V to its backward;
       the second chunk's only from r ranks below the turn and back */
    *cap_first = min_int(P, M);
    *cap_second = min_int(r == 0 || (variant & ZBV_LEAN) ? P - 1 : P, M);
}

static int gen_zbv(tr_pp_schedule *s, int variant) {
    int P = s->P, M = s->M, C = 2 * P;
    /* an input part a hair longer than a unit (ZBV_EVEN: exactly one): 3MC hairs stay under
       a unit, so the order is the unit greedy's but where two events fell at one instant */
    long unit = variant & ZBV_EVEN ? 1 : 4L * M * C, dur_b = variant & ZBV_EVEN ? 1 : unit + 1;
    /* end times of each part of (mb, chunk), -1 not run */
    long *tf = malloc((size_t)(M * C) * sizeof(long)), *tb = malloc((size_t)(M * C) * sizeof(long));
    int nf[TR_PP_MAX_CHUNKS] = {0}, nb[TR_PP_MAX_CHUNKS] = {0}, held[TR_PP_MAX_CHUNKS] = {0};
    int cap[TR_PP_MAX_CHUNKS];
    int *wq = malloc((size_t)(P * C * M) * sizeof(int)); /* per rank: pending W's, (mb, chunk) */
    int wh[TR_PP_MAX_RANKS] = {0}, wt[TR_PP_MAX_RANKS] = {0}, most[TR_PP_MAX_RANKS] = {0};
    long free_at[TR_PP_MAX_RANKS] = {0};
    if (!tf || !tb || !wq) {
        free(tf), free(tb), free(wq);
        return -1;
    }
    for (int i = 0; i < M * C; i++)
        tf[i] = tb[i] = -1;
    for (int r = 0; r < P; r++)
        zbv_caps(P, M, r, variant, &cap[r], &cap[C - 1 - r]);
    int left = 3 * M * C;
    /* at each instant a rank is free, it decides; then time moves to the next instant one is
       (a cap never blocks every rank: one at its cap has a weight or an input part due) */
    for (long t = 0; left > 0;) {
        for (int r = 0; r < P; r++) {
            if (free_at[r] > t) continue;
            int ch[2] = {C - 1 - r, r}; /* the second chunk first */
            if (variant & ZBV_FIRST) ch[0] = r, ch[1] = C - 1 - r;
            int bb = -1, fb = -1;
            long bb_ready = 0;
            for (int k = 0; k < 2; k++) { /* the input gradient ready longest */
                int c = ch[k], mb = nb[c];
                if (mb >= M || tf[mb * C + c] < 0 || tf[mb * C + c] > t) continue;
                long ready = c == C - 1 ? tf[mb * C + c] : tb[mb * C + c + 1];
                if (ready < 0 || ready > t) continue;
                if (bb < 0 || ready < bb_ready) bb = c, bb_ready = ready;
            }
            for (int k = 0; k < 2 && fb < 0; k++) {
                int c = ch[k], mb = nf[c];
                if (mb >= M || held[c] >= cap[c]) continue;
                if (c > 0 && (tf[mb * C + c - 1] < 0 || tf[mb * C + c - 1] > t)) continue;
                fb = c;
            }
            if (bb >= 0) {
                int mb = nb[bb]++;
                tb[mb * C + bb] = free_at[r] = t + dur_b;
                push(s, r, TR_ACT_BWD_IN, mb, bb);
                wq[(r * C * M) + wt[r]++] = mb * C + bb;
                left--;
            } else if (fb >= 0) {
                int mb = nf[fb]++;
                tf[mb * C + fb] = free_at[r] = t + unit;
                push(s, r, TR_ACT_FWD, mb, fb);
                held[fb]++;
                if (held[C - 1 - r] + held[r] > most[r]) most[r] = held[C - 1 - r] + held[r];
                left--;
            } else if (wh[r] < wt[r]) { /* a W can run only after its B: it is in the queue */
                int x = wq[r * C * M + wh[r]++];
                push(s, r, TR_ACT_BWD_W, x / C, x % C);
                free_at[r] = t + unit;
                held[x % C]--;
                left--;
            }
        }
        long next = -1; /* the next instant a rank is free; none busy: nothing can move */
        for (int r = 0; r < P; r++)
            if (free_at[r] > t && (next < 0 || free_at[r] < next)) next = free_at[r];
        if (next < 0) break;
        t = next;
    }
    for (int r = 0; r < P; r++)
        s->max_inflight[r] = most[r];
    free(tf), free(tb), free(wq);
    return left > 0 ? -1 : 0;
}

/* ZB-V's variants (above), the one with the smallest bubble left in s (kind, P, V, M set); the
 * first alone where it reaches the paper's bubble (P divides M: no list does better in unit
 * time, and the planner meets many (P, M)). */
static int gen_zbv_best(tr_pp_schedule *s) {
    tr_pp_schedule t = *s;
    double best = 2, paper = (s->P - 1.0) / (6.0 * s->M + s->P - 1.0);
    for (int v = 0; v < ZBV_VARIANTS && best > paper + 1e-12; v++) {
        for (int r = 0; r < t.P; r++)
            if (!(t.list[r] = malloc((size_t)(6 * t.M) * sizeof(tr_pp_action)))) {
                tr_pp_free(&t);
                tr_pp_free(s);
                return -1;
            }
        double b = gen_zbv(&t, v) ? -1 : tr_pp_bubble(&t);
        if (b >= 0 && b < best - 1e-12) {
            best = b;
            tr_pp_free(s);
            *s = t;
        } else
            tr_pp_free(&t);
        t = (tr_pp_schedule){.kind = s->kind, .P = s->P, .V = s->V, .M = s->M};
    }
    return best < 2 ? 0 : -1;
}

int tr_pp_generate(tr_pp_schedule *s, tr_pp_kind k, int P, int V, int M) {
    memset(s, 0, sizeof(*s));
    s->kind = k;
    s->P = P;
    s->V = V;
    s->M = M;
    int per_rank = V * M * (split_kind(k) ? 3 : 2);
    if (k == TR_PP_ZBV) return gen_zbv_best(s);
    for (int r = 0; r < P; r++) {
        s->list[r] = malloc((size_t)per_rank * sizeof(tr_pp_action));
        if (!s->list[r]) {
            tr_pp_free(s);
            return -1;
        }
        switch (k) {
        case TR_PP_GPIPE:
            gen_gpipe(s, r);
            break;
        case TR_PP_1F1B:
            gen_1f1b(s, r);
            break;
        case TR_PP_INTERLEAVED:
            gen_interleaved(s, r);
            break;
        case TR_PP_ZBH1:
            gen_zbh1(s, r);
            break;
        case TR_PP_ZBV:
            break;
        }
    }
    return 0;
}

void tr_pp_free(tr_pp_schedule *s) {
    if (!s) return;
    for (int r = 0; r < TR_PP_MAX_RANKS; r++) {
        free(s->list[r]);
        s->list[r] = NULL;
        s->n[r] = 0;
    }
}

/* Whether an action releases its micro-batch's activations: the whole backward, or the weight
 * part (the input part still needs them). */
static int releases(int op) {
    return op == TR_ACT_BWD || op == TR_ACT_BWD_W;
}

int tr_pp_chunk_slots(const tr_pp_schedule *s, int chunk) {
    if (s->P < 1 || chunk < 0 || chunk >= s->P * s->V) return 0;
    int r = tr_pp_rank_of(s, chunk), held = 0, most = 0;
    for (int i = 0; i < s->n[r]; i++) {
        const tr_pp_action *a = &s->list[r][i];
        if (a->chunk != chunk) continue;
        if (a->op == TR_ACT_FWD && ++held > most) most = held;
        if (releases(a->op)) held--;
    }
    return most;
}

/* The most input gradients of chunk c + 1 run before chunk c's of the same micro-batch, both
 * on rank r (zb-v's turn): the buffers between them. */
static int turn_bufs(const tr_pp_schedule *s, int r, int c) {
    int ahead = 0, most = 1;
    for (int i = 0; i < s->n[r]; i++) {
        const tr_pp_action *a = &s->list[r][i];
        if (a->op != TR_ACT_BWD_IN) continue;
        if (a->chunk == c + 1 && ++ahead > most) most = ahead;
        if (a->chunk == c) ahead--;
    }
    return most;
}

void tr_pp_grad_bufs(const tr_pp_schedule *s, int chunk, int *recv, int *send) {
    *recv = *send = 0;
    if (s->kind != TR_PP_ZBV || chunk < 0 || chunk >= s->P * s->V) return;
    int r = tr_pp_rank_of(s, chunk), C = s->P * s->V;
    *recv = chunk + 1 < C && tr_pp_rank_of(s, chunk + 1) == r ? turn_bufs(s, r, chunk) : 1;
    *send = chunk > 0 && tr_pp_rank_of(s, chunk - 1) == r ? turn_bufs(s, r, chunk - 1) : 1;
}

/* ---- simulation ------------------------------------------------------------------------ */

/* What the simulation knows of one (micro-batch, chunk): how often each part appears in the
 * lists, and when each finished in simulated time (-1: not yet). "in" is the part the previous
 * chunk waits for: the whole backward, or zb-h1's input gradient. */
typedef struct {
    unsigned char n_fwd, n_in, n_w;
    double t_fwd, t_in, t_w;
} pair_state;

static const char *op_name(int op) {
    switch (op) {
    case TR_ACT_FWD:
        return "forward";
    case TR_ACT_BWD:
        return "backward";
    case TR_ACT_BWD_IN:
        return "input gradient";
    case TR_ACT_BWD_W:
        return "weight gradient";
    }
    return "unknown action";
}

static double op_cost(int op) {
    return op == TR_ACT_BWD ? 2.0 : 1.0;
}

static pair_state *pair_of(const tr_pp_schedule *s, pair_state *st, const tr_pp_action *a) {
    return &st[(size_t)a->mb * (size_t)(s->P * s->V) + (size_t)a->chunk];
}

/* Whether action i of rank r is well formed, and count it: an op of this kind of schedule, on
 * the rank that holds the chunk, after the parts it needs on this rank, not repeated, and
 * within the rank's promise of activations held (*held). */
static int check_action(const tr_pp_schedule *s, pair_state *st, int r, int i, int *held, char *err,
                        size_t errlen) {
    const tr_pp_action *a = &s->list[r][i];
    int split = split_kind(s->kind), op = a->op;
    int op_ok = op == TR_ACT_FWD || op == (split ? TR_ACT_BWD_IN : TR_ACT_BWD) ||
                (split && op == TR_ACT_BWD_W);
    const char *what = NULL;
    if (!op_ok) {
        snprintf(err, errlen, "rank %d, action %d: %s (op %d) does not belong in a \"%s\" schedule",
                 r, i, op_name(op), op, tr_pp_kind_name(s->kind));
        return -1;
    }
    if (a->mb < 0 || a->mb >= s->M || a->chunk < 0 || a->chunk >= s->P * s->V) {
        snprintf(err, errlen,
                 "rank %d, action %d: %s of (mb %d, chunk %d) is out of range "
                 "(%d micro-batches, %d chunks)",
                 r, i, op_name(op), a->mb, a->chunk, s->M, s->P * s->V);
        return -1;
    }
    if (tr_pp_rank_of(s, a->chunk) != r) {
        snprintf(err, errlen, "rank %d, action %d: %s of (mb %d, chunk %d) belongs to rank %d", r,
                 i, op_name(op), a->mb, a->chunk, tr_pp_rank_of(s, a->chunk));
        return -1;
    }
    pair_state *p = pair_of(s, st, a);
    unsigned char *count = op == TR_ACT_FWD ? &p->n_fwd : op == TR_ACT_BWD_W ? &p->n_w : &p->n_in;
    if (*count)
        what = "repeated";
    else if (op != TR_ACT_FWD && !p->n_fwd)
        what = "before its forward";
    else if (op == TR_ACT_BWD_W && !p->n_in)
        what = "before its input gradient";
    if (what) {
        snprintf(err, errlen, "rank %d, action %d: %s of (mb %d, chunk %d) %s", r, i, op_name(op),
                 a->mb, a->chunk, what);
        return -1;
    }
    (*count)++;
    *held += op == TR_ACT_FWD ? 1 : releases(op) ? -1 : 0;
    if (*held > s->max_inflight[r]) {
        snprintf(err, errlen,
                 "rank %d, action %d: forward of (mb %d, chunk %d) holds %d "
                 "micro-batches, more than the promised max_inflight %d",
                 r, i, a->mb, a->chunk, *held, s->max_inflight[r]);
        return -1;
    }
    return 0;
}

/* Every (micro-batch, chunk) has its forward and its backward (or both backward parts). */
static int check_complete(const tr_pp_schedule *s, const pair_state *st, char *err, size_t errlen) {
    int C = s->P * s->V, split = split_kind(s->kind);
    for (int mb = 0; mb < s->M; mb++)
        for (int c = 0; c < C; c++) {
            const pair_state *p = &st[(size_t)mb * (size_t)C + (size_t)c];
            int op = !p->n_fwd          ? TR_ACT_FWD
                     : !p->n_in         ? (split ? TR_ACT_BWD_IN : TR_ACT_BWD)
                     : split && !p->n_w ? TR_ACT_BWD_W
                                        : -1;
            if (op >= 0) {
                snprintf(err, errlen, "rank %d has no %s of (mb %d, chunk %d)", tr_pp_rank_of(s, c),
                         op_name(op), mb, c);
                return -1;
            }
        }
    return 0;
}

/* The static checks: every list on its own, then the lists together. */
static int check_lists(const tr_pp_schedule *s, pair_state *st, char *err, size_t errlen) {
    for (int r = 0; r < s->P; r++) {
        int held = 0;
        for (int i = 0; i < s->n[r]; i++)
            if (check_action(s, st, r, i, &held, err, errlen)) return -1;
    }
    return check_complete(s, st, err, errlen);
}

/* Whether action a can start: 1 with *ready_at the time its last dependency finished, or 0
 * with *dep the first action it still waits for. Dependencies on its own rank come earlier in
 * the list (check_lists), so only another chunk's part can be missing. */
static int can_start(const tr_pp_schedule *s, pair_state *st, const tr_pp_action *a,
                     double *ready_at, tr_pp_action *dep) {
    const pair_state *p = pair_of(s, st, a);
    int C = s->P * s->V, in_op = split_kind(s->kind) ? TR_ACT_BWD_IN : TR_ACT_BWD;
    double t = 0;
    if (a->op == TR_ACT_FWD && a->chunk > 0) {
        *dep = (tr_pp_action){.op = TR_ACT_FWD, .mb = a->mb, .chunk = a->chunk - 1};
        t = pair_of(s, st, dep)->t_fwd;
    } else if (a->op != TR_ACT_FWD && a->op != TR_ACT_BWD_W && a->chunk < C - 1) {
        *dep = (tr_pp_action){.op = (unsigned char)in_op, .mb = a->mb, .chunk = a->chunk + 1};
        t = pair_of(s, st, dep)->t_in;
    }
    if (t < 0) return 0;
    /* zb-v: an input part that overwrites its send buffer waits until the micro-batch sent
       from it before is received: that receive is posted after the receiving chunk's input
       part of the micro-batch its receive buffer held before (tr_pp_grad_bufs) */
    if (s->kind == TR_PP_ZBV && a->op == TR_ACT_BWD_IN && a->chunk > 0 &&
        tr_pp_rank_of(s, a->chunk - 1) != tr_pp_rank_of(s, a->chunk)) {
        int gr, gs, unused;
        tr_pp_grad_bufs(s, a->chunk, &unused, &gs);
        tr_pp_grad_bufs(s, a->chunk - 1, &gr, &unused);
        int mb = a->mb - gs - gr;
        if (mb >= 0) {
            tr_pp_action d = {.op = TR_ACT_BWD_IN, .mb = mb, .chunk = a->chunk - 1};
            double tr = pair_of(s, st, &d)->t_in;
            if (tr < 0) {
                *dep = d;
                return 0;
            }
            if (tr > t) t = tr;
        }
    }
    /* the same rank's earlier part: done, but it may finish later than the other chunk's */
    double own = a->op == TR_ACT_FWD ? 0 : a->op == TR_ACT_BWD_W ? p->t_in : p->t_fwd;
    *ready_at = t > own ? t : own;
    return 1;
}

/* "deadlock: rank 0 waits for the backward of (mb 0, chunk 1) on rank 1; rank 1 ..." */
static void describe_deadlock(const tr_pp_schedule *s, pair_state *st, const int *pos, char *err,
                              size_t errlen) {
    size_t len = (size_t)snprintf(err, errlen, "deadlock:");
    const char *sep = "";
    for (int r = 0; r < s->P && len < errlen; r++) {
        if (pos[r] == s->n[r]) continue;
        const tr_pp_action *a = &s->list[r][pos[r]];
        tr_pp_action dep;
        double t;
        if (can_start(s, st, a, &t, &dep)) continue;
        len += (size_t)snprintf(err + len, errlen - len,
                                "%s rank %d (action %d, %s of mb %d chunk %d) waits for the %s "
                                "of (mb %d, chunk %d) on rank %d",
                                sep, r, pos[r], op_name(a->op), a->mb, a->chunk, op_name(dep.op),
                                dep.mb, dep.chunk, tr_pp_rank_of(s, dep.chunk));
        sep = ";";
    }
}

/* Run the lists in simulated time: each rank takes its actions strictly in order, an action
 * starts when the rank is free and its dependencies have finished. Any order of visiting the
 * ranks gives the same times, since an action's start depends only on finished actions. */
static int run_lists(const tr_pp_schedule *s, pair_state *st, double *makespan, double **ends,
                     char *err, size_t errlen) {
    int pos[TR_PP_MAX_RANKS] = {0}, progress = 1;
    double free_at[TR_PP_MAX_RANKS] = {0};
    while (progress) {
        progress = 0;
        for (int r = 0; r < s->P; r++) {
            double ready_at;
            tr_pp_action dep;
            while (pos[r] < s->n[r] && can_start(s, st, &s->list[r][pos[r]], &ready_at, &dep)) {
                const tr_pp_action *a = &s->list[r][pos[r]++];
                pair_state *p = pair_of(s, st, a);
                double end = (free_at[r] > ready_at ? free_at[r] : ready_at) + op_cost(a->op);
                *(a->op == TR_ACT_FWD     ? &p->t_fwd
                  : a->op == TR_ACT_BWD_W ? &p->t_w
                                          : &p->t_in) = end;
                free_at[r] = end;
                if (ends) ends[r][pos[r] - 1] = end;
                progress = 1;
            }
        }
    }
    for (int r = 0; r < s->P; r++)
        if (pos[r] < s->n[r]) {
            describe_deadlock(s, st, pos, err, errlen);
            return -1;
        }
    for (int r = 0; makespan && r < s->P; r++)
        makespan[r] = free_at[r];
    return 0;
}

int tr_pp_simulate(const tr_pp_schedule *s, double *makespan, char *err, size_t errlen) {
    if (s->P < 1 || s->P > TR_PP_MAX_RANKS || s->V < 1 || s->M < 1) {
        snprintf(err, errlen,
                 "schedule of pp %d, virtual_stages %d, microbatches %d: not "
                 "generated",
                 s->P, s->V, s->M);
        return -1;
    }
    size_t n = (size_t)s->M * (size_t)(s->P * s->V);
    pair_state *st = calloc(n, sizeof(*st));
    if (!st) {
        snprintf(err, errlen, "out of memory simulating the pipeline schedule");
        return -1;
    }
    int rc = check_lists(s, st, err, errlen);
    for (size_t i = 0; i < n; i++)
        st[i].t_fwd = st[i].t_in = st[i].t_w = -1;
    if (!rc) rc = run_lists(s, st, makespan, NULL, err, errlen);
    free(st);
    return rc;
}

static int cmp_event(const void *a, const void *b) {
    const double *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

double tr_pp_span_shared(const tr_pp_schedule *s, const double *load) {
    size_t n = (size_t)s->M * (size_t)(s->P * s->V), total = 0;
    if (s->P < 1 || s->P > TR_PP_MAX_RANKS) return -1;
    for (int r = 0; r < s->P; r++)
        total += (size_t)s->n[r];
    pair_state *st = calloc(n, sizeof(*st));
    double *end = calloc(total, sizeof(double)), *ev = calloc(2 * total, 2 * sizeof(double));
    double *ends[TR_PP_MAX_RANKS], span = -1;
    char err[256];
    if (!st || !end || !ev) goto out;
    for (size_t i = 0; i < n; i++)
        st[i].t_fwd = st[i].t_in = st[i].t_w = -1;
    for (int r = 0, at = 0; r < s->P; at += s->n[r], r++)
        ends[r] = end + at;
    if (check_lists(s, st, err, sizeof err) || run_lists(s, st, NULL, ends, err, sizeof err))
        goto out;
    /* each action: +load at its start, -load at its end; a sweep in time order */
    size_t k = 0;
    for (int r = 0; r < s->P; r++)
        for (int i = 0; i < s->n[r]; i++) {
            double e = ends[r][i], b = e - op_cost(s->list[r][i].op);
            ev[2 * k] = b, ev[2 * k + 1] = load[r], k++;
            ev[2 * k] = e, ev[2 * k + 1] = -load[r], k++;
        }
    qsort(ev, k, 2 * sizeof(double), cmp_event);
    double demand = 0, t = 0;
    span = 0;
    for (size_t i = 0; i < k; i++) {
        span += (ev[2 * i] - t) * (demand > 1 ? demand : 1);
        t = ev[2 * i];
        demand += ev[2 * i + 1];
    }
out:
    free(st);
    free(end);
    free(ev);
    return span;
}

double tr_pp_bubble(const tr_pp_schedule *s) {
    double span[TR_PP_MAX_RANKS], end = 0;
    char err[256];
    if (tr_pp_simulate(s, span, err, sizeof(err))) return -1;
    for (int r = 0; r < s->P; r++)
        if (span[r] > end) end = span[r];
    return 1.0 - 3.0 * s->V * s->M / end;
}
