/* Standalone test of tests/cudaemu/emu_cudnn.cc, the test-only host emulator of the cuDNN backend
 * graph API subset model/cuda/cuda_attention_cudnn.cu uses. It checks that what the documentation
 * forbids is refused with an error status (bad strides, missing attributes, wrong attribute
 * types, setting a finalized descriptor, unknown descriptor types and attributes, mismatched
 * matmul shapes, a graph that is not an attention pattern, an incomplete or misaligned variant
 * pack, an output sharing memory with an input), and that a causal GQA attention forward graph
 * built here computes what a plain double-precision loop written here computes.
 * Prints one line per check; exits 0 when all pass, 1 otherwise. */
#include <cudnn_graph.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

int g_failed = 0, g_checks = 0;

void report(bool ok, const char *name, const char *detail = "") {
    g_checks++;
    if (!ok) g_failed++;
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name, *detail ? ": " : "", detail);
}
void expect(cudnnStatus_t got, cudnnStatus_t want, const char *name) {
    char d[96];
    snprintf(d, sizeof(d), "status %d, expected %d", (int)got, (int)want);
    report(got == want, name, got == want ? "" : d);
}

typedef cudnnBackendDescriptor_t D;
std::vector<D> g_all;

D mk(cudnnBackendDescriptorType_t t) {
    D d = nullptr;
    if (cudnnBackendCreateDescriptor(t, &d) == CUDNN_STATUS_SUCCESS) g_all.push_back(d);
    return d;
}
cudnnStatus_t setd(D d, cudnnBackendAttributeName_t a, D v) {
    return cudnnBackendSetAttribute(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

/* a 4-d tensor, finalized; status in *st */
D tensor(int64_t uid, cudnnDataType_t dt, const int64_t dim[4], const int64_t str[4], bool virt,
         bool byval, cudnnStatus_t *st) {
    D t = mk(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int64_t align = byval ? 4 : 16;
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str);
    if (uid) cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (byval)
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval);
    cudnnStatus_t s = cudnnBackendFinalize(t);
    if (st) *st = s;
    return t;
}
int64_t g_virt = 1000;
D vt(cudnnDataType_t dt, int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t dim[4] = {a, b, c, d}, str[4] = {b * c * d, c * d, d, 1};
    return tensor(g_virt++, dt, dim, str, true, false, nullptr);
}

D pw(cudnnPointwiseMode_t m, D x, D b, D t, D y, int64_t axis = -1) {
    D p = mk(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    cudnnDataType_t f = m == CUDNN_POINTWISE_CMP_GE ? CUDNN_DATA_BOOLEAN : CUDNN_DATA_FLOAT;
    cudnnBackendSetAttribute(p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &m);
    cudnnBackendSetAttribute(p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f);
    if (axis >= 0)
        cudnnBackendSetAttribute(p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    cudnnBackendFinalize(p);
    D o = mk(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    setd(o, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, p);
    setd(o, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) setd(o, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) setd(o, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    setd(o, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    cudnnBackendFinalize(o);
    return o;
}
D mm(D a, D b, D c, cudnnStatus_t *st = nullptr) {
    D m = mk(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    cudnnBackendSetAttribute(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    cudnnBackendFinalize(m);
    D o = mk(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    setd(o, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    setd(o, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    setd(o, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    setd(o, CUDNN_ATTR_OPERATION_MATMUL_DESC, m);
    cudnnStatus_t s = cudnnBackendFinalize(o);
    if (st) *st = s;
    return o;
}
D red(cudnnReduceTensorOp_t op, D x, D y) {
    D r = mk(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    cudnnBackendSetAttribute(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
                             1, &op);
    cudnnBackendSetAttribute(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    cudnnBackendFinalize(r);
    D o = mk(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    setd(o, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    setd(o, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    setd(o, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    cudnnBackendFinalize(o);
    return o;
}
cudnnStatus_t graph(cudnnHandle_t h, const std::vector<D> &ops, D *g) {
    *g = mk(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    cudnnBackendSetAttribute(*g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                             (int64_t)ops.size(), ops.data());
    cudnnBackendSetAttribute(*g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    return cudnnBackendFinalize(*g);
}

uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void descriptors(void) {
    cudnnStatus_t st;
    int64_t dim[4] = {1, 1, 4, 8}, ok_str[4] = {32, 32, 8, 1}, overlap[4] = {32, 32, 4, 1};
    int64_t zero[4] = {32, 32, 0, 1};
    tensor(1, CUDNN_DATA_BFLOAT16, dim, ok_str, false, false, &st);
    expect(st, CUDNN_STATUS_SUCCESS, "tensor: packed strides accepted");
    tensor(1, CUDNN_DATA_BFLOAT16, dim, overlap, false, false, &st);
    expect(st, CUDNN_STATUS_BAD_PARAM, "tensor: overlapping strides rejected");
    tensor(1, CUDNN_DATA_BFLOAT16, dim, zero, false, false, &st);
    expect(st, CUDNN_STATUS_BAD_PARAM, "tensor: zero stride rejected");
    tensor(0, CUDNN_DATA_BFLOAT16, dim, ok_str, false, false, &st);
    expect(st, CUDNN_STATUS_BAD_PARAM, "tensor: no unique id rejected");
    D t = mk(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int32_t d32[4] = {1, 1, 4, 8};
    expect(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT32, 4, d32),
           CUDNN_STATUS_BAD_PARAM, "tensor: dims as INT32 (documented INT64) rejected");
    int64_t one = 1;
    expect(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_VECTOR_COUNT, CUDNN_TYPE_INT64, 1, &one),
           CUDNN_STATUS_NOT_SUPPORTED, "tensor: attribute not emulated -> NOT_SUPPORTED");
    D f = tensor(2, CUDNN_DATA_FLOAT, dim, ok_str, false, false, &st);
    expect(cudnnBackendSetAttribute(f, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &one),
           CUDNN_STATUS_BAD_PARAM, "tensor: set after finalize rejected");
    D conv = nullptr;
    expect(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &conv),
           CUDNN_STATUS_NOT_SUPPORTED, "descriptor type not emulated -> NOT_SUPPORTED");
    int64_t da[4] = {1, 2, 4, 8}, sa[4] = {64, 32, 8, 1}, db[4] = {1, 2, 7, 4},
            sb[4] = {56, 28, 4, 1};
    int64_t dc[4] = {1, 2, 4, 4}, sc[4] = {32, 16, 4, 1};
    D A = tensor(3, CUDNN_DATA_BFLOAT16, da, sa, false, false, nullptr);
    D B = tensor(4, CUDNN_DATA_BFLOAT16, db, sb, false, false, nullptr);
    D C = tensor(5, CUDNN_DATA_FLOAT, dc, sc, false, false, nullptr);
    mm(A, B, C, &st);
    expect(st, CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, "matmul: inner dims 8 vs 7 rejected");
}

/* Causal attention forward, B1 H2 KV1 T5 d8, q k v packed in one row-major (T, (H+2KV)d) array
 * as the trainer stores them; O (T, H d); stats (H, T). */
void forward(void) {
    const int H = 2, KV = 1, T = 5, d = 8, S = (H + 2 * KV) * d;
    cudnnHandle_t h;
    cudnnCreate(&h);
    cudnnStatus_t st;
    int64_t dq[4] = {1, H, T, d}, sq[4] = {T * S, d, S, 1}, dkt[4] = {1, KV, d, T},
            skt[4] = {T * S, d, 1, S}, dv[4] = {1, KV, T, d}, sv[4] = {T * S, d, S, 1},
            dO[4] = {1, H, T, d}, sO[4] = {T * H * d, d, H * d, 1}, dst[4] = {1, H, T, 1},
            sst[4] = {H * T, T, 1, 1}, d1[4] = {1, 1, 1, 1};
    D Q = tensor(1, CUDNN_DATA_BFLOAT16, dq, sq, false, false, nullptr);
    D Kt = tensor(2, CUDNN_DATA_BFLOAT16, dkt, skt, false, false, nullptr);
    D V = tensor(3, CUDNN_DATA_BFLOAT16, dv, sv, false, false, nullptr);
    D O = tensor(4, CUDNN_DATA_BFLOAT16, dO, sO, false, false, nullptr);
    D St = tensor(5, CUDNN_DATA_FLOAT, dst, sst, false, false, nullptr);
    D Sc = tensor(6, CUDNN_DATA_FLOAT, d1, d1, false, true, nullptr);
    D Ni = tensor(7, CUDNN_DATA_FLOAT, d1, d1, false, true, nullptr);
    D s = vt(CUDNN_DATA_FLOAT, 1, H, T, T), s2 = vt(CUDNN_DATA_FLOAT, 1, H, T, T);
    D r = vt(CUDNN_DATA_INT32, 1, H, T, T), c = vt(CUDNN_DATA_INT32, 1, H, T, T);
    D k = vt(CUDNN_DATA_BOOLEAN, 1, H, T, T), s3 = vt(CUDNN_DATA_FLOAT, 1, H, T, T);
    D mx = vt(CUDNN_DATA_FLOAT, 1, H, T, 1), sub = vt(CUDNN_DATA_FLOAT, 1, H, T, T);
    D e = vt(CUDNN_DATA_FLOAT, 1, H, T, T), sum = vt(CUDNN_DATA_FLOAT, 1, H, T, 1);
    D lg = vt(CUDNN_DATA_FLOAT, 1, H, T, 1), p = vt(CUDNN_DATA_BFLOAT16, 1, H, T, T);
    D p32 = vt(CUDNN_DATA_FLOAT, 1, H, T, T),
      O32 = tensor(8, CUDNN_DATA_BFLOAT16, dO, sO, false, false, nullptr);
    std::vector<D> ops = {mm(Q, Kt, s),
                          pw(CUDNN_POINTWISE_MUL, s, Sc, nullptr, s2),
                          pw(CUDNN_POINTWISE_GEN_INDEX, s2, nullptr, nullptr, r, 2),
                          pw(CUDNN_POINTWISE_GEN_INDEX, s2, nullptr, nullptr, c, 3),
                          pw(CUDNN_POINTWISE_CMP_GE, r, c, nullptr, k),
                          pw(CUDNN_POINTWISE_BINARY_SELECT, s2, Ni, k, s3),
                          red(CUDNN_REDUCE_TENSOR_MAX, s3, mx),
                          pw(CUDNN_POINTWISE_SUB, s3, mx, nullptr, sub),
                          pw(CUDNN_POINTWISE_EXP, sub, nullptr, nullptr, e),
                          red(CUDNN_REDUCE_TENSOR_ADD, e, sum),
                          pw(CUDNN_POINTWISE_LOG, sum, nullptr, nullptr, lg),
                          pw(CUDNN_POINTWISE_ADD, mx, lg, nullptr, St),
                          pw(CUDNN_POINTWISE_DIV, e, sum, nullptr, p),
                          mm(p, V, O)};
    D g;
    expect(graph(h, std::vector<D>(ops.begin(), ops.begin() + 1), &g),
           CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN, "graph: a lone matmul is not a pattern");
    /* P in fp32 before O = P V: a real cuDNN 9.14 found no engine for it (H200, 2026-12-04) */
    std::vector<D> ops32(ops.begin(), ops.end() - 2);
    ops32.push_back(pw(CUDNN_POINTWISE_DIV, e, sum, nullptr, p32));
    ops32.push_back(mm(p32, V, O32));
    expect(graph(h, ops32, &g), CUDNN_STATUS_NOT_SUPPORTED, "graph: P in fp32 before O = P V");
    expect(graph(h, ops, &g), CUDNN_STATUS_SUCCESS, "graph: the causal SDPA forward pattern");
    D heur = mk(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    setd(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g);
    cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    expect(cudnnBackendFinalize(heur), CUDNN_STATUS_SUCCESS, "heuristics finalize");
    D cfg = mk(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t n = 0;
    st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &cfg);
    report(st == CUDNN_STATUS_SUCCESS && n == 1, "heuristics: one engine config");
    D plan = mk(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    setd(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    expect(cudnnBackendFinalize(plan), CUDNN_STATUS_SUCCESS, "plan finalize");
    int64_t ws = -1;
    st = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                  1, &n, &ws);
    report(st == CUDNN_STATUS_SUCCESS && ws > 0, "plan: workspace size queried");

    /* data: bf16 values, a reference in double */
    std::vector<uint16_t> qkv(T * S), o(T * H * d, 0), o2(T * H * d + 8, 0);
    std::vector<float> stats(H * T), work((size_t)(ws > 0 ? ws : 1) / 4 + 1);
    unsigned seed = 7;
    for (auto &x : qkv) {
        seed = seed * 1103515245u + 12345u;
        x = f2bf(((int)(seed >> 16) % 2001 - 1000) / 500.0f);
    }
    float scale = 1.0f / sqrtf((float)d), ninf = -INFINITY;
    auto run = [&](int nu, const int64_t *uids, void **ptrs, void *wsp) {
        D vp = mk(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
        cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, nu,
                                 uids);
        cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, nu,
                                 ptrs);
        cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                 &wsp);
        cudnnStatus_t s1 = cudnnBackendFinalize(vp);
        return s1 ? s1 : cudnnBackendExecute(h, plan, vp);
    };
    int64_t uids[7] = {1, 2, 3, 4, 5, 6, 7};
    void *ptrs[7] = {qkv.data(), qkv.data() + H * d, qkv.data() + (H + KV) * d,
                     o.data(),   stats.data(),       &scale,
                     &ninf};
    expect(run(6, uids, ptrs, work.data()), CUDNN_STATUS_BAD_PARAM, "execute: a uid missing");
    expect(run(7, uids, ptrs, nullptr), CUDNN_STATUS_BAD_PARAM, "execute: NULL workspace");
    void *mis[7] = {ptrs[0], ptrs[1], ptrs[2], o2.data() + 1, ptrs[4], ptrs[5], ptrs[6]};
    expect(run(7, uids, mis, work.data()), CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
           "execute: O 2 bytes off its 16-byte alignment");
    void *alias[7] = {ptrs[0], ptrs[1], ptrs[2], qkv.data(), ptrs[4], ptrs[5], ptrs[6]};
    expect(run(7, uids, alias, work.data()), CUDNN_STATUS_BAD_PARAM, "execute: O on top of Q");
    expect(run(7, uids, ptrs, work.data()), CUDNN_STATUS_SUCCESS, "execute");

    double worst = 0, worst_l = 0;
    for (int hh = 0; hh < H; hh++) {
        int g2 = hh / (H / KV);
        for (int i = 0; i < T; i++) {
            double sc[T], m = -INFINITY, z = 0;
            for (int j = 0; j <= i; j++) {
                double a = 0;
                for (int x = 0; x < d; x++)
                    a +=
                        (double)bf2f(qkv[i * S + hh * d + x]) * bf2f(qkv[j * S + (H + g2) * d + x]);
                sc[j] = a / sqrt((double)d);
                m = fmax(m, sc[j]);
            }
            for (int j = 0; j <= i; j++)
                z += exp(sc[j] - m);
            worst_l = fmax(worst_l, fabs(stats[hh * T + i] - (m + log(z))));
            for (int x = 0; x < d; x++) {
                double a = 0;
                for (int j = 0; j <= i; j++)
                    a += exp(sc[j] - m) / z * bf2f(qkv[j * S + (H + KV + g2) * d + x]);
                worst = fmax(worst, fabs(bf2f(o[i * H * d + hh * d + x]) - a) / fmax(1.0, fabs(a)));
            }
        }
    }
    char det[96];
    snprintf(det, sizeof(det), "worst error %.2e (tol 2^-7: two bf16 roundings, P and O)", worst);
    report(worst < 1.0 / 128, "forward O vs a double loop (causal, GQA)", det);
    snprintf(det, sizeof(det), "worst error %.2e (tol 1e-5)", worst_l);
    report(worst_l < 1e-5, "forward stats (log-sum-exp) vs a double loop", det);
    cudnnDestroy(h);
}

} // namespace

int main() {
    descriptors();
    forward();
    for (auto it = g_all.rbegin(); it != g_all.rend(); ++it)
        cudnnBackendDestroyDescriptor(*it);
    printf("%s: %d of %d checks failed\n", g_failed ? "FAIL" : "PASS", g_failed, g_checks);
    return g_failed ? 1 : 0;
}
