/* The supervisor as a witness of who is still connected (trainer/ops/witness.h). IPv4: the
 * supervisor listens on all of its host's addresses and lists them, loopback last; a rank tries
 * them in that order. A report is one line, "NONCE ATTEMPT RANK": the nonce, fresh for each
 * supervisor, keeps a stale OUT/supervise.addr from reaching whatever listens on that port
 * now. */
#define _GNU_SOURCE /* accept4; IFF_UP and IFF_LOOPBACK in net/if.h */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "trainer/ops/witness.h"
#include "trainer/trainer.h"

enum { MAX_ADDRS = 16 };

struct tr_witness {
    int fd;
    unsigned long long nonce;
    char path[TR_PATH_MAX + 32];
};

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* This host's IPv4 addresses as text, loopback last, space-separated in buf; how many. */
static int host_addresses(char *buf, size_t len) {
    struct ifaddrs *all;
    int n = 0;
    size_t at = 0;
    buf[0] = 0;
    if (getifaddrs(&all)) return 0;
    for (int loop = 0; loop < 2; loop++)
        for (struct ifaddrs *i = all; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
                !!(i->ifa_flags & IFF_LOOPBACK) != loop || n >= MAX_ADDRS)
                continue;
            char a[INET_ADDRSTRLEN];
            if (!inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, a, sizeof a))
                continue;
            int w = snprintf(buf + at, len - at, " %s", a);
            if (w < 0 || at + (size_t)w >= len) break;
            at += (size_t)w, n++;
        }
    freeifaddrs(all);
    return n;
}

tr_witness *tr_witness_listen(const char *out, char *err, size_t elen) {
    tr_witness *w = calloc(1, sizeof(*w));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t sl = sizeof sa;
    char addrs[MAX_ADDRS * (INET_ADDRSTRLEN + 1) + 1], tmp[TR_PATH_MAX + 40];
    if (!w) {
        snprintf(err, elen, "out of memory");
        return NULL;
    }
    w->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (w->fd < 0 || bind(w->fd, (struct sockaddr *)&sa, sizeof sa) || listen(w->fd, 64) ||
        getsockname(w->fd, (struct sockaddr *)&sa, &sl)) {
        snprintf(err, elen, "cannot listen on a TCP port: %s", strerror(errno));
        goto fail;
    }
    if (!host_addresses(addrs, sizeof addrs)) {
        snprintf(err, elen, "this host has no IPv4 address");
        goto fail;
    }
    if (getrandom(&w->nonce, sizeof w->nonce, 0) != (ssize_t)sizeof w->nonce)
        w->nonce = (unsigned long long)getpid() * 2654435761ull ^ (unsigned long long)time(NULL);
    snprintf(w->path, sizeof w->path, "%s/supervise.addr", out);
    snprintf(tmp, sizeof tmp, "%s.tmp", w->path);
    FILE *f = fopen(tmp, "w");
    int bad = !f || fprintf(f, "%u %llx%s\n", ntohs(sa.sin_port), w->nonce, addrs) < 0;
    if (f && fclose(f)) bad = 1;
    if (bad || rename(tmp, w->path)) {
        snprintf(err, elen, "cannot write %s: %s", w->path, strerror(errno));
        unlink(tmp);
        w->path[0] = 0;
        goto fail;
    }
    return w;
fail:
    tr_witness_close(w);
    return NULL;
}

/* One report from connection c (it is sent at once on connecting: 200 ms at most). */
static void read_report(tr_witness *w, int c, void (*fn)(void *, int, int), void *ctx) {
    char line[128];
    size_t got = 0;
    double end = mono_now() + 0.2;
    while (got < sizeof line - 1 && !memchr(line, '\n', got)) {
        struct pollfd p = {.fd = c, .events = POLLIN};
        int ms = (int)((end - mono_now()) * 1000);
        if (ms <= 0 || poll(&p, 1, ms) <= 0) break;
        ssize_t r = recv(c, line + got, sizeof line - 1 - got, 0);
        if (r <= 0) break;
        got += (size_t)r;
    }
    line[got] = 0;
    unsigned long long nonce;
    int attempt, rank;
    if (sscanf(line, "%llx %d %d", &nonce, &attempt, &rank) == 3 && nonce == w->nonce &&
        attempt > 0 && rank >= 0)
        fn(ctx, attempt, rank);
}

void tr_witness_collect(tr_witness *w, void (*fn)(void *ctx, int attempt, int rank), void *ctx) {
    if (!w) return;
    for (int c; (c = accept4(w->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0; close(c))
        read_report(w, c, fn, ctx);
}

void tr_witness_close(tr_witness *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (w->path[0]) unlink(w->path);
    free(w);
}

/* ---- the rank's side ---------------------------------------------------------------------- */

static struct {
    int n;
    struct sockaddr_in addr[MAX_ADDRS];
    unsigned long long nonce;
} g_sup;

int tr_witness_prepare(const char *out) {
    char path[TR_PATH_MAX + 32], line[MAX_ADDRS * (INET_ADDRSTRLEN + 1) + 64];
    snprintf(path, sizeof path, "%s/supervise.addr", out);
    g_sup.n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char *ok = fgets(line, sizeof line, f);
    fclose(f);
    unsigned port;
    int at = 0;
    if (!ok || sscanf(line, "%u %llx%n", &port, &g_sup.nonce, &at) != 2 || !port || port > 65535)
        return 0;
    for (char *tok = strtok(line + at, " \n"); tok && g_sup.n < MAX_ADDRS; tok = strtok(NULL, " \n")) {
        struct sockaddr_in *a = &g_sup.addr[g_sup.n];
        *a = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        if (inet_pton(AF_INET, tok, &a->sin_addr) == 1) g_sup.n++;
    }
    return g_sup.n;
}

/* Sends msg to a within `budget` seconds: 0 when it went. */
static int tell_one(const struct sockaddr_in *a, const char *msg, double budget) {
    int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), rc = -1;
    if (c < 0) return -1;
    if (connect(c, (const struct sockaddr *)a, sizeof *a) == 0 || errno == EINPROGRESS) {
        struct pollfd p = {.fd = c, .events = POLLOUT};
        int e = 0;
        socklen_t el = sizeof e;
        if (poll(&p, 1, (int)(budget * 1000)) == 1 && !getsockopt(c, SOL_SOCKET, SO_ERROR, &e, &el) &&
            !e && send(c, msg, strlen(msg), MSG_NOSIGNAL) == (ssize_t)strlen(msg))
            rc = 0;
    }
    close(c);
    return rc;
}

void tr_witness_tell(int attempt, int rank) {
    char msg[96];
    snprintf(msg, sizeof msg, "%llx %d %d\n", g_sup.nonce, attempt, rank);
    double end = mono_now() + 1.0;
    for (int k = 0; k < g_sup.n; k++) {
        double left = end - mono_now();
        if (left <= 0 || !tell_one(&g_sup.addr[k], msg, left / (g_sup.n - k))) return;
    }
}
