/* What `trainer run` writes for tools and tests, as global tensors whatever the layout:
 * TR_DUMP_PARAMS (the final parameters) and TR_DUMP_TENSORS (the first step's activations and
 * gradients, which `trainer check` compares), and TR_FAULT_PERTURB, which changes one op's
 * output in that step so that the tests can see `check` find it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/run/run.h"

#define PERTURB 1e-3f /* TR_FAULT_PERTURB scales the op's output by 1 + PERTURB */

/* Where a rank reads its part of parameter tensor i (numel floats, its local layout). */
typedef void (*tensor_source)(void *ctx, int i, float *dst);

static void model_param_source(void *ctx, int i, float *dst) {
    tr_model_get_param(ctx, i, dst);
}

typedef struct {
    const tr_model *m;
    const float *slab; /* fp32, indexed like the model's slab */
} slab_source_ctx;

static void slab_source(void *ctx, int i, float *dst) {
    const slab_source_ctx *s = ctx;
    const tr_param *p = tr_model_param(s->m, i);
    memcpy(dst, s->slab + p->offset, p->numel * sizeof(float));
}

/* This process's part of global tensor g (its name), read through src, into `global`
 * (zeroed; what several ranks hold, once: tp copy 0, not a pipeline replica); nothing when it
 * does not hold the tensor. -1 when out of memory. */
static int place_param(run_ctx *x, tensor_source src, void *ctx, const char *name, float *global) {
    int i = 0, np = tr_model_num_params(x->model);
    while (i < np && strcmp(tr_model_param(x->model, i)->name, name))
        i++;
    if (i == np || tr_model_param(x->model, i)->pp_copy) return 0;
    const tr_param *p = tr_model_param(x->model, i);
    int nr = tr_param_runs(p, 0, p->numel, NULL, 0);
    float *mine = malloc((p->numel ? p->numel : 1) * sizeof(float));
    tr_run *runs = malloc((size_t)(nr ? nr : 1) * sizeof(tr_run));
    if (!mine || !runs) {
        free(mine), free(runs);
        return -1;
    }
    src(ctx, i, mine);
    tr_param_runs(p, 0, p->numel, runs, nr);
    for (int k = 0; k < nr; k++)
        if (p->seg[runs[k].seg].copy == 0)
            memcpy(global + runs[k].global, mine + runs[k].local, runs[k].n * sizeof(float));
    free(mine), free(runs);
    return 0;
}

/* Every GLOBAL parameter tensor in the order of one process's model (a planned one lists
 * them), read through src: each rank places its part into a zeroed buffer, a sum over the
 * ranks of one model copy (tp x pp) assembles it (every element comes from exactly one rank),
 * and rank 0 writes it to df (raw fp32) and, when given, a line "KIND\tNAME\tROWS\tCOLS" to
 * index. Every rank takes part; -1 when out of memory. */
static int write_globals(run_ctx *x, tensor_source src, void *ctx, FILE *df, FILE *index,
                         const char *kind) {
    tr_model *plan = NULL;
    tr_model_opts one = {.B = 1, .T = 1};
    if (tr_model_plan(&plan, &x->r.model, TR_DTYPE_F32, &one, x->err, sizeof(x->err))) return -1;
    int bad = 0;
    for (int i = 0; i < tr_model_num_params(plan) && !bad; i++) {
        const tr_param *p = tr_model_param(plan, i);
        size_t n = (size_t)p->gshape[0] * (size_t)p->gshape[1];
        float *global = calloc(n ? n : 1, sizeof(float));
        if (!global || place_param(x, src, ctx, p->name, global)) {
            free(global);
            bad = -1;
            break;
        }
        tr_comm_all_reduce(x->mpc, global, n, TR_COMM_F32);
        if (df) fwrite(global, sizeof(float), n, df);
        if (index) fprintf(index, "%s\t%s\t%d\t%d\n", kind, p->name, p->gshape[0], p->gshape[1]);
        free(global);
    }
    tr_model_free(plan);
    return bad;
}

/* TR_DUMP_PARAMS (tests): the final parameters as raw fp32, every global tensor in the order
 * of one process's model. ZeRO 1-3 read the gathered state: each part's fp32 master from the
 * rank that updates it (in bf16 another rank's copy of the master is stale). Every rank takes
 * part; 1 when the file could not be written (said), -1 when out of memory. */
int run_dump_params(run_ctx *x, const char *path) {
    tr_dp_state all = {0};
    int sharded = tr_dp_zero(x->dp).optimizer; /* the master weights too */
    if (sharded && tr_dp_gather_state(x->dp, &all)) return -1;
    FILE *df = x->rank == 0 ? fopen(path, "wb") : NULL;
    int bad = x->rank == 0 && !df ? -run_cannot_write(path, errno) : 0;
    /* rank 0 takes part without its file: the others' sums need it */
    int oom = sharded ? write_globals(x, tr_dp_param_source, &all, df, NULL, NULL)
                          : write_globals(x, model_param_source, x->model, df, NULL, NULL);
    if (df && run_close_output(df, path)) bad = 1;
    tr_dp_state_free(&all);
    return oom ? -1 : bad;
}

/* ---- the first step's activations and gradients ------------------------------------------
 * The model's tap (tr_model_set_tap) copies every op's output of every micro-batch of the step
 * into host memory, in the layout of this rank's micro-batch (B x T rows); after the step's
 * gradients are summed, the ranks assemble each op's output over the step's global batch: the
 * loader gives dp rank d the sequences [d*B, (d+1)*B) of each global micro-batch of dp*B, so
 * row r of micro-batch k on dp rank d is global row (k*dp + d)*B*T + r. */

struct run_dump {
    run_ctx *x;
    char dir[TR_PATH_MAX];
    int perturb; /* the op whose output TR_FAULT_PERTURB scales, -1: none */
    int n_ops, N, accum;
    float **data;  /* per op: accum x N x cols, once captured */
    int *seen;     /* forwards of the op captured */
    char *replica; /* another tp rank holds the same rows */
};

static void on_tap(void *ctx, const tr_tap *t) {
    run_dump *d = ctx;
    const tr_backend *be = d->x->be;
    size_t n = (size_t)t->rows * (size_t)t->cols;
    if (t->op == d->perturb && t->x) {
        be->scale(t->x, 1.0f + PERTURB, n);
    } else if (t->op == d->perturb) { /* the head's losses: fp32 backend memory */
        float *h = malloc(n * sizeof(float));
        if (h) {
            be->download(h, t->f32, n * sizeof(float));
            for (size_t i = 0; i < n; i++)
                h[i] *= 1.0f + PERTURB;
            be->upload(t->f32, h, n * sizeof(float));
            free(h);
        }
    }
    if (!d->dir[0]) return;
    int k = d->seen[t->op]++;
    if (k >= d->accum || t->N != d->N) return; /* not a training micro-batch of the step */
    size_t per = (size_t)d->N * (size_t)t->cols;
    if (!d->data[t->op] && !(d->data[t->op] = calloc((size_t)d->accum * per, sizeof(float))))
        return; /* said when assembling */
    float *dst = d->data[t->op] + (size_t)k * per + (size_t)t->row0 * (size_t)t->cols;
    if (t->x)
        be->from_storage(dst, t->x, n);
    else
        be->download(dst, t->f32, n * sizeof(float));
    d->replica[t->op] = (char)t->replica;
}

void run_dump_free(run_ctx *x) {
    run_dump *d = x->dump;
    if (!d) return;
    if (x->model) tr_model_set_tap(x->model, NULL, NULL);
    for (int i = 0; i < d->n_ops && d->data; i++)
        free(d->data[i]);
    free(d->data), free(d->seen), free(d->replica);
    free(d);
    x->dump = NULL;
}

/* TR_DUMP_TENSORS=DIR and TR_FAULT_PERTURB=NAME, read before the first step: the tap set when
 * either is there. -1 after one line (rank 0) when the name is no op's, or out of memory. */
int run_dump_arm(run_ctx *x) {
    const char *dir = getenv("TR_DUMP_TENSORS"), *name = getenv("TR_FAULT_PERTURB");
    if ((!dir || !*dir) && (!name || !*name)) return 0;
    if (x->lay.shares_uneven) { /* the same on every rank: all stop */
        if (x->rank == 0)
            fprintf(stderr, "trainer run: TR_DUMP_TENSORS and TR_FAULT_PERTURB need even "
                            "dp_shares (each replica's taps are gathered by micro-batch)\n");
        return -1;
    }
    int n_ops = tr_model_num_ops(x->model);
    run_dump *d = x->dump = calloc(1, sizeof(*d));
    if (d) {
        d->data = calloc((size_t)n_ops, sizeof(float *));
        d->seen = calloc((size_t)n_ops, sizeof(int));
        d->replica = calloc((size_t)n_ops, 1);
    }
    if (!d || !d->data || !d->seen || !d->replica) {
        fprintf(stderr, "trainer run: rank %d: out of memory for TR_DUMP_TENSORS\n", x->rank);
        run_dump_free(x);
        return -1;
    }
    d->x = x, d->n_ops = n_ops, d->N = x->B * x->T, d->accum = x->lay.accum, d->perturb = -1;
    snprintf(d->dir, sizeof(d->dir), "%s", dir ? dir : "");
    for (int i = 0; name && *name && i < n_ops && d->perturb < 0; i++) {
        const char *op = tr_model_op_name(x->model, i, NULL);
        if (op && !strcmp(op, name)) d->perturb = i;
    }
    if (name && *name && d->perturb < 0) { /* the same on every rank: all stop */
        if (x->rank == 0)
            fprintf(stderr,
                    "trainer run: TR_FAULT_PERTURB: no layer output is named '%s' (the names "
                    "are those `trainer check` lists, e.g. '%s')\n",
                    name, tr_model_op_name(x->model, n_ops - 1, NULL));
        run_dump_free(x);
        return -1;
    }
    tr_model_set_tap(x->model, on_tap, d);
    return 0;
}

/* Every op's output of the step over the global batch, rank 0 writing it: -1 when out of
 * memory somewhere (every rank learns it). */
static int write_activations(run_ctx *x, FILE *df, FILE *index) {
    run_dump *d = x->dump;
    int dp = x->lay.dp, me = tr_comm_rank(x->dpc);
    size_t rows = (size_t)dp * (size_t)d->accum * (size_t)d->N;
    for (int i = 0; i < d->n_ops; i++) {
        int cols = 0, bad = 0;
        const char *name = tr_model_op_name(x->model, i, &cols);
        if (!name) continue;
        size_t per = (size_t)d->N * (size_t)cols;
        float *global = calloc(rows * (size_t)cols, sizeof(float));
        bad = !global || (d->seen[i] && !d->data[i]);
        tr_comm_all_reduce(x->world, &bad, 1, TR_COMM_I32);
        if (bad) {
            free(global);
            return -1;
        }
        for (int k = 0; d->data[i] && !d->replica[i] && k < d->accum; k++)
            memcpy(global + ((size_t)k * dp + me) * per, d->data[i] + k * per, per * sizeof(float));
        tr_comm_all_reduce(x->world, global, rows * (size_t)cols, TR_COMM_F32);
        if (df) fwrite(global, sizeof(float), rows * (size_t)cols, df);
        if (index) fprintf(index, "activation\t%s\t%zu\t%d\n", name, rows, cols);
        free(global);
    }
    return 0;
}

/* After the first step's gradients are summed (before the update): its activations and
 * gradients into DIR/tensors.bin (raw fp32, one tensor after another) and DIR/tensors.tsv
 * (a line "activation|gradient\tNAME\tROWS\tCOLS" per tensor, in the same order), and the tap
 * removed. Every rank takes part; 0, 1 when the files could not be written (said), -1 when
 * out of memory (said). */
int run_dump_step(run_ctx *x) {
    run_dump *d = x->dump;
    if (!d) return 0;
    tr_model_set_tap(x->model, NULL, NULL);
    if (!d->dir[0]) {
        run_dump_free(x);
        return 0;
    }
    char bin[TR_PATH_MAX + 32], tsv[TR_PATH_MAX + 32];
    snprintf(bin, sizeof(bin), "%s/tensors.bin", d->dir);
    snprintf(tsv, sizeof(tsv), "%s/tensors.tsv", d->dir);
    FILE *df = NULL, *index = NULL;
    int bad = 0;
    if (x->rank == 0) {
        if (tr_mkdirs(d->dir, x->err, sizeof(x->err))) {
            fprintf(stderr, "trainer run: TR_DUMP_TENSORS: %s\n", x->err);
            bad = 1;
        } else if (!(df = fopen(bin, "wb")) || !(index = fopen(tsv, "w"))) {
            bad = -run_cannot_write(df ? tsv : bin, errno);
        }
    }
    tr_comm_all_reduce(x->world, &bad, 1, TR_COMM_I32); /* all write, or none */
    size_t n = tr_model_slab_elements(x->model);
    float *g = bad ? NULL : malloc((n ? n : 1) * sizeof(float));
    int oom = !bad && !g;
    tr_comm_all_reduce(x->world, &oom, 1, TR_COMM_I32);
    if (!bad && !oom) oom = write_activations(x, df, index);
    if (!bad && !oom) {
        oom = tr_dp_gather_grads(x->dp, g);
        tr_comm_all_reduce(x->world, &oom, 1, TR_COMM_I32);
    }
    if (!bad && !oom) {
        slab_source_ctx sc = {x->model, g};
        oom = write_globals(x, slab_source, &sc, df, index, "gradient");
    }
    free(g);
    if (df && run_close_output(df, bin)) bad = 1;
    if (index && run_close_output(index, tsv)) bad = 1;
    run_dump_free(x);
    if (oom) {
        fprintf(stderr, "trainer run: rank %d: out of memory for TR_DUMP_TENSORS\n", x->rank);
        return -1;
    }
    return bad ? 1 : 0;
}
