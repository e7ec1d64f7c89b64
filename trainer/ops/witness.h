/* The supervisor as a witness of who is still connected. A rank that gives up on a job (a peer
 * did not answer within --timeout) writes a "failed" line naming the peer it blames; when a
 * host's link is cut, both sides of the cut blame each other in the file, and nothing in it
 * says which side lost the network. So each such rank also tells the supervisor over TCP: the
 * side the supervisor hears from is the one still connected to it, and its view wins
 * (trainer/ops/supervise_records.c). A rank that cannot reach the supervisor (the one cut off,
 * a firewall, no supervisor at all) only loses its vote.
 *
 * The supervisor listens on every address of its host and writes them to OUT/supervise.addr
 * before it launches the command ("PORT NONCE ADDR..."); each rank reads that file when its
 * ledger opens, while the network is sound (trainer/report/ledger.c). */
#ifndef TR_WITNESS_H
#define TR_WITNESS_H

#include <stddef.h>

/* The supervisor's side: a listening socket, and OUT/supervise.addr written atomically; -1 and
 * why in err when not possible (the supervisor then goes on without a witness). */
typedef struct tr_witness tr_witness;
tr_witness *tr_witness_listen(const char *out, char *err, size_t elen);
/* The reports that arrived since the last call, without waiting: fn(ctx, attempt, rank) for
 * each rank that told it it gave up. */
void tr_witness_collect(tr_witness *w, void (*fn)(void *ctx, int attempt, int rank), void *ctx);
/* Stops listening and removes OUT/supervise.addr. NULL is fine. */
void tr_witness_close(tr_witness *w);

/* The rank's side: the supervisor's addresses, read from OUT/supervise.addr now (0 when there
 * is none: nothing will be told). */
int tr_witness_prepare(const char *out);
/* Tells the supervisor that this rank (of this attempt) gave up, trying each address for at
 * most a second in all; quietly nothing when it cannot be reached. */
void tr_witness_tell(int attempt, int rank);

#endif
