/* Between the host transport (comm/mpi.c) and the device transport (comm/device.c), which
 * is built with the CUDA backend (for real, or on the CUDA emulator in tests/) and registers
 * itself at tr_comm_device_init: comm/mpi.c owns groups, requests, deadlines and the one line
 * a failure prints; comm/device.c owns streams, events, NCCL communicators and staging. */
#ifndef TR_COMM_PRIVATE_H
#define TR_COMM_PRIVATE_H

#include "parallel/comm/comm.h"

/* One device operation, as comm/mpi.c describes it in messages. */
typedef struct {
    tr_comm_op op;
    size_t n;
    tr_comm_dtype t;
    int peer, tag;
} tr_comm_desc;

typedef struct {
    /* start o on c (every rank of c starts its operations in the same order); NULL after
       printing why when it cannot */
    void *(*start)(tr_comm *c, const tr_comm_desc *o, const void *send, void *recv);
    int (*test)(void *req);      /* 1 when complete */
    double (*wait)(void *req);   /* order the compute stream after it; frees req; returns the
                                    seconds the host waited (0 unless staged) */
    void (*group_free)(void *g); /* a group's device state (tr_comm_device_slot) */
    const char *(*transport)(const void *g);
    void (*times)(void *g, double *span_s, double *exposed_s); /* tr_comm_device_time */
    /* tr_comm_open_channels on device memory, the list checked */
    void (*open_channels)(tr_comm *c, const tr_comm_channel *list, int n);
} tr_comm_device_ops;

/* comm/device.c calls these (comm/mpi.c defines them). */
/* Bytes of one element of t. */
size_t tr_comm_dtype_bytes(tr_comm_dtype t);
void tr_comm_register_device(const tr_comm_device_ops *ops);
/* The group's device state: NULL until its first device operation. */
void **tr_comm_device_slot(tr_comm *c);
/* Bytes a bandwidth-optimal algorithm sends for o on c, added to tr_comm_bytes_sent. */
void tr_comm_count_bytes(tr_comm *c, const tr_comm_desc *o);
/* TR_COMM_DEVICE as tr_comm_init checked it: 0 unset (NCCL where every rank of a group has a
 * GPU of its own), 1 nccl (even in a group of one), 2 staged. */
int tr_comm_device_choice(void);
/* The job's timeout in seconds (tr_comm_init). */
double tr_comm_timeout(void);
/* "all_reduce of 1024 bf16s on group dp (size 2)" */
void tr_comm_describe(char *buf, size_t len, const tr_comm *c, const tr_comm_desc *o);
/* A device operation did not complete in time: the census of who is waiting, one line, and
 * the job ends (MPI_Abort; `before`, aborting the NCCL communicators, only if that returns).
 * Safe from the watchdog thread. */
void tr_comm_die_timeout(const tr_comm *c, const tr_comm_desc *o, void (*before)(void));
/* This process's world rank, for messages. */
int tr_comm_world_rank(void);
/* Answer other ranks asking who is waiting (the watchdog calls it while device operations
 * are in flight: this rank is then waiting on communication). */
void tr_comm_serve_census(void);

#endif
