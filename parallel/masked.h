/* Private gradients: data-parallel sums whose messages reveal nothing to whoever carries them
 * between organisations (secure aggregation, Bonawitz et al. 2017, in its simplest form).
 *
 * At start every rank of a dp group makes an X25519 key pair, the public keys are exchanged,
 * and each pair of ranks in different organisations derives a shared key (libsodium's
 * crypto_kx). A bucket to sum is put in fixed point, a ring of 32-bit integers (sums wrap mod
 * 2^32), and each rank adds, for every peer in another organisation, a mask drawn from
 * ChaCha20 keyed by their shared key, with a nonce that names the reduction: the lower rank
 * adds it, the higher subtracts it. Any one message, and any sum of fewer than all of them, is
 * uniformly random; the masks cancel exactly in the full sum. One more element, a canary whose
 * value is 0 on every rank, must come back 0: a mask that did not cancel (a peer with another
 * key, a replayed message, sabotage) is found at once.
 *
 * The scale: each rank's largest magnitude in the bucket is summed over the group first (one
 * number per bucket, sent in the clear: the only figure of the gradients that crosses
 * unmasked), A; values are scaled by 2^s, the largest s with A * 2^s + ranks < 2^31, so the
 * sum cannot leave the ring. Rounding each rank's value to the grid 2^-s moves the sum by at
 * most ranks x 2^-(s+1) per element, under ranks x A / 2^31 (tr_masked_bound). */
#ifndef TR_MASKED_H
#define TR_MASKED_H

#include <stddef.h>
#include <stdint.h>

#include "parallel/comm/comm.h"

typedef struct tr_masked tr_masked;

/* Agree keys over the dp group c; org is this rank's organisation (any name; ranks with the
 * same name are not masked against each other). Collective. NULL and one line in err when
 * it fails (the same on every rank: a failed confirmation is found by all). */
tr_masked *tr_masked_open(tr_comm *c, const char *org, char *err, size_t errlen);
void tr_masked_close(tr_masked *p);
/* The organisations in the group, and the peers this rank masks against. */
int tr_masked_orgs(const tr_masked *p);
int tr_masked_peers(const tr_masked *p);

/* The scale exponent s for a sum over `ranks` of values whose largest magnitudes add up to a
 * (>= 0): the largest with a * 2^s + ranks < 2^31, at most 60. */
int tr_masked_shift(double a, int ranks);
/* The most the masked sum of an element differs from the exact sum of the rounded inputs'
 * originals: ranks x 2^-(s+1). */
double tr_masked_bound(int shift, int ranks);

/* q[0..n): x in fixed point at 2^shift plus this rank's masks for reduction `seq` (a number
 * every rank gives the same and never reuses with these keys); q[n]: the canary, masked.
 * Summed over the group as TR_COMM_I32 (two's complement: the same bits). -1 when out of
 * memory for the masks' stream. */
int tr_masked_mask(tr_masked *p, const float *x, size_t n, int shift, uint64_t seq,
                   uint32_t *q);
/* x[0..n) = the summed q at 2^-shift. -1 when the canary q[n] is not 0: the masks did not
 * cancel (x is left alone). */
int tr_masked_unmask(const uint32_t *q, size_t n, int shift, float *x);

#endif
