/* `trainer run RECIPE`: the training loop. After the setup (trainer/run/setup.c) every step
 * runs data -> forward/backward over the micro-batches of the step -> gradient sync over the
 * dp group -> clip -> AdamW, with a live progress line, metrics.jsonl, evaluations and
 * checkpoints; the run ends with a report: the summary, memory.json, where each rank's time
 * went, and a sample. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "data/json.h"
#include "data/tokenizer.h"
#include "parallel/comm/env.h"
#include "trainer/run/run.h"

/* Learning rate at `step` (0-based): linear warmup from 0, then the recipe's decay to min_lr. */
static float lr_at(const tr_recipe *r, int step) {
    const tr_schedule_desc *s = &r->schedule;
    float lr = r->optim.lr, lo = s->min_lr;
    int total = r->train.steps;
    if (step < s->warmup) return lr * (float)(step + 1) / (float)s->warmup;
    int span = total - s->warmup;
    double t = span > 0 ? (double)(step - s->warmup) / (double)span : 1.0; /* 0 .. 1 */
    switch (s->decay) {
    case TR_DECAY_CONSTANT:
        return lr;
    case TR_DECAY_LINEAR:
        return (float)(lr + (lo - lr) * t);
    case TR_DECAY_COSINE:
        return (float)(lo + 0.5 * (lr - lo) * (1.0 + cos(3.14159265358979323846 * t)));
    case TR_DECAY_WSD: {
        int decay_steps = (int)(s->decay_frac * (float)total + 0.5f);
        int start = total - decay_steps;
        if (step < start || decay_steps <= 0) return lr;
        double u = (double)(step - start + 1) / (double)decay_steps;
        return (float)(lr + (lo - lr) * u);
    }
    }
    return lr;
}

/* This rank's part of the checkpoint of `step` (from 1): the model, the loader's position and
 * the guard's state; its stall goes into the ledger. */
void run_checkpoint(run_ctx *x, int step) {
    tr_loader_pos pos = tr_loader_get_pos(x->loader);
    tr_ckpt_guard gs;
    double stall = tr_ckpt_save(x->ckw, step, &pos, run_guard_state(x, &gs));
    tr_ledger_mark(x->ledger, LED_CKPT);
    tr_ledger_save(x->ledger, step, stall);
}

/* Mean loss over the first eval_tokens of the validation split (the same batches every time);
 * NAN when there are no validation data, -1 with a message on bad data. */
static int evaluate(run_ctx *x, double *loss) {
    /* eval_tokens is global: every dp rank evaluates its own slice of the same batches */
    int ndp = x->lay.dp;
    long want = x->r.train.eval_tokens / ((long)x->B * x->T * ndp);
    long have = tr_loader_val_batches(x->loader);
    if (want < 1) want = 1;
    if (want > have) want = have;
    double sum = 0;
    for (long i = 0; i < want; i++) {
        if (tr_loader_val_batch(x->loader, i, x->inputs, x->targets) < 0) return -1;
        sum += x->pipe ? tr_pipe_eval(x->pipe, x->inputs, x->targets, x->B, x->T)
                       : tr_model_forward(x->model, x->inputs, x->targets, x->B, x->T, 0);
    }
    sum = tr_dp_sum(x->dp, sum);
    *loss = want > 0 ? sum / (double)(want * ndp) : NAN;
    return 0;
}

static void pipe_decode(void *pipe, tr_kv_cache *c, int token, int pos, float *logits) {
    tr_pipe_decode(pipe, c, token, pos, logits);
}

/* Sample n tokens, temperature 1, from the model's full distribution, after <|endoftext|>
 * (GPT-2) or a newline (byte-level); tokens are decoded to their exact bytes. */
static void sample(run_ctx *x, int n, unsigned long long seed, FILE *out) {
    tr_tokenizer *tok;
    char err[512];
    const tr_data_desc *d = &x->r.data;
    if (tr_tokenizer_open(&tok, d->tokenizer, d->encoder, d->merges, err, sizeof(err))) {
        fprintf(stderr, "%s: sample: %s\n", x->r.path, err);
        return;
    }
    int prompt[8], len = 1, *ids = malloc((size_t)n * sizeof(int));
    prompt[0] = tr_tokenizer_eot(tok);
    if (prompt[0] < 0) len = (int)tr_tokenizer_encode(tok, "\n", 1, prompt);
    tr_decode_fn via = x->pipe ? pipe_decode : NULL;
    if (tr_sample_tokens_via(x->model, via, x->pipe, prompt, len, n, 1.0f, 0, seed, ids, err,
                             sizeof(err))) {
        fprintf(stderr, "%s: sample: %s\n", x->r.path, err);
        n = 0;
    }
    for (int i = 0; i < n; i++) {
        size_t nb = 0;
        const char *bytes = tr_tokenizer_token(tok, ids[i], &nb);
        if (bytes) fwrite(bytes, 1, nb, out);
    }
    tr_tokenizer_free(tok);
    free(ids);
}

/* Returns -1 when the writer could not save the sample (the others still take part: under
 * ZeRO-3 the sampling forwards are collective). */
static int write_sample(run_ctx *x, const char *outdir, int writer) {
    int n = x->r.train.sample_tokens;
    if (n <= 0) return 0;
    char path[TR_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/sample.txt", outdir);
    FILE *f = writer ? fopen(path, "w") : NULL;
    int bad = writer && !f ? run_cannot_write(path, errno) : 0;
    printf("\n--- sample (%d tokens%s%s) ---\n", n, f ? ", also in " : "", f ? path : "");
    fflush(stdout);
    /* sample into a memory stream once, then show it and save it */
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    sample(x, n, x->r.train.seed, mem);
    fclose(mem);
    fwrite(buf, 1, len, stdout);
    printf("\n---\n");
    if (f) {
        fwrite(buf, 1, len, f);
        bad = run_close_output(f, path);
    }
    free(buf);
    return bad;
}

/* ---- what each rank contributed ---------------------------------------------------------- */

typedef struct {
    double compute_s, wait_s, data_s, steps;
    double pp_idle;         /* the pipeline's idle share of its schedules; -1 without one */
    double mem[5], pred[5]; /* bytes allocated (less ZeRO's transient bucket buffers) and
                               predicted: parameters, gradients, optimizer, activations,
                               scratch */
    char host[64], device[96];
} rank_row;

/* Every rank's ledger to rank 0, which prints a table and writes OUT/ranks.json: where the
 * time went on each rank, and which rank the others waited for. -1 when out of memory, 1 when
 * ranks.json could not be written (said in one line). */
static int rank_table(const run_ctx *x, double pp_idle) {
    tr_comm *world = x->world;
    const rank_ledger *led = &x->led;
    const char *device = x->device, *out = x->r.train.out;
    int n = tr_comm_size(world), me = tr_comm_rank(world);
    rank_row row, *rows = calloc((size_t)n, sizeof(rank_row));
    if (!rows) return -1;
    memset(&row, 0, sizeof(row));
    row.compute_s = led->compute_s, row.wait_s = led->wait_s, row.data_s = led->data_s;
    row.steps = (double)led->steps;
    row.pp_idle = pp_idle;
    tr_memory m = tr_model_memory(x->model), p = x->predicted;
    m.grads += tr_dp_grad_bytes(x->dp) - tr_dp_grad_buffer_bytes(x->dp);
    const size_t *mv[5] = {&m.params, &m.grads, &m.optimizer, &m.activations, &m.scratch},
                 *pv[5] = {&p.params, &p.grads, &p.optimizer, &p.activations, &p.scratch};
    for (int k = 0; k < 5; k++)
        row.mem[k] = (double)*mv[k], row.pred[k] = (double)*pv[k];
    tr_hostname(row.host, sizeof(row.host));
    /* the device without the start-up notes after ';' (why there is no GPU, and so on) */
    snprintf(row.device, sizeof(row.device), "%.*s", (int)strcspn(device, ";"), device);
    tr_comm_all_gather(world, &row, rows, sizeof(rank_row), TR_COMM_BYTE);
    int bad = 0;
    if (me == 0) {
        int slow = 0, fast = 0;
        for (int k = 1; k < n; k++) {
            if (rows[k].compute_s > rows[slow].compute_s) slow = k;
            if (rows[k].compute_s < rows[fast].compute_s) fast = k;
        }
        printf("per rank, over %.0f steps: seconds computing | in exposed communication | "
               "waiting for other ranks | waiting for data (the ledger's split)\n",
               rows[0].steps);
        for (int k = 0; k < n; k++) {
            double comm = tr_ledger_total(x->ledger, k, LED_COMM),
                   wait = tr_ledger_total(x->ledger, k, LED_WAIT);
            printf("  rank %-3d %-16.16s %8.2f %8.2f %8.2f %8.3f   %.60s\n", k, rows[k].host,
                   tr_ledger_total(x->ledger, k, LED_COMPUTE), comm, wait,
                   tr_ledger_total(x->ledger, k, LED_DATA), rows[k].device);
        }
        if (rows[slow].compute_s > 1.1 * rows[fast].compute_s)
            printf("rank %d computed longest (%.2f s against %.2f s on rank %d): the others waited "
                   "for it\n",
                   slow, rows[slow].compute_s, rows[fast].compute_s, fast);
        char path[TR_PATH_MAX + 32];
        snprintf(path, sizeof(path), "%s/ranks.json", out);
        FILE *f = fopen(path, "w");
        if (!f) bad = run_cannot_write(path, errno) ? 1 : 0;
        if (f) {
            fprintf(f, "[\n");
            for (int k = 0; k < n; k++) {
                fprintf(f, "  {\"rank\": %d, \"host\": ", k);
                tr_json_write_string(f, rows[k].host);
                fprintf(f, ", \"device\": ");
                tr_json_write_string(f, rows[k].device);
                fprintf(f,
                        ", \"steps\": %.0f, \"compute_s\": %.4f, \"wait_s\": %.4f, "
                        "\"data_wait_s\": %.4f, \"exposed_comm_s\": %.4f, "
                        "\"waited_for_others_s\": %.4f",
                        rows[k].steps, rows[k].compute_s, rows[k].wait_s, rows[k].data_s,
                        tr_ledger_total(x->ledger, k, LED_COMM),
                        tr_ledger_total(x->ledger, k, LED_WAIT));
                for (int j = 0; j < 2; j++) { /* [params, grads, optimizer, activations, scratch] */
                    const double *v = j ? rows[k].pred : rows[k].mem;
                    fprintf(f, ", \"%s\": [%.0f, %.0f, %.0f, %.0f, %.0f]",
                            j ? "predicted_bytes" : "memory_bytes", v[0], v[1], v[2], v[3], v[4]);
                }
                if (rows[k].pp_idle >= 0) fprintf(f, ", \"pipeline_idle\": %.4f", rows[k].pp_idle);
                fprintf(f, "}%s\n", k + 1 < n ? "," : "");
            }
            fprintf(f, "]\n");
            if (run_close_output(f, path)) bad = 1;
        }
    }
    free(rows);
    return bad;
}

/* ---- the step loop -------------------------------------------------------------------- */

typedef struct {
    float lr;
    double loss, norm;
    double dt, tps, gflops, mfu;
    int skipped; /* the guard's verdict (GUARD_*): the update was skipped */
} step_result;

/* Tests: die right after the step that saved (all ranks after rank 0 published the save, or
 * only this one, abruptly). */
static void fault_kill(run_ctx *x, int step) {
    if (step != x->kill_step || step <= x->start_step) return;
    tr_ckpt_wait(x->ckw, x->err, sizeof(x->err));
    if (!x->kill_alone) tr_comm_barrier(x->world);
    fflush(NULL);
    raise(SIGKILL); /* as if killed after the step that saved */
}

/* The bytes this rank holds as the layout predicts them: on a GPU every byte the backend
 * allocated (the arenas, the workspaces, ZeRO's bucket buffers: all sized before the first
 * step); elsewhere its arena and ZeRO's gradient pieces (not ZeRO-2/3's bucket buffers, which
 * memory.json gives). */
static double rank_memory(const run_ctx *x) {
    if (x->be->device_memory) {
        size_t now = 0;
        tr_backend_cuda_memory(&now, NULL);
        return (double)now;
    }
    tr_memory m = tr_model_memory(x->model);
    return (double)(m.params + m.grads + m.optimizer + m.activations + m.scratch +
                    tr_dp_grad_bytes(x->dp) - tr_dp_grad_buffer_bytes(x->dp));
}

/* The update of a step the guard let through: clipping and AdamW. Returns the seconds waited
 * for the checkpoint's copy of the state (which must be taken before the update). */
static double update(run_ctx *x, const step_result *res) {
    const tr_optim_desc *o = &x->r.optim;
    tr_adamw opt = {.lr = res->lr,
                    .beta1 = o->beta1,
                    .beta2 = o->beta2,
                    .eps = o->eps,
                    .weight_decay = o->weight_decay,
                    .grad_scale = 1.0f};
    if (o->grad_clip > 0 && res->norm > o->grad_clip)
        opt.grad_scale = (float)(o->grad_clip / (res->norm + 1e-6));
    double fence = tr_ckpt_fence(x->ckw);
    tr_dp_step(x->dp, &opt);
    return fence;
}

/* One optimizer step: the micro-batches' forward and backward (the loss of each scaled to its
 * share of the global batch, 1 / the step's micro-batches over the dp replicas), the gradients summed over the dp group
 * during the last backward, then the guard's verdict (trainer/run/guard.c) and, unless it skips
 * the step, clipping and AdamW. -1 on bad data or when the guard stops the run (said). */
/* Seconds the GPU's compute stream has stood waiting for NCCL operations so far, over the
 * groups of the mesh, as CUDA events timed them (comm.h): the communication a host clock
 * cannot see, as the host never blocks on NCCL. 0 without device collectives. */
static double device_exposed(const run_ctx *x) {
    tr_comm *g[3] = {x->dpc, x->tpc, x->ppc};
    double sum = 0, span, exposed;
    for (int i = 0; i < 3; i++)
        if (g[i] && tr_comm_size(g[i]) > 1 && tr_comm_device_time(g[i], &span, &exposed))
            sum += exposed;
    return sum;
}

static int train_step(run_ctx *x, int step, step_result *res) {
    const tr_recipe *r = &x->r;
    /* this replica's micro-batches (uneven dp_shares: its own), of the step's total */
    int accum = tr_layout_accum_of(&x->lay, tr_comm_rank(x->dpc));
    int total = tr_layout_step_micro_batches(&x->lay);
    double t0 = tr_now(), c0 = tr_comm_wait_seconds(), w0 = tr_loader_wait_seconds(x->loader);
    double e0 = x->be->device_memory ? device_exposed(x) : 0;
    double k0 = tr_dp_get_stats(x->dp).mask_s;
    float scale = 1.0f / (float)total * run_guard_fault(x, step);
    res->lr = lr_at(r, step);
    tr_model_zero_grad(x->model);
    if (step == x->start_step && run_dump_arm(x)) return -1; /* TR_DUMP_TENSORS, tests */
    double loss = 0;
    for (int a = 0; a < accum; a++) {
        int *in = x->pipe ? x->mb_in[a] : x->inputs, *tg = x->pipe ? x->mb_tg[a] : x->targets;
        if (tr_loader_next(x->loader, in, tg)) {
            fprintf(stderr, "%s%s: %s\n", x->tty ? "\n" : "", r->path, tr_loader_error(x->loader));
            return -1;
        }
        run_guard_targets(x, step, tg, (long)x->B * x->T, a == accum - 1); /* tests */
        if (x->pipe) continue; /* the schedule runs them all below */
        double m0 = tr_now();
        loss += tr_model_forward(x->model, x->inputs, x->targets, x->B, x->T, scale);
        if (a == accum - 1) tr_dp_arm(x->dp); /* reduce buckets during the last backward */
        tr_model_backward(x->model);
        tr_dp_micro_end(x->dp);
        tr_trace_span(x->trace, TR_SPAN_MODEL, m0, tr_now(), a, -1);
    }
    /* a pipeline: ZeRO 0 and 1 reduce each bucket during the chunks' last backwards (the
       executor calls the gradient hook in those only); ZeRO 2 and 3 every micro-batch */
    if (x->pipe && !tr_dp_zero(x->dp).grads) tr_dp_arm(x->dp);
    if (x->pipe)
        loss = tr_pipe_step(x->pipe, (const int *const *)x->mb_in, (const int *const *)x->mb_tg,
                            x->B, x->T, scale);
    if (x->slow_ms > 0 && step + 1 >= x->slow_from) { /* all of it, signals or not */
        struct timespec ts = {x->slow_ms / 1000, (x->slow_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) && errno == EINTR) {
        }
    }
    double g0 = tr_now();
    if (tr_dp_sync_grads(x->dp)) return -1;
    tr_trace_span(x->trace, TR_SPAN_GRADS, g0, tr_now(), -1, -1);
    int dumped = run_dump_step(x);
    if (dumped < 0) return -1;
    if (dumped) x->out_failed = 1;
    res->loss = tr_dp_sum(x->dp, loss) / total;
    res->norm = tr_dp_grad_norm(x->dp);
    /* both are reduced over every rank (dp sum; the norm over dp, tp and pp; a pipeline's loss
       is every stage's): every rank comes to the same verdict */
    res->skipped = run_guard_judge(x, step, res->loss, res->norm);
    if (res->skipped < 0) return -1;
    double fence = 0, u0 = tr_now();
    if (res->skipped)
        tr_dp_drop_grads(x->dp); /* the parameters and AdamW state stay as they were */
    else
        fence = update(x, res);
    res->dt = tr_now() - t0;
    tr_trace_span(x->trace, TR_SPAN_UPDATE, u0, t0 + res->dt, -1, -1);
    tr_trace_span(x->trace, TR_SPAN_STEP, t0, t0 + res->dt, -1, -1);
    x->t_train += res->dt;
    if (step > x->start_step) { /* the first step of a start warms up: not the plan's */
        x->steps_s += res->dt;
        x->steps_n++;
    }
    double dev = x->be->device_memory ? device_exposed(x) - e0 : 0; /* NCCL, GPU-timed */
    tr_ledger_step_waits w = {.t0 = t0,
                              .comm_s = tr_comm_wait_seconds() - c0 + dev,
                              .data_s = tr_loader_wait_seconds(x->loader) - w0,
                              .fence_s = fence,
                              .idle_s = x->pipe ? tr_pipe_last_idle_seconds(x->pipe) : 0,
                              .mask_s = tr_dp_get_stats(x->dp).mask_s - k0};
    tr_ledger_step(x->ledger, &w);
    x->led.compute_s += res->dt - w.comm_s - w.data_s, x->led.wait_s += w.comm_s;
    x->led.data_s += w.data_s;
    x->led.steps++;
    double mine[TR_LEDGER_EXTRA] = {[FIG_PIPE_IDLE] = x->pipe ? tr_pipe_last_idle(x->pipe) : 0,
                                    [FIG_MEMORY] = rank_memory(x),
                                    [FIG_STOP] = run_stop_signal()};
    tr_ledger_gather(x->ledger, step, mine, x->all_steps, x->all_compute);
    x->mem_most = 0;
    x->stop_sig = 0; /* a signal may reach one rank only, or the ranks in different steps */
    for (int k = 0; k < x->nranks; k++) {
        const double *fig = x->all_steps + TR_LEDGER_EXTRA * k;
        if (fig[FIG_MEMORY] > x->mem_most) x->mem_most = fig[FIG_MEMORY];
        if (!x->stop_sig) x->stop_sig = (int)fig[FIG_STOP]; /* the lowest rank's names it */
    }
    res->tps = (double)x->tokens_step / res->dt;
    res->gflops = x->flops_tok * res->tps / 1e9;
    /* every process of the world brings its own peak */
    res->mfu = x->peak > 0 ? res->gflops / (x->peak * x->nranks) : NAN;
    return 0;
}

/* The share of the data-parallel group's communication hidden behind compute: on the host
 * the gradient reductions' exposed wait against their span (dp.h); NCCL operations as the GPU
 * timed them (comm.h), which there include ZeRO's parameter gathers. */
static double dp_hidden(const run_ctx *x, double *exposed_s, double *span_s) {
    if (tr_comm_device_time(x->dpc, span_s, exposed_s))
        return *span_s > 0 ? 1.0 - *exposed_s / *span_s : 1.0;
    tr_dp_stats ds = tr_dp_get_stats(x->dp);
    *exposed_s = ds.exposed_s;
    *span_s = ds.span_s;
    return tr_dp_hidden_fraction(x->dp);
}

/* Rank 0's metrics.jsonl line; a file that cannot be written is said once and training goes
 * on (the ranks stay in step), the run then exits with 1. */
static void write_metrics(run_ctx *x, int step, const step_result *res, int do_eval, double val,
                          int tasks) {
    FILE *m = x->metrics;
    if (!m) return;
    /* JSON has no inf or nan: a skipped step's loss or norm, an unknown peak, are null
       (tr_json_write_num, as every figure here) */
    fprintf(m, "{\"step\": %d, \"loss\": ", step + 1);
    tr_json_write_num(m, res->loss, 17);
    const struct {
        const char *key;
        double v;
        int digits;
    } num[] = {{"lr", res->lr, 6},
               {"grad_norm", res->norm, 6},
               {"tokens_per_s", res->tps, -1},
               {"gflops", res->gflops, -2},
               {"time", tr_ledger_unix_now(), -3}};
    for (size_t i = 0; i < sizeof num / sizeof *num; i++) {
        fprintf(m, ", \"%s\": ", num[i].key);
        tr_json_write_num(m, num[i].v, num[i].digits);
    }
    fprintf(m, ", \"attempt\": %d, \"mfu\": ", tr_ledger_attempt(x->ledger));
    tr_json_write_num(m, res->mfu, -4);
    if (res->skipped)
        fprintf(m, ", \"skipped\": \"%s\"", res->skipped == GUARD_NAN ? "nan" : "spike");
    double dp_exposed, dp_span;
    if (x->lay.dp > 1) {
        fprintf(m, ", \"comm_hidden\": ");
        tr_json_write_num(m, dp_hidden(x, &dp_exposed, &dp_span), -4);
    }
    if (x->nranks > 1) {
        fprintf(m, ", \"rank_compute_s\": [");
        for (int k = 0; k < x->nranks; k++) {
            fputs(k ? ", " : "", m);
            tr_json_write_num(m, x->all_compute[k], -4);
        }
        fprintf(m, "]");
    }
    if (x->pipe) { /* each rank's idle share of the pipeline schedule */
        fprintf(m, ", \"pipeline_idle\": [");
        for (int k = 0; k < x->nranks; k++) {
            fputs(k ? ", " : "", m);
            tr_json_write_num(m, x->all_steps[TR_LEDGER_EXTRA * k + FIG_PIPE_IDLE], -4);
        }
        fprintf(m, "]");
    }
    if (do_eval) {
        fprintf(m, ", \"val_loss\": ");
        tr_json_write_num(m, val, -6);
    }
    if (tasks) run_tasks_write(x, m);
    /* the plan's prediction beside the measured step and the fullest process's memory */
    const struct {
        const char *key;
        double v;
        int digits;
    } tail[] = {{"step_s", res->dt, 6},
                {"predicted_step_s", x->plan_step_s, 6},
                {"memory_bytes", x->mem_most, 0},
                {"predicted_memory_bytes", x->plan_mem, 0}};
    for (size_t i = 0; i < sizeof tail / sizeof *tail; i++) {
        fprintf(m, ", \"%s\": ", tail[i].key);
        tr_json_write_num(m, tail[i].v, tail[i].digits);
    }
    fprintf(m, "}\n");
    if (fflush(m) || ferror(m)) {
        int e = errno;
        fprintf(stderr,
                "%strainer run: cannot write '%s': %s (training goes on without "
                "metrics; the run will exit with status 1)\n",
                x->tty ? "\n" : "", x->metrics_path, strerror(e ? e : EIO));
        fclose(m);
        x->metrics = NULL;
        x->out_failed = 1;
    }
}

/* "12.3K tok/s, 4.5 GFLOP/s, MFU 1.2%" at tps tokens a second, the pieces joined by sep. */
static void fmt_rates(const run_ctx *x, double tps, const char *sep, char *buf, size_t n) {
    char tk[32], mfu[32] = "n/a";
    tr_fmt_count(tps, tk, sizeof(tk));
    double gflops = x->flops_tok * tps / 1e9;
    if (x->peak > 0) snprintf(mfu, sizeof(mfu), "%.1f%%", 100.0 * gflops / (x->peak * x->nranks));
    snprintf(buf, n, "%s tok/s%s%.1f GFLOP/s%sMFU %s", tk, sep, gflops, sep, mfu);
}

int run_progress_tty(const char *flag, char *msg, size_t len) {
    static const char *const ways[] = {"tty", "lines", NULL};
    int env = -1;
    char m[256];
    if (tr_env_word("TR_PROGRESS", ways, &env, m, sizeof m) < 0) {
        snprintf(msg, len, "trainer run: %s", m);
        return -1;
    }
    if (flag) return !strcmp(flag, "tty"); /* checked with the flags */
    if (env >= 0) return env == 0;
    /* Open MPI (OMPI_*, PMIx), MPICH's Hydra (PMI_RANK) and Slurm's srun set these */
    static const char *launcher[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK",
                                     "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof(launcher) / sizeof(launcher[0]); i++)
        if (getenv(launcher[i])) return 0;
    return isatty(STDOUT_FILENO);
}

/* The progress line: the rates over its window, the steps since the last line that ended
 * (the first step of a start, which warms up, is a window of its own). On a terminal the line
 * is rewritten every step and ends each log step; else only log steps print it. */
static void print_progress(run_ctx *x, int step, const step_result *res, int do_eval, double val,
                           int tasks) {
    int steps = x->r.train.steps, every = x->r.train.log_every, last = step + 1 == steps;
    int first = step == x->start_step, ends = (step + 1) % every == 0 || last || do_eval || tasks;
    if (!x->tty) ends |= first;
    if (!(x->tty || ends)) return;
    double n = step + 1 - x->win_step, dt = x->t_train - x->win_t;
    double tps = dt > 0 ? (double)x->tokens_step * n / dt : 0;
    char eta[32], rates[128];
    tr_fmt_seconds((steps - step - 1) * (dt / n), eta, sizeof(eta));
    fmt_rates(x, tps, " | ", rates, sizeof(rates));
    printf("%sstep %*d/%d | loss %.4f | lr %.2e | %s | ETA %s", x->tty ? "\r\033[K" : "",
           (int)snprintf(NULL, 0, "%d", steps), step + 1, steps, res->loss, res->lr, rates, eta);
    if (do_eval) printf(" | val_loss %.4f", val);
    for (int i = 0; tasks && i < x->n_tasks; i++)
        printf(" | %s acc %.3f", x->tasks[i].name, x->task_res[i].acc);
    if (ends) printf("\n");
    if (ends || first) x->win_step = step + 1, x->win_t = x->t_train;
    fflush(stdout);
}

/* --trace: the window's spans to rank 0, which writes OUT/trace.json and names it. A file
 * that cannot be written fails the run's outputs (exit 1), not its training. */
static int end_trace(run_ctx *x) {
    if (!x->trace) return 0;
    if (tr_trace_end(x->trace, x->err, sizeof(x->err))) {
        fprintf(stderr, "trainer run: %s\n", x->err);
        x->out_failed = 1;
    } else if (x->rank == 0) {
        printf("trace: %s/trace.json (open it in ui.perfetto.dev; bench/pp_bubble.py reads it)\n",
               x->r.train.out);
    }
    return 0;
}

/* Rank 0's device as its runtime counts it (cudaMemGetInfo: the CUDA context, the libraries'
 * handles and NCCL's buffers too, and any other process's on the device) beside the plan's
 * figure for one process: what rank 0 predicted plus the runtime's reserve
 * (tr_plan_runtime_reserve). tests/gpu/check.sh shows the ratio. */
static void print_device_use(const run_ctx *x, double predicted) {
    size_t used, total;
    if (tr_backend_cuda_device_use(&used, &total)) return;
    int g = tr_cluster_group_of(&x->cluster, 0, NULL);
    const char *from = "assumed";
    double reserve = tr_plan_runtime_reserve(g >= 0 ? x->cluster.g[g].device : "", &from);
    double plan = predicted + reserve;
    char u[32], t[32], p[32], r[32];
    tr_fmt_bytes((double)used, u, sizeof u), tr_fmt_bytes((double)total, t, sizeof t);
    tr_fmt_bytes(plan, p, sizeof p), tr_fmt_bytes(reserve, r, sizeof r);
    printf("device memory: in use on rank 0's device %s of %s (cudaMemGetInfo: %.0f bytes); "
           "planned %s (%.0f bytes: predicted, and the runtime's reserve of %s, %s): %.3fx\n",
           u, t, (double)used, p, plan, r, from, plan > 0 ? (double)used / plan : 0.0);
}

/* After the first step: the device memory this process holds (every byte of the run, none is
 * allocated later) beside what the layout predicted for it, the fullest rank's on rank 0. */
static void print_device_memory(run_ctx *x) {
    const tr_memory *p = &x->predicted;
    size_t now = 0;
    tr_backend_cuda_memory(&now, NULL);
    double mine[2] = {(double)(p->params + p->grads + p->optimizer + p->activations + p->scratch +
                               p->workspace + p->buffers),
                      (double)now},
           *all = malloc((size_t)x->nranks * sizeof(mine));
    if (!all) return;
    tr_comm_all_gather(x->world, mine, all, 2, TR_COMM_F64);
    int most = 0, differ = -1;
    for (int k = 0; k < x->nranks; k++) {
        if (all[2 * k + 1] > all[2 * most + 1]) most = k;
        if (differ < 0 && all[2 * k] != all[2 * k + 1]) differ = k;
    }
    if (x->rank == 0) {
        char a[32], b[32];
        tr_fmt_bytes(all[2 * most], a, sizeof a);
        tr_fmt_bytes(all[2 * most + 1], b, sizeof b);
        printf("device memory: predicted %s, allocated %s (%.0f and %.0f bytes%s%s)\n", a, b,
               all[2 * most], all[2 * most + 1], x->nranks > 1 ? ", the fullest rank" : "",
               differ < 0 ? ", equal on every rank" : "");
        if (differ >= 0)
            printf("device memory: rank %d predicted %.0f bytes, allocated %.0f\n", differ,
                   all[2 * differ], all[2 * differ + 1]);
        print_device_use(x, all[0]);
    }
    free(all);
}

/* The steps from start_step: each trained, then saved, evaluated and logged as the recipe
 * says, until the last or a requested stop. 0 when all were trained, -1 when one failed
 * (said), else the stop's exit status (trainer/run/stop.c). */
static int run_steps(run_ctx *x) {
    const tr_train_desc *t = &x->r.train;
    x->t_start = tr_now();
    x->win_step = x->start_step;
    for (int step = x->start_step; step < t->steps; step++) {
        fault_kill(x, step);
        tr_trace_step(x->trace, step);
        step_result res;
        if (train_step(x, step, &res)) return -1;
        tr_ledger_step_done(x->ledger, step + 1);
        if (x->be->device_memory) { /* every device byte is held from now on */
            if (step == x->start_step) print_device_memory(x);
            tr_backend_cuda_step_done(step + 1 - x->start_step);
        }
        if (x->guard.bad >= t->guard.max_bad) { /* back to a checkpoint, past these batches */
            int to;
            if (run_guard_rollback(x, step, &to)) return -1;
            step = to - 1;
            continue;
        }
        int last = step + 1 == t->steps;
        int saved =
            x->ckw && t->checkpoint_every > 0 && ((step + 1) % t->checkpoint_every == 0 || last);
        if (saved) run_checkpoint(x, step + 1);
        int do_eval = t->eval_every > 0 && ((step + 1) % t->eval_every == 0 || last);
        double val = NAN;
        if (do_eval) {
            if (evaluate(x, &val)) {
                fprintf(stderr, "%s%s: %s\n", x->tty ? "\n" : "", x->r.path,
                        tr_loader_error(x->loader));
                return -1;
            }
            if (val < x->best_val) x->best_val = val;
            do_eval = isfinite(val); /* no validation data: nothing to report */
            tr_ledger_mark(x->ledger, LED_EVAL);
        }
        int tasks = run_tasks_due(x, step, last);
        if (tasks) {
            if (run_tasks_score(x)) return -1;
            tr_ledger_mark(x->ledger, LED_EVAL);
        }
        write_metrics(x, step, &res, do_eval, val, tasks);
        print_progress(x, step, &res, do_eval, val, tasks);
        tr_ledger_mark(x->ledger, LED_LOG);
        /* every rank saw the same stop_sig in this step's gather; the last step just ends */
        if (x->stop_sig && !last) return end_trace(x), run_stop_save(x, step + 1, saved);
    }
    fault_kill(x, t->steps); /* after the last step's save, before the end of the run */
    if (x->be->device_memory) tr_backend_cuda_step_done(0); /* sampling's caches may follow */
    return end_trace(x);
}

/* ---- the end of the run --------------------------------------------------------------- */

/* OUT/memory.json (rank 0): the layout, what this process allocated by kind (measured after
 * training: the high-water marks of ZeRO's bucket buffers are only known then) and what the
 * layout predicted (tr_layout_memory: the same as the measured figures but for those
 * buffers). */
static void write_memory_json(run_ctx *x) {
    if (x->rank != 0) return;
    tr_memory m = tr_model_memory(x->model), p = x->predicted;
    size_t gbuf = tr_dp_grad_buffer_bytes(x->dp), pbuf = tr_dp_param_buffer_bytes(x->dp);
    m.grads += tr_dp_grad_bytes(x->dp);
    m.params += pbuf; /* ZeRO-3: gathered buckets, high water */
    char path[TR_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/memory.json", x->r.train.out);
    FILE *f = fopen(path, "w");
    if (!f) {
        x->out_failed = 1;
        run_cannot_write(path, errno);
        return;
    }
    fprintf(f,
            "{\"ranks\": %d, \"dp\": %d, \"tp\": %d, \"pp\": %d, \"sequence_parallel\": %s, "
            "\"micro_batch\": %d, \"zero\": %d, \"params\": %zu, \"param_buffers\": %zu, "
            "\"grads\": %zu, \"grad_buffers\": %zu, \"optimizer\": %zu, \"activations\": %zu, "
            "\"scratch\": %zu,\n \"predicted\": {\"params\": %zu, \"grads\": %zu, "
            "\"optimizer\": %zu, \"activations\": %zu, \"scratch\": %zu, \"buffers\": %zu, "
            "\"workspace\": %zu}}\n",
            x->nranks, x->lay.dp, x->lay.tp, x->lay.pp, x->lay.sequence_parallel ? "true" : "false",
            x->lay.micro_batch, x->lay.zero, m.params, pbuf, m.grads, gbuf, m.optimizer,
            m.activations, m.scratch, p.params, p.grads, p.optimizer, p.activations, p.scratch,
            p.buffers, p.workspace);
    if (run_close_output(f, path)) x->out_failed = 1;
}

/* What the parallel runtime did: gradient reductions and how much of them the backward hid,
 * ZeRO's parameter gathers, tensor parallelism's collectives. */
static void print_parallel_stats(const run_ctx *x) {
    int zero = x->lay.zero; /* for the messages; what it shards: */
    tr_zero sh = tr_dp_zero(x->dp);
    if (x->be->device_memory && x->nranks > 1) { /* each group's, chosen at its first use */
        tr_comm *g[3] = {x->dpc, x->tpc, x->ppc};
        printf("device collectives:");
        for (int i = 0; i < 3; i++)
            if (tr_comm_size(g[i]) > 1)
                printf(" %s %s", tr_comm_name(g[i]), tr_comm_device_transport(g[i]));
        printf("\n");
    }
    if (x->lay.dp > 1) {
        tr_dp_stats ds = tr_dp_get_stats(x->dp);
        double exposed, span, hidden = dp_hidden(x, &exposed, &span), unused[2];
        int dev = tr_comm_device_time(x->dpc, &unused[0], &unused[1]); /* whose figures */
        printf("data parallel: %ld bucket %s over %ld steps; %.0f%% of the %s hidden behind "
               "%s (%.3g s exposed of %.3g s%s; the plan priced %.0f%%)\n",
               ds.buckets, sh.grads ? "reduce-scatters" : "all-reduces", ds.steps, 100.0 * hidden,
               dev ? "group's communication" : "gradient communication",
               dev ? "compute" : "the backward", exposed, span,
               dev ? " in flight, timed on the GPU" : "", 100.0 * x->plan_hidden);
        if (x->lay.private_gradients)
            printf("private gradients: masking took %.3g s over %ld steps (the fixed point, the "
                   "masks and unmasking: the ledger's mask_s; the sums that set each bucket's "
                   "scale are communication)\n",
                   ds.mask_s, ds.steps);
        if (sh.params)
            printf("ZeRO-3: %ld bucket all-gathers of parameters before the ops that read them; "
                   "waited %.3g s for them (the rest overlapped the previous op)\n",
                   ds.param_gathers, ds.gather_s);
        else if (sh.optimizer)
            printf("ZeRO-%d: %ld parameter %s after the updates, bringing back %ld buckets, "
                   "%ld of them waited for by the forward op that reads them (the others right "
                   "after the update); waited %.3g s in all\n",
                   zero, ds.param_gathers, sh.grads ? "all-gathers" : "broadcasts", ds.refreshed,
                   ds.refreshed_by_op, ds.gather_s);
    }
    if (x->lay.tp > 1) {
        /* training and evaluation so far (the sample at the end comes after) */
        tr_tp_stats ts = tr_model_tp_stats(x->model);
        double steps = x->r.train.steps - x->start_step;
        double span_dev, exposed_dev; /* the GPU's timing, where it times them */
        int dev = tr_comm_device_time(x->tpc, &span_dev, &exposed_dev);
        if (dev) ts.span_s = span_dev, ts.exposed_s = exposed_dev;
        printf("tensor parallel: %.0f collectives and %.3f MB sent by this process per step; "
               "the compute waited %.1f ms per step for them%s",
               ts.ops / steps, ts.bytes / steps / 1e6, 1e3 * ts.exposed_s / steps,
               dev ? " (timed on the GPU)" : "");
        if ((dev || tr_comm_progress_agent()) && ts.span_s > 0) /* else: nothing overlapped */
            printf(", %.0f%% of their time in flight was hidden behind compute",
                   100.0 * fmax(0.0, 1.0 - ts.exposed_s / ts.span_s)); /* a wait can outlast
                   the operation: it returns only once its thread runs again */
        printf("\n");
    }
}

/* Pipeline parallelism: every stage's idle share of its schedules (rank 0 prints them, one
 * per stage: the first rank of each), beside the schedule's theoretical bubble. */
static void print_pipeline(const run_ctx *x, double idle) {
    if (!x->pipe) return;
    int P = x->lay.pp, n = x->nranks;
    double *all = malloc((size_t)n * sizeof(double));
    if (!all) return;
    tr_comm_all_gather(x->world, &idle, all, 1, TR_COMM_F64);
    const tr_pp_schedule *s = tr_pipe_schedule(x->pipe);
    tr_pipe_stats ps = tr_pipe_get_stats(x->pipe);
    if (x->rank == 0) {
        printf("pipeline %s, %d stages x %d micro-batches%s: idle share of the step by stage",
               tr_pp_kind_name(s->kind), P, s->M,
               s->kind == TR_PP_INTERLEAVED ? " (interleaved)"
               : s->V > 1                   ? " (in a V)"
                                            : "");
        for (int p = 0; p < P; p++) {
            tr_layout_coord c = {.d = 0, .p = p, .t = 0};
            int rank = (c.d * P + c.p) * x->lay.tp + c.t;
            printf("%s%.1f%%", p ? ", " : " ", 100.0 * all[rank]);
        }
        printf(" (theory %.1f%%); %.3f MB sent to the next or previous stage per step\n",
               100.0 * tr_pp_bubble(s), ps.steps ? ps.bytes / ps.steps / 1e6 : 0.0);
    }
    free(all);
}

/* The plan's prediction against the run, in a line: the mean step after the first, and the
 * fullest process's memory after the last step. */
static void report_plan(const run_ctx *x) {
    double most = x->mem_most;
    if (x->rank != 0 || x->steps_n == 0 || !(x->plan_step_s > 0)) return;
    double step = x->steps_s / x->steps_n, es = step / x->plan_step_s - 1;
    double em = x->plan_mem > 0 ? most / x->plan_mem - 1 : 0;
    char pm[32], mm[32];
    tr_fmt_bytes(x->plan_mem, pm, sizeof pm);
    tr_fmt_bytes(most, mm, sizeof mm);
    printf("plan vs run: step %.4g s predicted, %.4g s measured (%+.1f%%); memory %s predicted, "
           "%s measured (%+.1f%%)\n",
           x->plan_step_s, step, 100 * es, pm, mm, 100 * em);
}

/* The summary, the last save, memory.json, the parallel figures, the table of ranks, the
 * sample and (tests) the parameters. Returns the exit status. */
static int run_report(run_ctx *x) {
    const tr_recipe *r = &x->r;
    char tt[32], rates[128];
    tr_fmt_seconds(tr_now() - x->t_start, tt, sizeof(tt));
    const run_guard *g = &x->guard;
    long trained = r->train.steps - x->start_step + g->redone; /* rollbacks train some again */
    fmt_rates(x, (double)x->tokens_step * trained / x->t_train, ", ", rates, sizeof(rates));
    printf("done: %d steps in %s, %s (mean over the run), waited for data %.3f%% of the time",
           r->train.steps, tt, rates, 100.0 * tr_loader_wait_seconds(x->loader) / x->t_train);
    if (isfinite(x->best_val)) printf(", best val_loss %.4f", x->best_val);
    printf("\n");
    if (g->skipped)
        printf("guard: %ld step(s) skipped, %d rollback(s) (%d steps trained again)\n", g->skipped,
               g->rollbacks, g->redone);
    if (x->ckw) {
        int failed = tr_ckpt_wait(x->ckw, x->err, sizeof(x->err));
        tr_ckpt_stats cs = tr_ckpt_writer_stats(x->ckw);
        double t_run = tr_now() - x->t_start; /* the stalls include the wait for the last save */
        char size[32];
        tr_fmt_bytes((double)cs.bytes, size, sizeof(size));
        printf("checkpoints: %d saved in %s/checkpoints/ (%s each; host copy %.3f s, "
               "written in %.2f s on average); training waited %.3f s for them (%.2f%% of the "
               "run's time)\n",
               cs.saves, r->train.out, size, cs.saves ? cs.copy_s / cs.saves : 0.0,
               cs.saves ? cs.write_s / cs.saves : 0.0, cs.stall_s, 100.0 * cs.stall_s / t_run);
        if (failed) {
            fprintf(stderr, "trainer run: %s\n", x->err);
            return 1;
        }
    } else {
        printf("checkpoints: none saved (checkpoint_every 0): rerun with --set "
               "checkpoint_every=N to keep the trained model for export and sample\n");
    }
    write_memory_json(x);
    report_plan(x);
    print_parallel_stats(x);
    double idle = -1;
    if (x->pipe) {
        tr_pipe_stats ps = tr_pipe_get_stats(x->pipe);
        idle = ps.step_s > 0 ? ps.idle_s / ps.step_s : 0;
    }
    print_pipeline(x, idle);
    int rt = x->nranks > 1 ? rank_table(x, idle) : 0;
    if (rt < 0) return 1;
    if (rt > 0) x->out_failed = 1;
    /* tensor and pipeline parallelism, ZeRO-3: the sampling forwards are collective, every
       rank takes part (all draw the same tokens), rank 0 writes them */
    int together = x->lay.tp > 1 || tr_dp_zero(x->dp).params || x->pipe;
    tr_dp_hold_params(x->dp, 1); /* ZeRO-3: each bucket gathered once */
    if ((x->rank == 0 || together) && write_sample(x, r->train.out, x->rank == 0))
        x->out_failed = 1;
    tr_dp_hold_params(x->dp, 0);
    if (x->dump_params) {
        int bad = run_dump_params(x, x->dump_params);
        if (bad < 0) {
            fprintf(stderr, "trainer: rank %d: out of memory for TR_DUMP_PARAMS\n", x->rank);
            return 1;
        }
        if (bad) x->out_failed = 1;
    }
    return x->out_failed ? 1 : 0;
}

/* The GPU's power, SM clock and temperature for the ledger (NVML, where present). */
static int gpu_telemetry(double out[3]) {
    tr_gpu_telemetry t;
    int rc = tr_backend_cuda_telemetry(&t);
    out[0] = t.power_w, out[1] = t.sm_mhz, out[2] = t.temp_c;
    return rc;
}

/* The ledger of this attempt (collective): NULL when out of memory (said). TR_LEDGER=off
 * (benchmarks: the baseline) keeps its accounts but writes no files and names no straggler. */
static tr_ledger *open_ledger(run_ctx *x, const char *command) {
    char layout[256];
    snprintf(layout, sizeof(layout),
             "{\"dp\": %d, \"tp\": %d, \"pp\": %d, \"zero\": %d, \"micro_batch\": %d, "
             "\"accumulation\": %d}",
             x->lay.dp, x->lay.tp, x->lay.pp, x->lay.zero, x->lay.micro_batch, x->lay.accum);
    tr_ledger_opts o = {.out = x->r.train.out,
                        .resume = x->o.resume,
                        .start_step = x->start_step,
                        .steps = x->r.train.steps,
                        .hosts = x->hosts,
                        .devices = x->devices,
                        .layout = layout,
                        .command = command,
                        .flops_step = x->flops_tok * (double)x->tokens_step,
                        .tokens_step = x->tokens_step,
                        .files = !x->ledger_off,
                        .tty = x->tty,
                        .telemetry = x->be->device_memory ? gpu_telemetry : NULL};
    tr_ledger *L = tr_ledger_open(x->world, &o);
    if (!L) fprintf(stderr, "trainer run: rank %d: out of memory for the ledger\n", x->rank);
    return L;
}

int tr_cmd_run(int argc, char **argv) {
    tr_ledger_clock_start();
    run_ctx *x = calloc(1, sizeof(*x));
    char *command = tr_shell_join(argc, argv);
    if (!x || !command) {
        fprintf(stderr, "trainer run: out of memory\n");
        free(x), free(command);
        return 1;
    }
    int status = 1;
    x->lock_fd = -1;
    if (!run_setup(x, &argc, &argv, &status) && (x->ledger = open_ledger(x, command))) {
        run_stop_listen(1);
        int rc = run_steps(x), ok = rc >= 0;
        run_stop_listen(0);
        status = rc == 0 ? run_report(x) : rc < 0 ? 1 : rc;
        tr_ledger_close(x->ledger, status, ok);
    }
    free(command);
    run_free(x);
    return status;
}
