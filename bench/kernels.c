/* Micro-benchmark of the CPU backend's non-GEMM kernels at the sizes of the two target models
 * (small GPT: C=256, T=128, B=64; GPT-2 124M: C=768, T=256, B=4). Prints ms per call and, for
 * attention, GFLOP/s counting causal FLOPs: fwd 2*2*B*H*(T*T/2)*hd, bwd 2.5x fwd. */
#include "model/backend.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

static const tr_backend *be_g;
static float *frand_vec(size_t n, float amp) {
    float *p = getenv("BENCH_MALLOC") ? malloc(sizeof(float) * n) : be_g->alloc(sizeof(float) * n);
    if (!p) exit(2);
    for (size_t i = 0; i < n; i++) p[i] = amp * ((float)rand() / RAND_MAX * 2 - 1);
    return p;
}

/* best of reps, after one warm-up call */
#define TIME_BEST(best, reps, stmt)                                                            \
    do {                                                                                       \
        stmt;                                                                                  \
        best = 1e30;                                                                           \
        for (int r_ = 0; r_ < (reps); r_++) {                                                  \
            double t0_ = omp_get_wtime();                                                      \
            stmt;                                                                              \
            double dt_ = omp_get_wtime() - t0_;                                                \
            best = dt_ < best ? dt_ : best;                                                    \
        }                                                                                      \
    } while (0)

static void bench_attention(const tr_backend *be, int B, int T, int H, int KV, int hd) {
    int S = (H + 2 * KV) * hd;
    float *qkv = frand_vec((size_t)B * T * S, 1.0f), *dout = frand_vec((size_t)B * T * H * hd, 1);
    float *out = malloc(sizeof(float) * B * T * H * hd), *lse = malloc(sizeof(float) * B * H * T);
    float *dqkv = malloc(sizeof(float) * B * T * S);
    double tf, tb;
    TIME_BEST(tf, 20, be->attention_forward(out, lse, qkv, B, T, H, KV, hd));
    TIME_BEST(tb, 20, be->attention_backward(dqkv, dout, qkv, out, lse, B, T, H, KV, hd));
    double ff = 2.0 * 2.0 * B * H * ((double)T * T / 2) * hd, fb = 2.5 * ff;
    printf("attention B=%d T=%d H=%d KV=%d hd=%-3d fwd %7.3f ms %6.1f GFLOP/s  bwd %7.3f ms %6.1f "
           "GFLOP/s  fwd+bwd %7.3f ms %6.1f GFLOP/s\n",
           B, T, H, KV, hd, tf * 1e3, ff / tf * 1e-9, tb * 1e3, fb / tb * 1e-9, (tf + tb) * 1e3,
           (ff + fb) / (tf + tb) * 1e-9);
    free(qkv), free(dout), free(out), free(lse), free(dqkv);
}

static void bench_pointwise(const tr_backend *be, int N, int C, int V) {
    size_t n4 = (size_t)N * 4 * C;
    float *x = frand_vec(n4, 3), *y = frand_vec(n4, 1), *g = frand_vec(n4, 1);
    float *w = frand_vec(C, 1), *b = frand_vec(C, 1), *mean = malloc(sizeof(float) * N);
    float *rstd = malloc(sizeof(float) * N), *dw = frand_vec(C, 1), *db = frand_vec(C, 1);
    double t;
    printf("N=%d C=%d:", N, C);
    TIME_BEST(t, 20, be->layernorm_forward(y, mean, rstd, x, w, b, N, C, 1e-5f));
    printf(" ln fwd %.3f ms,", t * 1e3);
    TIME_BEST(t, 20, be->layernorm_backward(y, dw, db, g, x, w, mean, rstd, N, C));
    printf(" ln bwd %.3f ms,", t * 1e3);
    TIME_BEST(t, 20, be->gelu_forward(y, x, n4));
    printf(" gelu fwd (N,4C) %.3f ms,", t * 1e3);
    TIME_BEST(t, 20, be->gelu_backward(y, g, x, n4));
    printf(" gelu bwd %.3f ms,", t * 1e3);
    TIME_BEST(t, 20, be->add(y, x, g, (size_t)N * C));
    printf(" add %.3f ms\n", t * 1e3);
    free(x), free(y), free(g), free(w), free(b), free(mean), free(rstd), free(dw), free(db);
    int *tg = malloc(sizeof(int) * N);
    for (int i = 0; i < N; i++) tg[i] = i % V;
    float *lg = frand_vec((size_t)N * V, 5), *loss = malloc(sizeof(float) * N);
    TIME_BEST(t, 5, be->softmax_xent(lg, loss, tg, N, V, V, 1.0f / N, 1));
    printf("softmax_xent N=%d V=%d: %.3f ms\n", N, V, t * 1e3);
    free(tg), free(lg), free(loss);
}

int main(void) {
    const tr_backend *be = be_g = tr_backend_cpu();
    printf("threads: %d\n", omp_get_max_threads());
    bench_attention(be, 8, 256, 4, 4, 64);
    bench_attention(be, 4, 256, 12, 12, 64);
    bench_attention(be, 64, 128, 4, 4, 64);
    bench_attention(be, 4, 1024, 4, 4, 32);
    bench_attention(be, 4, 256, 12, 4, 128);
    bench_attention(be, 8, 64, 8, 8, 32);
    bench_pointwise(be, 64 * 128, 256, 50257 / 8);
    bench_pointwise(be, 4 * 256, 768, 50257);
    return 0;
}
