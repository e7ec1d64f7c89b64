/* Helpers shared by the subcommands: loading a recipe with the command-line overrides,
 * resolving "auto" values, the machine's measured peak, folders and number formatting. */
#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "trainer/trainer.h"

double tr_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tr_mkdirs(const char *path, char *err, size_t errlen) {
    char buf[TR_PATH_MAX];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
                snprintf(err, errlen, "cannot create folder '%s': %s", buf, strerror(errno));
                return -1;
            }
            *p = c;
            if (c == '\0') break;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "'%s' exists and is not a folder", path);
        return -1;
    }
    return 0;
}

/* The best sgemm rate of a few 1024-cubed products: the ceiling MFU is measured against on
 * the CPU (what BLAS can reach here, not the vendor's paper figure). */
double tr_measure_peak_gflops(void) {
    const int n = 1024;
    float *a = malloc((size_t)n * n * sizeof(float));
    float *b = malloc((size_t)n * n * sizeof(float));
    float *c = malloc((size_t)n * n * sizeof(float));
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    double best = 0;
    for (int rep = 0; rep < 8; rep++) {
        double t0 = tr_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c,
                    n);
        double dt = tr_now() - t0;
        double g = 2.0 * n * n * n / dt / 1e9;
        if (rep >= 2 && g > best) best = g;
    }
    free(a);
    free(b);
    free(c);
    return best;
}

void tr_fmt_count(double x, char *buf, size_t n) {
    if (x >= 1e12)
        snprintf(buf, n, "%.2fT", x / 1e12);
    else if (x >= 1e9)
        snprintf(buf, n, "%.2fG", x / 1e9);
    else if (x >= 1e6)
        snprintf(buf, n, "%.2fM", x / 1e6);
    else if (x >= 1e3)
        snprintf(buf, n, "%.1fK", x / 1e3);
    else
        snprintf(buf, n, "%.0f", x);
}

void tr_fmt_bytes(double x, char *buf, size_t n) {
    if (x >= 1024.0 * 1024 * 1024)
        snprintf(buf, n, "%.2f GiB", x / (1024.0 * 1024 * 1024));
    else if (x >= 1024.0 * 1024)
        snprintf(buf, n, "%.1f MiB", x / (1024.0 * 1024));
    else if (x >= 1024.0)
        snprintf(buf, n, "%.1f KiB", x / 1024.0);
    else
        snprintf(buf, n, "%.0f B", x);
}

void tr_fmt_duration(double s, char *buf, size_t n) {
    if (s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, n, "%lds", t);
}

int tr_load_recipe_msg(tr_recipe *r, const tr_options *o, const char *cmd, char *err,
                       size_t errlen) {
    if (tr_recipe_load(r, o->recipe, o->sets, o->n_sets, err, errlen)) return -1;
    if (o->steps) r->train.steps = o->steps;
    if (o->eval_every >= 0) r->train.eval_every = o->eval_every;
    if (o->sample_tokens >= 0) r->train.sample_tokens = o->sample_tokens;
    if (o->out) snprintf(r->train.out, sizeof(r->train.out), "%s", o->out);
    if (o->micro_batch) {
        long seqs = r->train.batch_tokens / r->model.seq_len;
        if (seqs % o->micro_batch) {
            snprintf(err, errlen,
                     "trainer %s: --micro-batch %d does not divide the %ld sequences of a step "
                     "(batch_tokens %ld / seq_len %d)",
                     cmd, o->micro_batch, seqs, r->train.batch_tokens, r->model.seq_len);
            tr_recipe_free(r);
            return -1;
        }
        r->train.micro_batch = o->micro_batch;
    }
    return 0;
}

int tr_load_recipe(tr_recipe *r, const tr_options *o, const char *cmd) {
    char err[1024];
    if (tr_load_recipe_msg(r, o, cmd, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 0;
}

static double memory_budget(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    double phys = pages > 0 && size > 0 ? (double)pages * (double)size : 8.0 * (1 << 30);
    double b = 0.25 * phys;
    return b < 8.0 * (1 << 30) ? b : 8.0 * (1 << 30);
}

int tr_resolve_micro_batch(const tr_recipe *r, int world, tr_dtype dtype, double budget,
                           int *micro, int *accum, char *err, size_t errlen) {
    long seqs = r->train.batch_tokens / r->model.seq_len;
    if (seqs % world) {
        snprintf(err, errlen, "train: %ld sequences per step do not split over %d ranks", seqs,
                 world);
        return -1;
    }
    long per_rank = seqs / world;
    if (r->train.micro_batch > 0) {
        if (per_rank % r->train.micro_batch) {
            snprintf(err, errlen,
                     "train: micro_batch %d does not divide the %ld sequences per rank of a step",
                     r->train.micro_batch, per_rank);
            return -1;
        }
        *micro = r->train.micro_batch;
        *accum = (int)(per_rank / r->train.micro_batch);
        return 0;
    }
    /* auto: the largest divisor whose activations and scratch fit the budget */
    if (budget <= 0) budget = memory_budget();
    for (long b = per_rank; b >= 1; b--) {
        if (per_rank % b) continue;
        tr_memory mem;
        tr_model_opts mo = {.B = (int)b, .T = r->model.seq_len,
                            .recompute = (tr_recompute)r->train.recompute};
        if (tr_model_measure(&r->model, dtype, &mo, &mem, err, errlen))
            return -1;
        if ((double)(mem.activations + mem.scratch) <= budget || b == 1) {
            *micro = (int)b;
            *accum = (int)(per_rank / b);
            return 0;
        }
    }
    snprintf(err, errlen, "train: no micro-batch fits");
    return -1;
}

const tr_backend *tr_choose_backend(const tr_options *o, const tr_recipe *r, double *peak,
                                    char *desc, size_t desclen, char *err, size_t errlen) {
    const char *dev = o->device ? o->device : "auto";
    tr_dtype dtype = TR_DTYPE_BF16;
    if (o->precision)
        dtype = !strcmp(o->precision, "fp32") ? TR_DTYPE_F32 : TR_DTYPE_BF16;
    else if (r && r->train.precision == TR_PRECISION_FP32)
        dtype = TR_DTYPE_F32;
    *peak = o->peak_gflops > 0 ? o->peak_gflops * 1e9 : r ? r->train.peak_tflops * 1e12 : 0;
    int given = *peak > 0;
    char why[256] = "";
    if (strcmp(dev, "cpu") != 0) {
        const tr_backend *be = tr_backend_cuda(dtype, why, sizeof(why));
        if (be) {
            char name[128];
            double table = tr_backend_cuda_peak(dtype, name, sizeof(name));
            if (*peak <= 0) *peak = table;
            if (*peak > 0)
                snprintf(desc, desclen, "cuda (%s), %s storage, peak %.0f TFLOP/s (%s)", name,
                         dtype == TR_DTYPE_BF16 ? "bf16" : "fp32", *peak / 1e12,
                         given ? "given" : "device table");
            else /* MFU is then not reported (a 0 peak would print it as inf) */
                snprintf(desc, desclen, "cuda (%s), %s storage, peak unknown for this device: no "
                         "MFU (set train.peak_tflops or --peak-gflops)", name,
                         dtype == TR_DTYPE_BF16 ? "bf16" : "fp32");
            return be;
        }
        if (!strcmp(dev, "cuda")) {
            snprintf(err, errlen, "--device cuda: %s", why);
            return NULL;
        }
    }
    if (*peak <= 0) *peak = tr_measure_peak_gflops() * 1e9;
    snprintf(desc, desclen, "cpu, fp32, peak %.1f GFLOP/s (%s)%s%s%s", *peak / 1e9,
             given ? "given" : "measured sgemm",
             o->precision && dtype == TR_DTYPE_BF16 ? "; --precision bf16 applies to CUDA only" : "",
             why[0] ? "; no GPU: " : "", why);
    return tr_backend_cpu();
}
