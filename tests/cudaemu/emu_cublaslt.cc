/* Test-only host emulator of the cuBLASLt subset that model/cuda/cuda_linear.cu uses, so the
 * CUDA backend can run on the CPU in tests ("device" pointers are plain host memory, the product
 * runs synchronously on the host; the stream and the workspace are ignored).
 *
 * Written from NVIDIA's documentation of cuBLASLt (the doc comments of <cublasLt.h>, which are the
 * text of docs.nvidia.com/cuda/cublas's cuBLASLt reference, and NVIDIA's nvmath-python epilogue
 * tests for the GELU form), NOT from what cuda_linear.cu expects: its job is to catch layout and
 * convention mistakes there. Documented facts relied on:
 *  - D = alpha * op(A) op(B) + beta * C, column-major (CUBLASLT_ORDER_COL, the default): element
 *    (r, c) of a layout (type, rows, cols, ld) is at r + c * ld, and ld >= rows. op(A) is m x k,
 *    op(B) is k x n, C and D are m x n.
 *  - BIAS: the bias vector's length is D's row count (m), packed, "broadcasted to all columns and
 *    added before applying final postprocessing"; its type defaults to D's type.
 *  - GELU_AUX(_BIAS): D = GELU(x) and the aux matrix receives the GELU input x (after the bias),
 *    stored in the aux type (default: D's type) with EPILOGUE_AUX_LD as its leading dimension,
 *    which "must be divisible by 8 and be no less than the number of rows in the output matrix".
 *    GELU is the tanh form 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))).
 *  - DGELU: D = (matmul output) * gelu'(aux), aux holding the forward's GELU input.
 *  - DGELU_BGRAD: also bias[i] = sum over columns of row i of D. BGRADA: bias (length m) = op(A)
 *    summed over k; BGRADB: bias (length n) = op(B) summed over k. D is the plain product.
 * Arithmetic: each dot product is accumulated in float in k order (CUBLAS_COMPUTE_32F), then
 * alpha, + beta * C (C is not read when beta == 0), then the epilogue, then rounding to D's type
 * (bf16: round to nearest even). */
#include <cublasLt.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>

/* The product is accumulated exactly as written: no fused multiply-adds. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* The handle type is an incomplete struct in the header: this is its definition. */
struct cublasLtContext {
    uint32_t magic;
};

namespace {

constexpr uint32_t kCtxMagic = 0x4c744358u;    /* "XCtL" */
constexpr uint32_t kDescMagic = 0x4c744444u;   /* "DDtL" */
constexpr uint32_t kLayoutMagic = 0x4c74594cu; /* "LYtL" */
constexpr uint32_t kPrefMagic = 0x4c745250u;   /* "PRtL" */
/* What cublasLtMatmulAlgoGetHeuristic puts in the algo: "cuLtEmu" and a version. */
constexpr uint64_t kAlgoTag = 0x00756d45744c7563ull; /* bytes "cuLtEmu\0" */
constexpr uint64_t kAlgoVersion = 1;

struct Desc {
    uint32_t magic;
    int32_t compute;
    int32_t scale;
    int32_t transa, transb;
    uint32_t epilogue;
    const void *bias;
    int32_t bias_type; /* -1: D's type */
    void *aux;
    int64_t aux_ld;
    int32_t aux_type; /* -1: D's type */
};
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t), "Desc fits the opaque struct");

struct Layout {
    uint32_t magic;
    int32_t type;
    uint64_t rows, cols;
    int64_t ld;
};
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "Layout fits");

struct Pref {
    uint32_t magic;
    uint32_t reduction_mask;
    uint64_t max_workspace;
    uint32_t min_align[4];
};
static_assert(sizeof(Pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "Pref fits");

template <class T, class O> T *state(O *o) { return reinterpret_cast<T *>(o->data); }

__attribute__((format(printf, 2, 3))) void complain(const char *fn, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "emu_cublaslt: %s: ", fn);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

bool type_ok(int32_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }
size_t type_size(int32_t t) { return t == CUDA_R_32F ? 4 : 2; }
const char *type_name(int32_t t) {
    return t == CUDA_R_32F ? "CUDA_R_32F" : t == CUDA_R_16BF ? "CUDA_R_16BF" : "an unsupported type";
}

float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

float load(const void *p, int32_t type, uint64_t idx) {
    if (type == CUDA_R_32F) return static_cast<const float *>(p)[idx];
    return bf16_to_float(static_cast<const uint16_t *>(p)[idx]);
}

void store(void *p, int32_t type, uint64_t idx, float v) {
    if (type == CUDA_R_32F)
        static_cast<float *>(p)[idx] = v;
    else
        static_cast<uint16_t *>(p)[idx] = float_to_bf16(v);
}

const float kSqrt2OverPi = 0.7978845608028654f;
const float kGeluC = 0.044715f;

float gelu(float x) {
    float u = kSqrt2OverPi * (x + kGeluC * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

float gelu_grad(float x) { /* d/dx of the tanh form above */
    float u = kSqrt2OverPi * (x + kGeluC * x * x * x);
    float t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluC * x * x);
}

/* What an epilogue needs. */
struct EpiInfo {
    bool known;
    bool bias_in;   /* reads a bias vector of length m */
    bool gelu;      /* D = gelu(x) */
    bool aux_out;   /* writes the GELU input to aux */
    bool dgelu;     /* D = x * gelu'(aux) */
    int bias_grad;  /* 0: none, 'D': row sums of D (length m), 'A': op(A) summed over k (length m),
                       'B': op(B) summed over k (length n) */
    bool uses_aux() const { return aux_out || dgelu; }
    bool uses_bias() const { return bias_in || bias_grad != 0; }
};

EpiInfo epi_info(uint32_t e) {
    EpiInfo i{};
    i.known = true;
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: break;
    case CUBLASLT_EPILOGUE_BIAS: i.bias_in = true; break;
    case CUBLASLT_EPILOGUE_GELU: i.gelu = true; break;
    case CUBLASLT_EPILOGUE_GELU_BIAS: i.gelu = i.bias_in = true; break;
    case CUBLASLT_EPILOGUE_GELU_AUX: i.gelu = i.aux_out = true; break;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: i.gelu = i.aux_out = i.bias_in = true; break;
    case CUBLASLT_EPILOGUE_DGELU: i.dgelu = true; break;
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: i.dgelu = true; i.bias_grad = 'D'; break;
    case CUBLASLT_EPILOGUE_BGRADA: i.bias_grad = 'A'; break;
    case CUBLASLT_EPILOGUE_BGRADB: i.bias_grad = 'B'; break;
    default: i.known = false; break;
    }
    return i;
}

/* The problem once validated. */
struct Problem {
    const Desc *d;
    const Layout *a, *b, *c, *dd;
    uint64_t m, n, k;
    bool ta, tb;
    EpiInfo epi;
    int32_t bias_type, aux_type;
};

const char *op_name(bool t) { return t ? "OP_T" : "OP_N"; }

/* Everything that cublasLtMatmulAlgoGetHeuristic and cublasLtMatmul check alike. */
cublasStatus_t validate(const char *fn, cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                        cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                        cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld, Problem *p) {
    if (!h || h->magic != kCtxMagic) {
        complain(fn, "the handle is %s", h ? "not a live cublasLtHandle_t" : "NULL");
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    if (!desc || state<Desc>(desc)->magic != kDescMagic) {
        complain(fn, "the matmul descriptor is %s", desc ? "not a live descriptor" : "NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    cublasLtMatrixLayout_t ls[4] = {la, lb, lc, ld};
    const char *names[4] = {"A", "B", "C", "D"};
    for (int i = 0; i < 4; i++)
        if (!ls[i] || state<Layout>(ls[i])->magic != kLayoutMagic) {
            complain(fn, "the %s layout is %s", names[i], ls[i] ? "not a live layout" : "NULL");
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    const Desc *d = state<Desc>(desc);
    const Layout *a = state<Layout>(la), *b = state<Layout>(lb), *c = state<Layout>(lc),
                 *dd = state<Layout>(ld);
    const Layout *all[4] = {a, b, c, dd};

    if (d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F) {
        complain(fn, "compute type %d / scale type %d: only CUBLAS_COMPUTE_32F / CUDA_R_32F are emulated",
                 (int)d->compute, (int)d->scale);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    for (int i = 0; i < 4; i++) {
        if (!type_ok(all[i]->type)) {
            complain(fn, "matrix %s has data type %d: only CUDA_R_32F and CUDA_R_16BF are emulated",
                     names[i], (int)all[i]->type);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
    }
    /* Type combinations of the cublasLtMatmul table for CUBLAS_COMPUTE_32F / CUDA_R_32F scale:
       A, B and C, D pairwise equal; fp32 inputs need fp32 outputs. */
    if (a->type != b->type || c->type != dd->type || (a->type == CUDA_R_32F && c->type != CUDA_R_32F)) {
        complain(fn, "type combination A=%s B=%s C=%s D=%s is not emulated", type_name(a->type),
                 type_name(b->type), type_name(c->type), type_name(dd->type));
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if ((d->transa != CUBLAS_OP_N && d->transa != CUBLAS_OP_T) ||
        (d->transb != CUBLAS_OP_N && d->transb != CUBLAS_OP_T)) {
        complain(fn, "TRANSA=%d TRANSB=%d: only CUBLAS_OP_N and CUBLAS_OP_T are emulated",
                 (int)d->transa, (int)d->transb);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    EpiInfo epi = epi_info(d->epilogue);
    if (!epi.known) {
        complain(fn, "epilogue %u is not emulated", d->epilogue);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    for (int i = 0; i < 4; i++) {
        if (all[i]->ld < 0 || (uint64_t)all[i]->ld < all[i]->rows || all[i]->ld == 0) {
            complain(fn, "matrix %s: ld=%lld but rows=%llu (column-major needs ld >= rows, ld > 0)",
                     names[i], (long long)all[i]->ld, (unsigned long long)all[i]->rows);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    bool ta = d->transa == CUBLAS_OP_T, tb = d->transb == CUBLAS_OP_T;
    uint64_t m = dd->rows, n = dd->cols;
    uint64_t k = ta ? a->rows : a->cols;
    uint64_t am = ta ? a->cols : a->rows;
    if (am != m) {
        complain(fn, "A layout is %llux%llu; with TRANSA=%s op(A) is %llux%llu, whose %llu rows must match "
                 "D's m=%llu", (unsigned long long)a->rows, (unsigned long long)a->cols, op_name(ta),
                 (unsigned long long)am, (unsigned long long)k, (unsigned long long)am,
                 (unsigned long long)m);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    uint64_t bk = tb ? b->cols : b->rows, bn = tb ? b->rows : b->cols;
    if (bk != k || bn != n) {
        complain(fn, "B layout is %llux%llu; with TRANSB=%s op(B) is %llux%llu but must be k x n = "
                 "%llux%llu (k from op(A), n from D)", (unsigned long long)b->rows,
                 (unsigned long long)b->cols, op_name(tb), (unsigned long long)bk,
                 (unsigned long long)bn, (unsigned long long)k, (unsigned long long)n);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (c->rows != m || c->cols != n) {
        complain(fn, "C layout is %llux%llu but D is m x n = %llux%llu", (unsigned long long)c->rows,
                 (unsigned long long)c->cols, (unsigned long long)m, (unsigned long long)n);
        return CUBLAS_STATUS_INVALID_VALUE;
    }

    int32_t bias_type = d->bias_type == -1 ? dd->type : d->bias_type;
    if (epi.uses_bias() && bias_type != dd->type) {
        complain(fn, "bias data type %s differs from D's %s (the documented bias type for these "
                 "kernels is D's type)", type_name(bias_type), type_name(dd->type));
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    int32_t aux_type = d->aux_type == -1 ? dd->type : d->aux_type;
    if (epi.uses_aux()) {
        if (aux_type != dd->type) {
            complain(fn, "EPILOGUE_AUX_DATA_TYPE %s is unsupported with D of type %s (the GELU input "
                     "matrix has D's element type)", type_name(aux_type), type_name(dd->type));
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        if (d->aux_ld < 0 || (uint64_t)d->aux_ld < m || d->aux_ld % 8 != 0 || d->aux_ld == 0) {
            complain(fn, "EPILOGUE_AUX_LD=%lld: it must be divisible by 8 and no less than D's rows m=%llu",
                     (long long)d->aux_ld, (unsigned long long)m);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }

    p->d = d;
    p->a = a, p->b = b, p->c = c, p->dd = dd;
    p->m = m, p->n = n, p->k = k;
    p->ta = ta, p->tb = tb;
    p->epi = epi;
    p->bias_type = bias_type, p->aux_type = aux_type;
    return CUBLAS_STATUS_SUCCESS;
}

bool aligned_for(const void *ptr, int32_t type) {
    return reinterpret_cast<uintptr_t>(ptr) % type_size(type) == 0;
}

} // namespace

extern "C" {

size_t CUBLASWINAPI cublasLtGetVersion(void) { return CUBLAS_VERSION; } // the headers' version

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t *lightHandle) {
    if (!lightHandle) {
        complain("cublasLtCreate", "lightHandle is NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    cublasLtContext *c = new (std::nothrow) cublasLtContext;
    if (!c) return CUBLAS_STATUS_ALLOC_FAILED;
    c->magic = kCtxMagic;
    *lightHandle = c;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
    if (!lightHandle || lightHandle->magic != kCtxMagic) {
        complain("cublasLtDestroy", "the handle is %s", lightHandle ? "not live" : "NULL");
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    lightHandle->magic = 0;
    delete lightHandle;
    return CUBLAS_STATUS_SUCCESS;
}

const char *CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS: the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED: the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED: resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE: an invalid value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH: an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR: an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED: the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR: an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED: the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR: license error";
    }
    return "unknown cuBLAS status";
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                                     cublasComputeType_t computeType,
                                                     cudaDataType_t scaleType) {
    if (!matmulDesc) {
        complain("cublasLtMatmulDescCreate", "matmulDesc is NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (computeType != CUBLAS_COMPUTE_32F || scaleType != CUDA_R_32F) {
        complain("cublasLtMatmulDescCreate",
                 "compute type %d / scale type %d: only CUBLAS_COMPUTE_32F / CUDA_R_32F are emulated",
                 (int)computeType, (int)scaleType);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    cublasLtMatmulDescOpaque_t *o = new (std::nothrow) cublasLtMatmulDescOpaque_t;
    if (!o) return CUBLAS_STATUS_ALLOC_FAILED;
    memset(o, 0, sizeof(*o));
    Desc *d = new (o->data) Desc{};
    d->magic = kDescMagic;
    d->compute = computeType;
    d->scale = scaleType;
    d->transa = CUBLAS_OP_N;
    d->transb = CUBLAS_OP_N;
    d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    d->bias = nullptr;
    d->bias_type = -1;
    d->aux = nullptr;
    d->aux_ld = 0;
    d->aux_type = -1;
    *matmulDesc = o;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    if (!matmulDesc) return CUBLAS_STATUS_SUCCESS;
    if (state<Desc>(matmulDesc)->magic != kDescMagic) {
        complain("cublasLtMatmulDescDestroy", "not a live matmul descriptor");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    state<Desc>(matmulDesc)->magic = 0;
    delete matmulDesc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           const void *buf, size_t sizeInBytes) {
    const char *fn = "cublasLtMatmulDescSetAttribute";
    if (!matmulDesc || state<Desc>(matmulDesc)->magic != kDescMagic) {
        complain(fn, "the descriptor is %s", matmulDesc ? "not live" : "NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    Desc *d = state<Desc>(matmulDesc);
    size_t want;
    const char *name;
    switch (attr) { /* sizes: the types documented for each attribute in cublasLt.h */
    case CUBLASLT_MATMUL_DESC_TRANSA: want = sizeof(int32_t), name = "TRANSA"; break;
    case CUBLASLT_MATMUL_DESC_TRANSB: want = sizeof(int32_t), name = "TRANSB"; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: want = sizeof(uint32_t), name = "EPILOGUE"; break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: want = sizeof(void *), name = "BIAS_POINTER"; break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: want = sizeof(int32_t), name = "BIAS_DATA_TYPE"; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: want = sizeof(void *), name = "EPILOGUE_AUX_POINTER"; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: want = sizeof(int64_t), name = "EPILOGUE_AUX_LD"; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: want = sizeof(int32_t), name = "EPILOGUE_AUX_DATA_TYPE"; break;
    default:
        complain(fn, "attribute %d is not emulated", (int)attr);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!buf || sizeInBytes != want) {
        complain(fn, "%s: buf=%p sizeInBytes=%zu, the attribute's documented type has %zu bytes", name, buf,
                 sizeInBytes, want);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: memcpy(&d->transa, buf, want); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: memcpy(&d->transb, buf, want); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: memcpy(&d->epilogue, buf, want); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: memcpy(&d->bias, buf, want); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: memcpy(&d->bias_type, buf, want); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: memcpy(&d->aux, buf, want); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: memcpy(&d->aux_ld, buf, want); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: memcpy(&d->aux_type, buf, want); break;
    default: break;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout,
                                                       cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
    if (!matLayout) {
        complain("cublasLtMatrixLayoutCreate", "matLayout is NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    cublasLtMatrixLayoutOpaque_t *o = new (std::nothrow) cublasLtMatrixLayoutOpaque_t;
    if (!o) return CUBLAS_STATUS_ALLOC_FAILED;
    memset(o, 0, sizeof(*o));
    Layout *l = new (o->data) Layout{};
    l->magic = kLayoutMagic;
    l->type = type;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld;
    *matLayout = o;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    if (!matLayout) return CUBLAS_STATUS_SUCCESS;
    if (state<Layout>(matLayout)->magic != kLayoutMagic) {
        complain("cublasLtMatrixLayoutDestroy", "not a live layout");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    state<Layout>(matLayout)->magic = 0;
    delete matLayout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    if (!pref) {
        complain("cublasLtMatmulPreferenceCreate", "pref is NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    cublasLtMatmulPreferenceOpaque_t *o = new (std::nothrow) cublasLtMatmulPreferenceOpaque_t;
    if (!o) return CUBLAS_STATUS_ALLOC_FAILED;
    memset(o, 0, sizeof(*o));
    Pref *p = new (o->data) Pref{};
    p->magic = kPrefMagic;
    p->reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
    p->max_workspace = 0;
    for (int i = 0; i < 4; i++) p->min_align[i] = 256;
    *pref = o;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    if (!pref) return CUBLAS_STATUS_SUCCESS;
    if (state<Pref>(pref)->magic != kPrefMagic) {
        complain("cublasLtMatmulPreferenceDestroy", "not a live preference");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    state<Pref>(pref)->magic = 0;
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void *buf, size_t sizeInBytes) {
    const char *fn = "cublasLtMatmulPreferenceSetAttribute";
    if (!pref || state<Pref>(pref)->magic != kPrefMagic) {
        complain(fn, "the preference is %s", pref ? "not live" : "NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    Pref *p = state<Pref>(pref);
    size_t want;
    void *dst;
    switch (attr) { /* values are recorded but do not change the emulated product */
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: want = sizeof(uint64_t), dst = &p->max_workspace; break;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: want = sizeof(uint32_t), dst = &p->reduction_mask; break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: want = sizeof(uint32_t), dst = &p->min_align[0]; break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: want = sizeof(uint32_t), dst = &p->min_align[1]; break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: want = sizeof(uint32_t), dst = &p->min_align[2]; break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: want = sizeof(uint32_t), dst = &p->min_align[3]; break;
    default:
        complain(fn, "attribute %d is not emulated", (int)attr);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!buf || sizeInBytes != want) {
        complain(fn, "attribute %d: buf=%p sizeInBytes=%zu, the attribute's documented type has %zu bytes",
                 (int)attr, buf, sizeInBytes, want);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    memcpy(dst, buf, want);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                                           cublasLtMatmulDesc_t operationDesc,
                                                           cublasLtMatrixLayout_t Adesc,
                                                           cublasLtMatrixLayout_t Bdesc,
                                                           cublasLtMatrixLayout_t Cdesc,
                                                           cublasLtMatrixLayout_t Ddesc,
                                                           cublasLtMatmulPreference_t preference,
                                                           int requestedAlgoCount,
                                                           cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                           int *returnAlgoCount) {
    const char *fn = "cublasLtMatmulAlgoGetHeuristic";
    if (returnAlgoCount) *returnAlgoCount = 0;
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount) {
        complain(fn, "requestedAlgoCount=%d results=%p returnAlgoCount=%p", requestedAlgoCount,
                 (void *)heuristicResultsArray, (void *)returnAlgoCount);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!preference || state<Pref>(preference)->magic != kPrefMagic) {
        complain(fn, "the preference is %s", preference ? "not live" : "NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    Problem p;
    cublasStatus_t st = validate(fn, lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    cublasLtMatmulHeuristicResult_t *r = &heuristicResultsArray[0];
    memset(r, 0, sizeof(*r));
    r->algo.data[0] = kAlgoTag;
    r->algo.data[1] = kAlgoVersion;
    r->algo.data[2] = p.m;
    r->algo.data[3] = p.n;
    r->algo.data[4] = p.k;
    r->algo.data[5] = p.d->epilogue;
    r->workspaceSize = 0;
    r->state = CUBLAS_STATUS_SUCCESS;
    r->wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* The runtime's streams (emu_sched.cc): a product is work on its stream, run when the
 * runtime's scheduler reaches it. Weak: test_emu_cublaslt runs without the runtime (at once). */
extern "C++" void emu_stream_exec(cudaStream_t s, const char *what, void (*run)(void *),
                                  void *ctx) __attribute__((weak));

/* a product as given: what it reads of the descriptors is copied (they may be destroyed or
 * changed once cublasLtMatmul returns) */
struct MatmulJob {
    Problem p;
    Desc d;
    Layout a, b, c, dd;
    float al, be;
    const void *A, *B, *C;
    void *D;
};
static void matmul_run(const MatmulJob &j);
static void matmul_job(void *ctx) {
    MatmulJob *j = static_cast<MatmulJob *>(ctx);
    matmul_run(*j);
    delete j;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                           const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                                           const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                                           const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                                           cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                                           void *workspace, size_t workspaceSizeInBytes,
                                           cudaStream_t stream) {
    const char *fn = "cublasLtMatmul";
    Problem p;
    cublasStatus_t st = validate(fn, lightHandle, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (algo && algo->data[0] != kAlgoTag) {
        complain(fn, "the algo was not filled in by cublasLtMatmulAlgoGetHeuristic");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!alpha || !beta) {
        complain(fn, "alpha=%p beta=%p (host pointers expected)", alpha, beta);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const float al = *static_cast<const float *>(alpha), be = *static_cast<const float *>(beta);
    const uint64_t m = p.m, n = p.n, k = p.k;
    const bool work = m > 0 && n > 0;
    if (work && (!D || (k > 0 && (!A || !B)) || (be != 0.0f && !C))) {
        complain(fn, "A=%p B=%p C=%p D=%p: a matrix the product needs is NULL", A, B, C, (void *)D);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if ((A && !aligned_for(A, p.a->type)) || (B && !aligned_for(B, p.b->type)) ||
        (C && !aligned_for(C, p.c->type)) || (D && !aligned_for(D, p.dd->type))) {
        complain(fn, "a matrix pointer is not aligned to its element size");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (C && C == D && (p.c->ld != p.dd->ld || p.c->type != p.dd->type)) {
        complain(fn, "in-place (C == D) needs identical C and D layouts: ldc=%lld ldd=%lld",
                 (long long)p.c->ld, (long long)p.dd->ld);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const Desc *d = p.d;
    if (p.epi.uses_bias() && !d->bias) {
        complain(fn, "epilogue %u needs CUBLASLT_MATMUL_DESC_BIAS_POINTER, which is NULL", d->epilogue);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (p.epi.uses_bias() && !aligned_for(d->bias, p.bias_type)) {
        complain(fn, "the bias pointer is not aligned to its element size");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (p.epi.uses_aux() && !d->aux) {
        complain(fn, "epilogue %u needs CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, which is NULL", d->epilogue);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (p.epi.uses_aux() && !aligned_for(d->aux, p.aux_type)) {
        complain(fn, "the aux pointer is not aligned to its element size");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!work) return CUBLAS_STATUS_SUCCESS;
    MatmulJob *j = new (std::nothrow) MatmulJob{p, *p.d, *p.a, *p.b, *p.c, *p.dd, al, be, A, B, C, D};
    if (!j) return CUBLAS_STATUS_ALLOC_FAILED;
    j->p.d = &j->d, j->p.a = &j->a, j->p.b = &j->b, j->p.c = &j->c, j->p.dd = &j->dd;
    if (emu_stream_exec)
        emu_stream_exec(stream, "cublasLtMatmul", matmul_job, j);
    else
        matmul_job(j);
    return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"

static void matmul_run(const MatmulJob &j) {
    const Problem &p = j.p;
    const float al = j.al, be = j.be;
    const void *A = j.A, *B = j.B, *C = j.C;
    void *D = j.D;
    const Desc *d = p.d;
    const uint64_t m = p.m, n = p.n, k = p.k;
    const int32_t tat = p.a->type, tbt = p.b->type, tct = p.c->type, tdt = p.dd->type;
    const uint64_t lda = (uint64_t)p.a->ld, ldb = (uint64_t)p.b->ld, ldc = (uint64_t)p.c->ld,
                   ldd = (uint64_t)p.dd->ld, ldx = (uint64_t)d->aux_ld;
    const EpiInfo &epi = p.epi;

    /* Bias gradients from the inputs, computed before D is written (A or B may not alias D,
       but this keeps the order independent of that). */
    if (epi.bias_grad == 'A')
        for (uint64_t i = 0; i < m; i++) {
            float s = 0.0f;
            for (uint64_t q = 0; q < k; q++) s += load(A, tat, p.ta ? q + i * lda : i + q * lda);
            store(const_cast<void *>(d->bias), p.bias_type, i, s);
        }
    if (epi.bias_grad == 'B')
        for (uint64_t j = 0; j < n; j++) {
            float s = 0.0f;
            for (uint64_t q = 0; q < k; q++) s += load(B, tbt, p.tb ? j + q * ldb : q + j * ldb);
            store(const_cast<void *>(d->bias), p.bias_type, j, s);
        }
    float *rowsum = nullptr;
    if (epi.bias_grad == 'D') {
        rowsum = new (std::nothrow) float[m];
        if (!rowsum) {
            fprintf(stderr, "cublasLtMatmul (emulated): out of memory\n");
            abort();
        }
        for (uint64_t i = 0; i < m; i++) rowsum[i] = 0.0f;
    }

    for (uint64_t j = 0; j < n; j++)
        for (uint64_t i = 0; i < m; i++) {
            float acc = 0.0f;
            for (uint64_t q = 0; q < k; q++) {
                float av = load(A, tat, p.ta ? q + i * lda : i + q * lda); /* op(A)(i, q) */
                float bv = load(B, tbt, p.tb ? j + q * ldb : q + j * ldb); /* op(B)(q, j) */
                acc += av * bv;
            }
            float v = al * acc;
            if (be != 0.0f) v += be * load(C, tct, i + j * ldc);
            if (epi.bias_in) v += load(d->bias, p.bias_type, i);
            if (epi.aux_out) store(d->aux, p.aux_type, i + j * ldx, v);
            if (epi.gelu) v = gelu(v);
            if (epi.dgelu) v *= gelu_grad(load(d->aux, p.aux_type, i + j * ldx));
            if (rowsum) rowsum[i] += v;
            store(D, tdt, i + j * ldd, v);
        }
    if (rowsum) {
        for (uint64_t i = 0; i < m; i++) store(const_cast<void *>(d->bias), p.bias_type, i, rowsum[i]);
        delete[] rowsum;
    }
}
