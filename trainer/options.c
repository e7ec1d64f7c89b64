/* The options the subcommands that read a recipe share (tr_options, trainer/trainer.h):
 * parsed and checked here, once, below every subcommand; each mistake is one line naming the
 * flag, on stderr or into a message (tr_parse_options_msg: for a caller that says it its own
 * way, as supervise and every rank of a run do). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm/env.h"
#include "parallel/schedule.h"
#include "trainer/trainer.h"

/* Where option mistakes go: stderr, or a buffer (tr_parse_options_msg). */
static FILE *perr_stream;
static FILE *perr(void) {
    return perr_stream ? perr_stream : stderr;
}

static int need_value(const char *cmd, const char *flag, int i, int argc) {
    if (i + 1 >= argc) {
        fprintf(perr(), "trainer %s: %s needs a value (see trainer %s --help)\n", cmd, flag, cmd);
        return -1;
    }
    return 0;
}

static int parse_int(const char *cmd, const char *flag, const char *s, int min, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < min || v > 1000000000L) {
        fprintf(perr(), "trainer %s: %s needs a %s integer, got '%s'\n", cmd, flag,
                min > 0 ? "positive" : "non-negative", s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* A real number from lo to hi, `what` naming it and its range in the refusal. */
static int parse_real(const char *cmd, const char *flag, const char *s, const char *what,
                      double lo, double hi, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || !(v >= lo && v <= hi)) {
        fprintf(perr(), "trainer %s: %s needs %s, got '%s'\n", cmd, flag, what, s);
        return -1;
    }
    *out = v;
    return 0;
}

int tr_parse_options(tr_options *o, const char *cmd, int argc, char **argv, int first) {
    memset(o, 0, sizeof(*o));
    o->eval_every = o->sample_tokens = o->layout.dp = o->layout.tp = o->layout.zero = o->layout.schedule = -1;
    char err[256];
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        if (!strcmp(a, "--set") || !strncmp(a, "--set=", 6)) {
            const char *v = a[5] == '=' ? a + 6 : NULL;
            if (!v) {
                if (need_value(cmd, a, i, argc)) return -1;
                v = argv[++i];
            }
            if (o->n_sets == TR_MAX_SETS) {
                fprintf(perr(), "trainer %s: more than %d --set options\n", cmd, TR_MAX_SETS);
                return -1;
            }
            if (tr_knob_set_parse(&o->sets[o->n_sets], v, err, sizeof(err))) {
                fprintf(perr(), "trainer %s: %s\n", cmd, err);
                return -1;
            }
            o->n_sets++;
        } else if (!strcmp(a, "--steps")) {
            if (need_value(cmd, a, i, argc) || parse_int(cmd, a, argv[++i], 1, &o->steps))
                return -1;
        } else if (!strcmp(a, "--micro-batch")) {
            if (need_value(cmd, a, i, argc) || parse_int(cmd, a, argv[++i], 1, &o->layout.micro_batch))
                return -1;
        } else if (!strcmp(a, "--eval-every")) {
            if (need_value(cmd, a, i, argc) || parse_int(cmd, a, argv[++i], 0, &o->eval_every))
                return -1;
        } else if (!strcmp(a, "--sample-tokens")) {
            if (need_value(cmd, a, i, argc) || parse_int(cmd, a, argv[++i], 0, &o->sample_tokens))
                return -1;
            if (o->sample_tokens > TR_MAX_SAMPLE_TOKENS) { /* as train.sample_tokens */
                fprintf(perr(), "trainer %s: --sample-tokens must be at most %d, got '%s'\n", cmd,
                        TR_MAX_SAMPLE_TOKENS, argv[i]);
                return -1;
            }
        } else if (!strcmp(a, "--device") || !strcmp(a, "--precision")) {
            if (need_value(cmd, a, i, argc)) return -1;
            const char *v = argv[++i];
            int dev = a[2] == 'd';
            if (dev ? strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda")
                    : strcmp(v, "bf16") && strcmp(v, "fp32")) {
                fprintf(perr(), "trainer %s: %s must be %s, got '%s'\n", cmd, a,
                        dev ? "auto, cpu or cuda" : "bf16 or fp32", v);
                return -1;
            }
            if (dev)
                o->device = v;
            else
                o->precision = v;
        } else if (!strcmp(a, "--resume")) {
            o->resume = 1;
        } else if (!strcmp(a, "--overwrite")) {
            o->overwrite = 1;
        } else if (!strcmp(a, "--progress")) {
            if (need_value(cmd, a, i, argc)) return -1;
            o->progress = argv[++i];
            if (strcmp(o->progress, "tty") && strcmp(o->progress, "lines")) {
                fprintf(perr(), "trainer %s: --progress must be tty or lines, got '%s'\n", cmd,
                        o->progress);
                return -1;
            }
        } else if (!strcmp(a, "--trace")) {
            if (need_value(cmd, a, i, argc) || parse_int(cmd, a, argv[++i], 1, &o->trace))
                return -1;
        } else if (!strcmp(a, "--timeout")) {
            if (need_value(cmd, a, i, argc)) return -1;
            char *end;
            o->timeout = strtod(argv[++i], &end);
            if (*end != '\0' || !(o->timeout > 0)) {
                fprintf(perr(),
                        "trainer %s: --timeout needs a positive number of seconds, got "
                        "'%s'\n",
                        cmd, argv[i]);
                return -1;
            }
        } else if (!strcmp(a, "--dp") || !strcmp(a, "--tp")) {
            if (need_value(cmd, a, i, argc) ||
                parse_int(cmd, a, argv[++i], 1, a[2] == 'd' ? &o->layout.dp : &o->layout.tp))
                return -1;
        } else if (!strcmp(a, "--pp") || !strcmp(a, "--microbatches") ||
                   !strcmp(a, "--virtual-stages")) {
            int *dst = a[2] == 'p' ? &o->layout.pp : a[2] == 'm' ? &o->layout.microbatches : &o->layout.virtual_stages;
            if (need_value(cmd, a, i, argc) || parse_int(cmd, a, argv[++i], 1, dst)) return -1;
        } else if (!strcmp(a, "--schedule")) {
            if (need_value(cmd, a, i, argc)) return -1;
            o->layout.schedule = tr_pp_kind_parse(argv[++i]);
            if (o->layout.schedule < 0) {
                fprintf(
                    perr(),
                    "trainer %s: --schedule must be gpipe, 1f1b, interleaved, zb-h1 or zb-v, got "
                    "'%s'\n",
                    cmd, argv[i]);
                return -1;
            }
        } else if (!strcmp(a, "--sequence-parallel")) {
            o->layout.sequence_parallel = 1;
        } else if (!strcmp(a, "--no-sequence-parallel")) {
            o->layout.sequence_parallel = -1;
        } else if (!strcmp(a, "--private-gradients")) {
            o->layout.private_gradients = 1;
        } else if (!strcmp(a, "--orgs")) {
            if (need_value(cmd, a, i, argc)) return -1;
            o->orgs = argv[++i];
        } else if (!strcmp(a, "--zero")) { /* the stage is checked by the layout */
            if (need_value(cmd, a, i, argc) || parse_int(cmd, a, argv[++i], 0, &o->layout.zero)) return -1;
        } else if (!strcmp(a, "--out")) {
            if (need_value(cmd, a, i, argc)) return -1;
            o->out = argv[++i];
        } else if (!strcmp(a, "--peak-gflops")) {
            if (need_value(cmd, a, i, argc) ||
                parse_real(cmd, a, argv[++i], "a rate in GFLOP/s from 0.001 to 1e9", 1e-3, 1e9,
                           &o->peak_gflops))
                return -1;
        } else if (!strcmp(a, "--memory-mib")) {
            if (need_value(cmd, a, i, argc) ||
                parse_real(cmd, a, argv[++i], "MiB per process from 1 to 1e9", 1, 1e9,
                           &o->memory_mib))
                return -1;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(perr(), "trainer %s: unknown option '%s' (see trainer %s --help)\n", cmd, a,
                    cmd);
            return -1;
        } else if (!o->recipe) {
            o->recipe = a;
        } else {
            fprintf(perr(), "trainer %s: unexpected argument '%s' (one recipe only)\n", cmd, a);
            return -1;
        }
    }
    if (!o->recipe) {
        fprintf(perr(), "trainer %s: no recipe given (see trainer %s --help)\n", cmd, cmd);
        return -1;
    }
    long pad = 0; /* checked with the flags, so that every subcommand refuses it alike */
    if (tr_env_int("TR_PAD_VOCAB", 1, TR_PAD_VOCAB_MAX, &pad, err, sizeof err) < 0) {
        fprintf(perr(), "trainer %s: %s\n", cmd, err);
        return -1;
    }
    o->layout.pad_vocab = (int)pad;
    if (o->resume && o->overwrite) {
        fprintf(perr(),
                "trainer %s: --resume continues the run in the output folder and "
                "--overwrite replaces it: give one of them\n",
                cmd);
        return -1;
    }
    return 0;
}

int tr_parse_options_msg(tr_options *o, const char *cmd, int argc, char **argv, int first,
                         char *msg, size_t msglen) {
    char *buf = NULL;
    size_t len = 0;
    perr_stream = open_memstream(&buf, &len);
    int rc = tr_parse_options(o, cmd, argc, argv, first);
    if (perr_stream) fclose(perr_stream);
    perr_stream = NULL;
    if (buf && len && buf[len - 1] == '\n') buf[len - 1] = 0;
    snprintf(msg, msglen, "%s", buf ? buf : "");
    free(buf);
    return rc;
}
