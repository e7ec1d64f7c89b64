/* `trainer run RECIPE`: the training loop. Loads the recipe, builds the model on the CPU
 * backend, and runs: data -> forward/backward over the micro-batches of a step -> clip ->
 * AdamW, with a live progress line, metrics.jsonl, evaluations and a sample at the end. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "data/corpus.h"
#include "data/loader.h"
#include "parallel/comm.h"
#include "parallel/dp.h"
#include "data/tokenizer.h"
#include "trainer/checkpoint.h"
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

/* Mean loss over the first eval_tokens of the validation split (the same batches every time);
 * NAN when there are no validation data, -1 with a message on bad data. */
static int evaluate(run_state *s, tr_dp *dp, int nranks, double *loss) {
    /* eval_tokens is global: every rank evaluates its own slice of the same batches */
    long want = s->r->train.eval_tokens / ((long)s->B * s->T * nranks);
    long have = tr_loader_val_batches(s->loader);
    if (want < 1) want = 1;
    if (want > have) want = have;
    double sum = 0;
    for (long i = 0; i < want; i++) {
        if (tr_loader_val_batch(s->loader, i, s->inputs, s->targets) < 0) return -1;
        sum += tr_model_forward(s->model, s->inputs, s->targets, s->B, s->T, 0);
    }
    sum = tr_dp_sum(dp, sum);
    *loss = want > 0 ? sum / (double)(want * nranks) : NAN;
    return 0;
}

/* Sample n tokens, temperature 1, from the model's full distribution, after <|endoftext|>
 * (GPT-2) or a newline (byte-level); tokens are decoded to their exact bytes. */
static void sample(run_state *s, int n, unsigned long long seed, FILE *out) {
    tr_tokenizer *tok;
    char err[512];
    const tr_data_desc *d = &s->r->data;
    if (tr_tokenizer_open(&tok, d->tokenizer, d->encoder, d->merges, err, sizeof(err))) {
        fprintf(stderr, "%s: sample: %s\n", s->r->path, err);
        return;
    }
    int prompt[8], len = 1, *ids = malloc((size_t)n * sizeof(int));
    prompt[0] = tr_tokenizer_eot(tok);
    if (prompt[0] < 0) len = (int)tr_tokenizer_encode(tok, "\n", 1, prompt);
    if (tr_sample_tokens(s->model, prompt, len, n, 1.0f, 0, seed, ids, err, sizeof(err))) {
        fprintf(stderr, "%s: sample: %s\n", s->r->path, err);
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

/* A fault-injection variable for tests: unset or empty leaves *a (and *b) alone; "N", or
 * "N:M" where b is given, sets them; anything else is -1 with the message in msg. */
static int env_count(const char *name, long *a, long *b, char *msg, size_t msglen) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10), y = 0;
    int ok = !errno && end != v && x >= 0;
    if (ok && b) {
        const char *m = end;
        ok = *m == ':' && m[1];
        if (ok) y = strtol(m + 1, &end, 10);
        ok = ok && !errno && end != m + 1 && y >= 0;
    }
    if (!ok || *end) {
        snprintf(msg, msglen, "trainer run: %s must be %s, got '%s'", name,
                 b ? "RANK:MILLISECONDS" : "a non-negative integer", v);
        return -1;
    }
    *a = x;
    if (b) *b = y;
    return 0;
}

/* One line for an output file that could not be written (opened, written or closed). */
static int cannot_write(const char *path, int e) {
    fprintf(stderr, "trainer run: cannot write '%s': %s\n", path, strerror(e ? e : EIO));
    return -1;
}

/* Closes an output file; -1 (and the line) when anything written to it did not reach it. */
static int close_output(FILE *f, const char *path) {
    int e = ferror(f) ? (errno ? errno : EIO) : 0;
    if (fclose(f) && !e) e = errno ? errno : EIO;
    return e ? cannot_write(path, e) : 0;
}

/* A resumed run appends to metrics.jsonl: first the records of steps after the checkpoint
 * (written before the run was interrupted, and about to be written again) are dropped, so
 * every step has one record. The file is rewritten to a temporary and renamed over. */
static int trim_metrics(FILE **mf, const char *path, long step) {
    char tmp[TR_PATH_MAX + 48];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    fclose(*mf);
    *mf = NULL;
    FILE *in = fopen(path, "r"), *out = in ? fopen(tmp, "w") : NULL;
    if (!in || !out) {
        int e = errno;
        if (in) fclose(in);
        return cannot_write(in ? tmp : path, e);
    }
    char *line = NULL;
    size_t cap = 0;
    long dropped = 0;
    while (getline(&line, &cap, in) > 0) {
        long k;
        if (sscanf(line, "{\"step\": %ld", &k) == 1 && k > step)
            dropped++;
        else
            fputs(line, out);
    }
    free(line);
    fclose(in);
    if (close_output(out, tmp)) return -1;
    if (rename(tmp, path)) return cannot_write(path, errno);
    if (dropped)
        printf("metrics.jsonl: dropped %ld record(s) of steps after %ld (they are trained again)\n",
               dropped, step);
    *mf = fopen(path, "a");
    return *mf ? 0 : cannot_write(path, errno);
}

/* Returns -1 when the writer could not save the sample (the others still take part: under
 * ZeRO-3 the sampling forwards are collective). */
static int write_sample(run_state *s, const char *outdir, int writer) {
    int n = s->r->train.sample_tokens;
    if (n <= 0) return 0;
    char path[TR_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/sample.txt", outdir);
    FILE *f = writer ? fopen(path, "w") : NULL;
    int bad = writer && !f ? cannot_write(path, errno) : 0;
    printf("\n--- sample (%d tokens%s%s) ---\n", n, f ? ", also in " : "", f ? path : "");
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
        bad = close_output(f, path);
    }
    free(buf);
    return bad;
}

/* ---- what each rank contributed ---------------------------------------------------------- */

typedef struct {
    double compute_s, wait_s, data_s;
    long steps;
} rank_ledger;

typedef struct {
    double compute_s, wait_s, data_s, steps;
    char host[64], device[96];
} rank_row;

/* Every rank's ledger to rank 0, which prints a table and writes OUT/ranks.json: where the
 * time went on each rank, and which rank the others waited for. -1 when out of memory, 1 when
 * ranks.json could not be written (said in one line). */
static int rank_table(tr_comm *world, const rank_ledger *led, const char *device, const char *out) {
    int n = tr_comm_size(world), me = tr_comm_rank(world);
    rank_row row, *rows = calloc((size_t)n, sizeof(rank_row));
    if (!rows) return -1;
    memset(&row, 0, sizeof(row));
    row.compute_s = led->compute_s, row.wait_s = led->wait_s, row.data_s = led->data_s;
    row.steps = (double)led->steps;
    if (gethostname(row.host, sizeof(row.host) - 1)) snprintf(row.host, sizeof(row.host), "?");
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
        printf("per rank, over %.0f steps: seconds computing | waiting (communication, other "
               "ranks) | waiting for data\n", rows[0].steps);
        for (int k = 0; k < n; k++)
            printf("  rank %-3d %-16.16s %8.2f %8.2f %8.3f   %.60s\n", k, rows[k].host,
                   rows[k].compute_s, rows[k].wait_s, rows[k].data_s, rows[k].device);
        if (rows[slow].compute_s > 1.1 * rows[fast].compute_s)
            printf("rank %d computed longest (%.2f s against %.2f s on rank %d): the others waited "
                   "for it\n", slow, rows[slow].compute_s, rows[fast].compute_s, fast);
        char path[TR_PATH_MAX + 32];
        snprintf(path, sizeof(path), "%s/ranks.json", out);
        FILE *f = fopen(path, "w");
        if (!f) bad = cannot_write(path, errno) ? 1 : 0;
        if (f) {
            fprintf(f, "[\n");
            for (int k = 0; k < n; k++) {
                fprintf(f, "  {\"rank\": %d, \"host\": ", k);
                tr_json_write_string(f, rows[k].host);
                fprintf(f, ", \"device\": ");
                tr_json_write_string(f, rows[k].device);
                fprintf(f, ", \"steps\": %.0f, \"compute_s\": %.4f, \"wait_s\": %.4f, "
                        "\"data_wait_s\": %.4f}%s\n", rows[k].steps, rows[k].compute_s,
                        rows[k].wait_s, rows[k].data_s, k + 1 < n ? "," : "");
            }
            fprintf(f, "]\n");
            if (close_output(f, path)) bad = 1;
        }
    }
    free(rows);
    return bad;
}

/* Checkpoint c into the model and the loader, if the recipe still matches it: 0; -1 with err
 * when it cannot be used (another recipe, nothing left to do); 1 when a block this process
 * reads is damaged (lazily read checkpoints: an older one may do). */
static int use_checkpoint(run_state *s, const tr_recipe *r, tr_ckpt *c, char *err,
                          size_t errlen) {
    tr_recipe saved;
    char chunk[TR_PATH_MAX + 32];
    snprintf(chunk, sizeof(chunk), "%s/manifest.yaml", c->dir);
    int rc = tr_recipe_load_string(&saved, c->recipe, chunk, ".", NULL, 0, err, errlen);
    if (!rc) {
        rc = tr_ckpt_compare_recipes(&saved, r, stdout, err, errlen);
        tr_recipe_free(&saved);
    }
    if (rc) return -1;
    if (c->step >= r->train.steps) {
        if (snprintf(err, errlen, "%s is at step %ld and the recipe trains %d steps: nothing to "
                     "do (raise --steps)", c->dir, c->step, r->train.steps) < 0)
            err[0] = 0;
        return -1;
    }
    if (tr_ckpt_apply(c, s->model, err, errlen)) return 1;
    if (c->has_loader && tr_loader_set_pos(s->loader, c->loader, err, errlen)) return -1;
    return 0;
}

/* --resume: the newest checkpoint in OUT that verifies, if the recipe still matches it. Restores
 * the parameters, the AdamW state and step count, and the loader position; *start is the
 * number of steps done. One process verifies every file first; several ranks each check only
 * the blocks they read, and when any rank finds one damaged, all go back to the checkpoint
 * before (each rank that found damage says where). */
static int resume_from(run_state *s, tr_comm *world, const tr_recipe *r, int *start, char *err,
                       size_t errlen) {
    tr_ckpt c;
    int rc = -1, me = tr_comm_rank(world);
    double t0 = tr_now();
    if (tr_comm_size(world) == 1) {
        if (tr_ckpt_find_resume(r->train.out, &c, 1, stdout, err, errlen)) return -1;
        rc = use_checkpoint(s, r, &c, err, errlen) ? -1 : 0;
    } else {
        long *steps;
        int n = tr_ckpt_steps(r->train.out, &steps);
        if (snprintf(err, errlen, "no usable checkpoint in %s/checkpoints/", r->train.out) < 0)
            err[0] = 0;
        for (int i = 0; i < n; i++) {
            char dir[TR_PATH_MAX + 64], why[768];
            snprintf(dir, sizeof(dir), "%s/checkpoints/step_%08ld", r->train.out, steps[i]);
            int opened = tr_ckpt_read_lazy(&c, dir, 1, why, sizeof(why)) == 0;
            int mine = opened ? use_checkpoint(s, r, &c, why, sizeof(why)) : 1;
            long long v[2] = {mine == 1, mine < 0}; /* damaged here, unusable here */
            tr_comm_all_reduce(world, v, 2, TR_COMM_I64);
            if (mine == 1) fprintf(stderr, "trainer: rank %d: checkpoint %s: %s\n", me, dir, why);
            if (v[1]) { /* a reason that is not damage (recipe, steps): said by one rank */
                if (snprintf(err, errlen, "%s", mine < 0 ? why : "another rank's reason") < 0)
                    err[0] = 0;
                if (opened) tr_ckpt_free(&c);
                rc = mine < 0 ? -1 : -2;
                break;
            }
            if (!v[0]) {
                rc = 0;
                break;
            }
            if (me == 0) printf("skipping checkpoint %s: damaged (found by %lld rank(s))\n", dir, v[0]);
            if (opened) tr_ckpt_free(&c);
        }
        free(steps);
        if (rc) return rc;
    }
    if (!rc) {
        double t_read = tr_now() - t0, bytes = 0;
        for (int i = 0; i < c.n_files; i++) bytes += (double)c.files[i].size;
        *start = (int)c.step;
        printf("resuming from %s (step %ld; checkpoint of %.3f GB read and verified in %.2f s)\n",
               c.dir, c.step, bytes / 1e9, t_read);
    }
    tr_ckpt_free(&c);
    return rc;
}

/* Every rank must hold the same `what` (64 hex digits) as rank 0: -1 with a message naming
 * the ranks that differ (each of them also says so on its stderr). */
/* A setup step that can fail on some ranks only: every rank says whether its step failed
 * (with its message), and all leave together, so no rank is left waiting in a collective
 * until the timeout. The lowest failing rank prints its message, once: as it is when every
 * rank failed (the same mistake everywhere), after its rank number when only some did.
 * Returns 1 on every rank when any rank failed. */
static int setup_failed(tr_comm *world, int bad, const char *msg) {
    int n = tr_comm_size(world), me = tr_comm_rank(world);
    if (n <= 1) {
        if (bad && msg && *msg) fprintf(stderr, "%s\n", msg);
        return bad != 0;
    }
    long long *v = calloc((size_t)n, sizeof(long long));
    if (!v) {
        fprintf(stderr, "trainer: rank %d: out of memory\n", me);
        exit(1); /* mpirun ends the others */
    }
    v[me] = bad != 0;
    tr_comm_all_reduce(world, v, (size_t)n, TR_COMM_I64);
    int first = -1, count = 0;
    for (int k = 0; k < n; k++)
        if (v[k]) {
            count++;
            if (first < 0) first = k;
        }
    free(v);
    if (me == first && msg && *msg) {
        if (count == n)
            fprintf(stderr, "%s\n", msg);
        else if (!strncmp(msg, "trainer run: ", 13))
            fprintf(stderr, "trainer run: rank %d%s: %s\n", me, count > 1 ? " (and others)" : "",
                    msg + 13);
        else
            fprintf(stderr, "rank %d%s: %s\n", me, count > 1 ? " (and others)" : "", msg);
    }
    return count > 0;
}

/* Every rank must have what rank 0 has (a hash of it in `mine`): 1 on every rank if not, said
 * once, naming the first rank that differs. */
static int ranks_agree(tr_comm *world, const char *what, const char mine[65]) {
    if (tr_comm_size(world) <= 1) return 0;
    char root[65], msg[300];
    memcpy(root, mine, sizeof(root));
    tr_comm_broadcast(world, root, 64, TR_COMM_BYTE, 0);
    int differs = memcmp(root, mine, 64) != 0;
    snprintf(msg, sizeof(msg), "trainer run: the %s differs from rank 0's: every rank must run "
             "the same recipe, flags and files", what);
    return setup_failed(world, differs, msg);
}

/* Checkpoints and --resume need OUT to be one folder all ranks see and write: rank 0 writes a
 * file with a nonce there, every rank reads it back and writes a file of its own. 1 on every
 * rank when some rank cannot (said once, by the lowest such rank). */
static int out_is_shared(tr_comm *world, const char *out) {
    int n = tr_comm_size(world), me = tr_comm_rank(world);
    if (n <= 1) return 0;
    char path[TR_PATH_MAX + 64], mine[TR_PATH_MAX + 80], want[65], got[65] = {0};
    snprintf(want, sizeof(want), "%016llx%016llx%032d", (unsigned long long)tr_now() * 1000003ULL,
             (unsigned long long)getpid(), 0);
    tr_comm_broadcast(world, want, 64, TR_COMM_BYTE, 0);
    want[64] = 0;
    snprintf(path, sizeof(path), "%s/.shared_check_%.16s", out, want);
    if (me == 0) {
        FILE *f = fopen(path, "w");
        if (f) {
            fputs(want, f);
            fclose(f);
        }
    }
    tr_comm_barrier(world);
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(got, sizeof(got), f)) got[0] = 0;
        fclose(f);
    }
    char host[64] = "?", msg[TR_PATH_MAX + 300] = "";
    gethostname(host, sizeof(host) - 1);
    int bad = strcmp(got, want) != 0;
    if (bad) {
        snprintf(msg, sizeof(msg), "trainer run: on %s, the output folder '%s' is not shared with "
                 "rank 0 (its files are not there): checkpoints and --resume need one folder "
                 "every rank sees (a shared file system)", host, out);
    } else if (me > 0) { /* every rank writes its part of each checkpoint there */
        snprintf(mine, sizeof(mine), "%s.r%d", path, me);
        FILE *w = fopen(mine, "w");
        int e = w ? 0 : errno;
        if (w && fclose(w)) e = errno ? errno : EIO;
        if (w) remove(mine);
        if (e) {
            bad = 1;
            snprintf(msg, sizeof(msg), "trainer run: on %s, cannot write in the output folder "
                     "'%s': %s (every rank writes its part of each checkpoint there)", host, out,
                     strerror(e));
        }
    }
    int failed = setup_failed(world, bad, msg);
    tr_comm_barrier(world);
    if (me == 0) remove(path);
    return failed;
}

/* The resolved recipe and every option that changes what a rank does (ranks launched with
 * other flags or test variables would otherwise meet in mismatched collectives). */
static void recipe_sha(const tr_recipe *r, const tr_options *o, int zero, char out[65]) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    tr_recipe_write_lua(r, f);
    const char *pad = getenv("TR_PAD_VOCAB"), *sync = getenv("TR_CKPT_SYNC");
    /* resolved values, so that equivalent settings agree (--zero 0 and the recipe's 0) */
    fprintf(f, "\n-- options: zero %d, dp %d, resume %d, device %s, precision %s, timeout %.17g, "
            "TR_PAD_VOCAB %d, TR_CKPT_SYNC %d\n", zero, o->dp > 0 ? o->dp : 0, o->resume,
            o->device ? o->device : "auto", o->precision ? o->precision : "default",
            o->timeout > 0 ? o->timeout : 300.0, pad && *pad ? atoi(pad) : 0,
            sync && *sync && strcmp(sync, "0"));
    fclose(f);
    tr_sha256_hex(text, len, out);
    free(text);
}

/* Started by a launcher with other processes (mpirun, srun)? */
static int launched_with_others(void) {
    const char *v[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"};
    for (int i = 0; i < 4; i++) {
        const char *e = getenv(v[i]);
        if (e && atoi(e) > 1) return 1;
    }
    return 0;
}

int tr_cmd_run(int argc, char **argv) {
    tr_options o;
    char pmsg[600];
    int rc = tr_parse_options_msg(&o, "run", argc, argv, 2, pmsg, sizeof(pmsg));
    if (rc > 0) return 0;
    if (rc < 0) {
        /* Under a launcher, connect first, so that a mistake made on every rank is said once
           and one made on some ranks only still ends the others at once (setup_failed: the
           same collective the others meet after loading the recipe). */
        tr_comm *w = NULL;
        char cerr[256];
        if (launched_with_others() && !tr_comm_init(&w, &argc, &argv, 0, cerr, sizeof(cerr))) {
            setup_failed(w, 1, pmsg);
            tr_comm_free(w);
        } else {
            fprintf(stderr, "%s\n", pmsg);
        }
        return 2;
    }
    char err[1024] = ""; /* setup steps format it into msg even when they succeed */
    tr_comm *world = NULL;
    if (tr_comm_init(&world, &argc, &argv, o.timeout, err, sizeof(err))) {
        fprintf(stderr, "trainer run: %s\n", err);
        return 1;
    }
    int rank = tr_comm_rank(world), nranks = tr_comm_size(world);
    if (rank > 0 && !freopen("/dev/null", "w", stdout)) /* rank 0 owns progress and output */
        fprintf(stderr, "trainer: rank %d: cannot silence stdout\n", rank);
    tr_recipe r;
    char msg[TR_PATH_MAX + 1100]; /* a setup step's failure, for setup_failed */
    int rbad = tr_load_recipe_msg(&r, &o, "run", msg, sizeof(msg));
    if (setup_failed(world, rbad, msg)) {
        if (!rbad) tr_recipe_free(&r);
        tr_comm_free(world);
        return 1;
    }
    int status = 1;
    run_state s = {.r = &r};
    FILE *metrics = NULL;
    char metrics_path[TR_PATH_MAX + 32] = "";
    int out_failed = 0; /* an output file that could not be written: the run exits with 1 */
    tr_ckpt_writer *ckw = NULL;
    tr_dp *dp = NULL;
    double *all_steps = NULL; /* every rank's figures of the last step */
    const char *out = r.train.out;
    const tr_parallel_desc *par = &r.parallel;
    /* --zero overrides parallel.zero; --dp, like parallel.dp, must be the process count */
    int zero = o.zero >= 0 ? o.zero : par->zero < 0 ? 0 : par->zero;
    char fp[65];
    recipe_sha(&r, &o, zero, fp);
    if (ranks_agree(world, "resolved recipe or a flag", fp)) goto done;
    if (o.dp > 0 && o.dp != nranks) {
        if (rank == 0)
            fprintf(stderr, "trainer run: --dp %d does not fit %d process(es): the process count "
                            "comes from mpirun or srun\n", o.dp, nranks);
        goto done;
    }
    if ((par->dp > 0 && par->dp != nranks) || par->tp > 1 || par->pp > 1) {
        if (rank == 0)
            fprintf(stderr, "%s: parallel { dp = %d, tp = %d, pp = %d } does not fit %d process(es)"
                    "%s\n", r.path, par->dp, par->tp, par->pp, nranks,
                    par->tp > 1 || par->pp > 1 ? " (tensor and pipeline parallelism are not "
                                                 "implemented yet)" : "");
        goto done;
    }

    double peak;
    char device_desc[512];
    const tr_backend *be =
        tr_choose_backend(&o, &r, &peak, device_desc, sizeof(device_desc), err, sizeof(err));
    snprintf(msg, sizeof(msg), "trainer run: %s", err);
    if (setup_failed(world, !be, msg)) goto done;
    tr_layout lay;
    int mbad = tr_resolve_layout(&lay, &r, &o, nranks, be->dtype, "run", msg, sizeof(msg));
    if (setup_failed(world, mbad, msg)) goto done;
    int micro = lay.micro_batch, accum = lay.accum;
    snprintf(fp, sizeof(fp), "%032d%032d", micro, accum); /* "auto" is sized by each host's memory */
    if (ranks_agree(world, "resolved micro-batch", fp)) goto done;
    if (!r.train.micro_batch)
        printf("micro_batch auto -> %d sequences (%d accumulation step(s) per %ld-token step)\n",
               micro, accum, r.train.batch_tokens);
    r.train.micro_batch = micro;
    s.B = micro;
    s.T = r.model.seq_len;

    char path[TR_PATH_MAX + 32];
    int obad = rank == 0 && tr_mkdirs(out, err, sizeof(err));
    snprintf(msg, sizeof(msg), "trainer run: %s", err);
    if (setup_failed(world, obad, msg)) goto done;

    if (r.data.text[0] && r.data.tokenizer != TR_TOKENIZER_BYTE) {
        /* a text corpus for BPE: tokenized once into cached shards, on first use */
        char dir[TR_PATH_MAX + 64];
        int made = 0;
        double t0 = tr_now();
        int cbad = tr_corpus_cache(&r.data, dir, sizeof(dir), &made, NULL, NULL, err, sizeof(err));
        snprintf(msg, sizeof(msg), "%s: %s", r.path, err);
        if (setup_failed(world, cbad, msg)) goto done;
        if (made)
            printf("tokenized %s with %s into %s/ in %.1f s (first use; cached from now on)\n",
                   r.data.text, r.data.tokenizer == TR_TOKENIZER_GPT2 ? "gpt2" : "byte", dir,
                   tr_now() - t0);
    }
    int lbad = tr_loader_open(&s.loader, &r.data, r.model.vocab, rank, nranks, s.B, s.T,
                              r.train.seed, err, sizeof(err));
    snprintf(msg, sizeof(msg), "%s: %s", r.path, err);
    if (setup_failed(world, lbad, msg)) goto done;
    snprintf(fp, sizeof(fp), "%016llx%048d", (unsigned long long)tr_loader_fingerprint(s.loader), 0);
    if (ranks_agree(world, "data (sizes and sampled tokens)", fp)) goto done;
    if ((r.train.checkpoint_every > 0 || o.resume) && out_is_shared(world, out)) goto done;
    tr_model_opts mopts = {.B = s.B, .T = s.T, .recompute = (tr_recompute)r.train.recompute,
                           .shards = zero == 1 ? nranks : 1, .shard = rank,
                           .external_grads = zero == 2, .external_params = zero == 3};
    const char *padv = getenv("TR_PAD_VOCAB"); /* tests: the GPU's vocabulary padding on the CPU */
    if (padv && *padv) mopts.pad_vocab = atoi(padv);
    int ibad = tr_model_init_opts(&s.model, &r.model, be, &mopts, err, sizeof(err));
    snprintf(msg, sizeof(msg), "%s: %s", r.path, err);
    if (setup_failed(world, ibad, msg)) goto done;
    int dprc = tr_dp_init(&dp, s.model, world, zero, (size_t)r.parallel.bucket_kb << 10, err,
                          sizeof(err));
    snprintf(msg, sizeof(msg), "%s: %s", r.path, err);
    if (setup_failed(world, dprc, msg)) goto done; /* a refused configuration: said once */
    tr_model_init_params(s.model, r.train.seed);
    int start_step = 0;
    if (o.resume) {
        int rrc = resume_from(&s, world, &r, &start_step, err, sizeof(err));
        /* -2: this rank is fine but another's reason stops every rank (that rank says it) */
        snprintf(msg, sizeof(msg), "trainer run: --resume: %s", err);
        if (setup_failed(world, rrc == -1, msg) || rrc) goto done;
        snprintf(fp, sizeof(fp), "%064d", start_step); /* every rank from the same checkpoint */
        if (ranks_agree(world, "checkpoint step to resume from", fp)) goto done;
    } else if (r.init_hf[0]) {
        int hbad = tr_hf_import(s.model, r.init_hf, err, sizeof(err));
        snprintf(msg, sizeof(msg), "%s: %s", r.path, err);
        if (setup_failed(world, hbad, msg)) goto done;
        printf("initialized from the Hugging Face model in %s\n", r.init_hf);
    }
    /* OUT's files only now, so that a refused --resume leaves them as they were: the recipe,
       and metrics.jsonl (a resumed run appends, after dropping the steps it trains again) */
    int fbad = 0;
    msg[0] = 0; /* the helpers below print their own line */
    if (rank == 0) {
        snprintf(path, sizeof(path), "%s/recipe.lua", out);
        FILE *rf = fopen(path, "w");
        if (!rf) {
            fbad = cannot_write(path, errno);
        } else {
            int wbad = tr_recipe_write_lua(&r, rf);
            fbad = close_output(rf, path);
            if (!fbad && wbad) fbad = cannot_write(path, EIO);
        }
        snprintf(path, sizeof(path), "%s/metrics.jsonl", out);
        snprintf(metrics_path, sizeof(metrics_path), "%s", path);
        if (!fbad) {
            metrics = fopen(path, o.resume ? "a" : "w");
            if (!metrics) fbad = cannot_write(path, errno);
        }
        if (!fbad && o.resume) fbad = trim_metrics(&metrics, metrics_path, start_step);
    }
    if (setup_failed(world, fbad, msg)) goto done;
    /* every rank writes the part of each checkpoint it keeps; rank 0 also the manifest */
    size_t *ranges = NULL;
    if (r.train.checkpoint_every > 0) {
        const char *sync = getenv("TR_CKPT_SYNC"); /* benchmarks: the synchronous baseline */
        int n_ranges = tr_dp_ckpt_ranges(dp, &ranges);
        tr_ckpt_opts co = {.out = out, .keep = r.train.keep_checkpoints, .rank = rank,
                           .world = nranks, .ranges = ranges, .n_ranges = n_ranges,
                           .zero = zero, .sync = sync && *sync && strcmp(sync, "0"),
                           .timeout_s = o.timeout > 0 ? o.timeout : 300,
                           .overlap = !strcmp(be->name, "cpu")};
        int wrc = tr_ckpt_writer_init(&ckw, s.model, &r, &co, err, sizeof(err));
        free(ranges);
        snprintf(msg, sizeof(msg), "trainer run: %s", err);
        if (setup_failed(world, wrc, msg)) goto done;
    }
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
        tr_memory mem = tr_model_memory(s.model);
        mem.grads += tr_dp_grad_bytes(dp); /* ZeRO-2: its pieces and buffers */
        char b1[32], b2[32], b3[32], b4[32];
        tr_fmt_bytes((double)mem.params, b1, sizeof(b1));
        tr_fmt_bytes((double)mem.grads, b2, sizeof(b2));
        tr_fmt_bytes((double)mem.optimizer, b3, sizeof(b3));
        tr_fmt_bytes((double)(mem.activations + mem.scratch), b4, sizeof(b4));
        if (nranks > 1)
            printf("%d processes (%s), data parallel, ZeRO-%d | ", nranks, tr_comm_transport(),
                   zero);
        printf("memory per process: parameters %s, gradients %s, optimizer state %s, "
               "activations and scratch %s\n",
               b1, b2, b3, b4);
    }

    int tty = isatty(STDOUT_FILENO);
    double t_start = tr_now(), t_train = 0, best_val = INFINITY;
    long tokens_step = (long)s.B * s.T * accum * nranks;
    tr_adamw opt = {.beta1 = r.optim.beta1,
                    .beta2 = r.optim.beta2,
                    .eps = r.optim.eps,
                    .weight_decay = r.optim.weight_decay};
    /* tests: TR_FAULT_KILL_AFTER_STEP=S dies right after step S's save (TR_FAULT_KILL_RANK=R:
       only rank R); TR_FAULT_SLOW_RANK=R:MS makes rank R MS milliseconds slower every step */
    long kill_step = -1, kill_r = -1, slow_r = -1, slow_ms = 0;
    const char *kill_rank = getenv("TR_FAULT_KILL_RANK");
    int ebad = env_count("TR_FAULT_KILL_AFTER_STEP", &kill_step, NULL, msg, sizeof(msg)) ||
               env_count("TR_FAULT_KILL_RANK", &kill_r, NULL, msg, sizeof(msg)) ||
               env_count("TR_FAULT_SLOW_RANK", &slow_r, &slow_ms, msg, sizeof(msg));
    if (setup_failed(world, ebad, msg)) goto done; /* may be set on some ranks only */
    if (kill_r >= 0 && kill_r != rank) kill_step = -1;
    if (slow_r != rank) slow_ms = 0;
    /* what this rank did: computing, waiting (communication, and other ranks to catch up),
       waiting for data; per step (metrics.jsonl) and in all (the table at the end) */
    rank_ledger led = {0};
    all_steps = malloc((size_t)nranks * 3 * sizeof(double));
    if (!all_steps) goto done;
    for (int step = start_step; step < r.train.steps; step++) {
        if (step == kill_step && step > start_step) {
            tr_ckpt_wait(ckw, err, sizeof(err));
            if (!(kill_rank && *kill_rank)) /* all die: after rank 0 published the save */
                tr_comm_barrier(world);
            fflush(NULL);
            raise(SIGKILL); /* as if killed after the step that saved */
        }
        double t0 = tr_now(), c0 = tr_comm_wait_seconds(), w0 = tr_loader_wait_seconds(s.loader);
        float lr = lr_at(&r, step);
        tr_model_zero_grad(s.model);
        double loss = 0;
        for (int a = 0; a < accum; a++) {
            if (tr_loader_next(s.loader, s.inputs, s.targets)) {
                fprintf(stderr, "%s%s: %s\n", tty ? "\n" : "", r.path, tr_loader_error(s.loader));
                goto done;
            }
            /* the mean over the global batch: every rank's share is 1/(accum * ranks) */
            loss += tr_model_forward(s.model, s.inputs, s.targets, s.B, s.T,
                                     1.0f / (float)(accum * nranks));
            if (a == accum - 1) tr_dp_arm(dp); /* reduce buckets during the last backward */
            tr_model_backward(s.model);
            tr_dp_micro_end(dp);
        }
        if (slow_ms > 0) {
            struct timespec ts = {slow_ms / 1000, (slow_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        tr_dp_sync_grads(dp);
        loss = tr_dp_sum(dp, loss / accum) / nranks;
        double norm = tr_dp_grad_norm(dp);
        if (!isfinite(loss) || !isfinite(norm)) {
            fprintf(stderr, "%s%s: step %d: loss is %g and gradient norm %g: training diverged "
                    "(lower optimizer.lr or raise schedule.warmup)\n",
                    tty ? "\n" : "", r.path, step + 1, loss, norm); /* \n: past the progress line */
            goto done;
        }
        opt.lr = lr;
        opt.grad_scale = 1.0f;
        if (r.optim.grad_clip > 0 && norm > r.optim.grad_clip)
            opt.grad_scale = (float)(r.optim.grad_clip / (norm + 1e-6));
        tr_ckpt_fence(ckw); /* the checkpoint's copy of the state must be taken first */
        tr_dp_step(dp, &opt);
        double dt = tr_now() - t0;
        t_train += dt;
        double mine[3] = {0, tr_comm_wait_seconds() - c0, tr_loader_wait_seconds(s.loader) - w0};
        mine[0] = dt - mine[1] - mine[2];
        led.compute_s += mine[0], led.wait_s += mine[1], led.data_s += mine[2], led.steps++;
        if (nranks > 1) tr_comm_all_gather(world, mine, all_steps, 3, TR_COMM_F64);
        double tps = (double)tokens_step / dt, gflops = flops_tok * tps / 1e9;
        double mfu = peak > 0 ? gflops / (peak * nranks) : NAN; /* every rank brings its own peak */

        int last = step + 1 == r.train.steps;
        int save = r.train.checkpoint_every > 0 && ((step + 1) % r.train.checkpoint_every == 0 || last);
        if (save && ckw) {
            tr_loader_pos pos = tr_loader_get_pos(s.loader);
            tr_ckpt_save(ckw, step + 1, &pos);
        }
        int do_eval = r.train.eval_every > 0 && ((step + 1) % r.train.eval_every == 0 || last);
        double val = NAN;
        if (do_eval) {
            if (evaluate(&s, dp, nranks, &val)) {
                fprintf(stderr, "%s%s: %s\n", tty ? "\n" : "", r.path, tr_loader_error(s.loader));
                goto done;
            }
            if (val < best_val) best_val = val;
            do_eval = isfinite(val); /* no validation data: nothing to report */
        }
        if (metrics) {
            fprintf(metrics,
                    "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6g, "
                    "\"tokens_per_s\": %.1f, \"gflops\": %.2f, \"mfu\": ",
                    step + 1, loss, lr, norm, tps, gflops);
            if (isfinite(mfu)) /* JSON has no inf or nan: an unknown peak is null */
                fprintf(metrics, "%.4f", mfu);
            else
                fprintf(metrics, "null");
            if (nranks > 1) {
                fprintf(metrics, ", \"comm_hidden\": %.4f, \"rank_compute_s\": [", tr_dp_hidden_fraction(dp));
                for (int k = 0; k < nranks; k++)
                    fprintf(metrics, "%s%.4f", k ? ", " : "", all_steps[3 * k]);
                fprintf(metrics, "]");
            }
            if (do_eval) fprintf(metrics, ", \"val_loss\": %.6f", val);
            fprintf(metrics, "}\n");
            if (fflush(metrics) || ferror(metrics)) { /* a full disk: said once, training goes
                                                         on (ranks stay in step), exit 1 */
                int e = errno;
                fprintf(stderr, "%strainer run: cannot write '%s': %s (training goes on without "
                        "metrics; the run will exit with status 1)\n", tty ? "\n" : "",
                        metrics_path, strerror(e ? e : EIO));
                fclose(metrics);
                metrics = NULL;
                out_failed = 1;
            }
        }

        /* progress: rolling figures since the start (after the first, warm-up step) */
        int show = tty || (step + 1) % r.train.log_every == 0 || step == 0 || last || do_eval;
        if (show) {
            double avg_tps = (double)tokens_step * (step + 1 - start_step) / t_train;
            char eta[32], tk[32];
            tr_fmt_duration((r.train.steps - step - 1) * (t_train / (step + 1 - start_step)), eta,
                            sizeof(eta));
            tr_fmt_count(avg_tps, tk, sizeof(tk));
            char mfus[32] = "n/a";
            if (peak > 0 &&
                snprintf(mfus, sizeof(mfus), "%.1f%%",
                         100.0 * flops_tok * avg_tps / 1e9 / (peak * nranks)) < 0)
                mfus[0] = '\0';
            printf("%sstep %*d/%d | loss %.4f | lr %.2e | %s tok/s | %.1f GFLOP/s | MFU %s | "
                   "ETA %s",
                   tty ? "\r\033[K" : "", (int)snprintf(NULL, 0, "%d", r.train.steps), step + 1,
                   r.train.steps, loss, lr, tk, flops_tok * avg_tps / 1e9, mfus, eta);
            if (do_eval) printf(" | val_loss %.4f", val);
            if (!tty || (step + 1) % r.train.log_every == 0 || last || do_eval) printf("\n");
            fflush(stdout);
        }
    }
    {
        char tt[32], tk[32];
        tr_fmt_duration(tr_now() - t_start, tt, sizeof(tt));
        tr_fmt_count((double)tokens_step * (r.train.steps - start_step) / t_train, tk, sizeof(tk));
        printf("done: %d steps in %s, %s tok/s on average, waited for data %.3f%% of the time",
               r.train.steps, tt, tk, 100.0 * tr_loader_wait_seconds(s.loader) / t_train);
        if (isfinite(best_val)) printf(", best val_loss %.4f", best_val);
        printf("\n");
    }
    if (ckw) {
        int failed = tr_ckpt_wait(ckw, err, sizeof(err));
        tr_ckpt_stats cs = tr_ckpt_writer_stats(ckw);
        double t_run = tr_now() - t_start; /* the stalls include the wait for the last save */
        printf("checkpoints: %d saved in %s/checkpoints/ (%.2f GB each; host copy %.3f s, "
               "written in %.2f s on average); training waited %.3f s for them (%.2f%% of the "
               "run's time)\n",
               cs.saves, out, (double)cs.bytes / 1e9, cs.saves ? cs.copy_s / cs.saves : 0.0,
               cs.saves ? cs.write_s / cs.saves : 0.0, cs.stall_s, 100.0 * cs.stall_s / t_run);
        if (failed) {
            fprintf(stderr, "trainer run: %s\n", err);
            goto done;
        }
    }
    {
        /* what this process allocated, by kind, for tools (measured after training: ZeRO-2's
           gradient buffers are only known then) */
        tr_memory mem = tr_model_memory(s.model);
        mem.grads += tr_dp_grad_bytes(dp);
        mem.params += tr_dp_param_buffer_bytes(dp); /* ZeRO-3: gathered buckets, high water */
        snprintf(path, sizeof(path), "%s/memory.json", out);
        FILE *mf = rank == 0 ? fopen(path, "w") : NULL;
        if (mf) {
            fprintf(mf, "{\"ranks\": %d, \"zero\": %d, \"params\": %zu, "
                    "\"param_buffers\": %zu, \"grads\": %zu, \"grad_buffers\": %zu, "
                    "\"optimizer\": %zu, \"activations\": %zu, \"scratch\": %zu}\n",
                    nranks, zero, mem.params, tr_dp_param_buffer_bytes(dp), mem.grads,
                    tr_dp_grad_buffer_bytes(dp), mem.optimizer, mem.activations, mem.scratch);
            if (close_output(mf, path)) out_failed = 1;
        } else if (rank == 0) {
            out_failed = 1;
            cannot_write(path, errno);
        }
    }
    if (nranks > 1) {
        tr_dp_stats ds = tr_dp_get_stats(dp);
        printf("data parallel: %ld bucket %s over %ld steps; %.0f%% of the gradient "
               "communication hidden behind the backward (%.3f s exposed of %.3f s)\n",
               ds.buckets, zero >= 2 ? "reduce-scatters" : "all-reduces", ds.steps,
               100.0 * tr_dp_hidden_fraction(dp), ds.exposed_s, ds.span_s);
        if (zero == 3)
            printf("ZeRO-3: %ld bucket all-gathers of parameters before the ops that read them; "
                   "waited %.3f s for them (the rest overlapped the previous op)\n",
                   ds.param_gathers, ds.gather_s);
        else if (zero)
            printf("ZeRO-%d parameter all-gathers: %.3f s\n", zero, ds.gather_s);
    }
    /* ZeRO-3: every rank takes part in the sampling forwards (they gather the parameters);
       all draw the same tokens, rank 0 writes them */
    int rt = nranks > 1 ? rank_table(world, &led, device_desc, out) : 0;
    if (rt < 0) goto done;
    if (rt > 0) out_failed = 1;
    if (zero == 3) tr_dp_hold_params(dp, 1); /* each bucket gathered once, not once a token */
    if ((rank == 0 || zero == 3) && write_sample(&s, out, rank == 0)) out_failed = 1;
    tr_dp_hold_params(dp, 0);
    const char *dump = getenv("TR_DUMP_PARAMS"); /* tests: the final parameters, raw fp32 */
    if (dump && *dump) {
        tr_dp_state all = {0};
        if (zero == 3 && tr_dp_gather_state(dp, &all)) goto done;
        FILE *df = rank == 0 ? fopen(dump, "wb") : NULL;
        if (rank == 0 && !df) {
            cannot_write(dump, errno);
            out_failed = 1;
        }
        for (int i = 0; df && i < tr_model_num_params(s.model); i++) {
            const tr_param *p = tr_model_param(s.model, i);
            float *host = malloc(p->numel * sizeof(float));
            if (zero == 3)
                tr_dp_param_source(&all, i, host);
            else
                tr_model_get_param(s.model, i, host);
            fwrite(host, sizeof(float), p->numel, df);
            free(host);
        }
        if (df && close_output(df, dump)) out_failed = 1;
        tr_dp_state_free(&all);
    }
    status = out_failed ? 1 : 0;
done:
    tr_ckpt_writer_free(ckw); /* before the model: the writer reads it */
    if (metrics) fclose(metrics);
    free(s.inputs);
    free(s.targets);
    free(all_steps);
    tr_dp_free(dp); /* before the model: it unhooks itself from it */
    tr_model_free(s.model);
    tr_loader_free(s.loader);
    tr_recipe_free(&r);
    tr_comm_free(world);
    return status;
}
