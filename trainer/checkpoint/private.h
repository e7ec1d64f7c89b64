/* Private to the checkpoint code (trainer/checkpoint/): what saving and loading share. The
 * public interface is trainer/checkpoint/checkpoint.h.
 *   checkpoint/files.c     checksums, whole-file writes and reads, folders, safetensors
 *   checkpoint/manifest.c  the global tensors' blocks (made, checked) and the manifest text
 *   checkpoint/save.c      the writer thread, rank files, rank 0's merge and publishing
 *   checkpoint/load.c      reading and verifying, element ranges, apply, resume choice
 *   checkpoint/recipe.c    comparing the saved recipe with the current one */
#ifndef TR_CHECKPOINT_PRIVATE_H
#define TR_CHECKPOINT_PRIVATE_H

#include <stddef.h>
#include <stdint.h>

#include "parallel/comm/base.h"
#include "trainer/checkpoint/checkpoint.h"

#define CKPT_FORMAT "trainer-checkpoint"
#define CKPT_VERSION 1

/* ---- checkpoint/files.c ---- */

/* Write a file from n pieces so that it appears whole or not at all: written to a temporary
 * beside it, fsynced, renamed over `path`. */
int ck_write_file(const char *path, const void *const *parts, const size_t *lens, int n, char *err,
                  size_t errlen);
/* The whole file, malloc'ed with a NUL after it. */
int ck_read_whole(const char *path, unsigned char **buf, size_t *size, char *err, size_t errlen);
int ck_fsync_dir(const char *dir);
/* Remove a flat folder (files only) and the folder itself. */
void ck_remove_dir(const char *dir);
/* Steps of the complete checkpoints in dir (step_NNNNNNNN folders), newest first. */
int ck_list_steps(const char *dir, long **steps);
/* The same in the order to try them: the one `latest` names first (the truth: a save cut
 * before it renamed `latest`, or an earlier run, may have left others), then the others
 * newest first; when `latest` names none of them, newest first, said on log (may be NULL). */
int ck_resume_order(const char *dir, long **steps, FILE *log);
/* The "u64 length + header JSON" prefix of an F32 safetensors file holding t[0..n), padded so
 * that the data start at a multiple of 8 bytes; malloc'ed. */
unsigned char *ck_st_header(const tr_st_tensor *t, int n, const char *const *meta, size_t *out_len);
/* Fault injection for tests (tr_ckpt_opts' fault_bytes and fault_hang) for the files written
 * from now on. */
void ck_fault_init(long long fault_bytes, int fault_hang_on);

/* ---- checkpoint/manifest.c ---- */

/* One block of a global tensor as the manifest lists it: the rectangle [start, start + shape)
 * (rows x columns in the global tensor; one dimension for vectors), stored under `key` in
 * rank `rank`'s file. A rank writes the blocks of the slab ranges it keeps; a block's elements
 * lie back to back in this rank's tensor from local element `local` (row-major), and its
 * first element is global element `flat` of the flattened global tensor. */
typedef struct {
    int param, kind; /* tr_model_param index; -1 parameters, 0 adam_m, 1 adam_v */
    int gparam;      /* the global tensor: its index in the one-process model (ranks of a
                        pipeline hold different tensors, so their local indices differ) */
    int rank;
    int ndim;
    long start[2], shape[2];
    size_t flat, count;
    size_t local;  /* this rank's blocks: the local element of the first one */
    size_t offset; /* floats into the snapshot buffer (this rank's blocks) */
    uint32_t crc;
} slice_info;

typedef struct {
    long step, adam_steps;
    tr_loader_pos pos;
    tr_ckpt_guard guard; /* its ring in the writer's own arrays (cap doubles each) */
    int has_guard, guard_cap;
} snap_meta;

/* Append the blocks of the global tensor `gparam` that local elements [lo, hi) of tensor p
 * (parameter index `param`, kind -1, 0, 1) hold, leaving out the segments another copy writes
 * (tr_param_seg.copy != 0) and a pipeline replica (tr_param.pp_copy: the embedding's stage
 * writes it); -1 when out of memory. */
int ck_add_blocks(slice_info **sl, int *n, int *cap, const tr_param *p, int param, int gparam,
                  int kind, int rank, size_t lo, size_t hi);
/* Sort blocks by (kind, global tensor, first element): the manifest's order. */
void ck_sort_blocks(slice_info *sl, int n);
/* Blocks b[0..nb) of one global tensor (ndim 1 or 2, its shape gshape; any order) must hold
 * each of its elements exactly once: -1 with a message naming the tensor and the first
 * element in no block or in two (or a block outside it). */
int ck_check_tensor_cover(const char *name, int ndim, const long gshape[2], const slice_info *b,
                          int nb, char *err, size_t errlen);
/* Every rank's blocks, sorted: each element of each global tensor (parameters and both AdamW
 * moments) of g, the one-process model (every tensor of every pipeline stage), must be in
 * exactly one block; -1 with a message naming the tensor and the first element written twice
 * or by no rank. */
int ck_check_cover(const tr_model *g, const slice_info *sl, int n, char *err, size_t errlen);
/* The global name of a block's tensor, and its key in the rank's file. */
void ck_slice_names(const tr_param *p, const slice_info *s, char *name, size_t nlen, char *key,
                    size_t klen);
/* The manifest text (with its trailing checksum comment), from every rank's blocks sorted by
 * (kind, global tensor, position), g (the one-process model: the global tensors' names and
 * shapes), the layout in o (world, dp, tp, pp, zero, sequence_parallel) and the pipeline's
 * chunk count; malloc'ed, NULL when libyaml fails. */
char *ck_manifest_text(unsigned long long seed, const char *recipe_text, const char *sha,
                       const tr_model_desc *d, const tr_model *g, const snap_meta *sm,
                       const slice_info *sl, int n_sl, const size_t *file_bytes,
                       const tr_ckpt_opts *o, int n_chunks, size_t *out_len);

#endif
