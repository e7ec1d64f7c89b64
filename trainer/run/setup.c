/* `trainer run`, its setup: the flags, connecting the processes, and every step that can fail
 * on some ranks only (recipe, backend, layout, mesh, data, output folder, model, data
 * parallelism, --resume, OUT's files, checkpoint writer), each agreed by all ranks so that
 * they leave together and the lowest failing rank says why in one line. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/corpus.h"
#include "trainer/run/run.h"

/* A setup step that can fail on some ranks only: every rank says whether its step failed
 * (with its message), and all leave together, so no rank is left waiting in a collective
 * until the timeout. The lowest failing rank prints its message, once: as it is when every
 * rank failed (the same mistake everywhere), after its rank number when only some did.
 * Returns 1 on every rank when any rank failed. */
int run_setup_failed(tr_comm *world, int bad, const char *msg) {
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

/* The end of the item of a line that starts at `from`: the next ',' or " }", or the line's end. */
static int item_end(const char *from) {
    int n = 0;
    while (from[n] && from[n] != '\n' && from[n] != ',' && strncmp(from + n, " }", 2))
        n++;
    return n;
}

/* Where text and rank 0's first differ, as "'zero = 1' here, 'zero = 0' on rank 0": the
 * item (a recipe's "name = value", between commas or braces) of the first differing byte. */
static void first_difference(const char *mine, const char *root, char *out, size_t n) {
    size_t i = 0, from = 0;
    while (mine[i] && mine[i] == root[i]) {
        if (mine[i] == '\n' || mine[i] == ',' || mine[i] == '{') from = i + 1;
        i++;
    }
    while (mine[from] == ' ')
        from++;
    int la = item_end(mine + from), lb = item_end(root + from);
    snprintf(out, n, "'%.*s' here, '%.*s' on rank 0", la > 120 ? 120 : la, mine + from,
             lb > 120 ? 120 : lb, root + from);
}

/* Every rank must have what rank 0 has (`text`, lines of it): 1 on every rank if not, said once
 * by the lowest rank that differs, naming the first line that does. Only a difference costs
 * more than a hash: rank 0's text is then sent to all. */
static int ranks_agree(tr_comm *world, const char *what, const char *text) {
    if (tr_comm_size(world) <= 1) return 0;
    size_t len = strlen(text);
    char mine[65], root[65], where[300] = "", msg[600];
    tr_sha256_hex(text, len, mine);
    memcpy(root, mine, sizeof(root));
    tr_comm_broadcast(world, root, 64, TR_COMM_BYTE, 0);
    int differs = memcmp(root, mine, 64) != 0, any = differs;
    tr_comm_all_reduce(world, &any, 1, TR_COMM_I32);
    if (!any) return 0;
    long long n = (long long)len;
    tr_comm_broadcast(world, &n, 1, TR_COMM_I64, 0);
    char *theirs = calloc((size_t)n + 1, 1);
    if (!theirs) {
        fprintf(stderr, "trainer: rank %d: out of memory\n", tr_comm_rank(world));
        exit(1); /* mpirun ends the others */
    }
    if (tr_comm_rank(world) == 0) memcpy(theirs, text, len);
    tr_comm_broadcast(world, theirs, (size_t)n, TR_COMM_BYTE, 0);
    if (differs) first_difference(text, theirs, where, sizeof(where));
    free(theirs);
    snprintf(msg, sizeof(msg),
             "trainer run: the %s differs from rank 0's: %s; every rank must run the same "
             "recipe, flags and files",
             what, where);
    return run_setup_failed(world, differs, msg);
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
    char host[64], msg[TR_PATH_MAX + 300] = "";
    tr_hostname(host, sizeof(host));
    int bad = strcmp(got, want) != 0;
    if (bad) {
        snprintf(msg, sizeof(msg),
                 "trainer run: on %s, the output folder '%s' is not shared with "
                 "rank 0 (its files are not there): checkpoints and --resume need one folder "
                 "every rank sees (a shared file system)",
                 host, out);
    } else if (me > 0) { /* every rank writes its part of each checkpoint there */
        snprintf(mine, sizeof(mine), "%s.r%d", path, me);
        FILE *w = fopen(mine, "w");
        int e = w ? 0 : errno;
        if (w && fclose(w)) e = errno ? errno : EIO;
        if (w) remove(mine);
        if (e) {
            bad = 1;
            snprintf(msg, sizeof(msg),
                     "trainer run: on %s, cannot write in the output folder "
                     "'%s': %s (every rank writes its part of each checkpoint there)",
                     host, out, strerror(e));
        }
    }
    int failed = run_setup_failed(world, bad, msg);
    tr_comm_barrier(world);
    if (me == 0) remove(path);
    return failed;
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

/* ---- the setup steps ------------------------------------------------------------------- */

/* The resolved recipe with its layout (but an "auto" micro-batch, which each host sizes by
 * its memory: agreed next, on its own) and every option that changes what a rank does: ranks
 * launched with other flags or test variables would otherwise meet in mismatched
 * collectives. Resolved values, so that equivalent settings agree (--zero 0 and the recipe's
 * default ZeRO-0). */
static char *agreed_text(const run_ctx *x) {
    tr_recipe c = x->r; /* a shallow copy: only written out */
    tr_layout_to_recipe(&x->lay, &c);
    if (x->lay.micro_auto) c.train.micro_batch = 0;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    tr_recipe_write_lua(&c, f);
    fprintf(f,
            "\n-- options: resume %d, overwrite %d, device %s, precision %s, timeout %.17g, "
            "pad_vocab %d, TR_CKPT_SYNC %d\n",
            x->o.resume, x->o.overwrite, x->o.device ? x->o.device : "auto",
            x->o.precision ? x->o.precision : "default", x->o.timeout > 0 ? x->o.timeout : 300.0,
            x->lay.pad_vocab, x->ckpt_sync);
    fclose(f);
    return text;
}

/* The flags, then the processes. A flag mistake under a launcher: connect first, so that a
 * mistake made on every rank is said once and one made on some ranks only still ends the
 * others at once (setup_failed: the same collective the others meet after the recipe). */
static int connect_ranks(run_ctx *x, int *argc, char ***argv, int *status) {
    char pmsg[600];
    int rc = tr_parse_options_msg(&x->o, "run", *argc, *argv, 2, pmsg, sizeof(pmsg));
    *status = rc > 0 ? 0 : rc < 0 ? 2 : 1;
    if (rc > 0) return -1;
    if (rc < 0) {
        tr_comm *w = NULL;
        char cerr[256];
        if (launched_with_others() && !tr_comm_init(&w, argc, argv, 0, cerr, sizeof(cerr))) {
            run_setup_failed(w, 1, pmsg);
            tr_comm_free(w);
        } else {
            fprintf(stderr, "%s\n", pmsg);
        }
        return -1;
    }
    if (tr_comm_init(&x->world, argc, argv, x->o.timeout, x->err, sizeof(x->err))) {
        fprintf(stderr, "trainer run: %s\n", x->err);
        return -1;
    }
    x->rank = tr_comm_rank(x->world);
    x->nranks = tr_comm_size(x->world);
    if (x->rank > 0 && !freopen("/dev/null", "w", stdout)) /* rank 0 owns progress and output */
        fprintf(stderr, "trainer: rank %d: cannot silence stdout\n", x->rank);
    int bad = tr_load_recipe_msg(&x->r, &x->o, "run", x->msg, sizeof(x->msg));
    x->have_recipe = !bad;
    return run_setup_failed(x->world, bad, x->msg) ? -1 : 0;
}

/* The backend and the layout, agreed by all ranks (the recipe with its layout and the flags,
 * then the micro-batch), written back into the recipe, its predicted memory, and the mesh:
 * the dp group for data parallelism and the loader, the tp group for the model. */
static int setup_layout(run_ctx *x) {
    double peak;
    x->be = tr_choose_backend(&x->o, &x->r, &peak, x->device, sizeof(x->device), x->err,
                              sizeof(x->err));
    snprintf(x->msg, sizeof(x->msg), "trainer run: %s", x->err);
    if (run_setup_failed(x->world, !x->be, x->msg)) return -1;
    x->peak = peak / 1e9;
    if (run_private_orgs(x) || run_setup_failed(x->world, run_plan(x), x->msg)) return -1;
    int bad =
        tr_resolve_layout(&x->lay, &x->r, &x->o, x->nranks, x->be, "run", x->msg, sizeof(x->msg));
    if (run_setup_failed(x->world, bad, x->msg)) return -1;
    char *text = agreed_text(x), fp[96];
    bad = ranks_agree(x->world, "resolved recipe or a flag", text ? text : "(out of memory)");
    free(text);
    if (bad) return -1;
    snprintf(fp, sizeof(fp), "micro_batch %d, accumulation steps %d", x->lay.micro_batch,
             x->lay.accum);
    if (ranks_agree(x->world, "resolved micro-batch", fp)) return -1;
    if (x->lay.micro_auto)
        printf("micro_batch auto -> %d sequences (%d accumulation step(s) per %ld-token step)\n",
               x->lay.micro_batch, x->lay.accum, x->r.train.batch_tokens);
    tr_layout_to_recipe(&x->lay, &x->r); /* OUT/recipe.lua and the manifests name it */
    x->B = x->lay.micro_batch;
    x->T = x->lay.seq_len;
    bad = tr_layout_memory(&x->lay, &x->r.model, x->be->dtype, x->rank, &x->predicted, x->err,
                           sizeof(x->err));
    snprintf(x->msg, sizeof(x->msg), "%s: %s", x->r.path, x->err);
    if (run_setup_failed(x->world, bad, x->msg) || run_setup_failed(x->world, run_price(x), x->msg))
        return -1;
    tr_mesh mesh = {.dp = x->lay.dp, .pp = x->lay.pp, .tp = x->lay.tp};
    bad = tr_comm_mesh(x->world, mesh, &x->dpc, &x->ppc, &x->tpc, x->err, sizeof(x->err));
    /* the pipeline's first and last stages (each pair of them: the others get a group of
       their own they never use), and the ranks of one model copy */
    tr_layout_coord co = tr_layout_coord_of(&x->lay, x->rank);
    int edge = co.p == 0 || co.p == x->lay.pp - 1;
    bad = bad ||
          tr_comm_split(x->ppc, edge ? 0 : 1, co.p, "tie", &x->tiec, x->err, sizeof(x->err)) ||
          tr_comm_split(x->world, co.d, x->rank, "mp", &x->mpc, x->err, sizeof(x->err));
    snprintf(x->msg, sizeof(x->msg), "trainer run: %s", x->err);
    return run_setup_failed(x->world, bad, x->msg) ? -1 : 0;
}

/* A step only rank 0 takes (OUT's lock, what OUT holds): every rank leaves on its word, which
 * rank 0 says as it is. */
static int rank0_decides(run_ctx *x, int (*step)(run_ctx *)) {
    long long bad = x->rank == 0 && step(x);
    tr_comm_broadcast(x->world, &bad, 1, TR_COMM_I64, 0);
    return run_setup_failed(x->world, bad != 0, x->msg);
}

/* The output folder, the data (a BPE corpus tokenized once into cached shards), the loader of
 * this rank's dp group (tp ranks of one group read the same batches), agreed data, and an
 * output folder all ranks share when checkpoints need one. */
static int setup_data(run_ctx *x) {
    const tr_recipe *r = &x->r;
    if (rank0_decides(x, run_folder_make) || rank0_decides(x, run_folder_lock) ||
        rank0_decides(x, run_folder_check))
        return -1;
    int bad;
    if (r->data.text[0] && r->data.tokenizer != TR_TOKENIZER_BYTE) {
        char dir[TR_PATH_MAX + 64];
        int made = 0;
        double t0 = tr_now();
        bad =
            tr_corpus_cache(&r->data, dir, sizeof(dir), &made, NULL, NULL, x->err, sizeof(x->err));
        snprintf(x->msg, sizeof(x->msg), "%s: %s", r->path, x->err);
        if (run_setup_failed(x->world, bad, x->msg)) return -1;
        if (made)
            printf("tokenized %s with %s into %s/ in %.1f s (first use; cached from now on)\n",
                   r->data.text, r->data.tokenizer == TR_TOKENIZER_GPT2 ? "gpt2" : "byte", dir,
                   tr_now() - t0);
    }
    int d = tr_comm_rank(x->dpc), first = 0;
    bad = tr_loader_open(&x->loader, &r->data, r->model.vocab, d, tr_comm_size(x->dpc), x->B,
                         x->T, r->train.seed, x->err, sizeof(x->err));
    for (int k = 0; k < d; k++) first += tr_layout_accum_of(&x->lay, k);
    if (!bad && x->lay.shares_uneven) /* this replica's micro-batches of each step's */
        bad = tr_loader_set_share(x->loader, first, tr_layout_accum_of(&x->lay, d),
                                  tr_layout_step_micro_batches(&x->lay), x->err, sizeof(x->err));
    snprintf(x->msg, sizeof(x->msg), "%s: %s", r->path, x->err);
    if (run_setup_failed(x->world, bad, x->msg)) return -1;
    char fp[65];
    snprintf(fp, sizeof(fp), "fingerprint %016llx",
             (unsigned long long)tr_loader_fingerprint(x->loader));
    if (ranks_agree(x->world, "data (sizes and sampled tokens)", fp)) return -1;
    if ((r->train.checkpoint_every > 0 || x->o.resume) && out_is_shared(x->world, r->train.out))
        return -1;
    return 0;
}

/* After each chunk's backward (or weight part): ZeRO-3 frees the parameters gathered for it
 * (ZeRO-2 and 3 reduce each bucket as soon as its micro-batch completes it: parallel/dp.c). */
static void micro_end(void *dp) {
    tr_dp_micro_end(dp);
}

/* Pipeline parallelism: the executor over the pp group, and a step's micro-batch buffers. */
static int setup_pipeline(run_ctx *x) {
    const tr_layout *l = &x->lay;
    if (l->pp <= 1) return 0;
    int bad = tr_pipe_init(&x->pipe, x->model, x->ppc, (tr_pp_kind)l->schedule, l->virtual_stages,
                           l->microbatches, x->err, sizeof(x->err));
    snprintf(x->msg, sizeof(x->msg), "%s: %s", x->r.path, x->err);
    if (run_setup_failed(x->world, bad, x->msg)) return -1;
    tr_pipe_set_backward_hook(x->pipe, micro_end, x->dp);
    tr_pipe_final_hooks(x->pipe, !tr_zero_of(l->zero).grads);
    x->mb_in = calloc((size_t)l->accum, sizeof(int *));
    x->mb_tg = calloc((size_t)l->accum, sizeof(int *));
    bad = !x->mb_in || !x->mb_tg;
    for (int a = 0; !bad && a < l->accum; a++)
        bad = !(x->mb_in[a] = malloc((size_t)x->B * x->T * sizeof(int))) ||
              !(x->mb_tg[a] = malloc((size_t)x->B * x->T * sizeof(int)));
    snprintf(x->msg, sizeof(x->msg), "trainer run: out of memory for the micro-batches");
    return run_setup_failed(x->world, bad, x->msg) ? -1 : 0;
}

/* This rank's part of the model (the layout's options, the tp group), data parallelism over
 * the dp group, and the parameters: initialised, then from --resume or init = hf. */
static int setup_model(run_ctx *x) {
    const tr_recipe *r = &x->r;
    tr_model_opts mo = tr_layout_model_opts(&x->lay, x->rank);
    mo.tp_comm = x->tpc;
    if (x->lay.pp > 1) {
        mo.pp_comm = x->ppc;
        mo.tie_comm = x->tiec;
    }
    int bad = tr_model_init_opts(&x->model, &r->model, x->be, &mo, x->err, sizeof(x->err));
    snprintf(x->msg, sizeof(x->msg), "%s: %s", r->path, x->err);
    if (run_setup_failed(x->world, bad, x->msg)) return -1;
    bad = tr_dp_init(&x->dp, x->model, x->dpc, x->lay.zero, (size_t)x->lay.bucket_kb << 10, x->err,
                     sizeof(x->err));
    snprintf(x->msg, sizeof(x->msg), "%s: %s", r->path, x->err);
    if (run_setup_failed(x->world, bad, x->msg)) return -1; /* a refused configuration: said once */
    if (setup_pipeline(x)) return -1;
    tr_model_init_params(x->model, r->train.seed);
    /* before --resume, which brings back the guard's state */
    snprintf(x->msg, sizeof(x->msg), "trainer run: out of memory for the guard's window");
    if (run_setup_failed(x->world, run_guard_init(x), x->msg)) return -1;
    if (x->o.resume) {
        int rrc = run_load_checkpoint(x, LONG_MAX, &x->start_step, x->err, sizeof(x->err));
        /* -2: this rank is fine but another's reason stops every rank (that rank says it) */
        snprintf(x->msg, sizeof(x->msg), "trainer run: --resume: %s", x->err);
        if (run_setup_failed(x->world, rrc == -1, x->msg) || rrc) return -1;
        char fp[65];
        snprintf(fp, sizeof(fp), "step %d", x->start_step); /* every rank from the same one */
        if (ranks_agree(x->world, "checkpoint step to resume from", fp)) return -1;
    } else if (r->init_hf[0]) {
        tr_tokenizer *tok = NULL; /* its vocabulary: an export without the padding rows loads */
        int real = tr_tokenizer_open(&tok, r->data.tokenizer, r->data.encoder, r->data.merges,
                                     x->err, sizeof(x->err))
                       ? 0
                       : tr_tokenizer_vocab(tok);
        tr_tokenizer_free(tok);
        bad = tr_hf_import(x->model, r->init_hf, real, x->err, sizeof(x->err));
        snprintf(x->msg, sizeof(x->msg), "%s: %s", r->path, x->err);
        if (run_setup_failed(x->world, bad, x->msg)) return -1;
        printf("initialized from the Hugging Face model in %s\n", r->init_hf);
    }
    return 0;
}

/* OUT's files only now, so that a refused --resume leaves them as they were: the recipe (with
 * its layout), the planner's search when it chose the layout (plan.json), and metrics.jsonl (a resumed run appends, after dropping the steps it trains
 * again). Rank 0's helpers print their own line. */
static int open_outputs(run_ctx *x) {
    char path[TR_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/recipe.lua", x->r.train.out);
    FILE *rf = fopen(path, "w");
    if (!rf) return run_cannot_write(path, errno);
    int wbad = tr_recipe_write_lua(&x->r, rf);
    if (run_close_output(rf, path)) return -1;
    if (wbad) return run_cannot_write(path, EIO);
    snprintf(path, sizeof(path), "%s/plan.json", x->r.train.out); /* when the planner chose */
    if (x->plan_json && run_write_whole(path, x->plan_json)) return -1;
    snprintf(x->metrics_path, sizeof(x->metrics_path), "%s/metrics.jsonl", x->r.train.out);
    if (x->o.resume && tr_jsonl_repair(x->metrics_path, stdout, x->err, sizeof(x->err))) {
        fprintf(stderr, "trainer run: %s\n", x->err);
        return -1;
    }
    x->metrics = fopen(x->metrics_path, x->o.resume ? "a" : "w");
    if (!x->metrics) return run_cannot_write(x->metrics_path, errno);
    return x->o.resume ? run_trim_metrics(x, x->start_step) : 0;
}

/* The checkpoint writer (every rank writes the part of each checkpoint it keeps; rank 0 also
 * the manifest), collectively: at setup when the recipe saves checkpoints, else when a stop
 * is requested (trainer/run/stop.c), whose save then first checks that OUT is shared when
 * `check_shared`. 0, or -1 after one line. */
int run_open_checkpoints(run_ctx *x, int check_shared) {
    const tr_recipe *r = &x->r;
    if (check_shared && out_is_shared(x->world, r->train.out)) return -1;
    size_t *ranges = NULL;
    int n_ranges = tr_dp_ckpt_ranges(x->dp, &ranges);
    tr_ckpt_opts co = {.out = r->train.out,
                       .keep = r->train.keep_checkpoints,
                       .rank = x->rank,
                       .world = x->nranks,
                       .ranges = ranges,
                       .n_ranges = n_ranges,
                       .layout = x->lay,
                       .sync = x->ckpt_sync,
                       .fault_bytes = x->fault_save_bytes,
                       .fault_hang = x->fault_save_hang,
                       .timeout_s = x->o.timeout > 0 ? x->o.timeout : 300,
                       .overlap = !strcmp(x->be->name, "cpu")};
    int bad = tr_ckpt_writer_init(&x->ckw, x->model, r, &co, x->err, sizeof(x->err));
    free(ranges);
    snprintf(x->msg, sizeof(x->msg), "trainer run: %s", x->err);
    return run_setup_failed(x->world, bad, x->msg) ? -1 : 0;
}

/* The output files, the checkpoint writer when the recipe saves checkpoints, the batch buffers
 * and the tests' fault variables. */
/* --trace N: the N steps after this start's first (which warms up), or the first alone. */
static int setup_trace(run_ctx *x) {
    if (x->o.trace <= 0) return 0;
    int left = x->r.train.steps - x->start_step, first = x->start_step + (left > 1);
    char path[TR_PATH_MAX + 16];
    snprintf(path, sizeof(path), "%s/trace.json", x->r.train.out);
    x->trace = tr_trace_new(x->world, first, x->o.trace, path, x->err, sizeof(x->err));
    if (x->trace && x->pipe) tr_pipe_set_trace(x->pipe, x->trace);
    snprintf(x->msg, sizeof(x->msg), "trainer run: %s", x->err);
    return run_setup_failed(x->world, !x->trace, x->msg);
}

static int setup_outputs(run_ctx *x) {
    const tr_recipe *r = &x->r;
    /* only now that every rank's setup succeeded: a refused run leaves the earlier one whole */
    if (x->o.overwrite && run_setup_failed(x->world, x->rank == 0 && run_folder_clear(x), ""))
        return -1;
    if (run_setup_failed(x->world, x->rank == 0 && open_outputs(x), "")) return -1;
    char err[TR_PATH_MAX + 128]; /* the plan memory: a cache, whose failure ends nothing */
    if (x->rank == 0 && x->planned && x->memory[0] &&
        tr_plan_memory_save(x->memory, &x->plan, err, sizeof err))
        printf("plan memory: not kept: %s\n", err);
    if (r->train.checkpoint_every > 0 && run_open_checkpoints(x, 0)) return -1;
    if (setup_trace(x)) return -1;
    x->inputs = malloc((size_t)x->B * x->T * sizeof(int));
    x->targets = malloc((size_t)x->B * x->T * sizeof(int));
    x->all_steps = malloc((size_t)x->nranks * TR_LEDGER_EXTRA * sizeof(double));
    x->all_compute = malloc((size_t)x->nranks * sizeof(double));
    int bad = !x->inputs || !x->targets || !x->all_steps || !x->all_compute;
    snprintf(x->msg, sizeof(x->msg), "trainer run: out of memory for the batches");
    if (run_setup_failed(x->world, bad, x->msg)) return -1;
    if (x->dp) tr_dp_set_sync(x->dp, x->dp_sync_refresh, x->dp_sync_reduce);
    return 0;
}

/* What the run is: model, data, device, steps, the layout of several processes and the
 * memory a process allocates as the layout predicts it. */
static void print_banner(const run_ctx *x) {
    const tr_recipe *r = &x->r;
    char np[32], ft[32], tt[32], vt[32];
    tr_cost all; /* the whole model's, whatever part of it this process holds */
    tr_cost_model(&r->model, x->T, &all);
    tr_fmt_count(all.params, np, sizeof(np));
    tr_fmt_count(x->flops_tok, ft, sizeof(ft));
    tr_fmt_count((double)tr_loader_train_tokens(x->loader), tt, sizeof(tt));
    tr_fmt_count((double)tr_loader_val_tokens(x->loader), vt, sizeof(vt));
    printf("model %s params, %s training FLOPs/token | data %s train + %s val tokens\n"
           "device %s\n",
           np, ft, tt, vt, x->device);
    if (r->train.guard.on && r->train.guard.z_norm_unused)
        printf("%s: train: guard: z_norm is no longer used: the gradient norm is judged by "
               "norm_ratio (a multiple of the window's median, default 20)\n",
               r->path);
    char fix[TR_PATH_MAX + 256];
    if (!x->be->device_memory && !strcmp(tr_backend_cpu_blas_threads(fix, sizeof(fix)), "pthreads"))
        fprintf(stderr, "trainer run: warning: %s\n", fix);
    printf("training %d steps of %ld tokens, micro-batch %d x %d, output in %s/\n", r->train.steps,
           r->train.batch_tokens, x->B, x->T, r->train.out);
    if (r->train.checkpoint_every == 0)
        printf("checkpoints: none: the recipe saves none (checkpoint_every 0), so export and "
               "sample will have nothing to read; --set checkpoint_every=N saves every N steps "
               "and the last\n");
    if (x->nranks > 1) {
        char desc[256];
        tr_layout_describe(&x->lay, desc, sizeof(desc));
        printf("%d processes (%s), %s\n", x->nranks, tr_comm_transport(), desc);
        if (*tr_comm_progress_note()) printf("communication: %s\n", tr_comm_progress_note());
        tr_layout_describe_stages(&x->lay, &x->r.model, stdout);
    }
    for (int i = 0; i < 2; i++)
        if (x->plan_line[i][0]) printf("%s\n", x->plan_line[i]);
    if (x->lay.private_gradients)
        printf("private gradients: data-parallel sums masked between %d %s%s%s (X25519 keys "
               "agreed at start, ChaCha20 masks per bucket, sums in 32-bit fixed point); in the "
               "clear: each bucket's sum of magnitudes (its scale), the summed gradient, the "
               "parameters after each update, and tensor and pipeline traffic, kept inside "
               "each %s\n",
               x->private_orgs, x->o.orgs ? "organisation" : "host",
               x->private_orgs == 1 ? "" : "s", x->private_orgs == 1 ? " (one: nothing to mask)" : "",
               x->o.orgs ? "organisation" : "host");
    const tr_memory *m = &x->predicted;
    char b1[32], b2[32], b3[32], b4[32];
    tr_fmt_bytes((double)m->params, b1, sizeof(b1));
    tr_fmt_bytes((double)m->grads, b2, sizeof(b2));
    tr_fmt_bytes((double)m->optimizer, b3, sizeof(b3));
    tr_fmt_bytes((double)(m->activations + m->scratch), b4, sizeof(b4));
    char b5[48] = "";
    if (x->be->device_memory) { /* the kernels' workspaces (model/workspace.c) */
        tr_fmt_bytes((double)m->workspace, b5 + 2, sizeof(b5) - 2);
        memcpy(b5, ", ", 2);
        strncat(b5, " of device workspaces", sizeof(b5) - strlen(b5) - 1);
    }
    char b6[48] = "";
    if (m->buffers) {
        memcpy(b6, ", ZeRO's bucket buffers ", 25);
        tr_fmt_bytes((double)m->buffers, b6 + 24, sizeof(b6) - 24);
    }
    printf("memory per process (predicted): parameters %s, gradients %s, optimizer state %s, "
           "activations and scratch %s%s%s\n",
           b1, b2, b3, b4, b5, b6);
}

/* Every rank's host name and device (without the notes after ';'), gathered once for the run's
 * records (provenance.json, the ledger). */
static int gather_ranks(run_ctx *x) {
    char mine[TR_HOST_LEN + TR_DEVICE_LEN] = {0};
    size_t n = (size_t)x->nranks;
    char *all = malloc(n * sizeof(mine));
    x->hosts = calloc(n, TR_HOST_LEN);
    x->devices = calloc(n, TR_DEVICE_LEN);
    int bad = !all || !x->hosts || !x->devices;
    snprintf(x->msg, sizeof(x->msg), "trainer run: out of memory for the ranks' host names");
    if (run_setup_failed(x->world, bad, x->msg)) {
        free(all);
        return -1;
    }
    tr_hostname(mine, TR_HOST_LEN);
    snprintf(mine + TR_HOST_LEN, TR_DEVICE_LEN, "%.*s", (int)strcspn(x->device, ";"), x->device);
    tr_comm_all_gather(x->world, mine, all, sizeof(mine), TR_COMM_BYTE);
    for (size_t k = 0; k < n; k++) {
        memcpy(x->hosts + k * TR_HOST_LEN, all + k * sizeof(mine), TR_HOST_LEN - 1);
        memcpy(x->devices + k * TR_DEVICE_LEN, all + k * sizeof(mine) + TR_HOST_LEN,
               TR_DEVICE_LEN - 1);
    }
    free(all);
    tr_comm_set_host_names(x->hosts, x->nranks, TR_HOST_LEN); /* a timeout's line names them */
    return 0;
}

/* Everything after the flags and the processes; -1 after the lines that say why. */
static int setup_run(run_ctx *x, int argc, char **argv) {
    /* TR_FAULT_*, TR_LEDGER, ...: may be set on some ranks only */
    if (run_setup_failed(x->world, run_env_settings(x), x->msg)) return -1;
    if (setup_layout(x) || setup_data(x) || run_setup_failed(x->world, run_tasks_open(x), x->msg) ||
        setup_model(x) || setup_outputs(x) || gather_ranks(x) ||
        (x->lay.private_gradients && run_private_setup(x)))
        return -1;
    if (run_setup_failed(x->world, run_provenance(x, argc, argv), "")) return -1;
    x->flops_tok = tr_cost_train_flops_per_token(&x->r.model, x->T);
    x->tokens_step = (long)x->B * x->T * tr_layout_step_micro_batches(&x->lay);
    x->tty = run_progress_tty(x->o.progress, x->msg, sizeof(x->msg));
    if (run_setup_failed(x->world, x->tty < 0, x->msg)) return -1;
    x->best_val = INFINITY;
    print_banner(x);
    return 0;
}

int run_setup(run_ctx *x, int *argc, char ***argv, int *status) {
    if (connect_ranks(x, argc, argv, status)) return -1;
    *status = 1;
    if (!setup_run(x, *argc, *argv)) return 0;
    if (x->rank == 0) run_folder_unmake(x); /* a refused run leaves no folder behind */
    return -1;
}

void run_free(run_ctx *x) {
    if (!x) return;
    run_dump_free(x);
    tr_ckpt_writer_free(x->ckw); /* before the model: the writer reads it */
    if (x->metrics) fclose(x->metrics);
    if (x->lock_fd >= 0) close(x->lock_fd);
    free(x->inputs);
    free(x->targets);
    free(x->all_steps);
    free(x->all_compute);
    free(x->hosts);
    free(x->orgs);
    free(x->devices);
    free(x->plan_json);
    run_guard_free(x);
    run_tasks_free(x);
    for (int a = 0; x->mb_in && a < x->lay.accum; a++)
        free(x->mb_in[a]);
    for (int a = 0; x->mb_tg && a < x->lay.accum; a++)
        free(x->mb_tg[a]);
    free(x->mb_in);
    free(x->mb_tg);
    tr_pipe_free(x->pipe);
    tr_trace_free(x->trace);
    tr_dp_free(x->dp); /* before the model: it unhooks itself from it */
    tr_model_free(x->model);
    tr_loader_free(x->loader);
    if (x->have_recipe) tr_recipe_free(&x->r);
    tr_comm_free(x->dpc);
    tr_comm_free(x->ppc);
    tr_comm_free(x->tpc);
    tr_comm_free(x->tiec);
    tr_comm_free(x->mpc);
    tr_comm_free(x->world); /* last: freeing the world finalizes MPI */
    free(x);
}
