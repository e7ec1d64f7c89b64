/* Checks every operation of the CPU backend (model/backend.h) against a naive double-precision
 * reference written here, on awkward shapes, with NaN-poisoned outputs; checks each reference
 * backward against central finite differences; checks accumulate/overwrite semantics and
 * bitwise determinism. One line per check; exits non-zero on any failure. */
#include "model/backend.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tolerances, all relative to the largest |value| of the double reference:
 *  - fp32 forward vs double reference: 1e-5 (fp32 epsilon 6e-8 times short sums);
 *  - fp32 backward vs double reference backward: 1e-4 (longer chains, cancellation);
 *  - double reference backward vs central differences (h = 1e-5): 1e-6. */
#define TOL_FWD 1e-5
#define TOL_BWD 1e-4
#define TOL_FD 1e-6
#define FD_H 1e-5
#define PI 3.14159265358979323846

static const tr_backend *be;
static int n_fail, n_check;

/* ---- utilities ------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) { /* splitmix64 -> [0, 1) */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)urand(); }

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test_kernels: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}
static float *fvec(size_t n, float lo, float hi) {
    float *p = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) p[i] = frand(lo, hi);
    return p;
}
static float *fpoison(size_t n) { /* NaN everywhere, so an unwritten element fails */
    float *p = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}
static double *dvec(size_t n) { return calloc(n ? n : 1, sizeof(double)); }
static double *to_d(const float *x, size_t n) {
    double *d = dvec(n);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}
static float *to_f(const double *x, size_t n) {
    float *f = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) f[i] = (float)x[i];
    return f;
}

/* max |got - ref| / max |ref| against tol; NaN anywhere fails */
static void check(const char *name, const float *got, const double *ref, size_t n, double tol) {
    double mref = 0.0, merr = 0.0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double r = fabs(ref[i]), e = fabs((double)got[i] - ref[i]);
        if (r > mref) mref = r;
        if (!(e <= INFINITY)) bad = 1; /* NaN */
        else if (e > merr) merr = e;
    }
    double rel = merr / (mref > 0.0 ? mref : 1.0);
    int ok = !bad && rel <= tol;
    n_check++;
    if (!ok) n_fail++;
    printf("%s %-52s max err %.2e (max|ref| %.2e) tol %.0e%s\n", ok ? "ok  " : "FAIL", name, rel,
           mref, tol, bad ? " NaN" : "");
}
static void check_bitwise(const char *name, const float *a, const float *b, size_t n) {
    int ok = memcmp(a, b, sizeof(float) * n) == 0;
    n_check++;
    if (!ok) n_fail++;
    printf("%s %-52s bitwise identical\n", ok ? "ok  " : "FAIL", name);
}
static void check_true(const char *name, int ok) {
    n_check++;
    if (!ok) n_fail++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", name);
}

/* ---- double references, each on a packed input vector x ------------------------------- */

/* Every differentiable op is a function x -> out with a backward (x, dout) -> dx (overwritten),
 * so one finite-difference harness checks them all. */
typedef struct ref_op {
    const char *name;
    void (*fwd)(const struct ref_op *op, const double *x, double *out);
    void (*bwd)(const struct ref_op *op, const double *x, const double *dout, double *dx);
    size_t nx, nout;
    int B, T, H, KV, hd, N, C, IC, OC, V, has_b;
    const int *idx; /* tokens or targets */
    double eps, theta;
} ref_op;

/* L = sum(out * R): dL/dx by central differences at up to 300 coordinates vs op->bwd */
static void fd_check(const ref_op *op, const double *x, const double *R) {
    double *dx = dvec(op->nx), *out = dvec(op->nout), *xp = dvec(op->nx);
    op->bwd(op, x, R, dx);
    memcpy(xp, x, sizeof(double) * op->nx);
    double mg = 0.0, merr = 0.0;
    for (size_t i = 0; i < op->nx; i++) mg = fabs(dx[i]) > mg ? fabs(dx[i]) : mg;
    size_t ns = op->nx < 300 ? op->nx : 300;
    for (size_t s = 0; s < ns; s++) {
        size_t i = op->nx <= 300 ? s : (size_t)(urand() * op->nx);
        double L[2];
        for (int k = 0; k < 2; k++) {
            xp[i] = x[i] + (k ? -FD_H : FD_H);
            op->fwd(op, xp, out);
            L[k] = 0.0;
            for (size_t j = 0; j < op->nout; j++) L[k] += out[j] * R[j];
        }
        xp[i] = x[i];
        double e = fabs((L[0] - L[1]) / (2 * FD_H) - dx[i]);
        merr = e > merr ? e : merr;
    }
    double rel = merr / (mg > 0 ? mg : 1.0);
    int ok = rel <= TOL_FD;
    n_check++;
    if (!ok) n_fail++;
    char name[96];
    snprintf(name, sizeof name, "%s: ref backward vs finite diff", op->name);
    printf("%s %-52s max err %.2e (max|ref| %.2e) tol %.0e\n", ok ? "ok  " : "FAIL", name, rel, mg,
           TOL_FD);
    free(dx);
    free(out);
    free(xp);
}

/* linear: x = [inp (N,IC) | w (OC,IC) | bias (OC)] */
static void lin_f(const ref_op *o, const double *x, double *out) {
    const double *inp = x, *w = x + o->N * o->IC, *b = w + o->OC * o->IC;
    for (int n = 0; n < o->N; n++)
        for (int c = 0; c < o->OC; c++) {
            double s = b[c];
            for (int i = 0; i < o->IC; i++) s += inp[n * o->IC + i] * w[c * o->IC + i];
            out[n * o->OC + c] = s;
        }
}
static void lin_b(const ref_op *o, const double *x, const double *d, double *dx) {
    const double *inp = x, *w = x + o->N * o->IC;
    double *dinp = dx, *dw = dx + o->N * o->IC, *db = dw + o->OC * o->IC;
    memset(dx, 0, sizeof(double) * o->nx);
    for (int n = 0; n < o->N; n++)
        for (int c = 0; c < o->OC; c++) {
            double g = d[n * o->OC + c];
            db[c] += g;
            for (int i = 0; i < o->IC; i++) {
                dinp[n * o->IC + i] += g * w[c * o->IC + i];
                dw[c * o->IC + i] += g * inp[n * o->IC + i];
            }
        }
}

/* layernorm: x = [inp (N,C) | w (C) | b (C)] */
static void ln_f(const ref_op *o, const double *x, double *out) {
    int N = o->N, C = o->C;
    const double *w = x + N * C, *b = w + C;
    for (int n = 0; n < N; n++) {
        const double *r = x + n * C;
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += r[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (r[c] - m) * (r[c] - m);
        double rs = 1.0 / sqrt(v / C + o->eps);
        for (int c = 0; c < C; c++) out[n * C + c] = (r[c] - m) * rs * w[c] + (o->has_b ? b[c] : 0);
    }
}
static void ln_b(const ref_op *o, const double *x, const double *d, double *dx) {
    int N = o->N, C = o->C;
    const double *w = x + N * C;
    double *dw = dx + N * C, *db = dw + C;
    memset(dx, 0, sizeof(double) * o->nx);
    for (int n = 0; n < N; n++) {
        const double *r = x + n * C, *g = d + n * C;
        double m = 0, v = 0, a = 0, bb = 0;
        for (int c = 0; c < C; c++) m += r[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (r[c] - m) * (r[c] - m);
        double rs = 1.0 / sqrt(v / C + o->eps);
        for (int c = 0; c < C; c++) {
            double nr = (r[c] - m) * rs;
            a += g[c] * w[c];
            bb += g[c] * w[c] * nr;
            dw[c] += g[c] * nr;
            db[c] += o->has_b ? g[c] : 0;
        }
        for (int c = 0; c < C; c++)
            dx[n * C + c] = rs * (g[c] * w[c] - a / C - (r[c] - m) * rs * bb / C);
    }
}

/* rmsnorm: x = [inp (N,C) | w (C)] */
static void rms_f(const ref_op *o, const double *x, double *out) {
    int N = o->N, C = o->C;
    const double *w = x + N * C;
    for (int n = 0; n < N; n++) {
        double s = 0;
        for (int c = 0; c < C; c++) s += x[n * C + c] * x[n * C + c];
        double rs = 1.0 / sqrt(s / C + o->eps);
        for (int c = 0; c < C; c++) out[n * C + c] = x[n * C + c] * rs * w[c];
    }
}
static void rms_b(const ref_op *o, const double *x, const double *d, double *dx) {
    int N = o->N, C = o->C;
    const double *w = x + N * C;
    double *dw = dx + N * C;
    memset(dx, 0, sizeof(double) * o->nx);
    for (int n = 0; n < N; n++) {
        const double *r = x + n * C, *g = d + n * C;
        double s = 0, k = 0;
        for (int c = 0; c < C; c++) s += r[c] * r[c];
        double rs = 1.0 / sqrt(s / C + o->eps);
        for (int c = 0; c < C; c++) {
            k += g[c] * w[c] * r[c];
            dw[c] += g[c] * r[c] * rs;
        }
        for (int c = 0; c < C; c++) dx[n * C + c] = rs * g[c] * w[c] - r[c] * rs * rs * rs * k / C;
    }
}

/* embedding: x = wte (V,C); out (N,C) */
static void emb_f(const ref_op *o, const double *x, double *out) {
    for (int n = 0; n < o->N; n++)
        for (int c = 0; c < o->C; c++) out[n * o->C + c] = x[o->idx[n] * o->C + c];
}
static void emb_b(const ref_op *o, const double *x, const double *d, double *dx) {
    memset(dx, 0, sizeof(double) * o->nx);
    for (int n = 0; n < o->N; n++)
        for (int c = 0; c < o->C; c++) dx[o->idx[n] * o->C + c] += d[n * o->C + c];
}

/* positions: x = [x (B,T,C) | wpe (T,C)]; out = x + wpe[t] */
static void pos_f(const ref_op *o, const double *x, double *out) {
    int BTC = o->B * o->T * o->C, TC = o->T * o->C;
    for (int i = 0; i < BTC; i++) out[i] = x[i] + x[BTC + i % TC];
}
static void pos_b(const ref_op *o, const double *x, const double *d, double *dx) {
    int BTC = o->B * o->T * o->C, TC = o->T * o->C;
    memset(dx, 0, sizeof(double) * o->nx);
    for (int i = 0; i < BTC; i++) {
        dx[i] = d[i];
        dx[BTC + i % TC] += d[i];
    }
}

/* rope on qkv (B,T,(H+2KV)*hd), rotate-half; dir -1 is the transpose */
static void rope_ref(const ref_op *o, const double *x, double *out, double dir) {
    int S = (o->H + 2 * o->KV) * o->hd, h2 = o->hd / 2;
    memcpy(out, x, sizeof(double) * o->nout);
    for (int b = 0; b < o->B; b++)
        for (int t = 0; t < o->T; t++)
            for (int h = 0; h < o->H + o->KV; h++)
                for (int i = 0; i < h2; i++) {
                    double ang = t * pow(o->theta, -2.0 * i / o->hd);
                    double c = cos(ang), s = dir * sin(ang);
                    size_t k = ((size_t)b * o->T + t) * S + h * o->hd + i;
                    out[k] = x[k] * c - x[k + h2] * s;
                    out[k + h2] = x[k + h2] * c + x[k] * s;
                }
}
static void rope_f(const ref_op *o, const double *x, double *out) { rope_ref(o, x, out, 1.0); }
static void rope_b(const ref_op *o, const double *x, const double *d, double *dx) {
    rope_ref(o, d, dx, -1.0);
}

/* attention: x = qkv (B,T,(H+2KV)*hd); out (B,T,H*hd); full T*T scores, explicit mask */
static void att_probs(const ref_op *o, const double *x, int b, int h, double *P, double *lse) {
    int T = o->T, hd = o->hd, S = (o->H + 2 * o->KV) * hd, g = h / (o->H / o->KV);
    double sc = 1.0 / sqrt((double)hd);
    for (int i = 0; i < T; i++) {
        const double *q = x + ((size_t)b * T + i) * S + h * hd;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < T; j++) {
            const double *k = x + ((size_t)b * T + j) * S + (o->H + g) * hd;
            double s = 0;
            for (int d = 0; d < hd; d++) s += q[d] * k[d];
            P[i * T + j] = j <= i ? s * sc : -INFINITY;
            mx = P[i * T + j] > mx ? P[i * T + j] : mx;
        }
        for (int j = 0; j < T; j++) sum += P[i * T + j] = exp(P[i * T + j] - mx);
        for (int j = 0; j < T; j++) P[i * T + j] /= sum;
        if (lse) lse[i] = mx + log(sum);
    }
}
static void att_fwd_lse(const ref_op *o, const double *x, double *out, double *lse) {
    int T = o->T, hd = o->hd, S = (o->H + 2 * o->KV) * hd, G = o->H / o->KV;
    double *P = dvec((size_t)T * T);
    for (int b = 0; b < o->B; b++)
        for (int h = 0; h < o->H; h++) {
            att_probs(o, x, b, h, P, lse ? lse + ((size_t)b * o->H + h) * T : NULL);
            for (int i = 0; i < T; i++)
                for (int d = 0; d < hd; d++) {
                    double s = 0;
                    for (int j = 0; j < T; j++)
                        s += P[i * T + j] * x[((size_t)b * T + j) * S + (o->H + o->KV + h / G) * hd + d];
                    out[((size_t)b * T + i) * o->H * hd + h * hd + d] = s;
                }
        }
    free(P);
}
static void att_f(const ref_op *o, const double *x, double *out) { att_fwd_lse(o, x, out, NULL); }
static void att_b(const ref_op *o, const double *x, const double *dout, double *dx) {
    int T = o->T, hd = o->hd, H = o->H, KV = o->KV, S = (H + 2 * KV) * hd, G = H / KV;
    double sc = 1.0 / sqrt((double)hd);
    double *P = dvec((size_t)T * T), *dP = dvec((size_t)T * T);
    memset(dx, 0, sizeof(double) * o->nx);
    for (int b = 0; b < o->B; b++)
        for (int h = 0; h < H; h++) {
            int g = h / G;
            att_probs(o, x, b, h, P, NULL);
#define Q(t) (x + ((size_t)b * T + (t)) * S + h * hd)
#define K(t) (x + ((size_t)b * T + (t)) * S + (H + g) * hd)
#define VV(t) (x + ((size_t)b * T + (t)) * S + (H + KV + g) * hd)
#define DO(t) (dout + ((size_t)b * T + (t)) * H * hd + h * hd)
            for (int i = 0; i < T; i++) {
                double rs = 0;
                for (int j = 0; j < T; j++) {
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += DO(i)[d] * VV(j)[d];
                    dP[i * T + j] = s;
                    rs += s * P[i * T + j];
                }
                for (int j = 0; j < T; j++) dP[i * T + j] = P[i * T + j] * (dP[i * T + j] - rs);
            }
            for (int i = 0; i < T; i++)
                for (int j = 0; j < T; j++)
                    for (int d = 0; d < hd; d++) {
                        dx[((size_t)b * T + i) * S + h * hd + d] += sc * dP[i * T + j] * K(j)[d];
                        dx[((size_t)b * T + j) * S + (H + g) * hd + d] += sc * dP[i * T + j] * Q(i)[d];
                        dx[((size_t)b * T + j) * S + (H + KV + g) * hd + d] += P[i * T + j] * DO(i)[d];
                    }
#undef Q
#undef K
#undef VV
#undef DO
        }
    free(P);
    free(dP);
}

/* gelu, tanh approximation */
static void gelu_f(const ref_op *o, const double *x, double *out) {
    for (size_t i = 0; i < o->nx; i++)
        out[i] = 0.5 * x[i] * (1 + tanh(sqrt(2 / PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
}
static void gelu_b(const ref_op *o, const double *x, const double *d, double *dx) {
    for (size_t i = 0; i < o->nx; i++) {
        double k = sqrt(2 / PI), u = k * (x[i] + 0.044715 * x[i] * x[i] * x[i]), t = tanh(u);
        dx[i] = d[i] * (0.5 * (1 + t) + 0.5 * x[i] * (1 - t * t) * k * (1 + 3 * 0.044715 * x[i] * x[i]));
    }
}

/* swiglu: x (N, 2Hd) = [gate | up]; out (N, Hd); here C = Hd */
static void swi_f(const ref_op *o, const double *x, double *out) {
    for (int n = 0; n < o->N; n++)
        for (int i = 0; i < o->C; i++) {
            double g = x[n * 2 * o->C + i], u = x[n * 2 * o->C + o->C + i];
            out[n * o->C + i] = g / (1 + exp(-g)) * u;
        }
}
static void swi_b(const ref_op *o, const double *x, const double *d, double *dx) {
    for (int n = 0; n < o->N; n++)
        for (int i = 0; i < o->C; i++) {
            double g = x[n * 2 * o->C + i], u = x[n * 2 * o->C + o->C + i];
            double s = 1 / (1 + exp(-g)), dd = d[n * o->C + i];
            dx[n * 2 * o->C + i] = dd * u * (s + g * s * (1 - s));
            dx[n * 2 * o->C + o->C + i] = dd * g * s;
        }
}

/* softmax cross entropy: x = logits (N,V); out = losses (N) */
static void xent_f(const ref_op *o, const double *x, double *out) {
    for (int n = 0; n < o->N; n++) {
        const double *r = x + (size_t)n * o->V;
        if (o->idx[n] < 0) {
            out[n] = 0;
            continue;
        }
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < o->V; j++) mx = r[j] > mx ? r[j] : mx;
        for (int j = 0; j < o->V; j++) s += exp(r[j] - mx);
        out[n] = log(s) + mx - r[o->idx[n]];
    }
}
static void xent_b(const ref_op *o, const double *x, const double *d, double *dx) {
    for (int n = 0; n < o->N; n++) {
        const double *r = x + (size_t)n * o->V;
        double *g = dx + (size_t)n * o->V;
        if (o->idx[n] < 0) {
            memset(g, 0, sizeof(double) * o->V);
            continue;
        }
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < o->V; j++) mx = r[j] > mx ? r[j] : mx;
        for (int j = 0; j < o->V; j++) s += exp(r[j] - mx);
        for (int j = 0; j < o->V; j++) g[j] = d[n] * exp(r[j] - mx) / s;
        g[o->idx[n]] -= d[n];
    }
}

/* ---- per-op tests ---------------------------------------------------------------------- */

static double *rand_d(size_t n) {
    double *r = dvec(n);
    for (size_t i = 0; i < n; i++) r[i] = urand() * 2 - 1;
    return r;
}

static void test_linear(int N, int IC, int OC) {
    char nm[96];
    ref_op o = {.name = "linear", .fwd = lin_f, .bwd = lin_b, .N = N, .IC = IC, .OC = OC};
    size_t ni = (size_t)N * IC, nw = (size_t)OC * IC;
    o.nx = ni + nw + OC;
    o.nout = (size_t)N * OC;
    float *xf = fvec(o.nx, -1, 1);
    double *x = to_d(xf, o.nx), *R = rand_d(o.nout), *out = dvec(o.nout), *dx = dvec(o.nx);
    if (N * IC * OC < 4000) fd_check(&o, x, R);
    lin_f(&o, x, out);
    lin_b(&o, x, R, dx);
    float *of = fpoison(o.nout);
    be->linear_forward(of, xf, xf + ni, xf + ni + nw, N, IC, OC);
    snprintf(nm, sizeof nm, "linear fwd N=%d IC=%d OC=%d", N, IC, OC);
    check(nm, of, out, o.nout, TOL_FWD);
    /* without bias: out must be overwritten (poisoned) */
    double *out0 = dvec(o.nout);
    for (size_t i = 0; i < o.nout; i++) out0[i] = out[i] - x[ni + nw + i % OC];
    for (size_t i = 0; i < o.nout; i++) of[i] = NAN;
    be->linear_forward(of, xf, xf + ni, NULL, N, IC, OC);
    snprintf(nm, sizeof nm, "linear fwd no bias N=%d IC=%d OC=%d", N, IC, OC);
    check(nm, of, out0, o.nout, TOL_FWD);
    /* backward: dinp overwritten over garbage, dw/dbias accumulate onto a prefill, twice */
    float *Rf = to_f(R, o.nout), *dinp = fpoison(ni), *dw = fvec(nw, -1, 1), *db = fvec(OC, -1, 1);
    double *ew = to_d(dw, nw), *eb = to_d(db, OC);
    for (int rep = 1; rep <= 2; rep++) {
        be->linear_backward(dinp, dw, db, Rf, xf, xf + ni, N, IC, OC);
        for (size_t i = 0; i < nw; i++) ew[i] += dx[ni + i];
        for (int i = 0; i < OC; i++) eb[i] += dx[ni + nw + i];
        snprintf(nm, sizeof nm, "linear bwd dinp N=%d IC=%d OC=%d call %d", N, IC, OC, rep);
        check(nm, dinp, dx, ni, TOL_BWD);
        snprintf(nm, sizeof nm, "linear bwd dw (+= prefill) call %d", rep);
        check(nm, dw, ew, nw, TOL_BWD);
        snprintf(nm, sizeof nm, "linear bwd dbias (+= prefill) call %d", rep);
        check(nm, db, eb, OC, TOL_BWD);
    }
    be->linear_backward(NULL, dw, NULL, Rf, xf, xf + ni, N, IC, OC); /* NULL dinp, dbias */
    for (size_t i = 0; i < nw; i++) ew[i] += dx[ni + i];
    check("linear bwd dinp=NULL dbias=NULL: dw", dw, ew, nw, TOL_BWD);
    free(xf), free(x), free(R), free(out), free(dx), free(of), free(out0), free(Rf), free(dinp);
    free(dw), free(db), free(ew), free(eb);
}

static void test_layernorm(int N, int C, int has_b) {
    char nm[96];
    ref_op o = {.name = "layernorm", .fwd = ln_f, .bwd = ln_b, .N = N, .C = C, .eps = 1e-5,
                .has_b = has_b};
    size_t nn = (size_t)N * C;
    o.nx = nn + 2 * C;
    o.nout = nn;
    float *xf = fvec(o.nx, -1, 1);
    for (size_t i = 0; i < nn; i++) xf[i] = 3 * xf[i] + 0.5f; /* nonzero mean */
    double *x = to_d(xf, o.nx), *R = rand_d(nn), *out = dvec(nn), *dx = dvec(o.nx);
    if (N * C < 600) fd_check(&o, x, R);
    ln_f(&o, x, out);
    ln_b(&o, x, R, dx);
    float *of = fpoison(nn), *mean = fpoison(N), *rstd = fpoison(N);
    be->layernorm_forward(of, mean, rstd, xf, xf + nn, has_b ? xf + nn + C : NULL, N, C, 1e-5f);
    snprintf(nm, sizeof nm, "layernorm fwd N=%d C=%d bias=%d", N, C, has_b);
    check(nm, of, out, nn, TOL_FWD);
    float *Rf = to_f(R, nn), *dinp = fpoison(nn), *dw = fvec(C, -1, 1), *db = fvec(C, -1, 1);
    double *ew = to_d(dw, C), *eb = to_d(db, C);
    for (int rep = 1; rep <= 2; rep++) {
        be->layernorm_backward(dinp, dw, has_b ? db : NULL, Rf, xf, xf + nn, mean, rstd, N, C);
        for (int i = 0; i < C; i++) ew[i] += dx[nn + i], eb[i] += has_b ? dx[nn + C + i] : 0;
        snprintf(nm, sizeof nm, "layernorm bwd dinp N=%d C=%d call %d", N, C, rep);
        check(nm, dinp, dx, nn, TOL_BWD);
        snprintf(nm, sizeof nm, "layernorm bwd dw (+= prefill) call %d", rep);
        check(nm, dw, ew, C, TOL_BWD);
        snprintf(nm, sizeof nm, "layernorm bwd db (+= prefill%s) call %d", has_b ? "" : ", NULL",
                 rep);
        check(nm, db, eb, C, TOL_BWD);
    }
    free(xf), free(x), free(R), free(out), free(dx), free(of), free(mean), free(rstd), free(Rf);
    free(dinp), free(dw), free(db), free(ew), free(eb);
}

static void test_rmsnorm(int N, int C) {
    char nm[96];
    ref_op o = {.name = "rmsnorm", .fwd = rms_f, .bwd = rms_b, .N = N, .C = C, .eps = 1e-5};
    size_t nn = (size_t)N * C;
    o.nx = nn + C;
    o.nout = nn;
    float *xf = fvec(o.nx, -1, 1);
    double *x = to_d(xf, o.nx), *R = rand_d(nn), *out = dvec(nn), *dx = dvec(o.nx);
    if (N * C < 600) fd_check(&o, x, R);
    rms_f(&o, x, out);
    rms_b(&o, x, R, dx);
    float *of = fpoison(nn), *rstd = fpoison(N);
    be->rmsnorm_forward(of, rstd, xf, xf + nn, N, C, 1e-5f);
    snprintf(nm, sizeof nm, "rmsnorm fwd N=%d C=%d", N, C);
    check(nm, of, out, nn, TOL_FWD);
    float *Rf = to_f(R, nn), *dinp = fpoison(nn), *dw = fvec(C, -1, 1);
    double *ew = to_d(dw, C);
    for (int rep = 1; rep <= 2; rep++) {
        be->rmsnorm_backward(dinp, dw, Rf, xf, xf + nn, rstd, N, C);
        for (int i = 0; i < C; i++) ew[i] += dx[nn + i];
        snprintf(nm, sizeof nm, "rmsnorm bwd dinp N=%d C=%d call %d", N, C, rep);
        check(nm, dinp, dx, nn, TOL_BWD);
        snprintf(nm, sizeof nm, "rmsnorm bwd dw (+= prefill) call %d", rep);
        check(nm, dw, ew, C, TOL_BWD);
    }
    free(xf), free(x), free(R), free(out), free(dx), free(of), free(rstd), free(Rf), free(dinp);
    free(dw), free(ew);
}

static void test_embedding(int N, int V, int C) {
    char nm[96];
    int *tok = xmalloc(sizeof(int) * N);
    for (int n = 0; n < N; n++) tok[n] = (int)(urand() * V / 2); /* repeats */
    ref_op o = {.name = "embedding", .fwd = emb_f, .bwd = emb_b, .N = N, .C = C, .idx = tok};
    o.nx = (size_t)V * C;
    o.nout = (size_t)N * C;
    float *wf = fvec(o.nx, -1, 1);
    double *x = to_d(wf, o.nx), *R = rand_d(o.nout), *out = dvec(o.nout), *dx = dvec(o.nx);
    if (o.nx < 2000) fd_check(&o, x, R);
    emb_f(&o, x, out);
    emb_b(&o, x, R, dx);
    float *of = fpoison(o.nout);
    be->embedding_forward(of, tok, wf, N, C);
    snprintf(nm, sizeof nm, "embedding fwd N=%d V=%d C=%d", N, V, C);
    check(nm, of, out, o.nout, 0.0);
    float *Rf = to_f(R, o.nout), *dw = fvec(o.nx, -1, 1);
    double *ew = to_d(dw, o.nx);
    for (int rep = 1; rep <= 2; rep++) {
        be->embedding_backward(dw, Rf, tok, N, C);
        for (size_t i = 0; i < o.nx; i++) ew[i] += dx[i];
        snprintf(nm, sizeof nm, "embedding bwd dwte (+= prefill) call %d", rep);
        check(nm, dw, ew, o.nx, TOL_BWD);
    }
    free(tok), free(wf), free(x), free(R), free(out), free(dx), free(of), free(Rf), free(dw);
    free(ew);
}

static void test_positions(int B, int T, int C) {
    char nm[96];
    ref_op o = {.name = "positions", .fwd = pos_f, .bwd = pos_b, .B = B, .T = T, .C = C};
    size_t nb = (size_t)B * T * C, nt = (size_t)T * C;
    o.nx = nb + nt;
    o.nout = nb;
    float *xf = fvec(o.nx, -1, 1);
    double *x = to_d(xf, o.nx), *R = rand_d(nb), *out = dvec(nb), *dx = dvec(o.nx);
    fd_check(&o, x, R);
    pos_f(&o, x, out);
    pos_b(&o, x, R, dx);
    be->positions_forward(xf, xf + nb, B, T, C); /* in place: no poison possible */
    snprintf(nm, sizeof nm, "positions fwd B=%d T=%d C=%d (in place)", B, T, C);
    check(nm, xf, out, nb, TOL_FWD);
    float *Rf = to_f(R, nb), *dw = fvec(nt, -1, 1);
    double *ew = to_d(dw, nt);
    for (int rep = 1; rep <= 2; rep++) {
        be->positions_backward(dw, Rf, B, T, C);
        for (size_t i = 0; i < nt; i++) ew[i] += dx[nb + i];
        snprintf(nm, sizeof nm, "positions bwd dwpe (+= prefill) call %d", rep);
        check(nm, dw, ew, nt, TOL_BWD);
    }
    free(xf), free(x), free(R), free(out), free(dx), free(Rf), free(dw), free(ew);
}

static void test_rope(int B, int T, int H, int KV, int hd) {
    char nm[96];
    ref_op o = {.name = "rope", .fwd = rope_f, .bwd = rope_b, .B = B, .T = T, .H = H, .KV = KV,
                .hd = hd, .theta = 10000.0};
    o.nx = o.nout = (size_t)B * T * (H + 2 * KV) * hd;
    float *xf = fvec(o.nx, -1, 1);
    double *x = to_d(xf, o.nx), *R = rand_d(o.nx), *out = dvec(o.nx), *dx = dvec(o.nx);
    fd_check(&o, x, R);
    rope_f(&o, x, out);
    rope_b(&o, x, R, dx);
    be->rope_forward(xf, B, T, H, KV, hd, 10000.0f);
    snprintf(nm, sizeof nm, "rope fwd B=%d T=%d H=%d KV=%d hd=%d (in place)", B, T, H, KV, hd);
    check(nm, xf, out, o.nx, TOL_FWD);
    float *Rf = to_f(R, o.nx);
    be->rope_backward(Rf, B, T, H, KV, hd, 10000.0f);
    snprintf(nm, sizeof nm, "rope bwd (in place)");
    check(nm, Rf, dx, o.nx, TOL_BWD);
    free(xf), free(x), free(R), free(out), free(dx), free(Rf);
}

static void test_attention(int B, int T, int H, int KV, int hd) {
    char nm[128];
    ref_op o = {.name = "attention", .fwd = att_f, .bwd = att_b, .B = B, .T = T, .H = H, .KV = KV,
                .hd = hd};
    o.nx = (size_t)B * T * (H + 2 * KV) * hd;
    o.nout = (size_t)B * T * H * hd;
    size_t nl = (size_t)B * H * T;
    float *xf = fvec(o.nx, -2, 2);
    double *x = to_d(xf, o.nx), *R = rand_d(o.nout), *out = dvec(o.nout), *dx = dvec(o.nx);
    double *lse = dvec(nl);
    if (T <= 20) fd_check(&o, x, R);
    att_fwd_lse(&o, x, out, lse);
    att_b(&o, x, R, dx);
    float *of = fpoison(o.nout), *lf = fpoison(nl);
    be->attention_forward(of, lf, xf, B, T, H, KV, hd);
    snprintf(nm, sizeof nm, "attention fwd B=%d T=%d H=%d KV=%d hd=%d", B, T, H, KV, hd);
    check(nm, of, out, o.nout, TOL_FWD);
    check("attention fwd lse", lf, lse, nl, TOL_FWD);
    float *Rf = to_f(R, o.nout), *dq = fpoison(o.nx);
    be->attention_backward(dq, Rf, xf, of, lf, B, T, H, KV, hd);
    snprintf(nm, sizeof nm, "attention bwd dqkv (over NaN) B=%d T=%d H=%d KV=%d hd=%d", B, T, H,
             KV, hd);
    check(nm, dq, dx, o.nx, TOL_BWD);
    free(xf), free(x), free(R), free(out), free(dx), free(lse), free(of), free(lf), free(Rf);
    free(dq);
}

static void test_gelu(size_t n) {
    ref_op o = {.name = "gelu", .fwd = gelu_f, .bwd = gelu_b, .nx = n, .nout = n};
    float *xf = fvec(n, -6, 6);
    xf[0] = -20.0f, xf[1] = 20.0f, xf[2] = 0.0f; /* saturated ends and zero */
    double *x = to_d(xf, n), *R = rand_d(n), *out = dvec(n), *dx = dvec(n);
    fd_check(&o, x, R);
    gelu_f(&o, x, out);
    gelu_b(&o, x, R, dx);
    float *of = fpoison(n), *Rf = to_f(R, n), *dinp = fpoison(n);
    be->gelu_forward(of, xf, n);
    check("gelu fwd n=1001", of, out, n, TOL_FWD);
    be->gelu_backward(dinp, Rf, xf, n);
    check("gelu bwd n=1001", dinp, dx, n, TOL_BWD);
    free(xf), free(x), free(R), free(out), free(dx), free(of), free(Rf), free(dinp);
}

static void test_swiglu(int N, int Hd) {
    char nm[96];
    ref_op o = {.name = "swiglu", .fwd = swi_f, .bwd = swi_b, .N = N, .C = Hd};
    o.nx = (size_t)N * 2 * Hd;
    o.nout = (size_t)N * Hd;
    float *xf = fvec(o.nx, -5, 5);
    double *x = to_d(xf, o.nx), *R = rand_d(o.nout), *out = dvec(o.nout), *dx = dvec(o.nx);
    fd_check(&o, x, R);
    swi_f(&o, x, out);
    swi_b(&o, x, R, dx);
    float *of = fpoison(o.nout), *Rf = to_f(R, o.nout), *dinp = fpoison(o.nx);
    be->swiglu_forward(of, xf, N, Hd);
    snprintf(nm, sizeof nm, "swiglu fwd N=%d Hd=%d", N, Hd);
    check(nm, of, out, o.nout, TOL_FWD);
    be->swiglu_backward(dinp, Rf, xf, N, Hd);
    snprintf(nm, sizeof nm, "swiglu bwd N=%d Hd=%d", N, Hd);
    check(nm, dinp, dx, o.nx, TOL_BWD);
    free(xf), free(x), free(R), free(out), free(dx), free(of), free(Rf), free(dinp);
}

static void test_xent(int N, int V, float lo, float hi, int fd) {
    char nm[96];
    int *tgt = xmalloc(sizeof(int) * N);
    for (int n = 0; n < N; n++) tgt[n] = (int)(urand() * V);
    if (N > 2) tgt[1] = -1; /* ignored row */
    float dscale = 1.0f / N;
    ref_op o = {.name = "softmax_xent", .fwd = xent_f, .bwd = xent_b, .N = N, .V = V, .idx = tgt};
    o.nx = (size_t)N * V;
    o.nout = N;
    float *xf = fvec(o.nx, lo, hi);
    double *x = to_d(xf, o.nx), *R = dvec(N), *out = dvec(N), *dx = dvec(o.nx);
    for (int n = 0; n < N; n++) R[n] = dscale; /* the op's L is dscale * sum(losses) */
    if (fd) fd_check(&o, x, R);
    xent_f(&o, x, out);
    xent_b(&o, x, R, dx);
    float *lf = fpoison(N), *g = xmalloc(sizeof(float) * o.nx);
    memcpy(g, xf, sizeof(float) * o.nx);
    be->softmax_xent(g, lf, tgt, N, V, V, dscale, 1);
    snprintf(nm, sizeof nm, "softmax_xent loss N=%d V=%d logits in [%g,%g]", N, V, lo, hi);
    check(nm, lf, out, N, TOL_FWD);
    snprintf(nm, sizeof nm, "softmax_xent grad N=%d V=%d", N, V);
    check(nm, g, dx, o.nx, TOL_BWD);
    for (int n = 0; n < N; n++) lf[n] = NAN;
    memcpy(g, xf, sizeof(float) * o.nx);
    be->softmax_xent(g, lf, tgt, N, V, V, dscale, 0);
    snprintf(nm, sizeof nm, "softmax_xent loss only (logits untouched) N=%d V=%d", N, V);
    check(nm, lf, out, N, TOL_FWD);
    check_true("softmax_xent want_grad=0 leaves logits unchanged",
               memcmp(g, xf, sizeof(float) * o.nx) == 0);
    /* rows padded to ld (garbage in the padding): the same bits, and 0 in the padding */
    int ld = V + 13;
    float *gp = fvec((size_t)N * ld, 1e3f, 2e3f), *lp = fpoison(N), *g1 = xmalloc(sizeof(float) * o.nx);
    for (int n = 0; n < N; n++) memcpy(gp + (size_t)n * ld, xf + (size_t)n * V, sizeof(float) * V);
    memcpy(g1, xf, sizeof(float) * o.nx);
    be->softmax_xent(g1, lf, tgt, N, V, V, dscale, 1);
    be->softmax_xent(gp, lp, tgt, N, V, ld, dscale, 1);
    int same = memcmp(lp, lf, sizeof(float) * N) == 0, zero = 1;
    for (int n = 0; n < N; n++) {
        same &= memcmp(gp + (size_t)n * ld, g1 + (size_t)n * V, sizeof(float) * V) == 0;
        for (int j = V; j < ld; j++) zero &= gp[(size_t)n * ld + j] == 0.0f;
    }
    snprintf(nm, sizeof nm, "softmax_xent rows padded to %d: same bits, padding 0", ld);
    check_true(nm, same && zero);
    free(gp), free(lp), free(g1);
    free(tgt), free(xf), free(x), free(R), free(out), free(dx), free(lf), free(g);
}

static void test_misc(void) {
    /* add, with out aliasing a */
    size_t n = 1003;
    float *a = fvec(n, -1, 1), *b = fvec(n, -1, 1), *o = fpoison(n);
    double *e = dvec(n);
    for (size_t i = 0; i < n; i++) e[i] = (double)a[i] + b[i];
    be->add(o, a, b, n);
    check("add n=1003", o, e, n, 1e-7);
    be->add(a, a, b, n);
    check("add n=1003 (out aliases a)", a, e, n, 1e-7);
    /* scale: fp32 product is exactly the rounded double product */
    for (size_t i = 0; i < n; i++) e[i] = (float)((double)b[i] * (double)0.37f);
    be->scale(b, 0.37f, n);
    check("scale n=1003 (exact)", b, e, n, 0.0);
    free(a), free(b), free(o), free(e);
    /* sumsq across several chunks, vs a plain double loop */
    size_t m = 1000003;
    float *x = fvec(m, -1, 1);
    double s = 0;
    for (size_t i = 0; i < m; i++) s += (double)x[i] * x[i];
    double got = be->sumsq(x, m), rel = fabs(got - s) / s;
    n_check++;
    if (!(rel <= 1e-10)) n_fail++;
    printf("%s %-52s max err %.2e (max|ref| %.2e) tol 1e-10\n", rel <= 1e-10 ? "ok  " : "FAIL",
           "sumsq n=1000003 (double accumulation)", rel, s);
    check_true("sumsq n=0 is 0", be->sumsq(x, 0) == 0.0);
    free(x);
    /* alloc: zeroed, aligned; free(NULL) */
    unsigned char *p = be->alloc(1000);
    int ok = p && ((uintptr_t)p % 64) == 0;
    for (int i = 0; ok && i < 1000; i++) ok = p[i] == 0;
    check_true("alloc(1000) is 64-byte aligned and zeroed", ok);
    be->free(p);
    be->free(NULL);
}

/* three AdamW steps vs the PyTorch formula in double */
static void test_adamw(void) {
    size_t n = 517;
    float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    float *p = fvec(n, -1, 1), *m = fpoison(n), *v = fpoison(n);
    for (size_t i = 0; i < n; i++) m[i] = v[i] = 0.0f;
    double *pd = to_d(p, n), *md = dvec(n), *vd = dvec(n);
    for (int t = 1; t <= 3; t++) {
        float *g = fvec(n, -2, 2);
        double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
        for (size_t i = 0; i < n; i++) {
            double gi = (double)g[i] * gs;
            pd[i] -= (double)lr * wd * pd[i];
            md[i] = b1 * md[i] + (1 - (double)b1) * gi;
            vd[i] = b2 * vd[i] + (1 - (double)b2) * gi * gi;
            pd[i] -= lr * (md[i] / bc1) / (sqrt(vd[i] / bc2) + eps);
        }
        be->adamw(p, p, g, m, v, n, lr, b1, b2, eps, wd, (float)bc1, (float)bc2, gs);
        free(g);
    }
    check("adamw 3 steps: p", p, pd, n, 1e-6);
    check("adamw 3 steps: m", m, md, n, 1e-6);
    check("adamw 3 steps: v", v, vd, n, 1e-6);
    free(p), free(m), free(v), free(pd), free(md), free(vd);
}

/* Same inputs twice with 2 threads, then with 1 thread: all bitwise identical. */
static void test_determinism(void) {
    int B = 2, T = 150, H = 4, KV = 2, hd = 32, S = (H + 2 * KV) * hd;
    size_t nq = (size_t)B * T * S, no = (size_t)B * T * H * hd;
    float *qkv = fvec(nq, -2, 2), *out = fpoison(no), *lse = fpoison((size_t)B * H * T);
    float *dout = fvec(no, -1, 1), *d[3];
    be->attention_forward(out, lse, qkv, B, T, H, KV, hd);
    for (int r = 0; r < 3; r++) {
        omp_set_num_threads(r < 2 ? 2 : 1);
        d[r] = fpoison(nq);
        be->attention_backward(d[r], dout, qkv, out, lse, B, T, H, KV, hd);
    }
    check_bitwise("attention_backward: 2 threads twice", d[0], d[1], nq);
    check_bitwise("attention_backward: 2 threads vs 1 thread", d[0], d[2], nq);
    for (int r = 0; r < 3; r++) free(d[r]);
    free(qkv), free(out), free(lse), free(dout);

    int N = 1000, C = 67, V = 50;
    float *x = fvec((size_t)N * C, -1, 1), *w = fvec(C, -1, 1), *g = fvec((size_t)N * C, -1, 1);
    float *mean = fpoison(N), *rstd = fpoison(N), *y = fpoison((size_t)N * C);
    be->layernorm_forward(y, mean, rstd, x, w, NULL, N, C, 1e-5f);
    float *dx[3], *dw[3], *db[3], *de[3];
    int *tok = xmalloc(sizeof(int) * N);
    for (int i = 0; i < N; i++) tok[i] = (int)(urand() * V);
    for (int r = 0; r < 3; r++) {
        omp_set_num_threads(r < 2 ? 2 : 1);
        dx[r] = fpoison((size_t)N * C), dw[r] = fvec(C, 0, 0), db[r] = fvec(C, 0, 0);
        de[r] = fvec((size_t)V * C, 0, 0);
        be->layernorm_backward(dx[r], dw[r], db[r], g, x, w, mean, rstd, N, C);
        be->embedding_backward(de[r], g, tok, N, C);
    }
    omp_set_num_threads(2);
    check_bitwise("layernorm_backward dinp: 2 threads twice", dx[0], dx[1], (size_t)N * C);
    check_bitwise("layernorm_backward dw: 2 threads twice", dw[0], dw[1], C);
    check_bitwise("layernorm_backward db: 2 threads twice", db[0], db[1], C);
    check_bitwise("layernorm_backward dw: 2 threads vs 1 thread", dw[0], dw[2], C);
    check_bitwise("embedding_backward: 2 threads twice", de[0], de[1], (size_t)V * C);
    check_bitwise("embedding_backward: 2 threads vs 1 thread", de[0], de[2], (size_t)V * C);
    for (int r = 0; r < 3; r++) free(dx[r]), free(dw[r]), free(db[r]), free(de[r]);
    free(x), free(w), free(g), free(mean), free(rstd), free(y), free(tok);
}

/* extreme logits: one row over GPT-2's vocabulary, values +-1e4 */
static void test_xent_extreme(void) {
    int V = 50257;
    float *x = fvec(V, -1e4f, 1e4f), *loss = fpoison(1);
    int t = 123;
    double *xd = to_d(x, V), mx = -INFINITY, s = 0;
    for (int j = 0; j < V; j++) mx = xd[j] > mx ? xd[j] : mx;
    for (int j = 0; j < V; j++) s += exp(xd[j] - mx);
    double ref = log(s) + mx - xd[t];
    be->softmax_xent(x, loss, &t, 1, V, V, 1.0f, 1);
    int finite = isfinite(loss[0]);
    double gsum = 0;
    for (int j = 0; j < V; j++) finite &= isfinite(x[j]), gsum += x[j];
    check("softmax_xent V=50257 logits +-1e4: loss", loss, &ref, 1, TOL_FWD);
    check_true("softmax_xent V=50257 logits +-1e4: all finite, grad sums to 0",
               finite && fabs(gsum) < 1e-5);
    free(x), free(loss), free(xd);
}

/* adamw_multi over stretches of several sizes (with and without decay) = adamw on each */
static void test_adamw_multi(void) {
    size_t sizes[5] = {1, 17, 4096, 3, 70001}, tot = 0;
    for (int k = 0; k < 5; k++) tot += sizes[k];
    float *p1 = fvec(tot, -1, 1), *g = fvec(tot, -2, 2), *m1 = fvec(tot, -0.1f, 0.1f),
          *v1 = fvec(tot, 0, 0.01f);
    float *p2 = malloc(tot * 4), *m2 = malloc(tot * 4), *v2 = malloc(tot * 4);
    memcpy(p2, p1, tot * 4), memcpy(m2, m1, tot * 4), memcpy(v2, v1, tot * 4);
    tr_adamw_seg sg[5];
    size_t off = 0;
    for (int k = 0; k < 5; k++) {
        float wd = k % 2 ? 0.0f : 0.1f;
        be->adamw(p1 + off, p1 + off, g + off, m1 + off, v1 + off, sizes[k], 1e-2f, 0.9f, 0.95f,
                  1e-8f, wd, 0.19f, 0.0975f, 0.5f);
        sg[k] = (tr_adamw_seg){p2 + off, p2 + off, g + off, m2 + off, v2 + off, sizes[k], wd};
        off += sizes[k];
    }
    be->adamw_multi(sg, 5, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.19f, 0.0975f, 0.5f);
    check_bitwise("adamw_multi over 5 stretches: p", p2, p1, tot);
    check_bitwise("adamw_multi: m", m2, m1, tot);
    check_bitwise("adamw_multi: v", v2, v1, tot);
    free(p1), free(g), free(m1), free(v1), free(p2), free(m2), free(v2);
}

/* The optional fused ops give exactly what their parts give. */
static void test_fusions(int N, int C, int H) {
    char nm[96];
    size_t nc = (size_t)N * C, nh = (size_t)N * H;
    float *a = fvec(nc, -2, 2), *b = fvec(nc, -2, 2), *w = fvec(C, 0.5f, 1.5f), *bias = fvec(C, -1, 1);
    float *sum1 = fpoison(nc), *out1 = fpoison(nc), *sum2 = fpoison(nc), *out2 = fpoison(nc);
    float *m1 = fpoison(N), *r1 = fpoison(N), *m2 = fpoison(N), *r2 = fpoison(N);
    for (int rms = 0; rms <= 1; rms++) {
        be->add(sum1, a, b, nc);
        if (rms)
            be->rmsnorm_forward(out1, r1, sum1, w, N, C, 1e-5f);
        else
            be->layernorm_forward(out1, m1, r1, sum1, w, bias, N, C, 1e-5f);
        be->residual_norm_forward(sum2, out2, m2, r2, a, b, w, bias, N, C, 1e-5f, rms);
        snprintf(nm, sizeof(nm), "residual+%s N%d C%d: sum", rms ? "rmsnorm" : "layernorm", N, C);
        check_bitwise(nm, sum2, sum1, nc);
        snprintf(nm, sizeof(nm), "residual+%s N%d C%d: out", rms ? "rmsnorm" : "layernorm", N, C);
        check_bitwise(nm, out2, out1, nc);
        check_bitwise("  rstd", r2, r1, (size_t)N);
        if (!rms) check_bitwise("  mean", m2, m1, (size_t)N);
    }
    /* linear + GELU forward; linear backward through the GELU */
    float *x = fvec(nc, -1, 1), *W = fvec((size_t)H * C, -0.3f, 0.3f), *bb = fvec(H, -0.5f, 0.5f);
    float *pre1 = fpoison(nh), *act1 = fpoison(nh), *pre2 = fpoison(nh), *act2 = fpoison(nh);
    be->linear_forward(pre1, x, W, bb, N, C, H);
    be->gelu_forward(act1, pre1, nh);
    be->linear_gelu_forward(act2, pre2, x, W, bb, N, C, H);
    snprintf(nm, sizeof(nm), "linear+gelu fwd N%d %d->%d: pre", N, C, H);
    check_bitwise(nm, pre2, pre1, nh);
    snprintf(nm, sizeof(nm), "linear+gelu fwd N%d %d->%d: out", N, C, H);
    check_bitwise(nm, act2, act1, nh);
    /* the projection after the GELU: (N, H) -> (N, C), backward into dpre (N, H) */
    float *Wp = fvec((size_t)C * H, -0.3f, 0.3f), *dout = fvec(nc, -1, 1);
    float *dact = fpoison(nh), *dpre1 = fpoison(nh), *dpre2 = fpoison(nh);
    float *dw1 = calloc((size_t)C * H, 4), *dw2 = calloc((size_t)C * H, 4);
    float *db1 = calloc((size_t)C, 4), *db2 = calloc((size_t)C, 4);
    be->linear_backward(dact, dw1, db1, dout, act1, Wp, N, H, C);
    be->gelu_backward(dpre1, dact, pre1, nh);
    be->linear_backward_gelu(dpre2, dw2, db2, dout, act1, Wp, pre1, N, H, C);
    snprintf(nm, sizeof(nm), "linear bwd through gelu N%d %d->%d: dpre", N, H, C);
    check_bitwise(nm, dpre2, dpre1, nh);
    check_bitwise("  dw", dw2, dw1, (size_t)C * H);
    check_bitwise("  dbias", db2, db1, (size_t)C);
    float *bufs[] = {a, b, w, bias, sum1, out1, sum2, out2, m1, r1, m2, r2, x, W, bb, pre1, act1,
                     pre2, act2, Wp, dout, dact, dpre1, dpre2, dw1, dw2, db1, db2};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
}

int main(void) {
    be = tr_backend_cpu();
    omp_set_num_threads(2);
    test_linear(7, 13, 9);
    test_linear(33, 64, 48);
    test_linear(130, 67, 129);
    test_layernorm(5, 7, 1);
    test_layernorm(3, 9, 0);
    test_layernorm(130, 64, 1);
    test_rmsnorm(5, 7);
    test_rmsnorm(130, 65);
    test_embedding(9, 6, 5);
    test_embedding(300, 40, 67);
    test_positions(2, 5, 7);
    test_rope(2, 5, 4, 2, 16);
    test_rope(1, 7, 2, 1, 32);
    /* attention: T=1, T off the 64 tile, GQA (4,2), MQA (4,1), MHA */
    test_attention(2, 1, 4, 2, 16);
    test_attention(1, 13, 4, 2, 16);
    test_attention(2, 9, 4, 1, 8);
    test_attention(1, 70, 4, 1, 32);
    test_attention(2, 130, 4, 4, 64);
    test_attention(1, 64, 2, 2, 16);
    test_attention(1, 200, 4, 2, 128);
    test_gelu(1001);
    test_swiglu(3, 17);
    test_xent(4, 11, -3, 3, 1);
    test_xent(3, 1000, -10, 10, 0);
    test_xent_extreme();
    test_misc();
    test_adamw();
    test_determinism();
    test_adamw_multi();
    test_fusions(7, 13, 29);
    test_fusions(130, 64, 256);
    printf("%d/%d checks passed\n", n_check - n_fail, n_check);
    return n_fail ? 1 : 0;
}
