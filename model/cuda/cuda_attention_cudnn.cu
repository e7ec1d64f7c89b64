/* Causal attention on cuDNN's fused attention engines, through the backend graph C API (no
 * cudnn-frontend): a second implementation of the attention op beside ours (cuda_attention.cu,
 * cuda_attention_tc.cu), same contract: qkv rows [q (H*hd) | k (KV*hd) | v (KV*hd)], query head h
 * reads kv head h / (H/KV), scale 1/sqrt(hd), out (B,T,H*hd), lse (B,H,T) fp32 natural-log
 * log-sum-exp of the scaled scores; the backward overwrites dqkv. bf16 storage only.
 *
 * The graphs are the fused SDPA patterns (cuDNN Developer Guide, "Fused Flash Attention
 * fprop/bprop"), written op by op as cudnn-frontend's composite SDPA nodes lay them out, which
 * the engines match exactly (cuDNN 9.14 on an H200 found no engine for a graph whose P was
 * fp32 before the second product, 2026-12-04):
 *   forward:  S = Q K^T, S *= scale, causal mask (GEN_INDEX row, col into INT32; CMP_GE in
 *             BOOLEAN; BINARY_SELECT with -inf), softmax with stats (MAX, SUB, EXP, sum, LOG,
 *             ADD -> Stats; DIV -> P in bf16, the I/O type), O = P V
 *   backward: D = sum(dO * O) * 1 (fp32, in the workspace); S, scale, mask as above,
 *             P = EXP(S - Stats), dV = (P^T in bf16) dO, dP = dO V^T, dS = (dP - D) * P *
 *             scale, dK = (dS^T in bf16) Q, dQ = dS K into an fp32 accumulator in the
 *             workspace, then IDENTITY into dQ; K is K^T's RESHAPE. With GQA, dK and dV per
 *             query head (virtual, bf16) are folded onto kv heads by a reduction.
 * Q, K^T, V^T, dQ, dK, dV are strided views straight into qkv / dqkv (no copies). Plans are
 * built once per shape and kept; the workspace is one block (the plan's own, then D and dQ's
 * accumulator), sized by tr_cuda_attention_cudnn_workspace.
 *
 * Selection (TR_CUDA_ATTENTION, model/backend.c): cudnn uses this for bf16; auto times both on
 * the run's shapes at the first call and keeps the faster, after checking the two agree. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/cuda_private.h"
#include "model/mutant.h"

static char cd_why[512];

static size_t up256(size_t x) {
    return (x + 255) & ~(size_t)255;
}

extern "C" const char *tr_cuda_attention_cudnn_error(void) {
    return cd_why;
}

#ifndef TR_HAVE_CUDNN

extern "C" int tr_cuda_attention_cudnn_available(void) {
    snprintf(cd_why, sizeof(cd_why), "this build has no cuDNN (CMake did not find it)");
    return 0;
}
extern "C" size_t tr_cuda_attention_cudnn_workspace(int B, int T, int H, int KV, int hd) {
    tr_cuda_attention_cudnn_available();
    return 0;
}
extern "C" int tr_cuda_attention_cudnn_forward(tr_buf *out, float *lse, const tr_buf *qkv, int B,
                                               int T, int H, int KV, int hd) {
    tr_cuda_attention_cudnn_available();
    return -1;
}
extern "C" int tr_cuda_attention_cudnn_backward(tr_buf *dqkv, const tr_buf *dout, const tr_buf *qkv,
                                                const tr_buf *out, const float *lse, int B, int T,
                                                int H, int KV, int hd) {
    tr_cuda_attention_cudnn_available();
    return -1;
}

#else

#include <cudnn_graph.h>

static cudnnHandle_t cd_handle;
static int cd_state; /* 0 untried, 1 ready, -1 failed (cd_why) */

/* Unique ids of the graphs' tensors: the ones with memory (variant pack), then virtual ones. */
enum {
    U_Q = 1,
    U_K,
    U_KT,
    U_V,
    U_VT,
    U_O,
    U_STATS,
    U_SCALE,
    U_NINF,
    U_DO,
    U_DQ,
    U_DK,
    U_DV,
    U_DSUM,
    U_DQACC,
    U_ONE,
    U_VIRT = 100
};

/* ---- building descriptors: the first failure is kept in cd_why, later calls are no-ops ---- */

#define MAX_DESC 128
typedef struct {
    cudnnBackendDescriptor_t d[MAX_DESC];
    int n, bad, next_virt;
} builder;

static void ck(builder *b, cudnnStatus_t s, const char *what) {
    if (s == CUDNN_STATUS_SUCCESS || b->bad) return;
    b->bad = 1;
    snprintf(cd_why, sizeof(cd_why), "cuDNN: %s failed: %s (%d)", what, cudnnGetErrorString(s),
             (int)s);
}
static cudnnBackendDescriptor_t make(builder *b, cudnnBackendDescriptorType_t t) {
    cudnnBackendDescriptor_t d = NULL;
    if (b->bad) return NULL;
    if (b->n == MAX_DESC) {
        ck(b, CUDNN_STATUS_INTERNAL_ERROR, "too many descriptors");
        return NULL;
    }
    ck(b, cudnnBackendCreateDescriptor(t, &d), "cudnnBackendCreateDescriptor");
    if (!b->bad) b->d[b->n++] = d;
    return d;
}
static void set(builder *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                cudnnBackendAttributeType_t t, int64_t n, const void *v, const char *what) {
    if (!b->bad) ck(b, cudnnBackendSetAttribute(d, a, t, n, v), what);
}
static void fin(builder *b, cudnnBackendDescriptor_t d, const char *what) {
    if (!b->bad) ck(b, cudnnBackendFinalize(d), what);
}
static void release(builder *b) {
    for (int i = b->n - 1; i >= 0; i--)
        cudnnBackendDestroyDescriptor(b->d[i]);
    b->n = 0;
}

/* a 4-d tensor; uid 0 = a new virtual one */
static cudnnBackendDescriptor_t tensor(builder *b, int64_t uid, cudnnDataType_t dt, int64_t d0,
                                       int64_t d1, int64_t d2, int64_t d3, int64_t s0, int64_t s1,
                                       int64_t s2, int64_t s3, int byval) {
    int64_t dim[4] = {d0, d1, d2, d3}, str[4] = {s0, s1, s2, s3};
    bool virt = uid == 0, bv = byval != 0;
    int64_t align = byval ? 4 : 16;
    if (virt) uid = b->next_virt++;
    cudnnBackendDescriptor_t t = make(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    set(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
    set(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, "tensor dims");
    set(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str, "tensor strides");
    set(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    set(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    set(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "tensor virtual");
    if (bv) set(b, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv, "tensor by value");
    fin(b, t, "tensor finalize");
    return t;
}

/* y = mode(x [, bx [, t]]); axis for GEN_INDEX */
static cudnnBackendDescriptor_t pointwise(builder *b, cudnnPointwiseMode_t mode,
                                          cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t bx,
                                          cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                                          int64_t axis) {
    /* comparisons compute in BOOLEAN, everything else in fp32 (as cudnn-frontend sets them) */
    cudnnDataType_t prec = mode == CUDNN_POINTWISE_CMP_GE ? CUDNN_DATA_BOOLEAN : CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t pw = make(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise prec");
    if (mode == CUDNN_POINTWISE_GEN_INDEX)
        set(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    fin(b, pw, "pointwise finalize");
    cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw,
        "pointwise op desc");
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x,
        "pointwise x");
    if (bx)
        set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bx,
            "pointwise b");
    if (t)
        set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t,
            "pointwise t");
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
        "pointwise y");
    fin(b, op, "pointwise op finalize");
    return op;
}

static cudnnBackendDescriptor_t matmul(builder *b, cudnnBackendDescriptor_t a,
                                       cudnnBackendDescriptor_t bm, cudnnBackendDescriptor_t c) {
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t mm = make(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    set(b, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul comp type");
    fin(b, mm, "matmul finalize");
    cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, "matmul a");
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bm,
        "matmul b");
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, "matmul c");
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm,
        "matmul desc");
    fin(b, op, "matmul op finalize");
    return op;
}

static cudnnBackendDescriptor_t reduction(builder *b, cudnnReduceTensorOp_t mode,
                                          cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t r = make(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    set(b, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode,
        "reduction operator");
    set(b, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "reduction comp");
    fin(b, r, "reduction finalize");
    cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x,
        "reduction x");
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
        "reduction y");
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r,
        "reduction desc");
    fin(b, op, "reduction op finalize");
    return op;
}

/* y: x's memory read with y's dims and strides (a transpose of a virtual tensor) */
static cudnnBackendDescriptor_t reshape(builder *b, cudnnBackendDescriptor_t x,
                                        cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(b, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x,
        "reshape x");
    set(b, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
        "reshape y");
    fin(b, op, "reshape op finalize");
    return op;
}

/* ---- the two graphs --------------------------------------------------------------------- */

/* One built plan: its shape, the plan, the descriptors to free, and the workspace layout:
 * [0, ws) the engine's own, then (backward) D at off_dsum and dQ's fp32 accumulator at
 * off_dqacc; total bytes in all. */
typedef struct {
    int B, T, H, KV, hd, bwd, used;
    builder b;
    cudnnBackendDescriptor_t plan;
    size_t ws, off_dsum, off_dqacc, all;
} cd_plan;

#define MAX_PLANS 8
static cd_plan plans[MAX_PLANS];
static unsigned plan_clock;

/* The causal score tensor: S = Q K^T * scale with -inf above the diagonal. Returns S's masked
 * descriptor; ops appended to ops[*n]. */
static cudnnBackendDescriptor_t scores(builder *b, cudnnBackendDescriptor_t *ops, int *n,
                                       cudnnBackendDescriptor_t q, cudnnBackendDescriptor_t kt,
                                       cudnnBackendDescriptor_t scale,
                                       cudnnBackendDescriptor_t ninf, int B, int H, int T) {
    int64_t TT = (int64_t)T * T, HTT = (int64_t)H * TT;
    cudnnBackendDescriptor_t s = tensor(b, 0, CUDNN_DATA_FLOAT, B, H, T, T, HTT, TT, T, 1, 0);
    cudnnBackendDescriptor_t s2 = tensor(b, 0, CUDNN_DATA_FLOAT, B, H, T, T, HTT, TT, T, 1, 0);
    cudnnBackendDescriptor_t row = tensor(b, 0, CUDNN_DATA_INT32, B, H, T, T, HTT, TT, T, 1, 0);
    cudnnBackendDescriptor_t col = tensor(b, 0, CUDNN_DATA_INT32, B, H, T, T, HTT, TT, T, 1, 0);
    cudnnBackendDescriptor_t keep = tensor(b, 0, CUDNN_DATA_BOOLEAN, B, H, T, T, HTT, TT, T, 1, 0);
    cudnnBackendDescriptor_t s3 = tensor(b, 0, CUDNN_DATA_FLOAT, B, H, T, T, HTT, TT, T, 1, 0);
    ops[(*n)++] = matmul(b, q, kt, s); /* (B,H,T,T) */
    ops[(*n)++] = pointwise(b, CUDNN_POINTWISE_MUL, s, scale, NULL, s2, 0);
    ops[(*n)++] = pointwise(b, CUDNN_POINTWISE_GEN_INDEX, s2, NULL, NULL, row, 2);
    ops[(*n)++] = pointwise(b, CUDNN_POINTWISE_GEN_INDEX, s2, NULL, NULL, col, 3);
    ops[(*n)++] = pointwise(b, CUDNN_POINTWISE_CMP_GE, row, col, NULL, keep, 0); /* key <= query */
    ops[(*n)++] = pointwise(b, CUDNN_POINTWISE_BINARY_SELECT, s2, ninf, keep, s3, 0);
    return s3;
}

static int build(cd_plan *p) {
    builder *b = &p->b;
    memset(b, 0, sizeof(*b));
    b->next_virt = U_VIRT;
    const int B = p->B, T = p->T, H = p->H, KV = p->KV, hd = p->hd;
    const int64_t S = (int64_t)(H + 2 * KV) * hd, TS = (int64_t)T * S;
    const int64_t HTd = (int64_t)H * T * hd, Hd = (int64_t)H * hd, HT = (int64_t)H * T;
    const cudnnDataType_t BF = CUDNN_DATA_BFLOAT16, F = CUDNN_DATA_FLOAT;
    /* views into qkv (and dqkv): (B, heads, T, hd) with row stride S */
    cudnnBackendDescriptor_t q = tensor(b, U_Q, BF, B, H, T, hd, TS, hd, S, 1, 0);
    cudnnBackendDescriptor_t kt = tensor(b, U_KT, BF, B, KV, hd, T, TS, hd, 1, S, 0);
    cudnnBackendDescriptor_t stats = tensor(b, U_STATS, F, B, H, T, 1, HT, T, 1, 1, 0);
    cudnnBackendDescriptor_t scale = tensor(b, U_SCALE, F, 1, 1, 1, 1, 1, 1, 1, 1, 1);
    cudnnBackendDescriptor_t ninf = tensor(b, U_NINF, F, 1, 1, 1, 1, 1, 1, 1, 1, 1);
    cudnnBackendDescriptor_t o = tensor(b, U_O, BF, B, H, T, hd, (int64_t)T * Hd, hd, Hd, 1, 0);
    cudnnBackendDescriptor_t ops[32];
    int n = 0;
    int64_t TT = (int64_t)T * T, HTT = (int64_t)H * TT;
    size_t extra = 0;
    if (!p->bwd) {
        cudnnBackendDescriptor_t s3 = scores(b, ops, &n, q, kt, scale, ninf, B, H, T);
        cudnnBackendDescriptor_t v = tensor(b, U_V, BF, B, KV, T, hd, TS, hd, S, 1, 0);
        cudnnBackendDescriptor_t mx = tensor(b, 0, F, B, H, T, 1, HT, T, 1, 1, 0);
        cudnnBackendDescriptor_t sub = tensor(b, 0, F, B, H, T, T, HTT, TT, T, 1, 0);
        cudnnBackendDescriptor_t e = tensor(b, 0, F, B, H, T, T, HTT, TT, T, 1, 0);
        cudnnBackendDescriptor_t sum = tensor(b, 0, F, B, H, T, 1, HT, T, 1, 1, 0);
        cudnnBackendDescriptor_t lg = tensor(b, 0, F, B, H, T, 1, HT, T, 1, 1, 0);
        /* P in the I/O type: the engines take the second product's A operand so */
        cudnnBackendDescriptor_t pr = tensor(b, 0, BF, B, H, T, T, HTT, TT, T, 1, 0);
        ops[n++] = reduction(b, CUDNN_REDUCE_TENSOR_MAX, s3, mx);
        ops[n++] = pointwise(b, CUDNN_POINTWISE_SUB, s3, mx, NULL, sub, 0);
        ops[n++] = pointwise(b, CUDNN_POINTWISE_EXP, sub, NULL, NULL, e, 0);
        ops[n++] = reduction(b, CUDNN_REDUCE_TENSOR_ADD, e, sum);
        ops[n++] = pointwise(b, CUDNN_POINTWISE_LOG, sum, NULL, NULL, lg, 0);
        ops[n++] = pointwise(b, CUDNN_POINTWISE_ADD, mx, lg, NULL, stats, 0); /* the lse */
        ops[n++] = pointwise(b, CUDNN_POINTWISE_DIV, e, sum, NULL, pr, 0);
        ops[n++] = matmul(b, pr, v, o);
    } else {
        int gqa = KV != H;
        const int64_t Td = (int64_t)T * hd;
        cudnnBackendDescriptor_t vt = tensor(b, U_VT, BF, B, KV, hd, T, TS, hd, 1, S, 0);
        cudnnBackendDescriptor_t dout = tensor(b, U_DO, BF, B, H, T, hd, T * Hd, hd, Hd, 1, 0);
        cudnnBackendDescriptor_t dq = tensor(b, U_DQ, BF, B, H, T, hd, TS, hd, S, 1, 0);
        cudnnBackendDescriptor_t dk = tensor(b, U_DK, BF, B, KV, T, hd, TS, hd, S, 1, 0);
        cudnnBackendDescriptor_t dv = tensor(b, U_DV, BF, B, KV, T, hd, TS, hd, S, 1, 0);
        cudnnBackendDescriptor_t one = tensor(b, U_ONE, F, 1, 1, 1, 1, 1, 1, 1, 1, 1);
        cudnnBackendDescriptor_t dsum = tensor(b, U_DSUM, F, B, H, T, 1, HT, T, 1, 1, 0);
        cudnnBackendDescriptor_t dqacc = tensor(b, U_DQACC, F, B, H, T, hd, HTd, Td, hd, 1, 0);
        cudnnBackendDescriptor_t doo = tensor(b, 0, F, B, H, T, hd, HTd, Td, hd, 1, 0);
        cudnnBackendDescriptor_t dred = tensor(b, 0, F, B, H, T, 1, HT, T, 1, 1, 0);
        /* D = rowsum(dO * O), times one (the pattern's dropout scale) */
        ops[n++] = pointwise(b, CUDNN_POINTWISE_MUL, dout, o, NULL, doo, 0);
        ops[n++] = reduction(b, CUDNN_REDUCE_TENSOR_ADD, doo, dred);
        ops[n++] = pointwise(b, CUDNN_POINTWISE_MUL, dred, one, NULL, dsum, 0);
        cudnnBackendDescriptor_t s3 = scores(b, ops, &n, q, kt, scale, ninf, B, H, T);
        cudnnBackendDescriptor_t sub = tensor(b, 0, F, B, H, T, T, HTT, TT, T, 1, 0);
        cudnnBackendDescriptor_t pr = tensor(b, 0, F, B, H, T, T, HTT, TT, T, 1, 0);
        cudnnBackendDescriptor_t prt = tensor(b, 0, BF, B, H, T, T, HTT, TT, 1, T, 0);
        cudnnBackendDescriptor_t dp = tensor(b, 0, F, B, H, T, T, HTT, TT, T, 1, 0);
        cudnnBackendDescriptor_t ds1 = tensor(b, 0, F, B, H, T, T, HTT, TT, T, 1, 0);
        cudnnBackendDescriptor_t ds2 = tensor(b, 0, F, B, H, T, T, HTT, TT, T, 1, 0);
        cudnnBackendDescriptor_t ds = tensor(b, 0, F, B, H, T, T, HTT, TT, T, 1, 0);
        cudnnBackendDescriptor_t dst = tensor(b, 0, BF, B, H, T, T, HTT, TT, 1, T, 0);
        cudnnBackendDescriptor_t k = tensor(b, 0, BF, B, KV, T, hd, TS, hd, S, 1, 0);
        /* with GQA, dK and dV per query head, virtual, then folded onto the kv heads */
        cudnnBackendDescriptor_t dkf = dk, dvf = dv;
        if (gqa) {
            dkf = tensor(b, 0, BF, B, H, T, hd, HTd, Td, hd, 1, 0);
            dvf = tensor(b, 0, BF, B, H, T, hd, HTd, Td, hd, 1, 0);
        }
        ops[n++] = pointwise(b, CUDNN_POINTWISE_SUB, s3, stats, NULL, sub, 0);
        ops[n++] = pointwise(b, CUDNN_POINTWISE_EXP, sub, NULL, NULL, pr, 0); /* P */
        ops[n++] = reshape(b, pr, prt);                                       /* P^T */
        ops[n++] = matmul(b, prt, dout, dvf);                                 /* dV = P^T dO */
        if (gqa) ops[n++] = reduction(b, CUDNN_REDUCE_TENSOR_ADD, dvf, dv);
        ops[n++] = matmul(b, dout, vt, dp); /* dP = dO V^T */
        ops[n++] = pointwise(b, CUDNN_POINTWISE_SUB, dp, dsum, NULL, ds1, 0);
        ops[n++] = pointwise(b, CUDNN_POINTWISE_MUL, ds1, pr, NULL, ds2, 0);
        ops[n++] = pointwise(b, CUDNN_POINTWISE_MUL, ds2, scale, NULL, ds, 0); /* dS */
        ops[n++] = reshape(b, ds, dst);                                        /* dS^T */
        ops[n++] = matmul(b, dst, q, dkf);                                     /* dK = dS^T Q */
        if (gqa) ops[n++] = reduction(b, CUDNN_REDUCE_TENSOR_ADD, dkf, dk);
        ops[n++] = reshape(b, kt, k);       /* K */
        ops[n++] = matmul(b, ds, k, dqacc); /* dQ = dS K */
        ops[n++] = pointwise(b, CUDNN_POINTWISE_IDENTITY, dqacc, NULL, NULL, dq, 0);
        extra = up256(sizeof(float) * (size_t)B * HT) + up256(sizeof(float) * (size_t)B * HTd);
    }
    cudnnBackendDescriptor_t graph = make(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, ops,
        "graph ops");
    set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &cd_handle,
        "graph handle");
    fin(b, graph, "operation graph finalize");
    cudnnBackendDescriptor_t heur = make(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph,
        "heuristics graph");
    set(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
    fin(b, heur, "heuristics finalize");
    /* the heuristics' engine configs, best first: the first that makes a plan wins */
    enum { NCFG = 8 };
    cudnnBackendDescriptor_t cfg[NCFG];
    int64_t ncfg = 0;
    for (int i = 0; i < NCFG; i++)
        cfg[i] = make(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (!b->bad)
        ck(b,
           cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, NCFG, &ncfg, cfg),
           "heuristics results");
    if (!b->bad && ncfg == 0)
        ck(b, CUDNN_STATUS_NOT_SUPPORTED, "heuristics: no engine for the attention graph");
    p->plan = NULL;
    for (int64_t i = 0; i < ncfg && i < NCFG && !b->bad && !p->plan; i++) {
        cudnnBackendDescriptor_t plan = make(b, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        set(b, plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &cd_handle,
            "plan handle");
        set(b, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
            &cfg[i], "plan engine config");
        if (b->bad) break;
        cudnnStatus_t s = cudnnBackendFinalize(plan);
        if (s == CUDNN_STATUS_SUCCESS)
            p->plan = plan;
        else if (i + 1 == ncfg || i + 1 == NCFG)
            ck(b, s, "execution plan finalize (every engine)");
    }
    int64_t ws = 0;
    if (!b->bad)
        ck(b,
           cudnnBackendGetAttribute(p->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                    CUDNN_TYPE_INT64, 1, NULL, &ws),
           "plan workspace size");
    if (b->bad) {
        release(b);
        p->plan = NULL;
        return -1;
    }
    p->ws = up256((size_t)ws);
    p->off_dsum = p->ws;                                                /* D: (B,H,T) */
    p->off_dqacc = p->off_dsum + up256(sizeof(float) * (size_t)B * HT); /* (B,H,T,hd) */
    p->all = p->ws + extra;
    return 0;
}

static int cd_init(void) {
    if (cd_state) return cd_state > 0 ? 0 : -1;
    cudnnStatus_t s = cudnnCreate(&cd_handle);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnSetStream(cd_handle, tr_cuda_stream);
    if (s != CUDNN_STATUS_SUCCESS) {
        snprintf(cd_why, sizeof(cd_why), "cuDNN: cudnnCreate failed: %s", cudnnGetErrorString(s));
        cd_state = -1;
        return -1;
    }
    cd_state = 1;
    return 0;
}

/* the plan for this shape and direction, built on first use; NULL with cd_why set */
static cd_plan *get_plan(int B, int T, int H, int KV, int hd, int bwd) {
    if (cd_init()) return NULL;
    cd_plan *lru = &plans[0];
    for (int i = 0; i < MAX_PLANS; i++) {
        cd_plan *p = &plans[i];
        if (p->plan && p->B == B && p->T == T && p->H == H && p->KV == KV && p->hd == hd &&
            p->bwd == bwd) {
            p->used = (int)++plan_clock;
            return p;
        }
        if (!p->plan || (lru->plan && p->used < lru->used)) lru = p;
    }
    if (lru->plan) release(&lru->b), lru->plan = NULL;
    lru->B = B, lru->T = T, lru->H = H, lru->KV = KV, lru->hd = hd, lru->bwd = bwd;
    if (build(lru)) return NULL;
    lru->used = (int)++plan_clock;
    return lru;
}

static int execute(cd_plan *p, int n, const int64_t *uids, void *const *ptrs, void *ws) {
    builder vb;
    memset(&vb, 0, sizeof(vb));
    cudnnBackendDescriptor_t vp = make(&vb, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    set(&vb, vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids, "variant uids");
    set(&vb, vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs,
        "variant pointers");
    set(&vb, vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws,
        "variant workspace");
    fin(&vb, vp, "variant pack finalize");
    if (!vb.bad) ck(&vb, cudnnBackendExecute(cd_handle, p->plan, vp), "cudnnBackendExecute");
    release(&vb);
    return vb.bad ? -1 : 0;
}

extern "C" int tr_cuda_attention_cudnn_available(void) {
    return cd_init() == 0;
}

/* Bytes of device workspace the forward and backward need at this shape (the larger): what a
 * caller allocating everything at start reserves. 0 with cd_why set when cuDNN cannot run it. */
extern "C" size_t tr_cuda_attention_cudnn_workspace(int B, int T, int H, int KV, int hd) {
    cd_plan *f = get_plan(B, T, H, KV, hd, 0);
    size_t fa = f ? f->all : 0;
    cd_plan *b = f ? get_plan(B, T, H, KV, hd, 1) : NULL;
    if (!f || !b) return 0;
    return fa > b->all ? fa : b->all;
}

static void *workspace(size_t bytes) {
    return tr_cuda_scratch(SCR_CUDNN, bytes ? bytes : 256);
}

extern "C" int tr_cuda_attention_cudnn_forward(tr_buf *out, float *lse, const tr_buf *qkv, int B,
                                               int T, int H, int KV, int hd) {
    cd_plan *p = get_plan(B, T, H, KV, hd, 0);
    if (!p) return -1;
    float scale = 1.0f / sqrtf((float)hd), ninf = -INFINITY;
    __nv_bfloat16 *x = (__nv_bfloat16 *)qkv;
    int64_t uids[] = {U_Q, U_KT, U_V, U_STATS, U_SCALE, U_NINF, U_O};
    void *ptrs[] = {x, x + (size_t)H * hd, x + (size_t)(H + KV) * hd, lse, &scale, &ninf, out};
    return execute(p, 7, uids, ptrs, workspace(p->all));
}

extern "C" int tr_cuda_attention_cudnn_backward(tr_buf *dqkv, const tr_buf *dout, const tr_buf *qkv,
                                                const tr_buf *out, const float *lse, int B, int T,
                                                int H, int KV, int hd) {
    cd_plan *p = get_plan(B, T, H, KV, hd, 1);
    if (!p) return -1;
    float scale = 1.0f / sqrtf((float)hd), ninf = -INFINITY, one = 1.0f;
    __nv_bfloat16 *x = (__nv_bfloat16 *)qkv, *d = (__nv_bfloat16 *)dqkv;
    char *ws = (char *)workspace(p->all);
    size_t ko = (size_t)H * hd, vo = (size_t)(H + KV) * hd;
    int64_t uids[] = {U_Q,    U_KT,  U_VT, U_O,  U_DO, U_STATS, U_SCALE,
                      U_NINF, U_ONE, U_DQ, U_DK, U_DV, U_DSUM,  U_DQACC};
    void *ptrs[] = {
        x,     x + ko, x + vo, (void *)out, (void *)dout, (void *)lse,      &scale,
        &ninf, &one,   d,      d + ko,      d + vo,       ws + p->off_dsum, ws + p->off_dqacc};
    return execute(p, 14, uids, ptrs, ws);
}

#endif /* TR_HAVE_CUDNN */

/* ---- the choice: TR_CUDA_ATTENTION=cudnn, or auto's measurement, once per shape --------- */

static float host_bf(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ||a - b||_2 / ||b||_2 of n device elements (bf16 when bf, else fp32) */
static double rel_err(const void *a, const void *b, size_t n, int bf) {
    size_t es = bf ? 2 : 4;
    char *ha = (char *)malloc(n * es), *hb = (char *)malloc(n * es);
    if (!ha || !hb)
        tr_cuda_fail("malloc (attention auto check)", "out of memory", __FILE__, __LINE__);
    CK(cudaMemcpyAsync(ha, a, n * es, cudaMemcpyDeviceToHost, tr_cuda_stream));
    CK(cudaMemcpyAsync(hb, b, n * es, cudaMemcpyDeviceToHost, tr_cuda_stream));
    TR_WAIT("cuda.cudnn_check", CK(cudaStreamSynchronize(tr_cuda_stream)));
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        float x, y;
        if (bf) {
            x = host_bf(((uint16_t *)ha)[i]), y = host_bf(((uint16_t *)hb)[i]);
        } else {
            x = ((float *)ha)[i], y = ((float *)hb)[i];
        }
        num += ((double)x - y) * ((double)x - y), den += (double)y * y;
    }
    free(ha), free(hb);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Bytes auto's decision (below) carves from the scratch slot past cuDNN's workspace: an
 * output, a dqkv and an lse for each implementation. */
static size_t decide_bytes(int B, int T, int H, int KV, int hd) {
    size_t no = (size_t)B * T * H * hd, nq = (size_t)B * T * (H + 2 * KV) * hd,
           nl = (size_t)B * H * T;
    return 2 * (up256(no * 2) + up256(nq * 2) + up256(nl * 4));
}

extern "C" size_t tr_cuda_attention_cudnn_reserve(int B, int T, int H, int KV, int hd) {
    size_t ws = tr_cuda_attention_cudnn_workspace(B, T, H, KV, hd);
    if (!ws || tr_backend_attention() != TR_ATTENTION_AUTO) return ws;
    return up256(ws) + decide_bytes(B, T, H, KV, hd);
}

static int deciding = -1; /* while auto measures: 0 ours, 1 cuDNN */
static struct { int B, T, H, KV, hd, use; } chosen[16];
static int n_chosen;

/* Both implementations on this shape, on the run's own qkv: one warm-up forward + backward
 * each (dout: ours' output, for both), then 3 timed; the faster is kept. The outputs of the
 * warm-up (out, lse, dqkv) are compared: ||a - b|| / ||b|| above 2^-6, four bf16 rounding
 * steps (2^-8: outputs and cuDNN's bf16 probabilities are rounded once each, the sums run in
 * different orders), says so in one line. */
static int decide(const tr_buf *qkv, int B, int T, int H, int KV, int hd) {
    char shape[96];
    snprintf(shape, sizeof(shape), "B%d T%d H%d KV%d hd%d", B, T, H, KV, hd);
    size_t ws = tr_cuda_attention_cudnn_workspace(B, T, H, KV, hd);
    if (!ws) {
        fprintf(stderr, "attention auto (%s): ours (cuDNN cannot run it: %s)\n", shape,
                tr_cuda_attention_cudnn_error());
        return 0;
    }
    size_t no = (size_t)B * T * H * hd, nq = (size_t)B * T * (H + 2 * KV) * hd,
           nl = (size_t)B * H * T;
    /* the buffers past cuDNN's workspace in its slot, which the plan reserved for them
       (tr_cuda_attention_cudnn_reserve): no allocation in the first step */
    char *at =
        (char *)tr_cuda_scratch(SCR_CUDNN, tr_cuda_attention_cudnn_reserve(B, T, H, KV, hd)) +
        up256(ws);
    void *out[2], *dq[2];
    float *lse[2];
    for (int i = 0; i < 2; i++) {
        out[i] = at, at += up256(no * 2);
        dq[i] = at, at += up256(nq * 2);
        lse[i] = (float *)at, at += up256(nl * 4);
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[2];
    for (int i = 0; i < 2; i++) {
        deciding = i;
        tr_cuda_attention_forward(1, out[i], lse[i], qkv, B, T, H, KV, hd);
        tr_cuda_attention_backward(1, dq[i], out[0], qkv, out[i], lse[i], B, T, H, KV, hd);
        CK(cudaEventRecord(e0, tr_cuda_stream));
        for (int r = 0; r < 3; r++) {
            tr_cuda_attention_forward(1, out[i], lse[i], qkv, B, T, H, KV, hd);
            tr_cuda_attention_backward(1, dq[i], out[0], qkv, out[i], lse[i], B, T, H, KV, hd);
        }
        CK(cudaEventRecord(e1, tr_cuda_stream));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms[i], e0, e1));
        ms[i] /= 3;
    }
    deciding = -1;
    int use = ms[1] < ms[0];
    const double tol = 1.0 / 64;
    double eo = rel_err(out[use], out[!use], no, 1), el = rel_err(lse[use], lse[!use], nl, 0),
           ed = rel_err(dq[use], dq[!use], nq, 1);
    fprintf(stderr,
            "attention auto (%s): ours %.3f ms, cuDNN %.3f ms per forward + backward: "
            "keeps %s\n",
            shape, ms[0], ms[1], use ? "cuDNN" : "ours");
    if (eo > tol || el > tol || ed > tol || eo != eo || el != el || ed != ed)
        fprintf(stderr,
                "attention auto (%s): WARNING ours and cuDNN differ beyond bf16's "
                "tolerance %.2g: out %.3g, lse %.3g, dqkv %.3g (relative L2)\n",
                shape, tol, eo, el, ed);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return use;
}

extern "C" int tr_cuda_attention_use_cudnn(int bf, const tr_buf *qkv, int B, int T, int H, int KV,
                                           int hd) {
    if (!bf) return 0; /* cuDNN's fused attention is bf16 (fp16) only: fp32 runs ours */
    if (deciding >= 0) return deciding;
    tr_attention_impl a = tr_backend_attention();
    if (a != TR_ATTENTION_AUTO) return a == TR_ATTENTION_CUDNN;
    for (int i = 0; i < n_chosen && i < 16; i++)
        if (chosen[i].B == B && chosen[i].T == T && chosen[i].H == H && chosen[i].KV == KV &&
            chosen[i].hd == hd)
            return chosen[i].use;
    int use = decide(qkv, B, T, H, KV, hd);
    int i = n_chosen++ % 16; /* past 16 shapes the oldest choice is measured again */
    chosen[i].B = B, chosen[i].T = T, chosen[i].H = H;
    chosen[i].KV = KV, chosen[i].hd = hd, chosen[i].use = use;
    return use;
}
