/* Helper for tests/hf_check.sh: the logits (T, V) of a checkpoint's model on a fixed input
 * (token t = (37 t + 11) mod vocab), as raw little-endian float32, for comparing with what
 * transformers computes from the exported Hugging Face folder.
 * usage: hf_logits CKPT OUT.bin   (prints "vocab seq_len") */
#include <stdio.h>
#include <stdlib.h>

#include "trainer/checkpoint/checkpoint.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: hf_logits CKPT OUT.bin\n");
        return 2;
    }
    char err[1024];
    tr_ckpt c;
    if (tr_ckpt_open_arg(argv[1], &c, 0, stderr, err, sizeof(err))) {
        fprintf(stderr, "hf_logits: %s\n", err);
        return 1;
    }
    tr_recipe r;
    if (tr_recipe_load_string(&r, c.recipe, "ckpt", ".", NULL, 0, err, sizeof(err))) {
        fprintf(stderr, "hf_logits: %s\n", err);
        return 1;
    }
    int T = r.model.seq_len, V = r.model.vocab, rc = 1;
    tr_model *m;
    if (tr_model_init(&m, &r.model, tr_backend_cpu(), 1, T, err, sizeof(err)) ||
        tr_ckpt_apply(&c, m, err, sizeof(err))) {
        fprintf(stderr, "hf_logits: %s\n", err);
        return 1;
    }
    int *tok = malloc((size_t)T * sizeof(int));
    float *logits = malloc((size_t)T * (size_t)V * sizeof(float));
    for (int t = 0; t < T; t++) tok[t] = (37 * t + 11) % V;
    tr_model_all_logits(m, tok, 1, T, logits);
    FILE *f = fopen(argv[2], "wb");
    if (f && fwrite(logits, sizeof(float), (size_t)T * V, f) == (size_t)T * V && !fclose(f)) {
        printf("%d %d\n", V, T);
        rc = 0;
    }
    free(tok);
    free(logits);
    tr_model_free(m);
    tr_recipe_free(&r);
    tr_ckpt_free(&c);
    return rc;
}
