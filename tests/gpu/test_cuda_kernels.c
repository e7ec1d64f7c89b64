/* Every operation of the CUDA backend (both storage dtypes) against the CPU backend on random
 * inputs (fresh per run of a check, fixed seed), awkward shapes (odd sizes, sizes that are not
 * multiples of 8, so both the 128-bit and the scalar paths run), outputs poisoned with NaN first
 * so that an unwritten element fails, accumulate-vs-overwrite semantics, and bitwise
 * reproducibility of the reductions. Exits 77 (ctest: skipped) when no GPU is present.
 * TR_TEST_QUICK=1 (the sanitizer build, where the emulator is slowest, and the plain build's
 * runs again in reverse thread order and under the race check) leaves out the tensor-core
 * attention at T = 1024 (16 full tiles, a third of the test's time): its tile loops, grid and
 * barriers are those of T = 257 (5 tiles, a ragged end), which those runs do see; the plain
 * build's own run has it.
 *
 * Tolerances: ||cuda - cpu||_2 / ||cpu||_2 over each output. fp32 storage: 1e-5 (different
 * summation orders only). bf16 storage: 1e-2 (inputs are rounded to bf16 before both backends
 * see them, so the error is the rounding of bf16 outputs and intermediates: about 2^-9 each). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/backend.h"

static const tr_backend *cpu, *gpu;
static int bf; /* the dtype under test is bf16 */
static double tol;
static int n_fail, n_check;
static int quick; /* TR_TEST_QUICK=1 */

/* ---- host helpers ---------------------------------------------------------------------- */

static uint64_t rng = 0x243F6A8885A308D3ull;
static double urand(void) {
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}
static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test_cuda_kernels: out of host memory\n");
        exit(2);
    }
    return p;
}
/* x rounded to the storage dtype under test, so both backends see the same values */
static float round_st(float x) {
    if (!bf) return x;
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}
static float *rnd(size_t n, float lo, float hi) {
    float *p = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = round_st(lo + (hi - lo) * (float)urand());
    return p;
}
static float *dup(const float *a, size_t n) {
    float *p = xmalloc(n * sizeof(float));
    memcpy(p, a, n * sizeof(float));
    return p;
}
static float *nanv(size_t n) {
    float *p = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

/* device buffers: storage dtype (s*) or fp32 (f*) */
static void *sput(const float *h, size_t n) {
    void *d = gpu->alloc(n * tr_dtype_size(gpu->dtype));
    if (!d) {
        fprintf(stderr, "test_cuda_kernels: device allocation failed\n");
        exit(2);
    }
    gpu->to_storage(d, h, n);
    return d;
}
static void *spoison(size_t n) {
    float *h = nanv(n);
    void *d = sput(h, n);
    free(h);
    return d;
}
static float *sget(const void *d, size_t n) {
    float *h = xmalloc(n * sizeof(float));
    gpu->from_storage(h, d, n);
    return h;
}
static float *fput(const float *h, size_t n) {
    float *d = gpu->alloc(n * sizeof(float));
    if (!d) exit(2);
    gpu->upload(d, h, n * sizeof(float));
    return d;
}
static float *fpoison(size_t n) {
    float *h = nanv(n), *d = fput(h, n);
    free(h);
    return d;
}
static float *fget(const float *d, size_t n) {
    float *h = xmalloc(n * sizeof(float));
    gpu->download(h, d, n * sizeof(float));
    return h;
}
static int *iput(const int *h, size_t n) {
    int *d = gpu->alloc(n * sizeof(int));
    if (!d) exit(2);
    gpu->upload(d, h, n * sizeof(int));
    return d;
}

/* ||got - ref|| / ||ref|| <= t; NaN anywhere fails */
static void cmp_t(const char *name, const float *got, const float *ref, size_t n, double t) {
    double num = 0, den = 0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        if (!(fabs(d) <= INFINITY)) nan = 1;
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    double rel = sqrt(num) / (den > 0 ? sqrt(den) : 1.0);
    int ok = !nan && rel <= t;
    n_check++;
    n_fail += !ok;
    printf("%s %-5s %-46s rel err %.2e (tol %.0e)%s\n", ok ? "ok  " : "FAIL", bf ? "bf16" : "fp32",
           name, rel, t, nan ? " NaN (unwritten or invalid)" : "");
}
static void cmp(const char *name, const float *got, const float *ref, size_t n) {
    cmp_t(name, got, ref, n, tol);
}
/* a storage-dtype device buffer against a host fp32 reference; frees the download */
static void cmp_s(const char *name, const void *d, const float *ref, size_t n) {
    float *h = sget(d, n);
    cmp(name, h, ref, n);
    free(h);
}
static void cmp_f(const char *name, const float *d, const float *ref, size_t n, double t) {
    float *h = fget(d, n);
    cmp_t(name, h, ref, n, t);
    free(h);
}
static void same_bits(const char *name, const void *a, const void *b, size_t n) {
    float *x = sget(a, n), *y = sget(b, n);
    int ok = memcmp(x, y, n * sizeof(float)) == 0;
    n_check++;
    n_fail += !ok;
    printf("%s %-5s %-46s bitwise identical\n", ok ? "ok  " : "FAIL", bf ? "bf16" : "fp32", name);
    free(x);
    free(y);
}

/* ---- checks ---------------------------------------------------------------------------- */

static void t_linear(int N, int IC, int OC, int with_bias) {
    char nm[96];
    float *x = rnd((size_t)N * IC, -1, 1), *w = rnd((size_t)OC * IC, -0.5f, 0.5f);
    float *b = rnd((size_t)OC, -1, 1), *dout = rnd((size_t)N * OC, -1, 1);
    float *dw0 = rnd((size_t)OC * IC, -1, 1), *db0 = rnd((size_t)OC, -1, 1);
    /* cpu */
    float *out = xmalloc(sizeof(float) * N * OC), *dinp = xmalloc(sizeof(float) * N * IC);
    float *dw = dup(dw0, (size_t)OC * IC), *db = dup(db0, OC);
    cpu->linear_forward(out, x, w, with_bias ? b : NULL, N, IC, OC);
    cpu->linear_backward(dinp, dw, with_bias ? db : NULL, dout, x, w, N, IC, OC);
    /* gpu */
    void *gx = sput(x, (size_t)N * IC), *gw = sput(w, (size_t)OC * IC), *gb = sput(b, OC);
    void *gout = spoison((size_t)N * OC), *gdout = sput(dout, (size_t)N * OC);
    void *gdinp = spoison((size_t)N * IC), *gdw = sput(dw0, (size_t)OC * IC), *gdb = sput(db0, OC);
    gpu->linear_forward(gout, gx, gw, with_bias ? gb : NULL, N, IC, OC);
    gpu->linear_backward(gdinp, gdw, with_bias ? gdb : NULL, gdout, gx, gw, N, IC, OC);
    snprintf(nm, sizeof(nm), "linear fwd N%d IC%d OC%d%s", N, IC, OC, with_bias ? " bias" : "");
    cmp_s(nm, gout, out, (size_t)N * OC);
    snprintf(nm, sizeof(nm), "linear bwd dinp N%d IC%d OC%d", N, IC, OC);
    cmp_s(nm, gdinp, dinp, (size_t)N * IC);
    snprintf(nm, sizeof(nm), "linear bwd dw (+=) N%d IC%d OC%d", N, IC, OC);
    cmp_s(nm, gdw, dw, (size_t)OC * IC);
    if (with_bias) {
        snprintf(nm, sizeof(nm), "linear bwd dbias (+=) N%d OC%d", N, OC);
        cmp_s(nm, gdb, db, OC);
        /* dinp NULL is allowed; dw accumulates again, bitwise the same as a second run */
        float *now = sget(gdw, (size_t)OC * IC); /* a copy of the device's own dw */
        void *gdw2 = sput(now, (size_t)OC * IC);
        free(now);
        gpu->linear_backward(NULL, gdw, NULL, gdout, gx, gw, N, IC, OC);
        gpu->linear_backward(NULL, gdw2, NULL, gdout, gx, gw, N, IC, OC);
        same_bits("linear bwd dw twice, same bits", gdw, gdw2, (size_t)OC * IC);
        /* dw NULL (tensor parallelism: dinp first, the weight gradient later): dinp only,
           dw untouched */
        void *gdinp2 = spoison((size_t)N * IC);
        gpu->linear_backward(gdinp2, NULL, NULL, gdout, gx, gw, N, IC, OC);
        snprintf(nm, sizeof(nm), "linear bwd dinp alone (dw NULL) N%d IC%d OC%d", N, IC, OC);
        cmp_s(nm, gdinp2, dinp, (size_t)N * IC);
        same_bits("linear bwd with dw NULL leaves dw", gdw, gdw2, (size_t)OC * IC);
        gpu->free(gdw2);
        gpu->free(gdinp2);
    }
    void *bufs[] = {gx, gw, gb, gout, gdout, gdinp, gdw, gdb};
    for (int i = 0; i < 8; i++) gpu->free(bufs[i]);
    free(x), free(w), free(b), free(dout), free(dw0), free(db0), free(out), free(dinp), free(dw),
        free(db);
}

/* split: tokens < 0 (another tensor-parallel rank's rows: zeros, no gradient) every third
 * (1) or everywhere (2) */
static void t_embedding(int N, int C, int V, int split) {
    char nm[96];
    int *tok = xmalloc(sizeof(int) * N);
    for (int i = 0; i < N; i++) tok[i] = (int)(urand() * V) % V; /* many repeats */
    tok[0] = V - 1;
    for (int i = 0; i < N; i++)
        if (split == 2 || (split == 1 && i % 3 == 1)) tok[i] = -1;
    float *wte = rnd((size_t)V * C, -1, 1), *dout = rnd((size_t)N * C, -1, 1);
    float *out = xmalloc(sizeof(float) * N * C), *dwte = dup(wte, (size_t)V * C);
    cpu->embedding_forward(out, tok, wte, N, C);
    cpu->embedding_backward(dwte, dout, tok, N, C);
    int *gtok = iput(tok, N);
    void *gwte = sput(wte, (size_t)V * C), *gout = spoison((size_t)N * C);
    void *gdout = sput(dout, (size_t)N * C), *gd = sput(wte, (size_t)V * C),
         *gd2 = sput(wte, (size_t)V * C);
    gpu->embedding_forward(gout, gtok, gwte, N, C);
    gpu->embedding_backward(gd, gdout, gtok, N, C);
    gpu->embedding_backward(gd2, gdout, gtok, N, C);
    snprintf(nm, sizeof(nm), "embedding fwd N%d C%d V%d%s", N, C, V,
             split ? split == 1 ? " (some ids < 0)" : " (all ids < 0)" : "");
    cmp_s(nm, gout, out, (size_t)N * C);
    snprintf(nm, sizeof(nm), "embedding bwd (+=) N%d C%d V%d%s", N, C, V,
             split ? split == 1 ? " (some ids < 0)" : " (all ids < 0)" : "");
    cmp_s(nm, gd, dwte, (size_t)V * C);
    same_bits("embedding bwd twice, same bits", gd, gd2, (size_t)V * C);
    void *bufs[] = {gtok, gwte, gout, gdout, gd, gd2};
    for (int i = 0; i < 6; i++) gpu->free(bufs[i]);
    free(tok), free(wte), free(dout), free(out), free(dwte);
}

static void t_positions(int B, int T, int C) {
    char nm[96];
    size_t n = (size_t)B * T * C;
    float *x = rnd(n, -1, 1), *wpe = rnd((size_t)T * C, -1, 1), *dx = rnd(n, -1, 1);
    float *y = dup(x, n), *dwpe = dup(wpe, (size_t)T * C);
    cpu->positions_forward(y, wpe, B, T, C);
    cpu->positions_backward(dwpe, dx, B, T, C);
    void *gx = sput(x, n), *gw = sput(wpe, (size_t)T * C), *gdx = sput(dx, n),
         *gdw = sput(wpe, (size_t)T * C);
    gpu->positions_forward(gx, gw, B, T, C);
    gpu->positions_backward(gdw, gdx, B, T, C);
    snprintf(nm, sizeof(nm), "positions fwd (in place) B%d T%d C%d", B, T, C);
    cmp_s(nm, gx, y, n);
    snprintf(nm, sizeof(nm), "positions bwd (+=) B%d T%d C%d", B, T, C);
    cmp_s(nm, gdw, dwpe, (size_t)T * C);
    gpu->free(gx), gpu->free(gw), gpu->free(gdx), gpu->free(gdw);
    free(x), free(wpe), free(dx), free(y), free(dwpe);
}

static void t_norms(int N, int C) {
    char nm[96];
    size_t n = (size_t)N * C;
    float *x = rnd(n, -2, 2), *w = rnd(C, 0.5f, 1.5f), *b = rnd(C, -0.5f, 0.5f);
    float *dout = rnd(n, -1, 1), *dw0 = rnd(C, -1, 1), *db0 = rnd(C, -1, 1);
    for (int r = 0; r < N; r++) /* offset rows: the two-pass variance matters */
        for (int c = 0; c < C; c++) x[(size_t)r * C + c] = round_st(x[(size_t)r * C + c] + 3.0f);
    for (int with_b = 0; with_b < 2; with_b++) {
        float *out = xmalloc(n * 4), *mean = xmalloc(N * 4), *rstd = xmalloc(N * 4);
        float *dinp = xmalloc(n * 4), *dw = dup(dw0, C), *db = dup(db0, C);
        cpu->layernorm_forward(out, mean, rstd, x, w, with_b ? b : NULL, N, C, 1e-5f);
        cpu->layernorm_backward(dinp, dw, with_b ? db : NULL, dout, x, w, mean, rstd, N, C);
        void *gx = sput(x, n), *gw = sput(w, C), *gb = sput(b, C), *gout = spoison(n);
        float *gmean = fpoison(N), *grstd = fpoison(N);
        void *gdout = sput(dout, n), *gdinp = spoison(n), *gdw = sput(dw0, C), *gdb = sput(db0, C);
        gpu->layernorm_forward(gout, gmean, grstd, gx, gw, with_b ? gb : NULL, N, C, 1e-5f);
        /* the backward gets the CPU's statistics, so it is checked on its own */
        float *cmean = fput(mean, N), *crstd = fput(rstd, N);
        gpu->layernorm_backward(gdinp, gdw, with_b ? gdb : NULL, gdout, gx, gw, cmean, crstd, N, C);
        snprintf(nm, sizeof(nm), "layernorm fwd N%d C%d%s", N, C, with_b ? " bias" : "");
        cmp_s(nm, gout, out, n);
        cmp_f("layernorm mean (fp32)", gmean, mean, N, 1e-5);
        cmp_f("layernorm rstd (fp32)", grstd, rstd, N, bf ? 1e-2 : 1e-5);
        snprintf(nm, sizeof(nm), "layernorm bwd dinp N%d C%d", N, C);
        cmp_s(nm, gdinp, dinp, n);
        cmp_s("layernorm bwd dw (+=)", gdw, dw, C);
        if (with_b) cmp_s("layernorm bwd db (+=)", gdb, db, C);
        void *bufs[] = {gx, gw, gb, gout, gmean, grstd, gdout, gdinp, gdw, gdb, cmean, crstd};
        for (int i = 0; i < 12; i++) gpu->free(bufs[i]);
        free(out), free(mean), free(rstd), free(dinp), free(dw), free(db);
    }
    {
        float *out = xmalloc(n * 4), *rstd = xmalloc(N * 4), *dinp = xmalloc(n * 4),
              *dw = dup(dw0, C);
        cpu->rmsnorm_forward(out, rstd, x, w, N, C, 1e-6f);
        cpu->rmsnorm_backward(dinp, dw, dout, x, w, rstd, N, C);
        void *gx = sput(x, n), *gw = sput(w, C), *gout = spoison(n), *gdout = sput(dout, n);
        void *gdinp = spoison(n), *gdw = sput(dw0, C), *gdw2 = sput(dw0, C), *gdinp2 = spoison(n);
        float *grstd = fpoison(N), *crstd = fput(rstd, N);
        gpu->rmsnorm_forward(gout, grstd, gx, gw, N, C, 1e-6f);
        gpu->rmsnorm_backward(gdinp, gdw, gdout, gx, gw, crstd, N, C);
        gpu->rmsnorm_backward(gdinp2, gdw2, gdout, gx, gw, crstd, N, C);
        snprintf(nm, sizeof(nm), "rmsnorm fwd N%d C%d", N, C);
        cmp_s(nm, gout, out, n);
        cmp_f("rmsnorm rstd (fp32)", grstd, rstd, N, bf ? 1e-2 : 1e-5);
        cmp_s("rmsnorm bwd dinp", gdinp, dinp, n);
        cmp_s("rmsnorm bwd dw (+=)", gdw, dw, C);
        same_bits("rmsnorm bwd dw twice, same bits", gdw, gdw2, C);
        void *bufs[] = {gx, gw, gout, gdout, gdinp, gdw, gdw2, gdinp2, grstd, crstd};
        for (int i = 0; i < 10; i++) gpu->free(bufs[i]);
        free(out), free(rstd), free(dinp), free(dw);
    }
    free(x), free(w), free(b), free(dout), free(dw0), free(db0);
}

static void t_rope(int B, int T, int H, int KV, int hd) {
    char nm[96];
    size_t n = (size_t)B * T * (H + 2 * KV) * hd;
    float *x = rnd(n, -1, 1), *y = dup(x, n), *z = dup(x, n);
    cpu->rope_forward(y, B, T, H, KV, hd, 10000.0f);
    cpu->rope_backward(z, B, T, H, KV, hd, 10000.0f);
    void *gy = sput(x, n), *gz = sput(x, n);
    gpu->rope_forward(gy, B, T, H, KV, hd, 10000.0f);
    gpu->rope_backward(gz, B, T, H, KV, hd, 10000.0f);
    snprintf(nm, sizeof(nm), "rope fwd B%d T%d H%d KV%d hd%d", B, T, H, KV, hd);
    cmp_s(nm, gy, y, n);
    snprintf(nm, sizeof(nm), "rope bwd B%d T%d H%d KV%d hd%d", B, T, H, KV, hd);
    cmp_s(nm, gz, z, n);
    gpu->free(gy), gpu->free(gz);
    free(x), free(y), free(z);
}

/* The fused ops against the CPU's parts: residual add + norm, linear + GELU, and the linear
 * backward through the GELU (the cuBLASLt epilogues where the shapes allow them, the parts
 * otherwise: OC or IC not a multiple of 8). */
static void t_fusions(int N, int C, int H) {
    char nm[96];
    size_t nc = (size_t)N * C, nh = (size_t)N * H;
    float *a = rnd(nc, -2, 2), *b = rnd(nc, -2, 2), *w = rnd(C, 0.5f, 1.5f), *bias = rnd(C, -1, 1);
    float *sum = xmalloc(nc * 4), *out = xmalloc(nc * 4), *mean = xmalloc(N * 4), *rstd = xmalloc(N * 4);
    for (size_t i = 0; i < nc; i++) sum[i] = round_st(a[i] + b[i]); /* the storage's sum */
    void *ga = sput(a, nc), *gb = sput(b, nc), *gw = sput(w, C), *gbias = sput(bias, C);
    for (int rms = 0; rms <= 1; rms++) {
        if (rms)
            cpu->rmsnorm_forward(out, rstd, sum, w, N, C, 1e-5f);
        else
            cpu->layernorm_forward(out, mean, rstd, sum, w, bias, N, C, 1e-5f);
        void *gsum = spoison(nc), *gout = spoison(nc);
        float *gmean = fpoison(N), *grstd = fpoison(N);
        gpu->residual_norm_forward(gsum, gout, gmean, grstd, ga, gb, gw, gbias, N, C, 1e-5f, rms);
        snprintf(nm, sizeof(nm), "residual+%s N%d C%d sum", rms ? "rms" : "ln", N, C);
        cmp_s(nm, gsum, sum, nc);
        snprintf(nm, sizeof(nm), "residual+%s N%d C%d out", rms ? "rms" : "ln", N, C);
        cmp_s(nm, gout, out, nc);
        cmp_f("residual+norm rstd (fp32)", grstd, rstd, N, bf ? 1e-2 : 1e-5);
        if (!rms) cmp_f("residual+norm mean (fp32)", gmean, mean, N, bf ? 1e-2 : 1e-5);
        gpu->free(gsum), gpu->free(gout), gpu->free(gmean), gpu->free(grstd);
    }
    float *x = rnd(nc, -1, 1), *W = rnd((size_t)H * C, -0.3f, 0.3f), *bb = rnd(H, -0.5f, 0.5f);
    float *pre = xmalloc(nh * 4), *act = xmalloc(nh * 4);
    cpu->linear_forward(pre, x, W, bb, N, C, H);
    for (size_t i = 0; i < nh; i++) pre[i] = round_st(pre[i]);
    cpu->gelu_forward(act, pre, nh);
    void *gx = sput(x, nc), *gW = sput(W, (size_t)H * C), *gbb = sput(bb, H);
    void *gpre = spoison(nh), *gact = spoison(nh);
    gpu->linear_gelu_forward(gact, gpre, gx, gW, gbb, N, C, H);
    snprintf(nm, sizeof(nm), "linear+gelu N%d %d->%d pre", N, C, H);
    cmp_s(nm, gpre, pre, nh);
    snprintf(nm, sizeof(nm), "linear+gelu N%d %d->%d out", N, C, H);
    cmp_s(nm, gact, act, nh);
    for (size_t i = 0; i < nh; i++) act[i] = round_st(act[i]);
    float *Wp = rnd((size_t)C * H, -0.3f, 0.3f), *dout = rnd(nc, -1, 1);
    float *dpre = xmalloc(nh * 4), *dw = rnd((size_t)C * H, -1, 1), *db = rnd(C, -1, 1);
    void *gWp = sput(Wp, (size_t)C * H), *gdout = sput(dout, nc), *gact_c = sput(act, nh);
    void *gpre_c = sput(pre, nh), *gdpre = spoison(nh), *gdw = sput(dw, (size_t)C * H), *gdb = sput(db, C);
    cpu->linear_backward_gelu(dpre, dw, db, dout, act, Wp, pre, N, H, C);
    gpu->linear_backward_gelu(gdpre, gdw, gdb, gdout, gact_c, gWp, gpre_c, N, H, C);
    snprintf(nm, sizeof(nm), "linear bwd thru gelu N%d %d->%d dpre", N, H, C);
    cmp_s(nm, gdpre, dpre, nh);
    cmp_s("linear bwd thru gelu dw (+=)", gdw, dw, (size_t)C * H);
    cmp_s("linear bwd thru gelu dbias (+=)", gdb, db, C);
    void *gbufs[] = {ga, gb, gw, gbias, gx, gW, gbb, gpre, gact, gWp, gdout, gact_c, gpre_c, gdpre,
                     gdw, gdb};
    for (size_t i = 0; i < sizeof(gbufs) / sizeof(gbufs[0]); i++) gpu->free(gbufs[i]);
    float *hbufs[] = {a, b, w, bias, sum, out, mean, rstd, x, W, bb, pre, act, Wp, dout, dpre, dw, db};
    for (size_t i = 0; i < sizeof(hbufs) / sizeof(hbufs[0]); i++) free(hbufs[i]);
}

static const char *attn_kind = ""; /* "", " tc", " cudnn": which kernels the names describe */

static void t_attention(int B, int T, int H, int KV, int hd) {
    char nm[128];
    size_t nq = (size_t)B * T * (H + 2 * KV) * hd, no = (size_t)B * T * H * hd,
           nl = (size_t)B * H * T;
    float *qkv = rnd(nq, -2, 2), *dout = rnd(no, -1, 1);
    float *out = xmalloc(no * 4), *lse = xmalloc(nl * 4), *dqkv = xmalloc(nq * 4);
    cpu->attention_forward(out, lse, qkv, B, T, H, KV, hd);
    for (size_t i = 0; i < no; i++) out[i] = round_st(out[i]); /* the backward's input */
    cpu->attention_backward(dqkv, dout, qkv, out, lse, B, T, H, KV, hd);
    void *gqkv = sput(qkv, nq), *gout = spoison(no), *gdout = sput(dout, no);
    void *gdq = spoison(nq), *gdq2 = spoison(nq), *gout_c = sput(out, no);
    float *glse = fpoison(nl), *clse = fput(lse, nl);
    gpu->attention_forward(gout, glse, gqkv, B, T, H, KV, hd);
    gpu->attention_backward(gdq, gdout, gqkv, gout_c, clse, B, T, H, KV, hd);
    gpu->attention_backward(gdq2, gdout, gqkv, gout_c, clse, B, T, H, KV, hd);
    snprintf(nm, sizeof(nm), "attention%s fwd B%d T%d H%d KV%d hd%d", attn_kind, B, T, H, KV, hd);
    cmp_s(nm, gout, out, no);
    snprintf(nm, sizeof(nm), "attention%s lse (fp32)", attn_kind);
    cmp_f(nm, glse, lse, nl, bf ? 1e-2 : 1e-5);
    snprintf(nm, sizeof(nm), "attention%s bwd B%d T%d H%d KV%d hd%d", attn_kind, B, T, H, KV, hd);
    cmp_s(nm, gdq, dqkv, nq);
    snprintf(nm, sizeof(nm), "attention%s bwd twice, same bits", attn_kind);
    same_bits(nm, gdq, gdq2, nq);
    void *bufs[] = {gqkv, gout, gdout, gdq, gdq2, gout_c, glse, clse};
    for (int i = 0; i < 8; i++) gpu->free(bufs[i]);
    free(qkv), free(dout), free(out), free(lse), free(dqkv);
}

/* Decoding token by token against the KV cache, like the CPU backend's decode_attention. */
static void t_decode(int T, int H, int KV, int hd, float theta) {
    char nm[96];
    size_t row = (size_t)(H + 2 * KV) * hd, cache = (size_t)T * KV * hd, no = (size_t)H * hd;
    float *rows = rnd((size_t)T * row, -2, 2), *ck = xmalloc(cache * 4), *cv = xmalloc(cache * 4);
    float *ref = xmalloc((size_t)T * no * 4), *got = xmalloc((size_t)T * no * 4);
    float *q = xmalloc(row * 4);
    void *gk = spoison(cache), *gv = spoison(cache), *go = spoison(no);
    for (int t = 0; t < T; t++) {
        memcpy(q, rows + (size_t)t * row, row * 4);
        cpu->decode_attention(ref + (size_t)t * no, q, ck, cv, t, H, KV, hd, theta);
        void *gq = sput(rows + (size_t)t * row, row);
        gpu->decode_attention(go, gq, gk, gv, t, H, KV, hd, theta);
        float *o = sget(go, no);
        memcpy(got + (size_t)t * no, o, no * 4);
        free(o);
        gpu->free(gq);
    }
    snprintf(nm, sizeof(nm), "decode T%d H%d KV%d hd%d theta %g", T, H, KV, hd, theta);
    cmp(nm, got, ref, (size_t)T * no);
    gpu->free(gk), gpu->free(gv), gpu->free(go);
    free(rows), free(ck), free(cv), free(ref), free(got), free(q);
}

static void t_pointwise(size_t n, int N, int Hd) {
    char nm[96];
    float *x = rnd(n, -4, 4), *g = rnd(n, -1, 1), *a = rnd(n, -1, 1);
    float *y = xmalloc(n * 4), *dx = xmalloc(n * 4), *s = xmalloc(n * 4), *sc = dup(x, n);
    cpu->gelu_forward(y, x, n);
    cpu->gelu_backward(dx, g, x, n);
    cpu->add(s, x, a, n);
    cpu->scale(sc, 0.37f, n);
    void *gx = sput(x, n), *gg = sput(g, n), *ga = sput(a, n), *gy = spoison(n), *gdx = spoison(n);
    void *gs = spoison(n), *gsc = sput(x, n), *galias = sput(x, n);
    gpu->gelu_forward(gy, gx, n);
    gpu->gelu_backward(gdx, gg, gx, n);
    gpu->add(gs, gx, ga, n);
    gpu->add(galias, galias, ga, n); /* out aliases a */
    gpu->scale(gsc, 0.37f, n);
    snprintf(nm, sizeof(nm), "gelu fwd n%zu", n);
    cmp_s(nm, gy, y, n);
    snprintf(nm, sizeof(nm), "gelu bwd n%zu", n);
    cmp_s(nm, gdx, dx, n);
    snprintf(nm, sizeof(nm), "add n%zu", n);
    cmp_s(nm, gs, s, n);
    cmp_s("add, out aliasing a", galias, s, n);
    snprintf(nm, sizeof(nm), "scale n%zu", n);
    cmp_s(nm, gsc, sc, n);
    void *bufs[] = {gx, gg, ga, gy, gdx, gs, gsc, galias};
    for (int i = 0; i < 8; i++) gpu->free(bufs[i]);
    free(x), free(g), free(a), free(y), free(dx), free(s), free(sc);

    size_t ni = (size_t)N * 2 * Hd, no = (size_t)N * Hd;
    float *in = rnd(ni, -3, 3), *d = rnd(no, -1, 1), *o = xmalloc(no * 4), *di = xmalloc(ni * 4);
    cpu->swiglu_forward(o, in, N, Hd);
    cpu->swiglu_backward(di, d, in, N, Hd);
    void *gin = sput(in, ni), *gd = sput(d, no), *go = spoison(no), *gdi = spoison(ni);
    gpu->swiglu_forward(go, gin, N, Hd);
    gpu->swiglu_backward(gdi, gd, gin, N, Hd);
    snprintf(nm, sizeof(nm), "swiglu fwd N%d Hd%d", N, Hd);
    cmp_s(nm, go, o, no);
    snprintf(nm, sizeof(nm), "swiglu bwd N%d Hd%d", N, Hd);
    cmp_s(nm, gdi, di, ni);
    gpu->free(gin), gpu->free(gd), gpu->free(go), gpu->free(gdi);
    free(in), free(d), free(o), free(di);
}

static void t_xent(int N, int V) {
    char nm[96];
    size_t n = (size_t)N * V;
    float *x = rnd(n, -6, 6), *y = dup(x, n), *loss = xmalloc(N * 4), *loss2 = xmalloc(N * 4);
    int *t = xmalloc(sizeof(int) * N);
    for (int i = 0; i < N; i++) t[i] = i == 1 ? -1 : (int)(urand() * V) % V;
    t[0] = V - 1;
    cpu->softmax_xent(y, loss, t, N, V, V, 0.25f, 1);
    int *gt = iput(t, N);
    void *gx = sput(x, n), *gx2 = sput(x, n);
    float *gl = fpoison(N), *gl2 = fpoison(N);
    gpu->softmax_xent(gx, gl, gt, N, V, V, 0.25f, 1);
    gpu->softmax_xent(gx2, gl2, gt, N, V, V, 0.25f, 0);
    snprintf(nm, sizeof(nm), "softmax_xent losses N%d V%d (one ignored)", N, V);
    cmp_f(nm, gl, loss, N, bf ? 1e-3 : 1e-5);
    cmp_f("softmax_xent losses, no gradient", gl2, loss, N, bf ? 1e-3 : 1e-5);
    cmp_s("softmax_xent gradient (in place)", gx, y, n);
    cmp_s("softmax_xent no gradient: logits untouched", gx2, x, n);
    /* rows padded to ld = V rounded up to 128, garbage in the padding: 0 there after */
    int ld = (V + 127) / 128 * 128 + 128;
    float *xp = rnd((size_t)N * ld, 50, 60), *yp = xmalloc((size_t)N * ld * 4);
    for (int i = 0; i < N; i++) memcpy(xp + (size_t)i * ld, x + (size_t)i * V, (size_t)V * 4);
    for (int i = 0; i < N; i++) {
        memcpy(yp + (size_t)i * ld, y + (size_t)i * V, (size_t)V * 4);
        for (int j = V; j < ld; j++) yp[(size_t)i * ld + j] = 0.0f;
    }
    void *gxp = sput(xp, (size_t)N * ld);
    float *glp = fpoison(N);
    gpu->softmax_xent(gxp, glp, gt, N, V, ld, 0.25f, 1);
    snprintf(nm, sizeof(nm), "softmax_xent rows padded to %d: losses", ld);
    cmp_f(nm, glp, loss, N, bf ? 1e-3 : 1e-5);
    cmp_s("softmax_xent padded: gradient, padding 0", gxp, yp, (size_t)N * ld);
    gpu->free(gxp), gpu->free(glp);
    free(xp), free(yp);
    gpu->free(gt), gpu->free(gx), gpu->free(gx2), gpu->free(gl), gpu->free(gl2);
    free(x), free(y), free(loss), free(loss2), free(t);
}

/* ---- softmax cross entropy over a vocabulary split by tensor parallelism ---------------- */

#define TP_MAX 4
/* R simulated ranks in one process: rank r holds the classes [lo[r], lo[r] + V[r]) in rows of
 * ld[r] >= V[r]; off[r] is where its (N, ld[r]) logits start in the ranks' concatenation. */
typedef struct {
    int N, R, Vt, V[TP_MAX], lo[TP_MAX], ld[TP_MAX];
    size_t off[TP_MAX + 1];
} tp_split;

static tp_split tp_make(int N, int R, const int *V, const int *pad) {
    tp_split sp = {.N = N, .R = R};
    for (int r = 0; r < R; r++) {
        sp.V[r] = V[r], sp.lo[r] = sp.Vt, sp.ld[r] = V[r] + pad[r];
        sp.Vt += V[r];
        sp.off[r + 1] = sp.off[r] + (size_t)N * sp.ld[r];
    }
    return sp;
}

/* the ranks' logits cut from full (N, Vt), garbage in the padding columns */
static float *tp_cut(const tp_split *sp, const float *full) {
    float *xs = rnd(sp->off[sp->R], 50, 60);
    for (int r = 0; r < sp->R; r++)
        for (int n = 0; n < sp->N; n++)
            memcpy(xs + sp->off[r] + (size_t)n * sp->ld[r], full + (size_t)n * sp->Vt + sp->lo[r],
                   sizeof(float) * sp->V[r]);
    return xs;
}

/* the CPU backend as R ranks would run it: every rank's stats into all (R, N, 3), rank after
 * rank (the all-gather), then every rank's finish on ys (a copy of xs); losses (R, N) */
static void tp_cpu(const tp_split *sp, float *all, float *ys, float *loss, const int *t,
                   float dscale) {
    for (int r = 0; r < sp->R; r++)
        cpu->xent_stats(all + (size_t)r * sp->N * 3, ys + sp->off[r], t, sp->lo[r], sp->N,
                        sp->V[r], sp->ld[r]);
    for (int r = 0; r < sp->R; r++)
        cpu->xent_finish(ys + sp->off[r], loss + (size_t)r * sp->N, all, sp->R, t, sp->lo[r],
                         sp->N, sp->V[r], sp->ld[r], dscale, 1);
}

/* the same on the device, each rank's logits in a buffer of its own, outputs poisoned first;
 * everything downloaded into all, ys and loss as tp_cpu lays them out */
static void tp_gpu(const tp_split *sp, float *all, float *ys, float *loss, const float *xs,
                   const int *gt, float dscale, int want_grad) {
    int N = sp->N, R = sp->R;
    float *gall = fpoison((size_t)R * N * 3), *gloss = fpoison((size_t)R * N);
    void *gx[TP_MAX];
    for (int r = 0; r < R; r++) {
        gx[r] = sput(xs + sp->off[r], sp->off[r + 1] - sp->off[r]);
        gpu->xent_stats(gall + (size_t)r * N * 3, gx[r], gt, sp->lo[r], N, sp->V[r], sp->ld[r]);
    }
    for (int r = 0; r < R; r++)
        gpu->xent_finish(gx[r], gloss + (size_t)r * N, gall, R, gt, sp->lo[r], N, sp->V[r],
                         sp->ld[r], dscale, want_grad);
    gpu->download(all, gall, sizeof(float) * R * N * 3);
    gpu->download(loss, gloss, sizeof(float) * R * N);
    for (int r = 0; r < R; r++) {
        gpu->from_storage(ys + sp->off[r], gx[r], sp->off[r + 1] - sp->off[r]);
        gpu->free(gx[r]);
    }
    gpu->free(gall), gpu->free(gloss);
}

/* stats (rows, 3) against the CPU's: a max of -inf (a rank without classes) must be -inf in
 * both, and is then left out of the norm; the math is fp32 in both dtypes, hence 1e-5 */
static void cmp_stats(const char *name, float *got, float *ref, int rows) {
    for (int i = 0; i < rows; i++)
        if (ref[3 * i] == -INFINITY) {
            got[3 * i] = got[3 * i] == -INFINITY ? 0.0f : NAN;
            ref[3 * i] = 0.0f;
        }
    cmp_t(name, got, ref, (size_t)rows * 3, 1e-5);
}

/* targets: class 0, one ignored, the last class, the first class of rank 1, then random */
static int *tp_targets(const tp_split *sp) {
    int *t = xmalloc(sizeof(int) * sp->N);
    for (int n = 0; n < sp->N; n++) t[n] = (int)(urand() * sp->Vt) % sp->Vt;
    int fixed[4] = {0, -1, sp->Vt - 1, sp->lo[1]};
    for (int n = 0; n < sp->N && n < 4; n++) t[n] = fixed[n];
    return t;
}

/* logits (N, Vt) in [-6, 6], but row 2's rank-0 classes 20 higher and row 3's last-rank ones
 * 20 higher, so that the ranks' maxima differ and exp(m_r - M) matters */
static float *tp_full(const tp_split *sp) {
    float *x = rnd((size_t)sp->N * sp->Vt, -6, 6);
    int R = sp->R;
    for (int n = 2; n < 4 && n < sp->N; n++) {
        int r = n == 2 ? 0 : R - 1;
        for (int j = sp->lo[r]; j < sp->lo[r] + sp->V[r]; j++)
            x[(size_t)n * sp->Vt + j] = round_st(x[(size_t)n * sp->Vt + j] + 20.0f);
    }
    return x;
}

static void t_xent_tp(int N, int R, const int *V, const int *pad, float dscale) {
    char nm[96], shape[48];
    tp_split sp = tp_make(N, R, V, pad);
    int len = snprintf(shape, sizeof(shape), "N%d V", N);
    for (int r = 0; r < R; r++)
        len += snprintf(shape + len, sizeof(shape) - len, "%s%d+%d", r ? "|" : "", V[r], pad[r]);
    float *full = tp_full(&sp), *xs = tp_cut(&sp, full);
    int *t = tp_targets(&sp), *gt = iput(t, N);
    size_t ns = (size_t)R * N * 3, nx = sp.off[R];
    float *call = xmalloc(ns * 4), *cy = dup(xs, nx), *closs = xmalloc((size_t)R * N * 4);
    float *gall = xmalloc(ns * 4), *gy = xmalloc(nx * 4), *gloss = xmalloc((size_t)R * N * 4);
    tp_cpu(&sp, call, cy, closs, t, dscale);
    tp_gpu(&sp, gall, gy, gloss, xs, gt, dscale, 1);
    snprintf(nm, sizeof(nm), "xent_stats %s", shape);
    cmp_stats(nm, gall, call, R * N);
    snprintf(nm, sizeof(nm), "xent_finish losses %s ds%g", shape, dscale);
    cmp_t(nm, gloss, closs, (size_t)R * N, 1e-5);
    cmp("xent_finish gradient, padding 0", gy, cy, nx);
    /* the CPU's softmax_xent over the whole vocabulary gives every rank's loss */
    float *fy = dup(full, (size_t)N * sp.Vt), *floss = xmalloc((size_t)R * N * 4);
    cpu->softmax_xent(fy, floss, t, N, sp.Vt, sp.Vt, dscale, 1);
    for (int r = 1; r < R; r++) memcpy(floss + (size_t)r * N, floss, sizeof(float) * N);
    cmp_t("xent_finish losses = softmax_xent's, unsplit", gloss, floss, (size_t)R * N, 1e-5);
    tp_gpu(&sp, gall, gy, gloss, xs, gt, dscale, 0);
    cmp_t("xent_finish losses, no gradient", gloss, closs, (size_t)R * N, 1e-5);
    cmp("xent_finish no gradient: logits untouched", gy, xs, nx);
    gpu->free(gt);
    free(full), free(xs), free(t), free(call), free(cy), free(closs), free(gall), free(gy);
    free(gloss), free(fy), free(floss);
}

/* uneven parts, padded rows (odd ld too), a rank with no classes (with and without padding),
 * one with a single class, parts longer than a block's threads */
static void t_xent_tp_all(void) {
    t_xent_tp(5, 2, (int[]){20, 17}, (int[]){0, 3}, 1.0f);
    t_xent_tp(5, 3, (int[]){400, 0, 601}, (int[]){8, 5, 0}, 0.25f);
    t_xent_tp(6, 3, (int[]){1300, 1, 1199}, (int[]){3, 7, 0}, 3.0f);
    t_xent_tp(4, 2, (int[]){0, 50}, (int[]){0, 2}, 0.5f);
}

static void t_optim(size_t n) {
    char nm[96];
    float *g = rnd(n, -1, 1), *p = rnd(n, -1, 1), *m = rnd(n, -0.1f, 0.1f), *v = rnd(n, 0, 0.01f);
    double ss = cpu->sumsq(g, n);
    float *cp = dup(p, n), *cm = dup(m, n), *cv = dup(v, n);
    cpu->adamw(cp, cp, g, cm, cv, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.19f, 0.0975f, 0.5f);
    void *gg = sput(g, n);
    float *gp = fput(p, n), *gm = fput(m, n), *gv = fput(v, n);
    void *gparam = bf ? spoison(n) : (void *)gp;
    double gs = gpu->sumsq(gg, n), gs2 = gpu->sumsq(gg, n);
    gpu->adamw(gp, gparam, gg, gm, gv, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.19f, 0.0975f, 0.5f);
    float a = (float)gs, b = (float)ss;
    snprintf(nm, sizeof(nm), "sumsq n%zu", n);
    cmp_t(nm, &a, &b, 1, 1e-6);
    n_check++;
    n_fail += gs != gs2;
    printf("%s %-5s %-46s bitwise identical\n", gs == gs2 ? "ok  " : "FAIL", bf ? "bf16" : "fp32",
           "sumsq twice, same bits");
    snprintf(nm, sizeof(nm), "adamw master n%zu", n);
    cmp_f(nm, gp, cp, n, 1e-5);
    cmp_f("adamw m", gm, cm, n, 1e-5);
    cmp_f("adamw v", gv, cv, n, 1e-5);
    if (bf) {
        for (size_t i = 0; i < n; i++) cp[i] = round_st(cp[i]);
        cmp_s("adamw bf16 working copy = rounded master", gparam, cp, n);
        gpu->free(gparam);
    }
    /* the same step through adamw_multi, the tensor cut into 3 stretches (the middle one
       without decay, an odd offset so some stretches are not 16-byte aligned) */
    float *cp2 = dup(p, n), *cm2 = dup(m, n), *cv2 = dup(v, n);
    size_t cut[4] = {0, n / 3 + 1, 2 * n / 3, n};
    float *gp2 = fput(p, n), *gm2 = fput(m, n), *gv2 = fput(v, n);
    void *gparam2 = bf ? spoison(n) : (void *)gp2;
    tr_adamw_seg sg[3];
    for (int k = 0; k < 3; k++) {
        size_t o = cut[k], len = cut[k + 1] - cut[k];
        float wd = k == 1 ? 0.0f : 0.1f;
        cpu->adamw(cp2 + o, cp2 + o, g + o, cm2 + o, cv2 + o, len, 1e-2f, 0.9f, 0.95f, 1e-8f, wd,
                   0.19f, 0.0975f, 0.5f);
        sg[k] = (tr_adamw_seg){gp2 + o, tr_buf_at(gpu, gparam2, o), tr_buf_at(gpu, gg, o), gm2 + o,
                               gv2 + o, len, wd};
    }
    for (int rep = 0; rep < 2; rep++) { /* twice: the second call reuses the uploaded tables */
        if (rep) { /* undo: the same inputs again */
            gpu->upload(gp2, p, n * 4), gpu->upload(gm2, m, n * 4), gpu->upload(gv2, v, n * 4);
        }
        gpu->adamw_multi(sg, 3, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.19f, 0.0975f, 0.5f);
    }
    /* tables that change from call to call, with no wait between: the tensor cut in 2, then
       in 3 again; each call rewrites the host tables while the previous call's upload of
       them may still be queued (the wait at cuda.ms_tables keeps them apart) */
    tr_adamw_seg two[2];
    size_t half = n / 2;
    for (int k = 0; k < 2; k++) {
        size_t o = k ? half : 0, len = k ? n - half : half;
        cpu->adamw(cp2 + o, cp2 + o, g + o, cm2 + o, cv2 + o, len, 1e-2f, 0.9f, 0.95f, 1e-8f,
                   0.1f, 0.19f, 0.0975f, 0.5f);
        two[k] = (tr_adamw_seg){gp2 + o, tr_buf_at(gpu, gparam2, o), tr_buf_at(gpu, gg, o),
                                gm2 + o, gv2 + o, len, 0.1f};
    }
    for (int k = 0; k < 3; k++) {
        size_t o = cut[k], len = cut[k + 1] - cut[k];
        cpu->adamw(cp2 + o, cp2 + o, g + o, cm2 + o, cv2 + o, len, 1e-2f, 0.9f, 0.95f, 1e-8f,
                   k == 1 ? 0.0f : 0.1f, 0.19f, 0.0975f, 0.5f);
    }
    gpu->adamw_multi(two, 2, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.19f, 0.0975f, 0.5f);
    gpu->adamw_multi(sg, 3, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.19f, 0.0975f, 0.5f);
    snprintf(nm, sizeof(nm), "adamw_multi master n%zu (3 steps)", n);
    cmp_f(nm, gp2, cp2, n, 1e-5);
    cmp_f("adamw_multi m", gm2, cm2, n, 1e-5);
    cmp_f("adamw_multi v", gv2, cv2, n, 1e-5);
    if (bf) {
        for (size_t i = 0; i < n; i++) cp2[i] = round_st(cp2[i]);
        cmp_s("adamw_multi bf16 working copy", gparam2, cp2, n);
        gpu->free(gparam2);
    }
    gpu->free(gp2), gpu->free(gm2), gpu->free(gv2);
    free(cp2), free(cm2), free(cv2);
    gpu->free(gg), gpu->free(gp), gpu->free(gm), gpu->free(gv);
    free(g), free(p), free(m), free(v), free(cp), free(cm), free(cv);
}

static void run_all(tr_dtype dt) {
    char why[256];
    gpu = tr_backend_cuda(dt, why, sizeof(why));
    bf = dt == TR_DTYPE_BF16;
    tol = bf ? 1e-2 : 1e-5;
    printf("== %s\n", gpu->name);
    tr_backend_set_simple_attention(1); /* the CUDA-core kernels; the tensor-core ones below */
    t_linear(37, 100, 72, 1);
    t_linear(64, 128, 256, 1);
    t_linear(5, 24, 8, 0);
    t_embedding(50, 72, 13, 0);
    t_embedding(50, 72, 13, 1);
    t_embedding(20, 64, 13, 2);
    t_embedding(300, 128, 40, 0);
    t_positions(3, 11, 40);
    t_positions(2, 16, 64);
    t_norms(37, 72);
    t_norms(300, 100);
    t_norms(64, 768);
    t_rope(2, 9, 4, 2, 16);
    t_rope(1, 33, 2, 1, 6);
    t_attention(2, 16, 4, 4, 8);
    t_attention(2, 77, 4, 2, 24);
    t_attention(1, 130, 2, 2, 64);
    t_attention(1, 65, 2, 1, 128);
    t_attention(1, 200, 6, 2, 80);
    if (bf) { /* the tensor-core kernels (bf16, hd 64 and 128): tiles of 64, ragged ends, GQA */
        tr_backend_set_simple_attention(0);
        attn_kind = " tc";
        t_attention(1, 130, 2, 2, 64);
        t_attention(1, 65, 2, 1, 128);
        t_attention(2, 64, 4, 2, 64);
        if (!quick) t_attention(1, 1024, 2, 2, 64);
        t_attention(1, 257, 4, 1, 128);
        tr_backend_set_simple_attention(1);
        attn_kind = "";
    }
    t_decode(20, 4, 2, 16, 10000.0f);
    t_decode(9, 2, 1, 64, 0.0f);
    t_pointwise(1001, 7, 37);
    t_pointwise(4096, 16, 64);
    t_xent(6, 1001);
    t_xent(3, 50257);
    t_xent_tp_all();
    t_fusions(37, 72, 100);  /* 100: not a multiple of 8, the unfused fallback */
    t_fusions(256, 768, 3072); /* GPT-2's MLP: the epilogues */
    t_optim(1001);
    t_optim(300000);
}

/* The attention op on cuDNN (model/cuda/cuda_attention_cudnn.cu, bf16 only) against the CPU
 * on the shapes above that cuDNN takes (head sizes multiples of 8): GQA, ragged T, hd 8 to
 * 128; then TR_CUDA_ATTENTION=auto, which times ours and cuDNN's and keeps one. */
static void run_cudnn(void) {
    char why[256];
    gpu = tr_backend_cuda(TR_DTYPE_BF16, why, sizeof(why));
    bf = 1;
    tol = 1e-2;
    printf("== %s, attention on cuDNN\n", gpu->name);
    tr_backend_set_attention(TR_ATTENTION_CUDNN);
    attn_kind = " cudnn";
    t_attention(2, 16, 4, 4, 8);
    t_attention(2, 77, 4, 2, 24);
    t_attention(1, 130, 2, 2, 64);
    t_attention(1, 65, 2, 1, 128);
    t_attention(2, 64, 4, 2, 64);
    tr_backend_set_attention(TR_ATTENTION_AUTO);
    attn_kind = " auto";
    t_attention(1, 48, 4, 2, 32);
    t_attention(1, 48, 4, 2, 32); /* the shape's choice is kept: no second measurement */
    tr_backend_set_attention(TR_ATTENTION_TC);
    attn_kind = "";
}

int main(void) {
    char why[256];
    if (!tr_backend_cuda(TR_DTYPE_BF16, why, sizeof(why))) {
        printf("SKIP test_cuda_kernels: %s\n", why);
        return 77;
    }
    cpu = tr_backend_cpu();
    const char *q = getenv("TR_TEST_QUICK");
    quick = q && strcmp(q, "1") == 0;
    if (getenv("TR_TEST_CUDNN")) /* test_cudnn_attention_emu: that implementation only */
        run_cudnn();
    else
        run_all(TR_DTYPE_F32), run_all(TR_DTYPE_BF16);
    printf("%s: %d of %d checks failed\n", n_fail ? "FAIL" : "PASS", n_fail, n_check);
    return n_fail ? 1 : 0;
}
