/* Whether a process has a core to spare beside its compute: the rule that turns the
 * communication progress agent (comm/mpi.c) on by default. No MPI here (tests/test_comm.c). */
#ifndef TR_COMM_CORES_H
#define TR_COMM_CORES_H

#include <stddef.h>

typedef struct {
    long online;  /* the machine's cores online */
    long allowed; /* the cores this process may run on (its affinity) */
    long threads; /* its compute threads */
    int ranks;    /* the ranks on its node, this one included */
} tr_node_cores;

/* This process's view, with `ranks` on its node: threads from OMP_NUM_THREADS (its first
 * number), or one per allowed core when unset or not a count, as OpenMP's default is. */
tr_node_cores tr_node_cores_here(int ranks);

/* 1 when a thread beside the compute has a core of its own: the node's ranks' threads leave
 * one of its cores idle (ranks x threads < online) and this process may run on more cores
 * than its threads. why (when not NULL): the figures, as "4 ranks x 1 thread on 2 cores". */
int tr_spare_core(const tr_node_cores *c, char *why, size_t n);

#endif
