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
    int given;    /* threads is OMP_NUM_THREADS's */
} tr_node_cores;

/* The compute threads of each of `ranks` processes on a node of `online` cores, each allowed
 * `allowed` of them, when the user does not say: the node's cores shared among its ranks, at
 * most the allowed, at least 1. OpenMP's own default, a thread per allowed core, gave each
 * of 4 ranks on 2 cores 2 threads: their steps ran 1.09-3.0x slower, and the planner's probes,
 * timed on threads that wait for each other's turns, priced them 3.3-13x too slow
 * (bench/threads.sh). */
long tr_node_threads(long online, long allowed, int ranks);

/* This process's view, with `ranks` on its node: threads from OMP_NUM_THREADS (its first
 * number; given), or tr_node_threads() when unset or not a count. The CPU backend runs that
 * many (trainer/util.c's tr_choose_backend sets them). */
tr_node_cores tr_node_cores_here(int ranks);

/* 1 when a thread beside the compute has a core of its own: the node's ranks' threads leave
 * one of its cores idle (ranks x threads < online) and this process may run on more cores
 * than its threads. why (when not NULL): the figures, as "4 ranks x 1 thread on 2 cores". */
int tr_spare_core(const tr_node_cores *c, char *why, size_t n);

#endif
