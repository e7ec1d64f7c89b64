/* Tests for the recipe DSL (dsl/recipe.c): fields and defaults of GPT- and Llama-like recipes,
 * --set overrides, the write_lua round trip, the sandbox, and the exact one-line errors with
 * their line numbers. Plain C: prints ok/FAIL per check, exits non-zero on any failure. */
#define _XOPEN_SOURCE 700 /* realpath */
#include "dsl/recipe.h"

#include <glob.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"



static char err[4096];

static int load(tr_recipe *r, const char *text, const char *chunk, const tr_knob_set *sets,
                int n_sets)
{
    int rc = tr_recipe_load_string(r, text, chunk, ".", sets, n_sets, err, sizeof err);
    if (rc)
        printf("     (load of %s failed: %s)\n", chunk, err);
    return rc;
}

/* Loading must fail with exactly this message. */
static void expect_error(const char *what, const char *text, const char *chunk,
                         const tr_knob_set *sets, int n_sets, const char *expected)
{
    tr_recipe r;
    int rc = tr_recipe_load_string(&r, text, chunk, ".", sets, n_sets, err, sizeof err);
    if (!check(rc != 0 && strcmp(err, expected) == 0, "error: %s", what))
        printf("     expected: %s\n     got (rc %d): %s\n", expected, rc, err);
    tr_recipe_free(&r);
}

static int feq(float a, float b)
{
    return a == b;
}

static const char *gpt_text =
    "local k = knobs { layers = 4, width = 256, heads = 4, seq = 128, lr = 2e-3, steps = 1500 }\n"
    "\n"
    "model {\n"
    "  vocab = 256, dim = k.width, seq_len = k.seq,\n"
    "  embedding {},\n"
    "  positions {},                            -- learned absolute positions\n"
    "  stack { n = k.layers,\n"
    "    residual { layernorm {}, attention { heads = k.heads } },\n"
    "    residual { layernorm {}, mlp { hidden = 4 * k.width, activation = \"gelu\" } },\n"
    "  },\n"
    "  layernorm {},\n"
    "  lm_head { tied = true },\n"
    "}\n"
    "data { text = \"data/corpora/tinyshakespeare.txt\", tokenizer = \"byte\", val_fraction = 0.1 }\n"
    "optimizer { lr = k.lr, betas = { 0.9, 0.99 }, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0 }\n"
    "schedule { warmup = 100, decay = \"cosine\", min_lr = 0.1 * k.lr }\n"
    "train { batch_tokens = 8192, micro_batch = \"auto\", steps = k.steps, eval_every = 250,\n"
    "        eval_tokens = 32768, seed = 1337, out = \"runs/shakespeare_char\", sample_tokens = 300 }\n"
    "parallel \"auto\"\n";

static const char *llama_text =
    "local k = knobs { tie = false, name = \"llama\", layers = 2 }\n"
    "model { vocab = 256, dim = 64, seq_len = 32,\n"
    "  embedding {},\n"
    "  rope { theta = 500000 },\n"
    "  stack { n = k.layers,\n"
    "    residual { rmsnorm {}, attention { heads = 8, kv_heads = 2, bias = false } },\n"
    "    residual { rmsnorm { eps = 1e-6 }, mlp { hidden = 172, activation = \"swiglu\", bias = false } },\n"
    "  },\n"
    "  rmsnorm {},\n"
    "  lm_head { tied = k.tie },\n"
    "}\n"
    "data { text = \"/nonexistent/corpus.txt\" }\n"
    "train { batch_tokens = 4096, steps = 100, out = \"runs/\" .. k.name .. \"-\" .. k.layers }\n"
    "parallel { dp = 2, zero = 1 }\n";

static void test_gpt(void)
{
    tr_recipe r;
    if (!check(tr_recipe_load_string(&r, gpt_text, "gpt.lua", "..", NULL, 0, err, sizeof err) == 0,
               "gpt: loads (%s)", err))
        return;
    const tr_model_desc *m = &r.model;
    check(m->vocab == 256 && m->dim == 256 && m->seq_len == 128, "gpt: vocab, dim, seq_len");
    const tr_node *root = &m->root;
    check(root->kind == TR_NODE_SEQUENCE && root->n_children == 5 && root->line == 3,
          "gpt: root is a sequence of 5 at line 3");
    if (root->n_children == 5) {
        const tr_node *c = root->children;
        check(c[0].kind == TR_NODE_EMBEDDING && c[1].kind == TR_NODE_POSITIONS &&
                  c[2].kind == TR_NODE_STACK && c[3].kind == TR_NODE_LAYERNORM &&
                  c[4].kind == TR_NODE_LM_HEAD,
              "gpt: top-level kinds");
    }
    if (root->n_children == 5) {
        const tr_node *st = &root->children[2];
        check(st->repeat == 4 && st->n_children == 2 && st->line == 7, "gpt: stack n=4, line 7");
        if (st->n_children == 2) {
            const tr_node *a = &st->children[0], *b = &st->children[1];
            check(a->kind == TR_NODE_RESIDUAL && a->n_children == 2 && a->line == 8,
                  "gpt: residual 1");
            check(b->kind == TR_NODE_RESIDUAL && b->n_children == 2 && b->line == 9,
                  "gpt: residual 2");
            if (a->n_children == 2 && b->n_children == 2) {
                const tr_node *ln = &a->children[0], *at = &a->children[1], *mlp = &b->children[1];
                check(ln->kind == TR_NODE_LAYERNORM && feq(ln->eps, 1e-5f) && ln->bias == 1,
                      "gpt: layernorm defaults eps=1e-5 bias=true");
                check(at->kind == TR_NODE_ATTENTION && at->heads == 4 && at->kv_heads == 4 &&
                          at->bias == 1 && at->rope_theta == 0 && at->line == 8,
                      "gpt: attention heads=4 kv_heads=4 bias rope_theta=0");
                check(mlp->kind == TR_NODE_MLP && mlp->hidden == 1024 &&
                          mlp->activation == TR_ACT_GELU && mlp->bias == 1,
                      "gpt: mlp hidden=1024 gelu bias");
            }
        }
        check(root->children[4].tied == 1, "gpt: lm_head tied");
    }
    check(strcmp(r.data.text, "../data/corpora/tinyshakespeare.txt") == 0,
          "gpt: data.text resolved against basedir (%s)", r.data.text);
    check(r.data.tokenizer == TR_TOKENIZER_BYTE && feq(r.data.val_fraction, 0.1f), "gpt: data");
    check(feq(r.optim.lr, 2e-3f) && feq(r.optim.beta1, 0.9f) && feq(r.optim.beta2, 0.99f) &&
              feq(r.optim.eps, 1e-8f) && feq(r.optim.weight_decay, 0.1f) &&
              feq(r.optim.grad_clip, 1.0f),
          "gpt: optimizer");
    check(r.schedule.warmup == 100 && r.schedule.decay == TR_DECAY_COSINE &&
              feq(r.schedule.min_lr, (float)(0.1 * 2e-3)) && feq(r.schedule.decay_frac, 0.2f),
          "gpt: schedule");
    const tr_train_desc *t = &r.train;
    check(t->batch_tokens == 8192 && t->micro_batch == 0 && t->steps == 1500 &&
              t->eval_every == 250 && t->eval_tokens == 32768 && t->seed == 1337 &&
              strcmp(t->out, "runs/shakespeare_char") == 0 && t->sample_tokens == 300 &&
              t->log_every == 10,
          "gpt: train");
    check(r.parallel.is_auto == 1, "gpt: parallel auto");
    check(strcmp(r.path, "gpt.lua") == 0, "gpt: path");
    const char *names[] = {"heads", "layers", "lr", "seq", "steps", "width"};
    int knobs_ok = r.n_knobs == 6;
    for (int i = 0; knobs_ok && i < 6; i++)
        knobs_ok = strcmp(r.knobs[i].name, names[i]) == 0 &&
                   r.knobs[i].type == TR_KNOB_NUMBER && !r.knobs[i].overridden;
    check(knobs_ok && r.knobs[2].number == 2e-3 && r.knobs[5].number == 256,
          "gpt: knobs recorded, sorted");
    tr_recipe_free(&r);
}

static void test_llama(void)
{
    tr_recipe r;
    if (!check(load(&r, llama_text, "llama.lua", NULL, 0) == 0, "llama: loads"))
        return;
    const tr_node *root = &r.model.root;
    check(root->n_children == 5, "llama: 5 top-level layers");
    if (root->n_children == 5) {
        const tr_node *rope = &root->children[1], *st = &root->children[2];
        check(rope->kind == TR_NODE_ROPE && feq(rope->rope_theta, 500000.0f), "llama: rope theta");
        const tr_node *at = &st->children[0].children[1];
        const tr_node *norm = &st->children[1].children[0], *mlp = &st->children[1].children[1];
        check(at->kind == TR_NODE_ATTENTION && at->heads == 8 && at->kv_heads == 2 &&
                  at->bias == 0 && feq(at->rope_theta, 500000.0f),
              "llama: attention gqa, no bias, rope_theta from the rope");
        check(norm->kind == TR_NODE_RMSNORM && feq(norm->eps, 1e-6f), "llama: rmsnorm eps");
        check(st->children[0].children[0].kind == TR_NODE_RMSNORM &&
                  feq(st->children[0].children[0].eps, 1e-5f),
              "llama: rmsnorm default eps");
        check(mlp->hidden == 172 && mlp->activation == TR_ACT_SWIGLU && mlp->bias == 0,
              "llama: mlp swiglu");
        check(root->children[4].kind == TR_NODE_LM_HEAD && root->children[4].tied == 0,
              "llama: lm_head untied");
    }
    check(feq(r.optim.lr, 3e-4f) && feq(r.optim.beta1, 0.9f) && feq(r.optim.beta2, 0.95f) &&
              feq(r.optim.eps, 1e-8f) && feq(r.optim.weight_decay, 0.1f) &&
              feq(r.optim.grad_clip, 1.0f),
          "llama: optimizer defaults");
    check(r.schedule.warmup == 0 && r.schedule.decay == TR_DECAY_COSINE &&
              feq(r.schedule.min_lr, 0.1f * 3e-4f) && feq(r.schedule.decay_frac, 0.2f),
          "llama: schedule defaults, min_lr = 0.1 * lr");
    const tr_train_desc *t = &r.train;
    check(t->micro_batch == 0 && t->eval_every == 0 && t->eval_tokens == 0 && t->seed == 1337 &&
              t->sample_tokens == 200 && t->log_every == 10 && t->checkpoint_every == 0 &&
              t->keep_checkpoints == 3 && r.init_hf[0] == 0 &&
              t->precision == TR_PRECISION_BF16 && t->recompute == -1 && t->peak_tflops == 0,
          "llama: train defaults (no checkpoints, keep 3, no init, bf16, recompute auto)");
    check(strcmp(t->out, "runs/llama-2") == 0, "llama: string and integer knobs in out (%s)",
          t->out);
    check(strcmp(r.data.text, "/nonexistent/corpus.txt") == 0 && feq(r.data.val_fraction, 0.1f),
          "llama: absolute data path kept, val_fraction default");
    check(!r.parallel.is_auto && r.parallel.dp == 2 && r.parallel.tp == -1 &&
              r.parallel.pp == -1 && r.parallel.zero == 1,
          "llama: parallel table");
    tr_recipe_free(&r);

    /* defaults that only show when left out */
    const char *minimal = "model { vocab = 10, dim = 8, seq_len = 4, embedding {}, rope {},\n"
                          "  residual { attention { heads = 2 }, mlp {} }, lm_head {} }\n"
                          "data { text = \"c.txt\" }\ntrain { batch_tokens = 8, steps = 1 }\n";
    if (check(tr_recipe_load_string(&r, minimal, "dir/min.lua", "dir", NULL, 0, err, sizeof err) == 0,
              "minimal: loads (%s)", err)) {
        const tr_node *res = &r.model.root.children[2];
        check(feq(r.model.root.children[1].rope_theta, 10000.0f), "minimal: rope theta default");
        check(res->children[1].hidden == 32 && res->children[1].activation == TR_ACT_GELU,
              "minimal: mlp hidden default 4 * dim");
        check(strcmp(r.train.out, "runs/min") == 0, "minimal: default out runs/<stem> (%s)",
              r.train.out);
        check(strcmp(r.data.text, "dir/c.txt") == 0, "minimal: data relative to basedir");
        check(r.parallel.is_auto && r.parallel.zero == -1 && r.n_knobs == 0,
              "minimal: parallel auto (-1 everywhere), no knobs");
        tr_recipe_free(&r);
    }
}

#define TRAIN_FIELDS                                                                              \
    "batch_tokens, checkpoint_every, eval_every, eval_tokens, guard, keep_checkpoints, "          \
    "log_every, micro_batch, out, peak_tflops, precision, recompute, sample_tokens, seed, steps"

static const char *plain_text = /* no knobs */
    "model { vocab = 10, dim = 8, seq_len = 4, embedding {}, lm_head {} }\n"
    "data { text = \"c\" } train { batch_tokens = 8, steps = 1 }\n";

/* --set reaches train { }'s fields: as train.NAME, or as NAME where no knob is so named. */
static void test_train_sets(void)
{
    tr_knob_set s[4];
    tr_recipe r;
    tr_knob_set_parse(&s[0], "checkpoint_every=50", err, sizeof err);
    tr_knob_set_parse(&s[1], "train.steps=7", err, sizeof err);
    tr_knob_set_parse(&s[2], "train.guard=false", err, sizeof err);
    tr_knob_set_parse(&s[3], "precision=fp32", err, sizeof err);
    if (check(load(&r, gpt_text, "gpt.lua", s, 4) == 0, "train set: fields set by --set load")) {
        check(r.train.checkpoint_every == 50, "train set: checkpoint_every=50 (no such knob)");
        check(r.train.steps == 7 && !r.knobs[4].overridden,
              "train set: train.steps=7 sets the field, not the knob 'steps' (%d)", r.train.steps);
        check(!r.train.guard.on && r.train.precision == TR_PRECISION_FP32,
              "train set: a boolean and an enumerated field");
        check(r.train.eval_every == 250 && r.train.seed == 1337, "train set: the others stay");
        tr_recipe_free(&r);
    }
    tr_knob_set_parse(&s[0], "steps=9", err, sizeof err);
    if (check(load(&r, gpt_text, "gpt.lua", s, 1) == 0, "train set: a knob's name loads")) {
        check(r.train.steps == 9 && r.knobs[4].overridden, "train set: steps=9 is the knob's");
        tr_recipe_free(&r);
    }
    tr_knob_set_parse(&s[0], "checkpoint_every=5", err, sizeof err);
    tr_knob_set_parse(&s[1], "train.out=runs/x", err, sizeof err);
    if (check(load(&r, plain_text, "plain.lua", s, 2) == 0, "train set: a recipe without knobs")) {
        check(r.train.checkpoint_every == 5 && strcmp(r.train.out, "runs/x") == 0,
              "train set: checkpoint_every and out without knobs");
        tr_recipe_free(&r);
    }
    tr_knob_set_parse(&s[0], "checkpoint_every=often", err, sizeof err);
    expect_error("train set: not an integer", gpt_text, "gpt.lua", s, 1,
                 "gpt.lua:17: --set checkpoint_every=often: field 'checkpoint_every' must be an "
                 "integer, got string");
    tr_knob_set_parse(&s[0], "train.eval_every=-1", err, sizeof err);
    expect_error("train set: out of range", gpt_text, "gpt.lua", s, 1,
                 "gpt.lua:17: --set train.eval_every=-1: field 'eval_every' must be >= 0, got -1");
    tr_knob_set_parse(&s[0], "train.widht=3", err, sizeof err);
    expect_error("train set: unknown field", gpt_text, "gpt.lua", s, 1,
                 "gpt.lua:17: --set train.widht: train has no field 'widht' (fields: " TRAIN_FIELDS
                 ")");
    tr_knob_set_parse(&s[0], "steps=3", err, sizeof err);
    expect_error("train set: a knob declared after train took its name",
                 "model { vocab = 10, dim = 8, seq_len = 4, embedding {}, lm_head {} }\n"
                 "data { text = \"c\" } train { batch_tokens = 8, steps = 1 }\n"
                 "local k = knobs { steps = 2 }\n",
                 "late.lua", s, 1,
                 "late.lua:3: --set steps: both a knob and a field of train { } (line 2), which "
                 "took it first; write --set train.steps for the field, or declare knobs first");
}

static void test_sets(void)
{
    tr_knob_set s[4];
    tr_recipe r;
    check(tr_knob_set_parse(&s[0], "layers=6", err, sizeof err) == 0 &&
              strcmp(s[0].name, "layers") == 0 && strcmp(s[0].value, "6") == 0,
          "set: parse name=value");
    check(tr_knob_set_parse(&s[3], "noequals", err, sizeof err) != 0 && strstr(err, "name=value"),
          "set: parse without '=' fails (%s)", err);
    check(tr_knob_set_parse(&s[3], "=3", err, sizeof err) != 0, "set: parse empty name fails");
    tr_knob_set_parse(&s[1], "lr=1e-3", err, sizeof err);
    if (check(load(&r, gpt_text, "gpt.lua", s, 2) == 0, "set: number overrides load")) {
        check(r.model.root.children[2].repeat == 6, "set: layers=6 reaches stack n");
        check(feq(r.optim.lr, 1e-3f) && feq(r.schedule.min_lr, (float)(0.1 * 1e-3)),
              "set: lr=1e-3 reaches optimizer and schedule");
        check(r.knobs[1].overridden && r.knobs[1].number == 6 && r.knobs[2].overridden &&
                  !r.knobs[0].overridden,
              "set: knobs record overridden");
        tr_recipe_free(&r);
    }
    tr_knob_set_parse(&s[0], "tie=true", err, sizeof err);
    tr_knob_set_parse(&s[1], "name=big", err, sizeof err);
    tr_knob_set_parse(&s[2], "layers=12", err, sizeof err);
    if (check(load(&r, llama_text, "llama.lua", s, 3) == 0, "set: bool and string overrides load")) {
        check(r.model.root.children[4].tied == 1, "set: tie=true reaches lm_head");
        check(strcmp(r.train.out, "runs/big-12") == 0, "set: name=big and layers=12 (%s)",
              r.train.out);
        tr_recipe_free(&r);
    }
    tr_knob_set_parse(&s[0], "lr=abc", err, sizeof err);
    expect_error("set: bad number", gpt_text, "gpt.lua", s, 1,
                 "gpt.lua:1: --set lr=abc: 'abc' is not a number (knob 'lr' defaults to 0.002)");
    tr_knob_set_parse(&s[0], "layers=12abc", err, sizeof err);
    expect_error("set: number must parse completely", gpt_text, "gpt.lua", s, 1,
                 "gpt.lua:1: --set layers=12abc: '12abc' is not a number (knob 'layers' defaults to 4)");
    tr_knob_set_parse(&s[0], "tie=yes", err, sizeof err);
    expect_error("set: bad boolean", llama_text, "llama.lua", s, 1,
                 "llama.lua:1: --set tie=yes: 'yes' is not a boolean; use true or false (knob 'tie' defaults to false)");
    tr_knob_set_parse(&s[0], "widht=3", err, sizeof err);
    expect_error("set: unknown knob", gpt_text, "gpt.lua", s, 1,
                 "gpt.lua:1: --set widht: unknown knob (knobs: heads, layers, lr, seq, steps, width) "
                 "or train field (" TRAIN_FIELDS ")");
    expect_error("set: recipe without knobs", plain_text, "plain.lua", s, 1,
                 "plain.lua: --set widht: the recipe declares no knobs, and train has no field "
                 "'widht' (fields: " TRAIN_FIELDS ")");
    test_train_sets();
}

/* Every field of two node trees, recursively. */
static int nodes_equal(const tr_node *a, const tr_node *b)
{
    if (a->kind != b->kind || a->repeat != b->repeat || a->n_children != b->n_children ||
        a->heads != b->heads || a->kv_heads != b->kv_heads || a->hidden != b->hidden ||
        a->activation != b->activation || a->bias != b->bias || !feq(a->eps, b->eps) ||
        !feq(a->rope_theta, b->rope_theta) || a->tied != b->tied)
        return 0;
    for (int i = 0; i < a->n_children; i++)
        if (!nodes_equal(&a->children[i], &b->children[i]))
            return 0;
    return 1;
}

/* Everything write_lua promises to keep (knobs live in its comment header, path is new). */
static int recipes_equal(const tr_recipe *a, const tr_recipe *b, int compare_text)
{
    return a->model.vocab == b->model.vocab && a->model.dim == b->model.dim &&
           a->model.seq_len == b->model.seq_len && nodes_equal(&a->model.root, &b->model.root) &&
           (!compare_text || strcmp(a->data.text, b->data.text) == 0) &&
           a->data.tokenizer == b->data.tokenizer && memcmp(&a->optim, &b->optim, sizeof a->optim) == 0 &&
           memcmp(&a->schedule, &b->schedule, sizeof a->schedule) == 0 &&
           memcmp(&a->train, &b->train, sizeof a->train) == 0 &&
           memcmp(&a->parallel, &b->parallel, sizeof a->parallel) == 0 &&
           feq(a->data.val_fraction, b->data.val_fraction);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = calloc(1, 1 << 20);
    if (buf)
        fread(buf, 1, (1 << 20) - 1, f);
    fclose(f);
    return buf;
}

/* The text after the leading comment lines (the header names the source file and knobs). */
static const char *body(const char *text)
{
    while (strncmp(text, "--", 2) == 0) {
        const char *nl = strchr(text, '\n');
        if (!nl)
            return "";
        text = nl + 1;
    }
    return text;
}

static int write_file(const char *path, const tr_recipe *r)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    int rc = tr_recipe_write_lua(r, f);
    return fclose(f) || rc;
}

static void round_trip(const char *name, const char *text, const char *basedir,
                       const tr_knob_set *sets, int n_sets)
{
    char dir[] = "/tmp/test_recipe_XXXXXX", p1[64], p2[64];
    if (!check(mkdtemp(dir) != NULL, "%s: make a temporary folder", name))
        return;
    snprintf(p1, sizeof p1, "%s/first.lua", dir);
    snprintf(p2, sizeof p2, "%s/second.lua", dir);
    tr_recipe a, b, c;
    memset(&b, 0, sizeof b);
    memset(&c, 0, sizeof c);
    char *t1 = NULL, *t2 = NULL;
    if (tr_recipe_load_string(&a, text, name, basedir, sets, n_sets, err, sizeof err) != 0) {
        check(0, "%s: loads (%s)", name, err);
        goto out;
    }
    check(write_file(p1, &a) == 0, "%s: write_lua", name);
    if (!check(tr_recipe_load(&b, p1, NULL, 0, err, sizeof err) == 0, "%s: written recipe loads (%s)",
               name, err))
        goto out;
    check(write_file(p2, &b) == 0, "%s: write_lua again", name);
    t1 = slurp(p1);
    t2 = slurp(p2);
    check(t1 && t2 && strcmp(body(t1), body(t2)) == 0, "%s: the two written texts are identical",
          name);
    check(t1 && strstr(t1, "stack {") != NULL, "%s: stack kept as a stack", name);
    char *real = realpath(a.data.text, NULL);
    check(b.data.text[0] == '/' && (!real || strcmp(real, b.data.text) == 0),
          "%s: data.text written as an absolute path", name);
    free(real);
    check(recipes_equal(&a, &b, 0), "%s: reloaded structs equal the original", name);
    if (check(tr_recipe_load(&c, p2, NULL, 0, err, sizeof err) == 0, "%s: second write loads", name))
        check(recipes_equal(&b, &c, 1), "%s: second reload equal, data.text too", name);
    if (n_sets > 0)
        check(t1 && strstr(t1, "(--set)") != NULL, "%s: header marks overridden knobs", name);
out:
    free(t1);
    free(t2);
    tr_recipe_free(&a);
    tr_recipe_free(&b);
    tr_recipe_free(&c);
    unlink(p1);
    unlink(p2);
    rmdir(dir);
}

static void test_round_trip(void)
{
    tr_knob_set s[1];
    tr_knob_set_parse(&s[0], "lr=1e-3", err, sizeof err);
    round_trip("rt-gpt", gpt_text, "..", s, 1);
    round_trip("rt-llama", llama_text, ".", NULL, 0);
    /* odd floats and every optional value changed from its default */
    round_trip("rt-odd",
               "model { vocab = 300, dim = 12, seq_len = 6, embedding {}, positions {},\n"
               "  stack { n = 3, stack { n = 2, residual { layernorm { eps = 3.3e-7, bias = false },\n"
               "    attention { heads = 3, kv_heads = 1, bias = false } } },\n"
               "    residual { mlp { hidden = 7, activation = \"swiglu\", bias = false } } },\n"
               "  rmsnorm { eps = 0.123456789 }, lm_head { tied = false } }\n"
               "data { text = \"weird \\\"name\\\"\\n.txt\", val_fraction = 0.37 }\n"
               "optimizer { lr = 0.1234567, betas = { 0, 0.999999 }, eps = 1e-30, weight_decay = 0,\n"
               "  grad_clip = 0 }\n"
               "schedule { warmup = 7, decay = \"wsd\", min_lr = 0, decay_frac = 1 }\n"
               "train { batch_tokens = 36, micro_batch = 3, steps = 2, eval_every = 1, eval_tokens = 5,\n"
               "  seed = 9007199254740993, out = \"x/y\", sample_tokens = 0, log_every = 1,\n"
               "  checkpoint_every = 4, keep_checkpoints = 5, precision = \"fp32\",\n"
               "  recompute = \"selective\", peak_tflops = 123.5 }\n"
               "parallel { dp = 1, tp = 2, pp = \"auto\", zero = 0 }\n",
               "/tmp", NULL, 0);
}

/* parallel { dp, tp, pp, zero, sequence_parallel, bucket_kb }: every field, each also "auto";
 * written back so that the written recipe loads to the same structs. */
static void test_parallel_fields(void)
{
    static const char *head =
        "model { vocab = 10, dim = 8, seq_len = 4, embedding {}, stack { n = 2, mlp {} }, lm_head {} }\n"
        "data { text = \"c\" }\ntrain { batch_tokens = 8, steps = 1 }\n";
    char text[1024];
    tr_recipe r;
    snprintf(text, sizeof text, "%s\nparallel { dp = 2, tp = 4, pp = 1, zero = 3,\n"
             "  sequence_parallel = true, bucket_kb = 64 }\n", head);
    if (check(load(&r, text, "p.lua", NULL, 0) == 0, "parallel: every field loads")) {
        const tr_parallel_desc *p = &r.parallel;
        check(!p->is_auto && p->dp == 2 && p->tp == 4 && p->pp == 1 && p->zero == 3 &&
                  p->sequence_parallel == 1 && p->bucket_kb == 64,
              "parallel: dp 2, tp 4, pp 1, zero 3, sequence parallel, bucket 64 KiB");
        check(r.train_line == 3 && r.parallel_line == 5, "parallel: lines of train (%d) and "
              "parallel (%d) recorded", r.train_line, r.parallel_line);
        tr_recipe_free(&r);
    }
    snprintf(text, sizeof text, "%sparallel { sequence_parallel = false, zero = 0 }\n", head);
    if (check(load(&r, text, "p.lua", NULL, 0) == 0, "parallel: some fields loads")) {
        const tr_parallel_desc *p = &r.parallel;
        check(!p->is_auto && p->dp == -1 && p->tp == -1 && p->pp == -1 && p->zero == 0 &&
                  p->sequence_parallel == 0 && p->bucket_kb == 0,
              "parallel: sequence_parallel = false and zero = 0 are choices, the rest auto");
        tr_recipe_free(&r);
    }
    snprintf(text, sizeof text, "%sparallel { dp = 'auto', tp = 'auto', pp = 'auto', zero = "
             "'auto', sequence_parallel = 'auto', bucket_kb = 'auto' }\n", head);
    if (check(load(&r, text, "p.lua", NULL, 0) == 0, "parallel: every field \"auto\" loads")) {
        const tr_parallel_desc *p = &r.parallel;
        check(p->is_auto && p->dp == -1 && p->tp == -1 && p->pp == -1 && p->zero == -1 &&
                  p->sequence_parallel == -1 && p->bucket_kb == 0,
              "parallel: every field \"auto\" is parallel \"auto\"");
        tr_recipe_free(&r);
    }
    snprintf(text, sizeof text, "%s", head);
    if (check(load(&r, text, "p.lua", NULL, 0) == 0, "parallel: absent loads")) {
        check(r.parallel.is_auto && r.parallel.sequence_parallel == -1 && r.parallel_line == 0,
              "parallel: absent is \"auto\", no line");
        tr_recipe_free(&r);
    }
    struct {
        const char *what, *fields, *expected;
    } cases[] = {
        {"unknown field", "dpp = 2",
         "p.lua:4: parallel: unknown field 'dpp' (fields: bucket_kb, dp, dp_shares, microbatches, pp, "
         "private_gradients, schedule, sequence_parallel, stages, tp, virtual_stages, zero)"},
        {"schedule unknown", "schedule = 'fast'",
         "p.lua:4: parallel: field 'schedule' must be one of gpipe, 1f1b, interleaved, zb-h1, "
         "zb-v or \"auto\", got 'fast'"},
        {"schedule a number", "schedule = 1",
         "p.lua:4: parallel: field 'schedule' must be one of gpipe, 1f1b, interleaved, zb-h1, "
         "zb-v or \"auto\", got number"},
        {"microbatches 0", "microbatches = 0",
         "p.lua:4: parallel: field 'microbatches' must be >= 1, got 0"},
        {"virtual_stages 0", "virtual_stages = 0",
         "p.lua:4: parallel: field 'virtual_stages' must be >= 1, got 0"},
        {"stages a number", "stages = 6",
         "p.lua:4: parallel: field 'stages' must be a list of integers or \"auto\", got number"},
        {"stages a word", "stages = 'even'",
         "p.lua:4: parallel: field 'stages' must be a list of integers or \"auto\", got 'even'"},
        {"stages empty", "stages = {}",
         "p.lua:4: parallel: field 'stages' must not be empty (or \"auto\")"},
        {"stages with a gap", "stages = { 0, nil, 3 }",
         "p.lua:4: parallel: field 'stages' must be a list of integers, as in stages = { 0, 6, 12, "
         "18 }, without named fields or gaps"},
        {"stages with a name", "stages = { 0, x = 3 }",
         "p.lua:4: parallel: field 'stages' must be a list of integers, as in stages = { 0, 6, 12, "
         "18 }, without named fields or gaps"},
        {"stages a fraction", "stages = { 0, 1.5 }",
         "p.lua:4: parallel: field 'stages[2]' must be an integer, got 1.5"},
        {"stages negative", "stages = { -1, 2 }",
         "p.lua:4: parallel: field 'stages[1]' must be >= 0, got -1"},
        {"stages too long", "stages = (function() local t = {} for i = 1, 257 do t[i] = i - 1 end "
         "return t end)()",
         "p.lua:4: parallel: field 'stages' has 257 entries; at most 256 are supported"},
        {"sequence_parallel a number", "sequence_parallel = 1",
         "p.lua:4: parallel: field 'sequence_parallel' must be true, false or \"auto\", got number"},
        {"sequence_parallel a word", "sequence_parallel = 'yes'",
         "p.lua:4: parallel: field 'sequence_parallel' must be true, false or \"auto\", got 'yes'"},
        {"tp 0", "tp = 0", "p.lua:4: parallel: field 'tp' must be >= 1, got 0"},
        {"dp a fraction", "dp = 1.5", "p.lua:4: parallel: field 'dp' must be an integer, got 1.5"},
        {"bucket_kb 0", "bucket_kb = 0", "p.lua:4: parallel: field 'bucket_kb' must be >= 1, got 0"},
        {"bucket_kb a word", "bucket_kb = 'big'",
         "p.lua:4: parallel: field 'bucket_kb' must be an integer or \"auto\", got 'big'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(text, sizeof text, "%sparallel { %s }\n", head, cases[i].fields);
        expect_error(cases[i].what, text, "p.lua", NULL, 0, cases[i].expected);
    }
    snprintf(text, sizeof text, "%sparallel { dp = 2, tp = 4, zero = 3, sequence_parallel = true,\n"
             "  bucket_kb = 64 }\n", head);
    round_trip("rt-parallel", text, ".", NULL, 0);
    snprintf(text, sizeof text, "%sparallel { sequence_parallel = false }\n", head);
    round_trip("rt-parallel-sp-off", text, ".", NULL, 0);
    snprintf(text, sizeof text, "%sparallel { pp = 2, schedule = 'interleaved', microbatches = 4,\n"
             "  virtual_stages = 2, stages = { 0, 3, 5, 9 } }\n", head);
    if (check(load(&r, text, "p.lua", NULL, 0) == 0, "parallel: pipeline fields load")) {
        const tr_parallel_desc *p = &r.parallel;
        check(!p->is_auto && p->pp == 2 && p->schedule == 2 && p->microbatches == 4 &&
                  p->virtual_stages == 2 && p->n_stages == 4 && p->stages[0] == 0 &&
                  p->stages[1] == 3 && p->stages[2] == 5 && p->stages[3] == 9,
              "parallel: pp 2, interleaved, 4 micro-batches, 2 virtual stages, stages 0 3 5 9");
        tr_recipe_free(&r);
    }
    round_trip("rt-parallel-pipeline", text, ".", NULL, 0);
    snprintf(text, sizeof text, "%sparallel { schedule = 'auto', microbatches = 'auto',\n"
             "  virtual_stages = 'auto', stages = 'auto' }\n", head);
    if (check(load(&r, text, "p.lua", NULL, 0) == 0, "parallel: pipeline fields \"auto\" load")) {
        const tr_parallel_desc *p = &r.parallel;
        check(p->is_auto && p->schedule == -1 && p->microbatches == 0 && p->virtual_stages == 0 &&
                  p->n_stages == 0,
              "parallel: pipeline fields \"auto\" are parallel \"auto\"");
        tr_recipe_free(&r);
    }
    snprintf(text, sizeof text, "%sparallel { schedule = 'zb-h1' }\n", head);
    round_trip("rt-parallel-zbh1", text, ".", NULL, 0);
}

/* checkpoint_every, keep_checkpoints and `init = hf "DIR"` load, write and load again. */
static void test_checkpoint_fields(void)
{
    const char *text = "model { vocab = 10, dim = 8, seq_len = 4, embedding {}, lm_head {} }\n"
                       "data { text = \"c\" }\n"
                       "train { batch_tokens = 8, steps = 1, checkpoint_every = 4, keep_checkpoints = 5 }\n"
                       "init = hf \"models/gpt2\"\n";
    tr_recipe a, b;
    if (!check(tr_recipe_load_string(&a, text, "ck.lua", "/base", NULL, 0, err, sizeof err) == 0,
               "checkpoint fields load (%s)", err))
        return;
    check(a.train.checkpoint_every == 4 && a.train.keep_checkpoints == 5 &&
              strcmp(a.init_hf, "/base/models/gpt2") == 0,
          "checkpoint_every, keep_checkpoints, init = hf (resolved against the recipe's folder: %s)",
          a.init_hf);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    tr_recipe_write_lua(&a, f);
    fclose(f);
    check(strstr(buf, "checkpoint_every = 4, keep_checkpoints = 5") != NULL &&
              strstr(buf, "init = hf \"/base/models/gpt2\"") != NULL,
          "write_lua writes the checkpoint settings and init");
    if (check(tr_recipe_load_string(&b, buf, "ck2.lua", ".", NULL, 0, err, sizeof err) == 0,
              "the written recipe loads (%s)", err)) {
        check(b.train.checkpoint_every == 4 && b.train.keep_checkpoints == 5 &&
                  strcmp(b.init_hf, a.init_hf) == 0,
              "checkpoint settings and init survive the round trip");
        tr_recipe_free(&b);
    }
    free(buf);
    tr_recipe_free(&a);
    expect_error("checkpoint: hf needs a string",
                 "model { vocab = 10, dim = 8, seq_len = 4, embedding {}, lm_head {} }\n"
                 "data { text = \"c\" } train { batch_tokens = 8, steps = 1 }\ninit = hf(3)\n",
                 "hf.lua", NULL, 0,
                 "hf.lua:3: hf: expects a directory path, as in init = hf \"path/to/model\"");
}

static void test_sandbox(void)
{
    tr_recipe r;
    const char *tail = "model { vocab = 10, dim = 8, seq_len = 4, embedding {}, lm_head {} }\n"
                       "data { text = \"c\" } train { batch_tokens = 8, steps = 1 }\n";
    char text[4096];
    snprintf(text, sizeof text,
             "assert(io == nil and os == nil and require == nil and package == nil)\n"
             "assert(debug == nil and dofile == nil and loadfile == nil and string.dump == nil)\n"
             "assert(coroutine == nil and math and table and string and utf8)\n"
             "local f, e = load(\"\\27LuaT\\0\\25\\147\\r\\n\\26\\n\")\n"
             "assert(f == nil and e:find('binary'), 'bytecode must be refused')\n"
             "assert(load(\"\\27Lua\", \"x\", \"b\") == nil, 'mode b is ignored')\n"
             "assert(load('return 1 + 1')() == 2)\n"
             "local k = knobs { a = 1, b = 'x' }\n"
             "local n = 0 for name, v in pairs(k) do n = n + 1 end\n"
             "assert(n == 2 and getmetatable(k) == 'knobs')\n%s",
             tail);
    if (check(load(&r, text, "sandbox.lua", NULL, 0) == 0,
              "sandbox: io/os/require/debug absent, bytecode refused, text load works"))
        tr_recipe_free(&r);
    expect_error("sandbox: endless loop", "local n = 0\nwhile true do n = n + 1 end\n", "loop.lua",
                 NULL, 0, "loop.lua:2: recipe did not finish within 100000000 instructions (an endless loop?)");
    tr_recipe_load_string(&r, "while true do pcall(function() while true do end end) end\n",
                          "pl.lua", ".", NULL, 0, err, sizeof err);
    check(strstr(err, "did not finish") != NULL, "sandbox: endless loop under pcall stops (%s)", err);
    expect_error("sandbox: huge string", "local s = string.rep('x', 100 * 1024 * 1024)\n", "mem.lua",
                 NULL, 0, "mem.lua: recipe used more than 64 MiB");
    expect_error("sandbox: growing table", "local t = {}\nfor i = 1, 1e8 do t[i] = i end\n",
                 "mem.lua", NULL, 0, "mem.lua: recipe used more than 64 MiB");
    expect_error("sandbox: precompiled recipe", "\033LuaT\001\002", "bin.lua", NULL, 0,
                 "bin.lua: binary (precompiled) recipes are not allowed");
    expect_error("sandbox: io is nil", "io.write('x')\n", "io.lua", NULL, 0,
                 "io.lua:1: attempt to index a nil value (global 'io')");
    check(tr_recipe_load(&r, "no/such/recipe.lua", NULL, 0, err, sizeof err) != 0 &&
              strcmp(err, "no/such/recipe.lua: cannot read recipe: No such file or directory") == 0,
          "sandbox: missing file (%s)", err);
}

static void test_files(void)
{
    tr_recipe r;
    if (check(tr_recipe_load(&r, "recipes_good/tiny.lua", NULL, 0, err, sizeof err) == 0,
              "file: recipes_good/tiny.lua loads (%s)", err)) {
        check(strcmp(r.data.text, "recipes_good/../../data/corpora/tinyshakespeare.txt") == 0,
              "file: data.text relative to the recipe's folder (%s)", r.data.text);
        check(strcmp(r.train.out, "runs/tiny") == 0, "file: default out (%s)", r.train.out);
        check(strcmp(r.path, "recipes_good/tiny.lua") == 0, "file: path as given");
        tr_recipe_free(&r);
    }
    tr_recipe zero;
    memset(&zero, 0, sizeof zero);
    tr_recipe_free(&zero);
    tr_recipe_free(NULL);
    check(1, "free: zeroed struct and NULL");
    check(strcmp(tr_node_kind_name(TR_NODE_ATTENTION), "attention") == 0 &&
              strcmp(tr_node_kind_name(TR_NODE_LM_HEAD), "lm_head") == 0 &&
              strcmp(tr_node_kind_name(TR_NODE_KIND_COUNT), "?") == 0,
          "kind names");
}

/* Errors: one line, the user's line number, the message of the spec. */
static void test_errors(void)
{
    static const char *tail = "data { text = \"c\" }\ntrain { batch_tokens = 64, steps = 1 }\n";
    struct {
        const char *what, *text, *expected;
    } cases[] = {
        {"unknown field",
         "model { vocab = 10, dim = 32, seq_len = 4,\n  embedding {},\n  residual {\n"
         "    attention { head = 4 } },\n  lm_head {} }\n",
         "t.lua:4: attention: unknown field 'head' (fields: bias, heads, kv_heads)"},
        {"wrong type", "local a = attention {\n  heads = 'four' }\n",
         "t.lua:1: attention: field 'heads' must be an integer, got string"},
        {"not an integer", "\n\nlocal s = stack { n = 2.5, mlp {} }\n",
         "t.lua:3: stack: field 'n' must be an integer, got 2.5"},
        {"out of range", "local x = 1\nlocal n = layernorm { eps = -1 }\n",
         "t.lua:2: layernorm: field 'eps' must be > 0, got -1"},
        {"bad enum", "mlp { activation = 'relu' }\n",
         "t.lua:1: mlp: field 'activation' must be one of gelu, swiglu, got 'relu'"},
        {"enum of wrong type", "schedule { decay = 3 }\n",
         "t.lua:1: schedule: field 'decay' must be one of cosine, linear, constant, wsd, got number"},
        {"missing required", "\nattention { bias = false }\n",
         "t.lua:2: attention: field 'heads' is required"},
        {"heads do not divide dim",
         "model { vocab = 10, dim = 32, seq_len = 4,\n  embedding {},\n  stack { n = 2,\n"
         "    residual { layernorm {},\n      attention { heads = 5 } } },\n  lm_head {} }\n",
         "t.lua:5: attention: heads (5) must divide dim (32)"},
        {"kv_heads do not divide heads",
         "model { vocab = 10, dim = 32, seq_len = 4,\n  embedding {},\n"
         "  attention { heads = 8, kv_heads = 3 },\n  lm_head {} }\n",
         "t.lua:3: attention: kv_heads (3) must divide heads (8)"},
        {"non-layer child", "residual {\n  layernorm {}, 5 }\n",
         "t.lua:1: residual: item 2 is a number (5), not a layer (a layer is made by a constructor such as mlp { ... })"},
        {"nil hole in children", "local x\nresidual { layernorm {}, x, mlp {} }\n",
         "t.lua:2: residual: item 2 is nil (a misspelled or undefined variable?)"},
        {"positional item in a leaf", "mlp { 4 }\n",
         "t.lua:1: mlp: unexpected number at position 1; fields are written name = value"},
        {"not a table", "attention(4)\n",
         "t.lua:1: attention: expected a table of fields, as in attention { ... }, got number"},
        {"lm_head not last",
         "model { vocab = 10, dim = 32, seq_len = 4,\n  embedding {},\n  lm_head {},\n  layernorm {} }\n",
         "t.lua:3: lm_head: must be the last layer of model, but layernorm (line 4) follows it"},
        {"rope nested", "model { vocab = 10, dim = 32, seq_len = 4, embedding {},\n"
                        "  residual { rope {} }, lm_head {} }\n",
         "t.lua:2: rope: only allowed at the top level of model, not inside residual"},
        {"both positions and rope",
         "model { vocab = 10, dim = 32, seq_len = 4,\n  embedding {},\n  rope {},\n  positions {},\n  lm_head {} }\n",
         "t.lua:4: positions: a model has positions {} or rope {}, not both (rope at line 3)"},
        {"empty stack", "model { vocab = 10, dim = 32, seq_len = 4, embedding {},\n  stack { n = 2 },\n  lm_head {} }\n",
         "t.lua:2: stack: needs at least one layer inside it"},
        {"duplicate section", "optimizer {}\n\noptimizer { lr = 1 }\n",
         "t.lua:3: optimizer: declared twice (first at line 1)"},
        {"betas", "optimizer { betas = { 0.9 } }\n",
         "t.lua:1: optimizer: field 'betas' must be a table of two numbers, as in betas = { 0.9, 0.95 }, got another table"},
        {"val_fraction", "data { text = 'x', val_fraction = 0.7 }\n",
         "t.lua:1: data: field 'val_fraction' must be <= 0.5, got 0.7"},
        {"micro_batch", "train { batch_tokens = 64, steps = 1, micro_batch = 'max' }\n",
         "t.lua:1: train: field 'micro_batch' must be an integer or \"auto\", got 'max'"},
        {"zero out of range", "parallel { zero = 4 }\n",
         "t.lua:1: parallel: field 'zero' must be <= 3, got 4"},
        {"unknown knob read", "local k = knobs { width = 32, depth = 2 }\nlocal w = k.width\nlocal x = k.widht\n",
         "t.lua:3: unknown knob 'widht' (knobs: depth, width)"},
        {"knob write", "local k = knobs { width = 32 }\n\nk.width = 3\n",
         "t.lua:3: knobs are read-only: change 'width' with --set width=VALUE or in knobs { ... }"},
        {"knobs twice", "knobs {}\nknobs {}\n", "t.lua:2: knobs: declared twice (first at line 1)"},
        {"bad knob value", "knobs { f = print }\n",
         "t.lua:1: knobs: knob 'f' must be a number, string or boolean, got function"},
        {"syntax error", "model {\n  vocab = 10\n  dim = 3 }\n",
         "t.lua:3: '}' expected (to close '{' at line 1) near 'dim'"},
        {"runtime error", "local x = 1\nattenton { heads = 2 }\n",
         "t.lua:2: unknown layer 'attenton' (layers: attention, embedding, layernorm, lm_head, "
         "mlp, positions, residual, rmsnorm, rope, stack; sections: data, eval, hf, knobs, model, "
         "optimizer, parallel, schedule, sweep, train)"},
        {"error without position", "\nerror('plain', 0)\n", "t.lua:2: plain"},
        {"error with a table", "\n\nerror({})\n",
         "t.lua:3: recipe raised a table as an error (error() takes a message string)"},
        {"error inside load", "local f = load('error(\"inner\")')\nf()\n",
         "t.lua:2: [string \"error(\"inner\")\"]:1: inner"},
        {"multi-line error message", "error('first\\nsecond')\n", "t.lua:1: first"},
        {"__gc refused", "\nsetmetatable({}, { __gc = print })\n",
         "t.lua:2: setmetatable: __gc finalizers are not allowed in recipes"},
        {"missing model", "data { text = 'c' }\n", "t.lua: no model { ... } declared"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_error(cases[i].what, cases[i].text, "t.lua", NULL, 0, cases[i].expected);

    char text[1024];
    snprintf(text, sizeof text,
             "model { vocab = 10, dim = 32, seq_len = 16, embedding {}, lm_head {} }\n%s",
             "data { text = \"c\" }\n\ntrain { batch_tokens = 100, steps = 1 }\n");
    expect_error("batch_tokens not a multiple of seq_len", text, "t.lua", NULL, 0,
                 "t.lua:4: train: batch_tokens (100) must be a multiple of the model's seq_len (16)");
    snprintf(text, sizeof text, "model { vocab = 10, dim = 32, seq_len = 4, embedding {}, lm_head {} }\n%s", tail);
    tr_recipe r;
    if (check(load(&r, text, "t.lua", NULL, 0) == 0, "errors: the base recipe is fine"))
        tr_recipe_free(&r);
    /* Lua shortens long chunk names in its own messages; the full name must come back */
    const char *long_name =
        "a/very/long/folder/name/that/goes/on/and/on/for/more/than/sixty/bytes/recipe.lua";
    char expected[512];
    snprintf(expected, sizeof expected, "%s:2: unexpected symbol near '}'", long_name);
    expect_error("long chunk name", "local x = 1\n}\n", long_name, NULL, 0, expected);
}

/* The data fields: shards, val_shards, mix, gpt2 vocabulary files; resolved against the
 * recipe's folder and written back (absolute) so that the saved recipe loads to the same. */
static void test_data_fields(void)
{
    static const char *model = "model { vocab = 50304, dim = 32, seq_len = 8, embedding {}, lm_head {} }\n"
                               "train { batch_tokens = 64, steps = 1 }\n";
    char text[2048];
    tr_recipe a, b;
    snprintf(text, sizeof text, "%sdata { mix = { { shards = \"a/*.bin\", weight = 0.7 },\n"
             "  { shards = \"/abs/b_*.bin\", weight = 0.3 } }, val_shards = \"v/*.bin\",\n"
             "  tokenizer = \"gpt2\", merges = \"m.bpe\" }\n", model);
    if (check(tr_recipe_load_string(&a, text, "d.lua", "dir", NULL, 0, err, sizeof err) == 0, "data mix: loads (%s)", err)) {
        const tr_data_desc *d = &a.data;
        check(d->n_mix == 2 && strcmp(d->mix[0].shards, "dir/a/*.bin") == 0 &&
                  strcmp(d->mix[1].shards, "/abs/b_*.bin") == 0 && feq(d->mix[0].weight, 0.7f) &&
                  strcmp(d->val_shards, "dir/v/*.bin") == 0 && d->text[0] == 0 && d->shards[0] == 0,
              "data mix: sources, weights and val_shards resolved against the recipe's folder");
        check(d->tokenizer == TR_TOKENIZER_GPT2 && strcmp(d->merges, "dir/m.bpe") == 0 &&
                  strstr(d->encoder, "data/gpt2/encoder.json") && d->encoder[0] == '/',
              "data mix: gpt2 merges given, encoder defaults to the project's (%s)", d->encoder);
        char dir[] = "/tmp/test_recipe_XXXXXX", p1[64];
        if (mkdtemp(dir)) {
            snprintf(p1, sizeof p1, "%s/first.lua", dir);
            write_file(p1, &a);
            if (check(tr_recipe_load(&b, p1, NULL, 0, err, sizeof err) == 0,
                      "data mix: written recipe loads (%s)", err)) {
                const tr_data_desc *e = &b.data;
                check(e->n_mix == 2 && e->mix[0].shards[0] == '/' &&
                          strstr(e->mix[0].shards, "/dir/a/*.bin") &&
                          strcmp(e->mix[1].shards, "/abs/b_*.bin") == 0 &&
                          feq(e->mix[1].weight, 0.3f) && strstr(e->val_shards, "/dir/v/*.bin") &&
                          e->tokenizer == TR_TOKENIZER_GPT2 && strcmp(e->encoder, a.data.encoder) == 0 &&
                          strstr(e->merges, "/dir/m.bpe"),
                      "data mix: round trip keeps every source, weight and file (absolute)");
                tr_recipe_free(&b);
            }
            unlink(p1);
            rmdir(dir);
        }
        tr_recipe_free(&a);
    }
    snprintf(text, sizeof text, "%sdata { shards = \"s/train_*.bin\", tokenizer = \"gpt2\" }\n", model);
    if (check(tr_recipe_load_string(&a, text, "d.lua", "dir", NULL, 0, err, sizeof err) == 0, "data shards: loads (%s)", err)) {
        check(strcmp(a.data.shards, "dir/s/train_*.bin") == 0 && a.data.val_shards[0] == 0 &&
                  a.data.n_mix == 0,
              "data shards: glob resolved, no validation shards");
        tr_recipe_free(&a);
    }
    struct {
        const char *what, *data, *expected;
    } cases[] = {
        {"no source", "data { tokenizer = 'gpt2' }",
         "d.lua:3: data: one of 'text', 'shards' or 'mix' is required"},
        {"two sources", "data { text = 'x', shards = 'y' }",
         "d.lua:3: data: give only one of 'text', 'shards' and 'mix'"},
        {"val_fraction with shards", "data { shards = 'x', val_fraction = 0.2 }",
         "d.lua:3: data: 'val_fraction' goes with 'text'; shards take 'val_shards'"},
        {"val_shards with text", "data { text = 'x', val_shards = 'v' }",
         "d.lua:3: data: 'val_shards' goes with 'shards' or 'mix'"},
        {"mix without weight", "data { mix = { { shards = 'a' } } }",
         "d.lua:3: data: mix[1]: field 'weight' is required"},
        {"mix zero weight", "data { mix = { { shards = 'a', weight = 1 }, { shards = 'b', weight = 0 } } }",
         "d.lua:3: data: mix[2]: field 'weight' must be > 0, got 0"},
        {"mix empty", "data { mix = {} }", "d.lua:3: data: 'mix' needs at least one"},
        {"mix not a list", "data { mix = { a = 1 } }", "d.lua:3: data: 'mix' must be a list"},
        {"mix unknown field", "data { mix = { { shards = 'a', weight = 1, wieght = 2 } } }",
         "d.lua:3: data: mix[1]: unknown field 'wieght' (fields: shards, weight)"},
        {"mix of strings", "data { mix = { 'a' } }",
         "d.lua:3: data: mix[1]: expected a table { shards = \"...\", weight = w }, got string"},
        {"mix not a table", "data { mix = 'a' }", "d.lua:3: data: field 'mix' must be a table, got string"},
        {"encoder with bytes", "data { text = 'x', encoder = 'e.json' }",
         "d.lua:3: data: 'encoder' goes with tokenizer = \"gpt2\""},
        {"bad tokenizer", "data { text = 'x', tokenizer = 'bpe' }",
         "d.lua:3: data: field 'tokenizer' must be one of byte, gpt2, got 'bpe'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(text, sizeof text, "%s%s\n", model, cases[i].data);
        int rc = tr_recipe_load_string(&a, text, "d.lua", "dir", NULL, 0, err, sizeof err);
        if (!check(rc != 0 && strstr(err, cases[i].expected) == err, "error: %s", cases[i].what))
            printf("     expected: %s\n     got (rc %d): %s\n", cases[i].expected, rc, err);
        tr_recipe_free(&a);
    }
    expect_error("gpt2 with a small vocab",
                 "model { vocab = 256, dim = 32, seq_len = 8, embedding {}, lm_head {} }\n"
                 "train { batch_tokens = 64, steps = 1 }\ndata { text = 'x', tokenizer = 'gpt2' }\n",
                 "d.lua", NULL, 0,
                 "d.lua:3: data: the gpt2 tokenizer has 50257 tokens but model.vocab is 256");
}

/* Every shipped recipe saves checkpoints (export and sample read them), and --set
 * checkpoint_every=0 still turns them off. */
static void test_shipped_recipes(void)
{
    glob_t g;
    if (!check(glob("../recipes/*.lua", 0, NULL, &g) == 0 && g.gl_pathc >= 4,
               "shipped: recipes/*.lua found"))
        return;
    tr_knob_set off;
    tr_knob_set_parse(&off, "checkpoint_every=0", err, sizeof err);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        tr_recipe r;
        const char *path = g.gl_pathv[i];
        if (!check(tr_recipe_load(&r, path, NULL, 0, err, sizeof err) == 0, "%s loads (%s)", path,
                   err))
            continue;
        int every = r.train.checkpoint_every, steps = r.train.steps;
        check(every > 0 && every <= steps, "%s saves a checkpoint every %d of its %d steps", path,
              every, steps);
        tr_recipe_free(&r);
        if (check(tr_recipe_load(&r, path, &off, 1, err, sizeof err) == 0, "%s loads (%s)", path,
                  err)) {
            check(r.train.checkpoint_every == 0, "%s: --set checkpoint_every=0 saves none", path);
            tr_recipe_free(&r);
        }
    }
    globfree(&g);
}

int main(void)
{
    test_gpt();
    test_llama();
    test_sets();
    test_round_trip();
    test_parallel_fields();
    test_sandbox();
    test_checkpoint_fields();
    test_files();
    test_errors();
    test_data_fields();
    test_shipped_recipes();
    printf("%d ok, %d failed\n", n_ok, n_fail);
    return n_fail ? 1 : 0;
}
