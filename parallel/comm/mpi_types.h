/* MPI's datatype and sum of comm.h's element types (parallel/comm/mpi_types.c), for mpi.c. */
#ifndef TR_COMM_MPI_TYPES_H
#define TR_COMM_MPI_TYPES_H
#ifdef TR_HAVE_MPI

#include <mpi.h>

#include "parallel/comm/comm.h"

MPI_Datatype comm_mpi_type(tr_comm_dtype t);
/* The sum of t: MPI_SUM, or our own for bytes and bfloat16 (made by comm_mpi_sums_create after
 * MPI_Init, freed before MPI_Finalize). */
MPI_Op comm_mpi_sum(tr_comm_dtype t);
void comm_mpi_sums_create(void);
void comm_mpi_sums_free(void);

#endif
#endif
