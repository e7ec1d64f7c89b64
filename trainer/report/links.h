/* The ledger's watch on the network between hosts. Each step, every rank reads the same
 * gathered records: the least time any rank spent communicating (waiting included) is the
 * step's communication, which a straggler does not lengthen (it waits least). When its median
 * over 5 steps has been twice its best and 20 ms more for 4 steps in a row, every rank at once
 * times the links between hosts (tr_topology_host_rates) and the host whose transfers run at
 * less than half the rate of the others' is named (tr_topology_slow_host): rank 0 says so on
 * stdout and in ledger.jsonl ("kind": "slow_link"), and from then on the communication beyond
 * the best is charged as waiting for that host's first rank. Once per attempt. */
#ifndef TR_REPORT_LINKS_H
#define TR_REPORT_LINKS_H

#include <stdio.h>

#include "parallel/comm/comm.h"

typedef struct tr_links tr_links;

/* hosts: n names of TR_HOST_LEN bytes, rank by rank. NULL when the ranks share one host (no
 * link to watch) or memory runs out. */
tr_links *tr_links_open(tr_comm *world, const char *hosts, int n, int start_step);
void tr_links_free(tr_links *k);

/* Every rank, after each step's gather: comm_s[r], rank r's communication and waiting seconds
 * of the step. Rank 0 writes the alarm to stdout (tty: a fresh line first) and to events. */
void tr_links_step(tr_links *k, const double *comm_s, int step, FILE *events, int attempt,
                   int tty);

/* After the alarm named a host: the first rank of that host, and in *excess the seconds of
 * this step's communication beyond the best (what every rank elsewhere waited for it); -1
 * before, or when no one host was slow. */
int tr_links_blame(const tr_links *k, int rank, double *excess);

#endif
