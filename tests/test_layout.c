/* Tests for the resolved layout (parallel/layout.c): "auto" fields and flags over the recipe,
 * every check with its exact one-line message (located in the recipe where the mistake is
 * there), the mesh coordinates and model options of a rank, the "auto" micro-batch against its
 * budget, the write-back into the recipe, and the predicted memory against what a model built
 * with the layout's options allocates. Plain C: ok/FAIL per check, non-zero exit on failure. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl/recipe.h"
#include "model/model.h"
#include "parallel/layout.h"
#include "parallel/schedule.h"
#include "check.h"

static char err[1024];


/* A GPT-like model: heads 6 (line 4), kv_heads 2 in a second attention (line 5), an MLP of
 * 384 (line 6), seq_len 16, 32 sequences a step, and the given parallel { } on line 10. */
static int load(tr_recipe *r, const char *parallel, const char *train_extra) {
    char text[2048];
    snprintf(text, sizeof(text),
             "model { vocab = 64, dim = 48, seq_len = 16,\n"
             "  embedding {}, positions {},\n"
             "  stack { n = 2,\n"
             "    residual { layernorm {}, attention { heads = 6 } },\n"
             "    residual { layernorm {}, attention { heads = 12, kv_heads = 2 } },\n"
             "    residual { layernorm {}, mlp { hidden = 384 } } },\n"
             "  layernorm {}, lm_head {} }\n"
             "data { text = 'c' }\n"
             "train { batch_tokens = 512, steps = 1%s }\n"
             "%s\n",
             train_extra, parallel);
    if (tr_recipe_load_string(r, text, "tiny.lua", ".", NULL, 0, err, sizeof(err))) {
        printf("FAIL recipe: %s\n", err);
        n_fail++;
        return -1;
    }
    return 0;
}

static tr_layout_flags no_flags(void) {
    return (tr_layout_flags){.dp = -1, .tp = -1, .zero = -1, .schedule = -1};
}

/* Resolving must fail with exactly `expected`. */
static void refused(const char *what, const char *parallel, const char *train_extra,
                    tr_layout_flags f, int world, const char *expected) {
    tr_recipe r;
    if (load(&r, parallel, train_extra)) return;
    tr_layout l;
    int rc = tr_layout_resolve(&l, &r, &f, world, TR_DTYPE_F32, 0, err, sizeof(err));
    if (!check(rc != 0 && !strcmp(err, expected), "refused: %s", what))
        printf("     expected: %s\n     got (rc %d): %s\n", expected, rc, err);
    tr_recipe_free(&r);
}

static void test_refusals(void) {
    tr_layout_flags f = no_flags();
    f.tp = 4;
    refused("tp does not divide heads", "", "", f, 4,
            "tiny.lua:4: attention: tp 4 does not divide heads 6 (tp 1, 2, 3 or 6 would)");
    f.tp = 3;
    refused("tp neither divides kv_heads nor is a multiple", "", "", f, 3,
            "tiny.lua:5: attention: tp 3 and kv_heads 2: tp must divide kv_heads or be a "
            "multiple of it (tp 1, 2, 4, 6 or 12 would)");
    refused("tp from the recipe, same check", "parallel { tp = 4 }", "", no_flags(), 4,
            "tiny.lua:4: attention: tp 4 does not divide heads 6 (tp 1, 2, 3 or 6 would)");
    f = no_flags();
    f.sequence_parallel = 1;
    refused("--sequence-parallel without tp", "", "", f, 1,
            "--sequence-parallel needs tensor parallelism: give --tp 2 or more");
    refused("sequence_parallel without tp in the recipe", "parallel { sequence_parallel = true }",
            "", no_flags(), 1, "tiny.lua:10: parallel: sequence_parallel needs tp > 1 (tp is 1)");
    f = no_flags();
    f.zero = 4;
    refused("--zero 4", "", "", f, 1, "--zero must be 0, 1, 2 or 3, got 4");
    refused("pp 4 on a model of 2 blocks", "parallel { pp = 4 }", "", no_flags(), 4,
            "tiny.lua:10: parallel: pp 4 x virtual_stages 1 = 4 stages, but the model has 2 blocks "
            "(pp 1 or 2 would)");
    f = no_flags();
    f.dp = 1;
    f.tp = 2;
    refused("dp x tp is not the world (flags)", "", "", f, 1,
            "dp 1 x tp 2 = 2 processes, but 1 started (mpirun -np 2)");
    refused("dp x tp is not the world (recipe)", "parallel { dp = 2, tp = 2 }", "", no_flags(), 3,
            "tiny.lua:10: parallel: dp 2 x tp 2 = 4 processes, but 3 started (mpirun -np 4)");
    f = no_flags();
    f.tp = 2;
    refused("tp does not divide the world", "", "", f, 3,
            "tp 2 needs a multiple of 2 processes, but 3 started (mpirun -np 4)");
    refused("sequences per step do not split over dp", "", "", no_flags(), 3,
            "tiny.lua:9: train: the 32 sequences of a step (batch_tokens 512 / seq_len 16) do not "
            "split over dp 3 (dp 1, 2, 4, 8, 16 or 32 would)");
    refused("micro_batch does not divide the sequences per rank", "", ", micro_batch = 16",
            no_flags(), 4,
            "tiny.lua:9: train: micro_batch 16 does not divide the 8 sequences per data-parallel "
            "rank of a step (batch_tokens 512 / seq_len 16 / dp 4; 1, 2, 4 or 8 would)");
    f = no_flags();
    f.micro_batch = 3;
    refused("--micro-batch does not divide the sequences per rank", "", "", f, 2,
            "--micro-batch 3 does not divide the 16 sequences per data-parallel rank of a step "
            "(batch_tokens 512 / seq_len 16 / dp 2; 1, 2, 4, 8 or 16 would)");
}

/* A model whose MLP width and seq_len do not suit tp 4 (heads 4 do). */
static void test_widths(void) {
    const char *text = "model { vocab = 64, dim = 32, seq_len = 6,\n"
                       "  embedding {},\n"
                       "  residual { attention { heads = 4 } },\n"
                       "  residual { mlp { hidden = 36 } }, lm_head {} }\n"
                       "data { text = 'c' } train { batch_tokens = 48, steps = 1 }\n";
    tr_recipe r;
    if (tr_recipe_load_string(&r, text, "w.lua", ".", NULL, 0, err, sizeof(err))) {
        check(0, "widths: recipe loads (%s)", err);
        return;
    }
    tr_layout l;
    tr_layout_flags f = no_flags();
    f.tp = 8;
    int rc = tr_layout_resolve(&l, &r, &f, 8, TR_DTYPE_F32, 0, err, sizeof(err));
    check(rc && !strcmp(err, "w.lua:3: attention: tp 8 does not divide heads 4 (tp 1, 2 or 4 "
                             "would)"),
          "widths: tp 8 and heads 4 (%s)", err);
    f.tp = 8;
    r.model.root.children[1].children[0].heads = 8; /* past the recipe's checks: the MLP next */
    r.model.dim = 64;
    rc = tr_layout_resolve(&l, &r, &f, 8, TR_DTYPE_F32, 0, err, sizeof(err));
    check(rc && !strcmp(err, "w.lua:4: mlp: tp 8 does not divide hidden 36 (tp 1, 2, 3, 4, 6, 9, "
                             "12, 18 or 36 would)"),
          "widths: tp 8 and hidden 36 (%s)", err);
    f.tp = 4;
    f.sequence_parallel = 1;
    rc = tr_layout_resolve(&l, &r, &f, 4, TR_DTYPE_F32, 0, err, sizeof(err));
    check(rc && !strcmp(err, "w.lua:1: model: sequence parallelism needs tp to divide seq_len: "
                             "tp 4 does not divide 6 (tp 2, 3 or 6 would)"),
          "widths: sequence parallelism with tp 4 and seq_len 6 (%s)", err);
    tr_recipe_free(&r);
}

static void test_resolve(void) {
    tr_recipe r;
    tr_layout l;
    tr_layout_flags f = no_flags();
    if (load(&r, "parallel \"auto\"", ", micro_batch = 4")) return;
    int rc = tr_layout_resolve(&l, &r, &f, 1, TR_DTYPE_F32, 0, err, sizeof(err));
    check(!rc && l.world == 1 && l.dp == 1 && l.tp == 1 && l.pp == 1 && l.zero == 0 &&
              !l.sequence_parallel && l.micro_batch == 4 && l.accum == 8 && !l.micro_auto &&
              l.bucket_kb == 4096 && l.seq_len == 16,
          "auto on one process: dp 1 x tp 1, ZeRO-0, micro-batch 4 x 8, bucket 4096 KiB (%s)", err);
    rc = tr_layout_resolve(&l, &r, &f, 4, TR_DTYPE_F32, 0, err, sizeof(err));
    check(!rc && l.dp == 4 && l.tp == 1 && l.micro_batch == 4 && l.accum == 2,
          "auto on 4 processes: dp 4, 2 accumulation steps of 4 (%s)", err);
    f.tp = 2;
    f.zero = 1;
    f.micro_batch = 8;
    rc = tr_layout_resolve(&l, &r, &f, 4, TR_DTYPE_F32, 0, err, sizeof(err));
    check(!rc && l.dp == 2 && l.tp == 2 && l.zero == 1 && l.micro_batch == 8 && l.accum == 2,
          "flags over the recipe: --tp 2 --zero 1 --micro-batch 8 on 4: dp 2 (%s)", err);
    tr_layout_coord c = tr_layout_coord_of(&l, 3);
    check(c.d == 1 && c.p == 0 && c.t == 1, "rank 3 of dp 2 x tp 2 is d 1, t 1");
    tr_model_opts mo = tr_layout_model_opts(&l, 2);
    check(mo.B == 8 && mo.T == 16 && mo.tp == 2 && mo.tp_rank == 0 && mo.shards == 2 &&
              mo.shard == 1 && !mo.external_grads && !mo.external_params && !mo.tp_comm,
          "model options of rank 2: tp rank 0, ZeRO-1 shard 1 of 2 (the dp group)");
    char line[256];
    tr_layout_describe(&l, line, sizeof(line));
    check(!strcmp(line, "dp 2 x tp 2: data and tensor parallel, ZeRO-1, micro-batch 8, 2 "
                        "accumulation steps"),
          "describe: %s", line);
    /* written back into the recipe: the same layout again, with no flags */
    tr_layout_to_recipe(&l, &r);
    tr_layout again;
    rc = tr_layout_resolve(&again, &r,
                           &(tr_layout_flags){.dp = -1, .tp = -1, .zero = -1, .schedule = -1}, 4,
                           TR_DTYPE_F32, 0, err, sizeof(err));
    check(!rc && !memcmp(&again, &l, sizeof(l)) && !r.parallel.is_auto,
          "to_recipe: the written-back recipe resolves to the same layout (%s)", err);
    tr_recipe_free(&r);

    if (load(&r, "parallel { dp = 2, zero = 3, bucket_kb = 64 }", "")) return;
    f = no_flags();
    f.tp = 2;
    f.sequence_parallel = 1;
    rc = tr_layout_resolve(&l, &r, &f, 4, TR_DTYPE_F32, 0, err, sizeof(err));
    check(!rc && l.dp == 2 && l.tp == 2 && l.zero == 3 && l.sequence_parallel &&
              l.bucket_kb == 64 && l.micro_auto,
          "recipe dp 2, ZeRO-3, --tp 2 --sequence-parallel on 4 (%s)", err);
    mo = tr_layout_model_opts(&l, 1);
    check(mo.external_grads == 1 && mo.external_params == 1 && mo.shards == 1 &&
              mo.sequence_parallel == 1 && mo.tp_rank == 1,
          "model options at ZeRO-3: external gradients and parameters, sequence parallel");
    tr_layout_describe(&l, line, sizeof(line));
    check(strstr(line, "sequence parallel, ZeRO-3") && strstr(line, "(auto)"), "describe: %s",
          line);
    tr_recipe_free(&r);
}

/* "auto": the largest divisor of the sequences per rank whose activations and scratch fit. */
static void test_auto_micro(void) {
    tr_recipe r;
    if (load(&r, "", "")) return;
    tr_layout_flags f = no_flags();
    tr_layout l, big;
    int rc = tr_layout_resolve(&big, &r, &f, 2, TR_DTYPE_F32, 1e12, err, sizeof(err));
    check(!rc && big.micro_batch == 16 && big.accum == 1 && big.micro_auto,
          "auto, ample budget: all 16 sequences per rank at once");
    rc = tr_layout_resolve(&l, &r, &f, 2, TR_DTYPE_F32, 1, err, sizeof(err));
    check(!rc && l.micro_batch == 1 && l.accum == 16, "auto, no budget: 1 sequence");
    /* a budget between the activations of micro-batches 4 and 8 picks 4 */
    tr_memory m4, m8;
    l.micro_batch = 4;
    tr_model_opts o4 = tr_layout_model_opts(&l, 0);
    l.micro_batch = 8;
    tr_model_opts o8 = tr_layout_model_opts(&l, 0);
    tr_model_measure(&r.model, TR_DTYPE_F32, &o4, &m4, err, sizeof(err));
    tr_model_measure(&r.model, TR_DTYPE_F32, &o8, &m8, err, sizeof(err));
    double budget = 0.5 * (double)(m4.activations + m4.scratch + m8.activations + m8.scratch);
    rc = tr_layout_resolve(&l, &r, &f, 2, TR_DTYPE_F32, budget, err, sizeof(err));
    check(!rc && l.micro_batch == 4 && l.accum == 4,
          "auto: a budget between micro-batches 4 and 8 picks 4 (got %d)", l.micro_batch);
    tr_recipe_free(&r);
}

/* tr_layout_memory (planned) against what a model built with the layout's options holds. */
static void test_memory(void) {
    tr_recipe r;
    if (load(&r, "", ", micro_batch = 2")) return;
    for (int zero = 0; zero <= 1; zero++) {
        tr_layout_flags f = no_flags();
        f.zero = zero;
        tr_layout l;
        int world = zero ? 2 : 1, rank = world - 1;
        if (tr_layout_resolve(&l, &r, &f, world, TR_DTYPE_F32, 0, err, sizeof(err))) {
            check(0, "memory: resolve (%s)", err);
            continue;
        }
        tr_memory want, got;
        tr_model_opts mo = tr_layout_model_opts(&l, rank);
        tr_model *m;
        if (tr_layout_memory(&l, &r.model, TR_DTYPE_F32, rank, &want, err, sizeof(err)) ||
            tr_model_init_opts(&m, &r.model, tr_backend_cpu(), &mo, err, sizeof(err))) {
            check(0, "memory: plan and build (%s)", err);
            continue;
        }
        got = tr_model_memory(m);
        tr_model_free(m);
        check(!memcmp(&want, &got, sizeof(got)) && got.params > 0 && got.activations > 0,
              "memory at ZeRO-%d on %d process(es), rank %d: predicted = allocated (params %zu, "
              "grads %zu, optimizer %zu, activations %zu, scratch %zu)",
              zero, world, rank, got.params, got.grads, got.optimizer, got.activations,
              got.scratch);
    }
    tr_recipe_free(&r);
}

/* ---- pipeline parallelism ---------------------------------------------------------------- */

/* A model of `blocks` blocks for the pipeline (line 3: the stack, line 6: the head, line 8:
 * train with 32 sequences of 8 tokens a step, line 9: parallel). Vocabulary 512 makes the head
 * cost about two blocks of forward FLOPs. */
static int load_pp(tr_recipe *r, int blocks, const char *tied, const char *parallel,
                   const char *train_extra) {
    char text[2048];
    snprintf(text, sizeof(text),
             "model { vocab = 512, dim = 32, seq_len = 8,\n"
             "  embedding {}, positions {},\n"
             "  stack { n = %d,\n"
             "    residual { layernorm {}, attention { heads = 4 } },\n"
             "    residual { layernorm {}, mlp { hidden = 64 } } },\n"
             "  layernorm {}, lm_head { tied = %s } }\n"
             "data { text = 'c' }\n"
             "train { batch_tokens = 256, steps = 1%s }\n"
             "%s\n",
             blocks, tied, train_extra, parallel);
    if (tr_recipe_load_string(r, text, "pp.lua", ".", NULL, 0, err, sizeof(err))) {
        printf("FAIL recipe: %s\n", err);
        n_fail++;
        return -1;
    }
    return 0;
}

/* Resolving the pipeline model must fail with exactly `expected`. */
static void pp_refused(const char *what, int blocks, const char *tied, const char *parallel,
                       const char *train_extra, tr_layout_flags f, int world,
                       const char *expected) {
    tr_recipe r;
    if (load_pp(&r, blocks, tied, parallel, train_extra)) return;
    tr_layout l;
    int rc = tr_layout_resolve(&l, &r, &f, world, TR_DTYPE_F32, 0, err, sizeof(err));
    if (!check(rc != 0 && !strcmp(err, expected), "pipeline refused: %s", what))
        printf("     expected: %s\n     got (rc %d): %s\n", expected, rc, err);
    tr_recipe_free(&r);
}

/* Resolving the pipeline model must succeed with this ZeRO stage and schedule, and predict
 * every rank's memory: layouts once refused, run since (issue 32). */
static void pp_resolves(const char *what, const char *tied, const char *parallel, tr_layout_flags f,
                        int world, int zero, tr_pp_kind kind) {
    tr_recipe r;
    if (load_pp(&r, 6, tied, parallel, "")) return;
    tr_layout l;
    tr_memory mem;
    int rc = tr_layout_resolve(&l, &r, &f, world, TR_DTYPE_F32, 0, err, sizeof(err));
    for (int rank = 0; rank < world && !rc; rank++)
        rc = tr_layout_memory(&l, &r.model, TR_DTYPE_F32, rank, &mem, err, sizeof(err));
    check(!rc && l.zero == zero && l.schedule == (int)kind, "pipeline resolves: %s (%s)", what,
          rc ? err : "");
    tr_recipe_free(&r);
}

/* The most expensive chunk of a cut. */
static double worst(const double *cost, int k, const int *start) {
    double w = 0;
    for (int c = 0; c < k; c++) {
        double sum = 0;
        for (int i = start[c]; i < start[c + 1]; i++)
            sum += cost[i];
        if (sum > w) w = sum;
    }
    return w;
}

/* The cheapest most expensive chunk over every cut of n blocks into k (n < 16). */
static double brute_worst(const double *cost, int n, int k) {
    double best = 1e300;
    for (unsigned m = 0; m < 1u << (n - 1); m++) { /* bit i: a cut after block i */
        if (__builtin_popcount(m) != k - 1) continue;
        int start[17], c = 0;
        start[c++] = 0;
        for (int i = 0; i < n - 1; i++)
            if (m >> i & 1) start[c++] = i + 1;
        start[c] = n;
        double w = worst(cost, k, start);
        if (w < best) best = w;
    }
    return best;
}

static void test_partition(void) {
    int start[17], ok = 1;
    unsigned seed = 7;
    for (int t = 0; t < 300 && ok; t++) {
        int n = 1 + t % 12, k = 1 + t % n;
        double cost[16];
        for (int i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            cost[i] = (double)(seed >> 16 & 1023); /* integers: sums are exact */
        }
        ok = !tr_layout_partition(cost, n, k, start) && start[0] == 0 && start[k] == n;
        for (int c = 0; ok && c < k; c++)
            ok = start[c] < start[c + 1];
        ok = ok && worst(cost, k, start) == brute_worst(cost, n, k);
        if (!ok)
            printf("     n %d, k %d: worst %g, best %g\n", n, k, worst(cost, k, start),
                   brute_worst(cost, n, k));
    }
    check(ok, "partition: 300 random cuts are as good as the best of every cut");
    double even[6] = {1, 1, 1, 1, 1, 3};
    int rc = tr_layout_partition(even, 6, 4, start);
    check(!rc && start[1] == 1 && start[2] == 3 && start[3] == 5,
          "partition: 1 1 1 1 1 3 into 4: the heavy block alone, the rest even, earliest cuts "
          "first (0 1 3 5: got 0 %d %d %d)",
          start[1], start[2], start[3]);
    check(tr_layout_partition(even, 6, 7, start) == -1 && tr_layout_partition(even, 6, 0, start),
          "partition: more chunks than blocks, or none, is refused");
    /* by speed: 8 equal blocks on a stage twice as fast as the next: 6 and 2 (times 3 and 2;
       5 and 3 would reach the same most, 3, less evenly); equal speeds: the plain cut */
    double eight[8] = {1, 1, 1, 1, 1, 1, 1, 1}, fast_slow[2] = {2, 1}, same[3] = {1, 1, 1};
    int plain[4], rc2 = tr_layout_partition_speeds(eight, 8, 2, fast_slow, start);
    check(!rc2 && start[0] == 0 && start[1] == 6 && start[2] == 8,
          "partition by speed: 8 blocks on speeds 2 and 1: 6 | 2 (got %d | %d)", start[1],
          8 - start[1]);
    rc2 = tr_layout_partition_speeds(even, 6, 3, same, start) || tr_layout_partition(even, 6, 3, plain);
    check(!rc2 && !memcmp(start, plain, sizeof plain),
          "partition by speed: equal speeds cut as the plain partition");
    double zero[2] = {1, 0};
    check(tr_layout_partition_speeds(eight, 8, 2, zero, start) == -1,
          "partition by speed: a speed of 0 is refused");
}

static void test_pipeline_resolve(void) {
    tr_recipe r;
    tr_layout l;
    tr_layout_flags f = no_flags();
    char line[256];
    if (load_pp(&r, 6, "false", "parallel { pp = 2 }", ", micro_batch = 4")) return;
    int rc = tr_layout_resolve(&l, &r, &f, 4, TR_DTYPE_F32, 0, err, sizeof(err));
    check(!rc && l.dp == 2 && l.tp == 1 && l.pp == 2 && l.schedule == TR_PP_1F1B &&
              l.virtual_stages == 1 && l.n_blocks == 6 && l.micro_batch == 4 && l.accum == 4 &&
              l.microbatches == 4 && !l.stages_given,
          "pp 2 on 4: dp 2, 1f1b, 4 micro-batches of 4, 6 blocks (%s)", err);
    /* the head costs about two blocks: the last rank gets fewer blocks */
    check(!rc && l.chunk_start[0] == 0 && l.chunk_start[1] == 4 && l.chunk_start[2] == 6,
          "pp 2: balanced by FLOPs, the heavy head's rank gets blocks 4-5 (got %d %d %d)",
          l.chunk_start[0], l.chunk_start[1], l.chunk_start[2]);
    tr_layout_describe(&l, line, sizeof(line));
    check(!strcmp(line, "dp 2 x tp 1 x pp 2: data parallel, pipeline 1f1b over 4 micro-batches, "
                        "ZeRO-0, micro-batch 4"),
          "describe: %s", line);
    tr_model_opts m0 = tr_layout_model_opts(&l, 0), m3 = tr_layout_model_opts(&l, 3);
    check(m0.n_chunks == 2 && m0.chunk_start[1] == 4 && m0.chunk_start[2] == 6 && m0.held[0] &&
              !m0.held[1] && m0.slots[0] == 2 && !m0.split_backward,
          "model options of rank 0 (d 0, p 0): chunk 0 held, 2 slots (1f1b: pp - p)");
    check(m3.n_chunks == 2 && !m3.held[0] && m3.held[1] && m3.slots[1] == 1 && m3.shard == 1,
          "model options of rank 3 (d 1, p 1): chunk 1 held, 1 slot");
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    tr_layout_describe_stages(&l, &r.model, out);
    fclose(out);
    check(text && strstr(text, "blocks 0-3 (+ embedding, positions)") &&
              strstr(text, "blocks 4-5 (+ final norm, head)") && strstr(text, "bubble 20.0%") &&
              strstr(text, "rank p1"),
          "describe_stages: each rank's blocks and layers, the 1f1b bubble 1/5");
    if (text && n_fail) printf("%s", text);
    free(text);

    f.pp = 3;
    f.microbatches = 16; /* over the recipe's micro_batch */
    f.schedule = TR_PP_ZBH1;
    rc = tr_layout_resolve(&l, &r, &f, 3, TR_DTYPE_F32, 0, err, sizeof(err));
    check(!rc && l.dp == 1 && l.pp == 3 && l.micro_batch == 2 && l.accum == 16 &&
              l.microbatches == 16 && l.schedule == TR_PP_ZBH1,
          "--pp 3 --microbatches 16 --schedule zb-h1 on 3: micro-batch 32 / 16 = 2 (%s)", err);
    m0 = tr_layout_model_opts(&l, 0);
    check(m0.n_chunks == 3 && m0.split_backward, "zb-h1: the backward is split");
    f = no_flags();
    f.pp = 1;
    rc = tr_layout_resolve(&l, &r, &f, 1, TR_DTYPE_F32, 0, err, sizeof(err));
    m0 = tr_layout_model_opts(&l, 0);
    check(!rc && l.pp == 1 && l.microbatches == l.accum && m0.n_chunks == 0 &&
              l.chunk_start[1] == 6,
          "pp 1 (--pp over the recipe's): no chunks in the model options");
    tr_recipe_free(&r);

    if (load_pp(&r, 6, "false", "parallel { pp = 3, stages = { 0, 1, 3 }, microbatches = 8 }", ""))
        return;
    f = no_flags();
    rc = tr_layout_resolve(&l, &r, &f, 3, TR_DTYPE_F32, 0, err, sizeof(err));
    check(!rc && l.stages_given && l.chunk_start[1] == 1 && l.chunk_start[2] == 3 &&
              l.chunk_start[3] == 6 && l.micro_batch == 4 && l.accum == 8,
          "stages from the recipe: 0 1 3 (6), microbatches 8 of 4 (%s)", err);
    f.pp = 2; /* a flag changed pp: the recipe's cut no longer fits, balanced again */
    rc = tr_layout_resolve(&l, &r, &f, 2, TR_DTYPE_F32, 0, err, sizeof(err));
    check(!rc && !l.stages_given && l.chunk_start[1] == 4,
          "--pp 2 over the recipe's 3 stages: balanced again (%s)", err);
    tr_recipe_free(&r);

    /* "auto" micro-batch: at least pp micro-batches, and what the schedule runs */
    if (load_pp(&r, 8, "false", "parallel { pp = 4, schedule = 'interleaved' }", "")) return;
    f = no_flags();
    rc = tr_layout_resolve(&l, &r, &f, 4, TR_DTYPE_F32, 1e12, err, sizeof(err));
    check(!rc && l.micro_auto && l.virtual_stages == 2 && l.microbatches == 4 && l.micro_batch == 8,
          "auto micro-batch, ample budget, interleaved pp 4: V 2, 4 micro-batches of 8 (%s)", err);
    tr_recipe_free(&r);
}

static void test_pipeline_refusals(void) {
    tr_layout_flags f = no_flags();
    const char *no = "false";
    pp_refused("pp larger than the blocks", 6, no, "parallel { pp = 8 }", "", f, 8,
               "pp.lua:9: parallel: pp 8 x virtual_stages 1 = 8 stages, but the model has 6 "
               "blocks (pp 1, 2, 3, 4, 5 or 6 would)");
    f.pp = 4;
    f.virtual_stages = 2;
    pp_refused("--pp 4 --virtual-stages 2 on 6 blocks", 6, no, "", "", f, 4,
               "pp 4 x virtual_stages 2 = 8 stages, but the model has 6 blocks (pp 2 or 3 would)");
    f = no_flags();
    f.pp = 100;
    pp_refused("--pp 100", 6, no, "", "", f, 100, "--pp must be from 1 to 64, got 100");
    f = no_flags();
    pp_refused("virtual stages without a pipeline", 6, no, "parallel { virtual_stages = 2 }", "", f,
               1, "pp.lua:9: parallel: virtual_stages 2 needs pp 2 or more (pp is 1)");
    pp_refused("virtual stages with 1f1b", 6, no, "parallel { pp = 2, virtual_stages = 2 }", "", f,
               2, "pp.lua:9: parallel: virtual_stages 2 needs schedule \"interleaved\"");
    pp_refused("interleaved with 1 micro-batch on pp 2", 6, no,
               "parallel { pp = 2, schedule = 'interleaved', microbatches = 1 }", "", f, 2,
               "pp.lua:9: parallel: interleaved needs microbatches a multiple of pp 2 (2, 4, ...), "
               "not 1");
    f.microbatches = 1;
    pp_refused("interleaved with --microbatches 1", 6, no,
               "parallel { pp = 2, schedule = 'interleaved' }", "", f, 2,
               "--microbatches 1: interleaved needs microbatches a multiple of pp 2 (2, 4, ...), "
               "not 1");
    f = no_flags();
    pp_refused("microbatches do not divide the sequences", 6, no,
               "parallel { pp = 2, microbatches = 5 }", "", f, 2,
               "pp.lua:9: parallel: microbatches 5 does not divide the 32 sequences per "
               "data-parallel rank of a step (batch_tokens 256 / seq_len 8 / dp 1; 1, 2, 4, 8, 16 "
               "or 32 would)");
    pp_refused("microbatches and micro_batch disagree", 6, no,
               "parallel { pp = 2, microbatches = 8 }", ", micro_batch = 2", f, 2,
               "pp.lua:9: parallel: microbatches 8 and train.micro_batch 2 disagree: 8 "
               "micro-batches of 2 sequences are 16, but each data-parallel rank has 32 a step "
               "(batch_tokens 256 / seq_len 8 / dp 1); give one of them");
    pp_refused("a recompute level per pipeline rank, 2 for pp 4", 6, no, "parallel { pp = 4 }",
               ", recompute = { 'full', 'none' }", f, 4,
               "pp.lua:8: train: recompute gives 2 levels, one per pipeline rank, but pp is 4");
    pp_refused("dp x tp x pp is not the world", 6, no, "parallel { dp = 2, pp = 2 }", "", f, 2,
               "pp.lua:9: parallel: dp 2 x tp 1 x pp 2 = 4 processes, but 2 started (mpirun -np "
               "4)");
    pp_refused("pp does not divide the world", 6, no, "parallel { pp = 2 }", "", f, 3,
               "pp.lua:9: parallel: pp 2 needs a multiple of 2 processes, but 3 started (mpirun "
               "-np 4)");
    f.tp = 2;
    pp_refused("tp x pp does not divide the world", 6, no, "parallel { pp = 2 }", "", f, 6,
               "tp 2 x pp 2 needs a multiple of 4 processes, but 6 started (mpirun -np 8)");
    f = no_flags();
    /* every schedule runs with every ZeRO stage, tied head or not */
    pp_resolves("interleaved with ZeRO-2", no,
                "parallel { pp = 2, schedule = 'interleaved', zero = 2 }", f, 2, 2,
                TR_PP_INTERLEAVED);
    f.schedule = TR_PP_ZBH1;
    f.zero = 3;
    pp_resolves("--schedule zb-h1 --zero 3, a tied head", "true", "parallel { pp = 2 }", f, 4, 3,
                TR_PP_ZBH1);
    f = no_flags();
    pp_resolves("a tied head with pp 2 and ZeRO-2", "true", "parallel { pp = 2, zero = 2 }", f, 2,
                2, TR_PP_1F1B);
    pp_resolves("a tied head, interleaved, ZeRO-3 on dp 2 x pp 2", "true",
                "parallel { pp = 2, dp = 2, schedule = 'interleaved', zero = 3 }", f, 4, 3,
                TR_PP_INTERLEAVED);
    pp_refused("zb-h1 with full recomputation", 6, no, "parallel { pp = 2, schedule = 'zb-h1' }",
               ", recompute = 'full'", f, 2,
               "pp.lua:8: train: recompute \"full\" does not go with schedule zb-h1, which keeps "
               "the inputs of every product for its deferred weight gradients: use recompute "
               "\"none\" or \"selective\"");
    struct {
        const char *what, *stages, *expected;
    } st[] = {
        {"stages: too few", "{ 0, 3 }",
         "pp.lua:9: parallel: stages has 2 entries, but pp 3 x virtual_stages 1 = 3 chunks (give "
         "3 starts, the first 0, or stages = \"auto\")"},
        {"stages: not from 0", "{ 1, 3, 5 }",
         "pp.lua:9: parallel: stages[1] = 1, but the first chunk starts at block 0 (stages[1] = 0 "
         "would)"},
        {"stages: an empty stage (repeat)", "{ 0, 3, 3 }",
         "pp.lua:9: parallel: stages[3] = 3 repeats stages[2]: the chunk starting there would be "
         "empty (stages[3] from 4 to 5 would)"},
        {"stages: decreasing", "{ 0, 3, 2 }",
         "pp.lua:9: parallel: stages[3] = 2 comes before stages[2] = 3: the starts must increase "
         "(stages[3] from 4 to 5 would)"},
        {"stages: past the last block", "{ 0, 3, 6 }",
         "pp.lua:9: parallel: stages[3] = 6 starts an empty chunk: the model has 6 blocks (0 to "
         "5) (stages[3] from 4 to 5 would)"},
        {"stages: too few blocks left", "{ 0, 5, 6 }",
         "pp.lua:9: parallel: stages[2] = 5 leaves 1 block for the 2 chunks from it on "
         "(stages[2] from 1 to 4 would)"},
    };
    for (size_t i = 0; i < sizeof(st) / sizeof(st[0]); i++) {
        char par[128];
        snprintf(par, sizeof(par), "parallel { pp = 3, stages = %s }", st[i].stages);
        pp_refused(st[i].what, 6, no, par, "", f, 3, st[i].expected);
    }
}

/* tr_layout_to_recipe, the recipe written as Lua and loaded again: the same layout. */
static void round_trip(const char *what, const char *parallel, const char *train_extra,
                       tr_layout_flags f, int world) {
    tr_recipe r, back;
    tr_layout l, again;
    if (load_pp(&r, 6, "false", parallel, train_extra)) return;
    if (!check(!tr_layout_resolve(&l, &r, &f, world, TR_DTYPE_F32, 0, err, sizeof(err)),
               "round trip %s: resolves (%s)", what, err)) {
        tr_recipe_free(&r);
        return;
    }
    tr_layout_to_recipe(&l, &r);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    int rc = tr_recipe_write_lua(&r, out);
    fclose(out);
    rc = rc || tr_recipe_load_string(&back, text, "saved.lua", ".", NULL, 0, err, sizeof(err));
    if (check(!rc, "round trip %s: the written recipe loads (%s)", what, err)) {
        rc = tr_layout_resolve(&again, &back,
                               &(tr_layout_flags){.dp = -1, .tp = -1, .zero = -1, .schedule = -1},
                               world, TR_DTYPE_F32, 0, err, sizeof(err));
        again.stages_given = l.stages_given; /* written back, they come from the recipe now */
        check(!rc && !memcmp(&again, &l, sizeof(l)),
              "round trip %s: the saved recipe resolves to the same layout, without flags (%s)",
              what, err);
        tr_recipe_free(&back);
    }
    free(text);
    tr_recipe_free(&r);
}

static void test_pipeline_round_trip(void) {
    tr_layout_flags f = no_flags();
    round_trip("pp 2", "parallel { pp = 2 }", ", micro_batch = 2", f, 4);
    round_trip("interleaved, stages",
               "parallel { pp = 2, schedule = 'interleaved', stages = { 0, "
               "1, 2, 4 }, microbatches = 4 }",
               "", f, 2);
    f.pp = 3;
    f.schedule = TR_PP_GPIPE;
    f.microbatches = 8;
    round_trip("flags: --pp 3 --schedule gpipe --microbatches 8", "", "", f, 6);
    f = no_flags();
    round_trip("pp 1", "parallel { dp = 2 }", ", micro_batch = 4", f, 2);
}

int main(void) {
    test_partition();
    test_pipeline_resolve();
    test_pipeline_refusals();
    test_pipeline_round_trip();
    test_refusals();
    test_widths();
    test_resolve();
    test_auto_micro();
    test_memory();
    printf("%d ok, %d failed\n", n_ok, n_fail);
    return n_fail ? 1 : 0;
}
