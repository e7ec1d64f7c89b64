/* Checkpoint pieces in isolation: CRC32C and SHA-256 against published vectors, the JSON
 * reader, a save -> verified read -> apply round trip of parameters and AdamW state (bitwise),
 * damage detection (manifest and tensor bytes), recipe comparison, and the Hugging Face
 * export -> import round trip (bitwise) for GPT-2- and Llama-shaped models, with the
 * refusals for shapes that do not match. Several writers: blocks from ranges cut mid-row,
 * ranges with a gap or an overlap refused; the blocks of tensor-parallel layouts (planned in
 * one process) cover each global element once. Saving and loading real tensor-parallel shards
 * needs their tp groups: tests/test_ckpt_tp.c, under mpirun. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/private.h" /* the blocks of tensor-parallel layouts */
#include "trainer/trainer.h"

static int failures = 0;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            printf("ok   ");                                                                       \
        } else {                                                                                   \
            printf("FAIL ");                                                                       \
            failures++;                                                                            \
        }                                                                                          \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
    } while (0)

static const char *gpt_recipe =
    "model { vocab = 64, dim = 32, seq_len = 16, embedding {}, positions {},\n"
    "  stack { n = 2, residual { layernorm {}, attention { heads = 4 } },\n"
    "    residual { layernorm {}, mlp { hidden = 64 } } },\n"
    "  layernorm {}, lm_head {} }\n"
    "data { text = \"x.txt\" }\n"
    "train { batch_tokens = 32, steps = 10, checkpoint_every = 5, keep_checkpoints = 2 }\n";

static const char *gpt_nobias_recipe =
    "model { vocab = 64, dim = 32, seq_len = 16, embedding {}, positions {},\n"
    "  stack { n = 2, residual { layernorm { bias = false }, attention { heads = 4, bias = false } },\n"
    "    residual { layernorm { bias = false }, mlp { hidden = 64, bias = false } } },\n"
    "  layernorm { bias = false }, lm_head { tied = false } }\n"
    "data { text = \"x.txt\" }\n"
    "train { batch_tokens = 32, steps = 10 }\n";

static const char *llama_recipe =
    "model { vocab = 64, dim = 32, seq_len = 16, embedding {}, rope { theta = 10000 },\n"
    "  stack { n = 2, residual { rmsnorm {}, attention { heads = 4, kv_heads = 2, bias = false } },\n"
    "    residual { rmsnorm {}, mlp { hidden = 48, activation = \"swiglu\", bias = false } } },\n"
    "  rmsnorm {}, lm_head { tied = false } }\n"
    "data { text = \"x.txt\" }\n"
    "train { batch_tokens = 32, steps = 10 }\n";

static const char *tp_gpt_recipe = /* the vocabulary does not fill the last tp shards */
    "model { vocab = 130, dim = 32, seq_len = 16, embedding {}, positions {},\n"
    "  stack { n = 2, residual { layernorm {}, attention { heads = 4 } },\n"
    "    residual { layernorm {}, mlp { hidden = 64 } } },\n"
    "  layernorm {}, lm_head {} }\n"
    "data { text = \"x.txt\" }\n"
    "train { batch_tokens = 32, steps = 10 }\n";

static const char *tp_llama_recipe = /* one key/value head, shared by every tp rank */
    "model { vocab = 200, dim = 32, seq_len = 16, embedding {}, rope { theta = 10000 },\n"
    "  stack { n = 2,\n"
    "    residual { rmsnorm {}, attention { heads = 4, kv_heads = 1, bias = false } },\n"
    "    residual { rmsnorm {}, mlp { hidden = 48, activation = \"swiglu\", bias = false } } },\n"
    "  rmsnorm {}, lm_head { tied = false } }\n"
    "data { text = \"x.txt\" }\n"
    "train { batch_tokens = 32, steps = 10 }\n";

static const char *flat_recipe = /* no stack: neither GPT-2- nor Llama-shaped */
    "model { vocab = 64, dim = 32, seq_len = 16, embedding {}, positions {},\n"
    "  residual { layernorm {}, attention { heads = 4 } },\n"
    "  residual { layernorm {}, mlp { hidden = 64 } },\n"
    "  layernorm {}, lm_head {} }\n"
    "data { text = \"x.txt\" }\n"
    "train { batch_tokens = 32, steps = 10 }\n";

static tr_model *make_model(const char *text, tr_recipe *r, unsigned long long seed) {
    char err[512];
    if (tr_recipe_load_string(r, text, "test.lua", ".", NULL, 0, err, sizeof(err))) {
        printf("FAIL recipe: %s\n", err);
        exit(1);
    }
    tr_model *m;
    if (tr_model_init(&m, &r->model, tr_backend_cpu(), 2, 16, err, sizeof(err))) {
        printf("FAIL model: %s\n", err);
        exit(1);
    }
    tr_model_init_params(m, seed);
    return m;
}

/* A few AdamW steps so that m, v and the step count are not trivial. */
static void train_a_bit(tr_model *m, int steps) {
    int tok[32], tgt[32];
    for (int i = 0; i < 32; i++) tok[i] = (i * 7) % 64, tgt[i] = (i * 7 + 3) % 64;
    tr_adamw opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                    .weight_decay = 0.1f, .grad_scale = 1.0f};
    for (int s = 0; s < steps; s++) {
        tr_model_zero_grad(m);
        tr_model_forward(m, tok, tgt, 2, 16, 1.0f);
        tr_model_backward(m);
        tr_model_adamw_step(m, &opt);
    }
}

/* 1 when every parameter (and, with state, m and v) of a and b are bitwise equal */
static int same_model(const tr_model *a, const tr_model *b, int state) {
    int n = tr_model_num_params(a), same = n == tr_model_num_params(b);
    for (int i = 0; i < n && same; i++) {
        size_t k = tr_model_param(a, i)->numel;
        float *x = malloc(k * 4), *y = malloc(k * 4);
        for (int kind = 0; kind < (state ? 3 : 1) && same; kind++) {
            if (kind == 0) {
                tr_model_get_param(a, i, x);
                tr_model_get_param(b, i, y);
            } else {
                tr_model_get_state(a, i, (tr_state_kind)(kind - 1), x);
                tr_model_get_state(b, i, (tr_state_kind)(kind - 1), y);
            }
            same = memcmp(x, y, k * 4) == 0;
            if (!same) printf("     differs: %s (kind %d)\n", tr_model_param(a, i)->name, kind);
        }
        free(x);
        free(y);
    }
    return same;
}

static void test_hashes(void) {
    CHECK(tr_crc32c(0, "123456789", 9) == 0xE3069283u, "CRC32C check value of \"123456789\"");
    CHECK(tr_crc32c(tr_crc32c(0, "1234", 4), "56789", 5) == 0xE3069283u, "CRC32C in two pieces");
    unsigned char zeros[32] = {0};
    CHECK(tr_crc32c(0, zeros, 32) == 0x8A9136AAu, "CRC32C of 32 zero bytes (RFC 3720)");
    char hex[65];
    tr_sha256_hex("abc", 3, hex);
    CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
          "SHA-256 of \"abc\"");
    tr_sha256_hex("", 0, hex);
    CHECK(!strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
          "SHA-256 of the empty string");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    tr_sha256_hex(two, strlen(two), hex);
    CHECK(!strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
          "SHA-256 of the two-block FIPS vector");
}

static void test_json(void) {
    tr_json j;
    char err[128];
    const char *s = "{\"a\": [1, 2.5e1, -3], \"b\": {\"c\": \"x\\u00e9\\n\"}, \"t\": true, \"n\": null}";
    int rc = tr_json_parse(&j, s, strlen(s), err, sizeof(err));
    CHECK(rc == 0, "JSON parses");
    if (!rc) {
        const tr_json *a = tr_json_get(&j, "a"), *c = tr_json_get(tr_json_get(&j, "b"), "c");
        CHECK(a && a->n == 3 && a->kids[1].num == 25 && a->kids[2].num == -3, "JSON numbers");
        CHECK(c && !strcmp(c->str, "x\xc3\xa9\n"), "JSON string escapes");
        CHECK(tr_json_get(&j, "t")->num == 1 && tr_json_get(&j, "n")->type == TR_JSON_NULL,
              "JSON literals");
        tr_json_free(&j);
    }
    CHECK(tr_json_parse(&j, "{\"a\": [1, 2}", 12, err, sizeof(err)) == -1 && strstr(err, "byte"),
          "bad JSON is refused with a byte offset: %s", err);
}

static void flip_byte(const char *path, long from_end) {
    FILE *f = fopen(path, "r+b");
    fseek(f, -from_end, SEEK_END);
    int c = fgetc(f);
    fseek(f, -from_end, SEEK_END);
    fputc(c ^ 0x10, f);
    fclose(f);
}

/* Replaces the first `from` in a manifest by `to` and recomputes its checksum line: a forged
 * manifest that only the field checks can refuse. */
static void forge_manifest(const char *path, const char *from, const char *to) {
    FILE *f = fopen(path, "rb");
    static char buf[1 << 16], out[1 << 16];
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    char *tag = strstr(buf, "# crc32c: "), *at = strstr(buf, from);
    if (!tag || !at || at > tag) {
        CHECK(0, "forge_manifest: '%s' not in %s", from, path);
        return;
    }
    *tag = 0;
    int k = snprintf(out, sizeof(out), "%.*s%s%s", (int)(at - buf), buf, to, at + strlen(from));
    k += snprintf(out + k, sizeof(out) - (size_t)k, "# crc32c: %08x\n",
                  tr_crc32c(0, out, (size_t)k));
    f = fopen(path, "wb");
    fwrite(out, 1, (size_t)k, f);
    fclose(f);
}

static void test_round_trip(const char *root) {
    tr_recipe r;
    tr_model *m = make_model(gpt_recipe, &r, 5);
    train_a_bit(m, 3);
    char err[1024], out[512];
    snprintf(out, sizeof(out), "%s/run", root);
    tr_ckpt_opts o = {.out = out, .keep = 2, .world = 1, .sync = 1, .layout = {.dp = 1, .tp = 1, .pp = 1}};
    tr_ckpt_writer *w;
    CHECK(tr_ckpt_writer_init(&w, m, &r, &o, err, sizeof(err)) == 0, "writer starts");
    tr_loader_pos pos;
    memset(&pos, 0xA5, sizeof(pos));
    tr_ckpt_save(w, 3, &pos, NULL);
    train_a_bit(m, 1);
    tr_ckpt_save(w, 4, &pos, NULL);
    o.sync = 0; /* and one asynchronous save with the copy overlapped */
    tr_ckpt_writer *w2;
    tr_ckpt_writer_init(&w2, m, &r,
                        &(tr_ckpt_opts){.out = out, .keep = 2, .world = 1, .overlap = 1, .layout = {.dp = 1, .tp = 1, .pp = 1}},
                        err, sizeof(err));
    /* the guard's state (values that 17 digits must carry exactly; a ring that wrapped) */
    double gl[3] = {0.1, 1.0 / 3.0, 4.9e-324}, gn[3] = {2.5, 1e300, 0x1.fffffffffffffp-1};
    tr_ckpt_guard gs = {.window = 3,
                        .n = 3,
                        .next = 1,
                        .loss = gl,
                        .norm = gn,
                        .bad = 2,
                        .first_bad = 4,
                        .rolled_to = 2,
                        .last_loss = 7.25,
                        .last_norm = NAN};
    tr_ckpt_save(w2, 5, &pos, &gs);
    gl[0] = gn[0] = -1; /* the save holds its own copy */
    tr_ckpt_fence(w2);
    CHECK(tr_ckpt_wait(w2, err, sizeof(err)) == 0, "asynchronous save completes");
    tr_ckpt_writer_free(w2);
    tr_ckpt_stats st = tr_ckpt_writer_stats(w);
    CHECK(st.saves == 2 && st.failed == 0, "two synchronous saves (%d)", st.saves);
    tr_ckpt_writer_free(w);

    char dir[600];
    snprintf(dir, sizeof(dir), "%s/checkpoints/step_00000003", out);
    CHECK(access(dir, F_OK) != 0, "keep_checkpoints = 2 removed step 3 once step 5 was complete");

    tr_ckpt c;
    int rc = tr_ckpt_find_resume(out, &c, 1, stdout, err, sizeof(err));
    CHECK(rc == 0 && c.step == 5 && c.adam_steps == 4, "the newest checkpoint is step 5 (%s)",
          rc ? err : "found");
    if (rc) return;
    CHECK(!memcmp(&c.loader, &pos, sizeof(pos)), "the loader position comes back bytewise");
    gl[0] = 0.1, gn[0] = 2.5;
    const tr_ckpt_guard *g = &c.guard;
    CHECK(c.has_guard && g->window == 3 && g->n == 3 && g->next == 1 && g->bad == 2 &&
              g->first_bad == 4 && g->rolled_to == 2 && g->last_loss == 7.25 &&
              isnan(g->last_norm) && !memcmp(g->loss, gl, sizeof(gl)) &&
              !memcmp(g->norm, gn, sizeof(gn)),
          "the guard's state comes back bitwise (its ring as saved, not as changed after)");
    tr_recipe r2;
    tr_model *m2 = make_model(gpt_recipe, &r2, 99);
    CHECK(!same_model(m, m2, 0), "a model with another seed differs");
    rc = tr_ckpt_apply(&c, m2, err, sizeof(err));
    CHECK(rc == 0 && same_model(m, m2, 1) && tr_model_adam_steps(m2) == 4,
          "parameters, AdamW moments and step count come back bitwise");
    /* the recipe inside is the resolved one and compares equal */
    tr_recipe saved;
    rc = tr_recipe_load_string(&saved, c.recipe, "saved", ".", NULL, 0, err, sizeof(err));
    CHECK(rc == 0 && tr_ckpt_compare_recipes(&saved, &r, NULL, err, sizeof(err)) == 0,
          "the saved recipe loads and matches the current one");
    if (!rc) tr_recipe_free(&saved);

    /* HF export of this GPT-2-shaped checkpoint, then import into a fresh model */
    char hf[600];
    snprintf(hf, sizeof(hf), "%s/hf_gpt", root);
    rc = tr_hf_export(&c, &r.model, 0, hf, err, sizeof(err));
    CHECK(rc == 0, "GPT-2 export (%s)", rc ? err : "ok");
    tr_recipe r3;
    tr_model *m3 = make_model(gpt_recipe, &r3, 123);
    rc = tr_hf_import(m3, hf, 0, err, sizeof(err));
    CHECK(rc == 0 && same_model(m, m3, 0), "GPT-2 export -> import gives identical tensors%s%s",
          rc ? ": " : "", rc ? err : "");
    /* a NaN in the HF weights (they carry no checksum) is refused, naming the tensor */
    {
        char stpath[700];
        snprintf(stpath, sizeof(stpath), "%s/model.safetensors", hf);
        FILE *sf = fopen(stpath, "r+b");
        float nan = NAN;
        fseek(sf, -4, SEEK_END);
        fwrite(&nan, 4, 1, sf);
        fclose(sf);
        rc = tr_hf_import(m3, hf, 0, err, sizeof(err));
        CHECK(rc == -1 && strstr(err, "must be finite"), "a NaN weight in an HF file is refused: %s",
              rc ? err : "imported");
    }
    tr_ckpt_free(&c);

    /* damage: a flipped tensor byte, a flipped manifest byte */
    char f[700];
    snprintf(dir, sizeof(dir), "%s/checkpoints/step_00000005", out);
    snprintf(f, sizeof(f), "%s/rank_00000.safetensors", dir);
    flip_byte(f, 100);
    rc = tr_ckpt_read(&c, dir, 1, err, sizeof(err));
    CHECK(rc && strstr(err, "rank_00000.safetensors") && strstr(err, "checksum"),
          "a flipped tensor byte is refused: %s", err);
    flip_byte(f, 100);
    snprintf(f, sizeof(f), "%s/manifest.yaml", dir);
    flip_byte(f, 300);
    rc = tr_ckpt_read(&c, dir, 1, err, sizeof(err));
    CHECK(rc && strstr(err, "manifest.yaml") && strstr(err, "checksum"),
          "a flipped manifest byte is refused: %s", err);
    rc = tr_ckpt_find_resume(out, &c, 1, stdout, err, sizeof(err));
    CHECK(rc == 0 && c.step == 4, "resume falls back to step 4");
    if (!rc) tr_ckpt_free(&c);
    /* a forged manifest (checksum recomputed) with a negative step is refused by its fields */
    flip_byte(f, 300);
    forge_manifest(f, "step: 5", "step: -3");
    rc = tr_ckpt_read(&c, dir, 1, err, sizeof(err));
    CHECK(rc && strstr(err, "step '-3'") && strstr(err, "must be counts"),
          "a negative step is refused: %s", rc ? err : "read");
    if (!rc) tr_ckpt_free(&c);
    /* a forged guard section is refused, naming the field; step 4's has none (saved without) */
    forge_manifest(f, "step: -3", "step: 5");
    forge_manifest(f, "rolled_to: 2", "rolled_to: two");
    rc = tr_ckpt_read(&c, dir, 1, err, sizeof(err));
    CHECK(rc && strstr(err, "manifest.yaml: guard.rolled_to is 'two'"),
          "a forged guard.rolled_to is refused: %s", rc ? err : "read");
    if (!rc) tr_ckpt_free(&c);
    forge_manifest(f, "rolled_to: two", "rolled_to: 2");
    forge_manifest(f, "next: 1", "next: 5");
    rc = tr_ckpt_read(&c, dir, 1, err, sizeof(err));
    CHECK(rc && strstr(err, "guard: the lists loss and grad_norm"),
          "a guard ring that does not fit its window is refused: %s", rc ? err : "read");
    if (!rc) tr_ckpt_free(&c);
    snprintf(dir, sizeof(dir), "%s/checkpoints/step_00000004", out);
    rc = tr_ckpt_read(&c, dir, 1, err, sizeof(err));
    CHECK(rc == 0 && !c.has_guard, "a checkpoint saved without the guard's state reads (%s)",
          rc ? err : "none in it");
    if (!rc) tr_ckpt_free(&c);

    /* a recipe that matters is refused, naming the field */
    tr_recipe r4;
    tr_model *m4 = make_model(llama_recipe, &r4, 1);
    rc = tr_ckpt_compare_recipes(&r, &r4, NULL, err, sizeof(err));
    CHECK(rc == -1 && strstr(err, "model layers"), "a changed model is refused: %s", err);
    r2.train.steps = 20;
    r2.train.eval_every = 3;
    rc = tr_ckpt_compare_recipes(&r, &r2, stdout, err, sizeof(err));
    CHECK(rc == 0, "more steps and another eval interval are allowed");
    r2.optim.lr *= 2;
    rc = tr_ckpt_compare_recipes(&r, &r2, NULL, err, sizeof(err));
    CHECK(rc == -1 && strstr(err, "optimizer.lr"), "a changed lr is refused: %s", err);

    /* importing the GPT-2 folder into a Llama-shaped model is refused */
    rc = tr_hf_import(m4, hf, 0, err, sizeof(err));
    CHECK(rc == -1 && strstr(err, "model_type"), "a GPT-2 folder into a Llama model: %s", err);
    tr_model_free(m4);
    tr_recipe_free(&r4);
    tr_model_free(m);
    tr_model_free(m2);
    tr_model_free(m3);
    tr_recipe_free(&r);
    tr_recipe_free(&r2);
    tr_recipe_free(&r3);
}

/* Save a model as a checkpoint, export it, import it into a fresh model of the same recipe. */
/* Two writers in one process play ranks 0 and 1 of 2: each saves the slab ranges it is given
 * (cut at odd places, so tensors split into blocks mid-row), rank 0 publishes the manifest once
 * rank 1's part is there. The checkpoint reads back without assembling the split tensors, and
 * applying it or exporting it gives the model's tensors bitwise. */
static void test_two_writers(const char *root) {
    tr_recipe r;
    tr_model *m = make_model(gpt_recipe, &r, 11);
    train_a_bit(m, 2);
    char err[1024], out[512];
    snprintf(out, sizeof(out), "%s/sharded", root);
    size_t n = tr_model_slab_elements(m), cut1 = n / 3 + 5, cut2 = 2 * n / 3 + 7;
    size_t r0[4] = {0, cut1, cut2, n}, r1[2] = {cut1, cut2}; /* rank 0: two ranges */
    tr_ckpt_writer *w0, *w1;
    tr_ckpt_opts o0 = {.out = out, .keep = 1, .rank = 0, .world = 2, .ranges = r0, .n_ranges = 2,
                       .layout = {.dp = 2, .tp = 1, .pp = 1, .zero = 2}, .timeout_s = 30};
    tr_ckpt_opts o1 = o0;
    o1.rank = 1, o1.ranges = r1, o1.n_ranges = 1;
    int ok = tr_ckpt_writer_init(&w0, m, &r, &o0, err, sizeof(err)) == 0 &&
             tr_ckpt_writer_init(&w1, m, &r, &o1, err, sizeof(err)) == 0;
    CHECK(ok, "two writers start (%s)", ok ? "ok" : err);
    if (!ok) return;
    tr_loader_pos pos;
    memset(&pos, 0x3C, sizeof(pos));
    tr_ckpt_save(w0, 2, &pos, NULL);
    tr_ckpt_save(w1, 2, &pos, NULL);
    int rc0 = tr_ckpt_wait(w0, err, sizeof(err)), rc1 = tr_ckpt_wait(w1, err, sizeof(err));
    CHECK(rc0 == 0 && rc1 == 0, "both parts written, rank 0 published (%s)", rc0 || rc1 ? err : "ok");
    tr_ckpt_writer_free(w0);
    tr_ckpt_writer_free(w1);
    char f[700];
    snprintf(f, sizeof(f), "%s/checkpoints/step_00000002/rank_00001.safetensors", out);
    CHECK(access(f, F_OK) == 0, "rank 1 wrote its own file");
    snprintf(f, sizeof(f), "%s/checkpoints/step_00000002/rank_00001.part", out);
    CHECK(access(f, F_OK) != 0, "rank 1's block list was removed once the manifest was written");
    tr_ckpt c;
    int rc = tr_ckpt_find_resume(out, &c, 1, stdout, err, sizeof(err));
    CHECK(rc == 0, "the sharded checkpoint reads and verifies (%s)", rc ? err : "ok");
    if (rc) return;
    int split = 0;
    for (int i = 0; i < c.n; i++) split += c.t[i].data == NULL && c.t[i].n_blocks > 1;
    CHECK(split > 0, "%d tensors stay in blocks (not assembled in memory)", split);
    /* any range of a split tensor reads back bitwise */
    int same = 1;
    for (int i = 0; i < tr_model_num_params(m); i++) {
        const tr_param *p = tr_model_param(m, i);
        const tr_ckpt_tensor *t = tr_ckpt_find(&c, p->name);
        float *want = malloc(p->numel * sizeof(float)), *got = malloc(p->numel * sizeof(float));
        tr_model_get_param(m, i, want);
        size_t lo = p->numel / 5, hi = p->numel - p->numel / 7;
        same &= tr_ckpt_read_elems(t, lo, hi, got, err, sizeof(err)) == 0;
        same &= !memcmp(got, want + lo, (hi - lo) * sizeof(float));
        free(want), free(got);
    }
    CHECK(same, "partial reads across blocks give the model's elements");
    tr_recipe r2;
    tr_model *m2 = make_model(gpt_recipe, &r2, 77);
    rc = tr_ckpt_apply(&c, m2, err, sizeof(err));
    CHECK(rc == 0 && same_model(m, m2, 1), "applying the blocks gives parameters and AdamW state bitwise");
    char hf[600];
    snprintf(hf, sizeof(hf), "%s/hf_sharded", root);
    rc = tr_hf_export(&c, &r.model, 0, hf, err, sizeof(err));
    tr_recipe r3;
    tr_model *m3 = make_model(gpt_recipe, &r3, 5);
    if (!rc) rc = tr_hf_import(m3, hf, 0, err, sizeof(err));
    CHECK(rc == 0 && same_model(m, m3, 0), "export of the blocks -> import gives the tensors%s%s",
          rc ? ": " : "", rc ? err : "");
    rc = tr_ckpt_materialize(&c, err, sizeof(err));
    int whole = rc == 0;
    for (int i = 0; i < c.n; i++) whole &= c.t[i].data != NULL;
    CHECK(whole, "materialize gives every tensor whole");
    tr_ckpt_free(&c);
    tr_model_free(m), tr_model_free(m2), tr_model_free(m3);
    tr_recipe_free(&r), tr_recipe_free(&r2), tr_recipe_free(&r3);
}

/* Two writers whose ranges overlap, or leave a gap: rank 0 refuses to publish, naming the
 * tensor and the element (a bug in the ranges, never a checkpoint that loads wrong). */
static void test_bad_ranges(const char *root) {
    tr_recipe r;
    tr_model *m = make_model(gpt_recipe, &r, 11);
    size_t n = tr_model_slab_elements(m), cut = n / 2 + 3;
    for (int overlap = 0; overlap < 2; overlap++) {
        char err[1024] = "", out[512];
        snprintf(out, sizeof(out), "%s/bad_ranges_%d", root, overlap);
        /* rank 1 starts 8 elements before (overlap) or after (gap) rank 0's end */
        size_t r0[2] = {0, cut}, r1[2] = {overlap ? cut - 8 : cut + 8, n};
        tr_ckpt_opts o0 = {.out = out, .keep = 1, .rank = 0, .world = 2, .ranges = r0,
                           .n_ranges = 1, .layout = {.dp = 2, .tp = 1, .pp = 1},
                           .timeout_s = 30};
        tr_ckpt_opts o1 = o0;
        o1.rank = 1, o1.ranges = r1;
        tr_ckpt_writer *w0, *w1;
        if (tr_ckpt_writer_init(&w0, m, &r, &o0, err, sizeof(err)) ||
            tr_ckpt_writer_init(&w1, m, &r, &o1, err, sizeof(err))) {
            CHECK(0, "two writers start: %s", err);
            break;
        }
        tr_ckpt_save(w0, 1, NULL, NULL);
        tr_ckpt_save(w1, 1, NULL, NULL);
        int rc1 = tr_ckpt_wait(w1, err, sizeof(err)), rc0 = tr_ckpt_wait(w0, err, sizeof(err));
        CHECK(rc1 == 0 && rc0 && strstr(err, overlap ? "is in two blocks" : "is in no block") &&
                  strstr(err, "tensor '"),
              "ranges with %s are refused: %s", overlap ? "an overlap" : "a gap", err);
        tr_ckpt_writer_free(w0);
        tr_ckpt_writer_free(w1);
        long *steps;
        CHECK(tr_ckpt_steps(out, &steps) == 0, "and nothing was published");
        free(steps);
    }
    tr_model_free(m);
    tr_recipe_free(&r);
}

/* Tensor-parallel layouts planned in one process (tr_model_plan needs no tp group): the blocks
 * of all tp ranks of a GPT shape (vocabulary 130 padded to 64 per rank: at tp 4 the last rank
 * holds no real row) and a Llama shape (one key/value head, shared by every rank) cover every
 * global element exactly once, and dropping or repeating one block is caught. */
static void test_tp_blocks(void) {
    const char *recipes[2] = {tp_gpt_recipe, tp_llama_recipe};
    for (int c = 0; c < 2; c++)
        for (int tp = 2; tp <= 4; tp += 2) {
            tr_recipe r;
            char err[1024];
            if (tr_recipe_load_string(&r, recipes[c], "tp.lua", ".", NULL, 0, err, sizeof(err))) {
                CHECK(0, "recipe: %s", err);
                return;
            }
            slice_info *sl = NULL;
            int n = 0, cap = 0, rc = 0;
            tr_model *m0 = NULL;
            for (int rank = 0; rank < tp && !rc; rank++) {
                tr_model *m;
                tr_model_opts o = {.B = 1, .T = 16, .tp = tp, .tp_rank = rank, .pad_vocab = 64};
                rc = tr_model_plan(&m, &r.model, TR_DTYPE_F32, &o, err, sizeof(err));
                for (int i = 0; !rc && i < tr_model_num_params(m); i++)
                    for (int kind = -1; kind <= 1; kind++)
                        rc |= ck_add_blocks(&sl, &n, &cap, tr_model_param(m, i), i, i, kind, rank,
                                            0, tr_model_param(m, i)->numel);
                if (rank == 0)
                    m0 = m;
                else
                    tr_model_free(m);
            }
            ck_sort_blocks(sl, n);
            if (!rc) rc = ck_check_cover(m0, sl, n, err, sizeof(err));
            CHECK(rc == 0, "%s at tp %d: %d blocks hold every global element once%s%s",
                  c ? "Llama" : "GPT", tp, n, rc ? ": " : "", rc ? err : "");
            slice_info last = sl[n - 1];
            rc = ck_check_cover(m0, sl, n - 1, err, sizeof(err));
            CHECK(rc && strstr(err, "is in no block"), "a missing block is caught: %s", err);
            sl[n - 1] = sl[n - 2];
            rc = ck_check_cover(m0, sl, n, err, sizeof(err));
            CHECK(rc && strstr(err, "is in two blocks"), "a repeated block is caught: %s", err);
            sl[n - 1] = last;
            free(sl);
            tr_model_free(m0);
            tr_recipe_free(&r);
        }
}

static void export_import(const char *root, const char *name, const char *recipe) {
    tr_recipe r, r2;
    tr_model *m = make_model(recipe, &r, 3), *m2 = make_model(recipe, &r2, 4);
    char err[1024], out[512], hf[512];
    snprintf(out, sizeof(out), "%s/%s_run", root, name);
    snprintf(hf, sizeof(hf), "%s/%s_hf", root, name);
    tr_ckpt_writer *w;
    tr_ckpt_writer_init(&w, m, &r,
                        &(tr_ckpt_opts){.out = out, .keep = 1, .world = 1, .sync = 1, .layout = {.dp = 1, .tp = 1, .pp = 1}},
                        err, sizeof(err));
    tr_ckpt_save(w, 1, NULL, NULL);
    tr_ckpt_writer_free(w);
    tr_ckpt c;
    int rc = tr_ckpt_open_arg(out, &c, 0, stdout, err, sizeof(err));
    if (!rc) rc = tr_hf_export(&c, &r.model, 0, hf, err, sizeof(err));
    if (!rc) rc = tr_hf_import(m2, hf, 0, err, sizeof(err));
    CHECK(rc == 0 && same_model(m, m2, 0), "%s: export -> import gives identical tensors%s%s", name,
          rc ? ": " : "", rc ? err : "");
    if (!rc) tr_ckpt_free(&c);
    tr_model_free(m);
    tr_model_free(m2);
    tr_recipe_free(&r);
    tr_recipe_free(&r2);
}

static void test_refusals(const char *root) {
    tr_recipe r;
    char err[512];
    int rc = tr_recipe_load_string(&r, flat_recipe, "flat.lua", ".", NULL, 0, err, sizeof(err));
    CHECK(rc == 0 && !tr_hf_arch(&r.model, NULL, err, sizeof(err)) && strstr(err, "GPT-2"),
          "a model without a stack is not exportable: %s", err);
    if (!rc) tr_recipe_free(&r);
    /* a Llama folder into a Llama-shaped model of another width */
    char hf[512];
    snprintf(hf, sizeof(hf), "%s/llama_hf", root);
    char *wide = malloc(strlen(llama_recipe) + 8);
    strcpy(wide, llama_recipe);
    memcpy(strstr(wide, "dim = 32"), "dim = 64", 8);
    tr_model *m = make_model(wide, &r, 1);
    rc = tr_hf_import(m, hf, 0, err, sizeof(err));
    CHECK(rc == -1 && strstr(err, "hidden_size is 32 but the recipe's model.dim is 64"),
          "a shape mismatch is refused: %s", err);
    tr_model_free(m);
    tr_recipe_free(&r);
    free(wide);
}

/* A manifest nested 100,000 deep (200 KB) with a right checksum: refused in one line before
 * libyaml's loader builds it (which took minutes over such a text). */
static void test_deep_manifest(const char *root) {
    char dir[512], path[600], err[512];
    snprintf(dir, sizeof(dir), "%s/deep", root);
    snprintf(path, sizeof(path), "%s/manifest.yaml", dir);
    mkdir(dir, 0755);
    size_t n = 100000, len = 2 * n + 2;
    char *text = malloc(len + 32);
    memset(text, '[', n);
    memset(text + n, ']', n);
    text[2 * n] = '\n', text[2 * n + 1] = 0;
    len = 2 * n + 1;
    len += (size_t)snprintf(text + len, 32, "# crc32c: %08x\n", tr_crc32c(0, text, len));
    FILE *f = fopen(path, "wb");
    fwrite(text, 1, len, f);
    fclose(f);
    free(text);
    tr_ckpt c;
    int rc = tr_ckpt_read(&c, dir, 1, err, sizeof(err));
    CHECK(rc != 0 && strstr(err, "manifest.yaml:1: nested deeper than 64 levels"),
          "a manifest nested 100,000 deep is refused: %s", err);
    if (!rc) tr_ckpt_free(&c);
}

int main(void) {
    char root[] = "/tmp/test_checkpoint_XXXXXX";
    if (!mkdtemp(root)) return 1;
    test_hashes();
    test_json();
    test_round_trip(root);
    test_two_writers(root);
    test_bad_ranges(root);
    test_tp_blocks();
    export_import(root, "gpt_nobias", gpt_nobias_recipe);
    export_import(root, "llama", llama_recipe);
    test_refusals(root);
    test_deep_manifest(root);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    if (system(cmd)) printf("(could not remove %s)\n", root);
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
