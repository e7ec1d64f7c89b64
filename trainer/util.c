/* Helpers shared by the subcommands: loading a recipe with the command-line overrides,
 * resolving the layout, the machine's measured peak, folders and number formatting. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/comm/comm.h"
#include "parallel/comm/cores.h"
#include "parallel/comm/env.h"
#include "parallel/topology.h"
#include "trainer/trainer.h"

/* TR_HOSTNAME, read once by tr_hostname_init: "" when unset. */
static char fake_host[TR_HOST_LEN];

int tr_hostname_init(char *msg, size_t msglen) {
    const char *v = NULL;
    int rc = tr_env_name("TR_HOSTNAME", TR_HOST_LEN - 1, &v, msg, msglen);
    snprintf(fake_host, sizeof fake_host, "%s", rc > 0 ? v : "");
    return rc < 0 ? -1 : 0;
}

void tr_hostname(char *buf, size_t n) {
    if (fake_host[0])
        snprintf(buf, n, "%s", fake_host);
    else if (gethostname(buf, n - 1))
        snprintf(buf, n, "?");
    buf[n - 1] = 0;
}

/* The best sgemm rate of a few 1024-cubed products: the ceiling MFU is measured against on
 * the CPU (what BLAS can reach here, not the vendor's paper figure). */
double tr_measure_peak_gflops(void) {
    return tr_topology_sgemm_rate(1024, 2, 6) / 1e9;
}

/* A count with its SI prefix and no unit, to the precision a reader compares counts at:
 * "124.44M" parameters, "16.4k" tokens, "512" (tr_fmt_si keeps 3 significant digits). */
void tr_fmt_count(double x, char *buf, size_t n) {
    int p = tr_fmt_power(x, 0);
    if (p < 0) p = 0;
    tr_fmt_scaled(x, p, 0, p >= 2 ? 2 : p, "", buf, n);
}

void tr_fmt_bytes(double x, char *buf, size_t n) {
    if (!isfinite(x)) {
        snprintf(buf, n, "-");
        return;
    }
    if (x >= 1024.0 * 1024 * 1024 * 1024) {
        tr_fmt_scaled(x, tr_fmt_power(x, 1), 1, 2, "B", buf, n);
        return;
    }
    if (x >= 1024.0 * 1024 * 1024)
        snprintf(buf, n, "%.2f GiB", x / (1024.0 * 1024 * 1024));
    else if (x >= 1024.0 * 1024)
        snprintf(buf, n, "%.1f MiB", x / (1024.0 * 1024));
    else if (x >= 1024.0)
        snprintf(buf, n, "%.1f KiB", x / 1024.0);
    else
        snprintf(buf, n, "%.0f B", x);
}

/* ---- human units for pages and tables (trainer report): no exponent, a few digits ---------- */

static const char *const si_prefix[] = {"p", "n", "\xc2\xb5", "m", "", "k",
                                        "M", "G", "T",        "P", "E"};
static const char *const bin_prefix[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
enum { SI_LO = -4, SI_HI = 6, BIN_HI = 6 };

int tr_fmt_power(double x, int binary) {
    double a = fabs(x), base = binary ? 1024 : 1000;
    int p = 0;
    if (!isfinite(a) || a == 0) return 0;
    while (p < (binary ? BIN_HI : SI_HI) && a >= base)
        a /= base, p++;
    while (!binary && p > SI_LO && a < 1)
        a *= base, p--;
    return p;
}

void tr_fmt_scaled(double x, int power, int binary, int decimals, const char *unit, char *buf,
                   size_t n) {
    if (!isfinite(x)) {
        snprintf(buf, n, "-");
        return;
    }
    int lo = binary ? 0 : SI_LO, hi = binary ? BIN_HI : SI_HI;
    power = power < lo ? lo : power > hi ? hi : power;
    const char *pre = binary ? bin_prefix[power] : si_prefix[power - SI_LO];
    double v = x / pow(binary ? 1024 : 1000, power);
    if (v == 0) v = 0; /* no "-0" */
    snprintf(buf, n, "%.*f%s%s%s", decimals < 0 ? 0 : decimals, v, *unit ? " " : "", pre, unit);
}

/* 3 significant digits, the prefix bumped when rounding reaches 1000 (999.7 k is 1.00 M). */
void tr_fmt_si(double x, const char *unit, char *buf, size_t n) {
    if (!isfinite(x)) {
        snprintf(buf, n, "-");
        return;
    }
    int p = tr_fmt_power(x, 0);
    double v = fabs(x) / pow(1000, p);
    if (v >= 999.5 && p < SI_HI) v = fabs(x) / pow(1000, ++p);
    tr_fmt_scaled(x, p, 0, v == 0 || v >= 99.95 ? 0 : v >= 9.995 ? 1 : 2, unit, buf, n);
}

void tr_fmt_num(double x, char *buf, size_t n) {
    double a = fabs(x);
    if (!isfinite(x) || a >= 1e6 || (a < 1e-6 && a != 0)) {
        tr_fmt_si(x, "", buf, n);
        return;
    }
    int d = x == floor(x) ? 0 : 3 - (int)floor(log10(a));
    snprintf(buf, n, "%.*f", d < 0 ? 0 : d, x == 0 ? 0 : x);
    if (strchr(buf, '.')) { /* 5.380 is 5.38 */
        char *e = buf + strlen(buf) - 1;
        while (*e == '0')
            *e-- = 0;
        if (*e == '.') *e = 0;
    }
}

void tr_fmt_hms(double s, char *buf, size_t n) {
    if (!isfinite(s) || fabs(s) >= 3.6e12) { /* past a billion hours: not a clock */
        tr_fmt_si(s, "s", buf, n);
        return;
    }
    long long t = llround(fabs(s));
    snprintf(buf, n, "%s%lld:%02lld:%02lld", s < 0 && t ? "-" : "", t / 3600, t / 60 % 60, t % 60);
}

void tr_fmt_seconds(double s, char *buf, size_t n) {
    if (isfinite(s) && fabs(s) >= 59.5)
        tr_fmt_hms(s, buf, n);
    else
        tr_fmt_si(s, "s", buf, n);
}

void tr_fmt_percent(double share, char *buf, size_t n) {
    double p = 100 * share;
    if (!isfinite(p))
        snprintf(buf, n, "-");
    else if (p != 0 && fabs(p) < 0.005)
        snprintf(buf, n, "%s0.01%%", p < 0 ? ">-" : "<");
    else
        snprintf(buf, n, "%.*f%%", fabs(p) >= 99.95 ? 0 : fabs(p) >= 9.995 ? 1 : 2, p == 0 ? 0 : p);
}

void tr_fmt_real(double v, char *buf, size_t n) {
    char t[40];
    if (!isfinite(v)) {
        snprintf(buf, n, "%s", isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
        return;
    }
    float f = fabs(v) <= FLT_MAX ? (float)v : 0;
    snprintf(t, sizeof(t), "%.9g", (double)f);
    int from_float = fabs(v) <= FLT_MAX && strtod(t, NULL) == v; /* a float written as %.9g */
    int p = 1;
    for (; p <= 17; p++) {
        snprintf(t, sizeof(t), "%.*g", p, v);
        if (from_float ? (float)strtod(t, NULL) == f : strtod(t, NULL) == v) break;
    }
    double a = fabs(v);
    if (strchr(t, 'e') && a >= 1e-6 && a < 1e17) { /* the same digits without an exponent */
        int d = p - 1 - (int)floor(log10(a));
        snprintf(t, sizeof(t), "%.*f", d < 0 ? 0 : d, v);
    }
    snprintf(buf, n, "%s", t);
}

int tr_load_recipe_msg(tr_recipe *r, const tr_options *o, const char *cmd, char *err,
                       size_t errlen) {
    if (tr_recipe_load(r, o->recipe, o->sets, o->n_sets, err, errlen)) return -1;
    if (o->steps) r->train.steps = o->steps;
    if (o->eval_every >= 0) r->train.eval_every = o->eval_every;
    if (o->sample_tokens >= 0) r->train.sample_tokens = o->sample_tokens;
    if (o->out) snprintf(r->train.out, sizeof(r->train.out), "%s", o->out);
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

tr_layout_flags tr_options_layout(const tr_options *o, int backend_pad) {
    tr_layout_flags f = o->layout;
    if (!f.pad_vocab) f.pad_vocab = backend_pad; /* TR_PAD_VOCAB wins: the tests' GPU padding */
    return f;
}

int tr_resolve_layout(tr_layout *l, const tr_recipe *r, const tr_options *o, int world,
                      const tr_backend *be, const char *cmd, char *err, size_t errlen) {
    tr_layout_flags f = tr_options_layout(o, be->pad_vocab);
    char why[1024];
    if (!tr_layout_resolve(l, r, &f, world, be->dtype, 0, why, sizeof(why))) return 0;
    size_t n = strlen(r->path);
    if (!strncmp(why, r->path, n) && why[n] == ':')
        snprintf(err, errlen, "%s", why);
    else
        snprintf(err, errlen, "trainer %s: %s", cmd, why);
    return -1;
}

/* The CPU backend's threads where OMP_NUM_THREADS does not set them: the node's cores shared
 * among its processes (tr_node_threads); note: how many, where that is not OpenMP's default. */
static void cpu_threads(char *note, size_t n) {
    int local = 1;
    tr_comm_local_rank(&local);
    tr_node_cores c = tr_node_cores_here(local);
    if (c.given) return;
    tr_backend_cpu_set_threads((int)c.threads);
    if (c.threads < c.allowed)
        snprintf(note, n,
                 ", %ld thread%s a process (%d processes share this node's %ld cores; "
                 "OMP_NUM_THREADS sets it)",
                 c.threads, c.threads == 1 ? "" : "s", c.ranks, c.online);
}

const tr_backend *tr_choose_backend(const tr_options *o, const tr_recipe *r, double *peak,
                                    char *desc, size_t desclen, char *err, size_t errlen) {
    if (tr_backend_env(err, errlen)) return NULL; /* TR_CUDA_ATTENTION, whichever device */
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
        /* collectives on its buffers: NCCL or staged (parallel/comm/comm.h) */
        if (be && tr_comm_device_init(tr_backend_cuda_stream(), err, errlen)) return NULL;
        if (be) {
            char name[128];
            double table = tr_backend_cuda_peak(dtype, name, sizeof(name));
            if (*peak <= 0) *peak = table;
            if (*peak > 0)
                snprintf(desc, desclen, "cuda (%s), %s storage, peak %.0f TFLOP/s (%s)", name,
                         dtype == TR_DTYPE_BF16 ? "bf16" : "fp32", *peak / 1e12,
                         given ? "given" : "device table");
            else /* MFU is then not reported (a 0 peak would print it as inf) */
                snprintf(desc, desclen,
                         "cuda (%s), %s storage, peak unknown for this device: no "
                         "MFU (set train.peak_tflops or --peak-gflops)",
                         name, dtype == TR_DTYPE_BF16 ? "bf16" : "fp32");
            tr_backend_set_sizing(be); /* the plan's exact memory asks it (cuDNN's workspace) */
            return be;
        }
        if (!strcmp(dev, "cuda")) {
            snprintf(err, errlen, "--device cuda: %s", why);
            return NULL;
        }
    }
    char threads[160] = "";
    cpu_threads(threads, sizeof threads); /* before the sgemm that measures the peak */
    if (*peak <= 0) *peak = tr_measure_peak_gflops() * 1e9;
    /* a machine without a GPU is no error to explain; a GPU that fails is */
    int none = !strncmp(why, TR_NO_GPU_FOUND, strlen(TR_NO_GPU_FOUND));
    snprintf(desc, desclen, "cpu, fp32, peak %.1f GFLOP/s (%s)%s%s%s%s", *peak / 1e9,
             given ? "given" : "measured sgemm", threads,
             o->precision && dtype == TR_DTYPE_BF16 ? "; --precision bf16 applies to CUDA only"
                                                    : "",
             none     ? "; " TR_NO_GPU_FOUND ": running on the CPU"
             : why[0] ? "; no GPU: "
                      : "",
             none ? "" : why);
    return tr_backend_cpu();
}

char *tr_shell_join(int argc, char **argv) {
    size_t len = 1;
    for (int i = 0; i < argc; i++)
        len += 4 * strlen(argv[i]) + 3; /* every ' becomes '\'' at worst */
    char *out = malloc(len), *p = out;
    if (!out) return NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int plain = *a != 0;
        for (const char *c = a; *c && plain; c++)
            plain = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                    (*c >= '0' && *c <= '9') || strchr("_./:=,+-@%", *c);
        if (i) *p++ = ' ';
        if (!plain) *p++ = '\'';
        for (const char *c = a; *c; c++) {
            if (!plain && *c == '\'') {
                memcpy(p, "'\\''", 4);
                p += 4;
            } else {
                *p++ = *c;
            }
        }
        if (!plain) *p++ = '\'';
    }
    *p = 0;
    return out;
}

/* Scans back from the end in blocks for the last '\n': the file's length up to and with it. */
static off_t last_line_end(int fd, off_t size) {
    char buf[4096];
    for (off_t end = size; end > 0;) {
        off_t from = end > (off_t)sizeof(buf) ? end - (off_t)sizeof(buf) : 0;
        ssize_t k = pread(fd, buf, (size_t)(end - from), from);
        if (k != end - from) return -1;
        for (ssize_t i = k - 1; i >= 0; i--)
            if (buf[i] == '\n') return from + i + 1;
        end = from;
    }
    return 0;
}

int tr_jsonl_repair(const char *path, FILE *log, char *err, size_t errlen) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return 0;
    off_t size = fd < 0 ? -1 : lseek(fd, 0, SEEK_END), keep = size;
    char last = '\n';
    if (size > 0 && pread(fd, &last, 1, size - 1) != 1) size = -1;
    if (size > 0 && last != '\n') {
        keep = last_line_end(fd, size);
        if (keep >= 0 && ftruncate(fd, keep)) keep = -1;
    }
    int e = errno;
    if (fd >= 0) close(fd);
    if (size < 0 || keep < 0) {
        snprintf(err, errlen, "cannot repair '%s' before appending to it: %s", path, strerror(e));
        return -1;
    }
    if (keep < size && log)
        fprintf(log, "%s: dropped its last %lld bytes, a record cut short (a write was killed)\n",
                path, (long long)(size - keep));
    return 0;
}

const char *tr_signal_name(int sig) {
    switch (sig) {
    case SIGKILL:
        return "SIGKILL";
    case SIGTERM:
        return "SIGTERM";
    case SIGINT:
        return "SIGINT";
    case SIGHUP:
        return "SIGHUP";
    case SIGUSR1:
        return "SIGUSR1";
    case SIGSEGV:
        return "SIGSEGV";
    case SIGABRT:
        return "SIGABRT";
    case SIGBUS:
        return "SIGBUS";
    case SIGFPE:
        return "SIGFPE";
    case SIGILL:
        return "SIGILL";
    case SIGPIPE:
        return "SIGPIPE";
    default:
        return "a signal";
    }
}

int tr_number_arg(const char *cmd, const char *flag, const char *s, double lo, double hi,
                  double *out) {
    char *end;
    double v = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || !(v >= lo && v <= hi)) {
        fprintf(stderr, "trainer %s: %s needs a number in [%g, %g], got '%s'\n", cmd, flag, lo,
                hi, s);
        return -1;
    }
    *out = v;
    return 0;
}
