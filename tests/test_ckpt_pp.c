/* Checkpoints with pipeline parallelism. Every rank of a layout (dp x pp x tp, virtual stages
 * per stage, ZeRO stage) builds its part of a GPT-shaped model (tied head) and a Llama-shaped
 * one (untied, rmsnorm, swiglu, kv_heads < heads), both of 4 blocks, cut into chunks: a stage's
 * model holds only its chunks' tensors. Each rank sets its parameters and AdamW moments to
 * values derived from each global tensor's name and element index (the last stage's copy of
 * a tied embedding to other values: it must not be written) and saves. Every checkpoint is
 * loaded into every layout (pp 2 -> 1 process, pp 4 -> pp 2, tp 2 x pp 2 -> 1 process,
 * pp 2 -> tp 2, 1 process -> pp 2, ...) and every element a rank keeps is compared bitwise,
 * the copy of the tied embedding included; the Hugging Face export of each checkpoint must be
 * the single process's byte for byte, and importing it into a stage must work. A save where a
 * stage writes nothing, and a checkpoint missing a stage's file, are refused with one line.
 * Under mpirun -np 2 and -np 4; alone, one process plays every rank of the pipeline-only
 * layouts in turn (the writers share a folder, nothing else). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl/recipe.h"
#include "model/model.h"
#include "parallel/comm/comm.h"
#include "parallel/dp.h"
#include "trainer/checkpoint/checkpoint.h"

static int g_fail, g_me, g_world;
static tr_comm *g_comm;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        g_fail++;                                                                                  \
        printf("FAIL rank %d: ", g_me);                                                            \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
    } while (0)

static const char gpt[] =
    "model { vocab = 130, dim = 32, seq_len = 16, embedding {}, positions {},\n"
    "  stack { n = 4, residual { layernorm {}, attention { heads = 4 } },\n"
    "                 residual { layernorm {}, mlp { hidden = 64 } } },\n"
    "  layernorm {}, lm_head {} }\n"
    "data { text = 'x' } train { batch_tokens = 32, steps = 1 }\n";

static const char llama[] =
    "model { vocab = 200, dim = 32, seq_len = 16, embedding {}, rope { theta = 10000 },\n"
    "  stack { n = 4, residual { rmsnorm {}, attention { heads = 4, kv_heads = 2, "
    "bias = false } },\n"
    "    residual { rmsnorm {}, mlp { hidden = 48, activation = 'swiglu', bias = false } } },\n"
    "  rmsnorm {}, lm_head { tied = false } }\n"
    "data { text = 'x' } train { batch_tokens = 32, steps = 1 }\n";

typedef struct {
    const char *name, *recipe;
    int pad_vocab;
} model_case;

static const model_case cases[] = {{"gpt", gpt, 64}, {"llama", llama, 32}};
#define N_CASES (int)(sizeof(cases) / sizeof(cases[0]))

/* v: chunks per stage (virtual stages; stage p holds chunks p, p + pp, ...). */
typedef struct {
    int dp, pp, tp, zero, v;
} layout;

static int lsize(const layout *l) {
    return l->dp * l->pp * l->tp;
}

static void layout_name(char *buf, size_t n, const layout *l) {
    if (lsize(l) == 1 && l->v == 1)
        snprintf(buf, n, "one process");
    else
        snprintf(buf, n, "dp %d x pp %d%s x tp %d ZeRO-%d", l->dp, l->pp,
                 l->v > 1 ? " (2 chunks each)" : "", l->tp, l->zero);
}

/* One rank's part of a layout: its model, data-parallel runtime and groups. */
typedef struct {
    tr_model *m;
    tr_dp *d;
    tr_comm *dpc, *ppc, *tpc;
} part;

static void unbuild(part *pt) {
    tr_dp_free(pt->d);
    tr_model_free(pt->m);
    tr_comm_free(pt->dpc);
    tr_comm_free(pt->ppc);
    tr_comm_free(pt->tpc);
    memset(pt, 0, sizeof(*pt));
}

/* The virtual ranks this process plays in layout l: [*lo, *hi). Under MPI its own rank, if the
 * layout has it; alone, every rank of a layout without dp or tp (those need real groups). */
static void played(const layout *l, int *lo, int *hi) {
    if (g_world == 1) {
        *lo = 0;
        *hi = l->dp == 1 && l->tp == 1 ? lsize(l) : 0;
    } else {
        *lo = g_me;
        *hi = g_me < lsize(l) ? g_me + 1 : g_me;
    }
}

/* The groups of l over the world (every rank of the world calls it: the layout's first
 * lsize ranks get the mesh, the others nothing). Alone: no groups. */
static int make_groups(part *pt, const layout *l) {
    char err[512];
    memset(pt, 0, sizeof(*pt));
    if (g_world == 1) return 0;
    tr_comm *sub = NULL;
    int in = g_me < lsize(l);
    int rc = tr_comm_split(g_comm, in ? 0 : 1, g_me, "layout", &sub, err, sizeof(err));
    if (!rc && in)
        rc = tr_comm_mesh(sub, (tr_mesh){l->dp, l->pp, l->tp}, &pt->dpc, &pt->ppc, &pt->tpc, err,
                          sizeof(err));
    tr_comm_free(sub);
    if (rc) FAIL("groups: %s", err);
    return rc;
}

/* Rank r's model of layout l (groups already made: pt from make_groups). */
static int build(part *pt, const tr_recipe *r, const model_case *mc, const layout *l, int rank) {
    char err[512];
    int t = rank % l->tp, p = rank / l->tp % l->pp, d = rank / (l->tp * l->pp);
    tr_model_opts o = {.B = 1,
                       .T = 16,
                       .pad_vocab = mc->pad_vocab,
                       .shards = l->zero == 1 ? l->dp : 1,
                       .shard = d,
                       .external_grads = l->zero >= 2,
                       .external_params = l->zero == 3,
                       .tp = l->tp,
                       .tp_rank = t,
                       .tp_comm = l->tp > 1 ? pt->tpc : NULL};
    int nc = l->pp * l->v, blocks = tr_cost_blocks(&r->model, 16, NULL, 0);
    if (nc > 1) { /* pp_comm and tie_comm: only the gradient sums use them */
        o.n_chunks = nc;
        for (int c = 0; c <= nc; c++)
            o.chunk_start[c] = c * blocks / nc;
        for (int c = 0; c < nc; c++) {
            o.held[c] = c % l->pp == p;
            o.slots[c] = 1;
        }
    }
    if (tr_model_init_opts(&pt->m, &r->model, tr_backend_cpu(), &o, err, sizeof(err)) ||
        (pt->dpc && tr_dp_init(&pt->d, pt->m, pt->dpc, l->zero, 2048, err, sizeof(err)))) {
        FAIL("%s: building rank %d's model: %s", mc->name, rank, err);
        unbuild(pt);
        return -1;
    }
    return 0;
}

/* The value of element g of global tensor `name` (kind -1: parameters, 0, 1: AdamW m, v) of
 * model case mc; `other` gives different values (the copy of a tied embedding). */
static float ref_value(int mc, int kind, const char *name, size_t g, int other) {
    uint64_t h = 1469598103934665603u;
    for (const char *s = name; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211u;
    h ^= ((uint64_t)mc * 1000003u + (uint64_t)(kind + 1 + 4 * other)) * 0x9E3779B97F4A7C15u ^
         g * 0xBF58476D1CE4E5B9u;
    h ^= h >> 31;
    h *= 0x94D049BB133111EBu;
    h ^= h >> 29;
    float x = (float)(h >> 40) / 16777216.0f - 0.5f;
    return kind == 1 ? x * x : x * (float)(1 + (h & 7)); /* v >= 0 */
}

/* The expected local tensor p of kind `kind` (all numel elements) into out. */
static void expected(const tr_param *p, int mc, int kind, int other, float *out) {
    int n = tr_param_runs(p, 0, p->numel, NULL, 0);
    tr_run *run = malloc((size_t)(n + 1) * sizeof(tr_run));
    tr_param_runs(p, 0, p->numel, run, n);
    for (int k = 0; k < n; k++)
        for (size_t j = 0; j < run[k].n; j++)
            out[run[k].local + j] = ref_value(mc, kind, p->name, run[k].global + j, other);
    free(run);
}

/* Parameters (through the global tensor), AdamW moments and step count: the reference's,
 * except on the last stage's copy of a tied embedding (which a checkpoint must not take). */
static void set_values(tr_model *m, int mc) {
    for (int i = 0; i < tr_model_num_params(m); i++) {
        const tr_param *p = tr_model_param(m, i);
        size_t gn = (size_t)p->gshape[0] * (size_t)p->gshape[1];
        float *g = malloc((gn + 1) * sizeof(float)), *loc = malloc((p->numel + 1) * sizeof(float));
        for (size_t j = 0; j < gn; j++)
            g[j] = ref_value(mc, -1, p->name, j, p->pp_copy);
        tr_model_set_param_global(m, i, g);
        for (int k = 0; k < 2; k++) {
            expected(p, mc, k, p->pp_copy, loc);
            tr_model_set_state(m, i, (tr_state_kind)k, loc);
        }
        free(g);
        free(loc);
    }
    tr_model_set_adam_steps(m, 7);
}

/* Every element this rank keeps of every tensor (with_state: and moment, and the step count)
 * against the reference, bitwise; one line per differing tensor. *copies: tensors checked
 * that are the last stage's copy of a tied embedding. */
static int check_values(tr_model *m, int mc, int with_state, const char *what, int *copies) {
    int bad = 0;
    for (int i = 0; i < tr_model_num_params(m); i++) {
        const tr_param *p = tr_model_param(m, i);
        float *want = malloc((p->numel + 1) * sizeof(float)), *got = malloc((p->numel + 1) * 4);
        *copies += p->pp_copy;
        for (int kind = -1; kind <= (with_state ? 1 : -1); kind++) {
            expected(p, mc, kind, 0, want);
            int n = tr_model_held_parts(m, i, kind, NULL, NULL, 0);
            size_t *lo = malloc(2 * (size_t)(n + 1) * sizeof(size_t)), *hi = lo + n + 1;
            tr_model_held_parts(m, i, kind, lo, hi, n);
            for (int j = 0; j < n; j++) {
                size_t a = p->offset + lo[j], b = p->offset + hi[j];
                if (tr_model_read_range(m, kind, a, b, got + lo[j]) ||
                    memcmp(got + lo[j], want + lo[j], (hi[j] - lo[j]) * sizeof(float))) {
                    FAIL("%s: %s%s%s differs in local elements [%zu, %zu)", what,
                         kind < 0 ? ""
                         : kind   ? "adam_v/"
                                  : "adam_m/",
                         p->name, p->pp_copy ? " (the last stage's copy)" : "", lo[j], hi[j]);
                    bad++;
                    break;
                }
            }
            free(lo);
        }
        free(want);
        free(got);
    }
    if (with_state && tr_model_adam_steps(m) != 7) {
        FAIL("%s: AdamW step count %ld, expected 7", what, tr_model_adam_steps(m));
        bad++;
    }
    return bad;
}

static void ckpt_dir(char *buf, size_t n, const char *root, int mc, const layout *l) {
    snprintf(buf, n, "%s/%s_dp%d_pp%d_v%d_tp%d_z%d", root, cases[mc].name, l->dp, l->pp, l->v,
             l->tp, l->zero);
}

/* Every rank of l saves its part into out; `skip` (>= 0): that rank writes nothing (an empty
 * range list). The writers start in rank order (rank 0 clears old saves at its start) and
 * save in reverse (alone, rank 0's save waits for the others' lists). Returns rank 0's
 * error (or "" when it succeeded or this process does not play rank 0) in err0. */
static void save_to(const tr_recipe *r, int mc, const layout *l, const char *out, int skip,
                    char *err0, size_t errlen) {
    int lo, hi;
    played(l, &lo, &hi);
    part pts[8] = {{0}};
    tr_ckpt_writer *w[8] = {0};
    size_t *ranges[8] = {0};
    char err[1024];
    err0[0] = 0;
    if (make_groups(&pts[0], l)) return;
    for (int k = lo; k < hi; k++) {
        part *pt = &pts[k - lo];
        if (k > lo) *pt = (part){0};
        if (build(pt, r, &cases[mc], l, k)) continue;
        set_values(pt->m, mc);
        int n_ranges = pt->d ? tr_dp_ckpt_ranges(pt->d, &ranges[k - lo]) : 0;
        static const size_t none[2] = {0, 0};
        tr_ckpt_opts o = {.out = out,
                          .keep = 1,
                          .rank = k,
                          .world = lsize(l),
                          .ranges = k == skip ? none : ranges[k - lo],
                          .n_ranges = k == skip ? 0 : n_ranges,
                          .dp = l->dp,
                          .tp = l->tp,
                          .pp = l->pp,
                          .zero = l->zero,
                          .timeout_s = 60,
                          .sync = 1};
        if (tr_ckpt_writer_init(&w[k - lo], pt->m, r, &o, err, sizeof(err)))
            FAIL("%s: writer of rank %d: %s", cases[mc].name, k, err);
    }
    tr_comm_barrier(g_comm); /* every writer is up */
    for (int k = hi - 1; k >= lo; k--) {
        if (!w[k - lo]) continue;
        tr_ckpt_save(w[k - lo], 1, NULL, NULL);
        if (tr_ckpt_wait(w[k - lo], err, sizeof(err)) && k == 0) snprintf(err0, errlen, "%s", err);
        tr_ckpt_writer_free(w[k - lo]);
    }
    tr_comm_barrier(g_comm); /* rank 0 has published it */
    for (int k = lo; k < hi; k++) {
        free(ranges[k - lo]);
        unbuild(&pts[k - lo]);
    }
    if (hi == lo) unbuild(&pts[0]);
}

static void save(const tr_recipe *r, int mc, const layout *l, const char *root) {
    char out[600], err[1024], name[64];
    ckpt_dir(out, sizeof(out), root, mc, l);
    layout_name(name, sizeof(name), l);
    save_to(r, mc, l, out, -1, err, sizeof(err));
    if (err[0]) FAIL("%s: saving from %s: %s", cases[mc].name, name, err);
}

/* Every rank of `to` loads the checkpoint saved from `from` and checks what it keeps. */
static void load(const tr_recipe *r, int mc, const layout *from, const layout *to,
                 const char *root) {
    char dir[600], err[1024], a[64], b[64], what[256];
    ckpt_dir(dir, sizeof(dir), root, mc, from);
    layout_name(a, sizeof(a), from);
    layout_name(b, sizeof(b), to);
    snprintf(what, sizeof(what), "%s from %s into %s", cases[mc].name, a, b);
    int lo, hi, fails = g_fail, copies = 0;
    played(to, &lo, &hi);
    part pts[8];
    if (make_groups(&pts[0], to)) return;
    for (int k = lo; k < hi; k++) {
        part *pt = &pts[k - lo];
        if (k > lo) *pt = (part){0};
        if (build(pt, r, &cases[mc], to, k)) continue;
        tr_model_init_params(pt->m, 12345); /* anything but the reference */
        tr_ckpt c;
        if (tr_ckpt_find_resume(dir, &c, 1, NULL, err, sizeof(err))) {
            FAIL("%s: %s", what, err);
        } else {
            if (tr_ckpt_apply(&c, pt->m, err, sizeof(err)))
                FAIL("%s: rank %d: %s", what, k, err);
            else
                check_values(pt->m, mc, 1, what, &copies);
            tr_ckpt_free(&c);
        }
        unbuild(pt);
    }
    if (hi == lo) unbuild(&pts[0]);
    long long x[2] = {g_fail - fails, copies}; /* over the layout's ranks */
    tr_comm_all_reduce(g_comm, x, 2, TR_COMM_I64);
    if (g_me == 0 && (hi > lo || g_world > 1) && !x[0])
        printf("ok   %s: every tensor and AdamW moment bitwise%s\n", what,
               x[1] ? ", the last stage's copy of the tied embedding too" : "");
}

/* Every rank of `to` imports the single process's Hugging Face export. */
static void hf_import(const tr_recipe *r, int mc, const layout *to, const char *root,
                      const layout *one) {
    char hf[700], err[1024], name[64];
    ckpt_dir(hf, sizeof(hf), root, mc, one);
    snprintf(hf + strlen(hf), sizeof(hf) - strlen(hf), "/hf");
    layout_name(name, sizeof(name), to);
    int lo, hi, fails = g_fail, copies = 0;
    played(to, &lo, &hi);
    part pts[8];
    if (make_groups(&pts[0], to)) return;
    for (int k = lo; k < hi; k++) {
        part *pt = &pts[k - lo];
        if (k > lo) *pt = (part){0};
        if (build(pt, r, &cases[mc], to, k)) continue;
        tr_model_init_params(pt->m, 12345);
        if (tr_hf_import(pt->m, hf, 0, err, sizeof(err)))
            FAIL("%s: Hugging Face import into %s, rank %d: %s", cases[mc].name, name, k, err);
        else
            check_values(pt->m, mc, 0, name, &copies);
        unbuild(pt);
    }
    if (hi == lo) unbuild(&pts[0]);
    long long x = g_fail - fails;
    tr_comm_all_reduce(g_comm, &x, 1, TR_COMM_I64);
    if (g_me == 0 && (hi > lo || g_world > 1) && !x)
        printf("ok   %s: Hugging Face import into %s: every parameter bitwise\n", cases[mc].name,
               name);
}

static int same_file(const char *x, const char *y) {
    FILE *f = fopen(x, "rb"), *g = fopen(y, "rb");
    int same = f && g, a = 0, b = 0;
    while (same && (a = fgetc(f)) == (b = fgetc(g)) && a != EOF) {
    }
    same = same && a == b;
    if (f) fclose(f);
    if (g) fclose(g);
    return same;
}

/* Rank 0: the Hugging Face export of l's checkpoint against the single process's. */
static void hf_compare(const tr_recipe *r, int mc, const layout *l, const char *root,
                       const layout *one) {
    char dir[600], hf[700], ref[700], err[1024], name[64];
    ckpt_dir(dir, sizeof(dir), root, mc, l);
    snprintf(hf, sizeof(hf), "%s/hf", dir);
    ckpt_dir(ref, sizeof(ref), root, mc, one);
    snprintf(ref + strlen(ref), sizeof(ref) - strlen(ref), "/hf");
    layout_name(name, sizeof(name), l);
    tr_ckpt c;
    int rc = tr_ckpt_find_resume(dir, &c, 0, NULL, err, sizeof(err));
    if (!rc) {
        rc = tr_hf_export(&c, &r->model, 0, hf, err, sizeof(err));
        tr_ckpt_free(&c);
    }
    if (rc) {
        FAIL("%s: Hugging Face export of the checkpoint from %s: %s", cases[mc].name, name, err);
        return;
    }
    if (l == one) return; /* the reference */
    const char *files[2] = {"config.json", "model.safetensors"};
    for (int k = 0; k < 2; k++) {
        char x[800], y[800];
        snprintf(x, sizeof(x), "%s/%s", hf, files[k]);
        snprintf(y, sizeof(y), "%s/%s", ref, files[k]);
        if (same_file(x, y))
            printf("ok   %s: %s exported from %s is the single process's, byte for byte\n",
                   cases[mc].name, files[k], name);
        else
            FAIL("%s: %s exported from %s differs from the single process's", cases[mc].name,
                 files[k], name);
    }
}

/* pp 2, stage 1 writing nothing: rank 0 refuses the save in one line naming a tensor of the
 * stage, and publishes nothing. */
static void missing_stage_save(const tr_recipe *r, const char *root) {
    static const layout pp2 = {1, 2, 1, 0, 1};
    char out[600], err[1024];
    snprintf(out, sizeof(out), "%s/gpt_stage_missing", root);
    save_to(r, 0, &pp2, out, 1, err, sizeof(err));
    if (g_me != 0) return;
    long *steps = NULL;
    int n = tr_ckpt_steps(out, &steps);
    free(steps);
    if (strstr(err, "tensor 'stack.2.") && strstr(err, "is in no block") && !strchr(err, '\n') &&
        n == 0)
        printf("ok   a save where pipeline stage 1 wrote nothing is refused: %s\n", err);
    else
        FAIL("a save where pipeline stage 1 wrote nothing: %s (%d checkpoints published)",
             err[0] ? err : "accepted", n);
}

/* Rank 0: pp 2's checkpoint without stage 1's file is refused in one line naming the file
 * and the stage. */
static void missing_stage_load(const char *root) {
    static const layout pp2 = {1, 2, 1, 0, 1};
    char dir[600], f[700], g[720], err[1024];
    ckpt_dir(dir, sizeof(dir), root, 0, &pp2);
    snprintf(dir + strlen(dir), sizeof(dir) - strlen(dir), "/checkpoints/step_00000001");
    snprintf(f, sizeof(f), "%s/rank_00001.safetensors", dir);
    snprintf(g, sizeof(g), "%s.away", f);
    if (rename(f, g)) {
        FAIL("cannot move %s away", f);
        return;
    }
    tr_ckpt c;
    int rc = tr_ckpt_read(&c, dir, 1, err, sizeof(err));
    if (!rc) tr_ckpt_free(&c);
    if (rc && strstr(err, "rank_00001.safetensors") && strstr(err, "pipeline stage 1 of 2") &&
        !strchr(err, '\n'))
        printf("ok   a checkpoint without pipeline stage 1's file is refused: %s\n", err);
    else
        FAIL("a checkpoint without pipeline stage 1's file: %s", rc ? err : "accepted");
    if (rename(g, f)) FAIL("cannot move %s back", g);
}

int main(int argc, char **argv) {
    char err[512];
    if (tr_comm_init(&g_comm, &argc, &argv, 120, err, sizeof(err))) {
        printf("FAIL comm: %s\n", err);
        return 1;
    }
    g_me = tr_comm_rank(g_comm), g_world = tr_comm_size(g_comm);
    if (g_world != 1 && g_world != 2 && g_world != 4) {
        printf("skipped: run alone or under mpirun -np 2 or -np 4 (world of %d)\n", g_world);
        tr_comm_free(g_comm);
        return 77;
    }
    /* one process, pp 2, pp 2 with 2 chunks a stage, tp 2; with 4 ranks also pp 4,
       tp 2 x pp 2 and dp 2 x pp 2 (ZeRO-1 and ZeRO-2: the ranges of tr_dp) */
    static const layout ls[] = {{1, 1, 1, 0, 1}, {1, 2, 1, 0, 1}, {1, 2, 1, 0, 2}, {1, 1, 2, 0, 1},
                                {1, 4, 1, 0, 1}, {1, 2, 2, 0, 1}, {2, 2, 1, 1, 1}, {2, 2, 1, 2, 1}};
    int nl = g_world == 4 ? 8 : 4;
    const layout *one = &ls[0];
    char root[64] = "/tmp/test_ckpt_pp_XXXXXX";
    if (g_me == 0 && !mkdtemp(root)) root[0] = 0;
    tr_comm_broadcast(g_comm, root, sizeof(root), TR_COMM_BYTE, 0);
    if (!root[0]) {
        printf("FAIL cannot create a folder in /tmp\n");
        return 1;
    }
    for (int mc = 0; mc < N_CASES; mc++) {
        tr_recipe r;
        if (tr_recipe_load_string(&r, cases[mc].recipe, cases[mc].name, ".", NULL, 0, err,
                                  sizeof(err))) {
            FAIL("recipe %s: %s", cases[mc].name, err);
            continue;
        }
        int lo, hi;
        for (int i = 0; i < nl; i++)
            if (played(&ls[i], &lo, &hi), g_world > 1 || hi > lo) save(&r, mc, &ls[i], root);
        if (g_me == 0) hf_compare(&r, mc, one, root, one);
        tr_comm_barrier(g_comm);
        for (int to = 0; to < nl; to++) {
            if (played(&ls[to], &lo, &hi), g_world == 1 && hi == lo) continue;
            for (int from = 0; from < nl; from++)
                if (played(&ls[from], &lo, &hi), g_world > 1 || hi > lo)
                    load(&r, mc, &ls[from], &ls[to], root);
            hf_import(&r, mc, &ls[to], root, one);
        }
        if (g_me == 0)
            for (int i = 1; i < nl; i++)
                if (played(&ls[i], &lo, &hi), g_world > 1 || hi > lo)
                    hf_compare(&r, mc, &ls[i], root, one);
        tr_comm_barrier(g_comm);
        if (mc == 0) {
            missing_stage_save(&r, root);
            if (g_me == 0) missing_stage_load(root);
            tr_comm_barrier(g_comm);
        }
        tr_recipe_free(&r);
    }
    long long fails = g_fail;
    tr_comm_all_reduce(g_comm, &fails, 1, TR_COMM_I64);
    if (g_me == 0) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
        if (system(cmd)) printf("(could not remove %s)\n", root);
        printf("%s: %lld failure(s) over %d ranks\n", fails ? "FAIL" : "ok", fails, g_world);
    }
    tr_comm_free(g_comm);
    return fails ? 1 : 0;
}
