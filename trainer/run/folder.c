/* A run folder belongs to one run: rank 0 of `trainer run` holds OUT/.lock for the run's whole
 * life, a folder that holds an earlier run is refused unless --resume continues it or
 * --overwrite replaces it, and --overwrite removes only the trainer's own files. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainer/run/run.h"

/* What a run writes in OUT that a later command (export, sample, report, --resume) reads; the
 * first three, with checkpoints/, mark a folder as holding a run. */
static const char *const run_files[] = {
    "recipe.lua",         "metrics.jsonl",  "attempts.jsonl",    "ledger.jsonl",
    "sample.txt",         "memory.json",    "provenance.json",   "ranks.json",
    "supervise.hostfile", "report.html",    "metrics.jsonl.tmp", "provenance.json.tmp",
    "trace.json",         "supervise.addr", "plan.json",         "plan.json.tmp"};
#define RUN_MARKERS 3
#define RUN_FILES (int)(sizeof(run_files) / sizeof(run_files[0]))

int run_folder_make(run_ctx *x) {
    const char *out = x->r.train.out;
    char path[TR_PATH_MAX];
    struct stat st;
    x->out_made[0] = 0;
    snprintf(path, sizeof(path), "%s", out);
    for (char *p = path + 1; !x->out_made[0]; p++) {
        if (*p != '/' && *p != 0) continue;
        char c = *p;
        *p = 0;
        if (stat(path, &st) && errno == ENOENT)
            snprintf(x->out_made, sizeof(x->out_made), "%s", path);
        *p = c;
        if (!c) break;
    }
    if (!tr_mkdirs(out, x->err, sizeof(x->err))) return 0;
    snprintf(x->msg, sizeof(x->msg), "trainer run: %s", x->err);
    return -1;
}

void run_folder_unmake(run_ctx *x) {
    if (!x->out_made[0]) return;
    char path[TR_PATH_MAX + 32];
    const char *out = x->r.train.out;
    for (int i = 0; i < RUN_FILES; i++) {
        snprintf(path, sizeof(path), "%s/%s", out, run_files[i]);
        unlink(path);
    }
    snprintf(path, sizeof(path), "%s/checkpoints", out);
    rmdir(path); /* the writer makes it at set-up; no save has run */
    snprintf(path, sizeof(path), "%s/.lock", out);
    unlink(path);
    snprintf(path, sizeof(path), "%s", out);
    for (;;) { /* OUT, then its parents up to the first this run made, while empty */
        size_t n = strlen(path);
        while (n > 1 && path[n - 1] == '/')
            path[--n] = 0;
        if (rmdir(path) || !strcmp(path, x->out_made)) break;
        char *slash = strrchr(path, '/');
        if (!slash || slash == path) break;
        *slash = 0;
    }
    x->out_made[0] = 0;
}

/* The kernel drops a flock with its process, however it ends: a dead run leaves no lock. The
 * file says who holds it, for the next run's message. */
int run_folder_lock(run_ctx *x) {
    char path[TR_PATH_MAX + 16], who[256] = "", host[TR_HOST_LEN];
    snprintf(path, sizeof(path), "%s/.lock", x->r.train.out);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(x->msg, sizeof(x->msg),
                 "trainer run: cannot open '%s': %s (the run folder's "
                 "lock; choose another --out)",
                 path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        int e = errno;
        ssize_t k = pread(fd, who, sizeof(who) - 1, 0);
        who[k > 0 ? k : 0] = 0;
        close(fd);
        long pid = 0;
        char holder[TR_HOST_LEN] = "";
        if (e != EWOULDBLOCK)
            snprintf(x->msg, sizeof(x->msg),
                     "trainer run: cannot lock '%s': %s (choose another "
                     "--out)",
                     path, strerror(e));
        else if (sscanf(who, "%ld %63s", &pid, holder) == 2)
            snprintf(x->msg, sizeof(x->msg),
                     "trainer run: %s is in use by pid %ld on host %s "
                     "(another trainer run); wait for it or choose another --out",
                     x->r.train.out, pid, holder);
        else
            snprintf(x->msg, sizeof(x->msg),
                     "trainer run: %s is in use by another trainer run; "
                     "wait for it or choose another --out",
                     x->r.train.out);
        return -1;
    }
    tr_hostname(host, sizeof(host));
    int n = snprintf(who, sizeof(who), "%ld %s\n", (long)getpid(), host);
    if (ftruncate(fd, 0) || pwrite(fd, who, (size_t)n, 0) != n) { /* only the message needs it */
    }
    x->lock_fd = fd;
    return 0;
}

/* A regular file (a folder when `dir`) at OUT/name: a link to a device (tests point one at
 * /dev/full) is no run's record, and reading one would never end. */
static int has(const char *out, const char *name, int dir) {
    char path[TR_PATH_MAX + 32];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", out, name);
    return !stat(path, &st) && (dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
}

/* The recipe file OUT/recipe.lua was written from (its first line names it). */
static void recipe_source(const char *out, char *buf, size_t len) {
    char path[TR_PATH_MAX + 16], line[TR_PATH_MAX + 128] = "", cwd[TR_PATH_MAX];
    snprintf(path, sizeof(path), "%s/recipe.lua", out);
    snprintf(buf, len, "%s", "?");
    FILE *f = has(out, "recipe.lua", 0) ? fopen(path, "r") : NULL;
    if (!f) return;
    int got = fgets(line, sizeof(line), f) != NULL;
    fclose(f);
    char *a = got ? strstr(line, "from \"") : NULL, *b = a ? strrchr(a + 6, '"') : NULL;
    if (!b) return;
    *b = 0, a += 6;
    size_t cl = getcwd(cwd, sizeof(cwd)) ? strlen(cwd) : 0; /* as the user named it, mostly */
    if (cl && !strncmp(a, cwd, cl) && a[cl] == '/') a += cl + 1;
    snprintf(buf, len, "%s", a);
}

/* The highest step metrics.jsonl has a record of; 0 when none. */
static long metrics_steps(const char *out) {
    char path[TR_PATH_MAX + 16], *line = NULL;
    size_t cap = 0;
    long most = 0, k;
    snprintf(path, sizeof(path), "%s/metrics.jsonl", out);
    FILE *f = has(out, "metrics.jsonl", 0) ? fopen(path, "r") : NULL;
    while (f && getline(&line, &cap, f) > 0)
        if (sscanf(line, "{\"step\": %ld", &k) == 1 && k > most) most = k;
    free(line);
    if (f) fclose(f);
    return most;
}

/* The earlier run OUT holds, in words ("a run of recipes/x.lua (60 steps, checkpoints up to
 * step 60)"); 0 when it holds none. */
static int describe_run(const char *out, char *buf, size_t len) {
    char src[TR_PATH_MAX];
    int found = has(out, "checkpoints", 1);
    for (int i = 0; i < RUN_MARKERS && !found; i++)
        found = has(out, run_files[i], 0);
    if (!found) return 0;
    long *steps, top = -1;
    int n = tr_ckpt_steps(out, &steps);
    for (int i = 0; i < n; i++)
        if (steps[i] > top) top = steps[i];
    free(steps);
    recipe_source(out, src, sizeof(src));
    char ck[64] = "no checkpoint";
    if (top >= 0) snprintf(ck, sizeof(ck), "checkpoints up to step %ld", top);
    snprintf(buf, len, "a run of %s (%ld steps, %s)", src, metrics_steps(out), ck);
    return 1;
}

int run_folder_check(run_ctx *x) {
    char what[TR_PATH_MAX + 128];
    if (x->o.resume || x->o.overwrite || !describe_run(x->r.train.out, what, sizeof(what)))
        return 0;
    if (snprintf(x->msg, sizeof(x->msg),
                 "trainer run: %s holds %s: add --resume to continue "
                 "it or --overwrite to replace it, or choose another --out",
                 x->r.train.out, what) < 0)
        x->msg[0] = 0;
    return -1;
}

int run_folder_clear(run_ctx *x) {
    const char *out = x->r.train.out;
    char path[TR_PATH_MAX + 32];
    int files = 0;
    for (int i = 0; i < RUN_FILES; i++) {
        snprintf(path, sizeof(path), "%s/%s", out, run_files[i]);
        if (!unlink(path))
            files++;
        else if (errno != ENOENT)
            return run_cannot_write(path, errno);
    }
    int ck = tr_ckpt_remove_all(out, x->err, sizeof(x->err));
    if (ck < 0) {
        fprintf(stderr, "trainer run: --overwrite: %s\n", x->err);
        return -1;
    }
    if (files || ck)
        printf("--overwrite: removed the earlier run in %s/ (%d file(s), %d checkpoint(s); "
               "other files stay)\n",
               out, files, ck);
    return 0;
}
