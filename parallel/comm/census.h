/* Private to comm/mpi.c and comm/census.c: the census of who is waiting when a wait times out,
 * and the one way the job ends on a dead, stuck or mismatched peer. The functions that talk
 * MPI are called holding comm/mpi.c's lock (MPI calls are serialized there). */
#ifndef TR_COMM_CENSUS_H
#define TR_COMM_CENSUS_H

#ifdef TR_HAVE_MPI
#include <mpi.h>

/* A private duplicate of the world for the census's questions and answers: 0, or -1 (then no
 * census: a timeout's line says "a rank died or is stuck"). */
int tr_census_open(MPI_Comm world);
void tr_census_close(void);
/* Answer every rank that asked who is waiting (this one is). */
void tr_census_serve(void);
/* The census, one line naming `what` (an operation, described) and the ranks that did not
 * answer, tr_comm_on_abort's hook, and MPI_Abort; `before` runs only should that return. */
void tr_census_die(const char *what, void (*before)(void));
#endif

/* tr_comm_on_abort's hook, when one is set: the first silent rank (-1: unknown) and the line. */
void tr_census_tell_abort(int silent_rank, const char *line);

#endif
