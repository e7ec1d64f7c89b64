/* `trainer run RECIPE`: the training loop. Loads the recipe, builds the model on the CPU
 * backend, and runs: data -> forward/backward over the micro-batches of a step -> clip ->
 * AdamW, with a live progress line, metrics.jsonl, evaluations and a sample at the end. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/loader.h"
#include "data/tokenizer.h"
#include "trainer/trainer.h"

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

typedef struct {
    const tr_recipe *r;
    tr_model *model;
    tr_loader *loader;
    int B, T;
    int *inputs, *targets;
} run_state;

/* Mean loss over the first eval_tokens of the validation split (the same batches every time). */
static double evaluate(run_state *s) {
    long want = s->r->train.eval_tokens / ((long)s->B * s->T);
    long have = tr_loader_val_batches(s->loader);
    if (want < 1) want = 1;
    if (want > have) want = have;
    double sum = 0;
    for (long i = 0; i < want; i++) {
        tr_loader_val_batch(s->loader, i, s->inputs, s->targets);
        sum += tr_model_forward(s->model, s->inputs, s->targets, s->B, s->T, 0);
    }
    return sum / (double)want;
}

/* Sample n tokens after a newline, temperature 1, from the model's full distribution. */
static void sample(run_state *s, int n, unsigned long long seed, FILE *out) {
    tr_tokenizer tok;
    char err[128];
    if (tr_tokenizer_init(&tok, s->r->data.tokenizer, err, sizeof(err))) return;
    int V = s->r->model.vocab, T = s->T;
    int *ctx = malloc((size_t)(n + 1) * sizeof(int));
    float *logits = malloc((size_t)V * sizeof(float));
    int len = (int)tr_tokenizer_encode(&tok, "\n", 1, ctx);
    unsigned long long st = seed * 0x9e3779b97f4a7c15ULL + 7;
    for (int i = 0; i < n; i++) {
        int start = len > T ? len - T : 0;
        tr_model_last_logits(s->model, ctx + start, 1, len - start, logits);
        float mx = logits[0];
        for (int v = 1; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
        double sum = 0;
        for (int v = 0; v < V; v++) sum += exp((double)(logits[v] - mx));
        st ^= st << 13, st ^= st >> 7, st ^= st << 17; /* xorshift64 */
        double u = (double)(st >> 11) / 9007199254740992.0 * sum, acc = 0;
        int pick = V - 1;
        for (int v = 0; v < V; v++) {
            acc += exp((double)(logits[v] - mx));
            if (acc > u) {
                pick = v;
                break;
            }
        }
        ctx[len++] = pick;
        char bytes[8];
        size_t nb = tr_tokenizer_decode(&tok, pick, bytes);
        fwrite(bytes, 1, nb, out);
    }
    free(ctx);
    free(logits);
}

static void write_sample(run_state *s, const char *outdir) {
    int n = s->r->train.sample_tokens;
    if (n <= 0) return;
    char path[TR_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/sample.txt", outdir);
    FILE *f = fopen(path, "w");
    printf("\n--- sample (%d tokens, also in %s) ---\n", n, path);
    fflush(stdout);
    /* sample into a memory stream once, then show it and save it */
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    sample(s, n, s->r->train.seed, mem);
    fclose(mem);
    fwrite(buf, 1, len, stdout);
    printf("\n---\n");
    if (f) {
        fwrite(buf, 1, len, f);
        fclose(f);
    }
    free(buf);
}

int tr_cmd_run(int argc, char **argv) {
    tr_options o;
    int rc = tr_parse_options(&o, "run", argc, argv, 2);
    if (rc) return rc < 0 ? 2 : 0;
    tr_recipe r;
    if (tr_load_recipe(&r, &o, "run")) return 1;
    char err[1024];
    int status = 1;
    run_state s = {.r = &r};
    FILE *metrics = NULL;
    const char *out = r.train.out;

    double peak;
    char device_desc[512];
    const tr_backend *be =
        tr_choose_backend(&o, &peak, device_desc, sizeof(device_desc), err, sizeof(err));
    if (!be) {
        fprintf(stderr, "trainer run: %s\n", err);
        goto done;
    }
    int micro, accum;
    if (tr_resolve_micro_batch(&r, 1, be->dtype, 0, &micro, &accum, err, sizeof(err))) {
        fprintf(stderr, "%s: %s\n", r.path, err);
        goto done;
    }
    if (!r.train.micro_batch)
        printf("micro_batch auto -> %d sequences (%d accumulation step(s) per %ld-token step)\n",
               micro, accum, r.train.batch_tokens);
    r.train.micro_batch = micro;
    s.B = micro;
    s.T = r.model.seq_len;

    if (tr_mkdirs(out, err, sizeof(err))) {
        fprintf(stderr, "trainer run: %s\n", err);
        goto done;
    }
    char path[TR_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/recipe.lua", out);
    FILE *rf = fopen(path, "w");
    if (!rf || tr_recipe_write_lua(&r, rf)) {
        fprintf(stderr, "trainer run: cannot write '%s'\n", path);
        if (rf) fclose(rf);
        goto done;
    }
    fclose(rf);
    snprintf(path, sizeof(path), "%s/metrics.jsonl", out);
    metrics = fopen(path, "w");
    if (!metrics) {
        fprintf(stderr, "trainer run: cannot write '%s'\n", path);
        goto done;
    }

    if (tr_loader_open(&s.loader, &r.data, r.model.vocab, 0, 1, s.B, s.T, r.train.seed, err,
                       sizeof(err))) {
        fprintf(stderr, "%s: %s\n", r.path, err);
        goto done;
    }
    if (tr_model_init(&s.model, &r.model, be, s.B, s.T, err, sizeof(err))) {
        fprintf(stderr, "%s: %s\n", r.path, err);
        goto done;
    }
    tr_model_init_params(s.model, r.train.seed);
    s.inputs = malloc((size_t)s.B * s.T * sizeof(int));
    s.targets = malloc((size_t)s.B * s.T * sizeof(int));

    double flops_tok = tr_cost_train_flops_per_token(&r.model, s.T);
    peak /= 1e9; /* GFLOP/s from here on */
    {
        char np[32], ft[32], tt[32], vt[32];
        tr_fmt_count((double)tr_model_num_elements(s.model), np, sizeof(np));
        tr_fmt_count(flops_tok, ft, sizeof(ft));
        tr_fmt_count((double)tr_loader_train_tokens(s.loader), tt, sizeof(tt));
        tr_fmt_count((double)tr_loader_val_tokens(s.loader), vt, sizeof(vt));
        printf("model %s params, %s training FLOPs/token | data %s train + %s val tokens\n"
               "device %s\n",
               np, ft, tt, vt, device_desc);
        printf("training %d steps of %ld tokens, micro-batch %d x %d, output in %s/\n",
               r.train.steps, r.train.batch_tokens, s.B, s.T, out);
    }

    int tty = isatty(STDOUT_FILENO);
    double t_start = tr_now(), t_train = 0, best_val = INFINITY;
    long tokens_step = (long)s.B * s.T * accum;
    tr_adamw opt = {.beta1 = r.optim.beta1,
                    .beta2 = r.optim.beta2,
                    .eps = r.optim.eps,
                    .weight_decay = r.optim.weight_decay};
    for (int step = 0; step < r.train.steps; step++) {
        double t0 = tr_now();
        float lr = lr_at(&r, step);
        tr_model_zero_grad(s.model);
        double loss = 0;
        for (int a = 0; a < accum; a++) {
            tr_loader_next(s.loader, s.inputs, s.targets);
            loss += tr_model_forward(s.model, s.inputs, s.targets, s.B, s.T, 1.0f / (float)accum);
            tr_model_backward(s.model);
        }
        loss /= accum;
        double norm = tr_model_grad_norm(s.model);
        if (!isfinite(loss) || !isfinite(norm)) {
            fprintf(stderr, "\n%s: step %d: loss is %g and gradient norm %g: training diverged "
                    "(lower optimizer.lr or raise schedule.warmup)\n",
                    r.path, step + 1, loss, norm);
            goto done;
        }
        opt.lr = lr;
        opt.grad_scale = 1.0f;
        if (r.optim.grad_clip > 0 && norm > r.optim.grad_clip)
            opt.grad_scale = (float)(r.optim.grad_clip / (norm + 1e-6));
        tr_model_adamw_step(s.model, &opt);
        double dt = tr_now() - t0;
        t_train += dt;
        double tps = (double)tokens_step / dt, gflops = flops_tok * tps / 1e9;
        double mfu = gflops / peak;

        int last = step + 1 == r.train.steps;
        int do_eval = r.train.eval_every > 0 && ((step + 1) % r.train.eval_every == 0 || last);
        double val = NAN;
        if (do_eval) {
            val = evaluate(&s);
            if (val < best_val) best_val = val;
        }
        fprintf(metrics,
                "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6g, "
                "\"tokens_per_s\": %.1f, \"gflops\": %.2f, \"mfu\": %.4f",
                step + 1, loss, lr, norm, tps, gflops, mfu);
        if (do_eval) fprintf(metrics, ", \"val_loss\": %.6f", val);
        fprintf(metrics, "}\n");
        fflush(metrics);

        /* progress: rolling figures since the start (after the first, warm-up step) */
        int show = tty || (step + 1) % r.train.log_every == 0 || step == 0 || last || do_eval;
        if (show) {
            double avg_tps = (double)tokens_step * (step + 1) / t_train;
            char eta[32], tk[32];
            tr_fmt_duration((r.train.steps - step - 1) * (t_train / (step + 1)), eta, sizeof(eta));
            tr_fmt_count(avg_tps, tk, sizeof(tk));
            printf("%sstep %*d/%d | loss %.4f | lr %.2e | %s tok/s | %.1f GFLOP/s | MFU %.1f%% | "
                   "ETA %s",
                   tty ? "\r\033[K" : "", (int)snprintf(NULL, 0, "%d", r.train.steps), step + 1,
                   r.train.steps, loss, lr, tk, flops_tok * avg_tps / 1e9,
                   100.0 * flops_tok * avg_tps / 1e9 / peak, eta);
            if (do_eval) printf(" | val_loss %.4f", val);
            if (!tty || (step + 1) % r.train.log_every == 0 || last || do_eval) printf("\n");
            fflush(stdout);
        }
    }
    {
        char tt[32], tk[32];
        tr_fmt_duration(tr_now() - t_start, tt, sizeof(tt));
        tr_fmt_count((double)tokens_step * r.train.steps / t_train, tk, sizeof(tk));
        printf("done: %d steps in %s, %s tok/s on average", r.train.steps, tt, tk);
        if (isfinite(best_val)) printf(", best val_loss %.4f", best_val);
        printf("\n");
    }
    write_sample(&s, out);
    status = 0;
done:
    if (metrics) fclose(metrics);
    free(s.inputs);
    free(s.targets);
    tr_model_free(s.model);
    tr_loader_free(s.loader);
    tr_recipe_free(&r);
    return status;
}
