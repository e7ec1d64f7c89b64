/* `trainer sweep`: a grid of runs of one recipe (its knobs, train fields or run flags as the
 * axes, seeds as one more), each point a normal run in its own folder under one experiment
 * folder (trainer/ops/sweep.h). This file: the command line, sweep.json and the points;
 * running them is sweep_run.c's. Every point's flags are checked as `trainer run` checks them
 * before anything runs, so a typo fails the sweep in one line, not every point. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/json.h"
#include "trainer/ops/sweep.h"

static const char *help =
    "usage: trainer sweep RECIPE --out EXP [--grid NAME=V1,V2,...]... [--seeds N]\n"
    "                     [--launcher local|slurm|COMMAND] [--task-launcher COMMAND]\n"
    "                     [--sbatch OPTION]... [--wait] [--eval-task FILE]... [run flags...]\n"
    "       trainer sweep EXP [--out NEW] [--point K | --list] [--launcher ...] [--wait]\n"
    "\n"
    "Run a grid of runs of RECIPE: every combination of the --grid values, each with each\n"
    "seed, as a normal `trainer run` in EXP/points/NAME (its own metrics, checkpoints and\n"
    "provenance), its output in EXP/logs/NAME.log and how it ended in EXP/status/NAME.json.\n"
    "A point's NAME joins its values: lr-1e-3_width-128_seed-1337. EXP/sweep.json records\n"
    "the sweep, so `trainer sweep EXP` runs it again from the folder alone (and `trainer\n"
    "sweep EXP --out NEW` runs the same sweep anew in NEW): it runs only what\n"
    "is unfinished (a point that was cut short resumes from its checkpoint with --resume; a\n"
    "failed one is tried again), and nothing that is done. A point that fails is recorded and\n"
    "the others still run; the exit status is 1 when any failed. `trainer report --compare\n"
    "EXP` tables the points (mean and deviation over seeds) with their curves.\n"
    "\n"
    "  --out EXP         the experiment folder (made; a folder holding another sweep is\n"
    "                    refused)\n"
    "  --grid NAME=V,... one axis: a knob of the recipe or a train field, given to each run\n"
    "                    as --set NAME=V (train.NAME or NAME, as --set takes them); or\n"
    "                    --grid --FLAG=V,... for a flag of `trainer run` (--tp=1,2,\n"
    "                    --zero=0,1,2: a layout per point); repeatable, at most 8 axes and\n"
    "                    64 values each, 4096 points in all\n"
    "  --seeds N         N seeds per combination: the recipe's train.seed and the N - 1 after\n"
    "                    it, as --set train.seed=S (the seed sets the initialisation, the data\n"
    "                    order and the sample)\n"
    "Without --grid and --seeds, the recipe's own sweep { grid = { NAME = { V1, V2 }, ... },\n"
    "seeds = N } gives them (its axes in the order of their names); with either, the command\n"
    "line replaces that block.\n"
    "  --launcher L      local (default): one point after another on this machine; slurm: one\n"
    "                    Slurm job array of the unfinished points (sbatch), each task running\n"
    "                    `trainer sweep EXP --point K`; any other text: a command put before\n"
    "                    `trainer run` for every point, split at spaces (\"mpirun -np 2\")\n"
    "  --task-launcher C with slurm: the command before `trainer run` inside a task\n"
    "                    (\"srun --mpi=pmix\" for a task of several processes)\n"
    "  --sbatch OPTION   with slurm: one option for sbatch (--sbatch --partition=gpu);\n"
    "                    repeatable\n"
    "  --wait            with slurm: wait until the job array has ended, then summarize\n"
    "  --eval-task FILE  when a point has trained, `trainer eval POINT --task FILE --json`\n"
    "                    into EXP/points/NAME/eval.json (its last checkpoint: the recipe\n"
    "                    must save one); `trainer report --compare EXP` tables the accuracies;\n"
    "                    a point whose evaluation fails is failed, and only its evaluation is\n"
    "                    run again; repeatable, up to 8\n"
    "  --point K         run point K (0-based, in sweep.json's order) only\n"
    "  --list            print the points and their states; run nothing (with a recipe: make\n"
    "                    the experiment folder, to run its points later)\n"
    "Every other flag is a `trainer run` flag that every point gets (--steps, --set,\n"
    "--micro-batch, ...); --out, --resume and --overwrite are the sweep's to decide.\n";

TR_PRINTF(1, 2) static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "trainer sweep: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return -1;
}

/* ---- points --------------------------------------------------------------------------------- */

void sw_point_values(const sw_spec *s, int k, const char **values) {
    for (int a = s->n_axes - 1; a >= 0; a--) { /* the first axis varies slowest */
        values[a] = s->axes[a].values[k % s->axes[a].n];
        k /= s->axes[a].n;
    }
}

/* A value in a folder name: letters, digits and . + - kept, anything else '_'. */
static void put_clean(char *buf, size_t n, size_t *at, const char *v) {
    for (; *v && *at + 1 < n; v++) {
        char c = *v;
        int keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '.' || c == '+' || c == '-';
        buf[(*at)++] = keep ? c : '_';
    }
    buf[*at] = 0;
}

void sw_point_name(const sw_spec *s, int k, char *buf, size_t n) {
    const char *v[SW_MAX_AXES];
    sw_point_values(s, k, v);
    size_t at = 0;
    buf[0] = 0;
    if (s->n_axes == 0) put_clean(buf, n, &at, "run");
    for (int a = 0; a < s->n_axes; a++) {
        if (a) put_clean(buf, n, &at, "_");
        put_clean(buf, n, &at, s->axes[a].label);
        put_clean(buf, n, &at, "-");
        put_clean(buf, n, &at, v[a]);
    }
}

/* Text appended to store (4096 bytes) at *used, cut to fit: where it starts. */
TR_PRINTF(3, 4) static char *put(char *store, size_t *used, const char *fmt, ...) {
    static char none[1];
    if (*used >= 4096) return none;
    char *p = store + *used;
    size_t room = 4096 - *used;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(p, room, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < room ? (size_t)n : room - 1;
    *used += len + 1;
    return p;
}

int sw_point_argv(const sw_spec *s, int k, const char *self, int resume, char **argv,
                  char *store) {
    int n = 0;
    size_t used = 0;
    argv[n++] = (char *)self;
    argv[n++] = "run";
    argv[n++] = (char *)s->recipe;
    for (int i = 0; i < s->n_args; i++) argv[n++] = s->args[i];
    const char *v[SW_MAX_AXES];
    sw_point_values(s, k, v);
    /* at most 8 x (63 + 1 + SW_VALUE_MAX + 1) bytes of axes and the folder: they fit */
    for (int a = 0; a < s->n_axes; a++) {
        if (s->axes[a].flag) {
            argv[n++] = put(store, &used, "--%s", s->axes[a].name);
            argv[n++] = (char *)v[a];
        } else {
            argv[n++] = "--set";
            argv[n++] = put(store, &used, "%s=%s", s->axes[a].name, v[a]);
        }
    }
    char name[SW_NAME_LEN];
    sw_point_name(s, k, name, sizeof name);
    argv[n++] = "--out";
    argv[n++] = put(store, &used, "%s/points/%s", s->exp, name);
    if (resume) argv[n++] = "--resume";
    argv[n] = NULL;
    return n;
}

/* ---- sweep.json ----------------------------------------------------------------------------- */

static void write_strings(FILE *f, char *const *v, int n) {
    fputc('[', f);
    for (int i = 0; i < n; i++) {
        if (i) fputs(", ", f);
        tr_json_write_string(f, v[i]);
    }
    fputc(']', f);
}

/* What makes the experiment what it is: the recipe, the common flags and the axes (the
 * launcher may change between one sweep of EXP and the next). */
static void write_identity(const sw_spec *s, FILE *f) {
    fputs("  \"recipe\": ", f);
    tr_json_write_string(f, s->recipe);
    fputs(",\n  \"cwd\": ", f);
    tr_json_write_string(f, s->cwd);
    fputs(",\n  \"args\": ", f);
    write_strings(f, s->args, s->n_args);
    fputs(",\n  \"eval_tasks\": ", f);
    write_strings(f, s->eval_tasks, s->n_eval);
    fputs(",\n  \"axes\": [", f);
    for (int a = 0; a < s->n_axes; a++) {
        const sw_axis *x = &s->axes[a];
        fprintf(f, "%s\n    {\"name\": ", a ? "," : "");
        tr_json_write_string(f, x->name);
        fputs(", \"label\": ", f);
        tr_json_write_string(f, x->label);
        fprintf(f, ", \"flag\": %s, \"values\": ", x->flag ? "true" : "false");
        write_strings(f, x->values, x->n);
        fputc('}', f);
    }
    fputs("]", f);
}

static int write_spec(const sw_spec *s) {
    char path[TR_PATH_MAX + 16], err[TR_PATH_MAX + 128];
    snprintf(path, sizeof path, "%s/sweep.json", s->exp);
    tr_atomic a;
    if (tr_atomic_open(&a, path, err, sizeof err)) return fail("%s", err);
    fputs("{\n  \"sweep\": 1,\n", a.f);
    write_identity(s, a.f);
    fputs(",\n  \"launcher\": ", a.f);
    tr_json_write_string(a.f, s->launcher);
    fputs(",\n  \"task_launcher\": ", a.f);
    tr_json_write_string(a.f, s->task_launcher);
    fputs(",\n  \"sbatch\": ", a.f);
    write_strings(a.f, s->sbatch, s->n_sbatch);
    fputs(",\n  \"points\": [", a.f);
    for (int k = 0; k < s->n_points; k++) {
        char name[SW_NAME_LEN];
        const char *v[SW_MAX_AXES];
        sw_point_name(s, k, name, sizeof name);
        sw_point_values(s, k, v);
        fputs(k ? ",\n    {\"name\": " : "\n    {\"name\": ", a.f);
        tr_json_write_string(a.f, name);
        fputs(", \"values\": {", a.f);
        for (int x = 0; x < s->n_axes; x++) {
            fputs(x ? ", " : "", a.f);
            tr_json_write_string(a.f, s->axes[x].label);
            fputs(": ", a.f);
            tr_json_write_string(a.f, v[x]);
        }
        fputs("}}", a.f);
    }
    fputs("]\n}\n", a.f);
    return tr_atomic_commit(&a, err, sizeof err) ? fail("%s", err) : 0;
}

static char *dup_str(const char *s) {
    char *d = strdup(s);
    if (!d) {
        fail("out of memory");
        exit(1);
    }
    return d;
}

/* A JSON array of strings into v (at most max); -1 when it is not one. */
static int read_strings(const tr_json *a, char **v, int max, int *n) {
    if (!a || a->type != TR_JSON_ARR || a->n > max) return -1;
    for (*n = 0; *n < a->n; ++*n) { /* counted as they are made: spec_free frees them */
        if (a->kids[*n].type != TR_JSON_STR) return -1;
        v[*n] = dup_str(a->kids[*n].str);
    }
    return 0;
}

static void free_strings(char **v, int *n) {
    for (int i = 0; i < *n; i++) free(v[i]), v[i] = NULL;
    *n = 0;
}

/* The strings s holds (flags, values, files); s itself is the caller's. */
static void spec_free(sw_spec *s) {
    free_strings(s->args, &s->n_args);
    free_strings(s->sbatch, &s->n_sbatch);
    free_strings(s->eval_tasks, &s->n_eval);
    for (int a = 0; a < SW_MAX_AXES; a++) free_strings(s->axes[a].values, &s->axes[a].n);
}

static int read_str(const tr_json *o, const char *key, char *buf, size_t n) {
    const tr_json *v = tr_json_get(o, key);
    if (!v || v->type != TR_JSON_STR || strlen(v->str) >= n) return -1;
    snprintf(buf, n, "%s", v->str);
    return 0;
}

static int read_axes(const tr_json *axes, sw_spec *s) {
    if (!axes || axes->type != TR_JSON_ARR || axes->n > SW_MAX_AXES) return -1;
    s->n_axes = axes->n;
    s->n_points = 1;
    for (int a = 0; a < axes->n; a++) {
        sw_axis *x = &s->axes[a];
        const tr_json *o = &axes->kids[a], *flag = tr_json_get(o, "flag");
        if (read_str(o, "name", x->name, sizeof x->name) ||
            read_str(o, "label", x->label, sizeof x->label) || !flag ||
            flag->type != TR_JSON_BOOL ||
            read_strings(tr_json_get(o, "values"), x->values, SW_MAX_VALUES, &x->n) || x->n < 1)
            return -1;
        for (int v = 0; v < x->n; v++)
            if (!x->values[v][0] || strlen(x->values[v]) > SW_VALUE_MAX) return -1;
        x->flag = flag->num != 0;
        s->n_points *= x->n;
    }
    return s->n_points <= SW_MAX_POINTS ? 0 : -1;
}

/* EXP/sweep.json into s; -1 with one line. */
static int read_spec(const char *exp, sw_spec *s) {
    char path[TR_PATH_MAX + 16], err[TR_PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/sweep.json", exp);
    tr_json j;
    if (tr_json_parse_file(&j, path, err, sizeof err)) return fail("%s", err);
    int rc;
    if (exp != s->exp) snprintf(s->exp, sizeof s->exp, "%s", exp);
    rc = read_str(&j, "recipe", s->recipe, sizeof s->recipe) ||
         read_str(&j, "cwd", s->cwd, sizeof s->cwd) ||
         read_str(&j, "launcher", s->launcher, sizeof s->launcher) ||
         read_str(&j, "task_launcher", s->task_launcher, sizeof s->task_launcher) ||
         read_strings(tr_json_get(&j, "args"), s->args, SW_MAX_ARGS, &s->n_args) ||
         read_strings(tr_json_get(&j, "sbatch"), s->sbatch, 32, &s->n_sbatch) ||
         read_strings(tr_json_get(&j, "eval_tasks"), s->eval_tasks, 8, &s->n_eval) ||
         read_axes(tr_json_get(&j, "axes"), s);
    tr_json_free(&j);
    return rc ? fail("%s: not a sweep this trainer wrote (a field is missing or wrong)", path)
              : 0;
}

/* ---- the command line ----------------------------------------------------------------------- */

/* p as an absolute path without links into out (n bytes): 0, or -1 with one line. */
static int abs_path(const char *p, char *out, size_t n) {
    char *r = realpath(p, NULL);
    if (!r) return fail("%s: %s", p, strerror(errno));
    int rc = strlen(r) < n ? 0 : fail("%s: the path is longer than %zu bytes", p, n - 1);
    if (!rc) memcpy(out, r, strlen(r) + 1);
    free(r);
    return rc;
}


typedef struct {
    const char *first;    /* RECIPE or EXP */
    const char *out;      /* --out */
    const char *launcher; /* NULL: local, or sweep.json's */
    const char *task_launcher;
    int seeds, point, list, wait, has_sbatch;
} sw_flags;

/* --grid NAME=V,... (or --FLAG=V,...) as axis a */
static int parse_grid(const char *g, sw_axis *x) {
    const char *eq = strchr(g, '=');
    int flag = g[0] == '-' && g[1] == '-';
    const char *name = flag ? g + 2 : g;
    if (!eq || eq == name || (size_t)(eq - name) >= sizeof x->name)
        return fail("--grid '%s': needs NAME=V1,V2,... (or --FLAG=V1,V2,...)", g);
    memset(x, 0, sizeof *x);
    x->flag = flag;
    memcpy(x->name, name, (size_t)(eq - name));
    snprintf(x->label, sizeof x->label, "%s", strcmp(x->name, "train.seed") ? x->name : "seed");
    for (const char *p = eq + 1;;) {
        const char *c = strchr(p, ',');
        size_t n = c ? (size_t)(c - p) : strlen(p);
        if (n == 0) return fail("--grid '%s': an empty value", g);
        if (n > SW_VALUE_MAX)
            return fail("--grid '%.40s...': a value of %zu bytes (at most %d)", g, n, SW_VALUE_MAX);
        if (x->n == SW_MAX_VALUES) return fail("--grid '%s': more than %d values", g, SW_MAX_VALUES);
        x->values[x->n] = dup_str(p);
        x->values[x->n++][n] = 0;
        if (!c) break;
        p = c + 1;
    }
    return 0;
}

static int parse_int_flag(const char *flag, const char *v, int min, int max, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < min || x > max)
        return fail("%s needs an integer from %d to %d, got '%s'", flag, min, max, v);
    *out = (int)x;
    return 0;
}

/* One of the sweep's own flags at argv[*i] (value flags advance *i): 1 when it was one, 0
 * when it is a run flag, -1 on a mistake. */
static int own_flag(sw_flags *f, sw_spec *s, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    static const char *const valued[] = {"--out",     "--grid",  "--seeds",
                                         "--launcher", "--task-launcher", "--sbatch",
                                         "--point",   "--eval-task"};
    int which = -1;
    for (int k = 0; k < 8; k++)
        if (!strcmp(a, valued[k])) which = k;
    if (!strcmp(a, "--list")) return f->list = 1;
    if (!strcmp(a, "--wait")) return f->wait = 1;
    if (which < 0) return 0;
    if (*i + 1 >= argc) return fail("%s needs a value (see trainer sweep --help)", a);
    const char *v = argv[++*i];
    switch (which) {
    case 0: f->out = v; return 1;
    case 1:
        if (s->n_axes == SW_MAX_AXES) return fail("more than %d --grid axes", SW_MAX_AXES);
        return parse_grid(v, &s->axes[s->n_axes++]) ? -1 : 1;
    case 2: return parse_int_flag(a, v, 1, SW_MAX_VALUES, &f->seeds) ? -1 : 1;
    case 3: f->launcher = v; return 1;
    case 4: f->task_launcher = v; return 1;
    case 5:
        if (s->n_sbatch == 32) return fail("more than 32 --sbatch options");
        s->sbatch[s->n_sbatch++] = dup_str(v);
        return f->has_sbatch = 1;
    case 6: return parse_int_flag(a, v, 0, SW_MAX_POINTS - 1, &f->point) ? -1 : 1;
    default:
        if (s->n_eval == 8) return fail("more than 8 --eval-task files");
        if (!(s->eval_tasks[s->n_eval] = malloc(TR_PATH_MAX))) return fail("out of memory");
        return abs_path(v, s->eval_tasks[s->n_eval++], TR_PATH_MAX) ? -1 : 1;
    }
}

static int parse(sw_flags *f, sw_spec *s, int argc, char **argv) {
    f->point = -1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        int own = own_flag(f, s, argc, argv, &i);
        if (own < 0) return -1;
        if (own) continue;
        if (!strcmp(a, "--resume") || !strcmp(a, "--overwrite"))
            return fail("%s: the sweep decides it for each point (a point cut short is resumed)", a);
        if (a[0] != '-' && !f->first) {
            f->first = a;
            continue;
        }
        if (s->n_args + 2 > SW_MAX_ARGS) return fail("more than %d run flags", SW_MAX_ARGS);
        s->args[s->n_args++] = dup_str(a);
    }
    if (!f->first) return fail("needs a recipe or an experiment folder (see trainer sweep --help)");
    return 0;
}

/* ---- checking and making the sweep ----------------------------------------------------------- */

/* Point k's flags as `trainer run` reads them; a recipe it loads with them: 0, or -1 with
 * run's own line, naming the point. out (may be NULL) gets that recipe. */
static int check_point(const sw_spec *s, int k, tr_recipe *out) {
    char *argv[SW_MAX_ARGS + 3 * SW_MAX_AXES + 8], store[4096], msg[1024], name[SW_NAME_LEN];
    int argc = sw_point_argv(s, k, "trainer", 0, argv, store);
    sw_point_name(s, k, name, sizeof name);
    tr_options o;
    int rc = tr_parse_options_msg(&o, "run", argc, argv, 2, msg, sizeof msg);
    if (rc == 1) return fail("--help is not a flag to give every point");
    if (rc) return s->n_axes ? fail("point %s: %s", name, msg) : fail("%s", msg);
    tr_recipe *r = out ? out : malloc(sizeof *r);
    if (!r) return fail("out of memory");
    rc = tr_load_recipe_msg(r, &o, "run", msg, sizeof msg);
    if (rc && s->n_axes) fail("point %s: %s", name, msg);
    else if (rc) fail("%s", msg);
    else if (!out) tr_recipe_free(r);
    if (!out) free(r);
    return rc ? -1 : 0;
}

/* The recipe's sweep { } as the axes and seeds, when the command line gives none. */
static int recipe_axes(sw_spec *s, const tr_sweep_desc *w, int *seeds) {
    if (!w->line) return 0;
    if (s->n_axes || *seeds) {
        printf("sweep: the command line's --grid and --seeds replace the recipe's sweep { } "
               "(line %d)\n", w->line);
        return 0;
    }
    for (int a = 0; a < w->n_axes; a++) {
        sw_axis *x = &s->axes[a];
        memset(x, 0, sizeof *x);
        snprintf(x->name, sizeof x->name, "%s", w->names[a]);
        snprintf(x->label, sizeof x->label, "%s", strcmp(x->name, "train.seed") ? x->name : "seed");
        for (int v = 0; v < w->n_values[a]; v++) x->values[x->n++] = dup_str(w->values[a][v]);
    }
    s->n_axes = w->n_axes;
    *seeds = w->seeds;
    return 0;
}

static int add_seeds(sw_spec *s, int seeds, unsigned long long base) {
    if (s->n_axes == SW_MAX_AXES) return fail("more than %d axes with the seeds", SW_MAX_AXES);
    sw_axis *x = &s->axes[s->n_axes++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "train.seed");
    snprintf(x->label, sizeof x->label, "seed");
    for (int i = 0; i < seeds; i++) {
        char v[32];
        snprintf(v, sizeof v, "%llu", base + (unsigned long long)i);
        x->values[x->n++] = dup_str(v);
    }
    return 0;
}

/* Every point checked, and their names distinct. */
static int check_points(sw_spec *s) {
    s->n_points = 1;
    for (int a = 0; a < s->n_axes; a++) {
        s->n_points *= s->axes[a].n;
        if (s->n_points > SW_MAX_POINTS) return fail("more than %d points", SW_MAX_POINTS);
    }
    char (*names)[SW_NAME_LEN] = calloc((size_t)s->n_points, SW_NAME_LEN);
    if (!names) return fail("out of memory");
    int rc = 0;
    for (int k = 0; k < s->n_points && !rc; k++) {
        sw_point_name(s, k, names[k], SW_NAME_LEN);
        for (int j = 0; j < k && !rc; j++)
            if (!strcmp(names[j], names[k]))
                rc = fail("points %d and %d are both named %s (values that differ only in "
                          "characters a folder name replaces by '_')",
                          j, k, names[k]);
        if (!rc) rc = check_point(s, k, NULL);
    }
    free(names);
    return rc;
}

/* The identity of s, as text, for comparing with the experiment's. */
static char *identity(const sw_spec *s) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return NULL;
    write_identity(s, f);
    fclose(f);
    return buf;
}

/* A copy of the recipe in EXP, or (the sweep made before) the recipe unchanged since. */
static int keep_recipe(const sw_spec *s, int made) {
    char path[TR_PATH_MAX + 16], err[TR_PATH_MAX + 128];
    snprintf(path, sizeof path, "%s/recipe.lua", s->exp);
    size_t n, m;
    char *now = tr_read_file(s->recipe, 64u << 20, &n);
    if (!now) return fail("%s: cannot read: %s", s->recipe, strerror(errno));
    int rc = 0;
    if (made) {
        char *then = tr_read_file(path, 64u << 20, &m);
        if (!then || m != n || memcmp(then, now, n))
            rc = fail("%s changed since the sweep in %s was made (its copy: %s); a sweep runs "
                      "one recipe: make another with a new --out",
                      s->recipe, s->exp, path);
        free(then);
    } else {
        tr_atomic a;
        rc = tr_atomic_open(&a, path, err, sizeof err);
        if (!rc) fwrite(now, 1, n, a.f), rc = tr_atomic_commit(&a, err, sizeof err);
        if (rc) fail("%s", err);
    }
    free(now);
    return rc;
}

/* The recipe with the common flags: its sweep { } (the axes and seeds when the command line
 * gives none), its seed (*base), and the checkpoint --eval-task needs. */
static int from_recipe(sw_spec *s, sw_flags *f, unsigned long long *base) {
    tr_recipe *r = malloc(sizeof *r);
    if (!r) return fail("out of memory");
    int n_axes = s->n_axes;
    s->n_axes = 0, s->n_points = 1;
    int rc = check_point(s, 0, r);
    s->n_axes = n_axes;
    if (rc) {
        free(r);
        return -1;
    }
    *base = r->train.seed;
    if (s->n_eval && r->train.checkpoint_every <= 0)
        rc = fail("--eval-task evaluates each point's last checkpoint, and the recipe saves none "
                  "(checkpoint_every 0): add --set checkpoint_every=N");
    if (!rc) rc = recipe_axes(s, &r->sweep, &f->seeds);
    tr_recipe_free(r);
    free(r);
    return rc;
}

/* s's experiment in folder `out`: made, or (one made there before) the same sweep again; s->exp
 * then out's absolute path (the points run from where the sweep was made, wherever it is
 * continued from). */
static int settle(sw_spec *s, const char *out) {
    char err[TR_PATH_MAX + 128], path[TR_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/sweep.json", out);
    int made = access(path, F_OK) == 0;
    if (made) {
        sw_spec *old = calloc(1, sizeof *old);
        if (!old) return fail("out of memory");
        int bad = read_spec(out, old);
        char *a = bad ? NULL : identity(s), *b = bad ? NULL : identity(old);
        int same = a && b && !strcmp(a, b);
        free(a), free(b);
        spec_free(old), free(old);
        if (bad) return -1;
        if (!same)
            return fail("%s holds another sweep (its sweep.json has another recipe, flags or "
                        "axes): use another --out, or `trainer sweep %s` to continue that one",
                        out, out);
    } else if (tr_mkdirs(out, err, sizeof err)) {
        return fail("%s", err);
    }
    if (abs_path(out, s->exp, sizeof s->exp)) return -1;
    return keep_recipe(s, made) || write_spec(s);
}

/* A new sweep in f->out, or the same one again: 0 with s complete. */
static int make(sw_flags *f, sw_spec *s) {
    if (abs_path(f->first, s->recipe, sizeof s->recipe)) return -1;
    if (!getcwd(s->cwd, sizeof s->cwd)) return fail("cannot read the current folder");
    unsigned long long base = 0;
    if (from_recipe(s, f, &base)) return -1;
    if (f->seeds && add_seeds(s, f->seeds, base)) return -1;
    return check_points(s) || settle(s, f->out);
}

static int folders(const sw_spec *s) {
    static const char *const sub[] = {"points", "logs", "status"};
    char path[TR_PATH_MAX + 16], err[TR_PATH_MAX + 128];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", s->exp, sub[i]);
        if (tr_mkdirs(path, err, sizeof err)) return fail("%s", err);
    }
    return 0;
}

/* The sweep of f->first (an experiment folder) with the flags that may change between
 * sweeps of it (the others would make another experiment); with --out NEW, the same sweep
 * made again in NEW, from the experiment folder alone. */
static int again(sw_flags *f, sw_spec *s) {
    if (f->seeds || s->n_axes || s->n_args || s->n_eval)
        return fail("%s is an experiment folder: its sweep.json fixes the recipe, flags, grid "
                    "and seeds (only --out, --launcher, --task-launcher, --sbatch, --wait, "
                    "--point and --list may be given with it)",
                    f->first);
    int n_sbatch = s->n_sbatch; /* the command line's, kept over sweep.json's */
    char *sbatch[32], out[TR_PATH_MAX] = "", err[TR_PATH_MAX + 128];
    memcpy(sbatch, s->sbatch, sizeof sbatch);
    s->n_sbatch = 0;
    int rc = abs_path(f->first, s->exp, sizeof s->exp) || read_spec(s->exp, s);
    if (n_sbatch) {
        free_strings(s->sbatch, &s->n_sbatch);
        memcpy(s->sbatch, sbatch, sizeof sbatch), s->n_sbatch = n_sbatch;
    }
    if (rc || keep_recipe(s, 1)) return -1;
    if (f->out && tr_mkdirs(f->out, err, sizeof err)) return fail("%s", err);
    if (f->out && abs_path(f->out, out, sizeof out)) return -1;
    if (chdir(s->cwd)) return fail("cannot enter %s, where the sweep was made: %s", s->cwd,
                                   strerror(errno));
    return out[0] ? settle(s, out) : 0;
}

static int dispatch(const sw_flags *f, sw_spec *s) {
    if (f->launcher) snprintf(s->launcher, sizeof s->launcher, "%s", f->launcher);
    if (f->task_launcher) snprintf(s->task_launcher, sizeof s->task_launcher, "%s", f->task_launcher);
    if (folders(s) || sw_self_path(s)) return 2;
    if (f->list) return sw_summary(s, stdout) ? 1 : 0;
    int slurm = !strcmp(s->launcher, "slurm");
    if (f->point >= 0) {
        if (f->point >= s->n_points)
            return fail("--point %d: the sweep has %d points (0 to %d)", f->point, s->n_points,
                        s->n_points - 1), 2;
        int rc = sw_run_point(s, f->point, slurm ? s->task_launcher : s->launcher);
        return rc < 0 ? 2 : rc;
    }
    return slurm ? sw_run_slurm(s, f->wait) : sw_run_local(s);
}

int tr_cmd_sweep(int argc, char **argv) {
    sw_flags f = {0};
    sw_spec *s = calloc(1, sizeof *s);
    if (!s) return 1;
    snprintf(s->launcher, sizeof s->launcher, "local");
    int rc = parse(&f, s, argc, argv);
    if (f.launcher) snprintf(s->launcher, sizeof s->launcher, "%s", f.launcher);
    if (f.task_launcher) snprintf(s->task_launcher, sizeof s->task_launcher, "%s", f.task_launcher);
    if (rc > 0) fputs(help, stdout);
    if (rc) {
        spec_free(s), free(s);
        return rc > 0 ? 0 : 2;
    }
    struct stat st;
    int is_exp = stat(f.first, &st) == 0 && S_ISDIR(st.st_mode);
    if (!is_exp && !f.out) rc = fail("--out EXP is needed with a recipe (see trainer sweep --help)");
    else rc = is_exp ? again(&f, s) : make(&f, s);
    if (!rc) rc = dispatch(&f, s);
    else rc = 2;
    spec_free(s), free(s);
    return rc;
}
