/* Running a sweep's points (trainer/ops/sweep.h): each a `trainer run` child of this process
 * (trainer/ops/spawn.h), here one after another or as the tasks of a Slurm job array, and how
 * each ended, in EXP/status/NAME.json. A signal to the sweep reaches the running point, which
 * saves a checkpoint and stops; the point stays unfinished and the next sweep resumes it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/json.h"
#include "trainer/ops/spawn.h"
#include "trainer/ops/sweep.h"

#define SW_MAX_PREFIX 32
/* EXP/SUB/NAME.EXT */
#define SW_PATH_LEN (TR_PATH_MAX + SW_NAME_LEN + 32)

/* ---- records -------------------------------------------------------------------------------- */

static void path_of(const sw_spec *s, int k, const char *sub, const char *ext, char *buf,
                    size_t n) {
    char name[SW_NAME_LEN];
    sw_point_name(s, k, name, sizeof name);
    if (snprintf(buf, n, "%s/%s/%s%s", s->exp, sub, name, ext) >= (int)n) buf[0] = 0;
}

sw_state sw_point_state(const sw_spec *s, int k, char *why, size_t n, int *trained) {
    char path[SW_PATH_LEN];
    path_of(s, k, "status", ".json", path, sizeof path);
    if (why && n) why[0] = 0;
    if (trained) *trained = 0;
    tr_json j;
    if (tr_json_parse_file(&j, path, NULL, 0))
        return SW_TODO; /* none yet; written atomically: unreadable means not ours */
    const tr_json *st = tr_json_get(&j, "state"), *w = tr_json_get(&j, "why");
    sw_state r = SW_TODO;
    if (st && st->type == TR_JSON_STR) r = !strcmp(st->str, "done") ? SW_DONE
                                           : !strcmp(st->str, "failed") ? SW_FAILED
                                                                        : SW_TODO;
    if (why && w && w->type == TR_JSON_STR) snprintf(why, n, "%s", w->str);
    const tr_json *t = tr_json_get(&j, "trained");
    if (trained) *trained = r == SW_DONE || (t && t->type == TR_JSON_BOOL && t->num != 0);
    tr_json_free(&j);
    return r;
}

static int write_status(const sw_spec *s, int k, sw_state st, int trained, const char *why,
                        double sec) {
    char path[SW_PATH_LEN], err[TR_PATH_MAX + 128], name[SW_NAME_LEN];
    path_of(s, k, "status", ".json", path, sizeof path);
    sw_point_name(s, k, name, sizeof name);
    tr_atomic a;
    if (tr_atomic_open(&a, path, err, sizeof err)) goto bad;
    fputs("{\"point\": ", a.f);
    tr_json_write_string(a.f, name);
    fprintf(a.f, ", \"index\": %d, \"state\": \"%s\", \"why\": ", k,
            st == SW_DONE ? "done" : "failed");
    tr_json_write_string(a.f, why);
    fprintf(a.f, ", \"trained\": %s, \"seconds\": ", trained ? "true" : "false");
    tr_json_write_num(a.f, sec, 4);
    fputs("}\n", a.f);
    if (!tr_atomic_commit(&a, err, sizeof err)) return 0;
bad:
    fprintf(stderr, "trainer sweep: %s\n", err);
    return -1;
}

/* A line of dashes: the rule around a launcher's paragraph (Open MPI frames its reports so). */
static int is_rule(const char *l) {
    if (strlen(l) < 8) return 0;
    for (; *l; l++)
        if (*l != '-' && *l != '=') return 0;
    return 1;
}

/* Why a point failed, in its run's own words: the last line of its log that is not empty and
 * not inside a launcher's framed paragraph ("mpirun detected that one or more processes
 * exited ..."); else the last line there is. */
static void last_line(const char *log, char *buf, size_t n) {
    buf[0] = 0;
    FILE *f = fopen(log, "rb");
    if (!f) return;
    char line[1024], any[1024] = "";
    int framed = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (is_rule(line)) {
            framed = !framed;
            continue;
        }
        if (!line[0]) continue;
        snprintf(any, sizeof any, "%s", line);
        if (!framed) snprintf(buf, n, "%s", line);
    }
    if (!buf[0]) snprintf(buf, n, "%s", any);
    fclose(f);
}

/* ---- one point ------------------------------------------------------------------------------ */

/* The launcher's words (split at spaces) into argv; their count. */
static int split_prefix(const char *prefix, char *store, size_t cap, char **argv) {
    int n = 0;
    if (!prefix || !strcmp(prefix, "local") || !strcmp(prefix, "slurm")) return 0;
    snprintf(store, cap, "%s", prefix);
    for (char *save = NULL, *w = strtok_r(store, " \t", &save); w && n < SW_MAX_PREFIX;
         w = strtok_r(NULL, " \t", &save))
        argv[n++] = w;
    return n;
}

int sw_self_path(sw_spec *s) {
    ssize_t l = readlink("/proc/self/exe", s->self, sizeof s->self - 1);
    if (l <= 0 || (size_t)l >= sizeof s->self - 1) {
        fprintf(stderr, "trainer sweep: cannot find this binary (/proc/self/exe): %s\n",
                l < 0 ? strerror(errno) : "path too long");
        return -1;
    }
    s->self[l] = 0;
    return 0;
}

/* The point's training run (through the launcher prefix): its wait status, or -1; resumed
 * when its folder holds an earlier attempt. */
static int train_point(const sw_spec *s, int k, const char *prefix, const char *log) {
    char name[SW_NAME_LEN], dir[SW_PATH_LEN], pstore[512], store[4096];
    sw_point_name(s, k, name, sizeof name);
    path_of(s, k, "points", "/attempts.jsonl", dir, sizeof dir);
    int resume = access(dir, F_OK) == 0; /* an earlier attempt: continue it */
    char *argv[SW_MAX_PREFIX + SW_MAX_ARGS + 3 * SW_MAX_AXES + 8];
    int np = split_prefix(prefix, pstore, sizeof pstore, argv);
    sw_point_argv(s, k, s->self, resume, argv + np, store);
    printf("sweep: point %d/%d %s: %s (log: %s)\n", k + 1, s->n_points, name,
           resume ? "resuming" : "running", log);
    fflush(stdout);
    return tr_spawn(argv, NULL, log, NULL, NULL, "trainer sweep");
}

/* `trainer eval POINT --task ... --json` into POINT/eval.json (renamed there when it
 * succeeded): its wait status, or -1. */
static int eval_point(const sw_spec *s, int k, const char *log) {
    char run[SW_PATH_LEN], out[SW_PATH_LEN + 16], tmp[SW_PATH_LEN + 32];
    path_of(s, k, "points", "", run, sizeof run);
    snprintf(out, sizeof out, "%s/eval.json", run);
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", out, (long)getpid());
    char *argv[2 * 8 + 8];
    int c = 0;
    argv[c++] = (char *)s->self, argv[c++] = "eval", argv[c++] = run;
    for (int i = 0; i < s->n_eval; i++) argv[c++] = "--task", argv[c++] = s->eval_tasks[i];
    argv[c++] = "--json", argv[c] = NULL;
    int status = tr_spawn(argv, tmp, log, NULL, NULL, "trainer sweep");
    if (status == 0 && rename(tmp, out)) status = -1;
    if (status != 0) unlink(tmp);
    return status;
}

/* Why a step of the point failed: its wait status and the last line of the log. */
static void failure(int status, const char *log, const char *what, char *why, size_t n) {
    char st[64], last[1024];
    if (status < 0) snprintf(st, sizeof st, "not started");
    else tr_spawn_describe(status, st, sizeof st);
    last_line(log, last, sizeof last);
    snprintf(why, n, "%s%s%s%s", what, st, last[0] ? ": " : "", last);
}

static int stopped(const sw_spec *s, const char *name) {
    int sig = tr_spawn_signal();
    if (!sig) return 0;
    printf("sweep: stopped by %s during point %s (passed on to it: a run saves a checkpoint "
           "and stops); `trainer sweep %s` continues\n",
           tr_signal_name(sig), name, s->exp);
    return 128 + sig;
}

int sw_run_point(const sw_spec *s, int k, const char *prefix) {
    char name[SW_NAME_LEN], log[SW_PATH_LEN], why[1200];
    sw_point_name(s, k, name, sizeof name);
    int trained = 0;
    if (sw_point_state(s, k, NULL, 0, &trained) == SW_DONE) {
        printf("sweep: point %d/%d %s: done earlier\n", k + 1, s->n_points, name);
        return 0;
    }
    path_of(s, k, "logs", ".log", log, sizeof log);
    double t0 = tr_now();
    if (!trained) {
        int status = train_point(s, k, prefix, log), sig = stopped(s, name);
        if (sig) return sig;
        if (status != 0) {
            failure(status, log, "", why, sizeof why);
            printf("sweep: point %s: failed (%s)\n", name, why);
            return write_status(s, k, SW_FAILED, 0, why, tr_now() - t0) ? -1 : 1;
        }
    }
    if (s->n_eval) {
        printf("sweep: point %s: evaluating on %d task%s\n", name, s->n_eval,
               s->n_eval == 1 ? "" : "s");
        fflush(stdout);
        int status = eval_point(s, k, log), sig = stopped(s, name);
        if (sig) return sig;
        if (status != 0) {
            failure(status, log, "eval: ", why, sizeof why);
            printf("sweep: point %s: failed (%s)\n", name, why);
            return write_status(s, k, SW_FAILED, 1, why, tr_now() - t0) ? -1 : 1;
        }
    }
    printf("sweep: point %s: done in %.1f s\n", name, tr_now() - t0);
    return write_status(s, k, SW_DONE, 1, "", tr_now() - t0) ? -1 : 0;
}

/* ---- all of them ---------------------------------------------------------------------------- */

int sw_summary(const sw_spec *s, FILE *f) {
    int n[3] = {0, 0, 0};
    char why[1200], name[SW_NAME_LEN];
    static const char *const word[3] = {"unfinished", "done", "FAILED"};
    for (int k = 0; k < s->n_points; k++) {
        sw_state st = sw_point_state(s, k, why, sizeof why, NULL);
        n[st]++;
        sw_point_name(s, k, name, sizeof name);
        fprintf(f, "  %4d  %-10s  %s%s%s\n", k, word[st], name, why[0] ? ": " : "", why);
    }
    fprintf(f, "sweep %s: %d point%s: %d done, %d failed, %d unfinished\n", s->exp, s->n_points,
            s->n_points == 1 ? "" : "s", n[SW_DONE], n[SW_FAILED], n[SW_TODO]);
    return n[SW_DONE] == s->n_points ? 0 : -1;
}

int sw_run_local(const sw_spec *s) {
    tr_spawn_handlers();
    for (int k = 0; k < s->n_points; k++) {
        int rc = sw_run_point(s, k, s->launcher);
        if (rc < 0) return 2;
        if (rc >= 128) return rc;
    }
    return sw_summary(s, stdout) ? 1 : 0;
}

/* ---- Slurm ---------------------------------------------------------------------------------- */

static void sh_quote(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) *s == '\'' ? fputs("'\\''", f) : fputc(*s, f);
    fputc('\'', f);
}

/* The unfinished points as Slurm's array list ("0-3,7"); how many. */
static int todo_list(const sw_spec *s, FILE *f) {
    int n = 0;
    for (int k = 0; k < s->n_points;) {
        if (sw_point_state(s, k, NULL, 0, NULL) == SW_DONE) {
            k++;
            continue;
        }
        int j = k;
        while (j + 1 < s->n_points && sw_point_state(s, j + 1, NULL, 0, NULL) != SW_DONE) j++;
        fprintf(f, n ? ",%d" : "%d", k);
        if (j > k) fprintf(f, "-%d", j);
        n += j - k + 1;
        k = j + 1;
    }
    return n;
}

static int write_script(const sw_spec *s, const char *path, int *n) {
    char err[TR_PATH_MAX + 128];
    tr_atomic a;
    if (tr_atomic_open(&a, path, err, sizeof err)) goto bad;
    fputs("#!/bin/sh\n# a task of trainer sweep's job array: one point of the sweep\n", a.f);
    fputs("#SBATCH --job-name=trainer-sweep\n#SBATCH --array=", a.f);
    *n = todo_list(s, a.f);
    fprintf(a.f, "\n#SBATCH --output=%s/logs/slurm-%%A_%%a.out\ncd ", s->exp);
    sh_quote(a.f, s->cwd);
    fputs(" || exit 1\nexec ", a.f);
    sh_quote(a.f, s->self);
    fputs(" sweep ", a.f);
    sh_quote(a.f, s->exp);
    fputs(" --point \"$SLURM_ARRAY_TASK_ID\"\n", a.f);
    if (*n == 0) {
        tr_atomic_abandon(&a);
        return 0;
    }
    if (!tr_atomic_commit(&a, err, sizeof err)) return 0;
bad:
    fprintf(stderr, "trainer sweep: %s\n", err);
    return -1;
}

int sw_run_slurm(const sw_spec *s, int wait) {
    char script[TR_PATH_MAX + 32], log[TR_PATH_MAX + 32];
    snprintf(script, sizeof script, "%s/sweep.sbatch", s->exp);
    snprintf(log, sizeof log, "%s/logs/sbatch.log", s->exp);
    int n = 0;
    if (write_script(s, script, &n)) return 2;
    if (n == 0) return sw_summary(s, stdout) ? 1 : 0;
    char *argv[32 + 6];
    int c = 0;
    argv[c++] = "sbatch";
    for (int i = 0; i < s->n_sbatch; i++) argv[c++] = s->sbatch[i];
    argv[c++] = "--parsable";
    if (wait) argv[c++] = "--wait";
    argv[c++] = script;
    argv[c] = NULL;
    printf("sweep: submitting %d point%s as a Slurm job array (%s)%s\n", n, n == 1 ? "" : "s",
           script, wait ? "; waiting for it" : "");
    tr_spawn_handlers();
    unlink(log);
    int status = tr_spawn(argv, NULL, log, NULL, NULL, "trainer sweep");
    char last[1024];
    last_line(log, last, sizeof last);
    if (tr_spawn_signal()) return 128 + tr_spawn_signal();
    if (!wait) {
        if (status != 0) {
            fprintf(stderr, "trainer sweep: sbatch failed: %s\n", last);
            return 2;
        }
        printf("sweep: job array %s submitted; `trainer sweep %s --list` shows the points\n",
               last, s->exp);
        return 0;
    }
    return sw_summary(s, stdout) ? 1 : 0; /* sbatch --wait fails when a task did */
}
