/* What a resume needs of the recipe: the saved one against the current one, field by field;
 * the changes that matter are refused, harmless ones listed. */
#include "trainer/checkpoint/private.h"

#include <stdlib.h>
#include <string.h>

/* ---- recipe comparison ------------------------------------------------------------------- */

static int same_node(const tr_node *a, const tr_node *b) {
    if (a->kind != b->kind || a->repeat != b->repeat || a->n_children != b->n_children ||
        a->heads != b->heads || a->kv_heads != b->kv_heads || a->hidden != b->hidden ||
        a->activation != b->activation || a->bias != b->bias || a->eps != b->eps ||
        a->rope_theta != b->rope_theta || a->tied != b->tied)
        return 0;
    for (int i = 0; i < a->n_children; i++)
        if (!same_node(&a->children[i], &b->children[i])) return 0;
    return 1;
}

/* The text of one top-level section ("data {" ...) of a recipe as tr_recipe_write_lua writes
 * it: its first line and the indented lines after it. malloc'ed; "" when absent. */
static char *section_text(const tr_recipe *r, const char *head) {
    char *buf = tr_recipe_text(r, NULL);
    size_t hl = strlen(head);
    char *s = buf, *res = NULL;
    while (s && *s) {
        if (!strncmp(s, head, hl) && (s == buf || s[-1] == '\n')) {
            char *e = s;
            do {
                e = strchr(e, '\n');
                if (!e) break;
                e++;
            } while (*e == ' ' || *e == '}');
            size_t n = e ? (size_t)(e - s) : strlen(s);
            res = malloc(n + 1);
            if (res) {
                memcpy(res, s, n);
                res[n] = 0;
            }
            break;
        }
        s = strchr(s, '\n');
        if (s) s++;
    }
    free(buf);
    return res ? res : strdup("");
}

/* The shortest decimal that reads back as the same float. */
static void short_float(char *buf, size_t n, float x) {
    for (int p = 6; p <= 9; p++) {
        snprintf(buf, n, "%.*g", p, (double)x);
        if (strtof(buf, NULL) == x) return;
    }
}

static void add_diff(char *list, size_t cap, const char *field, const char *was, const char *now) {
    size_t l = strlen(list);
    if (snprintf(list + l, cap - l, "%s%s (%s -> %s)", l ? ", " : "", field, was, now) < 0)
        list[l] = 0;
}

int tr_ckpt_compare_recipes(const tr_recipe *saved, const tr_recipe *now, FILE *log, char *err,
                            size_t errlen) {
    char bad[1024] = "", a[64], b[64];
    const tr_model_desc *ma = &saved->model, *mb = &now->model;
#define INT_DIFF(list, name, x, y)                                                                 \
    do {                                                                                           \
        if ((x) != (y)) {                                                                          \
            snprintf(a, sizeof a, "%lld", (long long)(x));                                         \
            snprintf(b, sizeof b, "%lld", (long long)(y));                                         \
            add_diff(list, sizeof list, name, a, b);                                               \
        }                                                                                          \
    } while (0)
#define FLT_DIFF(list, name, x, y)                                                                 \
    do {                                                                                           \
        if ((x) != (y)) {                                                                          \
            short_float(a, sizeof a, (x));                                                         \
            short_float(b, sizeof b, (y));                                                         \
            add_diff(list, sizeof list, name, a, b);                                               \
        }                                                                                          \
    } while (0)
    INT_DIFF(bad, "model.vocab", ma->vocab, mb->vocab);
    INT_DIFF(bad, "model.dim", ma->dim, mb->dim);
    INT_DIFF(bad, "model.seq_len", ma->seq_len, mb->seq_len);
    if (!same_node(&ma->root, &mb->root)) {
        size_t l = strlen(bad);
        snprintf(bad + l, sizeof(bad) - l, "%smodel layers (the layer tree differs)",
                 l ? ", " : "");
    }
    char *da = section_text(saved, "data"), *db = section_text(now, "data");
    if (da && db && strcmp(da, db)) {
        size_t l = strlen(bad);
        snprintf(bad + l, sizeof(bad) - l, "%sdata", l ? ", " : "");
    }
    free(da);
    free(db);
    FLT_DIFF(bad, "optimizer.lr", saved->optim.lr, now->optim.lr);
    FLT_DIFF(bad, "optimizer.beta1", saved->optim.beta1, now->optim.beta1);
    FLT_DIFF(bad, "optimizer.beta2", saved->optim.beta2, now->optim.beta2);
    FLT_DIFF(bad, "optimizer.eps", saved->optim.eps, now->optim.eps);
    FLT_DIFF(bad, "optimizer.weight_decay", saved->optim.weight_decay, now->optim.weight_decay);
    FLT_DIFF(bad, "optimizer.grad_clip", saved->optim.grad_clip, now->optim.grad_clip);
    INT_DIFF(bad, "schedule.warmup", saved->schedule.warmup, now->schedule.warmup);
    if (saved->schedule.decay != now->schedule.decay) {
        static const char *decays[] = {"cosine", "linear", "constant", "wsd"};
        add_diff(bad, sizeof bad, "schedule.decay", decays[saved->schedule.decay & 3],
                 decays[now->schedule.decay & 3]);
    }
    FLT_DIFF(bad, "schedule.min_lr", saved->schedule.min_lr, now->schedule.min_lr);
    FLT_DIFF(bad, "schedule.decay_frac", saved->schedule.decay_frac, now->schedule.decay_frac);
    INT_DIFF(bad, "train.batch_tokens", saved->train.batch_tokens, now->train.batch_tokens);
    INT_DIFF(bad, "train.seed", saved->train.seed, now->train.seed);
    if (bad[0]) {
        snprintf(err, errlen, "the recipe changed in ways a resume cannot follow: %s", bad);
        return -1;
    }
    char ok[1024] = "";
    INT_DIFF(ok, "train.steps", saved->train.steps, now->train.steps);
    INT_DIFF(ok, "train.eval_every", saved->train.eval_every, now->train.eval_every);
    INT_DIFF(ok, "train.eval_tokens", saved->train.eval_tokens, now->train.eval_tokens);
    INT_DIFF(ok, "train.sample_tokens", saved->train.sample_tokens, now->train.sample_tokens);
    INT_DIFF(ok, "train.log_every", saved->train.log_every, now->train.log_every);
    INT_DIFF(ok, "train.checkpoint_every", saved->train.checkpoint_every,
             now->train.checkpoint_every);
    INT_DIFF(ok, "train.keep_checkpoints", saved->train.keep_checkpoints,
             now->train.keep_checkpoints);
    /* another micro-batch (another number of ranks, say) sums the same gradient in another
       order: the run continues exactly, up to rounding */
    INT_DIFF(ok, "train.micro_batch (the continuation then matches up to rounding, not bitwise)",
             saved->train.micro_batch, now->train.micro_batch);
    const tr_guard_desc *ga = &saved->train.guard, *gb = &now->train.guard;
    INT_DIFF(ok, "train.guard (on)", ga->on, gb->on);
    if (ga->on && gb->on) {
        INT_DIFF(ok, "train.guard.window", ga->window, gb->window);
        FLT_DIFF(ok, "train.guard.z_loss", ga->z_loss, gb->z_loss);
        FLT_DIFF(ok, "train.guard.norm_ratio", ga->norm_ratio, gb->norm_ratio);
        INT_DIFF(ok, "train.guard.warmup", ga->warmup, gb->warmup);
        INT_DIFF(ok, "train.guard.max_bad", ga->max_bad, gb->max_bad);
    }
    if (strcmp(saved->train.out, now->train.out))
        add_diff(ok, sizeof ok, "train.out", saved->train.out, now->train.out);
#undef INT_DIFF
#undef FLT_DIFF
    if (ok[0] && log) fprintf(log, "resume: allowed recipe changes: %s\n", ok);
    return 0;
}
