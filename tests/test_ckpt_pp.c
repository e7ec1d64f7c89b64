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
 * layouts in turn (the writers share a folder, nothing else). The saves, loads and exports
 * over the layouts: tests/ckpt_layouts.c; the missing stage's cases: here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_layouts.h"
#include "trainer/checkpoint/checkpoint.h"

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

static const ckl_case cases[] = {{"gpt", gpt, 64}, {"llama", llama, 32}};
#define N_CASES (int)(sizeof(cases) / sizeof(cases[0]))

/* pp 2, stage 1 writing nothing: rank 0 refuses the save in one line naming a tensor of the
 * stage, and publishes nothing. */
static void missing_stage_save(const tr_recipe *r) {
    static const ckl_layout pp2 = {1, 2, 1, 0, 1, 0};
    char out[600], err[1024];
    snprintf(out, sizeof(out), "%s/gpt_stage_missing", ckl_root);
    ckl_save_to(r, 0, &pp2, out, 1, err, sizeof(err));
    if (ckl_me != 0) return;
    long *steps = NULL;
    int n = tr_ckpt_steps(out, &steps);
    free(steps);
    if (strstr(err, "tensor 'stack.2.") && strstr(err, "is in no block") && !strchr(err, '\n') &&
        n == 0)
        printf("ok   a save where pipeline stage 1 wrote nothing is refused: %s\n", err);
    else
        ckl_bad("a save where pipeline stage 1 wrote nothing: %s (%d checkpoints published)",
                err[0] ? err : "accepted", n);
}

/* Rank 0: pp 2's checkpoint without stage 1's file is refused in one line naming the file
 * and the stage. */
static void missing_stage_load(void) {
    static const ckl_layout pp2 = {1, 2, 1, 0, 1, 0};
    char dir[600], f[700], g[720], err[1024];
    ckl_dir(dir, sizeof(dir), 0, &pp2);
    snprintf(dir + strlen(dir), sizeof(dir) - strlen(dir), "/checkpoints/step_00000001");
    snprintf(f, sizeof(f), "%s/rank_00001.safetensors", dir);
    snprintf(g, sizeof(g), "%s.away", f);
    if (rename(f, g)) {
        ckl_bad("cannot move %s away", f);
        return;
    }
    tr_ckpt c;
    int rc = tr_ckpt_read(&c, dir, 1, err, sizeof(err));
    if (!rc) tr_ckpt_free(&c);
    if (rc && strstr(err, "rank_00001.safetensors") && strstr(err, "pipeline stage 1 of 2") &&
        !strchr(err, '\n'))
        printf("ok   a checkpoint without pipeline stage 1's file is refused: %s\n", err);
    else
        ckl_bad("a checkpoint without pipeline stage 1's file: %s", rc ? err : "accepted");
    if (rename(g, f)) ckl_bad("cannot move %s back", g);
}

int main(int argc, char **argv) {
    int rc = ckl_start(&argc, &argv, "test_ckpt_pp", cases, 1);
    if (rc) return rc;
    /* one process, pp 2, pp 2 with 2 chunks a stage, tp 2; with 4 ranks also pp 4,
       tp 2 x pp 2 and dp 2 x pp 2 (ZeRO-1 and ZeRO-2: the ranges of tr_dp) */
    static const ckl_layout ls[] = {{1, 1, 1, 0, 1, 0}, {1, 2, 1, 0, 1, 0}, {1, 2, 1, 0, 2, 0},
                                    {1, 1, 2, 0, 1, 0}, {1, 4, 1, 0, 1, 0}, {1, 2, 2, 0, 1, 0},
                                    {2, 2, 1, 1, 1, 0}, {2, 2, 1, 2, 1, 0}};
    int nl = ckl_world == 4 ? 8 : 4;
    for (int mc = 0; mc < N_CASES; mc++) {
        tr_recipe r;
        if (ckl_recipe(mc, &r)) continue;
        ckl_matrix(&r, mc, ls, nl);
        if (mc == 0) {
            missing_stage_save(&r);
            if (ckl_me == 0) missing_stage_load();
            tr_comm_barrier(ckl_comm);
        }
        tr_recipe_free(&r);
    }
    return ckl_end();
}
