/* The table of operations every backend implements (model/cpu/ today, model/cuda/ next).
 * Layers call only this table, never a backend directly. All tensors are row-major; pointers
 * name memory of the backend that owns the table (host memory for the CPU backend).
 *
 * Conventions, shared by every backend and checked by tests/test_kernels.c:
 *  - N = B*T rows (tokens); C = model width; hd = head size; H query heads, KV key/value heads.
 *  - A linear layer's weight is (OC, IC), PyTorch's layout: out = inp @ w^T + bias.
 *  - Gradients of parameters ACCUMULATE (+=) so micro-batches add up; gradients of activations
 *    (dinp, dqkv, ...) are OVERWRITTEN.
 *  - qkv rows are [q (H*hd) | k (KV*hd) | v (KV*hd)]; query head h reads kv head h / (H/KV). */
#ifndef TR_BACKEND_H
#define TR_BACKEND_H

#include <stddef.h>

typedef struct tr_backend {
    const char *name;

    /* memory */
    void *(*alloc)(size_t bytes); /* zeroed, 64-byte aligned; NULL on failure */
    void (*free)(void *p);
    void (*upload)(void *dst, const void *src, size_t bytes);   /* host -> backend */
    void (*download)(void *dst, const void *src, size_t bytes); /* backend -> host */
    void (*zero)(void *p, size_t bytes);

    /* out(N,OC) = inp(N,IC) @ w(OC,IC)^T + bias(OC); bias may be NULL */
    void (*linear_forward)(float *out, const float *inp, const float *w, const float *bias, int N,
                           int IC, int OC);
    /* dinp(N,IC) = dout(N,OC) @ w (skipped when dinp is NULL); dw(OC,IC) += dout^T @ inp;
     * dbias(OC) += column sums of dout (skipped when dbias is NULL) */
    void (*linear_backward)(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int IC, int OC);

    /* out(N,C) = wte[tokens[n]] */
    void (*embedding_forward)(float *out, const int *tokens, const float *wte, int N, int C);
    /* dwte[tokens[n]] += dout[n]; deterministic (no ordering-dependent sums) */
    void (*embedding_backward)(float *dwte, const float *dout, const int *tokens, int N, int C);
    /* x(B,T,C) += wpe[t] (in place) */
    void (*positions_forward)(float *x, const float *wpe, int B, int T, int C);
    /* dwpe[t] += sum_b dx[b,t] */
    void (*positions_backward)(float *dwpe, const float *dx, int B, int T, int C);

    /* LayerNorm over the last dim: out = (inp - mean) * rstd * w + b; b may be NULL.
     * mean, rstd (N) are saved for the backward. */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C, float eps);
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C);
    /* RMSNorm: out = inp * rstd * w, rstd = 1/sqrt(mean(inp^2) + eps) */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *w, int N,
                            int C, float eps);
    void (*rmsnorm_backward)(float *dinp, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, int N, int C);

    /* Rotary embedding in place on the q and k parts of qkv (B,T,(H+2KV)*hd), the
     * "rotate half" convention: pairs (i, i + hd/2), angle t * theta^(-2i/hd). The backward
     * rotates the gradient back (in place on dqkv). */
    void (*rope_forward)(float *qkv, int B, int T, int H, int KV, int hd, float theta);
    void (*rope_backward)(float *dqkv, int B, int T, int H, int KV, int hd, float theta);

    /* Causal attention, scale 1/sqrt(hd). out (B,T,H*hd); lse (B,H,T) the log-sum-exp of each
     * query's scaled scores, saved for the backward. Never holds more than a tile of the T*T
     * scores per thread. */
    void (*attention_forward)(float *out, float *lse, const float *qkv, int B, int T, int H,
                              int KV, int hd);
    /* dqkv (B,T,(H+2KV)*hd) overwritten */
    void (*attention_backward)(float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, int B, int T, int H, int KV, int hd);

    /* GELU, tanh approximation */
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    void (*gelu_backward)(float *dinp, const float *dout, const float *inp, size_t n);
    /* inp (N, 2*Hd) = [gate | up]; out (N, Hd) = silu(gate) * up */
    void (*swiglu_forward)(float *out, const float *inp, int N, int Hd);
    void (*swiglu_backward)(float *dinp, const float *dout, const float *inp, int N, int Hd);

    /* out = a + b (out may alias a or b) */
    void (*add)(float *out, const float *a, const float *b, size_t n);

    /* Softmax cross entropy over V classes, in place: logits (N,V) become
     * dloss/dlogits * dscale (only when want_grad), losses (N) get -log p[target].
     * A target < 0 is ignored (loss 0, gradient 0). */
    void (*softmax_xent)(float *logits, float *losses, const int *targets, int N, int V,
                         float dscale, int want_grad);

    /* sum of squares, accumulated in double */
    double (*sumsq)(const float *x, size_t n);
    void (*scale)(float *x, float s, size_t n);
    /* PyTorch AdamW on n elements: p -= lr*wd*p; g' = g*gscale; m,v updated; p -= lr * mhat /
     * (sqrt(vhat) + eps), with mhat = m/bc1, vhat = v/bc2 (bc = 1 - beta^t). */
    void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                  float beta2, float eps, float wd, float bc1, float bc2, float gscale);
} tr_backend;

/* The CPU backend (model/cpu/): fp32, OpenMP, BLAS. */
const tr_backend *tr_backend_cpu(void);

#endif
