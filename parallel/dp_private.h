/* Data parallelism's internals, shared by dp.c (gradients, the update) and dp_params.c (the
 * parameters: ZeRO-1/2's refresh after the update, ZeRO-3's per-op gathers). */
#ifndef TR_DP_PRIVATE_H
#define TR_DP_PRIVATE_H

#include <stdint.h>

#include "parallel/dp.h"
#include "parallel/masked.h"

typedef struct {
    int lo_param;      /* the tensor that completes the bucket (its lowest index) */
    size_t lo, hi;     /* slab element range */
    tr_comm_req *req;
    int done;
    /* ZeRO-2: the bucket splits into `world` equal pieces of `piece` elements (the last ones
       clipped at hi); rank r owns piece r, whose accumulated gradient and optimizer state sit
       at `state` in this rank's arrays */
    size_t piece, state;
    int slot; /* ring buffer holding its gradient during a micro-step, -1 = none */
    int hi_param;
    int pending; /* tensors of this backward still to complete */
    int started; /* its reduction of this backward has started */
    /* ZeRO-3: the bucket's parameters, all-gathered from every rank's piece while an op that
       reads them runs (and from the op before, prefetched). ZeRO-2: the gather's buffer when
       the bucket does not split exactly into pieces (dp_params.c) */
    tr_buf *full;
    tr_comm_req *preq; /* the gather in flight, NULL when complete or none */
    size_t roff;       /* ZeRO-2: its refresh buffer's place in tr_dp.rbuf (elements) */
    int nreq;          /* ZeRO-1, 2: its refresh's operations in flight (at rreq[k * world]) */
    int shift;         /* private gradients: its fixed point's scale exponent this step
                          (SHIFT_NONFINITE: a rank's gradient was not finite) */
    size_t qoff;       /* and where its masked elements and canary sit in tr_dp.mq */
} bucket;

/* ZeRO-2's ring: gradient buffers for the buckets being computed or reduced. */
typedef struct {
    tr_buf *buf;  /* (world * piece) elements of its bucket, while held (= gbuf) */
    tr_buf *recv; /* this rank's reduced piece (= grecv) */
    tr_buf *gbuf, *grecv; /* the slot's buffers, allocated at the start: world x cap, cap */
    size_t cap;           /* the piece it holds at most (0: no buffers) */
    int bucket;  /* the bucket it holds, -1 = free */
    tr_comm_req *req;
    long seq;    /* when its reduction started, to finish the oldest first */
    /* private gradients: the bucket as world pieces of piece + 1 (each ends in a canary) in
       host floats and masked, and this rank's summed piece; room for pieces of mcap */
    float *mx;
    uint32_t *mq, *mqr;
    size_t mcap;
    int shift;
} ring_slot;
#define RING 8 /* buckets open at once: an op's tensors, the held embedding, in flight */
#define GATHERS 8 /* ZeRO-3's gathered buckets allocated at the start, the largest ones: an
                     op's (at most 4) and the next op's, prefetched (full recompute's forward
                     holds more: those are allocated when first needed, in the first step) */

struct tr_dp {
    tr_model *m;
    const tr_backend *be; /* the model's: every buffer below except the host arrays */
    size_t es;            /* bytes of a storage element */
    tr_comm *c;
    int zero;    /* the stage, for messages; what it shards is in sh */
    tr_zero sh;
    int refresh; /* ZeRO-1, 2 over more than one rank: each rank updates its part of the
                    parameters, and the others' parts come back after the update */
    int world, rank;
    bucket *b;
    int n_buckets;
    int armed;
    double first_start, last_done;
    tr_dp_stats st;
    /* ZeRO-2 */
    int *bucket_of;      /* per parameter tensor */
    ring_slot ring[RING];
    tr_buf *sgrad;       /* this rank's pieces of the gradient, summed over micro-steps (the
                            storage dtype: a bf16 slab accumulates in bf16 too) */
    size_t sgrad_elems, ring_elems;
    size_t ring_bytes, ring_high; /* ring memory now and its high-water mark (measured) */
    tr_piece *pieces;
    long seq;
    /* ZeRO-1, 2, 3: per direction (0 forward, 1 backward) and op, the buckets the op reads
       (need_n of them at need[.][4 * op]) and the next op in that direction that reads any */
    int *need[2], *need_n[2], *next_user[2];
    /* ZeRO-1, 2: the refresh of the parameters after the update, per bucket */
    tr_comm_req **rreq;
    int rnext, rnext_j; /* the oldest refresh request that may still be in flight: request
                           rnext_j of bucket rnext (they start from the last bucket down);
                           rnext -1 when none is */
    int sync_refresh;   /* tr_dp_set_sync */
    int sync_reduce;    /* tr_dp_set_sync */
    size_t pbuf_bytes, pbuf_high; /* gathered parameter buffers now and their high-water mark */
    tr_buf *rbuf; /* ZeRO-2: the refresh buffers of the buckets that need one (bucket.roff) */
    int hold;                     /* keep gathered buckets (tr_dp_hold_params) */
    /* freed bucket buffers kept for reuse (fresh memory every micro-step costs page faults and
       the kernel's zeroing), only while what is held stays within the peaks measured so far */
    struct {
        tr_buf *p;
        size_t n; /* elements */
    } pool[2 * GATHERS];
    int n_pool;
    size_t pool_bytes;
    /* private gradients (tr_dp_set_private): the keys, each bucket's fixed point masked (its
       n elements and a canary at bucket.qoff) and the gradient in host floats */
    tr_masked *mask;
    uint32_t *mq;
    float *mx;
    uint64_t mseq;     /* reductions masked so far: each one's nonce */
    int mask_failed;   /* a masked sum did not cancel (tr_dp_sync_grads says so) */
    const char *dump_local; /* TR_DUMP_LOCAL_GRAD=P (tests/cluster/private_wire.sh): each dp
                               rank r writes its own gradient of the first bucket it sums to
                               P.r, as float32, before any mask; NULL once written */
    const char *dump_sent;  /* then, when masked, that bucket's message as sent (its fixed
                               point with the masks and the canary) to P.sent.r */
};


/* This rank's piece of bucket b (ZeRO-2, 3): its first slab element in *at (b->lo + rank x
 * piece), and how many of its elements lie inside the bucket (the last pieces are clipped at
 * the bucket's end, and may be empty). */
static inline size_t dp_piece(const tr_dp *d, const bucket *b, size_t *at) {
    *at = b->lo + (size_t)d->rank * b->piece;
    return *at >= b->hi ? 0 : b->hi - *at < b->piece ? b->hi - *at : b->piece;
}

/* n storage elements of backend memory from the pool (zeroed when asked), and back. */
tr_buf *dp_pool_take(tr_dp *d, size_t n, int zero);
void dp_pool_give(tr_dp *d, tr_buf *p, size_t n);
/* A collective on the model's buffers (its storage dtype, its memory); root: broadcast's. */
tr_comm_req *dp_coll(tr_dp *d, tr_comm_op op, const tr_buf *send, tr_buf *recv, size_t n,
                     int root);

/* dp_params.c. After the buckets are cut: the ops' needs, the op hook (ZeRO-1, 2 over more
 * than one rank, and 3); -1 when out of memory. */
int dp_params_init(tr_dp *d);
void dp_params_free(tr_dp *d);
/* ZeRO-1, 2, after the update: every bucket's refresh starts. */
void dp_refresh_start(tr_dp *d);
/* ZeRO-3: every gathered bucket released. */
void dp_z3_release_all(tr_dp *d);

#endif
