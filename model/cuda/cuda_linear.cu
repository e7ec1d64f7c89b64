/* Linear layers on cuBLASLt: row-major products expressed as column-major ones (a row-major
 * (R, C) matrix is a column-major (C, R) one), bf16 or fp32 operands with fp32 accumulation
 * (CUBLAS_COMPUTE_32F: no TF32, so the fp32 backend matches the CPU), the bias fused into the
 * forward's epilogue. Plans (descriptors + the heuristic's algorithm) are cached per shape. */
#include <cublasLt.h>
#include <stdio.h>
#include <string.h>

#include "model/cuda/cuda_private.h"

#define WORKSPACE_BYTES TR_WS_CUBLASLT_BYTES /* backend.h: the workspace plan counts it */
#define PLANS 128

static cublasLtHandle_t lt;
static void *workspace;

static void ck_lt(cublasStatus_t st, const char *what, const char *file, int line) {
    if (st != CUBLAS_STATUS_SUCCESS) tr_cuda_fail(what, cublasLtGetStatusString(st), file, line);
}
#define CKL(call) ck_lt((call), #call, __FILE__, __LINE__)

/* Epilogues beyond the bias: GELU (its input kept in the aux matrix) and GELU's gradient
 * (the product times gelu'(aux)). */
enum { EPI_NONE = 0, EPI_GELU_AUX, EPI_DGELU };

/* Everything the heuristic's choice depends on. */
typedef struct {
    int bf, ta, tb, m, n, k, lda, ldb, ldc, bias, epi;
    float beta;
    unsigned align[5]; /* bytes: A, B, C(=D), the bias, the aux matrix (the heuristic's choice
                          depends on them: it reads the pointers set on the descriptor) */
} plan_key;

typedef struct {
    plan_key key;
    int used;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    int none; /* the heuristic found nothing (epilogue plans: the caller falls back) */
} plan;

static plan plans[PLANS];
static int next_victim;

static unsigned align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    unsigned al = 256;
    while (al > 1 && a % al) al >>= 1;
    return al;
}

extern "C" int tr_cuda_linear_init(char *why, size_t whylen) {
    if (lt) return 0;
    cublasStatus_t st = cublasLtCreate(&lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, whylen, "cublasLtCreate failed: %s", cublasLtGetStatusString(st));
        lt = NULL;
        return -1;
    }
    cudaError_t e = tr_cuda_malloc(&workspace, WORKSPACE_BYTES);
    if (e != cudaSuccess) {
        snprintf(why, whylen, "cannot allocate the cuBLASLt workspace: %s", cudaGetErrorString(e));
        cublasLtDestroy(lt);
        lt = NULL;
        return -1;
    }
    return 0;
}

static void plan_free(plan *p) {
    if (!p->used) return;
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatmulDescDestroy(p->desc);
    p->used = 0;
}

static plan *plan_get(const plan_key *k, const void *bias, const void *aux) {
    for (int i = 0; i < PLANS; i++)
        if (plans[i].used && !memcmp(&plans[i].key, k, sizeof(*k))) return &plans[i];
    plan *p = NULL;
    for (int i = 0; i < PLANS && !p; i++)
        if (!plans[i].used) p = &plans[i];
    if (!p) { /* full: replace round-robin (shapes in a run are few; this is a safety net) */
        p = &plans[next_victim];
        next_victim = (next_victim + 1) % PLANS;
        plan_free(p);
    }
    memset(p, 0, sizeof(*p));
    p->key = *k;
    cudaDataType_t dt = k->bf ? CUDA_R_16BF : CUDA_R_32F;
    CKL(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CKL(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CKL(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasLtEpilogue_t epi = k->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (k->epi == EPI_GELU_AUX)
        epi = k->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    else if (k->epi == EPI_DGELU)
        epi = CUBLASLT_EPILOGUE_DGELU;
    CKL(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (k->epi != EPI_NONE) { /* the aux matrix is laid out like D */
        int64_t ld = k->ldc;
        int32_t adt = (int32_t)dt;
        CKL(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                           sizeof(ld)));
        CKL(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                                           &adt, sizeof(adt)));
    }
    /* the heuristic derives the pointers' alignment from the values set here (which is why
       their alignments are part of the key) */
    if (k->bias)
        CKL(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                           sizeof(bias)));
    if (k->epi != EPI_NONE)
        CKL(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                           sizeof(aux)));
    if (k->bias)
        CKL(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &dt,
                                           sizeof(dt)));
    /* column-major: op(A) is (m, k), op(B) is (k, n), C and D are (m, n) */
    CKL(cublasLtMatrixLayoutCreate(&p->la, dt, k->ta ? k->k : k->m, k->ta ? k->m : k->k, k->lda));
    CKL(cublasLtMatrixLayoutCreate(&p->lb, dt, k->tb ? k->n : k->k, k->tb ? k->k : k->n, k->ldb));
    CKL(cublasLtMatrixLayoutCreate(&p->lc, dt, k->m, k->n, k->ldc));

    cublasLtMatmulPreference_t pref;
    CKL(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = WORKSPACE_BYTES;
    CKL(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                             sizeof(ws)));
    /* no in-place split-K reduction: its order is not fixed, and every product must be
     * bitwise reproducible */
    uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
    CKL(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                             &scheme, sizeof(scheme)));
    cublasLtMatmulPreferenceAttributes_t al[4] = {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) {
        uint32_t a = k->align[i < 3 ? i : 2];
        CKL(cublasLtMatmulPreferenceSetAttribute(pref, al[i], &a, sizeof(a)));
    }
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t hst = cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->la, p->lb, p->lc, p->lc,
                                                        pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hst != CUBLAS_STATUS_SUCCESS && hst != CUBLAS_STATUS_NOT_SUPPORTED)
        ck_lt(hst, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    if (hst != CUBLAS_STATUS_SUCCESS) found = 0; /* not supported: no algorithm */
    if (found < 1 && k->epi != EPI_NONE) { /* remembered, so the caller falls back at once */
        p->none = 1;
        p->used = 1;
        return p;
    }
    if (found < 1) {
        char what[160];
        snprintf(what, sizeof(what), "cuBLASLt heuristic for m=%d n=%d k=%d ta=%d tb=%d bf16=%d", k->m,
                 k->n, k->k, k->ta, k->tb, k->bf);
        tr_cuda_fail(what, "no algorithm found", __FILE__, __LINE__);
    }
    p->algo = res.algo;
    p->used = 1;
    return p;
}

/* Column-major D(m, n) = epilogue(op(A) @ op(B) + beta * D (+ bias(m) broadcast along n)),
 * aux the epilogue's extra (m, n) matrix. Returns -1 (nothing done) when an epilogue plan has
 * no algorithm. */
static int matmul_epi(int bf, int epi, int ta, int tb, int m, int n, int k, const void *A,
                      int lda, const void *B, int ldb, void *C, int ldc, float beta,
                      const void *bias, const void *aux) {
    plan_key key;
    memset(&key, 0, sizeof(key)); /* padding too: keys are compared with memcmp */
    key.bf = bf, key.ta = ta, key.tb = tb, key.m = m, key.n = n, key.k = k;
    key.lda = lda, key.ldb = ldb, key.ldc = ldc, key.bias = bias != NULL, key.beta = beta;
    key.epi = epi;
    key.align[0] = align_of(A), key.align[1] = align_of(B), key.align[2] = align_of(C);
    key.align[3] = bias ? align_of(bias) : 0, key.align[4] = aux ? align_of(aux) : 0;
    plan *p = plan_get(&key, bias, aux);
    if (p->none) return -1;
    if (bias)
        CKL(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                           sizeof(bias)));
    if (epi != EPI_NONE)
        CKL(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                           sizeof(aux)));
    float alpha = 1.0f;
    CKL(cublasLtMatmul(lt, p->desc, &alpha, A, p->la, B, p->lb, &beta, C, p->lc, C, p->lc, &p->algo,
                       workspace, WORKSPACE_BYTES, tr_cuda_stream));
    return 0;
}

static void matmul(int bf, int ta, int tb, int m, int n, int k, const void *A, int lda,
                   const void *B, int ldb, void *C, int ldc, float beta, const void *bias) {
    matmul_epi(bf, EPI_NONE, ta, tb, m, n, k, A, lda, B, ldb, C, ldc, beta, bias, NULL);
}

/* out(N, OC) = inp(N, IC) @ w(OC, IC)^T + bias: column-major out^T(OC, N) = w^T... i.e.
 * op(A) = (w as col-major (IC, OC))^T, B = inp as col-major (IC, N). */
extern "C" void tr_cuda_linear_forward(int bf, tr_buf *out, const tr_buf *inp, const tr_buf *w,
                                       const tr_buf *bias, int N, int IC, int OC) {
    matmul(bf, 1, 0, OC, N, IC, w, IC, inp, IC, out, OC, 0.0f, bias);
}

extern "C" void tr_cuda_linear_backward(int bf, tr_buf *dinp, tr_buf *dw, tr_buf *dbias,
                                        const tr_buf *dout, const tr_buf *inp, const tr_buf *w,
                                        int N, int IC, int OC) {
    /* dinp(N, IC) = dout(N, OC) @ w(OC, IC): col-major dinp^T(IC, N) = w^T(IC, OC) dout^T(OC, N) */
    if (dinp) matmul(bf, 0, 0, IC, N, OC, w, IC, dout, OC, dinp, IC, 0.0f, NULL);
    /* dw(OC, IC) += dout^T @ inp: col-major dw^T(IC, OC) += inp^T(IC, N) (dout^T(OC, N))^T */
    if (dw) matmul(bf, 0, 1, IC, OC, N, inp, IC, dout, OC, dw, IC, 1.0f, NULL);
    /* dbias: our own fixed-order column sum (the BGRAD epilogues overwrite instead of adding) */
    if (dbias) tr_cuda_colsum(bf, dbias, NULL, dout, NULL, NULL, NULL, N, OC, 0);
}

/* The aux matrix needs a leading dimension that is a multiple of 8 and 16-byte alignment;
 * otherwise (or when cuBLASLt has no kernel for the epilogue) the parts run one by one. */
static int epi_ok(int ld, const void *aux) {
    return ld % 8 == 0 && align_of(aux) >= 16;
}

/* pre = inp @ w^T + bias, out = gelu(pre) (tanh form): one product with the GELU epilogue */
extern "C" void tr_cuda_linear_gelu_forward(int bf, tr_buf *out, tr_buf *pre, const tr_buf *inp,
                                            const tr_buf *w, const tr_buf *bias, int N, int IC,
                                            int OC) {
    if (epi_ok(OC, pre) && matmul_epi(bf, EPI_GELU_AUX, 1, 0, OC, N, IC, w, IC, inp, IC, out, OC,
                                      0.0f, bias, pre) == 0)
        return;
    tr_cuda_linear_forward(bf, pre, inp, w, bias, N, IC, OC);
    tr_cuda_gelu_forward(bf, out, pre, (size_t)N * (size_t)OC);
}

/* linear_backward whose dinp goes back through the GELU that made inp: dinp = (dout @ w) *
 * gelu'(pre), the product's DGELU epilogue */
extern "C" void tr_cuda_linear_backward_gelu(int bf, tr_buf *dinp, tr_buf *dw, tr_buf *dbias,
                                             const tr_buf *dout, const tr_buf *inp,
                                             const tr_buf *w, const tr_buf *pre, int N, int IC,
                                             int OC) {
    if (!(epi_ok(IC, pre) && matmul_epi(bf, EPI_DGELU, 0, 0, IC, N, OC, w, IC, dout, OC, dinp, IC,
                                        0.0f, NULL, pre) == 0)) {
        matmul(bf, 0, 0, IC, N, OC, w, IC, dout, OC, dinp, IC, 0.0f, NULL);
        tr_cuda_gelu_backward(bf, dinp, dinp, pre, (size_t)N * (size_t)IC);
    }
    tr_cuda_linear_backward(bf, NULL, dw, dbias, dout, inp, w, N, IC, OC);
}
