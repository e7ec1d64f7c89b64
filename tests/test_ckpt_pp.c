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
 * The manifest records the pipeline (schedule, virtual stages, micro-batches, chunk starts)
 * and reads it back; an older trainer's manifest without it still loads.
 * Under mpirun -np 2 and -np 4; alone, one process plays every rank of the pipeline-only
 * layouts in turn (the writers share a folder, nothing else). The saves, loads and exports
 * over the layouts: tests/ckpt_layouts.c; the missing stage's cases: here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_layouts.h"
#include "parallel/schedule.h"
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
    static const ckl_layout pp2 = {1, 2, 1, 0, 1, 0, 0};
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
    static const ckl_layout pp2 = {1, 2, 1, 0, 1, 0, 0};
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

/* The manifest's text with each line holding one of `drop` removed and `from` replaced by
 * `to` (NULL: nothing), its checksum line recomputed; the original text is returned (to put
 * back), NULL when the manifest cannot be read. */
static char *forge(const char *path, const char *const *drop, const char *from, const char *to) {
    FILE *f = fopen(path, "rb");
    static char buf[1 << 17];
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f) fclose(f);
    if (!n) return NULL;
    buf[n] = 0;
    char *orig = strdup(buf), *out = calloc(1, sizeof(buf) + 256), *at = strstr(buf, "# crc32c: ");
    if (!orig || !out || !at) return free(out), orig;
    *at = 0;
    size_t k = 0;
    for (char *line = buf, *next; *line; line = next) {
        next = strchr(line, '\n');
        next = next ? next + 1 : line + strlen(line);
        int skip = 0;
        for (int d = 0; drop && drop[d] && !skip; d++)
            skip = !strncmp(line, drop[d], strlen(drop[d]));
        if (skip) continue;
        const char *hit = from ? strstr(line, from) : NULL;
        if (hit && hit < next)
            k += (size_t)sprintf(out + k, "%.*s%s%.*s", (int)(hit - line), line, to,
                                 (int)(next - hit - strlen(from)), hit + strlen(from));
        else
            k += (size_t)sprintf(out + k, "%.*s", (int)(next - line), line);
    }
    k += (size_t)sprintf(out + k, "# crc32c: %08x\n", tr_crc32c(0, out, k));
    f = fopen(path, "wb");
    if (f) fwrite(out, 1, k, f), fclose(f);
    free(out);
    return orig;
}

static void put_back(const char *path, char *orig) {
    FILE *f = orig ? fopen(path, "wb") : NULL;
    if (f) fputs(orig, f), fclose(f);
    free(orig);
}

/* Rank 0: pp 2 x 2 virtual stages' manifest records the pipeline (interleaved, 2 virtual
 * stages, 4 micro-batches, the chunks' first blocks) and it reads back; a manifest of an
 * older trainer, without those fields, still loads (schedule and cut not known, virtual
 * stages from the counts); a damaged cut is refused in one line. */
static void pipeline_fields(const tr_recipe *r) {
    static const ckl_layout v2 = {1, 2, 1, 0, 2, 0, 0};
    char dir[600], man[700], err[1024];
    ckl_dir(dir, sizeof(dir), 0, &v2);
    snprintf(dir + strlen(dir), sizeof(dir) - strlen(dir), "/checkpoints/step_00000001");
    snprintf(man, sizeof(man), "%s/manifest.yaml", dir);
    tr_ckpt c;
    int rc = tr_ckpt_read(&c, dir, 0, err, sizeof(err)), cut = !rc && c.has_stages;
    for (int k = 0; cut && k <= 4; k++)
        cut = c.chunk_start[k] == ckl_chunk_start(r, &v2, k);
    if (!rc && c.schedule == TR_PP_INTERLEAVED && c.virtual_stages == 2 && c.microbatches == 4 &&
        c.pp == 2 && c.chunks == 4 && cut)
        printf("ok   pp 2 x 2 virtual stages: the manifest records interleaved, 2 virtual "
               "stages, 4 micro-batches, chunks from blocks %d, %d, %d, %d\n",
               c.chunk_start[0], c.chunk_start[1], c.chunk_start[2], c.chunk_start[3]);
    else
        ckl_bad("pp 2 x 2 virtual stages' pipeline in the manifest: %s (schedule %d, V %d, M %d, "
                "cut %d)", rc ? err : "read", rc ? 0 : c.schedule, rc ? 0 : c.virtual_stages,
                rc ? 0 : c.microbatches, cut);
    if (!rc) tr_ckpt_free(&c);
    static const char *const fields[] = {"  schedule:", "  virtual_stages:", "  microbatches:",
                                         "  chunk_start:", NULL};
    char *orig = forge(man, fields, NULL, NULL);
    rc = tr_ckpt_read(&c, dir, 0, err, sizeof(err));
    if (!rc && c.schedule == -1 && c.microbatches == 0 && c.virtual_stages == 2 && !c.has_stages)
        printf("ok   an older trainer's manifest without the pipeline loads: schedule and cut "
               "not known, 2 virtual stages from pp 2 and 4 chunks\n");
    else
        ckl_bad("an older trainer's manifest without the pipeline: %s (schedule %d, V %d, "
                "stages %d)", rc ? err : "read", rc ? 0 : c.schedule, rc ? 0 : c.virtual_stages,
                rc ? 0 : c.has_stages);
    if (!rc) tr_ckpt_free(&c);
    put_back(man, orig);
    char from[64], to[64];
    snprintf(from, sizeof(from), "[0, %d, ", ckl_chunk_start(r, &v2, 1));
    snprintf(to, sizeof(to), "[0, %d, ", ckl_chunk_start(r, &v2, 2));
    orig = forge(man, NULL, from, to);
    rc = tr_ckpt_read(&c, dir, 0, err, sizeof(err));
    if (rc && strstr(err, "parallel.chunk_start must list 5 block numbers") && !strchr(err, '\n'))
        printf("ok   a manifest whose chunks are not cut in order is refused: %s\n", err);
    else
        ckl_bad("a manifest whose chunks are not in order: %s", rc ? err : "accepted");
    if (!rc) tr_ckpt_free(&c);
    put_back(man, orig);
}

int main(int argc, char **argv) {
    int rc = ckl_start(&argc, &argv, "test_ckpt_pp", cases, 1);
    if (rc) return rc;
    /* one process, pp 2, pp 2 with 2 chunks a stage, tp 2, pp 2 in zb-v's V (the first and
       last chunk on stage 0); with 4 ranks also pp 4, tp 2 x pp 2 and dp 2 x pp 2 (ZeRO-1 and
       ZeRO-2: the ranges of tr_dp) */
    static const ckl_layout ls[] = {
        {1, 1, 1, 0, 1, 0, 0}, {1, 2, 1, 0, 1, 0, 0}, {1, 2, 1, 0, 2, 0, 0},
        {1, 1, 2, 0, 1, 0, 0}, {1, 2, 1, 0, 2, 0, 1}, {1, 4, 1, 0, 1, 0, 0},
        {1, 2, 2, 0, 1, 0, 0}, {2, 2, 1, 1, 1, 0, 0}, {2, 2, 1, 2, 1, 0, 0}};
    int nl = ckl_world == 4 ? 9 : 5;
    for (int mc = 0; mc < N_CASES; mc++) {
        tr_recipe r;
        if (ckl_recipe(mc, &r)) continue;
        ckl_matrix(&r, mc, ls, nl);
        if (mc == 0) {
            missing_stage_save(&r);
            if (ckl_me == 0) missing_stage_load();
            if (ckl_me == 0) pipeline_fields(&r);
            tr_comm_barrier(ckl_comm);
        }
        tr_recipe_free(&r);
    }
    return ckl_end();
}
