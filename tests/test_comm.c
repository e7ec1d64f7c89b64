/* parallel/comm/comm.h on whatever world it is started in: alone (a world of one) or under
 * `mpirun -np N` (N = 1, 2, 4). Every collective, blocking and non-blocking, several dtypes
 * and sizes, the dp x pp x tp mesh, a send/recv ring, and results bitwise equal on all ranks.
 * Failure modes for tests/mpi/dead_rank.sh: --die-rank R (SIGKILL mid-run) and --stuck-rank R
 * (sleeps instead of joining an all_reduce), with --timeout T. */
#include "parallel/comm/comm.h"
#include "parallel/comm/cores.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_fail, g_rank;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            g_fail++;                                                                              \
            fprintf(stderr, "FAIL rank %d %s:%d: ", g_rank, __FILE__, __LINE__);                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

static const size_t esz[] = {4, 8, 4, 8, 1, 2};
static const char *const tname[] = {"f32", "f64", "i32", "i64", "byte", "bf16"};

/* bfloat16: the top half of a float, rounded to nearest even */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static const size_t sizes[] = {0, 1, 7, 1000, 65537};

/* Element i of rank r's input: floats are not exactly summable (so the order of additions
 * shows), integers exercise sign and the byte type wraps mod 256. */
static double val(int r, size_t i) {
    uint64_t h = (uint64_t)(r + 1) * 0x9E3779B97F4A7C15u ^ (uint64_t)i * 0xBF58476D1CE4E5B9u;
    h ^= h >> 29;
    h *= 0x94D049BB133111EBu;
    h ^= h >> 32;
    return (double)(h % 2000003) / 1000.0 - 1000.0 + 1.0 / 3.0;
}

static void fill(void *p, tr_comm_dtype t, int r, size_t off, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double v = val(r, off + i);
        switch (t) {
        case TR_COMM_F32:
            ((float *)p)[i] = (float)v;
            break;
        case TR_COMM_F64:
            ((double *)p)[i] = v;
            break;
        case TR_COMM_I32:
            ((int32_t *)p)[i] = (int32_t)(v * 7);
            break;
        case TR_COMM_I64:
            ((int64_t *)p)[i] = (int64_t)(v * 1e6) * 1000003;
            break;
        case TR_COMM_BYTE:
            ((uint8_t *)p)[i] = (uint8_t)(int64_t)(v * 3);
            break;
        case TR_COMM_BF16:
            ((uint16_t *)p)[i] = to_bf16((float)v);
            break;
        }
    }
}

static double get(const void *p, tr_comm_dtype t, size_t i) {
    switch (t) {
    case TR_COMM_F32:
        return ((const float *)p)[i];
    case TR_COMM_F64:
        return ((const double *)p)[i];
    case TR_COMM_I32:
        return ((const int32_t *)p)[i];
    case TR_COMM_I64:
        return (double)((const int64_t *)p)[i];
    case TR_COMM_BYTE:
        return ((const uint8_t *)p)[i];
    case TR_COMM_BF16:
        return from_bf16(((const uint16_t *)p)[i]);
    }
    return 0;
}

/* Does got[i] equal the sum over ranks of element (off + i)? Floats within rounding of the
 * summation order, integers exactly (bytes mod 256, int32 wraps as two's complement). */
static int check_sum(const void *got, tr_comm_dtype t, int size, size_t off, size_t n) {
    unsigned char tmp[8];
    for (size_t i = 0; i < n; i++) {
        double exact = 0, mag = 0;
        int64_t isum = 0;
        uint32_t usum32 = 0;
        for (int r = 0; r < size; r++) {
            fill(tmp, t, r, off + i, 1);
            exact += get(tmp, t, 0);
            mag += get(tmp, t, 0) < 0 ? -get(tmp, t, 0) : get(tmp, t, 0);
            if (t == TR_COMM_I64) isum += ((int64_t *)(void *)tmp)[0];
            if (t == TR_COMM_I32) usum32 += (uint32_t)((int32_t *)(void *)tmp)[0];
            if (t == TR_COMM_BYTE) isum += tmp[0];
        }
        double g = get(got, t, i);
        int ok;
        if (t == TR_COMM_F32)
            ok = g - exact <= 1e-6 * mag + 1e-3 && exact - g <= 1e-6 * mag + 1e-3;
        else if (t == TR_COMM_BF16) /* every addition rounds to 8 significant bits */
            ok = g - exact <= size * 0.0079 * mag && exact - g <= size * 0.0079 * mag;
        else if (t == TR_COMM_F64)
            ok = g - exact <= 1e-12 * mag && exact - g <= 1e-12 * mag;
        else if (t == TR_COMM_I64)
            ok = ((const int64_t *)got)[i] == isum;
        else if (t == TR_COMM_I32)
            ok = (uint32_t)((const int32_t *)got)[i] == usum32;
        else
            ok = ((const uint8_t *)got)[i] == (uint8_t)isum;
        if (!ok) {
            fprintf(stderr, "  element %zu: got %.17g expected %.17g\n", i, g, exact);
            return 0;
        }
    }
    return 1;
}

/* FNV-1a of a result; gathered over the world to prove every rank holds the same bits. */
static int64_t hash(const void *p, size_t bytes) {
    uint64_t h = 1469598103934665603u;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211u;
    return (int64_t)(h >> 1);
}

static void check_same_everywhere(tr_comm *w, const void *p, size_t bytes, const char *what) {
    int s = tr_comm_size(w);
    int64_t h = hash(p, bytes), *all = malloc((size_t)s * sizeof *all);
    CHECK(tr_comm_all_gather(w, &h, all, 1, TR_COMM_I64) == 0, "gather of hashes");
    for (int r = 0; r < s; r++)
        CHECK(all[r] == all[0], "%s: rank %d's result differs from rank 0's", what, r);
    free(all);
}

static void test_all_reduce(tr_comm *w, int nonblocking) {
    int rank = tr_comm_rank(w), size = tr_comm_size(w);
    for (int t = TR_COMM_F32; t <= TR_COMM_BF16; t++) {
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            size_t n = sizes[k];
            void *buf = malloc(n * esz[t] + 1);
            fill(buf, (tr_comm_dtype)t, rank, 0, n);
            if (nonblocking) {
                tr_comm_req *r = tr_comm_iall_reduce(w, buf, n, (tr_comm_dtype)t);
                CHECK(r != NULL, "iall_reduce started");
                while (!tr_comm_test(r)) {
                }
                CHECK(tr_comm_test(r) == 1, "test stays 1 after completion");
                CHECK(tr_comm_wait(r) >= 0, "wait");
            } else {
                CHECK(tr_comm_all_reduce(w, buf, n, (tr_comm_dtype)t) == 0, "all_reduce");
            }
            CHECK(check_sum(buf, (tr_comm_dtype)t, size, 0, n), "%sall_reduce %s n=%zu",
                  nonblocking ? "i" : "", tname[t], n);
            check_same_everywhere(w, buf, n * esz[t], "all_reduce");
            free(buf);
        }
    }
}

static void test_reduce_scatter(tr_comm *w, int nonblocking) {
    int rank = tr_comm_rank(w), size = tr_comm_size(w);
    for (int t = TR_COMM_F32; t <= TR_COMM_BYTE; t += 2) {
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            size_t n = sizes[k];
            void *send = malloc((size_t)size * n * esz[t] + 1), *recv = malloc(n * esz[t] + 1);
            fill(send, (tr_comm_dtype)t, rank, 0, (size_t)size * n);
            if (nonblocking) {
                tr_comm_req *r = tr_comm_ireduce_scatter(w, send, recv, n, (tr_comm_dtype)t);
                CHECK(r != NULL, "ireduce_scatter started");
                tr_comm_wait(r);
            } else {
                CHECK(tr_comm_reduce_scatter(w, send, recv, n, (tr_comm_dtype)t) == 0,
                      "reduce_scatter");
            }
            CHECK(check_sum(recv, (tr_comm_dtype)t, size, (size_t)rank * n, n),
                  "%sreduce_scatter %s n=%zu", nonblocking ? "i" : "", tname[t], n);
            free(send);
            free(recv);
        }
    }
}

static void test_all_gather(tr_comm *w, int nonblocking, int in_place) {
    int rank = tr_comm_rank(w), size = tr_comm_size(w);
    for (int t = TR_COMM_F32; t <= TR_COMM_BF16; t++) {
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            size_t n = sizes[k], bytes = n * esz[t];
            char *recv = malloc((size_t)size * bytes + 1), *own = malloc(bytes + 1);
            memset(recv, 0xAB, (size_t)size * bytes);
            fill(own, (tr_comm_dtype)t, rank, 0, n);
            const void *send = own;
            if (in_place) {
                memcpy(recv + (size_t)rank * bytes, own, bytes);
                send = recv + (size_t)rank * bytes;
            }
            if (nonblocking) {
                tr_comm_req *r = tr_comm_iall_gather(w, send, recv, n, (tr_comm_dtype)t);
                CHECK(r != NULL, "iall_gather started");
                tr_comm_wait(r);
            } else {
                CHECK(tr_comm_all_gather(w, send, recv, n, (tr_comm_dtype)t) == 0, "all_gather");
            }
            for (int r = 0; r < size; r++) {
                fill(own, (tr_comm_dtype)t, r, 0, n);
                CHECK(memcmp(recv + (size_t)r * bytes, own, bytes) == 0,
                      "%sall_gather%s %s n=%zu: block %d", nonblocking ? "i" : "",
                      in_place ? " in place" : "", tname[t], n, r);
            }
            free(recv);
            free(own);
        }
    }
}

static void test_broadcast(tr_comm *w) {
    int rank = tr_comm_rank(w), size = tr_comm_size(w);
    for (int root = 0; root < size; root++) {
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            size_t n = sizes[k];
            double *buf = malloc(n * sizeof *buf + 1), *want = malloc(n * sizeof *want + 1);
            fill(buf, TR_COMM_F64, rank, 0, n);
            fill(want, TR_COMM_F64, root, 0, n);
            CHECK(tr_comm_broadcast(w, buf, n, TR_COMM_F64, root) == 0, "broadcast");
            CHECK(n == 0 || memcmp(buf, want, n * sizeof *buf) == 0, "broadcast root %d n=%zu",
                  root, n);
            free(buf);
            free(want);
        }
    }
    int x = 0;
    CHECK(tr_comm_broadcast(w, &x, 1, TR_COMM_I32, size) == -1, "bad root is refused");
}

/* Each rank sends to the next and receives from the previous; even ranks send first. */
/* tr_comm_read_file: a file only rank 0 has (a name of its own pid) reaches every rank whole,
 * NULs and all; one the root cannot read, or one over max, is 1 on every rank. */
static void test_read_file(tr_comm *w) {
    char path[64] = "";
    long long pid = g_rank == 0 ? (long long)getpid() : 0;
    CHECK(tr_comm_broadcast(w, &pid, 1, TR_COMM_I64, 0) == 0, "broadcast of the pid");
    snprintf(path, sizeof path, "/tmp/tr_test_comm_read.%lld", pid);
    const char want[] = "HOST ORG\n\0a NUL inside\n";
    if (g_rank == 0) {
        FILE *f = fopen(path, "wb");
        CHECK(f && fwrite(want, 1, sizeof want, f) == sizeof want && !fclose(f), "write %s", path);
    }
    char *text = NULL;
    size_t len = 0;
    int rc = tr_comm_read_file(w, 0, path, 1 << 10, &text, &len);
    CHECK(rc == 0 && len == sizeof want && !memcmp(text, want, len) && text[len] == 0,
          "read_file: rank %d has rank 0's %zu bytes (rc %d, %zu)", g_rank, sizeof want, rc, len);
    free(text);
    CHECK(tr_comm_read_file(w, 0, path, 8, &text, &len) == 1, "read_file: over max: 1");
    if (g_rank == 0) unlink(path);
    CHECK(tr_comm_read_file(w, 0, path, 1 << 10, &text, &len) == 1, "read_file: absent: 1");
}

static void test_ring(tr_comm *w) {
    int rank = tr_comm_rank(w), size = tr_comm_size(w);
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    /* Sending to oneself blocks in MPI unless the message fits the eager limit. */
    size_t n = size == 1 ? 100 : 70001;
    float *out = malloc(n * sizeof *out), *in = malloc(n * sizeof *in), *want = malloc(n * 4);
    fill(out, TR_COMM_F32, rank, 0, n);
    fill(want, TR_COMM_F32, prev, 0, n);
    for (int tag = 1; tag <= 2; tag++) {
        if (rank % 2 == 0) {
            CHECK(tr_comm_send(w, out, n, TR_COMM_F32, next, tag) == 0, "send");
            CHECK(tr_comm_recv(w, in, n, TR_COMM_F32, prev, tag) == 0, "recv");
        } else {
            CHECK(tr_comm_recv(w, in, n, TR_COMM_F32, prev, tag) == 0, "recv");
            CHECK(tr_comm_send(w, out, n, TR_COMM_F32, next, tag) == 0, "send");
        }
        CHECK(memcmp(in, want, n * sizeof *in) == 0, "ring tag %d: message from rank %d", tag,
              prev);
    }
    CHECK(tr_comm_send(w, out, 1, TR_COMM_F32, size, 0) == -1, "bad peer is refused");
    free(out);
    free(in);
    free(want);
}

/* Several operations in flight on one group at once, progressed by tr_comm_test. */
static void test_overlap(tr_comm *w) {
    int rank = tr_comm_rank(w), size = tr_comm_size(w);
    size_t n = 50001;
    float *a = malloc(n * 4), *rs_in = malloc((size_t)size * n * 4), *rs = malloc(n * 4);
    float *ag = malloc((size_t)size * n * 4);
    fill(a, TR_COMM_F32, rank, 0, n);
    fill(rs_in, TR_COMM_F32, rank, 0, (size_t)size * n);
    fill(ag + (size_t)rank * n, TR_COMM_F32, rank, 0, n);
    double before = tr_comm_wait_seconds();
    tr_comm_req *r[3] = {tr_comm_iall_reduce(w, a, n, TR_COMM_F32),
                         tr_comm_ireduce_scatter(w, rs_in, rs, n, TR_COMM_F32),
                         tr_comm_iall_gather(w, ag + (size_t)rank * n, ag, n, TR_COMM_F32)};
    for (int spins = 0; spins < 1000000; spins++)
        if (tr_comm_test(r[0]) + tr_comm_test(r[1]) + tr_comm_test(r[2]) == 3) break;
    double waited = 0;
    for (int i = 0; i < 3; i++)
        waited += tr_comm_wait(r[i]);
    CHECK(waited >= 0 && tr_comm_wait_seconds() >= before + waited - 1e-9,
          "wait seconds accumulate");
    CHECK(check_sum(a, TR_COMM_F32, size, 0, n), "overlapped all_reduce");
    CHECK(check_sum(rs, TR_COMM_F32, size, (size_t)rank * n, n), "overlapped reduce_scatter");
    float *want = malloc(n * 4);
    for (int q = 0; q < size; q++) {
        fill(want, TR_COMM_F32, q, 0, n);
        CHECK(memcmp(ag + (size_t)q * n, want, n * 4) == 0, "overlapped all_gather block %d", q);
    }
    check_same_everywhere(w, a, n * 4, "overlapped all_reduce");
    free(want);
    free(a);
    free(rs_in);
    free(rs);
    free(ag);
}

/* The progress agent's rule (comm/cores.h): it runs only where the node's ranks leave a core
 * idle and this process may use more cores than its threads; and whether it runs here is what
 * TR_COMM_PROGRESS (0, 1, or auto: the rule on this process's view) says. */
static void test_spare_core(tr_comm *w) {
    static const struct {
        long online, allowed, threads;
        int ranks, spare;
    } cases[] = {
        {2, 2, 1, 2, 0},    /* this machine: 2 ranks of 1 thread fill its 2 cores */
        {2, 2, 1, 4, 0},    /* 4 ranks share them */
        {2, 2, 1, 1, 1},    /* 1 rank of 1 thread leaves one idle */
        {16, 16, 4, 2, 1},  /* 8 threads of 16 cores */
        {16, 1, 1, 2, 0},   /* bound to one core: the agent would share it */
        {16, 16, 16, 1, 0}, /* OpenMP's default, a thread per core */
        {8, 8, 2, 4, 0},    /* 8 threads on 8 cores */
        {1, 1, 1, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tr_node_cores c = {cases[i].online, cases[i].allowed, cases[i].threads, cases[i].ranks, 1};
        char why[96];
        int got = tr_spare_core(&c, why, sizeof why);
        CHECK(got == cases[i].spare, "%s: spare %d, expected %d", why, got, cases[i].spare);
    }
    /* the threads where OMP_NUM_THREADS does not say: the node's cores over its ranks */
    const struct {
        long online, allowed;
        int ranks;
        long threads;
    } share[] = {
        {2, 2, 4, 1},   /* 4 ranks on this machine's 2 cores: OpenMP's default gave each 2 */
        {2, 2, 2, 1},   /* 2 ranks of 1 */
        {2, 2, 1, 2},   /* 1 rank: OpenMP's default */
        {2, 1, 2, 1},   /* bound to a core each (Open MPI's default for 2 ranks) */
        {64, 32, 8, 8}, /* 8 ranks bound to a socket of 32 cores each: 8, not 32 */
        {64, 8, 4, 8},  /* bound to 8 cores each: at most the allowed */
        {3, 3, 2, 1},   /* 1.5 cores each: whole threads */
        {16, 16, 0, 16},
    };
    for (size_t i = 0; i < sizeof share / sizeof *share; i++) {
        long got = tr_node_threads(share[i].online, share[i].allowed, share[i].ranks);
        CHECK(got == share[i].threads,
              "%d ranks on %ld cores, %ld allowed: %ld threads, expected %ld", share[i].ranks,
              share[i].online, share[i].allowed, got, share[i].threads);
    }
    tr_node_cores c = {2, 2, 1, 4, 1};
    char why[96];
    tr_spare_core(&c, why, sizeof why);
    CHECK(!strcmp(why, "4 ranks x 1 thread on 2 cores"), "why: '%s'", why);
    /* this process's view: OMP_NUM_THREADS's first number, else tr_node_threads */
    const char *omp = getenv("OMP_NUM_THREADS");
    char *saved = omp ? strdup(omp) : NULL;
    setenv("OMP_NUM_THREADS", "3,1", 1);
    c = tr_node_cores_here(2);
    CHECK(c.threads == 3 && c.ranks == 2 && c.allowed >= 1 && c.allowed <= c.online,
          "OMP_NUM_THREADS=3,1: %ld threads, %d ranks, %ld of %ld cores", c.threads, c.ranks,
          c.allowed, c.online);
    CHECK(c.given, "OMP_NUM_THREADS=3,1: not given");
    setenv("OMP_NUM_THREADS", "many", 1);
    c = tr_node_cores_here(0);
    CHECK(c.threads == c.allowed && c.ranks == 1 && !c.given,
          "OMP_NUM_THREADS=many: %ld threads of %ld", c.threads, c.allowed);
    unsetenv("OMP_NUM_THREADS");
    c = tr_node_cores_here(4);
    CHECK(c.threads == tr_node_threads(c.online, c.allowed, 4) && !c.given,
          "OMP_NUM_THREADS unset, 4 ranks: %ld threads of %ld cores", c.threads, c.online);
    if (saved)
        setenv("OMP_NUM_THREADS", saved, 1);
    else
        unsetenv("OMP_NUM_THREADS");
    free(saved);
    const char *p = getenv("TR_COMM_PROGRESS");
    int want = -1; /* the agent runs only in an MPI world of several ranks */
    if (strcmp(tr_comm_transport(), "mpi") || tr_comm_size(w) < 2)
        want = 0;
    else if (p && !strcmp(p, "1"))
        want = 1;
    else if (p && !strcmp(p, "0"))
        want = 0;
    if (want >= 0)
        CHECK(tr_comm_progress_agent() == want, "TR_COMM_PROGRESS=%s: agent %d, expected %d",
              p ? p : "(unset)", tr_comm_progress_agent(), want);
    else { /* auto: the rule, recomputed here, and the note that says it */
        int local_size = 0;
        tr_comm_local_rank(&local_size);
        tr_node_cores here = tr_node_cores_here(local_size);
        const char *note = tr_comm_progress_note();
        int rule = tr_spare_core(&here, NULL, 0),
            lost = !!strstr(note, "; MPI grants no") || !!strstr(note, "did not start");
        CHECK(tr_comm_progress_agent() == (rule && !lost), "auto: agent %d, rule %d, note '%s'",
              tr_comm_progress_agent(), rule, note);
        CHECK(!!strstr(note, tr_comm_progress_agent() ? "agent on (" : "agent off (") &&
                  !!strstr(note, rule ? "a core to spare" : "no core to spare"),
              "auto: agent %d, rule %d, note '%s'", tr_comm_progress_agent(), rule, note);
    }
}

/* Members of a group, as world ranks in group-rank order. */
static void members(tr_comm *grp, int world_rank, int *out) {
    CHECK(tr_comm_all_gather(grp, &world_rank, out, 1, TR_COMM_I32) == 0, "gather members");
}

static void test_mesh(tr_comm *w, tr_mesh m) {
    int rank = tr_comm_rank(w);
    tr_comm *dp, *pp, *tp;
    char err[256] = "";
    int rc = tr_comm_mesh(w, m, &dp, &pp, &tp, err, sizeof err);
    CHECK(rc == 0, "mesh %d,%d,%d: %s", m.dp, m.pp, m.tp, err);
    if (rc) return;
    int t = rank % m.tp, p = (rank / m.tp) % m.pp, d = rank / (m.tp * m.pp);
    CHECK(!strcmp(tr_comm_name(dp), "dp") && !strcmp(tr_comm_name(pp), "pp") &&
              !strcmp(tr_comm_name(tp), "tp"),
          "group names");
    CHECK(tr_comm_size(dp) == m.dp && tr_comm_size(pp) == m.pp && tr_comm_size(tp) == m.tp,
          "group sizes");
    CHECK(tr_comm_rank(dp) == d && tr_comm_rank(pp) == p && tr_comm_rank(tp) == t,
          "mesh %d,%d,%d: world rank %d is (d,p,t) = (%d,%d,%d), got (%d,%d,%d)", m.dp, m.pp, m.tp,
          rank, d, p, t, tr_comm_rank(dp), tr_comm_rank(pp), tr_comm_rank(tp));
    int got[64];
    members(dp, rank, got);
    for (int i = 0; i < m.dp; i++)
        CHECK(got[i] == (i * m.pp + p) * m.tp + t, "dp member %d is world %d", i, got[i]);
    members(pp, rank, got);
    for (int i = 0; i < m.pp; i++)
        CHECK(got[i] == (d * m.pp + i) * m.tp + t, "pp member %d is world %d", i, got[i]);
    members(tp, rank, got);
    for (int i = 0; i < m.tp; i++)
        CHECK(got[i] == (d * m.pp + p) * m.tp + i, "tp member %d is world %d", i, got[i]);
    /* A collective on one group involves only its members. */
    int64_t x = rank;
    CHECK(tr_comm_all_reduce(tp, &x, 1, TR_COMM_I64) == 0, "tp all_reduce");
    int64_t want = 0;
    for (int i = 0; i < m.tp; i++)
        want += (d * m.pp + p) * m.tp + i;
    CHECK(x == want, "tp all_reduce of world ranks: got %lld want %lld", (long long)x,
          (long long)want);
    tr_comm_free(dp);
    tr_comm_free(pp);
    tr_comm_free(tp);
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
    int die_rank = -1, stuck_rank = -1;
    double timeout = 60;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--die-rank") && i + 1 < argc)
            die_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--stuck-rank") && i + 1 < argc)
            stuck_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
            timeout = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: test_comm [--die-rank R | --stuck-rank R] [--timeout S]\n");
            return 2;
        }
    }
    tr_comm *w;
    char err[256];
    if (tr_comm_init(&w, &argc, &argv, timeout, err, sizeof err)) {
        fprintf(stderr, "test_comm: %s\n", err);
        return 1;
    }
    g_rank = tr_comm_rank(w);
    int size = tr_comm_size(w);
    CHECK(!strcmp(tr_comm_name(w), "world"), "world name");
    CHECK(g_rank >= 0 && g_rank < size, "rank in range");
    int launched = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
#ifdef TR_HAVE_MPI
    const char *want_transport = launched ? "mpi" : "single";
#else
    const char *want_transport = "single";
    (void)launched;
#endif
    CHECK(!strcmp(tr_comm_transport(), want_transport), "transport %s, expected %s",
          tr_comm_transport(), want_transport);

    if (die_rank >= 0 || stuck_rank >= 0) {
        /* Everyone meets, then one rank dies (or hangs) while the rest all_reduce. */
        float x[1024] = {0};
        CHECK(tr_comm_all_reduce(w, x, 1024, TR_COMM_F32) == 0, "warm-up all_reduce");
        if (g_rank == die_rank) {
            fprintf(stderr, "test_comm: rank %d: killing itself\n", g_rank);
            raise(SIGKILL);
        }
        if (g_rank == stuck_rank) {
            fprintf(stderr, "test_comm: rank %d: sleeping instead of joining\n", g_rank);
            sleep_s(timeout + 60);
        }
        for (int i = 0; i < 100; i++)
            tr_comm_all_reduce(w, x, 1024, TR_COMM_F32);
        fprintf(stderr, "test_comm: rank %d: all_reduce returned though a peer is gone\n", g_rank);
        tr_comm_free(w);
        return 3;
    }

    test_all_reduce(w, 0);
    test_all_reduce(w, 1);
    test_read_file(w);
    test_reduce_scatter(w, 0);
    test_reduce_scatter(w, 1);
    test_all_gather(w, 0, 0);
    test_all_gather(w, 0, 1);
    test_all_gather(w, 1, 0);
    test_all_gather(w, 1, 1);
    test_broadcast(w);
    test_ring(w);
    test_overlap(w);
    test_spare_core(w);
    CHECK(tr_comm_barrier(w) == 0, "barrier");

    /* The mesh: every layout of this world that the lead uses, plus a wrong one. */
    if (size == 4) {
        test_mesh(w, (tr_mesh){2, 1, 2});
        test_mesh(w, (tr_mesh){1, 2, 2});
        test_mesh(w, (tr_mesh){4, 1, 1});
    }
    test_mesh(w, (tr_mesh){size, 1, 1});
    test_mesh(w, (tr_mesh){1, 1, size});
    test_mesh(w, (tr_mesh){1, size, 1});
    tr_comm *dp = NULL, *pp = NULL, *tp = NULL;
    err[0] = 0;
    CHECK(tr_comm_mesh(w, (tr_mesh){size + 1, 1, 1}, &dp, &pp, &tp, err, sizeof err) == -1 &&
              dp == NULL && strstr(err, "world has"),
          "a mesh that does not cover the world is refused: '%s'", err);
    CHECK(tr_comm_wait_seconds() > 0, "waiting time is counted");

    /* Every rank exits with the same status. */
    int64_t fails = g_fail;
    tr_comm_all_reduce(w, &fails, 1, TR_COMM_I64);
    if (g_rank == 0)
        printf("test_comm: %s on %d rank%s (transport %s, %.3f s waiting): %s\n",
               fails ? "FAILED" : "ok", size, size == 1 ? "" : "s", tr_comm_transport(),
               tr_comm_wait_seconds(), fails ? "see above" : "all checks passed");
    tr_comm_free(w);
    tr_comm_free(NULL);
    return fails ? 1 : 0;
}
