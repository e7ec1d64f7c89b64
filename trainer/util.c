/* Helpers shared by the subcommands: loading a recipe with the command-line overrides,
 * resolving the layout, the machine's measured peak, folders and number formatting. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "parallel/topology.h"
#include "trainer/trainer.h"

double tr_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void tr_hostname(char *buf, size_t n) {
    const char *fake = getenv("TR_HOSTNAME");
    if (fake && *fake)
        snprintf(buf, n, "%s", fake);
    else if (gethostname(buf, n - 1))
        snprintf(buf, n, "?");
    buf[n - 1] = 0;
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
    return tr_topology_sgemm_rate(1024, 2, 6) / 1e9;
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

int tr_resolve_layout(tr_layout *l, const tr_recipe *r, const tr_options *o, int world,
                      const tr_backend *be, const char *cmd, char *err, size_t errlen) {
    tr_layout_flags f = {.dp = o->dp,
                         .tp = o->tp,
                         .pp = o->pp,
                         .zero = o->zero,
                         .schedule = o->schedule,
                         .microbatches = o->microbatches,
                         .virtual_stages = o->virtual_stages,
                         .sequence_parallel = o->sequence_parallel,
                         .micro_batch = o->micro_batch,
                         .pad_vocab = o->pad_vocab ? o->pad_vocab : be->pad_vocab};
    char why[1024];
    if (!tr_layout_resolve(l, r, &f, world, be->dtype, 0, why, sizeof(why))) return 0;
    size_t n = strlen(r->path);
    if (!strncmp(why, r->path, n) && why[n] == ':')
        snprintf(err, errlen, "%s", why);
    else
        snprintf(err, errlen, "trainer %s: %s", cmd, why);
    return -1;
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
        /* collectives on its buffers: NCCL or staged (parallel/comm.h) */
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
             o->precision && dtype == TR_DTYPE_BF16 ? "; --precision bf16 applies to CUDA only"
                                                    : "",
             why[0] ? "; no GPU: " : "", why);
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
