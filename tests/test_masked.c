/* parallel/masked.h on whatever world it is started in (alone, or `mpirun -np N`), with the
 * ranks in organisations by rank parity ("a", "b") and then each its own:
 *  - the scale: tr_masked_shift is the largest that keeps the sum inside the ring;
 *  - masked sums of vectors whose magnitudes span 2^-20 to 2^3 equal the exact sum within
 *    tr_masked_bound (the fixed point's rounding) plus half a float ulp (the result's own);
 *  - each message is unlike the unmasked fixed point and its bytes look uniformly random
 *    (chi-square over byte values), when the rank has peers; with none it is the fixed point;
 *  - a rank that masks with another reduction's nonce (a replayed message) makes the canary
 *    fail on every rank, and a sum of all-zero gradients comes back exactly 0. */
#include "parallel/masked.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

enum { N = 1 << 16 };

/* Rank r's element i: a sign, a magnitude from 2^-20 to 2^3 (deterministic). */
static float val(int r, size_t i) {
    unsigned long long h = (unsigned long long)(r + 1) * 0x9E3779B97F4A7C15ull ^ i * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31, h *= 0x94D049BB133111EBull, h ^= h >> 29;
    double mant = (double)(h & 0xffffff) / 0x1000000, e = (double)((h >> 24) % 24) - 20;
    return (float)((h >> 60 & 1 ? -1 : 1) * (0.5 + 0.5 * mant) * ldexp(1, (int)e));
}

static void check_shift(void) {
    int cases = 0, wrong = 0;
    for (double a = 1e-12; a < 1e12; a *= 7.3)
        for (int d = 1; d <= 64; d *= 4, cases++) {
            int s = tr_masked_shift(a, d);
            wrong += !(a * ldexp(1, s) + d < 2147483648.0 &&
                       (s == 60 || a * ldexp(1, s + 1) + d >= 2147483648.0)); /* 60: the cap */
        }
    check(!wrong, "the scale is the largest that keeps the sum in the ring (at most 2^60): "
                  "%d of %d cases wrong", wrong, cases);
}

/* One masked sum over c of every rank's val(), checked against the exact sum. */
static void check_sum(tr_comm *c, tr_masked *m, uint64_t seq, int replay_rank) {
    int size = tr_comm_size(c), rank = tr_comm_rank(c);
    float *x = malloc(N * sizeof *x), *got = malloc(N * sizeof *got);
    uint32_t *q = malloc((N + 1) * sizeof *q);
    double a = 0;
    for (size_t i = 0; i < N; i++) {
        x[i] = val(rank, i);
        a = fabs(x[i]) > a ? fabs(x[i]) : a;
    }
    tr_comm_all_reduce(c, &a, 1, TR_COMM_F64);
    int s = tr_masked_shift(a, size);
    check(!tr_masked_mask(m, x, N, s, seq + (rank == replay_rank), q), "mask");
    if (tr_masked_peers(m) > 0) { /* the message: not the fixed point, bytes uniform */
        long same = 0, count[256] = {0};
        for (size_t i = 0; i < N; i++) {
            same += q[i] == (uint32_t)(int32_t)lrint((double)x[i] * ldexp(1, s));
            for (int b = 0; b < 4; b++) count[q[i] >> (8 * b) & 255]++;
        }
        double e = 4.0 * N / 256, chi = 0;
        for (int b = 0; b < 256; b++) chi += (count[b] - e) * (count[b] - e) / e;
        /* 255 degrees of freedom: mean 255, sd 22.6; 400 is 6.4 sd (p < 1e-9) */
        check(same < 8, "%ld of %d masked elements equal the unmasked fixed point", same, N);
        check(chi < 400, "the message's bytes are not uniform: chi-square %.1f (255 dof)", chi);
    }
    tr_comm_all_reduce(c, q, N + 1, TR_COMM_I32);
    int bad = tr_masked_unmask(q, N, s, got);
    if (replay_rank >= 0 && replay_rank < size && size > 1) {
        check(bad, "a replayed mask on rank %d was not caught", replay_rank);
    } else {
        check(!bad, "the canary failed");
        double bound = tr_masked_bound(s, size), worst = 0;
        for (size_t i = 0; i < N && !bad; i++) {
            double exact = 0;
            for (int r = 0; r < size; r++) exact += val(r, i);
            double err = fabs((double)got[i] - exact);
            double allowed = bound + 0.5 * ldexp(1, ilogb(exact ? exact : 1) - 23);
            if (err / allowed > worst) worst = err / allowed;
        }
        check(worst <= 1, "a masked sum is %.3g times the bound from the exact sum", worst);
        if (rank == 0)
            printf("masked sum of %d x %d elements (scale 2^%d): worst error %.3f of the bound "
                   "%.3g + half an ulp\n", size, N, s, worst, bound);
    }
    free(x), free(got), free(q);
}

/* Zero gradients: exactly zero back. */
static void check_zeros(tr_comm *c, tr_masked *m) {
    float x[5] = {0}, got[5] = {1, 1, 1, 1, 1};
    uint32_t q[6];
    check(!tr_masked_mask(m, x, 5, 20, 77, q), "mask");
    tr_comm_all_reduce(c, q, 6, TR_COMM_I32);
    check(!tr_masked_unmask(q, 5, 20, got), "canary");
    check(got[0] == 0 && got[1] == 0 && got[2] == 0 && got[3] == 0 && got[4] == 0,
          "zero gradients come back exactly zero (%g %g %g %g %g)", got[0], got[1], got[2],
          got[3], got[4]);
}

int main(int argc, char **argv) {
    tr_comm *w;
    char err[256];
    if (tr_comm_init(&w, &argc, &argv, 60, err, sizeof err)) {
        fprintf(stderr, "test_masked: %s\n", err);
        return 1;
    }
    int rank = tr_comm_rank(w), size = tr_comm_size(w);
    check_shift();
    for (int how = 0; how < 2; how++) { /* organisations by parity, then one per rank */
        char org[16];
        if (how)
            snprintf(org, sizeof org, "r%d", rank);
        else
            snprintf(org, sizeof org, "%s", rank % 2 ? "b" : "a");
        tr_masked *m = tr_masked_open(w, org, err, sizeof err);
        check(m != NULL, "open: %s", err);
        if (!m) break;
        int want_orgs = how ? size : size > 1 ? 2 : 1;
        int want_peers = how ? size - 1 : size / 2;
        check(tr_masked_orgs(m) == want_orgs && tr_masked_peers(m) == want_peers,
              "%d organisations and %d peers, not %d and %d", tr_masked_orgs(m),
              tr_masked_peers(m), want_orgs, want_peers);
        check_sum(w, m, 1, -1);
        check_sum(w, m, 2, size - 1); /* the last rank replays: every rank must see it */
        check_zeros(w, m);
        tr_masked_close(m);
    }
    int fails = n_fail;
    tr_comm_all_reduce(w, &fails, 1, TR_COMM_I32);
    printf("rank %d: %d ok, %d failed\n", rank, n_ok, n_fail);
    if (rank == 0) printf("%s test_masked (%d rank%s)\n", fails ? "FAIL" : "PASS", size,
                          size > 1 ? "s" : "");
    tr_comm_free(w);
    return fails ? 1 : 0;
}
