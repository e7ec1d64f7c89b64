/* Standalone test of tests/cudaemu/emu_cublaslt.cc, the test-only host emulator of the cuBLASLt
 * subset model/cuda/cuda_linear.cu uses (written from the cuBLASLt documentation). It checks the
 * emulator against a plain row-major triple-loop reference written independently here (double
 * precision, logical op(A) m x k, op(B) k x n, C and D m x n), which is then stored column-major
 * with padded leading dimensions the way cuBLASLt's documentation lays matrices out.
 * Prints one line per check; exits 0 when all pass, 1 otherwise.
 * Build: g++ -std=c++17 -O1 -Wall -Wextra -Werror -Wno-unused-parameter -I<cuda>/include \
 *          tests/cudaemu/emu_cublaslt.cc tests/cudaemu/test_emu_cublaslt.cc -o /tmp/t && /tmp/t */
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

int g_failed = 0, g_checks = 0;

void report(bool ok, const std::string &name, const std::string &detail = "") {
    g_checks++;
    if (!ok) g_failed++;
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name.c_str(), detail.empty() ? "" : ": ", detail.c_str());
}

/* ---- numbers ---- */

uint64_t g_rng = 0x9e3779b97f4a7c15ull;
double urand() { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* bf16 as the top half of an IEEE float; rounding to nearest even done by hand on the value
   (written independently of the emulator's bit trick). */
double bf16_round(double x) {
    if (x == 0.0 || !std::isfinite(x)) return x;
    int e;
    double f = std::frexp(x, &e);            /* x = f * 2^e, 0.5 <= |f| < 1 */
    double scaled = std::ldexp(f, 8);        /* 8 significant bits */
    double r = std::nearbyint(scaled);       /* default rounding mode: ties to even */
    return std::ldexp(r, e - 8);
}
uint16_t bf16_bits(double x) { /* x must already be bf16-representable */
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}
double bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

double ref_gelu(double x) {
    const double pi = 3.14159265358979323846;
    return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
}
double ref_gelu_grad(double x) { /* numerically differentiated independently: central difference */
    double h = 1e-5;
    return (ref_gelu(x + h) - ref_gelu(x - h)) / (2.0 * h);
}

/* ---- device-side (column-major) buffers ---- */

struct Buf {
    cudaDataType_t type;
    size_t n;
    std::vector<float> f;
    std::vector<uint16_t> h;
    Buf(cudaDataType_t t, size_t count) : type(t), n(count) {
        if (t == CUDA_R_32F) f.assign(count, 0.0f);
        else h.assign(count, 0);
    }
    void *ptr() { return type == CUDA_R_32F ? (void *)f.data() : (void *)h.data(); }
    void set(size_t i, double v) { /* v must be representable */
        if (type == CUDA_R_32F) f[i] = (float)v;
        else h[i] = bf16_bits(v);
    }
    double get(size_t i) const { return type == CUDA_R_32F ? (double)f[i] : bf16_value(h[i]); }
    bool same_bits(size_t i, const Buf &o) const {
        return type == CUDA_R_32F ? memcmp(&f[i], &o.f[i], 4) == 0 : h[i] == o.h[i];
    }
};

double representable(cudaDataType_t t, double v) { return t == CUDA_R_32F ? (double)(float)v : bf16_round(v); }

const double kSentinel = -1536.0; /* exactly representable in both types */

struct Case {
    std::string name;
    cudaDataType_t ab = CUDA_R_32F, cd = CUDA_R_32F;
    bool ta = false, tb = false;
    int m = 5, n = 7, k = 3;
    int pad_a = 2, pad_b = 3, pad_c = 1; /* ld = rows + pad */
    float alpha = 1.0f, beta = 0.0f;
    bool in_place = true; /* C == D (when beta != 0 this is the in-place accumulate) */
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    int aux_ld = 0; /* 0: round m up to a multiple of 8, plus 8 */
};

/* Runs one product through the emulator and compares it with the reference. */
void run_case(cublasLtHandle_t lt, const Case &cs) {
    const int m = cs.m, n = cs.n, k = cs.k;
    const bool bias_in = cs.epi == CUBLASLT_EPILOGUE_BIAS || cs.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const bool aux_out = cs.epi == CUBLASLT_EPILOGUE_GELU_AUX || cs.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const bool dgelu = cs.epi == CUBLASLT_EPILOGUE_DGELU || cs.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    const bool uses_aux = aux_out || dgelu;
    const int bgrad = cs.epi == CUBLASLT_EPILOGUE_BGRADA ? 'A' : cs.epi == CUBLASLT_EPILOGUE_BGRADB ? 'B'
                      : cs.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD ? 'D' : 0;

    /* logical row-major operands */
    std::vector<double> Aop((size_t)m * k), Bop((size_t)k * n), C0((size_t)m * n), bias(m),
        auxin((size_t)m * n);
    for (auto &v : Aop) v = representable(cs.ab, urand());
    for (auto &v : Bop) v = representable(cs.ab, urand());
    for (auto &v : C0) v = representable(cs.cd, urand());
    for (auto &v : bias) v = representable(cs.cd, urand());
    for (auto &v : auxin) v = representable(cs.cd, 2.5 * urand());

    /* reference: row-major triple loop */
    std::vector<double> pre((size_t)m * n), refD((size_t)m * n), scale((size_t)m * n);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0, sa = 0;
            for (int p = 0; p < k; p++) {
                s += Aop[(size_t)i * k + p] * Bop[(size_t)p * n + j];
                sa += std::fabs(Aop[(size_t)i * k + p] * Bop[(size_t)p * n + j]);
            }
            double x = cs.alpha * s + (cs.beta != 0.0f ? cs.beta * C0[(size_t)i * n + j] : 0.0);
            if (bias_in) x += bias[i];
            pre[(size_t)i * n + j] = x;
            double y = x;
            if (aux_out) y = ref_gelu(x);
            if (dgelu) y = x * ref_gelu_grad(auxin[(size_t)i * n + j]);
            refD[(size_t)i * n + j] = y;
            scale[(size_t)i * n + j] = std::fabs(cs.alpha) * sa + std::fabs(cs.beta * C0[(size_t)i * n + j]) +
                                       (bias_in ? std::fabs(bias[i]) : 0.0) + 1e-3;
        }

    /* column-major storage */
    const int arows = cs.ta ? k : m, acols = cs.ta ? m : k, brows = cs.tb ? n : k, bcols = cs.tb ? k : n;
    const int lda = arows + cs.pad_a, ldb = brows + cs.pad_b, ldc = m + cs.pad_c;
    const int auxld = cs.aux_ld ? cs.aux_ld : ((m + 7) / 8) * 8 + 8;
    Buf A(cs.ab, (size_t)lda * acols), B(cs.ab, (size_t)ldb * bcols), Cb(cs.cd, (size_t)ldc * n),
        Db(cs.cd, (size_t)ldc * n), Xb(cs.cd, (size_t)auxld * n), Bias(cs.cd, (size_t)std::max(m, n) + 4);
    for (size_t i = 0; i < A.n; i++) A.set(i, kSentinel);
    for (size_t i = 0; i < B.n; i++) B.set(i, kSentinel);
    for (size_t i = 0; i < Db.n; i++) Db.set(i, kSentinel);
    for (size_t i = 0; i < Xb.n; i++) Xb.set(i, kSentinel);
    for (size_t i = 0; i < Bias.n; i++) Bias.set(i, kSentinel);
    for (int i = 0; i < m; i++)
        for (int p = 0; p < k; p++) /* op(A)(i, p) */
            A.set(cs.ta ? (size_t)p + (size_t)i * lda : (size_t)i + (size_t)p * lda, Aop[(size_t)i * k + p]);
    for (int p = 0; p < k; p++)
        for (int j = 0; j < n; j++) /* op(B)(p, j) */
            B.set(cs.tb ? (size_t)j + (size_t)p * ldb : (size_t)p + (size_t)j * ldb, Bop[(size_t)p * n + j]);
    Buf &Dout = cs.in_place ? Cb : Db;
    for (size_t i = 0; i < Cb.n; i++) Cb.set(i, kSentinel);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) Cb.set((size_t)i + (size_t)j * ldc, C0[(size_t)i * n + j]);
    if (bias_in)
        for (int i = 0; i < m; i++) Bias.set(i, bias[i]);
    if (dgelu)
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) Xb.set((size_t)i + (size_t)j * auxld, auxin[(size_t)i * n + j]);
    const Buf Dbefore = Dout, Xbefore = Xb, Bbefore = Bias;

    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    bool ok = cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
    cublasOperation_t opa = cs.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = cs.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint32_t epi = cs.epi;
    ok &= cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(int32_t)) == 0;
    ok &= cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(int32_t)) == 0;
    ok &= cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)) == 0;
    if (bias_in || bgrad) {
        const void *bp = Bias.ptr();
        int32_t bt = cs.cd;
        ok &= cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)) == 0;
        ok &= cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)) == 0;
    }
    if (uses_aux) {
        void *xp = Xb.ptr();
        int64_t xld = auxld;
        int32_t xt = cs.cd;
        ok &= cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &xp, sizeof(xp)) == 0;
        ok &= cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &xld, sizeof(xld)) == 0;
        ok &= cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &xt, sizeof(xt)) == 0;
    }
    ok &= cublasLtMatrixLayoutCreate(&la, cs.ab, arows, acols, lda) == 0;
    ok &= cublasLtMatrixLayoutCreate(&lb, cs.ab, brows, bcols, ldb) == 0;
    ok &= cublasLtMatrixLayoutCreate(&lc, cs.cd, m, n, ldc) == 0;
    ok &= cublasLtMatmulPreferenceCreate(&pref) == 0;
    uint64_t ws = 1 << 20;
    ok &= cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)) == 0;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &res, &found);
    ok &= hs == CUBLAS_STATUS_SUCCESS && found == 1 && res.state == CUBLAS_STATUS_SUCCESS;
    cublasStatus_t ms = cublasLtMatmul(lt, desc, &cs.alpha, A.ptr(), la, B.ptr(), lb, &cs.beta, Cb.ptr(), lc,
                                       Dout.ptr(), lc, &res.algo, nullptr, 0, nullptr);
    ok &= ms == CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    if (!ok) {
        report(false, cs.name, "a cuBLASLt call failed (heuristic " + std::to_string(hs) + ", matmul " +
                                   std::to_string(ms) + ")");
        return;
    }

    const double u = cs.cd == CUDA_R_32F ? 0.0 : 1.0 / 256.0; /* bf16 half-ulp relative bound, doubled */
    auto tol = [&](double ref, double sc) { return std::fabs(ref) * u * 1.01 + 2e-5 * sc * (dgelu ? 1.2 : 1.0); };
    double maxerr = 0;
    bool good = true;
    char where[160] = "";
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double got = Dout.get((size_t)i + (size_t)j * ldc), want = refD[(size_t)i * n + j];
            double e = std::fabs(got - want);
            maxerr = std::max(maxerr, e);
            if (!(e <= tol(want, scale[(size_t)i * n + j])) && good) {
                good = false;
                snprintf(where, sizeof(where), "D(%d,%d)=%.9g want %.9g", i, j, got, want);
            }
        }
    /* padding rows between m and ld are untouched */
    for (int j = 0; j < n && good; j++)
        for (int i = m; i < ldc; i++)
            if (!Dout.same_bits((size_t)i + (size_t)j * ldc, Dbefore)) {
                good = false;
                snprintf(where, sizeof(where), "D padding (%d,%d) was written", i, j);
                break;
            }
    if (aux_out) {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                double got = Xb.get((size_t)i + (size_t)j * auxld), want = pre[(size_t)i * n + j];
                double e = std::fabs(got - want);
                if (!(e <= tol(want, scale[(size_t)i * n + j])) && good) {
                    good = false;
                    snprintf(where, sizeof(where), "aux(%d,%d)=%.9g want pre-GELU %.9g", i, j, got, want);
                }
            }
        for (int j = 0; j < n && good; j++)
            for (int i = m; i < auxld; i++)
                if (!Xb.same_bits((size_t)i + (size_t)j * auxld, Xbefore)) {
                    good = false;
                    snprintf(where, sizeof(where), "aux padding (%d,%d) was written", i, j);
                    break;
                }
    } else {
        for (size_t i = 0; i < Xb.n && good; i++)
            if (!Xb.same_bits(i, Xbefore)) {
                good = false;
                snprintf(where, sizeof(where), "aux element %zu changed without an aux output", i);
            }
    }
    if (bgrad) {
        int len = bgrad == 'B' ? n : m;
        for (int t = 0; t < len && good; t++) {
            double want = 0, sc = 1e-3;
            if (bgrad == 'A')
                for (int p = 0; p < k; p++) want += Aop[(size_t)t * k + p], sc += std::fabs(Aop[(size_t)t * k + p]);
            if (bgrad == 'B')
                for (int p = 0; p < k; p++) want += Bop[(size_t)p * n + t], sc += std::fabs(Bop[(size_t)p * n + t]);
            if (bgrad == 'D')
                for (int j = 0; j < n; j++) want += refD[(size_t)t * n + j], sc += scale[(size_t)t * n + j];
            double got = Bias.get(t);
            if (!(std::fabs(got - want) <= tol(want, sc))) {
                good = false;
                snprintf(where, sizeof(where), "bias gradient[%d]=%.9g want %.9g", t, got, want);
            }
        }
        if (good && !Bias.same_bits(len, Bbefore)) {
            good = false;
            snprintf(where, sizeof(where), "bias gradient written past its length %d", len);
        }
    }
    char detail[256];
    snprintf(detail, sizeof(detail), "max |D-ref| %.3g%s%s", maxerr, good ? "" : "; ", where);
    report(good, cs.name, detail);
}

const char *tname(cudaDataType_t t) { return t == CUDA_R_32F ? "fp32" : "bf16"; }

std::string case_name(const char *what, const Case &c) {
    char b[200];
    snprintf(b, sizeof(b), "%s %s%s%s %c%c m=%d n=%d k=%d alpha=%g beta=%g%s", what, tname(c.ab),
             c.ab != c.cd ? "->" : "", c.ab != c.cd ? tname(c.cd) : "", c.ta ? 'T' : 'N', c.tb ? 'T' : 'N',
             c.m, c.n, c.k, c.alpha, c.beta, c.beta != 0.0f ? (c.in_place ? " (C==D)" : " (C!=D)") : "");
    return b;
}

Case shape(int which, Case c) {
    if (which == 0) c.m = 5, c.n = 7, c.k = 3, c.pad_a = 2, c.pad_b = 3, c.pad_c = 1;
    else c.m = 37, c.n = 100, c.k = 72, c.pad_a = 5, c.pad_b = 1, c.pad_c = 3;
    return c;
}

/* ---- refusals: a valid fp32 problem (m=5 n=7 k=3, OP_N/OP_N) with one thing changed ---- */

struct Bad {
    int ta = 0, tb = 0;
    uint64_t ar = 5, ac = 3, br = 3, bc = 7, cr = 5, cc = 7, dr = 5, dc = 7;
    int64_t lda = 5, ldb = 3, ldc = 5, ldd = 5;
    cudaDataType_t type = CUDA_R_32F;
    uint32_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    bool set_aux = false, aux_ptr = true, bias_ptr = true;
    int64_t aux_ld = 8;
    int32_t aux_type = -1;
    bool c_is_d = false;
};

void refuse(cublasLtHandle_t lt, const char *name, const Bad &b, cublasStatus_t want_heur,
            cublasStatus_t want_mm) {
    static float mem[5][4096];
    for (auto &arr : mem)
        for (float &x : arr) x = 0.25f;
    const float sentinel_before = mem[3][0];
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t opa = b.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = b.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &b.epi, sizeof(b.epi));
    void *bias = b.bias_ptr ? (void *)mem[4] : nullptr;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    if (b.set_aux) {
        void *aux = b.aux_ptr ? (void *)mem[4] : nullptr;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &b.aux_ld, sizeof(b.aux_ld));
        if (b.aux_type != -1)
            cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &b.aux_type,
                                           sizeof(b.aux_type));
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux));
    }
    cublasLtMatrixLayoutCreate(&la, b.type, b.ar, b.ac, b.lda);
    cublasLtMatrixLayoutCreate(&lb, b.type, b.br, b.bc, b.ldb);
    cublasLtMatrixLayoutCreate(&lc, b.type, b.cr, b.cc, b.ldc);
    cublasLtMatrixLayoutCreate(&ld, b.type, b.dr, b.dc, b.ldd);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof(res));
    int found = -1;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, 1, &res, &found);
    float alpha = 1.0f, beta = 1.0f;
    cublasStatus_t ms = cublasLtMatmul(lt, desc, &alpha, mem[0], la, mem[1], lb, &beta, mem[2], lc,
                                       b.c_is_d ? mem[2] : mem[3], ld, nullptr, nullptr, 0, nullptr);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    bool untouched = ms == CUBLAS_STATUS_SUCCESS || (mem[3][0] == sentinel_before && mem[2][0] == 0.25f);
    bool count_ok = hs == CUBLAS_STATUS_SUCCESS ? found == 1 : found == 0;
    char d[200];
    snprintf(d, sizeof(d), "heuristic %d (want %d, count %d), matmul %d (want %d)%s", (int)hs, (int)want_heur,
             found, (int)ms, (int)want_mm, untouched ? "" : ", D written despite the refusal");
    report(hs == want_heur && ms == want_mm && count_ok && untouched, std::string("refuses ") + name, d);
}

} // namespace

int main() {
    cublasLtHandle_t lt = nullptr;
    report(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS && lt, "cublasLtCreate");

    const cudaDataType_t types[2] = {CUDA_R_32F, CUDA_R_16BF};
    /* plain products: every transpose combination, both types, both shapes, beta 0 and in place 1 */
    for (cudaDataType_t t : types)
        for (int s = 0; s < 2; s++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++)
                    for (float beta : {0.0f, 1.0f}) {
                        Case c = shape(s, Case{});
                        c.ab = c.cd = t, c.ta = ta, c.tb = tb, c.beta = beta;
                        c.name = case_name("DEFAULT", c);
                        run_case(lt, c);
                    }
    /* general alpha and beta, C separate from D, and bf16 inputs with fp32 outputs */
    for (int s = 0; s < 2; s++) {
        Case c = shape(s, Case{});
        c.alpha = 2.0f, c.beta = 0.5f, c.in_place = false, c.ta = true;
        c.name = case_name("DEFAULT", c);
        run_case(lt, c);
        c.ab = CUDA_R_16BF, c.tb = true;
        c.name = case_name("DEFAULT", c);
        run_case(lt, c);
    }
    /* bias: one value per row of D, broadcast along its columns */
    for (cudaDataType_t t : types)
        for (int s = 0; s < 2; s++)
            for (int v = 0; v < 3; v++) {
                Case c = shape(s, Case{});
                c.ab = c.cd = t, c.epi = CUBLASLT_EPILOGUE_BIAS;
                c.ta = v == 0, c.tb = v == 1, c.beta = v == 2 ? 1.0f : 0.0f;
                c.name = case_name("BIAS", c);
                run_case(lt, c);
            }
    /* GELU with its input kept in aux (with and without the bias) */
    for (cudaDataType_t t : types)
        for (int s = 0; s < 2; s++)
            for (int v = 0; v < 2; v++) {
                Case c = shape(s, Case{});
                c.ab = c.cd = t, c.epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
                c.ta = v == 0, c.tb = v == 1;
                c.name = case_name("GELU_AUX_BIAS", c);
                run_case(lt, c);
            }
    for (cudaDataType_t t : types) {
        Case c = shape(1, Case{});
        c.ab = c.cd = t, c.epi = CUBLASLT_EPILOGUE_GELU_AUX, c.ta = true, c.aux_ld = 40;
        c.name = case_name("GELU_AUX (aux ld 40)", c);
        run_case(lt, c);
    }
    /* GELU's gradient: D = product * gelu'(aux) */
    for (cudaDataType_t t : types)
        for (int s = 0; s < 2; s++)
            for (int v = 0; v < 2; v++) {
                Case c = shape(s, Case{});
                c.ab = c.cd = t, c.epi = CUBLASLT_EPILOGUE_DGELU;
                c.ta = c.tb = v == 1;
                c.name = case_name("DGELU", c);
                run_case(lt, c);
            }
    /* bias gradients */
    {
        Case c = shape(1, Case{});
        c.epi = CUBLASLT_EPILOGUE_DGELU_BGRAD, c.name = case_name("DGELU_BGRAD", c);
        run_case(lt, c);
        c.epi = CUBLASLT_EPILOGUE_BGRADA, c.ta = true, c.name = case_name("BGRADA", c);
        run_case(lt, c);
        c.epi = CUBLASLT_EPILOGUE_BGRADB, c.ta = false, c.tb = true, c.name = case_name("BGRADB", c);
        run_case(lt, c);
    }

    /* refusals */
    const cublasStatus_t OK = CUBLAS_STATUS_SUCCESS, INV = CUBLAS_STATUS_INVALID_VALUE,
                         NS = CUBLAS_STATUS_NOT_SUPPORTED;
    {
        Bad b;
        refuse(lt, "nothing (the valid baseline)", b, OK, OK);
    }
    {
        Bad b; /* A laid out as k x m while TRANSA = N needs m x k */
        b.ar = 3, b.ac = 5, b.lda = 3;
        refuse(lt, "A layout k x m with OP_N", b, INV, INV);
    }
    {
        Bad b; /* TRANSA = T needs A as k x m; the m x k layout is wrong */
        b.ta = 1;
        refuse(lt, "A layout m x k with OP_T", b, INV, INV);
    }
    {
        Bad b; /* B laid out as n x k while TRANSB = N */
        b.br = 7, b.bc = 3, b.ldb = 7;
        refuse(lt, "B layout n x k with OP_N", b, INV, INV);
    }
    {
        Bad b; /* TRANSB = T needs B as n x k */
        b.tb = 1;
        refuse(lt, "B layout k x n with OP_T", b, INV, INV);
    }
    {
        Bad b; /* C is not m x n */
        b.cr = 7, b.cc = 5, b.ldc = 7;
        refuse(lt, "C layout n x m", b, INV, INV);
    }
    {
        Bad b; /* D is n x m; with A m x k the row counts disagree */
        b.dr = 7, b.dc = 5, b.ldd = 7;
        refuse(lt, "D layout n x m", b, INV, INV);
    }
    {
        Bad b;
        b.lda = 4;
        refuse(lt, "lda < rows", b, INV, INV);
    }
    {
        Bad b;
        b.ldd = 4, b.ldc = 4;
        refuse(lt, "ldc = ldd < rows", b, INV, INV);
    }
    {
        Bad b; /* in place with different leading dimensions */
        b.c_is_d = true, b.ldd = 6;
        refuse(lt, "C == D with ldc != ldd", b, OK, INV);
    }
    {
        Bad b;
        b.epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS, b.set_aux = true, b.aux_ld = 12;
        refuse(lt, "EPILOGUE_AUX_LD not a multiple of 8", b, INV, INV);
    }
    {
        Bad b;
        b.cr = b.dr = 37, b.ar = 37, b.lda = 37, b.ldc = b.ldd = 37;
        b.epi = CUBLASLT_EPILOGUE_DGELU, b.set_aux = true, b.aux_ld = 32;
        refuse(lt, "EPILOGUE_AUX_LD < m", b, INV, INV);
    }
    {
        Bad b;
        b.epi = CUBLASLT_EPILOGUE_GELU_AUX;
        refuse(lt, "GELU_AUX without EPILOGUE_AUX_LD", b, INV, INV);
    }
    {
        Bad b; /* the heuristic does not need the pointer; the product does */
        b.epi = CUBLASLT_EPILOGUE_GELU_AUX, b.set_aux = true, b.aux_ptr = false;
        refuse(lt, "GELU_AUX with a NULL aux pointer", b, OK, INV);
    }
    {
        Bad b;
        b.epi = CUBLASLT_EPILOGUE_DGELU, b.set_aux = true, b.aux_ptr = false;
        refuse(lt, "DGELU with a NULL aux pointer", b, OK, INV);
    }
    {
        Bad b;
        b.epi = CUBLASLT_EPILOGUE_BIAS, b.bias_ptr = false;
        refuse(lt, "BIAS with a NULL bias pointer", b, OK, INV);
    }
    {
        Bad b;
        b.type = CUDA_R_16BF, b.epi = CUBLASLT_EPILOGUE_GELU_AUX, b.set_aux = true, b.aux_type = CUDA_R_32F;
        refuse(lt, "fp32 aux with a bf16 D", b, INV, INV);
    }
    {
        Bad b;
        b.type = CUDA_R_16F;
        refuse(lt, "CUDA_R_16F matrices", b, NS, NS);
    }
    {
        Bad b;
        b.epi = CUBLASLT_EPILOGUE_RELU;
        refuse(lt, "an epilogue it does not emulate (RELU)", b, NS, NS);
    }

    /* descriptor and preference attributes */
    {
        cublasLtMatmulDesc_t desc;
        cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        int64_t big = 1;
        int32_t small = 8;
        report(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &big, sizeof(big)) == INV,
               "refuses TRANSA with 8 bytes (int32_t documented)");
        report(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &small, sizeof(small)) == INV,
               "refuses EPILOGUE_AUX_LD with 4 bytes (int64_t documented)");
        report(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &small, sizeof(small)) == INV,
               "refuses BIAS_POINTER with 4 bytes");
        report(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, nullptr, 4) == INV,
               "refuses a NULL attribute buffer");
        int32_t pm = 0;
        report(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm)) == NS,
               "POINTER_MODE is reported NOT_SUPPORTED");
        cublasLtMatmulDescDestroy(desc);
        cublasLtMatmulDesc_t d2 = nullptr;
        report(cublasLtMatmulDescCreate(&d2, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F) == NS && !d2,
               "refuses CUBLAS_COMPUTE_32F_FAST_TF32");
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulPreferenceCreate(&pref);
        uint32_t a32 = 16, mask = 6;
        uint64_t ws = 1 << 20;
        bool ok = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, 8) == OK &&
                  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, 4) == OK &&
                  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a32, 4) == OK &&
                  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &a32, 4) == OK &&
                  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &a32, 4) == OK &&
                  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &a32, 4) == OK;
        report(ok, "accepts the preference attributes cuda_linear.cu sets");
        report(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &a32, 4) == INV,
               "refuses MAX_WORKSPACE_BYTES with 4 bytes (uint64_t documented)");
        report(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &a32, 4) == NS,
               "SEARCH_MODE is reported NOT_SUPPORTED");
        cublasLtMatmulPreferenceDestroy(pref);
    }
    /* handles and the heuristic's own arguments */
    {
        cublasLtMatmulDesc_t desc;
        cublasLtMatrixLayout_t l;
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 4, 4, 4);
        cublasLtMatmulPreferenceCreate(&pref);
        cublasLtMatmulHeuristicResult_t res[2];
        int found = -1;
        float x[16] = {0}, one = 1.0f;
        report(cublasLtMatmulAlgoGetHeuristic(nullptr, desc, l, l, l, l, pref, 1, res, &found) ==
                   CUBLAS_STATUS_NOT_INITIALIZED,
               "refuses a NULL handle (NOT_INITIALIZED)");
        report(cublasLtMatmul(lt, desc, &one, x, nullptr, x, l, &one, x, l, x, l, nullptr, nullptr, 0, nullptr) == INV,
               "refuses a NULL layout");
        report(cublasLtMatmul(lt, nullptr, &one, x, l, x, l, &one, x, l, x, l, nullptr, nullptr, 0, nullptr) == INV,
               "refuses a NULL matmul descriptor");
        report(cublasLtMatmulAlgoGetHeuristic(lt, desc, l, l, l, l, pref, 0, res, &found) == INV,
               "refuses requestedAlgoCount = 0");
        memset(res, 0, sizeof(res));
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, l, l, l, l, pref, 2, res, &found);
        report(st == OK && found == 1 && res[0].state == OK && res[0].algo.data[0] != 0,
               "heuristic returns exactly one recognizable algorithm");
        cublasLtMatmulAlgo_t bogus;
        memset(&bogus, 0, sizeof(bogus));
        report(cublasLtMatmul(lt, desc, &one, x, l, x, l, &one, x, l, x, l, &bogus, nullptr, 0, nullptr) == INV,
               "refuses an algo the heuristic did not produce");
        report(cublasLtMatmul(lt, desc, &one, x, l, x, l, &one, x, l, x, l, &res[0].algo, nullptr, 0, nullptr) == OK,
               "runs with the heuristic's algo");
        report(std::strlen(cublasLtGetStatusString(CUBLAS_STATUS_INVALID_VALUE)) > 0, "cublasLtGetStatusString");
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(l);
        cublasLtMatmulDescDestroy(desc);
    }
    report(cublasLtDestroy(lt) == CUBLAS_STATUS_SUCCESS, "cublasLtDestroy");

    printf("%d checks, %d failed\n", g_checks, g_failed);
    return g_failed ? 1 : 0;
}
