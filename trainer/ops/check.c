/* `trainer check RECIPE --a LAYOUT --b LAYOUT`: one training step of the same model on the same
 * batch in two layouts (device, precision, dp x tp x pp, ZeRO), each a child `trainer run`
 * that dumps its activations and gradients as global tensors (TR_DUMP_TENSORS, trainer/run/dump.c),
 * then a table of the largest relative difference of every tensor, naming the first one
 * beyond the tolerance. Exit 0 when all agree, 1 when some differ, 2 when the comparison could
 * not be made (bad input, a run that failed). */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "parallel/schedule.h"
#include "trainer/trainer.h"

#define BF16_TOL 2e-2 /* default when a side stores bf16: see README, `trainer check` */
#define MAX_ARGS (2 * TR_MAX_SETS + 64)

static const char *check_help =
    "usage: trainer check RECIPE --a LAYOUT --b LAYOUT [--tol X] [--set NAME=VALUE]...\n"
    "                            [--launcher CMD] [--out DIR]\n"
    "\n"
    "Run one training step of the recipe's model on the same batch in two layouts and compare\n"
    "them tensor by tensor: every layer's output in forward order, then every parameter's\n"
    "gradient (before the optimizer step), each assembled into the global tensor. Prints the\n"
    "largest relative difference of each, max |a - b| / max(max |a|, max |b|), and names the\n"
    "first tensor beyond the tolerance.\n"
    "\n"
    "  LAYOUT        comma-separated: a device (cpu, the default, or cuda), a precision (fp32,\n"
    "                the CPU's and the default; bf16, CUDA's default), dp=D, tp=T, pp=P,\n"
    "                zero=S (0-3), sp (sequence parallelism, with tp > 1), schedule=NAME\n"
    "                (gpipe, 1f1b, interleaved, zb-h1, zb-v); e.g. cpu,dp=2,zero=3 or\n"
    "                cuda,bf16,tp=2\n"
    "  --tol X       the largest relative difference that agrees (default 1e-5 when both\n"
    "                sides are fp32, 2e-2 otherwise)\n"
    "  --set N=V     a knob of the recipe, for both runs (repeatable)\n"
    "  --launcher C  how to start a layout of several processes, {n} their number (default\n"
    "                \"mpirun -np {n}\"; as root, OMPI_ALLOW_RUN_AS_ROOT and its _CONFIRM are\n"
    "                set to 1 for it, unless already set, since Open MPI refuses root without)\n"
    "  --out DIR     keep both runs (their logs and tensors) in DIR; by default they go to a\n"
    "                temporary folder, removed unless a run failed\n"
    "\n"
    "Exit status: 0 all tensors agree, 1 some differ, 2 bad input or a run that failed.\n";

typedef struct {
    const char *text;
    int cuda, bf16, dp, tp, pp, zero, sp, schedule;
} check_layout;

/* A positive (or, for zero, 0-3) integer value of key=VALUE. */
static int layout_int(const char *flag, const char *text, const char *key, const char *v, int lo,
                      int hi, int *out) {
    char *end;
    long n = strtol(v, &end, 10);
    if (*v && !*end && n >= lo && n <= hi) {
        *out = (int)n;
        return 0;
    }
    fprintf(stderr, "trainer check: %s '%s': %s needs an integer from %d to %d, got '%s'\n", flag,
            text, key, lo, hi, v);
    return -1;
}

/* One item of a layout into l; -1 after one line naming the flag, the layout and the item. */
static int layout_item(check_layout *l, const char *flag, char *it, unsigned *seen) {
    static const char *keys[] = {"device", "precision", "dp", "tp", "pp", "zero", "sp", "schedule"};
    char *eq = strchr(it, '=');
    const char *v = eq ? eq + 1 : "";
    if (eq) *eq = 0;
    int k = !strcmp(it, "cpu") || !strcmp(it, "cuda")    ? 0
            : !strcmp(it, "fp32") || !strcmp(it, "bf16") ? 1
            : !strcmp(it, "sp")                          ? 6
                                                         : -1;
    for (int j = 2; k < 0 && j < 8; j++)
        if (j != 6 && eq && !strcmp(it, keys[j])) k = j;
    if (k < 0 || (k < 2 || k == 6) != !eq) {
        if (eq) *eq = '=';
        fprintf(stderr,
                "trainer check: %s '%s': unknown item '%s' (items: cpu, cuda, fp32, bf16, dp=D, "
                "tp=T, pp=P, zero=S, sp, schedule=NAME)\n",
                flag, l->text, it);
        return -1;
    }
    if (*seen & (1u << k)) {
        fprintf(stderr, "trainer check: %s '%s': %s is given twice\n", flag, l->text, keys[k]);
        return -1;
    }
    *seen |= 1u << k;
    switch (k) {
    case 0:
        l->cuda = !strcmp(it, "cuda");
        return 0;
    case 1:
        l->bf16 = !strcmp(it, "bf16");
        return 0;
    case 2:
        return layout_int(flag, l->text, it, v, 1, 4096, &l->dp);
    case 3:
        return layout_int(flag, l->text, it, v, 1, 4096, &l->tp);
    case 4:
        return layout_int(flag, l->text, it, v, 1, 4096, &l->pp);
    case 5:
        return layout_int(flag, l->text, it, v, 0, 3, &l->zero);
    case 6:
        l->sp = 1;
        return 0;
    default:
        if ((l->schedule = tr_pp_kind_parse(v)) >= 0) return 0;
        fprintf(
            stderr,
            "trainer check: %s '%s': schedule must be gpipe, 1f1b, interleaved, zb-h1 or zb-v, got "
            "'%s'\n",
            flag, l->text, v);
        return -1;
    }
}

/* LAYOUT (see check_help) into l; -1 after one line. */
static int parse_layout(check_layout *l, const char *flag, const char *text) {
    *l = (check_layout){.text = text, .dp = 1, .tp = 1, .pp = 1, .schedule = -1};
    char buf[256];
    unsigned seen = 0;
    if (!*text || strlen(text) >= sizeof(buf)) {
        fprintf(stderr, "trainer check: %s needs a layout such as cpu,tp=2 (%s)\n", flag,
                *text ? "too long" : "empty");
        return -1;
    }
    snprintf(buf, sizeof(buf), "%s", text);
    for (char *save = NULL, *it = strtok_r(buf, ",", &save); it; it = strtok_r(NULL, ",", &save))
        if (layout_item(l, flag, it, &seen)) return -1;
    if (text[strlen(text) - 1] == ',' || text[0] == ',' || strstr(text, ",,")) {
        fprintf(stderr, "trainer check: %s '%s': an empty item\n", flag, text);
        return -1;
    }
    if (!(seen & 2)) l->bf16 = l->cuda; /* each device's default precision */
    if (l->bf16 && !l->cuda) {
        fprintf(stderr, "trainer check: %s '%s': bf16 needs cuda (the CPU computes in fp32)\n",
                flag, text);
        return -1;
    }
    if (l->sp && l->tp < 2) {
        fprintf(stderr, "trainer check: %s '%s': sp (sequence parallelism) needs tp=2 or more\n",
                flag, text);
        return -1;
    }
    if ((long)l->dp * l->tp * l->pp > 4096) {
        fprintf(stderr, "trainer check: %s '%s': more than 4096 processes\n", flag, text);
        return -1;
    }
    return 0;
}

typedef struct {
    const char *recipe, *launcher, *out;
    const char *sets[TR_MAX_SETS];
    int n_sets;
    double tol;
    check_layout a, b;
} check_opts;

static int need(int i, int argc, const char *flag) {
    if (i + 1 < argc) return 0;
    fprintf(stderr, "trainer check: %s needs a value (see trainer check --help)\n", flag);
    return -1;
}

/* 0, 1 for --help, -1 after one line. */
static int parse_check(check_opts *o, int argc, char **argv) {
    *o = (check_opts){.tol = -1};
    int have_a = 0, have_b = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        if (!strcmp(a, "--a") || !strcmp(a, "--b")) {
            if (need(i, argc, a) || parse_layout(a[2] == 'a' ? &o->a : &o->b, a, argv[++i]))
                return -1;
            *(a[2] == 'a' ? &have_a : &have_b) = 1;
        } else if (!strcmp(a, "--tol")) {
            char *end;
            if (need(i, argc, a)) return -1;
            o->tol = strtod(argv[++i], &end);
            if (!*argv[i] || *end || !(o->tol >= 0) || !isfinite(o->tol)) {
                fprintf(stderr, "trainer check: --tol needs a non-negative number, got '%s'\n",
                        argv[i]);
                return -1;
            }
        } else if (!strcmp(a, "--set")) {
            if (need(i, argc, a)) return -1;
            if (o->n_sets == TR_MAX_SETS) {
                fprintf(stderr, "trainer check: more than %d --set options\n", TR_MAX_SETS);
                return -1;
            }
            o->sets[o->n_sets++] = argv[++i];
        } else if (!strcmp(a, "--launcher") || !strcmp(a, "--out")) {
            if (need(i, argc, a)) return -1;
            *(a[2] == 'l' ? &o->launcher : &o->out) = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "trainer check: unknown option '%s' (see trainer check --help)\n", a);
            return -1;
        } else if (!o->recipe) {
            o->recipe = a;
        } else {
            fprintf(stderr, "trainer check: unexpected argument '%s' (one recipe only)\n", a);
            return -1;
        }
    }
    const char *miss = !o->recipe ? "recipe" : !have_a ? "--a LAYOUT" : !have_b ? "--b LAYOUT" : 0;
    if (miss) {
        fprintf(stderr, "trainer check: no %s given (see trainer check --help)\n", miss);
        return -1;
    }
    if (o->launcher && !strstr(o->launcher, "{n}")) {
        fprintf(stderr, "trainer check: --launcher '%s' must hold {n}, the number of processes\n",
                o->launcher);
        return -1;
    }
    if (o->tol < 0) o->tol = o->a.bf16 || o->b.bf16 ? BF16_TOL : 1e-5;
    return 0;
}

/* ---- the two runs ------------------------------------------------------------------------ */

static int push(char **argv, int *n, const char *s) {
    if (*n >= MAX_ARGS - 1) return -1;
    argv[(*n)++] = (char *)s;
    argv[*n] = NULL;
    return 0;
}

/* The command line of one side: the launcher's words ({n} replaced) when it has several
 * processes, then this binary's `run` for one step into dir. Strings go into store. */
static int side_argv(const check_opts *o, const check_layout *l, const char *self, const char *dir,
                     char **argv, char store[][32], char *launch) {
    int n = 0, np = l->dp * l->tp * l->pp, s = 0;
    argv[0] = NULL;
    if (np > 1) {
        const char *t = o->launcher ? o->launcher : "mpirun -np {n}";
        const char *at = strstr(t, "{n}");
        snprintf(launch, 1024, "%.*s%d%s", (int)(at - t), t, np, at + 3);
        for (char *sv = NULL, *w = strtok_r(launch, " ", &sv); w; w = strtok_r(NULL, " ", &sv))
            if (push(argv, &n, w)) return -1;
    }
    const char *fixed[] = {
        self, "run",           o->recipe, "--steps", "1", "--eval-every", "0", "--sample-tokens",
        "0",  "--peak-gflops", "1",       "--out",   dir,           "--overwrite"};
    for (size_t i = 0; i < sizeof(fixed) / sizeof(*fixed); i++)
        if (push(argv, &n, fixed[i])) return -1;
    for (int i = 0; i < o->n_sets; i++)
        if (push(argv, &n, "--set") || push(argv, &n, o->sets[i])) return -1;
    if (push(argv, &n, "--device") || push(argv, &n, l->cuda ? "cuda" : "cpu")) return -1;
    if (l->cuda && (push(argv, &n, "--precision") || push(argv, &n, l->bf16 ? "bf16" : "fp32")))
        return -1;
    const char *flag[] = {"--dp", "--tp", "--pp", "--zero"};
    int val[] = {l->dp, l->tp, l->pp, l->zero};
    for (int i = 0; i < 4; i++) {
        snprintf(store[s], 32, "%d", val[i]);
        if (push(argv, &n, flag[i]) || push(argv, &n, store[s++])) return -1;
    }
    if (push(argv, &n, l->sp ? "--sequence-parallel" : "--no-sequence-parallel")) return -1;
    if (l->schedule >= 0 &&
        (push(argv, &n, "--schedule") || push(argv, &n, tr_pp_kind_name((tr_pp_kind)l->schedule))))
        return -1;
    return 0;
}

/* Why a run failed, from its stderr: the trainer's own lines (they start with "trainer" or
 * name a file, "recipe.lua:3: ..."), else the last lines (a launcher's). */
static void show_errors(const char *path) {
    char lines[4][512], line[512];
    int n = 0, own = 0;
    for (int pass = 0; pass < 2 && !own; pass++) {
        FILE *f = fopen(path, "r");
        n = 0;
        while (f && fgets(line, sizeof(line), f)) {
            int mine = !strncmp(line, "trainer", 7) || strstr(line, ".lua:");
            if (pass == 0 ? mine : line[0] != '\n' && line[0] != ' ' && strncmp(line, "---", 3))
                snprintf(lines[n++ % 4], sizeof(lines[0]), "%s", line);
        }
        if (f) fclose(f);
        own = n > 0;
        for (int i = n > 4 ? n - 4 : 0; i < n; i++)
            fprintf(stderr, "  %s", lines[i % 4]);
    }
}

/* Run one side into OUT/side (its log, its run folder, its tensors): 0, or -1 after lines. */
static int run_side(const check_opts *o, const check_layout *l, const char *self, const char *out,
                    const char *side, const char *perturb) {
    char dir[TR_PATH_MAX], run[TR_PATH_MAX + 8], tensors[TR_PATH_MAX + 16], log[TR_PATH_MAX + 8],
        errs[TR_PATH_MAX + 16];
    char *argv[MAX_ARGS], store[4][32], launch[1024], err[512];
    snprintf(dir, sizeof(dir), "%s/%s", out, side);
    snprintf(run, sizeof(run), "%s/run", dir);
    snprintf(tensors, sizeof(tensors), "%s/tensors", dir);
    snprintf(log, sizeof(log), "%s/log.txt", dir);
    snprintf(errs, sizeof(errs), "%s/stderr.txt", dir);
    if (tr_mkdirs(dir, err, sizeof(err))) {
        fprintf(stderr, "trainer check: %s\n", err);
        return -1;
    }
    if (side_argv(o, l, self, run, argv, store, launch)) {
        fprintf(stderr, "trainer check: --launcher has too many words\n");
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644),
            fe = open(errs, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || fe < 0) _exit(126);
        dup2(fd, 1), dup2(fe, 2), close(fd), close(fe);
        setenv("TR_DUMP_TENSORS", tensors, 1);
        if (geteuid() == 0) { /* mpirun refuses root without both; other launchers ignore them */
            setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
            setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
        }
        /* a check's model is small: more processes than cores only run slower (Open MPI
           refuses them by default, with a page of help) */
        if (!o->launcher) setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
        if (perturb)
            setenv("TR_FAULT_PERTURB", perturb, 1);
        else
            unsetenv("TR_FAULT_PERTURB");
        execvp(argv[0], argv);
        fprintf(stderr, "trainer check: cannot start '%s': %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0) {
        fprintf(stderr, "trainer check: cannot start the --%s run: %s\n", side, strerror(errno));
        return -1;
    }
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    fprintf(stderr, "trainer check: the --%s run (%s) failed (%s %d), saying (%s):\n", side,
            l->text, WIFEXITED(st) ? "exit" : "signal",
            WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), errs);
    show_errors(errs);
    return -1;
}

/* ---- the comparison ---------------------------------------------------------------------- */

typedef struct {
    char kind[16], name[TR_PARAM_NAME_MAX];
    long rows, cols;
    long off; /* floats before it in tensors.bin */
} tensor_entry;

typedef struct {
    tensor_entry *t;
    int n;
    FILE *bin;
} dump;

/* OUT/side/tensors/tensors.{tsv,bin}: 0, or -1 after one line. */
static int read_dump(dump *d, const char *out, const char *side) {
    char tsv[TR_PATH_MAX + 48], bin[TR_PATH_MAX + 48], line[512];
    snprintf(tsv, sizeof(tsv), "%s/%s/tensors/tensors.tsv", out, side);
    snprintf(bin, sizeof(bin), "%s/%s/tensors/tensors.bin", out, side);
    FILE *f = fopen(tsv, "r");
    d->bin = fopen(bin, "rb");
    if (!f || !d->bin) {
        fprintf(stderr, "trainer check: the --%s run wrote no tensors: cannot read '%s': %s\n",
                side, f ? bin : tsv, strerror(errno));
        if (f) fclose(f);
        return -1;
    }
    long off = 0;
    int cap = 0;
    while (fgets(line, sizeof(line), f)) {
        if (d->n == cap) {
            tensor_entry *t = realloc(d->t, (size_t)(cap = cap ? 2 * cap : 256) * sizeof(*t));
            if (!t) break;
            d->t = t;
        }
        tensor_entry *e = &d->t[d->n];
        if (sscanf(line, "%15s %127s %ld %ld", e->kind, e->name, &e->rows, &e->cols) != 4) {
            fprintf(stderr, "trainer check: %s: line %d is not 'KIND NAME ROWS COLS'\n", tsv,
                    d->n + 1);
            fclose(f);
            return -1;
        }
        e->off = off;
        off += e->rows * e->cols;
        d->n++;
    }
    fclose(f);
    return 0;
}

static float *load(const dump *d, const tensor_entry *e) {
    size_t n = (size_t)(e->rows * e->cols);
    float *v = malloc((n ? n : 1) * sizeof(float));
    if (v && (fseek(d->bin, e->off * (long)sizeof(float), SEEK_SET) ||
              fread(v, sizeof(float), n, d->bin) != n)) {
        free(v);
        return NULL;
    }
    return v;
}

/* max |a - b| / max(max |a|, max |b|) (0 when both are zero; infinite with a NaN). */
static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double x = a[i], y = b[i], e = fabs(x - y);
        if (isnan(e)) return INFINITY;
        if (e > d) d = e;
        if (fabs(x) > m) m = fabs(x);
        if (fabs(y) > m) m = fabs(y);
    }
    return d > 0 ? d / m : 0;
}

/* The table, and the verdict: 0 all agree, 1 some differ, -1 a dump could not be read. */
static int compare(const check_opts *o, const dump *a, const dump *b) {
    int differ = 0, first = -1, worst = -1;
    double worst_d = -1, first_d = 0;
    printf("%-10s %-44s %-13s %-12s\n", "kind", "tensor", "shape", "max rel diff");
    for (int i = 0; i < a->n; i++) {
        const tensor_entry *e = &a->t[i], *f = NULL;
        for (int j = 0; j < b->n && !f; j++)
            if (!strcmp(b->t[j].kind, e->kind) && !strcmp(b->t[j].name, e->name)) f = &b->t[j];
        char shape[40];
        snprintf(shape, sizeof(shape), "%ld x %ld", e->rows, e->cols);
        double d = INFINITY;
        const char *why = "";
        if (!f) {
            why = " (not in --b)";
        } else if (f->rows != e->rows || f->cols != e->cols) {
            why = " (another shape in --b)";
        } else {
            float *x = load(a, e), *y = load(b, f);
            if (!x || !y) {
                free(x), free(y);
                fprintf(stderr, "trainer check: cannot read %s %s from the dumps\n", e->kind,
                        e->name);
                return -1;
            }
            d = rel_diff(x, y, (size_t)(e->rows * e->cols));
            free(x), free(y);
        }
        int ok = d <= o->tol;
        printf("%-10s %-44s %-13s %-12.3g %s%s\n", e->kind, e->name, shape, d, ok ? "ok" : "FAIL",
               why);
        if (!ok && first < 0) first = i, first_d = d;
        if (d > worst_d) worst_d = d, worst = i;
        differ += !ok;
    }
    int extra = 0;
    for (int j = 0; j < b->n; j++) {
        int found = 0;
        for (int i = 0; i < a->n && !found; i++)
            found = !strcmp(b->t[j].kind, a->t[i].kind) && !strcmp(b->t[j].name, a->t[i].name);
        if (!found) printf("%-10s %-44s only in --b: FAIL\n", b->t[j].kind, b->t[j].name), extra++;
    }
    if (first >= 0) {
        printf("first tensor beyond %.3g: %s %s (max rel diff %.3g); %d of %d tensors differ\n",
               o->tol, a->t[first].kind, a->t[first].name, first_d, differ, a->n);
        return 1;
    }
    if (extra) {
        printf("%d tensors of --b are not in --a\n", extra);
        return 1;
    }
    printf("all %d tensors agree within %.3g", a->n, o->tol);
    if (worst >= 0) printf(" (largest %.3g: %s %s)", worst_d, a->t[worst].kind, a->t[worst].name);
    printf("\n");
    return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* The model's own refusal of a side's layout, before any process starts (a launcher's refusal
 * of many processes would hide it): the recipe, with the --set knobs, resolved for the side's
 * dp x tp x pp processes as `trainer run` would. 0, or -1 after one line naming the side. */
static int side_layout_ok(const check_opts *o, const check_layout *l, const char *flag) {
    tr_options to = {.recipe = o->recipe, .layout = {.dp = l->dp, .tp = l->tp, .pp = l->pp,
                                                    .zero = l->zero, .schedule = l->schedule,
                                                    .sequence_parallel = l->sp ? 1 : -1}};
    char err[1024];
    for (int i = 0; i < o->n_sets; i++)
        if (tr_knob_set_parse(&to.sets[to.n_sets++], o->sets[i], err, sizeof(err))) {
            fprintf(stderr, "trainer check: --set: %s\n", err);
            return -1;
        }
    if (l->cuda) to.layout.pad_vocab = TR_CUDA_PAD_VOCAB;
    tr_recipe r;
    tr_layout lay;
    int rc = tr_load_recipe_msg(&r, &to, "check", err, sizeof(err));
    if (!rc) {
        rc = tr_resolve_layout(&lay, &r, &to, l->dp * l->tp * l->pp, tr_backend_cpu(), "check",
                               err, sizeof(err));
        tr_recipe_free(&r);
    }
    if (rc) fprintf(stderr, "trainer check: %s %s: %s\n", flag, l->text, err);
    return rc ? -1 : 0;
}

int tr_cmd_check(int argc, char **argv) {
    check_opts o;
    int rc = parse_check(&o, argc, argv);
    if (rc > 0) {
        fputs(check_help, stdout);
        return 0;
    }
    if (rc < 0 || side_layout_ok(&o, &o.a, "--a") || side_layout_ok(&o, &o.b, "--b")) return 2;
    char self[TR_PATH_MAX], out[TR_PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
        fprintf(stderr, "trainer check: cannot find this binary (/proc/self/exe): %s\n",
                strerror(errno));
        return 2;
    }
    self[n] = 0;
    const char *tmp = getenv("TMPDIR");
    char err[512];
    snprintf(out, sizeof(out), "%s/trainer-check-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (o.out && tr_mkdirs(o.out, err, sizeof(err))) {
        fprintf(stderr, "trainer check: --out: %s\n", err);
        return 2;
    }
    if (!o.out && !mkdtemp(out)) {
        fprintf(stderr, "trainer check: cannot make a folder '%s': %s\n", out, strerror(errno));
        return 2;
    }
    if (o.out) snprintf(out, sizeof(out), "%s", o.out);
    const char *perturb = getenv("TR_FAULT_PERTURB"); /* tests: the --b run only */
    printf("trainer check: %s, --a %s, --b %s, tolerance %.3g\n", o.recipe, o.a.text, o.b.text,
           o.tol);
    fflush(stdout);
    dump da = {0}, db = {0};
    rc = run_side(&o, &o.a, self, out, "a", NULL) || run_side(&o, &o.b, self, out, "b", perturb) ||
                 read_dump(&da, out, "a") || read_dump(&db, out, "b")
             ? -1
             : compare(&o, &da, &db);
    free(da.t), free(db.t);
    if (da.bin) fclose(da.bin);
    if (db.bin) fclose(db.bin);
    if (rc < 0)
        fprintf(stderr, "trainer check: the runs are kept in %s\n", out);
    else if (!o.out)
        nftw(out, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc < 0 ? 2 : rc;
}
