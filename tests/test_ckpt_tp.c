/* Checkpoints across layouts, under mpirun -np 2 and -np 4 (alone: skipped, exit 77). Every
 * rank builds its part of small GPT- and Llama-shaped models (a padded vocabulary whose last
 * tensor-parallel shard is partly, or wholly, padding; key/value heads split, or shared by 2
 * and 4 ranks) in each dp x tp x ZeRO layout of the world, sets its parameters and AdamW
 * moments to values derived from each global tensor's name and element index, and saves a
 * checkpoint with the ranges it keeps (tr_dp_ckpt_ranges). Rank 0 alone saves the
 * single-process model too (as the trainer builds it: no padded vocabulary). Every checkpoint
 * is then loaded into every layout (tp 2 -> 1, 1 -> 4, 2 -> 4, 4 -> 2, dp 2 x tp 2 -> dp 4,
 * ...), and each rank compares every element it keeps bitwise (it is a copy). The Hugging Face
 * export of each checkpoint must be byte for byte the single-process one's, importing that
 * export into every layout must give the reference's parameters bitwise, and a checkpoint of
 * another shape is refused naming the tensor and both shapes. Forward and backward are not
 * run. The saves, loads and exports over the layouts: tests/ckpt_layouts.c; the wrong shape:
 * here. */
#include <stdio.h>
#include <string.h>

#include "ckpt_layouts.h"
#include "trainer/checkpoint/checkpoint.h"

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

static const ckl_case cases[] = {
    {"gpt", gpt, 64},
    {"llama_kv1", LLAMA(1), 32}, /* one key/value head: shared by every tp rank */
    {"llama_kv2", LLAMA(2), 32}, /* split at tp 2, shared by pairs at tp 4 */
};
#define N_CASES (int)(sizeof(cases) / sizeof(cases[0]))

/* A checkpoint of another shape (kv_heads 1 into kv_heads 2) is refused, naming the tensor
 * and both global shapes. */
static void wrong_shape(const ckl_layout *single, const ckl_layout *to) {
    tr_recipe r;
    char err[1024], dir[600];
    if (ckl_recipe(2, &r)) return;
    ckl_part pt;
    if (!ckl_groups(&pt, to) && !ckl_build(&pt, &r, 2, to, ckl_me)) {
        ckl_dir(dir, sizeof(dir), 1, single);
        tr_ckpt c;
        int rc = tr_ckpt_find_resume(dir, &c, 1, NULL, err, sizeof(err)) ? -1 : 0;
        if (!rc) {
            rc = tr_ckpt_apply(&c, pt.m, err, sizeof(err)) ? 1 : 0;
            tr_ckpt_free(&c);
        }
        if (rc == 1 && strstr(err, "tensor 'stack.0.residual0.attention.qkv.weight' is 48 x 32, "
                                   "the model's is 64 x 32")) {
            if (ckl_me == 0) printf("ok   a checkpoint of another shape is refused: %s\n", err);
        } else {
            ckl_bad("a kv_heads 1 checkpoint into a kv_heads 2 model: %s", rc ? err : "accepted");
        }
        ckl_unbuild(&pt);
    }
    tr_recipe_free(&r);
}

int main(int argc, char **argv) {
    int rc = ckl_start(&argc, &argv, "test_ckpt_tp", cases, 0);
    if (rc) return rc;
    /* the single process (the reference) first */
    static const ckl_layout two[] = {{1, 1, 1, 0, 1, 1, 0},
                                     {2, 1, 1, 0, 1, 0, 0},
                                     {1, 1, 2, 0, 1, 0, 0},
                                     {2, 1, 1, 3, 1, 0, 0},
                                     {1, 1, 2, 2, 1, 0, 0}};
    static const ckl_layout four[] = {
        {1, 1, 1, 0, 1, 1, 0}, {4, 1, 1, 0, 1, 0, 0}, {2, 1, 2, 0, 1, 0, 0}, {1, 1, 4, 0, 1, 0, 0},
        {2, 1, 2, 1, 1, 0, 0}, {2, 1, 2, 3, 1, 0, 0}, {4, 1, 1, 2, 1, 0, 0}};
    const ckl_layout *ls = ckl_world == 2 ? two : four;
    int nl = ckl_world == 2 ? 5 : 7;
    for (int mc = 0; mc < N_CASES; mc++) {
        tr_recipe r;
        if (ckl_recipe(mc, &r)) continue;
        ckl_matrix(&r, mc, ls, nl);
        tr_recipe_free(&r);
    }
    wrong_shape(&ls[0], &ls[2]);
    return ckl_end();
}
