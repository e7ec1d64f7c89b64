/* The census of who is waiting, when a wait times out, and the end of the job: comm/mpi.c's
 * deadlines and comm/device.c's watchdog end here (parallel/comm/census.h).
 *
 * Every wait answers census requests on a private duplicate of the world at once. A rank whose
 * wait times out asks every other rank and gives them CENSUS_S seconds: the ones that do not
 * answer are not waiting on communication (computing, stuck, or dead), and its line names
 * them (a rank merely slower than the timeout is one of them: it answers only once it comes
 * back to communicate, too late). When every rank answers, all of them are waiting:
 * collectives that do not match. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parallel/comm/census.h"
#include "parallel/comm/private.h"

static void (*g_on_abort)(int silent_rank, const char *why);
static char *g_hosts; /* world rank k's host at k * HOST_LEN (tr_comm_set_host_names), or NULL */
static int g_nhosts;
enum { HOST_LEN = 64 };

void tr_comm_set_host_names(const char *names, int n, size_t stride) {
    char *h = calloc((size_t)(n > 0 ? n : 1), HOST_LEN);
    if (!h) return; /* the lines name ranks only */
    for (int k = 0; k < n; k++)
        snprintf(h + (size_t)k * HOST_LEN, HOST_LEN, "%s", names + (size_t)k * stride);
    free(g_hosts);
    g_hosts = h, g_nhosts = n;
}

void tr_comm_on_abort(void (*fn)(int silent_rank, const char *why)) {
    g_on_abort = fn;
}

void tr_census_tell_abort(int silent_rank, const char *line) {
    if (g_on_abort) g_on_abort(silent_rank, line);
}

#ifdef TR_HAVE_MPI
#define CENSUS_S 0.5 /* a waiting rank answers within a millisecond or so (its poll interval);
                       a rank that is late to this collective by more than this is named */
enum { CENSUS_ASK = 1, CENSUS_ANSWER = 2 };
static MPI_Comm g_census = MPI_COMM_NULL;
static int g_census_me; /* the buffer of every answer and question: sent, never changed */

int tr_census_open(MPI_Comm world) {
    if (MPI_Comm_dup(world, &g_census) != MPI_SUCCESS) {
        g_census = MPI_COMM_NULL;
        return -1;
    }
    MPI_Comm_set_errhandler(g_census, MPI_ERRORS_RETURN);
    MPI_Comm_rank(g_census, &g_census_me);
    return 0;
}

void tr_census_close(void) {
    if (g_census != MPI_COMM_NULL) MPI_Comm_free(&g_census);
    free(g_hosts);
    g_hosts = NULL, g_nhosts = 0;
}

void tr_census_serve(void) {
    if (g_census == MPI_COMM_NULL) return;
    for (;;) {
        int flag = 0, q;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, CENSUS_ASK, g_census, &flag, &st) != MPI_SUCCESS || !flag)
            return;
        MPI_Recv(&q, 1, MPI_INT, st.MPI_SOURCE, CENSUS_ASK, g_census, MPI_STATUS_IGNORE);
        MPI_Request r;
        if (MPI_Isend(&g_census_me, 1, MPI_INT, st.MPI_SOURCE, CENSUS_ANSWER, g_census, &r) ==
            MPI_SUCCESS)
            MPI_Request_free(&r);
    }
}

/* World rank k's host, "" when not known. */
static const char *host_of(int k) {
    return g_hosts && k >= 0 && k < g_nhosts ? g_hosts + (size_t)k * HOST_LEN : "";
}

/* The ranks that did not answer, as "1, 3" in buf, each run of ranks on one host followed by
 * " (host NAME)" when the hosts are known ("2, 3 (host b), 6 (host c)"); how many. -1: no
 * census possible. */
static int census(char *buf, size_t len) {
    int n = 0, silent = 0;
    if (g_census == MPI_COMM_NULL || MPI_Comm_size(g_census, &n) != MPI_SUCCESS || n < 2)
        return -1;
    int *ans = calloc((size_t)n, sizeof(int)), *got = calloc((size_t)n, sizeof(int));
    MPI_Request *rr = calloc((size_t)n, sizeof(MPI_Request));
    if (!ans || !got || !rr) {
        free(ans), free(got), free(rr);
        return -1;
    }
    for (int k = 0; k < n; k++) {
        rr[k] = MPI_REQUEST_NULL;
        if (k == g_census_me) continue;
        MPI_Irecv(&ans[k], 1, MPI_INT, k, CENSUS_ANSWER, g_census, &rr[k]);
        MPI_Request sr;
        if (MPI_Isend(&g_census_me, 1, MPI_INT, k, CENSUS_ASK, g_census, &sr) == MPI_SUCCESS)
            MPI_Request_free(&sr);
    }
    double deadline = tr_now() + CENSUS_S;
    for (int left = n - 1; left > 0 && tr_now() < deadline;) {
        for (int k = 0; k < n; k++) {
            int flag = 0;
            if (k == g_census_me || got[k]) continue;
            if (MPI_Test(&rr[k], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) got[k] = 1, left--;
        }
        tr_census_serve(); /* another rank may be taking its census now */
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    size_t k0 = 0;
    buf[0] = 0;
    int last = -1; /* the previous silent rank */
    for (int k = 0; k <= n; k++) {
        int is = k < n && k != g_census_me && !got[k];
        const char *h = last >= 0 ? host_of(last) : "";
        int w = 0;
        if (*h && (k == n || (is && strcmp(host_of(k), h)))) /* the run of ranks on h ends */
            w = snprintf(buf + k0, len > k0 ? len - k0 : 0, " (host %s)", h);
        if (w > 0 && k0 + (size_t)w < len) k0 += (size_t)w;
        if (!is) continue;
        w = snprintf(buf + k0, len > k0 ? len - k0 : 0, "%s%d", silent ? ", " : "", k);
        if (w > 0 && k0 + (size_t)w < len) k0 += (size_t)w;
        silent++, last = k;
    }
    /* ans and rr stay allocated: a late answer may still land in ans, and the job ends now */
    free(got);
    return silent;
}

/* The census, the one line naming what waited and who did not answer, and the end of the
 * job; called holding comm/mpi.c's lock. `before` (the device transport aborting its NCCL
 * communicators) runs only should MPI_Abort return: an aborted communicator releases this
 * process's waits, and its training thread would go on with results that never arrived (a
 * checkpoint of them, even) until the launcher's kill; dying processes take their kernels
 * with them. */
void tr_census_die(const char *d, void (*before)(void)) {
    char who[512], why[640];
    int silent = census(who, sizeof who);
    if (silent > 0)
        snprintf(why, sizeof why, "rank%s %s did not answer (busy outside communication, stuck "
                 "or dead; the others are waiting)", silent > 1 ? "s" : "", who);
    else if (silent == 0)
        snprintf(why, sizeof why, "every rank is waiting on communication: collectives that do "
                 "not match");
    else
        snprintf(why, sizeof why, "a rank died or is stuck");
    fprintf(stderr, "trainer: rank %d: %s did not complete within %g s: %s; aborting\n",
            tr_comm_world_rank(), d, tr_comm_timeout(), why);
    fflush(stderr);
    char line[1024];
    snprintf(line, sizeof line, "%s did not complete within %g s: %s", d, tr_comm_timeout(), why);
    tr_census_tell_abort(silent > 0 ? atoi(who) : -1, line);
    MPI_Abort(MPI_COMM_WORLD, 1);
    if (before) before();
    abort();
}

#endif
