/* Test-only host emulator of the part of cuDNN 9's backend graph API (cudnn_graph.h) that
 * model/cuda/cuda_attention_cudnn.cu uses, so the cuDNN attention path runs on the CPU in tests:
 * descriptors are built, checked and finalized as the documentation says, the operation graph is
 * validated (tensor dims, strides, uids, data types, broadcasting, the fused-attention op mix),
 * heuristics hand back one engine config, the plan reports a workspace size, and execution
 * interprets the graph op by op on the host ("device" pointers are host memory).
 *
 * Written from NVIDIA's documentation of the backend API (the cuDNN Backend API reference:
 * descriptor types, their attributes and attribute types, Finalize rules, the variant pack) and
 * of its operations, NOT from what cuda_attention_cudnn.cu expects. Semantics relied on:
 *  - a tensor element at index (i0..in-1) sits at sum(ik * stride_k) elements from its pointer;
 *    strides must be positive and the layout must not overlap itself;
 *  - pointwise ops broadcast an input dimension of 1; GEN_INDEX writes the index along AXIS;
 *    CMP_* write 1 or 0; BINARY_SELECT y = t ? x : b;
 *  - matmul C[.., m, n] = sum_k A[.., m, k] B[.., k, n], batch dims of A and B equal to C's or
 *    1, or (grouped-query attention) dividing C's: batch index i reads i / (C's / A's);
 *  - reduction: each output dim equals the input's or is 1 (reduced over), or divides it (the
 *    GQA fold of per-query-head gradients onto kv heads: output index j sums inputs
 *    j * g .. j * g + g - 1 with g the ratio);
 *  - reshape reinterprets: y's element at memory offset o is x's element at offset o;
 *  - by-value tensors: the variant pack holds a host pointer to the value.
 * Arithmetic: fp32 everywhere, sums in index order, rounding to the stored type (bf16: nearest
 * even) on every store; virtual tensors are kept in fp32, rounded to bf16 when they are bf16.
 * What the documentation leaves out and a real cuDNN (9.14, on an H200, 2026-12-04) showed: the
 * fused engines match cudnn-frontend's composite SDPA graphs exactly; a graph whose P is fp32
 * before O = P V found no engine. So, as those graphs have them: comparisons compute in BOOLEAN,
 * every other pointwise op in FLOAT; the A operand of O = P V, and of every product that reads a
 * RESHAPE's output (P^T, dS^T), is bf16; the backward writes dQ through an fp32 accumulator and
 * IDENTITY, and computes D = sum(dO * O) times a by-value one.
 * Unknown descriptor types, attributes, attribute types and op patterns return an error status
 * (NOT_SUPPORTED / BAD_PARAM...), never silence; every error prints one line to stderr.
 * This file: descriptors, attributes, finalization and the API; execution is in
 * emu_cudnn_exec.cc, what both share in emu_cudnn_private.h. */
#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "emu_cudnn_private.h"

namespace emu_cudnn {

void complain(const char *fn, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "emu cudnn: %s: ", fn);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

Desc *live(cudnnBackendDescriptor_t d) {
    Desc *p = static_cast<Desc *>(d);
    return p && p->magic == kDescMagic ? p : nullptr;
}

int64_t span(const Desc *t) {
    int64_t s = 1;
    for (int i = 0; i < t->nd; i++)
        s += (t->dim[i] - 1) * t->str[i];
    return s;
}
size_t dt_size(int64_t dt) {
    switch (dt) {
    case CUDNN_DATA_BFLOAT16:
        return 2;
    case CUDNN_DATA_FLOAT:
    case CUDNN_DATA_INT32:
        return 4;
    case CUDNN_DATA_INT64:
        return 8;
    case CUDNN_DATA_BOOLEAN:
        return 1;
    default:
        return 0;
    }
}

} // namespace emu_cudnn

using namespace emu_cudnn;

namespace {

const char *op_name(const Desc *o) {
    switch (o->type) {
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
        return "pointwise";
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
        return "matmul";
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
        return "reduction";
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
        return "reshape";
    default:
        return "?";
    }
}

bool is_op(const Desc *d) {
    return d->type == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR ||
           d->type == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR ||
           d->type == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR ||
           d->type == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR;
}

int64_t numel(const Desc *t) {
    int64_t n = 1;
    for (int i = 0; i < t->nd; i++)
        n *= t->dim[i];
    return n;
}

/* ---- attribute setting ------------------------------------------------------------------ */

/* the value array as n elements of the expected attribute type */
cudnnStatus_t want(const char *fn, cudnnBackendAttributeType_t got, cudnnBackendAttributeType_t exp,
                   int64_t n, int64_t lo, int64_t hi, const void *v) {
    if (got != exp) {
        complain(fn, "attribute type %d, expected %d", (int)got, (int)exp);
        return CUDNN_STATUS_BAD_PARAM;
    }
    if (n < lo || n > hi || !v) {
        complain(fn, "%lld elements (expected %lld..%lld) at %p", (long long)n, (long long)lo,
                 (long long)hi, v);
        return CUDNN_STATUS_BAD_PARAM;
    }
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t set_desc_ref(const char *fn, Desc **dst, cudnnBackendAttributeType_t ty, int64_t n,
                           const void *v, cudnnBackendDescriptorType_t need) {
    cudnnStatus_t s = want(fn, ty, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, 1, 1, v);
    if (s) return s;
    Desc *d = live(*static_cast<const cudnnBackendDescriptor_t *>(v));
    if (!d) {
        complain(fn, "not a live descriptor");
        return CUDNN_STATUS_BAD_PARAM;
    }
    if (d->type != need) {
        complain(fn, "descriptor type %d, expected %d", (int)d->type, (int)need);
        return CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE;
    }
    if (!d->fin) {
        complain(fn, "descriptor not finalized");
        return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
    }
    *dst = d;
    return CUDNN_STATUS_SUCCESS;
}

#define TRY(e)                                                                                     \
    do {                                                                                           \
        cudnnStatus_t s_ = (e);                                                                    \
        if (s_ != CUDNN_STATUS_SUCCESS) return s_;                                                 \
    } while (0)

cudnnStatus_t set_attr(Desc *d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t ty,
                       int64_t n, const void *v) {
    const char *fn = "cudnnBackendSetAttribute";
    const int64_t *i64 = static_cast<const int64_t *>(v);
    const cudnnBackendDescriptorType_t T = d->type;
    if (T == CUDNN_BACKEND_TENSOR_DESCRIPTOR) {
        switch (a) {
        case CUDNN_ATTR_TENSOR_DATA_TYPE:
            TRY(want(fn, ty, CUDNN_TYPE_DATA_TYPE, n, 1, 1, v));
            d->dtype = *static_cast<const cudnnDataType_t *>(v);
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_TENSOR_DIMENSIONS:
            TRY(want(fn, ty, CUDNN_TYPE_INT64, n, 1, 8, v));
            d->nd = n;
            memcpy(d->dim, v, n * sizeof(int64_t));
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_TENSOR_STRIDES:
            TRY(want(fn, ty, CUDNN_TYPE_INT64, n, 1, 8, v));
            memcpy(d->str, v, n * sizeof(int64_t));
            d->has_str = true;
            if (d->nd && n != d->nd) break;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_TENSOR_UNIQUE_ID:
            TRY(want(fn, ty, CUDNN_TYPE_INT64, n, 1, 1, v));
            d->uid = *i64;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT:
            TRY(want(fn, ty, CUDNN_TYPE_INT64, n, 1, 1, v));
            d->align = *i64;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_TENSOR_IS_VIRTUAL:
            TRY(want(fn, ty, CUDNN_TYPE_BOOLEAN, n, 1, 1, v));
            d->virt = *static_cast<const bool *>(v);
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_TENSOR_IS_BY_VALUE:
            TRY(want(fn, ty, CUDNN_TYPE_BOOLEAN, n, 1, 1, v));
            d->byval = *static_cast<const bool *>(v);
            return CUDNN_STATUS_SUCCESS;
        default:
            break;
        }
    } else if (T == CUDNN_BACKEND_POINTWISE_DESCRIPTOR) {
        switch (a) {
        case CUDNN_ATTR_POINTWISE_MODE:
            TRY(want(fn, ty, CUDNN_TYPE_POINTWISE_MODE, n, 1, 1, v));
            d->mode = *static_cast<const cudnnPointwiseMode_t *>(v);
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_POINTWISE_MATH_PREC:
            TRY(want(fn, ty, CUDNN_TYPE_DATA_TYPE, n, 1, 1, v));
            d->prec = *static_cast<const cudnnDataType_t *>(v);
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_POINTWISE_AXIS:
            TRY(want(fn, ty, CUDNN_TYPE_INT64, n, 1, 1, v));
            d->axis = *i64;
            return CUDNN_STATUS_SUCCESS;
        default:
            break;
        }
    } else if (T == CUDNN_BACKEND_MATMUL_DESCRIPTOR) {
        if (a == CUDNN_ATTR_MATMUL_COMP_TYPE) {
            TRY(want(fn, ty, CUDNN_TYPE_DATA_TYPE, n, 1, 1, v));
            d->prec = *static_cast<const cudnnDataType_t *>(v);
            return CUDNN_STATUS_SUCCESS;
        }
    } else if (T == CUDNN_BACKEND_REDUCTION_DESCRIPTOR) {
        if (a == CUDNN_ATTR_REDUCTION_OPERATOR) {
            TRY(want(fn, ty, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, n, 1, 1, v));
            d->mode = *static_cast<const cudnnReduceTensorOp_t *>(v);
            return CUDNN_STATUS_SUCCESS;
        }
        if (a == CUDNN_ATTR_REDUCTION_COMP_TYPE) {
            TRY(want(fn, ty, CUDNN_TYPE_DATA_TYPE, n, 1, 1, v));
            d->prec = *static_cast<const cudnnDataType_t *>(v);
            return CUDNN_STATUS_SUCCESS;
        }
    } else if (T == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR) {
        switch (a) {
        case CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR:
            return set_desc_ref(fn, &d->op, ty, n, v, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
        case CUDNN_ATTR_OPERATION_POINTWISE_XDESC:
            return set_desc_ref(fn, &d->x, ty, n, v, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        case CUDNN_ATTR_OPERATION_POINTWISE_BDESC:
            return set_desc_ref(fn, &d->b, ty, n, v, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        case CUDNN_ATTR_OPERATION_POINTWISE_YDESC:
            return set_desc_ref(fn, &d->y, ty, n, v, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        case CUDNN_ATTR_OPERATION_POINTWISE_TDESC:
            return set_desc_ref(fn, &d->t, ty, n, v, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        default:
            break;
        }
    } else if (T == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR) {
        switch (a) {
        case CUDNN_ATTR_OPERATION_MATMUL_ADESC:
            return set_desc_ref(fn, &d->x, ty, n, v, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        case CUDNN_ATTR_OPERATION_MATMUL_BDESC:
            return set_desc_ref(fn, &d->b, ty, n, v, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        case CUDNN_ATTR_OPERATION_MATMUL_CDESC:
            return set_desc_ref(fn, &d->y, ty, n, v, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        case CUDNN_ATTR_OPERATION_MATMUL_DESC:
            return set_desc_ref(fn, &d->op, ty, n, v, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
        default:
            break;
        }
    } else if (T == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR) {
        switch (a) {
        case CUDNN_ATTR_OPERATION_REDUCTION_XDESC:
            return set_desc_ref(fn, &d->x, ty, n, v, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        case CUDNN_ATTR_OPERATION_REDUCTION_YDESC:
            return set_desc_ref(fn, &d->y, ty, n, v, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        case CUDNN_ATTR_OPERATION_REDUCTION_DESC:
            return set_desc_ref(fn, &d->op, ty, n, v, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
        default:
            break;
        }
    } else if (T == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR) {
        if (a == CUDNN_ATTR_OPERATION_RESHAPE_XDESC)
            return set_desc_ref(fn, &d->x, ty, n, v, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        if (a == CUDNN_ATTR_OPERATION_RESHAPE_YDESC)
            return set_desc_ref(fn, &d->y, ty, n, v, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    } else if (T == CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR) {
        if (a == CUDNN_ATTR_OPERATIONGRAPH_HANDLE) {
            TRY(want(fn, ty, CUDNN_TYPE_HANDLE, n, 1, 1, v));
            d->handle = *static_cast<const cudnnHandle_t *>(v);
            return CUDNN_STATUS_SUCCESS;
        }
        if (a == CUDNN_ATTR_OPERATIONGRAPH_OPS) {
            TRY(want(fn, ty, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, 1, 256, v));
            d->ops.clear();
            for (int64_t i = 0; i < n; i++) {
                Desc *o = live(static_cast<const cudnnBackendDescriptor_t *>(v)[i]);
                if (!o || !is_op(o)) {
                    complain(fn, "OPERATIONGRAPH_OPS[%lld] is not an operation", (long long)i);
                    return CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE;
                }
                if (!o->fin) {
                    complain(fn, "OPERATIONGRAPH_OPS[%lld] is not finalized", (long long)i);
                    return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
                }
                d->ops.push_back(o);
            }
            return CUDNN_STATUS_SUCCESS;
        }
    } else if (T == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR) {
        if (a == CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH)
            return set_desc_ref(fn, &d->graph, ty, n, v, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
        if (a == CUDNN_ATTR_ENGINEHEUR_MODE) {
            TRY(want(fn, ty, CUDNN_TYPE_HEUR_MODE, n, 1, 1, v));
            d->heur_mode = *static_cast<const cudnnBackendHeurMode_t *>(v);
            return CUDNN_STATUS_SUCCESS;
        }
    } else if (T == CUDNN_BACKEND_ENGINE_DESCRIPTOR) {
        if (a == CUDNN_ATTR_ENGINE_OPERATION_GRAPH)
            return set_desc_ref(fn, &d->graph, ty, n, v, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
        if (a == CUDNN_ATTR_ENGINE_GLOBAL_INDEX) {
            TRY(want(fn, ty, CUDNN_TYPE_INT64, n, 1, 1, v));
            d->gidx = *i64;
            return CUDNN_STATUS_SUCCESS;
        }
    } else if (T == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR) {
        if (a == CUDNN_ATTR_ENGINECFG_ENGINE)
            return set_desc_ref(fn, &d->engine, ty, n, v, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    } else if (T == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR) {
        if (a == CUDNN_ATTR_EXECUTION_PLAN_HANDLE) {
            TRY(want(fn, ty, CUDNN_TYPE_HANDLE, n, 1, 1, v));
            d->handle = *static_cast<const cudnnHandle_t *>(v);
            return CUDNN_STATUS_SUCCESS;
        }
        if (a == CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG)
            return set_desc_ref(fn, &d->cfg, ty, n, v, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    } else if (T == CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR) {
        if (a == CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS) {
            TRY(want(fn, ty, CUDNN_TYPE_INT64, n, 1, 256, v));
            d->uids.assign(i64, i64 + n);
            return CUDNN_STATUS_SUCCESS;
        }
        if (a == CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS) {
            TRY(want(fn, ty, CUDNN_TYPE_VOID_PTR, n, 1, 256, v));
            const void *const *p = static_cast<const void *const *>(v);
            d->ptrs.assign(n, nullptr);
            for (int64_t i = 0; i < n; i++)
                d->ptrs[i] = const_cast<void *>(p[i]);
            return CUDNN_STATUS_SUCCESS;
        }
        if (a == CUDNN_ATTR_VARIANT_PACK_WORKSPACE) {
            TRY(want(fn, ty, CUDNN_TYPE_VOID_PTR, n, 1, 1, v));
            d->wsptr = *static_cast<void *const *>(v);
            d->has_ws = true;
            return CUDNN_STATUS_SUCCESS;
        }
    }
    complain(fn, "attribute %d is not emulated for descriptor type %d", (int)a, (int)T);
    return CUDNN_STATUS_NOT_SUPPORTED;
}

/* ---- finalization: descriptors, then the graph ------------------------------------------ */

cudnnStatus_t fin_tensor(Desc *d) {
    const char *fn = "cudnnBackendFinalize(tensor)";
    if (d->dtype < 0 || !d->nd || !d->has_str || d->uid < 0 || d->align <= 0) {
        complain(fn,
                 "uid %lld: data type, dimensions, strides, unique id and byte alignment "
                 "must all be set",
                 (long long)d->uid);
        return CUDNN_STATUS_BAD_PARAM;
    }
    if (!dt_size(d->dtype)) {
        complain(fn, "uid %lld: data type %lld not emulated", (long long)d->uid,
                 (long long)d->dtype);
        return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
    }
    if (d->virt && d->byval) {
        complain(fn, "uid %lld: virtual and by-value", (long long)d->uid);
        return CUDNN_STATUS_BAD_PARAM;
    }
    int idx[8];
    for (int i = 0; i < d->nd; i++) {
        if (d->dim[i] <= 0 || d->str[i] <= 0) {
            complain(fn, "uid %lld: dim %d is %lld with stride %lld (both must be positive)",
                     (long long)d->uid, i, (long long)d->dim[i], (long long)d->str[i]);
            return CUDNN_STATUS_BAD_PARAM;
        }
        idx[i] = i;
    }
    /* no two indices at one offset: sorted by stride, each stride covers the dims below it */
    for (int i = 1; i < d->nd; i++) /* insertion sort: at most 8 */
        for (int j = i; j > 0; j--) {
            int a = idx[j - 1], b = idx[j];
            bool later = d->str[a] != d->str[b] ? d->str[a] > d->str[b] : d->dim[a] > d->dim[b];
            if (!later) break;
            idx[j - 1] = b, idx[j] = a;
        }
    for (int i = 1; i < d->nd; i++) {
        int lo = idx[i - 1], hi = idx[i];
        if (d->dim[hi] > 1 && d->dim[lo] > 1 && d->str[hi] < d->str[lo] * d->dim[lo]) {
            complain(fn, "uid %lld: strides overlap (dim %d: stride %lld < %lld x %lld)",
                     (long long)d->uid, hi, (long long)d->str[hi], (long long)d->str[lo],
                     (long long)d->dim[lo]);
            return CUDNN_STATUS_BAD_PARAM;
        }
    }
    return CUDNN_STATUS_SUCCESS;
}

/* x broadcasts to y: each dim equal, or 1 (or dividing y's when `divide`) */
bool bcast(const Desc *x, const Desc *y, int upto, bool divide) {
    if (x->nd != y->nd) return false;
    for (int i = 0; i < upto; i++)
        if (x->dim[i] != y->dim[i] && x->dim[i] != 1 && !(divide && y->dim[i] % x->dim[i] == 0))
            return false;
    return true;
}

cudnnStatus_t fin_op(Desc *d) {
    const char *fn = "cudnnBackendFinalize(operation)";
    switch (d->type) {
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
        if (d->mode < 0 || d->prec < 0) {
            complain("cudnnBackendFinalize(pointwise)", "mode and math precision must be set");
            return CUDNN_STATUS_BAD_PARAM;
        }
        if (d->prec !=
            (d->mode == CUDNN_POINTWISE_CMP_GE ? CUDNN_DATA_BOOLEAN : CUDNN_DATA_FLOAT)) {
            complain("cudnnBackendFinalize(pointwise)",
                     "math precision %lld for mode %lld not emulated (comparisons BOOLEAN, the "
                     "rest FLOAT)",
                     (long long)d->prec, (long long)d->mode);
            return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
        }
        switch (d->mode) {
        case CUDNN_POINTWISE_IDENTITY:
        case CUDNN_POINTWISE_ADD:
        case CUDNN_POINTWISE_SUB:
        case CUDNN_POINTWISE_MUL:
        case CUDNN_POINTWISE_DIV:
        case CUDNN_POINTWISE_EXP:
        case CUDNN_POINTWISE_LOG:
        case CUDNN_POINTWISE_CMP_GE:
        case CUDNN_POINTWISE_BINARY_SELECT:
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_POINTWISE_GEN_INDEX:
            if (d->axis < 0) {
                complain("cudnnBackendFinalize(pointwise)", "GEN_INDEX needs AXIS");
                return CUDNN_STATUS_BAD_PARAM;
            }
            return CUDNN_STATUS_SUCCESS;
        default:
            complain("cudnnBackendFinalize(pointwise)", "mode %lld not emulated",
                     (long long)d->mode);
            return CUDNN_STATUS_NOT_SUPPORTED;
        }
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
        if (d->prec != CUDNN_DATA_FLOAT) {
            complain("cudnnBackendFinalize(matmul)", "compute type must be set to FLOAT");
            return d->prec < 0 ? CUDNN_STATUS_BAD_PARAM : CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
        }
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
        if ((d->mode != CUDNN_REDUCE_TENSOR_ADD && d->mode != CUDNN_REDUCE_TENSOR_MAX) ||
            d->prec != CUDNN_DATA_FLOAT) {
            complain("cudnnBackendFinalize(reduction)",
                     "operator %lld / compute type %lld not "
                     "emulated (ADD or MAX in FLOAT)",
                     (long long)d->mode, (long long)d->prec);
            return CUDNN_STATUS_NOT_SUPPORTED;
        }
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
        if (!d->op || !d->x || !d->y) {
            complain(fn, "pointwise: PW_DESCRIPTOR, XDESC and YDESC must be set");
            return CUDNN_STATUS_BAD_PARAM;
        }
        int64_t m = d->op->mode;
        bool binary = m == CUDNN_POINTWISE_ADD || m == CUDNN_POINTWISE_SUB ||
                      m == CUDNN_POINTWISE_MUL || m == CUDNN_POINTWISE_DIV ||
                      m == CUDNN_POINTWISE_CMP_GE || m == CUDNN_POINTWISE_BINARY_SELECT;
        if (binary != (d->b != nullptr) ||
            (m == CUDNN_POINTWISE_BINARY_SELECT) != (d->t != nullptr)) {
            complain(fn, "pointwise mode %lld: wrong inputs (BDESC %s, TDESC %s)", (long long)m,
                     d->b ? "set" : "unset", d->t ? "set" : "unset");
            return CUDNN_STATUS_BAD_PARAM;
        }
        if (!bcast(d->x, d->y, d->y->nd, false) || (d->b && !bcast(d->b, d->y, d->y->nd, false)) ||
            (d->t && !bcast(d->t, d->y, d->y->nd, false))) {
            complain(fn, "pointwise mode %lld: an input does not broadcast to y (uid %lld)",
                     (long long)m, (long long)d->y->uid);
            return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
        }
        if (m == CUDNN_POINTWISE_GEN_INDEX &&
            (d->op->axis >= d->y->nd ||
             (d->y->dtype != CUDNN_DATA_INT32 && d->y->dtype != CUDNN_DATA_INT64))) {
            complain(fn, "GEN_INDEX: axis %lld of %lld dims, output must be INT32/INT64",
                     (long long)d->op->axis, (long long)d->y->nd);
            return CUDNN_STATUS_BAD_PARAM;
        }
        if (m == CUDNN_POINTWISE_CMP_GE && d->y->dtype != CUDNN_DATA_BOOLEAN) {
            complain(fn, "CMP_GE: output must be BOOLEAN");
            return CUDNN_STATUS_BAD_PARAM;
        }
        if (m == CUDNN_POINTWISE_BINARY_SELECT && d->t->dtype != CUDNN_DATA_BOOLEAN) {
            complain(fn, "BINARY_SELECT: the mask (TDESC) must be BOOLEAN");
            return CUDNN_STATUS_BAD_PARAM;
        }
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
        if (!d->op || !d->x || !d->b || !d->y) {
            complain(fn, "matmul: ADESC, BDESC, CDESC and DESC must be set");
            return CUDNN_STATUS_BAD_PARAM;
        }
        const Desc *A = d->x, *B = d->b, *C = d->y;
        int n = (int)C->nd;
        if (n < 3 || A->nd != n || B->nd != n || !bcast(A, C, n - 2, true) ||
            !bcast(B, C, n - 2, true) || A->dim[n - 2] != C->dim[n - 2] ||
            B->dim[n - 1] != C->dim[n - 1] || A->dim[n - 1] != B->dim[n - 2]) {
            complain(fn, "matmul: A (uid %lld), B (uid %lld), C (uid %lld) shapes disagree",
                     (long long)A->uid, (long long)B->uid, (long long)C->uid);
            return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
        }
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
        if (!d->op || !d->x || !d->y) {
            complain(fn, "reduction: XDESC, YDESC and DESC must be set");
            return CUDNN_STATUS_BAD_PARAM;
        }
        if (d->x->nd != d->y->nd) return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
        for (int i = 0; i < d->x->nd; i++)
            if (d->x->dim[i] % d->y->dim[i]) {
                complain(fn, "reduction: y dim %d (%lld) does not divide x's (%lld)", i,
                         (long long)d->y->dim[i], (long long)d->x->dim[i]);
                return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
            }
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
        if (!d->x || !d->y || numel(d->x) != numel(d->y) || span(d->x) != span(d->y)) {
            complain(fn, "reshape: x and y must be set and cover the same elements");
            return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
        }
        return CUDNN_STATUS_SUCCESS;
    default:
        return CUDNN_STATUS_SUCCESS;
    }
}

/* the tensors an op reads and the one it writes */
void io(const Desc *o, std::vector<const Desc *> *in, const Desc **out) {
    in->clear();
    for (const Desc *t : {o->x, o->b, o->t})
        if (t) in->push_back(t);
    *out = o->y;
}

/* ops counted by kind, to recognise the fused attention patterns */
std::map<std::string, int> op_mix(const std::vector<Desc *> &ops) {
    std::map<std::string, int> m;
    for (const Desc *o : ops) {
        char k[64];
        if (o->type == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)
            snprintf(k, sizeof(k), "pw%lld", (long long)o->op->mode);
        else if (o->type == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)
            snprintf(k, sizeof(k), "red%lld", (long long)o->op->mode);
        else
            snprintf(k, sizeof(k), "%s", op_name(o));
        m[k]++;
    }
    return m;
}

/* Forward: S = Q K^T, S * scale, the causal mask (two GEN_INDEX, CMP_GE, BINARY_SELECT), the
 * softmax with its stats (MAX, SUB, EXP, ADD, LOG, ADD, DIV), O = P V. Backward: D = sum(dO *
 * O) * 1, S again, P = EXP(S - stats), dV = P^T dO, dP = dO V^T, dS = (dP - D) * P * scale,
 * dK = dS^T Q, dQ = dS K into an accumulator then IDENTITY (P^T, dS^T and K by RESHAPE), and
 * with GQA two reductions folding dK, dV. */
Pattern recognise(const std::vector<Desc *> &ops, std::string *why) {
    std::map<std::string, int> m = op_mix(ops);
    char k[32];
    auto n = [&](const char *pre, long long v) {
        snprintf(k, sizeof(k), "%s%lld", pre, v);
        return m.count(k) ? m[k] : 0;
    };
    int mm = m.count("matmul") ? m["matmul"] : 0, rs = m.count("reshape") ? m["reshape"] : 0;
    int mask = n("pw", CUDNN_POINTWISE_GEN_INDEX) == 2 && n("pw", CUDNN_POINTWISE_CMP_GE) == 1 &&
               n("pw", CUDNN_POINTWISE_BINARY_SELECT) == 1;
    size_t total = ops.size();
    if (mm == 2 && mask && n("pw", CUDNN_POINTWISE_MUL) == 1 &&
        n("red", CUDNN_REDUCE_TENSOR_MAX) == 1 && n("pw", CUDNN_POINTWISE_SUB) == 1 &&
        n("pw", CUDNN_POINTWISE_EXP) == 1 && n("red", CUDNN_REDUCE_TENSOR_ADD) == 1 &&
        n("pw", CUDNN_POINTWISE_LOG) == 1 && n("pw", CUDNN_POINTWISE_ADD) == 1 &&
        n("pw", CUDNN_POINTWISE_DIV) == 1 && total == 14)
        return PAT_SDPA_FWD;
    int red = n("red", CUDNN_REDUCE_TENSOR_ADD);
    if (mm == 5 && mask && rs == 3 && n("pw", CUDNN_POINTWISE_MUL) == 5 &&
        n("pw", CUDNN_POINTWISE_SUB) == 2 && n("pw", CUDNN_POINTWISE_EXP) == 1 &&
        n("pw", CUDNN_POINTWISE_IDENTITY) == 1 && (red == 1 || red == 3) &&
        total == (size_t)(21 + red))
        return PAT_SDPA_BWD;
    *why = "the ops are not the fused attention forward or backward pattern:";
    for (auto &e : m)
        *why += " " + e.first + "x" + std::to_string(e.second);
    return PAT_NONE;
}

cudnnStatus_t fin_graph(Desc *g) {
    const char *fn = "cudnnBackendFinalize(operation graph)";
    if (g->ops.empty() || !g->handle) {
        complain(fn, "OPS and HANDLE must be set");
        return CUDNN_STATUS_BAD_PARAM;
    }
    /* tensors by uid: one description per uid, at most one producer, every virtual one produced */
    std::map<int64_t, const Desc *> tens;
    std::map<int64_t, const Desc *> producer;
    std::vector<const Desc *> in;
    const Desc *out;
    for (const Desc *o : g->ops) {
        io(o, &in, &out);
        in.push_back(out);
        for (const Desc *t : in) {
            auto it = tens.find(t->uid);
            if (it != tens.end() && it->second != t &&
                (it->second->nd != t->nd || it->second->dtype != t->dtype ||
                 it->second->virt != t->virt || it->second->byval != t->byval ||
                 memcmp(it->second->dim, t->dim, sizeof(t->dim)) ||
                 memcmp(it->second->str, t->str, sizeof(t->str)))) {
                complain(fn, "uid %lld names two different tensors", (long long)t->uid);
                return CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES;
            }
            tens[t->uid] = t;
        }
        if (producer.count(out->uid)) {
            complain(fn, "uid %lld is written by two operations", (long long)out->uid);
            return CUDNN_STATUS_BAD_PARAM;
        }
        if (out->byval) {
            complain(fn, "uid %lld is by-value and written", (long long)out->uid);
            return CUDNN_STATUS_BAD_PARAM;
        }
        producer[out->uid] = o;
    }
    for (auto &e : tens)
        if (e.second->virt && !producer.count(e.first)) {
            complain(fn, "virtual uid %lld is read but never written", (long long)e.first);
            return CUDNN_STATUS_BAD_PARAM;
        }
    /* topological order */
    g->order.clear();
    std::map<const Desc *, int> state;
    std::vector<Desc *> pending(g->ops.begin(), g->ops.end());
    std::map<int64_t, bool> ready;
    for (auto &e : tens)
        ready[e.first] = !producer.count(e.first);
    while (!pending.empty()) {
        bool moved = false;
        for (size_t i = 0; i < pending.size(); i++) {
            io(pending[i], &in, &out);
            bool ok = true;
            for (const Desc *t : in)
                ok = ok && ready[t->uid];
            if (!ok) continue;
            ready[out->uid] = true;
            g->order.push_back(pending[i]);
            pending.erase(pending.begin() + i);
            moved = true;
            break;
        }
        if (!moved) {
            complain(fn, "the graph has a cycle");
            return CUDNN_STATUS_BAD_PARAM;
        }
    }
    std::string why;
    g->pattern = recognise(g->ops, &why);
    if (g->pattern == PAT_NONE) {
        complain(fn, "%s", why.c_str());
        return CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN;
    }
    /* the fused engines' input/output rules: bf16 Q K V O dO dQ dK dV with unit innermost
     * stride, fp32 stats; head size a multiple of 8 up to 256; H a multiple of KV */
    for (auto &e : tens) {
        const Desc *t = e.second;
        if (t->virt || t->byval) continue;
        if (t->dtype == CUDNN_DATA_BFLOAT16) {
            int u = t->nd == 4 ? (t->str[3] == 1 ? 3 : t->str[2] == 1 ? 2 : -1) : -1;
            if (u < 0 || t->dim[u] % 8 || t->dim[u] > 256) {
                complain(fn,
                         "uid %lld: bf16 tensors must be 4-d with unit stride in one of the "
                         "last two dims, the head size, a multiple of 8 up to 256",
                         (long long)e.first);
                return CUDNN_STATUS_NOT_SUPPORTED_LAYOUT;
            }
        } else if (t->dtype != CUDNN_DATA_FLOAT) {
            complain(fn, "uid %lld: data type %lld not supported by the fused attention engine",
                     (long long)e.first, (long long)t->dtype);
            return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
        }
    }
    const Desc *first_mm = nullptr;
    for (const Desc *o : g->order) {
        if (o->type != CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR) continue;
        if (!first_mm && !o->x->virt) {
            first_mm = o;
            continue;
        }
        /* a product reading probabilities made in the graph takes them in the I/O type */
        const Desc *made = o->x->virt ? producer[o->x->uid] : nullptr;
        bool probs = made && (made->type == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR ||
                              (made->type == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR &&
                               made->op->mode == CUDNN_POINTWISE_DIV));
        if (probs && o->x->dtype != CUDNN_DATA_BFLOAT16) {
            complain(fn,
                     "a product's A operand (uid %lld: P, P^T or dS^T) must be bf16, the I/O "
                     "type",
                     (long long)o->x->uid);
            return CUDNN_STATUS_NOT_SUPPORTED;
        }
    }
    if (!first_mm) {
        complain(fn, "S = Q K^T: no product of two tensors in memory");
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    if (first_mm->x->dtype != CUDNN_DATA_BFLOAT16 || first_mm->b->dtype != CUDNN_DATA_BFLOAT16 ||
        first_mm->y->dim[1] % first_mm->b->dim[1]) {
        complain(fn, "S = Q K^T: Q and K must be bf16, and K's heads must divide Q's");
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    return CUDNN_STATUS_SUCCESS;
}

/* what the emulated engine asks for: scratch as large as the graph's largest non-virtual
 * tensor in fp32 (the order of cuDNN's own dQ accumulator), at least 1 MiB */
int64_t workspace_for(const Desc *g) {
    int64_t big = 0;
    for (const Desc *o : g->ops)
        for (const Desc *t : {o->x, o->b, o->t, o->y})
            if (t && !t->virt) big = std::max(big, numel(t));
    return std::max<int64_t>(big * 4, 1 << 20);
}

} // namespace

/* ---- the API ---------------------------------------------------------------------------- */

extern "C" {

size_t cudnnGetVersion(void) {
    return CUDNN_VERSION;
}

const char *cudnnGetErrorString(cudnnStatus_t s) {
    switch (s) {
    case CUDNN_STATUS_SUCCESS:
        return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM:
        return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED:
        return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN:
        return "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN";
    default:
        return "CUDNN_STATUS (emulated, see the emulator's message)";
    }
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
    if (!h) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *h = new cudnnContext{kHandleMagic, nullptr};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
    if (h && h->magic == kHandleMagic) {
        h->magic = 0;
        delete h;
    }
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
    if (!h || h->magic != kHandleMagic) return CUDNN_STATUS_BAD_PARAM;
    h->stream = s;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t t,
                                           cudnnBackendDescriptor_t *d) {
    if (!d) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    switch (t) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
        break;
    default:
        complain("cudnnBackendCreateDescriptor", "descriptor type %d not emulated", (int)t);
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    Desc *p = new Desc;
    p->type = t;
    *d = p;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d) {
    Desc *p = live(d);
    if (!p) return CUDNN_STATUS_BAD_PARAM;
    if (p->owns_engine && p->engine) { /* a plan keeps its graph, not the engine (Finalize) */
        p->engine->magic = 0;
        delete p->engine;
    }
    p->magic = 0;
    delete p;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                                       cudnnBackendAttributeType_t ty, int64_t n, const void *v) {
    Desc *p = live(d);
    if (!p) {
        complain("cudnnBackendSetAttribute", "not a live descriptor");
        return CUDNN_STATUS_BAD_PARAM;
    }
    if (p->fin) {
        complain("cudnnBackendSetAttribute", "descriptor already finalized (attribute %d)", (int)a);
        return CUDNN_STATUS_BAD_PARAM;
    }
    return set_attr(p, a, ty, n, v);
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t d) {
    Desc *p = live(d);
    if (!p) return CUDNN_STATUS_BAD_PARAM;
    if (p->fin) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
    switch (p->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
        s = fin_tensor(p);
        break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
        s = fin_graph(p);
        break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
        if (!p->graph || p->heur_mode < 0) {
            complain("cudnnBackendFinalize(heuristics)", "OPERATION_GRAPH and MODE must be set");
            s = CUDNN_STATUS_BAD_PARAM;
        }
        break;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
        if (!p->graph || p->gidx != 0) {
            complain("cudnnBackendFinalize(engine)", "OPERATION_GRAPH and GLOBAL_INDEX 0 (the one "
                                                     "emulated engine) must be set");
            s = CUDNN_STATUS_BAD_PARAM;
        }
        break;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
        if (!p->engine) {
            complain("cudnnBackendFinalize(engine config)", "ENGINE must be set");
            s = CUDNN_STATUS_BAD_PARAM;
        } else {
            p->ws = workspace_for(p->engine->graph);
        }
        break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
        if (!p->handle || p->handle->magic != kHandleMagic || !p->cfg) {
            complain("cudnnBackendFinalize(plan)", "HANDLE and ENGINE_CONFIG must be set");
            s = CUDNN_STATUS_BAD_PARAM;
        } else {
            p->graph = p->cfg->engine->graph;
            p->ws = p->cfg->ws;
        }
        break;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
        if (p->uids.size() != p->ptrs.size() || !p->has_ws) {
            complain("cudnnBackendFinalize(variant pack)", "%zu unique ids, %zu pointers%s",
                     p->uids.size(), p->ptrs.size(), p->has_ws ? "" : ", no WORKSPACE");
            s = CUDNN_STATUS_BAD_PARAM;
        }
        break;
    default:
        s = fin_op(p);
        break;
    }
    if (s == CUDNN_STATUS_SUCCESS) p->fin = true;
    return s;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const d,
                                       cudnnBackendAttributeName_t a,
                                       cudnnBackendAttributeType_t ty, int64_t req, int64_t *count,
                                       void *out) {
    const char *fn = "cudnnBackendGetAttribute";
    Desc *p = live(d);
    if (!p || !p->fin) {
        complain(fn, "not a live, finalized descriptor");
        return p ? CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED : CUDNN_STATUS_BAD_PARAM;
    }
    if (p->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && a == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
        if (ty != CUDNN_TYPE_BACKEND_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM;
        if (count) *count = 1; /* one engine: the host interpreter */
        if (req < 1 || !out) return CUDNN_STATUS_SUCCESS;
        Desc *cfg = live(static_cast<cudnnBackendDescriptor_t *>(out)[0]);
        if (!cfg || cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR || cfg->fin) {
            complain(fn, "ENGINEHEUR_RESULTS needs created, unfinalized ENGINECFG descriptors");
            return CUDNN_STATUS_BAD_PARAM;
        }
        Desc *eng = new Desc;
        eng->type = CUDNN_BACKEND_ENGINE_DESCRIPTOR;
        eng->graph = p->graph;
        eng->gidx = 0;
        eng->fin = true;
        cfg->engine = eng; /* owned by the config from here on: destroyed with it */
        cfg->owns_engine = true;
        cfg->ws = workspace_for(p->graph);
        cfg->fin = true;
        return CUDNN_STATUS_SUCCESS;
    }
    if ((p->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR &&
         a == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) ||
        (p->type == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR &&
         a == CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE)) {
        if (ty != CUDNN_TYPE_INT64 || req < 1 || !out) return CUDNN_STATUS_BAD_PARAM;
        *static_cast<int64_t *>(out) = p->ws;
        if (count) *count = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    complain(fn, "attribute %d of descriptor type %d not emulated", (int)a, (int)p->type);
    return CUDNN_STATUS_NOT_SUPPORTED;
}

} /* extern "C" */
