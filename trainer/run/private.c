/* Private gradients at a run's start (parallel/masked.h): every rank's organisation, from
 * --orgs FILE (lines "HOST ORG", # comments; every host of the job must be in it) or else its
 * own host, before the plan (which keeps tensor and pipeline groups inside one); once the
 * groups exist, they are checked to stay inside one (only the data-parallel sums are
 * masked), and the dp group agrees its keys. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/run/run.h"

/* Rank 0 reads FILE and the text goes to every rank (the file need not be on every host):
 * the organisation of `host` into org, or one line in x->msg. -1 on every rank when any
 * rank's fails. */
static int read_orgs(run_ctx *x, const char *host, char *org) {
    char *text = NULL;
    size_t len = 0;
    int bad = 0, rc = tr_comm_read_file(x->world, 0, x->o.orgs, 1 << 20, &text, &len);
    if (rc > 0) {
        snprintf(x->msg, sizeof(x->msg),
                 "trainer run: --orgs %s: cannot read it (a file of "
                 "\"HOST ORG\" lines, at most 1 MiB)",
                 x->o.orgs);
        run_setup_failed(x->world, x->rank == 0, x->msg); /* rank 0 says why */
        return -1;
    }
    if (rc < 0) {
        run_setup_failed(x->world, 1, "trainer run: out of memory for --orgs");
        return -1;
    }
    org[0] = 0;
    int line = 0;
    for (char *l = text, *end; l && *l && !bad; l = end ? end + 1 : NULL) {
        end = strchr(l, '\n');
        if (end) *end = 0;
        line++;
        char h[TR_HOST_LEN], o[TR_HOST_LEN], more[2];
        char *hash = strchr(l, '#');
        if (hash) *hash = 0;
        int got = sscanf(l, "%63s %63s %1s", h, o, more);
        if (got <= 0) continue;
        if (got != 2) {
            snprintf(x->msg, sizeof(x->msg), "trainer run: --orgs %s:%d: expected \"HOST ORG\", "
                     "got '%.80s'", x->o.orgs, line, l);
            bad = 1;
        } else if (!strcmp(h, host)) {
            snprintf(org, TR_HOST_LEN, "%s", o);
        }
    }
    free(text);
    if (!bad && !org[0]) {
        snprintf(x->msg, sizeof(x->msg), "trainer run: --orgs %s: host %s (rank %d) is in no "
                 "organisation: every host of the job needs a \"HOST ORG\" line", x->o.orgs,
                 host, x->rank);
        bad = 1;
    }
    return run_setup_failed(x->world, bad, x->msg) ? -1 : 0;
}

/* An organisation other than this rank's among group g's (into other), or none: 0. */
static int group_spans_orgs(const run_ctx *x, tr_comm *g, char *other) {
    int n = tr_comm_size(g), spans = 0;
    const char *mine = x->orgs + (size_t)x->rank * TR_HOST_LEN;
    char *all = n > 1 ? calloc((size_t)n, TR_HOST_LEN) : NULL;
    if (!all) return 0;
    tr_comm_all_gather(g, mine, all, TR_HOST_LEN, TR_COMM_BYTE);
    for (int k = 0; k < n && !spans; k++)
        if (strncmp(all + (size_t)k * TR_HOST_LEN, mine, TR_HOST_LEN)) {
            snprintf(other, TR_HOST_LEN, "%s", all + (size_t)k * TR_HOST_LEN);
            spans = 1;
        }
    free(all);
    return spans;
}

int run_private_orgs(run_ctx *x) {
    if (!tr_private_asked(&x->o.layout, &x->r.parallel))
        return run_setup_failed(x->world, x->o.orgs != NULL,
                                "trainer run: --orgs names the organisations of private "
                                "gradients: give --private-gradients or parallel { "
                                "private_gradients = true } too");
    char host[TR_HOST_LEN], org[TR_HOST_LEN];
    tr_hostname(host, sizeof host);
    snprintf(org, sizeof org, "%s", host);
    if (x->o.orgs && read_orgs(x, host, org)) return -1;
    x->orgs = calloc((size_t)x->nranks, TR_HOST_LEN);
    if (run_setup_failed(x->world, !x->orgs, "trainer run: out of memory for the organisations"))
        return -1;
    tr_comm_all_gather(x->world, org, x->orgs, TR_HOST_LEN, TR_COMM_BYTE);
    return 0;
}

void run_private_cluster(const run_ctx *x, tr_cluster *c) {
    tr_cluster_hosts *h = &c->hosts;
    for (int r = 0; x->orgs && x->o.orgs && r < h->n_ranks && r < x->nranks; r++)
        snprintf(h->org[h->host_of[r]], sizeof h->org[0], "%s",
                 x->orgs + (size_t)r * TR_HOST_LEN);
}

int run_private_setup(run_ctx *x) {
    const char *org = x->orgs + (size_t)x->rank * TR_HOST_LEN;
    const char *what = x->o.orgs ? "organisations" : "hosts";
    tr_comm *g[2] = {x->tpc, x->ppc};
    const char *name[2] = {"tensor", "pipeline"};
    char other[TR_HOST_LEN] = "";
    int bad = 0;
    for (int i = 0; i < 2; i++) /* both gathers on every rank */
        if (group_spans_orgs(x, g[i], other) && !bad) {
            snprintf(x->msg, sizeof(x->msg),
                     "%s: private_gradients masks the data-parallel sums only, but this rank's "
                     "%s-parallel group spans %s %s and %s: its activations would cross "
                     "between them in the clear (keep tp x pp inside one)",
                     x->r.path, name[i], what, org, other);
            bad = 1;
        }
    if (run_setup_failed(x->world, bad, x->msg)) return -1;
    int peers = 0;
    bad = tr_dp_set_private(x->dp, org, &x->private_orgs, &peers, x->err, sizeof(x->err));
    snprintf(x->msg, sizeof(x->msg), "trainer run: %s", x->err);
    return run_setup_failed(x->world, bad, x->msg);
}
