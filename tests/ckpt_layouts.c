/* Checkpoints across layouts, shared by test_ckpt_pp.c and test_ckpt_tp.c (see
 * ckpt_layouts.h): the layouts' models built, set to reference values, saved, loaded into
 * every layout and compared bitwise; the Hugging Face exports compared and imported. */
#include "ckpt_layouts.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/schedule.h"
#include "trainer/checkpoint/checkpoint.h"

int ckl_fails, ckl_me, ckl_world;
tr_comm *ckl_comm;
const char *ckl_root;
static const ckl_case *g_cases;

void ckl_bad(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ckl_fails++;
    printf("FAIL rank %d: ", ckl_me);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

static int lsize(const ckl_layout *l) {
    return l->dp * l->pp * l->tp;
}

void ckl_layout_name(char *buf, size_t n, const ckl_layout *l) {
    char pp[32] = "";
    if (l->pp > 1 || l->v > 1)
        snprintf(pp, sizeof(pp), " x pp %d%s", l->pp,
                 l->zbv     ? " (zb-v)"
                 : l->v > 1 ? " (2 chunks each)"
                            : "");
    if (lsize(l) == 1 && l->v == 1)
        snprintf(buf, n, "one process");
    else
        snprintf(buf, n, "dp %d%s x tp %d ZeRO-%d", l->dp, pp, l->tp, l->zero);
}

void ckl_dir(char *buf, size_t n, int mc, const ckl_layout *l) {
    if (l->bare)
        snprintf(buf, n, "%s/%s_single", ckl_root, g_cases[mc].name);
    else
        snprintf(buf, n, "%s/%s_dp%d_pp%d_v%d%s_tp%d_z%d", ckl_root, g_cases[mc].name, l->dp, l->pp,
                 l->v, l->zbv ? "zbv" : "", l->tp, l->zero);
}

void ckl_unbuild(ckl_part *pt) {
    tr_dp_free(pt->d);
    tr_model_free(pt->m);
    tr_comm_free(pt->dpc);
    tr_comm_free(pt->ppc);
    tr_comm_free(pt->tpc);
    memset(pt, 0, sizeof(*pt));
}

/* The virtual ranks this process plays in layout l: [*lo, *hi). Under MPI its own rank, if the
 * layout has it; alone, every rank of a layout without dp or tp (those need real groups). */
static void played(const ckl_layout *l, int *lo, int *hi) {
    if (ckl_world == 1) {
        *lo = 0;
        *hi = l->dp == 1 && l->tp == 1 ? lsize(l) : 0;
    } else {
        *lo = ckl_me;
        *hi = ckl_me < lsize(l) ? ckl_me + 1 : ckl_me;
    }
}

/* Whether l is run at all: under MPI always (every rank takes part in the collectives). */
static int playable(const ckl_layout *l) {
    int lo, hi;
    played(l, &lo, &hi);
    return ckl_world > 1 || hi > lo;
}

/* The layout's first lsize ranks get the mesh, the others nothing. Alone: no groups. */
int ckl_groups(ckl_part *pt, const ckl_layout *l) {
    char err[512];
    memset(pt, 0, sizeof(*pt));
    if (ckl_world == 1) return 0;
    tr_comm *sub = NULL;
    int in = ckl_me < lsize(l);
    int rc = tr_comm_split(ckl_comm, in ? 0 : 1, ckl_me, "layout", &sub, err, sizeof(err));
    if (!rc && in)
        rc = tr_comm_mesh(sub, (tr_mesh){l->dp, l->pp, l->tp}, &pt->dpc, &pt->ppc, &pt->tpc, err,
                          sizeof(err));
    tr_comm_free(sub);
    if (rc) ckl_bad("groups: %s", err);
    return rc;
}

/* Rank `rank`'s model of l (groups already made: pt from ckl_groups). */
int ckl_chunk_start(const tr_recipe *r, const ckl_layout *l, int c) {
    return c * tr_cost_blocks(&r->model, 16, NULL, 0) / (l->pp * l->v);
}

tr_layout ckl_saved_layout(const tr_recipe *r, const ckl_layout *l) {
    tr_layout s = {.dp = l->dp,
                   .tp = l->tp,
                   .pp = l->pp,
                   .zero = l->zero,
                   .schedule = l->zbv     ? TR_PP_ZBV
                               : l->v > 1 ? TR_PP_INTERLEAVED
                                          : TR_PP_1F1B,
                   .virtual_stages = l->v,
                   .microbatches = 2 * l->pp};
    for (int c = 0; c <= l->pp * l->v; c++)
        s.chunk_start[c] = ckl_chunk_start(r, l, c);
    return s;
}

int ckl_build(ckl_part *pt, const tr_recipe *r, int mc, const ckl_layout *l, int rank) {
    char err[512];
    int t = rank % l->tp, p = rank / l->tp % l->pp, d = rank / (l->tp * l->pp);
    tr_model_opts o = {.B = 1, .T = 16};
    if (!l->bare)
        o = (tr_model_opts){.B = 1,
                            .T = 16,
                            .pad_vocab = g_cases[mc].pad_vocab,
                            .shards = l->zero == 1 ? l->dp : 1,
                            .shard = d,
                            .external_grads = l->zero >= 2,
                            .external_params = l->zero == 3,
                            .tp = l->tp,
                            .tp_rank = t,
                            .tp_comm = l->tp > 1 ? pt->tpc : NULL};
    int nc = l->pp * l->v;
    if (nc > 1) { /* pp_comm and tie_comm: only the gradient sums use them */
        o.n_chunks = nc;
        for (int c = 0; c <= nc; c++)
            o.chunk_start[c] = ckl_chunk_start(r, l, c);
        for (int c = 0; c < nc; c++) {
            o.held[c] = tr_pp_rank_of_kind(l->zbv ? TR_PP_ZBV : TR_PP_1F1B, l->pp, c) == p;
            o.slots[c] = 1;
        }
    }
    if (tr_model_init_opts(&pt->m, &r->model, tr_backend_cpu(), &o, err, sizeof(err)) ||
        (pt->dpc && !l->bare &&
         tr_dp_init(&pt->d, pt->m, pt->dpc, l->zero, 2048, err, sizeof(err)))) {
        ckl_bad("%s: building rank %d's model: %s", g_cases[mc].name, rank, err);
        ckl_unbuild(pt);
        return -1;
    }
    return 0;
}

/* The value of element g of global tensor `name` (kind -1: parameters, 0, 1: AdamW m, v) of
 * model case mc; `other` gives different values (the copy of a tied embedding). Distinct bit
 * patterns everywhere, signs and exponents mixed. */
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
                    ckl_bad("%s: %s%s%s differs in local elements [%zu, %zu)", what,
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
        ckl_bad("%s: AdamW step count %ld, expected 7", what, tr_model_adam_steps(m));
        bad++;
    }
    return bad;
}

/* The writers start in rank order (rank 0 clears old saves at its start) and save in reverse
 * (alone, rank 0's save waits for the others' lists). */
void ckl_save_to(const tr_recipe *r, int mc, const ckl_layout *l, const char *out, int skip,
                 char *err0, size_t errlen) {
    int lo, hi;
    played(l, &lo, &hi);
    ckl_part pts[8] = {{0}};
    tr_ckpt_writer *w[8] = {0};
    size_t *ranges[8] = {0};
    char err[1024];
    err0[0] = 0;
    if (ckl_groups(&pts[0], l)) return;
    for (int k = lo; k < hi; k++) {
        ckl_part *pt = &pts[k - lo];
        if (k > lo) *pt = (ckl_part){0};
        if (ckl_build(pt, r, mc, l, k)) continue;
        set_values(pt->m, mc);
        int n_ranges = pt->d ? tr_dp_ckpt_ranges(pt->d, &ranges[k - lo]) : 0;
        static const size_t none[2] = {0, 0};
        tr_ckpt_opts o = {.out = out,
                          .keep = 1,
                          .rank = k,
                          .world = lsize(l),
                          .ranges = k == skip ? none : ranges[k - lo],
                          .n_ranges = k == skip ? 0 : n_ranges,
                          .layout = ckl_saved_layout(r, l),
                          .timeout_s = 60,
                          .sync = 1};
        if (tr_ckpt_writer_init(&w[k - lo], pt->m, r, &o, err, sizeof(err)))
            ckl_bad("%s: writer of rank %d: %s", g_cases[mc].name, k, err);
    }
    tr_comm_barrier(ckl_comm); /* every writer is up */
    for (int k = hi - 1; k >= lo; k--) {
        if (!w[k - lo]) continue;
        tr_ckpt_save(w[k - lo], 1, NULL, NULL);
        if (tr_ckpt_wait(w[k - lo], err, sizeof(err)) && k == 0) snprintf(err0, errlen, "%s", err);
        tr_ckpt_writer_free(w[k - lo]);
    }
    tr_comm_barrier(ckl_comm); /* rank 0 has published it */
    for (int k = lo; k < hi; k++) {
        free(ranges[k - lo]);
        ckl_unbuild(&pts[k - lo]);
    }
    if (hi == lo) ckl_unbuild(&pts[0]);
}

static void save(const tr_recipe *r, int mc, const ckl_layout *l) {
    char out[600], err[1024], name[64];
    ckl_dir(out, sizeof(out), mc, l);
    ckl_layout_name(name, sizeof(name), l);
    ckl_save_to(r, mc, l, out, -1, err, sizeof(err));
    if (err[0]) ckl_bad("%s: saving from %s: %s", g_cases[mc].name, name, err);
}

/* Every rank of `to` loads the checkpoint saved from `from` and checks what it keeps. */
static void load(const tr_recipe *r, int mc, const ckl_layout *from, const ckl_layout *to) {
    char dir[600], err[1024], a[64], b[64], what[256];
    ckl_dir(dir, sizeof(dir), mc, from);
    ckl_layout_name(a, sizeof(a), from);
    ckl_layout_name(b, sizeof(b), to);
    snprintf(what, sizeof(what), "%s from %s into %s", g_cases[mc].name, a, b);
    int lo, hi, fails = ckl_fails, copies = 0;
    played(to, &lo, &hi);
    ckl_part pts[8];
    if (ckl_groups(&pts[0], to)) return;
    for (int k = lo; k < hi; k++) {
        ckl_part *pt = &pts[k - lo];
        if (k > lo) *pt = (ckl_part){0};
        if (ckl_build(pt, r, mc, to, k)) continue;
        tr_model_init_params(pt->m, 12345); /* anything but the reference */
        tr_ckpt c;
        if (tr_ckpt_find_resume(dir, &c, 1, NULL, err, sizeof(err))) {
            ckl_bad("%s: %s", what, err);
        } else {
            if (tr_ckpt_apply(&c, pt->m, err, sizeof(err)))
                ckl_bad("%s: rank %d: %s", what, k, err);
            else
                check_values(pt->m, mc, 1, what, &copies);
            tr_ckpt_free(&c);
        }
        ckl_unbuild(pt);
    }
    if (hi == lo) ckl_unbuild(&pts[0]);
    long long x[2] = {ckl_fails - fails, copies}; /* over the layout's ranks */
    tr_comm_all_reduce(ckl_comm, x, 2, TR_COMM_I64);
    if (ckl_me == 0 && !x[0])
        printf("ok   %s: every tensor and AdamW moment bitwise%s\n", what,
               x[1] ? ", the last stage's copy of the tied embedding too" : "");
}

/* Every rank of `to` imports the reference's Hugging Face export. */
static void hf_import(const tr_recipe *r, int mc, const ckl_layout *to, const ckl_layout *one) {
    char hf[700], err[1024], name[64];
    ckl_dir(hf, sizeof(hf), mc, one);
    snprintf(hf + strlen(hf), sizeof(hf) - strlen(hf), "/hf");
    ckl_layout_name(name, sizeof(name), to);
    int lo, hi, fails = ckl_fails, copies = 0;
    played(to, &lo, &hi);
    ckl_part pts[8];
    if (ckl_groups(&pts[0], to)) return;
    for (int k = lo; k < hi; k++) {
        ckl_part *pt = &pts[k - lo];
        if (k > lo) *pt = (ckl_part){0};
        if (ckl_build(pt, r, mc, to, k)) continue;
        tr_model_init_params(pt->m, 12345);
        if (tr_hf_import(pt->m, hf, 0, err, sizeof(err)))
            ckl_bad("%s: Hugging Face import into %s, rank %d: %s", g_cases[mc].name, name, k, err);
        else
            check_values(pt->m, mc, 0, name, &copies);
        ckl_unbuild(pt);
    }
    if (hi == lo) ckl_unbuild(&pts[0]);
    long long x = ckl_fails - fails;
    tr_comm_all_reduce(ckl_comm, &x, 1, TR_COMM_I64);
    if (ckl_me == 0 && !x)
        printf("ok   %s: Hugging Face import into %s: every parameter bitwise\n", g_cases[mc].name,
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

/* Rank 0: the Hugging Face export of l's checkpoint against the reference's (l == one: the
 * reference's own export). */
static void hf_compare(const tr_recipe *r, int mc, const ckl_layout *l, const ckl_layout *one) {
    char dir[600], hf[700], ref[700], err[1024], name[64];
    ckl_dir(dir, sizeof(dir), mc, l);
    snprintf(hf, sizeof(hf), "%s/hf", dir);
    ckl_dir(ref, sizeof(ref), mc, one);
    snprintf(ref + strlen(ref), sizeof(ref) - strlen(ref), "/hf");
    ckl_layout_name(name, sizeof(name), l);
    tr_ckpt c;
    int rc = tr_ckpt_find_resume(dir, &c, 0, NULL, err, sizeof(err));
    if (!rc) {
        rc = tr_hf_export(&c, &r->model, 0, hf, err, sizeof(err));
        tr_ckpt_free(&c);
    }
    if (rc) {
        ckl_bad("%s: Hugging Face export of the checkpoint from %s: %s", g_cases[mc].name, name,
                err);
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
                   g_cases[mc].name, files[k], name);
        else
            ckl_bad("%s: %s exported from %s differs from the single process's", g_cases[mc].name,
                    files[k], name);
    }
}

void ckl_matrix(const tr_recipe *r, int mc, const ckl_layout *ls, int nl) {
    const ckl_layout *one = &ls[0];
    for (int i = 0; i < nl; i++)
        if (playable(&ls[i])) save(r, mc, &ls[i]);
    if (ckl_me == 0) hf_compare(r, mc, one, one);
    tr_comm_barrier(ckl_comm);
    for (int to = 0; to < nl; to++) {
        if (!playable(&ls[to])) continue;
        for (int from = 0; from < nl; from++)
            if (playable(&ls[from])) load(r, mc, &ls[from], &ls[to]);
        hf_import(r, mc, &ls[to], one);
    }
    if (ckl_me == 0)
        for (int i = 1; i < nl; i++)
            if (playable(&ls[i])) hf_compare(r, mc, &ls[i], one);
    tr_comm_barrier(ckl_comm);
}

int ckl_start(int *argc, char ***argv, const char *test, const ckl_case *cases, int alone_ok) {
    static char root[64];
    char err[512];
    if (tr_comm_init(&ckl_comm, argc, argv, 120, err, sizeof(err))) {
        printf("FAIL comm: %s\n", err);
        return 1;
    }
    ckl_me = tr_comm_rank(ckl_comm), ckl_world = tr_comm_size(ckl_comm);
    if ((ckl_world != 1 || !alone_ok) && ckl_world != 2 && ckl_world != 4) {
        printf("skipped: run %sunder mpirun -np 2 or -np 4 (world of %d)\n",
               alone_ok ? "alone or " : "", ckl_world);
        tr_comm_free(ckl_comm);
        return 77;
    }
    g_cases = cases;
    snprintf(root, sizeof(root), "/tmp/%s_XXXXXX", test);
    if (ckl_me == 0 && !mkdtemp(root)) root[0] = 0;
    tr_comm_broadcast(ckl_comm, root, sizeof(root), TR_COMM_BYTE, 0);
    if (!root[0]) {
        printf("FAIL cannot create a folder in /tmp\n");
        return 1;
    }
    ckl_root = root;
    return 0;
}

int ckl_recipe(int mc, tr_recipe *r) {
    char err[512];
    if (!tr_recipe_load_string(r, g_cases[mc].recipe, g_cases[mc].name, ".", NULL, 0, err,
                               sizeof(err)))
        return 0;
    ckl_bad("recipe %s: %s", g_cases[mc].name, err);
    return -1;
}

int ckl_end(void) {
    long long fails = ckl_fails;
    tr_comm_all_reduce(ckl_comm, &fails, 1, TR_COMM_I64);
    if (ckl_me == 0) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", ckl_root);
        if (system(cmd)) printf("(could not remove %s)\n", ckl_root);
        printf("%s: %lld failure(s) over %d ranks\n", fails ? "FAIL" : "ok", fails, ckl_world);
    }
    tr_comm_free(ckl_comm);
    return fails ? 1 : 0;
}
