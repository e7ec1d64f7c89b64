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

static int n_fail, n_ok;
static char err[1024];

#ifdef __GNUC__
__attribute__((format(printf, 2, 3)))
#endif
static int
check(int cond, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", cond ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (cond)
        n_ok++;
    else
        n_fail++;
    return cond;
}

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
    return (tr_layout_flags){.dp = -1, .tp = -1, .zero = -1};
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
    refused("pp 2", "parallel { pp = 2 }", "", no_flags(), 2,
            "tiny.lua:10: parallel: pp 2: pipeline parallelism is not implemented yet (pp must be "
            "1)");
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
    rc = tr_layout_resolve(&again, &r, &(tr_layout_flags){.dp = -1, .tp = -1, .zero = -1}, 4,
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
    check(mo.external_grads == 0 && mo.external_params == 1 && mo.shards == 1 &&
              mo.sequence_parallel == 1 && mo.tp_rank == 1,
          "model options at ZeRO-3: external parameters, sequence parallel");
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

int main(void) {
    test_refusals();
    test_widths();
    test_resolve();
    test_auto_micro();
    test_memory();
    printf("%d ok, %d failed\n", n_ok, n_fail);
    return n_fail ? 1 : 0;
}
