/* Training on the CUDA backend against the CPU backend: two small models (GPT flavour:
 * LayerNorm, learned positions, GELU, tied head; Llama flavour: RMSNorm, rotary, GQA, SwiGLU,
 * untied head) trained for 50 AdamW steps with clipping on the same batches from the same
 * initial parameters. The fp32 CUDA loss curve must stay within 1e-4 relative of the CPU's at
 * every step, the bf16 one within 2e-2; two CUDA runs must give bitwise identical losses.
 * Then the PyTorch fixtures of tests/reference/ (logits, loss, every gradient) on the fp32
 * CUDA backend, 1e-4 relative as in test_reference. Exits 77 (skipped) without a GPU.
 * The determinism check repeats the first REPEAT_STEPS steps: a kernel whose result depends
 * on the order its threads or blocks run in differs at every step, the first included.
 * TR_TEST_QUICK=1 (the sanitizer build, where the emulator is slowest) skips the second runs
 * of the determinism check, which the plain build makes, and trains QUICK_STEPS steps: every
 * step launches the same kernels on the same shapes, so the sanitizers see in a few steps all
 * that 50 would show them; the plain build compares the 50-step curves.
 * TR_TEST_CUDNN=1 (test_cuda_train_emu_cudnn) also trains the bf16 models with attention on
 * cuDNN (TR_CUDA_ATTENTION=cudnn) and compares that curve with ours: 2e-2, as bf16 vs CPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl/recipe.h"
#include "fixture.h"
#include "model/model.h"

#define STEPS 50
#define REPEAT_STEPS 20
#define QUICK_STEPS 10
#define B 4
#define T 32

static int failures;
static int steps = STEPS; /* QUICK_STEPS under TR_TEST_QUICK=1 */

static const char *gpt =
    "model { vocab = 96, dim = 64, seq_len = 32,\n"
    "  embedding {}, positions {},\n"
    "  stack { n = 2,\n"
    "    residual { layernorm {}, attention { heads = 4 } },\n"
    "    residual { layernorm {}, mlp { hidden = 256, activation = 'gelu' } } },\n"
    "  layernorm {}, lm_head { tied = true } }\n"
    "data { text = 'x' } train { batch_tokens = 128, steps = 1 }\n";

static const char *llama =
    "model { vocab = 96, dim = 64, seq_len = 32,\n"
    "  embedding {}, rope { theta = 10000 },\n"
    "  stack { n = 2,\n"
    "    residual { rmsnorm {}, attention { heads = 4, kv_heads = 2, bias = false } },\n"
    "    residual { rmsnorm {}, mlp { hidden = 96, activation = 'swiglu', bias = false } } },\n"
    "  rmsnorm {}, lm_head { tied = false } }\n"
    "data { text = 'x' } train { batch_tokens = 128, steps = 1 }\n";

/* a learnable stream: each sequence follows x' = (5x + 3) mod V from a random start, with a
 * little noise; targets are the next tokens */
static void batch(int step, int V, int *tok, int *tgt) {
    unsigned s = 12345u + 7919u * (unsigned)step;
    for (int b = 0; b < B; b++) {
        s = s * 1103515245u + 12345u;
        int x = (int)((s >> 16) % (unsigned)V);
        for (int t = 0; t <= T; t++) {
            s = s * 1103515245u + 12345u;
            int y = ((s >> 16) % 16u) == 0 ? (int)((s >> 20) % (unsigned)V) : x;
            if (t < T) tok[b * T + t] = y;
            if (t > 0) tgt[b * T + t - 1] = y;
            x = (5 * x + 3) % V;
        }
    }
}

static void train(const tr_backend *be, const char *text, float *losses, int n) {
    tr_recipe r;
    char err[512];
    if (tr_recipe_load_string(&r, text, "test", ".", NULL, 0, err, sizeof(err))) {
        fprintf(stderr, "FAIL recipe: %s\n", err);
        exit(1);
    }
    tr_model *m;
    if (tr_model_init(&m, &r.model, be, B, T, err, sizeof(err))) {
        fprintf(stderr, "FAIL model on %s: %s\n", be->name, err);
        exit(1);
    }
    tr_model_init_params(m, 1337); /* host-generated: the same values on every backend */
    static int first_device = 1;
    if (be->device_memory && first_device) { /* the process's first model: all it holds */
        tr_memory p = tr_model_memory(m);
        size_t want = p.params + p.grads + p.optimizer + p.activations + p.scratch + p.workspace,
               held = 0;
        tr_backend_cuda_memory(&held, NULL);
        printf("%s %-6s %s: device memory predicted %zu bytes, allocated %zu\n",
               want == held ? "ok  " : "FAIL", "train", be->name, want, held);
        if (want != held) failures++;
        first_device = 0;
    }
    int tok[B * T], tgt[B * T];
    for (int s = 0; s < n; s++) {
        batch(s, r.model.vocab, tok, tgt);
        tr_model_zero_grad(m);
        losses[s] = tr_model_forward(m, tok, tgt, B, T, 1.0f);
        tr_model_backward(m);
        double norm = tr_model_grad_norm(m);
        tr_adamw o = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                      .weight_decay = 0.1f, .grad_scale = 1.0f};
        if (norm > 1.0) o.grad_scale = (float)(1.0 / (norm + 1e-6));
        tr_model_adamw_step(m, &o);
        /* no device allocation after the first step (the emulator fails one) */
        if (be->device_memory) tr_backend_cuda_step_done(s + 1);
    }
    if (be->device_memory) tr_backend_cuda_step_done(0);
    tr_model_free(m);
    tr_recipe_free(&r);
}

static void compare_curves(const char *model, const char *what, const float *got, const float *ref,
                           double tol) {
    double worst = 0;
    int at = 0, nan = 0;
    for (int s = 0; s < steps; s++) {
        double e = fabs((double)got[s] - ref[s]) / fabs((double)ref[s]);
        if (!(e <= INFINITY)) nan = 1;
        if (e > worst) worst = e, at = s;
    }
    int ok = !nan && worst <= tol;
    failures += !ok;
    printf("%s %-6s %-24s worst rel diff %.2e at step %d (%.6f vs %.6f), tol %.0e; "
           "loss %.4f -> %.4f\n",
           ok ? "ok  " : "FAIL", model, what, worst, at + 1, got[at], ref[at], tol, got[0],
           got[steps - 1]);
}

static void curves(const char *model, const char *text, const tr_backend *f32,
                   const tr_backend *b16) {
    float cpu[STEPS], g32[STEPS], g16[STEPS], g16b[STEPS], g32b[STEPS];
    train(tr_backend_cpu(), text, cpu, steps);
    train(f32, text, g32, steps);
    train(b16, text, g16, steps);
    compare_curves(model, "cuda-fp32 vs cpu", g32, cpu, 1e-4);
    compare_curves(model, "cuda-bf16 vs cpu", g16, cpu, 2e-2);
    if (getenv("TR_TEST_CUDNN")) { /* test_cuda_train_emu_cudnn: bf16 on cuDNN's attention */
        float gc[STEPS];
        tr_backend_set_attention(TR_ATTENTION_CUDNN);
        train(b16, text, gc, steps);
        tr_backend_set_attention(TR_ATTENTION_TC);
        compare_curves(model, "bf16 cudnn vs ours", gc, g16, 2e-2);
    }
    if (steps == STEPS) {
        size_t n = REPEAT_STEPS * sizeof(float);
        train(f32, text, g32b, REPEAT_STEPS);
        train(b16, text, g16b, REPEAT_STEPS);
        int ok32 = !memcmp(g32, g32b, n), ok16 = !memcmp(g16, g16b, n);
        failures += !ok32 + !ok16;
        printf("%s %-6s cuda-fp32 two runs: bitwise identical losses (%d steps)\n",
               ok32 ? "ok  " : "FAIL", model, REPEAT_STEPS);
        printf("%s %-6s cuda-bf16 two runs: bitwise identical losses (%d steps)\n",
               ok16 ? "ok  " : "FAIL", model, REPEAT_STEPS);
    }
    int learned = g16[steps - 1] < 0.8f * g16[0];
    failures += !learned;
    printf("%s %-6s cuda-bf16 learns (last loss below 0.8x the first)\n", learned ? "ok  " : "FAIL",
           model);
}

/* ---- the PyTorch fixtures on the fp32 CUDA backend ------------------------------------ */

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= num)) num = d;
        if (fabs((double)b[i]) > den) den = fabs((double)b[i]);
    }
    return den > 0 ? num / den : num;
}

static void fixture(const tr_backend *be, const char *recipe, const char *path) {
    fx_file fx;
    tr_recipe r;
    char err[512];
    if (fx_load(&fx, path) || tr_recipe_load(&r, recipe, NULL, 0, err, sizeof(err))) {
        fprintf(stderr, "FAIL cannot load %s / %s\n", path, recipe);
        exit(1);
    }
    const int *cfg = fx_find(&fx, "config")->data;
    int V = cfg[1], Bf = cfg[4], Tf = cfg[3];
    tr_model *m;
    if (tr_model_init(&m, &r.model, be, Bf, Tf, err, sizeof(err))) {
        fprintf(stderr, "FAIL %s\n", err);
        exit(1);
    }
    for (int i = 0; i < tr_model_num_params(m); i++) {
        const fx_entry *e = fx_nth(&fx, "param:", i);
        if (!e || e->numel != tr_model_param(m, i)->numel) {
            fprintf(stderr, "FAIL fixture %s does not match the model\n", path);
            exit(1);
        }
        tr_model_set_param(m, i, e->data);
    }
    const int *tok = fx_find(&fx, "tokens")->data, *tgt = fx_find(&fx, "targets")->data;
    float *logits = malloc((size_t)Bf * Tf * V * sizeof(float));
    tr_model_all_logits(m, tok, Bf, Tf, logits);
    double worst = rel_err(logits, fx_find(&fx, "logits")->data, (size_t)Bf * Tf * V);
    tr_model_zero_grad(m);
    float loss = tr_model_forward(m, tok, tgt, Bf, Tf, 1.0f);
    tr_model_backward(m);
    double le = rel_err(&loss, fx_find(&fx, "loss")->data, 1);
    worst = le > worst ? le : worst;
    for (int i = 0; i < tr_model_num_params(m); i++) {
        const tr_param *p = tr_model_param(m, i);
        float *g = malloc(p->numel * sizeof(float));
        tr_model_get_grad(m, i, g);
        double e = rel_err(g, fx_nth(&fx, "grad:", i)->data, p->numel);
        if (!(e <= worst)) worst = e;
        free(g);
    }
    int ok = worst <= 1e-4;
    failures += !ok;
    printf("%s cuda-fp32 vs PyTorch %-24s logits, loss, every grad: worst rel err %.2e (tol 1e-4)\n",
           ok ? "ok  " : "FAIL", path, worst);
    free(logits);
    tr_model_free(m);
    tr_recipe_free(&r);
    fx_free(&fx);
}

int main(void) {
    char why[256];
    const tr_backend *b16 = tr_backend_cuda(TR_DTYPE_BF16, why, sizeof(why));
    if (!b16) {
        printf("SKIP test_cuda_train: %s\n", why);
        return 77;
    }
    const tr_backend *f32 = tr_backend_cuda(TR_DTYPE_F32, why, sizeof(why));
    const char *q = getenv("TR_TEST_QUICK");
    if (q && strcmp(q, "1") == 0) steps = QUICK_STEPS;
    curves("gpt", gpt, f32, b16);
    curves("llama", llama, f32, b16);
    fixture(f32, "reference/tiny_gpt.lua", "reference/tiny_gpt.bin");
    fixture(f32, "reference/tiny_llama.lua", "reference/tiny_llama.bin");
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
