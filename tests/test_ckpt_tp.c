/* Checkpoints across layouts, under mpirun -np 2 and -np 4 (alone: skipped, exit 77). Every
 * rank builds its part of small GPT- and Llama-shaped models (a padded vocabulary whose last
 * tensor-parallel shard is partly, or wholly, padding; key/value heads split, or shared by 2
 * and 4 ranks) in each dp x tp x ZeRO layout of the world, sets its parameters and AdamW
 * moments to values derived from a single-process reference (each element from its global
 * index), and saves a checkpoint with the ranges it keeps (tr_dp_ckpt_ranges). Rank 0 alone
 * saves the single-process model too. Every checkpoint is then loaded into every layout
 * (tp 2 -> 1, 1 -> 4, 2 -> 4, 4 -> 2, dp 2 x tp 2 -> dp 4, ...), and each rank compares every
 * element it keeps bitwise (it is a copy). The Hugging Face export of each checkpoint must be
 * byte for byte the single-process one's, importing that export into every layout must give
 * the reference's parameters bitwise, and a checkpoint of another shape is refused naming the
 * tensor and both shapes. Forward and backward are not run. */
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

/* vocab 130 with pad_vocab 64: tp 2 pads to 256 (rank 1 holds 2 real rows of 128), tp 4 too
 * (rank 2: 2 real rows, rank 3: none). vocab 200 with pad_vocab 32: rank 1 of 2 holds 72 real
 * rows of 128, rank 3 of 4 8 of 64. */
static const char gpt[] =
    "model { vocab = 130, dim = 32, seq_len = 16, embedding {}, positions {},\n"
    "  stack { n = 2, residual { layernorm {}, attention { heads = 4 } },\n"
    "                 residual { layernorm {}, mlp { hidden = 64 } } },\n"
    "  layernorm {}, lm_head {} }\n"
    "data { text = 'x' } train { batch_tokens = 32, steps = 1 }\n";

#define LLAMA(KV)                                                                                  \
    "model { vocab = 200, dim = 32, seq_len = 16, embedding {}, rope { theta = 10000 },\n"         \
    "  stack { n = 2, residual { rmsnorm {}, attention { heads = 4, kv_heads = " #KV               \
    ", bias = false } },\n"                                                                        \
    "    residual { rmsnorm {}, mlp { hidden = 48, activation = 'swiglu', bias = false } } },\n"   \
    "  rmsnorm {}, lm_head { tied = false } }\n"                                                   \
    "data { text = 'x' } train { batch_tokens = 32, steps = 1 }\n"

typedef struct {
    const char *name, *recipe;
    int pad_vocab;
} model_case;

static const model_case cases[] = {
    {"gpt", gpt, 64},
    {"llama_kv1", LLAMA(1), 32}, /* one key/value head: shared by every tp rank */
    {"llama_kv2", LLAMA(2), 32}, /* split at tp 2, shared by pairs at tp 4 */
};
#define N_CASES (int)(sizeof(cases) / sizeof(cases[0]))

typedef struct {
    int dp, tp, zero;
} layout;

/* A model built in a layout: this rank's part, its data-parallel runtime and groups. */
typedef struct {
    tr_model *m;
    tr_dp *d;
    tr_comm *dpc, *ppc, *tpc;
} part;

/* The value of element g of global tensor `param` (kind -1: parameters, 0, 1: AdamW m, v) of
 * model case `mc`: distinct bit patterns everywhere, signs and exponents mixed. */
static float ref_value(int mc, int kind, int param, size_t g) {
    uint64_t h = ((uint64_t)mc * 1000003u + (uint64_t)(kind + 1)) * 0x9E3779B97F4A7C15u ^
                 ((uint64_t)param * 7919u + g) * 0xBF58476D1CE4E5B9u;
    h ^= h >> 31;
    h *= 0x94D049BB133111EBu;
    h ^= h >> 29;
    float x = (float)(h >> 40) / 16777216.0f - 0.5f;
    return kind == 1 ? x * x : x * (float)(1 + (h & 7)); /* v >= 0 */
}

static void layout_name(char *buf, size_t n, const layout *l) {
    snprintf(buf, n, "dp %d x tp %d ZeRO-%d", l->dp, l->tp, l->zero);
}

static void unbuild(part *pt) {
    tr_dp_free(pt->d);
    tr_model_free(pt->m);
    tr_comm_free(pt->dpc);
    tr_comm_free(pt->ppc);
    tr_comm_free(pt->tpc);
}

static int build(part *pt, const tr_recipe *r, const model_case *mc, const layout *l) {
    char err[512];
    memset(pt, 0, sizeof(*pt));
    if (tr_comm_mesh(g_comm, (tr_mesh){l->dp, 1, l->tp}, &pt->dpc, &pt->ppc, &pt->tpc, err,
                     sizeof(err))) {
        FAIL("mesh: %s", err);
        unbuild(pt);
        return -1;
    }
    tr_model_opts o = {.B = 1,
                       .T = 16,
                       .pad_vocab = mc->pad_vocab,
                       .shards = l->zero == 1 ? l->dp : 1,
                       .shard = tr_comm_rank(pt->dpc),
                       .external_grads = l->zero >= 2,
                       .external_params = l->zero == 3,
                       .tp = l->tp,
                       .tp_rank = tr_comm_rank(pt->tpc),
                       .tp_comm = l->tp > 1 ? pt->tpc : NULL};
    if (tr_model_init_opts(&pt->m, &r->model, tr_backend_cpu(), &o, err, sizeof(err)) ||
        tr_dp_init(&pt->d, pt->m, pt->dpc, l->zero, 2048, err, sizeof(err))) {
        FAIL("%s: building the model: %s", mc->name, err);
        unbuild(pt);
        return -1;
    }
    return 0;
}

/* The expected local tensor i of kind `kind` (all numel elements) into out. */
static void expected(const tr_param *p, int mc, int kind, int i, float *out) {
    int n = tr_param_runs(p, 0, p->numel, NULL, 0);
    tr_run *run = malloc((size_t)(n + 1) * sizeof(tr_run));
    tr_param_runs(p, 0, p->numel, run, n);
    for (int k = 0; k < n; k++)
        for (size_t j = 0; j < run[k].n; j++)
            out[run[k].local + j] = ref_value(mc, kind, i, run[k].global + j);
    free(run);
}

/* Parameters (through the global tensor), AdamW moments and step count of the reference. */
static void set_values(tr_model *m, int mc) {
    for (int i = 0; i < tr_model_num_params(m); i++) {
        const tr_param *p = tr_model_param(m, i);
        size_t gn = (size_t)p->gshape[0] * (size_t)p->gshape[1];
        float *g = malloc((gn + 1) * sizeof(float)), *loc = malloc((p->numel + 1) * sizeof(float));
        for (size_t j = 0; j < gn; j++)
            g[j] = ref_value(mc, -1, i, j);
        tr_model_set_param_global(m, i, g);
        for (int k = 0; k < 2; k++) {
            expected(p, mc, k, i, loc);
            tr_model_set_state(m, i, (tr_state_kind)k, loc);
        }
        free(g);
        free(loc);
    }
    tr_model_set_adam_steps(m, 7);
}

/* Every element this rank keeps of every tensor (with_state: and moment, and the step count)
 * against the reference, bitwise; one line per differing tensor. */
static int check_values(tr_model *m, int mc, int with_state, const char *what) {
    int bad = 0;
    for (int i = 0; i < tr_model_num_params(m); i++) {
        const tr_param *p = tr_model_param(m, i);
        float *want = malloc((p->numel + 1) * sizeof(float)), *got = malloc((p->numel + 1) * 4);
        for (int kind = -1; kind <= (with_state ? 1 : -1); kind++) {
            expected(p, mc, kind, i, want);
            int n = tr_model_held_parts(m, i, kind, NULL, NULL, 0);
            size_t *lo = malloc(2 * (size_t)(n + 1) * sizeof(size_t)), *hi = lo + n + 1;
            tr_model_held_parts(m, i, kind, lo, hi, n);
            for (int j = 0; j < n; j++) {
                size_t a = p->offset + lo[j], b = p->offset + hi[j];
                if (tr_model_read_range(m, kind, a, b, got + lo[j]) ||
                    memcmp(got + lo[j], want + lo[j], (hi[j] - lo[j]) * sizeof(float))) {
                    FAIL("%s: %s%s differs in local elements [%zu, %zu)", what,
                         kind < 0 ? ""
                         : kind   ? "adam_v/"
                                  : "adam_m/",
                         p->name, lo[j], hi[j]);
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
    if (l)
        snprintf(buf, n, "%s/%s_dp%d_tp%d_z%d", root, cases[mc].name, l->dp, l->tp, l->zero);
    else
        snprintf(buf, n, "%s/%s_single", root, cases[mc].name);
}

/* Every rank saves its part in layout l (rank 0 alone, l NULL: the single-process model). */
static void save(const tr_recipe *r, int mc, const layout *l, const char *root) {
    layout one = {1, 1, 0};
    int alone = l == NULL;
    char out[600], err[1024], name[64];
    ckpt_dir(out, sizeof(out), root, mc, l);
    part pt = {0};
    size_t *ranges = NULL;
    tr_ckpt_writer *w = NULL;
    int ok = 1;
    if (alone) { /* only rank 0; the others wait at the barrier below */
        if (g_me == 0 && tr_model_init_opts(&pt.m, &r->model, tr_backend_cpu(),
                                            &(tr_model_opts){.B = 1, .T = 16}, err, sizeof(err))) {
            FAIL("%s: %s", cases[mc].name, err);
            ok = 0;
        }
        l = &one;
    } else {
        ok = build(&pt, r, &cases[mc], l) == 0;
    }
    if (ok && (!alone || g_me == 0)) {
        set_values(pt.m, mc);
        int n_ranges = pt.d ? tr_dp_ckpt_ranges(pt.d, &ranges) : 0;
        tr_ckpt_opts o = {.out = out,
                          .keep = 1,
                          .rank = alone ? 0 : g_me,
                          .world = alone ? 1 : g_world,
                          .ranges = ranges,
                          .n_ranges = n_ranges,
                          .dp = l->dp,
                          .tp = l->tp,
                          .zero = l->zero,
                          .timeout_s = 60,
                          .sync = 1};
        ok = tr_ckpt_writer_init(&w, pt.m, r, &o, err, sizeof(err)) == 0;
        if (!ok) FAIL("%s: writer: %s", cases[mc].name, err);
    }
    tr_comm_barrier(g_comm); /* every writer is up (rank 0 cleared old saves at its start) */
    if (w) {
        tr_ckpt_save(w, 1, NULL, NULL);
        layout_name(name, sizeof(name), l);
        if (tr_ckpt_wait(w, err, sizeof(err)))
            FAIL("%s: saving from %s: %s", cases[mc].name, alone ? "one process" : name, err);
        tr_ckpt_writer_free(w);
    }
    tr_comm_barrier(g_comm); /* rank 0 has published it */
    free(ranges);
    unbuild(&pt); /* the single process's model has no runtime or groups: NULL */
}

/* Every rank loads the checkpoint saved from `from` (NULL: the single process) into its part
 * of layout `to` and checks it. */
static void load(const tr_recipe *r, int mc, const layout *from, const layout *to,
                 const char *root) {
    char dir[600], err[1024], a[64] = "one process", b[64], what[256];
    ckpt_dir(dir, sizeof(dir), root, mc, from);
    if (from) layout_name(a, sizeof(a), from);
    layout_name(b, sizeof(b), to);
    snprintf(what, sizeof(what), "%s from %s into %s", cases[mc].name, a, b);
    part pt;
    if (build(&pt, r, &cases[mc], to)) return;
    tr_model_init_params(pt.m, 12345); /* anything but the reference */
    tr_ckpt c;
    int rc = tr_ckpt_find_resume(dir, &c, 1, NULL, err, sizeof(err));
    if (!rc) {
        if (tr_ckpt_apply(&c, pt.m, err, sizeof(err)))
            FAIL("%s: %s", what, err);
        else if (!check_values(pt.m, mc, 1, what) && g_me == 0)
            printf("ok   %s: every tensor bitwise\n", what);
        tr_ckpt_free(&c);
    } else {
        FAIL("%s: %s", what, err);
    }
    unbuild(&pt);
}

/* Every rank imports the single process's Hugging Face export into its part of layout `to`. */
static void hf_import(const tr_recipe *r, int mc, const layout *to, const char *root) {
    char hf[700], err[1024], name[64], what[256];
    ckpt_dir(hf, sizeof(hf), root, mc, NULL);
    snprintf(hf + strlen(hf), sizeof(hf) - strlen(hf), "/hf");
    layout_name(name, sizeof(name), to);
    snprintf(what, sizeof(what), "%s: Hugging Face import into %s", cases[mc].name, name);
    part pt;
    if (build(&pt, r, &cases[mc], to)) return;
    tr_model_init_params(pt.m, 12345);
    if (tr_hf_import(pt.m, hf, 0, err, sizeof(err)))
        FAIL("%s: %s", what, err);
    else if (!check_values(pt.m, mc, 0, what) && g_me == 0)
        printf("ok   %s: every parameter bitwise\n", what);
    unbuild(&pt);
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

/* Rank 0: the Hugging Face export of the checkpoint saved from l against the single
 * process's (l NULL: that one), file by file. */
static void hf_compare(const tr_recipe *r, int mc, const layout *l, const char *root) {
    char dir[600], hf[700], ref[700], err[1024], name[64];
    ckpt_dir(dir, sizeof(dir), root, mc, l);
    snprintf(hf, sizeof(hf), "%s/hf", dir);
    ckpt_dir(ref, sizeof(ref), root, mc, NULL);
    snprintf(ref + strlen(ref), sizeof(ref) - strlen(ref), "/hf");
    tr_ckpt c;
    int rc = tr_ckpt_find_resume(dir, &c, 0, NULL, err, sizeof(err));
    if (!rc) {
        rc = tr_hf_export(&c, &r->model, 0, hf, err, sizeof(err));
        tr_ckpt_free(&c);
    }
    if (l)
        layout_name(name, sizeof(name), l);
    else
        snprintf(name, sizeof(name), "one process");
    if (rc) {
        FAIL("%s: Hugging Face export of the checkpoint from %s: %s", cases[mc].name, name, err);
        return;
    }
    if (!l) return; /* the reference */
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

/* A checkpoint of another shape (kv_heads 1 into kv_heads 2) is refused, naming the tensor
 * and both global shapes. */
static void wrong_shape(const char *root, const layout *to) {
    tr_recipe r;
    char err[1024], dir[600];
    if (tr_recipe_load_string(&r, cases[2].recipe, "llama_kv2", ".", NULL, 0, err, sizeof(err))) {
        FAIL("recipe: %s", err);
        return;
    }
    part pt;
    if (!build(&pt, &r, &cases[2], to)) {
        ckpt_dir(dir, sizeof(dir), root, 1, NULL);
        tr_ckpt c;
        int rc = tr_ckpt_find_resume(dir, &c, 1, NULL, err, sizeof(err)) ? -1 : 0;
        if (!rc) {
            rc = tr_ckpt_apply(&c, pt.m, err, sizeof(err)) ? 1 : 0;
            tr_ckpt_free(&c);
        }
        if (rc == 1 && strstr(err, "tensor 'stack.0.residual0.attention.qkv.weight' is 48 x 32, "
                                   "the model's is 64 x 32")) {
            if (g_me == 0) printf("ok   a checkpoint of another shape is refused: %s\n", err);
        } else {
            FAIL("a kv_heads 1 checkpoint into a kv_heads 2 model: %s", rc ? err : "accepted");
        }
        unbuild(&pt);
    }
    tr_recipe_free(&r);
}

int main(int argc, char **argv) {
    char err[512];
    if (tr_comm_init(&g_comm, &argc, &argv, 120, err, sizeof(err))) {
        printf("FAIL comm: %s\n", err);
        return 1;
    }
    g_me = tr_comm_rank(g_comm), g_world = tr_comm_size(g_comm);
    if (g_world != 2 && g_world != 4) {
        printf("skipped: run under mpirun -np 2 or -np 4 (world of %d)\n", g_world);
        tr_comm_free(g_comm);
        return 77;
    }
    static const layout two[] = {{2, 1, 0}, {1, 2, 0}, {2, 1, 3}, {1, 2, 2}};
    static const layout four[] = {{4, 1, 0}, {2, 2, 0}, {1, 4, 0}, {2, 2, 1}, {2, 2, 3}, {4, 1, 2}};
    const layout *ls = g_world == 2 ? two : four;
    int nl = g_world == 2 ? 4 : 6;
    char root[64] = "/tmp/test_ckpt_tp_XXXXXX";
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
        save(&r, mc, NULL, root);
        for (int i = 0; i < nl; i++)
            save(&r, mc, &ls[i], root);
        if (g_me == 0) hf_compare(&r, mc, NULL, root); /* the reference's own export */
        tr_comm_barrier(g_comm);
        for (int to = 0; to < nl; to++) {
            load(&r, mc, NULL, &ls[to], root);
            for (int from = 0; from < nl; from++)
                load(&r, mc, &ls[from], &ls[to], root);
            hf_import(&r, mc, &ls[to], root);
        }
        if (g_me == 0)
            for (int i = 0; i < nl; i++)
                hf_compare(&r, mc, &ls[i], root);
        tr_comm_barrier(g_comm);
        tr_recipe_free(&r);
    }
    wrong_shape(root, &ls[1]);
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
