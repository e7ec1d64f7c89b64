/* Masked data-parallel sums (parallel/masked.h): the keys, the masks, the fixed point. The
 * cryptography is libsodium's (crypto_kx: X25519 and BLAKE2b; ChaCha20 for the masks'
 * streams); nothing here is hand-written crypto. */
#include "parallel/masked.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm/env.h"

enum { ORG_LEN = 64 };
#define CONFIRM_SEQ UINT64_MAX /* the reduction that confirms the keys at start */

struct tr_masked {
    int size, rank, orgs, n_peers;
    int *peer;                                        /* the ranks masked against */
    unsigned char (*key)[crypto_kx_SESSIONKEYBYTES]; /* and each one's shared key */
    uint32_t *stream;                                 /* a mask's keystream, grown as needed */
    size_t stream_n;
    int sabotage; /* TR_FAULT_MASK on this rank: 1 "key" (its first key replaced), 2 "sum"
                     (its first peer's mask left out of every sum after the confirmation), 3
                     "replay" (its first message of a size sent again, verbatim, in place of
                     every later one of that size: a replayed step) */
    uint32_t *replay; /* "replay": that message */
    size_t replay_n;
};

/* TR_FAULT_MASK=R:key|R:sum|R:replay: a test's sabotage on dp rank R (0: none here; -1
 * malformed). */
static int read_sabotage(int rank, char *err, size_t errlen) {
    static const char *const kinds[] = {"key", "sum", "replay"};
    const char *v = getenv("TR_FAULT_MASK");
    int r, used = 0, k = 0;
    char what[8];
    if (!v || !*v) return 0;
    if (sscanf(v, "%d:%7[a-z]%n", &r, what, &used) == 2 && !v[used] && r >= 0)
        while (k < 3 && strcmp(what, kinds[k])) k++;
    if (!used || v[used] || r < 0 || k == 3)
        return tr_env_bad("TR_FAULT_MASK", "RANK:key, RANK:sum or RANK:replay", v, err, errlen);
    return r != rank ? 0 : k + 1;
}

static int agree_keys(tr_masked *p, const char *orgs, const unsigned char *pks,
                      const unsigned char *pk, const unsigned char *sk) {
    for (int j = 0; j < p->size; j++) {
        if (j == p->rank || !strncmp(orgs + (size_t)j * ORG_LEN, orgs + (size_t)p->rank * ORG_LEN,
                                     ORG_LEN))
            continue;
        unsigned char rx[crypto_kx_SESSIONKEYBYTES], tx[crypto_kx_SESSIONKEYBYTES];
        const unsigned char *other = pks + (size_t)j * crypto_kx_PUBLICKEYBYTES;
        /* the lower rank is the client: its tx key is the higher one's rx key */
        int rc = p->rank < j ? crypto_kx_client_session_keys(rx, tx, pk, sk, other)
                             : crypto_kx_server_session_keys(rx, tx, pk, sk, other);
        if (rc) return -1;
        p->peer[p->n_peers] = j;
        memcpy(p->key[p->n_peers++], p->rank < j ? tx : rx, crypto_kx_SESSIONKEYBYTES);
        sodium_memzero(rx, sizeof rx), sodium_memzero(tx, sizeof tx);
    }
    if (p->sabotage == 1 && p->n_peers) randombytes_buf(p->key[0], crypto_kx_SESSIONKEYBYTES);
    return 0;
}

static int count_orgs(const char *orgs, int size) {
    int n = 0;
    for (int j = 0; j < size; j++) {
        int seen = 0;
        for (int i = 0; i < j && !seen; i++)
            seen = !strncmp(orgs + (size_t)i * ORG_LEN, orgs + (size_t)j * ORG_LEN, ORG_LEN);
        n += !seen;
    }
    return n;
}

/* Every pair's key the same on both sides: a sum of nothing but masks comes back 0. */
static int confirm(tr_masked *p, tr_comm *c) {
    uint32_t q[1];
    if (tr_masked_mask(p, NULL, 0, 0, CONFIRM_SEQ, q) ||
        tr_comm_all_reduce(c, q, 1, TR_COMM_I32))
        return -1;
    return q[0] == 0 ? 0 : 1;
}

tr_masked *tr_masked_open(tr_comm *c, const char *org, char *err, size_t errlen) {
    tr_masked *p = calloc(1, sizeof *p);
    int size = tr_comm_size(c), rank = tr_comm_rank(c);
    char *orgs = calloc((size_t)size, ORG_LEN), mine[ORG_LEN] = {0};
    unsigned char *pks = calloc((size_t)size, crypto_kx_PUBLICKEYBYTES);
    unsigned char pk[crypto_kx_PUBLICKEYBYTES] = {0}, sk[crypto_kx_SECRETKEYBYTES];
    err[0] = 0;
    if (p) {
        p->size = size, p->rank = rank;
        p->peer = calloc((size_t)size, sizeof *p->peer);
        p->key = calloc((size_t)size, sizeof *p->key);
        p->sabotage = read_sabotage(rank, err, errlen);
    }
    snprintf(mine, sizeof mine, "%s", org);
    /* every rank takes part in every collective below whatever failed where, and the ranks
       agree on the outcome after each stage */
    int bad = !p || !orgs || !pks || !p->peer || !p->key || p->sabotage < 0 || sodium_init() < 0;
    if (!bad) crypto_kx_keypair(pk, sk);
    int any = bad;
    if (tr_comm_all_reduce(c, &any, 1, TR_COMM_I32) ||
        (!any && (tr_comm_all_gather(c, mine, orgs, ORG_LEN, TR_COMM_BYTE) ||
                  tr_comm_all_gather(c, pk, pks, crypto_kx_PUBLICKEYBYTES, TR_COMM_BYTE))))
        any = 1;
    if (!any) {
        any = agree_keys(p, orgs, pks, pk, sk) ? 1 : 0;
        if (tr_comm_all_reduce(c, &any, 1, TR_COMM_I32)) any = 1;
    }
    sodium_memzero(sk, sizeof sk);
    int disagree = any ? 0 : confirm(p, c);
    if (!any && !disagree) p->orgs = count_orgs(orgs, size);
    free(orgs), free(pks);
    if (!any && !disagree) return p;
    if (!err[0])
        snprintf(err, errlen, disagree > 0 ? "private gradients: the keys of the dp group do not "
                                             "agree: a rank joined with a key its peers do not hold"
                                           : "private gradients: agreeing keys over the dp group "
                                             "failed (libsodium, memory or a collective)");
    tr_masked_close(p);
    return NULL;
}

void tr_masked_close(tr_masked *p) {
    if (!p) return;
    if (p->key) sodium_memzero(p->key, (size_t)p->size * sizeof *p->key);
    free(p->key), free(p->peer), free(p->stream), free(p->replay);
    free(p);
}

int tr_masked_orgs(const tr_masked *p) {
    return p ? p->orgs : 0;
}

int tr_masked_peers(const tr_masked *p) {
    return p ? p->n_peers : 0;
}

int tr_masked_shift(double a, int ranks) {
    int s = 60;
    while (s > -60 && a * ldexp(1, s) + ranks >= 2147483648.0)
        s--;
    return s;
}

double tr_masked_bound(int shift, int ranks) {
    return ranks * ldexp(1, -(shift + 1));
}

int tr_masked_mask(tr_masked *p, const float *x, size_t n, int shift, uint64_t seq,
                   uint32_t *q) {
    double scale = ldexp(1, shift);
    for (size_t i = 0; i < n; i++) /* |x| * scale < 2^31: the shift saw to it */
        q[i] = (uint32_t)(int32_t)lrint((double)x[i] * scale);
    q[n] = 0;
    if (p->stream_n < n + 1) {
        free(p->stream);
        p->stream_n = 0;
        if (!(p->stream = malloc((n + 1) * sizeof *p->stream))) return -1;
        p->stream_n = n + 1;
    }
    unsigned char nonce[crypto_stream_chacha20_ietf_NONCEBYTES] = {0};
    for (int b = 0; b < 8; b++)
        nonce[b] = (unsigned char)(seq >> (8 * b));
    for (int k = 0; k < p->n_peers; k++) {
        if (p->sabotage == 2 && k == 0 && seq != CONFIRM_SEQ) continue;
        crypto_stream_chacha20_ietf((unsigned char *)p->stream, (n + 1) * sizeof *p->stream,
                                    nonce, p->key[k]);
        if (p->rank < p->peer[k])
            for (size_t i = 0; i <= n; i++) q[i] += p->stream[i];
        else
            for (size_t i = 0; i <= n; i++) q[i] -= p->stream[i];
    }
    if (p->sabotage == 3 && seq != CONFIRM_SEQ) { /* the test's replay */
        if (p->replay_n == n + 1) {
            memcpy(q, p->replay, (n + 1) * sizeof *q);
        } else if (!p->replay_n && (p->replay = malloc((n + 1) * sizeof *q))) {
            memcpy(p->replay, q, (n + 1) * sizeof *q);
            p->replay_n = n + 1;
        }
    }
    return 0;
}

int tr_masked_unmask(const uint32_t *q, size_t n, int shift, float *x) {
    if (q[n] != 0) return -1;
    double inv = ldexp(1, -shift);
    for (size_t i = 0; i < n; i++) /* the sum's bits as two's complement */
        x[i] = (float)((double)(int32_t)q[i] * inv);
    return 0;
}
