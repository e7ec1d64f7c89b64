/* OUT/provenance.json (the fields: trainer/report/provenance.h), written by rank 0 of `trainer run`
 * at setup, after every rank has given its host name. Written to a temporary file and renamed
 * over, so a reader never sees half of one.
 * On --resume the file describes the resumed attempt ("attempt": N, "resume": the step). When
 * the previous attempt's record differs from the new one in anything but time, resume and
 * attempt (another build, layout, host, command...), it is kept as provenance.K.json, K its
 * attempt number: every distinct setup a run went through stays on disk, and identical
 * attempts leave no copies (the lead's attempts.jsonl says when each one ran). */
#include <cblas.h>
#include <errno.h>
#include <lua.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <yaml.h>

#include "parallel/comm/base.h"
#include "parallel/schedule.h"
#include "trainer/report/provenance.h"
#include "trainer/run/run.h"

#define HOST_LEN TR_HOST_LEN

/* ---- small writers ------------------------------------------------------------------------ */

/* "key": "value", or "key": null when v is NULL or empty */
static void kv(FILE *f, const char *key, const char *v, int last) {
    fprintf(f, "\"%s\": ", key);
    if (v && *v)
        tr_json_write_string(f, v);
    else
        fputs("null", f);
    fputs(last ? "" : ", ", f);
}

/* a data path as the written recipe names it (absolute), or null when empty */
static void kv_path(FILE *f, const char *key, const char *path, int last) {
    char abs[TR_PATH_MAX];
    if (path[0]) tr_recipe_abs_path(path, abs, sizeof(abs));
    kv(f, key, path[0] ? abs : NULL, last);
}

static void kv_int(FILE *f, const char *key, long v, int last) {
    fprintf(f, "\"%s\": %ld%s", key, v, last ? "" : ", ");
}

/* FNV-1a 64 of a file's bytes as 16 hex digits into hex; -1 when it cannot be read. */
static int hash_file(const char *path, char hex[17]) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    unsigned long long h = TR_FNV1A_START;
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        h = tr_fnv1a(h, buf, n);
    int bad = ferror(f);
    fclose(f);
    snprintf(hex, 17, "%016llx", h);
    return bad ? -1 : 0;
}

/* ---- the sections ------------------------------------------------------------------------- */

static void write_trainer_build(FILE *f) {
    char bin[17];
    fprintf(f, "  \"trainer\": {");
    kv(f, "version", tr_build.version, 0);
    kv(f, "commit", tr_build.commit, 0);
    kv(f, "built", tr_build.built, 0);
    kv(f, "binary", hash_file("/proc/self/exe", bin) ? "unknown" : bin, 1);
    fprintf(f, "},\n  \"build\": {");
    kv(f, "type", tr_build.type, 0);
    kv(f, "compiler", tr_build.compiler, 0);
    kv(f, "flags", tr_build.flags, 0);
    kv(f, "cuda", tr_build.cuda, 0);
#ifdef TR_ON_CUDA_EMU
    kv(f, "emulator", "ON", 0);
#else
    kv(f, "emulator", "OFF", 0);
#endif
    kv(f, "sanitize", tr_build.sanitize, 0);
    kv(f, "native", tr_build.native, 1);
    fprintf(f, "},\n");
}

/* The run's device string without its peak rate (measured on the CPU: it varies from run to
 * run), and on the CPU the processor's model name (/proc/cpuinfo), which BLAS picks its
 * kernels by: "cpu, fp32 on Intel(R) Xeon(R) ...", "cuda (NVIDIA H200), bf16 storage". */
static void describe_device(const run_ctx *x, char *out, size_t len) {
    snprintf(out, len, "%s", x->device);
    char *peak = strstr(out, ", peak");
    if (peak) *peak = 0;
    if (x->be->device_memory) return;
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];
    while (f && fgets(line, sizeof(line), f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !colon) continue;
        colon[1 + strcspn(colon + 1, "\n")] = 0;
        size_t at = strlen(out);
        snprintf(out + at, len - at, " on%s", colon + 1);
        break;
    }
    if (f) fclose(f);
}

static void write_libraries(FILE *f, const run_ctx *x) {
    tr_cuda_versions cv;
    int cuda = !tr_backend_cuda_versions(&cv);
    char mpi[512], nccl[32];
    tr_comm_library_version(mpi, sizeof(mpi));
    tr_comm_nccl_version(nccl, sizeof(nccl));
    kv(f, "backend", x->be->name, 0);
    char dev[sizeof(x->device) + 160];
    describe_device(x, dev, sizeof(dev));
    kv(f, "device", dev, 0);
    kv(f, "driver", x->be->device_memory && cuda ? cv.driver : NULL, 1);
    fprintf(f, ",\n  \"libraries\": {");
#ifdef OPENBLAS_VERSION
    kv(f, "blas", openblas_get_config(), 0);
#else
    kv(f, "blas", "cblas", 0);
#endif
    kv(f, "blas_threads", tr_backend_cpu_blas_threads(NULL, 0), 0);
    kv(f, "mpi", mpi, 0);
    kv(f, "lua", LUA_RELEASE, 0);
    kv(f, "yaml", yaml_get_version_string(), 0);
    kv(f, "cuda", cuda ? cv.runtime : NULL, 0);
    kv(f, "cublaslt", cuda ? cv.cublaslt : NULL, 0);
    kv(f, "cudnn", NULL, 0); /* the CUDA backend does not use cuDNN */
    kv(f, "nccl", nccl, 1);
    fprintf(f, "},\n");
}

static void write_layout(FILE *f, const run_ctx *x) {
    const tr_layout *l = &x->lay;
    fprintf(f, "  \"layout\": {");
    kv_int(f, "dp", l->dp, 0);
    kv_int(f, "tp", l->tp, 0);
    kv_int(f, "pp", l->pp, 0);
    kv_int(f, "zero", l->zero, 0);
    kv_int(f, "sequence_parallel", l->sequence_parallel, 0);
    kv_int(f, "micro_batch", l->micro_batch, 0);
    kv_int(f, "accumulation", l->accum, 0);
    if (l->shares_uneven) { /* micro-batches of each dp replica */
        fputs("\"dp_shares\": [", f);
        for (int d = 0; d < l->dp; d++) fprintf(f, "%s%d", d ? ", " : "", l->dp_shares[d]);
        fputs("], ", f);
    }
    kv_int(f, "bucket_kb", l->bucket_kb, 0);
    kv_int(f, "pad_vocab", l->pad_vocab, 0);
    char rec[96]; /* per pipeline rank where the levels differ: "selective/none" */
    tr_layout_recompute_name(l, rec, sizeof rec);
    kv(f, "recompute", rec, 0);
    kv(f, "schedule", l->pp > 1 ? tr_pp_kind_name((tr_pp_kind)l->schedule) : NULL, 0);
    kv_int(f, "virtual_stages", l->virtual_stages, 0);
    fprintf(f, "\"stages\": ");
    if (l->pp > 1) { /* the block each chunk starts at */
        fputc('[', f);
        for (int c = 0; c < l->pp * l->virtual_stages; c++)
            fprintf(f, "%s%d", c ? ", " : "", l->chunk_start[c]);
        fputc(']', f);
    } else {
        fputs("null", f);
    }
    fprintf(f, "},\n");
}

/* Private gradients: what is masked and what is not (README "Private gradients"). */
static void write_private(FILE *f, const run_ctx *x) {
    if (!x->lay.private_gradients) return;
    fprintf(f, "  \"private_gradients\": {\"organisations\": %d, \"by\": \"%s\", \"masked\": "
               "\"each rank's data-parallel gradient sums (X25519, ChaCha20, 32-bit fixed "
               "point)\", \"in_clear\": [\"each bucket's scale\", \"the summed gradient\", "
               "\"the parameters\", \"tensor and pipeline traffic, inside an organisation\"], "
               "\"out_of_scope\": \"organisations that collude: all of a rank's peers in other "
               "organisations together can remove its masks, and all but one can subtract "
               "their own gradients from the sum; a rank that sends a false gradient\"},\n",
            x->private_orgs, x->o.orgs ? "--orgs" : "host");
}

/* ranks, hosts (every rank's, gathered: distinct, in rank order), command, cwd */
static void write_job(FILE *f, const run_ctx *x, const char *hosts, int argc, char **argv) {
    fprintf(f, "  \"ranks\": %d, \"hosts\": [", x->nranks);
    for (int r = 0, shown = 0; r < x->nranks; r++) {
        const char *h = hosts + (size_t)r * HOST_LEN;
        int seen = 0;
        for (int q = 0; q < r && !seen; q++)
            seen = !strcmp(h, hosts + (size_t)q * HOST_LEN);
        if (seen) continue;
        fputs(shown++ ? ", " : "", f);
        tr_json_write_string(f, h);
    }
    char *cmd = tr_shell_join(argc, argv), cwd[TR_PATH_MAX];
    fprintf(f, "],\n  ");
    kv(f, "command", cmd, 0);
    kv(f, "cwd", getcwd(cwd, sizeof(cwd)) ? cwd : NULL, 1);
    free(cmd);
    fprintf(f, ",\n");
}

/* seeds and data */
static void write_inputs(FILE *f, const run_ctx *x) {
    const tr_data_desc *d = &x->r.data;
    unsigned long long seed = x->r.train.seed;
    if (seed <= (1ULL << 53)) /* exact in a JSON reader's double; else as a string */
        fprintf(f, "  \"seeds\": {\"train\": %llu},\n", seed);
    else
        fprintf(f, "  \"seeds\": {\"train\": \"%llu\"},\n", seed);
    fprintf(f, "  \"data\": {\"fingerprint\": \"%016llx\", ",
            (unsigned long long)tr_loader_fingerprint(x->loader));
    if (d->text[0]) {
        kv_path(f, "train", d->text, 0);
        kv_path(f, "val", d->text, 0);
        fprintf(f, "\"val_fraction\": ");
        tr_json_write_num(f, (double)d->val_fraction, 9);
    } else if (d->n_mix > 0) {
        fprintf(f, "\"train\": [");
        for (int i = 0; i < d->n_mix; i++) {
            fprintf(f, "%s{", i ? ", " : "");
            kv_path(f, "shards", d->mix[i].shards, 0);
            fprintf(f, "\"weight\": ");
            tr_json_write_num(f, (double)d->mix[i].weight, 9);
            fputs("}", f);
        }
        fprintf(f, "], ");
        kv_path(f, "val", d->val_shards, 1);
    } else {
        kv_path(f, "train", d->shards, 0);
        kv_path(f, "val", d->val_shards, 1);
    }
    fprintf(f, "},\n");
}

/* recipe: OUT/recipe.lua's bytes, and the recipe without its output folder, its layout (the
 * fields tr_layout_to_recipe writes back, as an unresolved recipe has them), and the header
 * comment naming the file it came from and its knobs (their values are applied) */
static void write_recipe(FILE *f, const run_ctx *x) {
    char path[TR_PATH_MAX + 32], file[17], training[17];
    snprintf(path, sizeof(path), "%s/recipe.lua", x->r.train.out);
    if (hash_file(path, file)) snprintf(file, sizeof(file), "unknown");
    tr_recipe c = x->r; /* a shallow copy: only written out */
    c.path[0] = 0;
    c.n_knobs = 0;
    c.train.out[0] = 0;
    c.train.micro_batch = 0;
    c.train.recompute = -1;
    c.parallel = (tr_parallel_desc){.is_auto = 1,
                                    .dp = -1,
                                    .tp = -1,
                                    .pp = -1,
                                    .zero = -1,
                                    .sequence_parallel = -1,
                                    .schedule = -1};
    size_t len = 0;
    char *text = tr_recipe_text(&c, &len);
    snprintf(training, sizeof(training), "%016llx", tr_fnv1a(TR_FNV1A_START, text, text ? len : 0));
    free(text);
    fprintf(f, "  \"recipe\": {\"file\": \"%s\", \"training\": \"%s\"},\n", file, training);
}

/* time, resume, attempt: the end of the document */
static void write_attempt(FILE *f, const run_ctx *x, int attempt) {
    char when[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    fprintf(f, "  \"time\": \"%s\", \"resume\": ", when);
    if (x->o.resume)
        fprintf(f, "%d", x->start_step);
    else
        fputs("null", f);
    fprintf(f, ", \"attempt\": %d\n", attempt);
}

/* ---- the file ----------------------------------------------------------------------------- */

/* --resume: the attempt number after the previous record's, and that record kept as
 * provenance.K.json when it differs from `now` in more than the fields every attempt changes. */
static int previous_attempt(const char *dir, const char *path, const char *now, size_t len) {
    tr_json old, cur;
    if (tr_json_parse_file(&old, path, NULL, 0))
        return 2; /* written before provenance existed: say 2 */
    const tr_json *a = tr_json_get(&old, "attempt");
    int k = a && a->type == TR_JSON_NUM && a->num >= 1 ? (int)a->num : 1;
    char err[160];
    if (!tr_json_parse(&cur, now, len, err, sizeof(err))) {
        tr_prov_diff d[TR_PROV_MAX_DIFFS];
        int n = tr_provenance_diff(&old, &cur, d, TR_PROV_MAX_DIFFS), kept = 0;
        for (int i = 0; i < n && i < TR_PROV_MAX_DIFFS; i++)
            kept |= strcmp(d[i].field, "time") && strcmp(d[i].field, "resume") &&
                    strcmp(d[i].field, "attempt");
        char keep[TR_PATH_MAX + 48];
        snprintf(keep, sizeof(keep), "%s/provenance.%d.json", dir, k);
        if (kept && rename(path, keep))
            fprintf(stderr, "trainer: cannot keep '%s' as '%s': %s\n", path, keep, strerror(errno));
        tr_json_free(&cur);
    }
    tr_json_free(&old);
    return k + 1;
}

/* The document (attempt number `attempt`) into a string *text of *len bytes. */
static int compose(const run_ctx *x, const char *hosts, int argc, char **argv, int attempt,
                   char **text, size_t *len) {
    FILE *f = open_memstream(text, len);
    if (!f) return -1;
    fprintf(f, "{\n");
    write_trainer_build(f);
    fputs("  ", f);
    write_libraries(f, x);
    write_layout(f, x);
    write_private(f, x);
    write_job(f, x, hosts, argc, argv);
    write_inputs(f, x);
    write_recipe(f, x);
    write_attempt(f, x, attempt);
    fprintf(f, "}\n");
    return fclose(f) ? -1 : 0;
}

static int write_file(const run_ctx *x, const char *hosts, int argc, char **argv) {
    const char *dir = x->r.train.out;
    char path[TR_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/provenance.json", dir);
    char *text = NULL;
    size_t len = 0;
    if (compose(x, hosts, argc, argv, 1, &text, &len)) return run_cannot_write(path, ENOMEM);
    if (x->o.resume) {
        int attempt = previous_attempt(dir, path, text, len);
        free(text);
        text = NULL;
        if (compose(x, hosts, argc, argv, attempt, &text, &len))
            return run_cannot_write(path, ENOMEM);
    }
    tr_atomic a;
    char err[TR_PATH_MAX + 128];
    int rc = tr_atomic_open(&a, path, err, sizeof err);
    if (!rc) {
        fwrite(text, 1, len, a.f);
        rc = tr_atomic_commit(&a, err, sizeof err);
    }
    free(text);
    if (rc) fprintf(stderr, "trainer run: %s\n", err);
    return rc;
}

int run_provenance(run_ctx *x, int argc, char **argv) {
    return x->rank == 0 ? write_file(x, x->hosts, argc, argv) : 0;
}
