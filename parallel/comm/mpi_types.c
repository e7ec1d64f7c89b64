/* MPI's side of comm.h's element types: the MPI datatype of each, and the sums MPI does not
 * have (bytes mod 256, bfloat16). Only in a build with MPI. */
#include "parallel/comm/mpi_types.h"

#include <stdint.h>
#include <string.h>

#ifdef TR_HAVE_MPI

MPI_Datatype comm_mpi_type(tr_comm_dtype t) {
    /* MPI_SUM is not defined on MPI_BYTE; MPI_UINT8_T sums (mod 256) and moves the same. */
    switch (t) {
    case TR_COMM_F32:
        return MPI_FLOAT;
    case TR_COMM_F64:
        return MPI_DOUBLE;
    case TR_COMM_I32:
        return MPI_INT32_T;
    case TR_COMM_I64:
        return MPI_INT64_T;
    case TR_COMM_BF16:
        return MPI_UINT16_T;
    case TR_COMM_BYTE:
        break;
    }
    return MPI_UINT8_T;
}

/* Sum of bytes mod 256 as our own op: Open MPI 4.1.4's AVX reductions (op/avx) add 8-bit
 * integers with saturation in some paths (MPI_Ireduce_scatter_block gives 255 for 200 + 200). */
static MPI_Op g_byte_sum = MPI_OP_NULL;

static void byte_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint8_t *a = in;
    uint8_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = (uint8_t)(b[i] + a[i]);
}

/* bfloat16 sums: in fp32, rounded to nearest even (NCCL's bf16 sum rounds each addition
 * too; the order of additions differs between algorithms, as it does between NCCL's) */
static MPI_Op g_bf16_sum = MPI_OP_NULL;

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

MPI_Op comm_mpi_sum(tr_comm_dtype t) {
    return t == TR_COMM_BYTE ? g_byte_sum : t == TR_COMM_BF16 ? g_bf16_sum : MPI_SUM;
}

void comm_mpi_sums_create(void) {
    if (g_byte_sum == MPI_OP_NULL) MPI_Op_create(byte_sum, 1, &g_byte_sum);
    if (g_bf16_sum == MPI_OP_NULL) MPI_Op_create(bf16_sum, 1, &g_bf16_sum);
}

void comm_mpi_sums_free(void) {
    if (g_byte_sum != MPI_OP_NULL) MPI_Op_free(&g_byte_sum);
    if (g_bf16_sum != MPI_OP_NULL) MPI_Op_free(&g_bf16_sum);
}
#endif
