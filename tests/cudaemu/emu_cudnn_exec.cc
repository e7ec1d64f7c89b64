/* The emulated cuDNN's execution (what is emulated, and the semantics relied on, are in
 * emu_cudnn.cc's header): cudnnBackendExecute checks the variant pack against the plan's graph,
 * then interprets the graph op by op on the host, in fp32, rounding on every stored element. */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <unordered_map>
#include <vector>

#include "emu_cudnn_private.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif

using namespace emu_cudnn;

namespace {

float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* a tensor's storage during one execution: user memory, or fp32 host memory for virtual ones */
struct Store {
    const Desc *t = nullptr;
    void *p = nullptr;
    std::vector<float> own;
    float get(int64_t off) const {
        if (t->virt) return own[off];
        switch (t->dtype) {
        case CUDNN_DATA_BFLOAT16:
            return bf2f(static_cast<const uint16_t *>(p)[off]);
        case CUDNN_DATA_FLOAT:
            return static_cast<const float *>(p)[off];
        case CUDNN_DATA_INT32:
            return (float)static_cast<const int32_t *>(p)[off];
        case CUDNN_DATA_INT64:
            return (float)static_cast<const int64_t *>(p)[off];
        default:
            return static_cast<const uint8_t *>(p)[off] ? 1.0f : 0.0f;
        }
    }
    void set(int64_t off, float v) {
        if (t->virt) {
            own[off] = t->dtype == CUDNN_DATA_BFLOAT16 ? bf2f(f2bf(v)) : v;
            return;
        }
        switch (t->dtype) {
        case CUDNN_DATA_BFLOAT16:
            static_cast<uint16_t *>(p)[off] = f2bf(v);
            break;
        case CUDNN_DATA_FLOAT:
            static_cast<float *>(p)[off] = v;
            break;
        case CUDNN_DATA_INT32:
            static_cast<int32_t *>(p)[off] = (int32_t)v;
            break;
        case CUDNN_DATA_INT64:
            static_cast<int64_t *>(p)[off] = (int64_t)v;
            break;
        default:
            static_cast<uint8_t *>(p)[off] = v != 0.0f;
            break;
        }
    }
};

/* element offset in x of the element of y at index idx, x broadcasting (1, or dividing) */
int64_t off_bcast(const Desc *x, const Desc *y, const int64_t *idx, int upto) {
    int64_t o = 0;
    for (int i = 0; i < upto; i++) {
        int64_t j = x->dim[i] == y->dim[i] ? idx[i]
                    : x->dim[i] == 1       ? 0
                                           : idx[i] / (y->dim[i] / x->dim[i]);
        o += j * x->str[i];
    }
    return o;
}
int64_t off(const Desc *t, const int64_t *idx) {
    int64_t o = 0;
    for (int i = 0; i < t->nd; i++)
        o += idx[i] * t->str[i];
    return o;
}
/* next index of dims d (n of them) in row-major order; false after the last */
bool next(int64_t *idx, const int64_t *d, int n) {
    for (int i = n - 1; i >= 0; i--) {
        if (++idx[i] < d[i]) return true;
        idx[i] = 0;
    }
    return false;
}

void run_op(const Desc *o, std::map<int64_t, Store> &st) {
    const Desc *y = o->y;
    Store &Y = st[y->uid];
    int64_t idx[8] = {0};
    int n = (int)y->nd;
    if (o->type == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR) {
        const Store &X = st[o->x->uid];
        const Store *Bs = o->b ? &st[o->b->uid] : nullptr, *Ts = o->t ? &st[o->t->uid] : nullptr;
        int64_t m = o->op->mode;
        do {
            float x = X.get(off_bcast(o->x, y, idx, n)),
                  b = Bs ? Bs->get(off_bcast(o->b, y, idx, n)) : 0;
            float v;
            switch (m) {
            case CUDNN_POINTWISE_IDENTITY:
                v = x;
                break;
            case CUDNN_POINTWISE_ADD:
                v = x + b;
                break;
            case CUDNN_POINTWISE_SUB:
                v = x - b;
                break;
            case CUDNN_POINTWISE_MUL:
                v = x * b;
                break;
            case CUDNN_POINTWISE_DIV:
                v = x / b;
                break;
            case CUDNN_POINTWISE_EXP:
                v = expf(x);
                break;
            case CUDNN_POINTWISE_LOG:
                v = logf(x);
                break;
            case CUDNN_POINTWISE_CMP_GE:
                v = x >= b ? 1.0f : 0.0f;
                break;
            case CUDNN_POINTWISE_GEN_INDEX:
                v = (float)idx[o->op->axis];
                break;
            default:
                v = Ts->get(off_bcast(o->t, y, idx, n)) != 0.0f ? x : b;
                break;
            }
            Y.set(off(y, idx), v);
        } while (next(idx, y->dim, n));
    } else if (o->type == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR) {
        const Desc *A = o->x, *B = o->b;
        const Store &As = st[A->uid], &Bs = st[B->uid];
        int64_t K = A->dim[n - 1];
        do {
            int64_t oa = off_bcast(A, y, idx, n - 2), ob = off_bcast(B, y, idx, n - 2);
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++)
                acc += As.get(oa + idx[n - 2] * A->str[n - 2] + k * A->str[n - 1]) *
                       Bs.get(ob + k * B->str[n - 2] + idx[n - 1] * B->str[n - 1]);
            Y.set(off(y, idx), acc);
        } while (next(idx, y->dim, n));
    } else if (o->type == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR) {
        const Desc *x = o->x;
        const Store &X = st[x->uid];
        bool mx = o->op->mode == CUDNN_REDUCE_TENSOR_MAX;
        do { /* over y; the inputs that fold into this output: per dim a range */
            int64_t lo[8], cnt[8], j[8] = {0};
            for (int i = 0; i < n; i++) {
                int64_t g = x->dim[i] / y->dim[i];
                lo[i] = idx[i] * g;
                cnt[i] = g;
            }
            float acc = mx ? -INFINITY : 0.0f;
            do {
                int64_t xi[8];
                for (int i = 0; i < n; i++)
                    xi[i] = lo[i] + j[i];
                float v = X.get(off(x, xi));
                acc = mx ? std::max(acc, v) : acc + v;
            } while (next(j, cnt, n));
            Y.set(off(y, idx), acc);
        } while (next(idx, y->dim, n));
    } else { /* reshape: same memory offsets */
        const Desc *x = o->x;
        const Store &X = st[x->uid];
        int nx = (int)x->nd;
        do {
            int64_t oo = off(x, idx);
            Y.set(oo, X.get(oo));
        } while (next(idx, x->dim, nx));
    }
}

/* an execution as given */
struct ExecJob {
    const Desc *g;
    std::map<int64_t, Store> st;
    void *ws;
    int64_t ws_bytes;
    std::vector<std::vector<unsigned char>> vals; /* the by-value tensors, copied at the call */
};
void exec_job(void *c) {
    ExecJob *j = static_cast<ExecJob *>(c);
    if (j->ws_bytes > 0) memset(j->ws, 0xA5, (size_t)j->ws_bytes); /* the engine's scratch */
    for (const Desc *o : j->g->order)
        run_op(o, j->st);
    delete j;
}

} // namespace

extern "C" {

/* The runtime's streams (emu_sched.cc): an execution is work on the handle's stream, run
 * when the scheduler reaches it; its by-value tensors (host scalars) are read at the call, as
 * cuDNN reads them. Weak: test_emu_cudnn runs without the runtime (at once). */
extern "C++" void emu_stream_exec(cudaStream_t s, const char *what, void (*run)(void *),
                                  void *ctx) __attribute__((weak));

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t h, cudnnBackendDescriptor_t plan,
                                  cudnnBackendDescriptor_t pack) {
    const char *fn = "cudnnBackendExecute";
    Desc *pl = live(plan), *vp = live(pack);
    if (!h || h->magic != kHandleMagic || !pl || !vp || !pl->fin || !vp->fin ||
        pl->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR ||
        vp->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR) {
        complain(fn, "needs a live handle, a finalized plan and a finalized variant pack");
        return CUDNN_STATUS_BAD_PARAM;
    }
    const Desc *g = pl->graph;
    std::map<int64_t, Store> st;
    std::map<int64_t, void *> given;
    std::vector<std::vector<unsigned char>> vals;
    for (size_t i = 0; i < vp->uids.size(); i++) {
        if (given.count(vp->uids[i])) {
            complain(fn, "uid %lld twice in the variant pack", (long long)vp->uids[i]);
            return CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES;
        }
        given[vp->uids[i]] = vp->ptrs[i];
    }
    for (const Desc *o : g->ops)
        for (const Desc *t : {o->x, o->b, o->t, o->y}) {
            if (!t || st.count(t->uid)) continue;
            Store s;
            s.t = t;
            if (t->virt) {
                s.own.assign(span(t), NAN);
            } else {
                auto it = given.find(t->uid);
                if (it == given.end() || !it->second) {
                    complain(fn, "uid %lld has no pointer in the variant pack", (long long)t->uid);
                    return CUDNN_STATUS_BAD_PARAM;
                }
                if ((uintptr_t)it->second % (uintptr_t)t->align) {
                    complain(fn, "uid %lld: pointer %p is not %lld-byte aligned", (long long)t->uid,
                             it->second, (long long)t->align);
                    return CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER;
                }
                s.p = it->second;
                if (t->byval) { /* read now: the caller's scalar may be gone when this runs */
                    const unsigned char *b = static_cast<const unsigned char *>(it->second);
                    vals.emplace_back(b, b + (size_t)span(t) * dt_size(t->dtype));
                    s.p = vals.back().data();
                }
                given.erase(it);
            }
            st[t->uid] = std::move(s);
        }
    if (!given.empty()) {
        complain(fn, "uid %lld in the variant pack is not a tensor of the graph",
                 (long long)given.begin()->first);
        return CUDNN_STATUS_BAD_PARAM;
    }
    /* an output shares no element with any other tensor (inputs may share: Q and K views) */
    std::unordered_map<uintptr_t, int64_t> written;
    for (const Desc *o : g->ops) {
        const Desc *t = o->y;
        if (t->virt) continue;
        int64_t idx[8] = {0};
        size_t es = dt_size(t->dtype);
        do
            for (size_t k = 0; k < es; k++)
                written[(uintptr_t)st[t->uid].p + (uintptr_t)(off(t, idx) * es) + k] = t->uid;
        while (next(idx, t->dim, (int)t->nd));
    }
    for (auto &e : st) {
        const Desc *t = e.second.t;
        if (t->virt) continue;
        int64_t idx[8] = {0};
        size_t es = dt_size(t->dtype);
        do {
            for (size_t k = 0; k < es; k++) {
                auto it = written.find((uintptr_t)e.second.p + (uintptr_t)(off(t, idx) * es) + k);
                if (it != written.end() && it->second != t->uid) {
                    complain(fn, "uid %lld and output uid %lld share memory", (long long)t->uid,
                             (long long)it->second);
                    return CUDNN_STATUS_BAD_PARAM;
                }
            }
        } while (next(idx, t->dim, (int)t->nd));
    }
    if (pl->ws > 0) {
        if (!vp->wsptr) {
            complain(fn, "the plan needs %lld bytes of workspace and got NULL", (long long)pl->ws);
            return CUDNN_STATUS_BAD_PARAM;
        }
    }
    /* the engine's scratch: all of it is written */
    ExecJob *j = new ExecJob{g, std::move(st), vp->wsptr, pl->ws, {}};
    j->vals = std::move(vals);
    if (emu_stream_exec)
        emu_stream_exec(h->stream, "cudnnBackendExecute", exec_job, j);
    else
        exec_job(j);
    return CUDNN_STATUS_SUCCESS;
}

} /* extern "C" */
