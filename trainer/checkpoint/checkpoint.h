/* Checkpoints (trainer/checkpoint/) and Hugging Face interchange (trainer/checkpoint/export.c).
 *
 * Layout: OUT/checkpoints/step_NNNNNNNN/ holds manifest.yaml and one safetensors file per
 * writing rank (rank_RRRRR.safetensors); OUT/checkpoints/latest names the newest complete one.
 * The manifest (YAML) records the step, the resolved recipe and its SHA-256, the model
 * description, the parallel layout, the RNG seed, the loader position, the guard's state (when
 * the guard is on), and for every global
 * tensor its shape, dtype and slices (file, key, start, shape, CRC32C). Its last line is a YAML
 * comment `# crc32c: XXXXXXXX` over every byte before it.
 *
 * A save is written into a temporary folder, fsynced, renamed into place, and only then is
 * `latest` replaced (also by rename), so a process killed at any point leaves nothing that a
 * resume would take. Saves run on a writer thread: the caller stalls only for the host copy of
 * the state (on the CPU backend the copy itself overlaps the next step's forward/backward and
 * only has to finish before the next optimizer update: tr_ckpt_fence). */
#ifndef TR_CHECKPOINT_H
#define TR_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "data/json.h"
#include "data/loader.h"
#include "dsl/recipe.h"
#include "model/model.h"
#include "parallel/layout.h"

/* ---- checksums ------------------------------------------------------------------------- */

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the iSCSI/ext4 checksum: start with
 * crc = 0; tr_crc32c(tr_crc32c(0, a, n), b, m) == tr_crc32c(0, a||b, n+m). Uses the SSE4.2
 * instruction when the build has it. */
uint32_t tr_crc32c(uint32_t crc, const void *data, size_t n);

/* SHA-256 (FIPS 180-4) of data as 64 lowercase hex digits. */
void tr_sha256_hex(const void *data, size_t n, char hex[65]);

/* ---- safetensors --------------------------------------------------------------------------
 * u64 little-endian header length N, N bytes of JSON {"name": {"dtype", "shape",
 * "data_offsets": [begin, end]}, ..., "__metadata__": {string: string}}, then the data. */

typedef enum { TR_ST_F32 = 0, TR_ST_F16, TR_ST_BF16, TR_ST_OTHER } tr_st_dtype;

typedef struct {
    char name[TR_PARAM_NAME_MAX + 16];
    tr_st_dtype dtype;
    int ndim;
    long shape[4];
    size_t begin, end; /* byte offsets into the data */
} tr_st_entry;

typedef struct {
    char path[TR_PATH_MAX];
    unsigned char *buf; /* the whole file, memory-mapped (read-only) */
    size_t size;
    const unsigned char *data; /* after the header */
    size_t data_len;
    int n;
    tr_st_entry *e;
} tr_st_file;

/* Map a safetensors file and check its header against its size (a truncated file is
 * refused). Messages name the file. */
int tr_st_open(tr_st_file *f, const char *path, char *err, size_t errlen);
const tr_st_entry *tr_st_find(const tr_st_file *f, const char *name);
/* Tensor e as fp32 (F32, F16 and BF16 are converted). */
int tr_st_read_f32(const tr_st_file *f, const tr_st_entry *e, float *out, char *err,
                   size_t errlen);
void tr_st_close(tr_st_file *f);

typedef struct {
    const char *name;
    int ndim;
    long shape[2];
    const float *data;
} tr_st_tensor;

/* Write tensors as one F32 safetensors file (fsynced); metadata: NULL or "k1", "v1", ...,
 * NULL pairs. */
int tr_st_write(const char *path, const tr_st_tensor *t, int n, const char *const *metadata,
                char *err, size_t errlen);

/* ---- the guard's state -------------------------------------------------------------------
 * What the NaN and spike guard (trainer/run/guard.c) decides from, kept in every checkpoint (the
 * manifest's `guard` section) so that a resumed or rolled-back run judges its steps as the
 * uninterrupted run does: the ring of the last accepted steps' losses and gradient norms (kept
 * in ring order, the order the z-scores sum them in), the bad steps in a row, and the
 * checkpoint the last rollback went to. Doubles are written with 17 significant digits, which
 * read back bitwise. */
typedef struct {
    int window, n, next;         /* the ring's slots (2..10000), those filled, the next written */
    double *loss, *norm;         /* n values each (window allocated, in a tr_ckpt) */
    int bad, first_bad;          /* bad steps in a row; the first of them (from 1) */
    int rolled_to;               /* the last rollback's checkpoint step; -1: none */
    double last_loss, last_norm; /* of the last bad step (may be NaN or infinite) */
} tr_ckpt_guard;

/* ---- saving ----------------------------------------------------------------------------- */

typedef struct tr_ckpt_writer tr_ckpt_writer;

typedef struct {
    const char *out; /* the run folder; checkpoints go to OUT/checkpoints/ */
    int keep;        /* newest checkpoints kept (>= 1) */
    /* Several writers: every rank of the group has a writer and calls tr_ckpt_save for the
     * same steps; each writes rank_RRRRR.safetensors with the parameters and AdamW moments of
     * the slab ranges it keeps, `ranges` ([lo, hi) pairs of elements of its own slab, n_ranges
     * of them; NULL: the whole slab), as blocks of the global tensors (tensor parallelism: the
     * rows and columns its tensors hold there; segments another rank also holds are written by
     * their copy 0 only; pipeline parallelism: the tensors of its stage, the last stage's copy
     * of a tied embedding left to the first). Over all ranks every element of every global
     * tensor (those of the one-process model, whichever stage holds them) must be written
     * exactly once: rank 0 waits for the others' block lists, checks that (a gap, an overlap
     * or a tensor no rank wrote fails the save, naming the tensor and element), writes the
     * manifest and publishes the checkpoint. OUT must be one folder shared by the ranks. */
    int rank, world;
    const size_t *ranges;
    int n_ranges;
    /* How long anything may wait for a save (rank 0 for another rank's block list, the
     * caller for its writer thread): timeout_s plus the time to write this rank's state at
     * 20 MB/s. Past that the save is taken as stuck (a hung disk, a rank that died under a
     * launcher that does not clean up): rank 0 fails the save; a caller whose own writer is
     * stuck prints one line and exits with status 1. 0: an hour. */
    double timeout_s;
    /* The run's resolved layout (parallel/layout.h), recorded in the manifest's parallel
     * section (loading does not need it: the blocks say where everything is): its dp x tp x pp
     * must be world; its ZeRO stage and sequence parallelism are written as they are. */
    tr_layout layout;
    int sync;        /* 1: tr_ckpt_save returns once the checkpoint is on disk (benchmarks) */
    /* Fault injection for tests (trainer/run/env.c reads TR_FAULT_SAVE_BYTES and
     * TR_FAULT_SAVE_HANG): the process aborts once fault_bytes bytes of checkpoint writes are
     * done (0: never); fault_hang 1: the writer's first write never returns (a hung disk). */
    long long fault_bytes;
    int fault_hang;
    int overlap;     /* 1: copy the state on the writer thread while the caller goes on with
                      * forward/backward (needs concurrent reads of the model to be safe: the
                      * CPU backend); the caller must tr_ckpt_fence before the next update */
} tr_ckpt_opts;

typedef struct {
    int saves, failed;
    double stall_s;    /* caller time spent in tr_ckpt_save and tr_ckpt_fence */
    double copy_s;     /* host copy of the state */
    double write_s;    /* writing, checksums, fsync, rename (writer thread) */
    double last_write_s;
    size_t bytes;      /* bytes of the last save */
} tr_ckpt_stats;

/* `recipe` is the fully resolved recipe (saved in every manifest). */
int tr_ckpt_writer_init(tr_ckpt_writer **out, tr_model *m, const tr_recipe *recipe,
                        const tr_ckpt_opts *opts, char *err, size_t errlen);
/* Save the state after `step` optimizer steps, with the loader position and the guard's state
 * (each NULL: none; both are copied before the call returns). Waits (and says so) if the
 * previous save is still being written. Returns seconds the caller was held. */
double tr_ckpt_save(tr_ckpt_writer *w, long step, const tr_loader_pos *pos,
                    const tr_ckpt_guard *guard);
/* Wait until the state copy of the last save is done: call before changing the parameters or
 * the optimizer state. Returns seconds waited. */
double tr_ckpt_fence(tr_ckpt_writer *w);
/* Wait for the save in flight; -1 with a message when any save failed. */
int tr_ckpt_wait(tr_ckpt_writer *w, char *err, size_t errlen);
tr_ckpt_stats tr_ckpt_writer_stats(const tr_ckpt_writer *w);
/* Waits for the save in flight, stops the thread. NULL is a no-op. */
void tr_ckpt_writer_free(tr_ckpt_writer *w);

/* ---- loading ---------------------------------------------------------------------------- */

typedef struct {
    const unsigned char *src; /* fp32 rows of the block, in a mapped file */
    long start[2], shape[2];  /* a rectangle of the global tensor */
    uint32_t crc;             /* the manifest's CRC32C of the block */
    int verified;             /* its bytes were checked against crc */
    const char *file;         /* for messages: the file it is in */
    const char *key;
} tr_ckpt_block;

typedef struct {
    char name[TR_PARAM_NAME_MAX + 16]; /* "x.weight", "adam_m/x.weight", "adam_v/x.weight" */
    int ndim;
    long shape[2]; /* the global tensor's (shape[1] = 1 for vectors) */
    size_t numel;
    /* the whole tensor when it is one block of one file (in place) or was materialized
     * (tr_ckpt_materialize); else NULL, and the blocks tell where its parts are */
    float *data;
    int owned; /* data was allocated (else it points into a mapped file) */
    int n_blocks;
    tr_ckpt_block *blocks;
} tr_ckpt_tensor;

typedef struct {
    char dir[TR_PATH_MAX];
    long step, adam_steps;
    unsigned long long seed;
    tr_loader_pos loader;
    int has_loader;
    tr_ckpt_guard guard; /* when has_guard: checkpoints of older trainers and of runs with the
                            guard off have none */
    int has_guard;
    char *recipe; /* the resolved recipe text */
    char recipe_sha256[65];
    /* the layout that saved it (the manifest's parallel section; 0 where not recorded): for
     * messages and `trainer show`, loading does not need it */
    int world, dp, tp, pp, chunks, zero, sequence_parallel;
    /* its pipeline (chunks > 1): the schedule (tr_pp_kind), chunks per stage, micro-batches per
     * step, and chunk c = blocks [chunk_start[c], chunk_start[c + 1]) when has_stages. A
     * checkpoint of an older trainer records none of them: schedule -1 and microbatches 0 (not
     * known), virtual_stages chunks / pp, has_stages 0 (not known). */
    int schedule, virtual_stages, microbatches, has_stages;
    int chunk_start[TR_MAX_CHUNKS + 1];
    int n;
    tr_ckpt_tensor *t;
    int n_files;
    tr_st_file *files;
    char **keys; /* the blocks' keys (for messages) */
    int n_keys;
} tr_ckpt;

/* Read and verify a checkpoint folder (manifest checksum, file sizes, each tensor's blocks
 * holding each of its elements once, every block's CRC32C).
 * with_optimizer = 0 skips the AdamW moments. Messages name the damaged file. The files are
 * memory-mapped and a tensor written in blocks by several ranks is not assembled: a process
 * reads the parts it needs (tr_ckpt_read_elems), so loading a sharded checkpoint never holds a
 * whole copy of the model in memory. */
int tr_ckpt_read(tr_ckpt *c, const char *dir, int with_optimizer, char *err, size_t errlen);
/* The same, checking each block's CRC32C only when it is first read (tr_ckpt_read_elems, and
 * so tr_ckpt_apply): a rank of a sharded run then reads and checks only the blocks that hold
 * its part. A damaged block shows as an error of the read or apply. */
int tr_ckpt_read_lazy(tr_ckpt *c, const char *dir, int with_optimizer, char *err, size_t errlen);
const tr_ckpt_tensor *tr_ckpt_find(const tr_ckpt *c, const char *name);
/* Elements [lo, hi) of the flattened global tensor into dst (checking the blocks it touches
 * if they were not yet); -1 with a message naming the file when one is damaged. */
int tr_ckpt_read_elems(const tr_ckpt_tensor *t, size_t lo, size_t hi, float *dst, char *err,
                       size_t errlen);
/* The complete checkpoints under OUT/checkpoints (step numbers, malloc'ed) in the order to
 * resume from them: the one OUT/checkpoints/latest names first, then the others newest first. */
int tr_ckpt_steps(const char *out, long **steps);
/* After a rollback to the checkpoint of `step` (trainer/run/guard.c): the newer checkpoints (of
 * steps that are trained again on other data) are removed and `latest` names step's again.
 * -1 with a message when `latest` cannot be written. */
int tr_ckpt_remove_after(const char *out, long step, char *err, size_t errlen);
/* `trainer run --overwrite`: every checkpoint in OUT/checkpoints, `latest` and unfinished
 * saves removed (a user's own files there stay). The number removed, or -1 with a message. */
int tr_ckpt_remove_all(const char *out, char *err, size_t errlen);
/* Give every tensor whole data (assembling those in blocks); -1 when out of memory. */
int tr_ckpt_materialize(tr_ckpt *c, char *err, size_t errlen);
/* Copy the checkpoint's parameters (and, when present, AdamW moments and step count) into
 * the model, whatever layout saved it: every tensor the model holds (a pipeline stage: its
 * own, and the last stage's copy of a tied embedding from the embedding's), whose global
 * shape must be the model's gshape,
 * and only the parts the model keeps (tr_model_held_parts) are read, from where they lie in the
 * global tensor (tr_param_runs). -1 when a tensor is missing, has another shape (the message
 * names it and both shapes), or (lazy) a block it reads is damaged; nothing is changed when a
 * tensor is missing or of another shape. */
int tr_ckpt_apply(const tr_ckpt *c, tr_model *m, char *err, size_t errlen);
void tr_ckpt_free(tr_ckpt *c);

/* The checkpoint OUT/checkpoints/latest names, or when it is damaged or latest names none, the
 * newest other that verifies; every one skipped, and a missing latest, get a line on `log`.
 * Returns 0 (c filled), 1 when there is none, -1 on error. */
int tr_ckpt_find_resume(const char *out, tr_ckpt *c, int with_optimizer, FILE *log, char *err,
                        size_t errlen);

/* A checkpoint folder given on a command line: a step folder, or a run folder (its newest
 * good checkpoint). */
int tr_ckpt_open_arg(const char *arg, tr_ckpt *c, int with_optimizer, FILE *log, char *err,
                     size_t errlen);

/* Compare the recipe a checkpoint was saved with against the current one: -1 with the fields
 * that matter (model, data, optimizer, schedule, batch, micro-batch, seed) listed in err;
 * harmless differences (steps, evaluation, logging, sampling, checkpoint settings, out) are
 * printed to log, one line each. */
int tr_ckpt_compare_recipes(const tr_recipe *saved, const tr_recipe *now, FILE *log, char *err,
                            size_t errlen);

/* ---- Hugging Face (trainer/checkpoint/export.c)
 * ------------------------------------------------------ */

/* Which Hugging Face architecture a model description maps onto: GPT2LMHeadModel or
 * LlamaForCausalLM; NULL with the reason otherwise. Fills the number of blocks. */
const char *tr_hf_arch(const tr_model_desc *d, int *n_layers, char *err, size_t errlen);
/* Write OUT_DIR/config.json and OUT_DIR/model.safetensors from a checkpoint. vocab: the
 * tokenizer's vocabulary (0: not known). Below the model's, the embedding and head keep their
 * first `vocab` rows and config.json says vocab_size = vocab: the padding rows (50257 padded
 * to 50304) are left out; GPT-2's 50257 also sets bos/eos_token_id to 50256. */
int tr_hf_export(const tr_ckpt *c, const tr_model_desc *d, int vocab, const char *out_dir,
                 char *err, size_t errlen);
/* The tokenizer files of data's tokenizer in OUT_DIR (trainer/checkpoint/export_tokenizer.c),
 * for transformers' AutoTokenizer; *names lists them for messages. */
int tr_hf_export_tokenizer(const tr_data_desc *d, int seq_len, const char *out_dir,
                           const char **names, char *err, size_t errlen);
/* Load a Hugging Face model folder (config.json + model.safetensors) into m's parameters;
 * -1 when the architecture or a shape does not match the model. A folder whose vocab_size is
 * below the model's vocabulary but at least real_vocab (the tokenizer's; 0: none such) is an
 * export without the padding rows: it fills the first rows, the padding rows are zero. */
int tr_hf_import(tr_model *m, const char *hf_dir, int real_vocab, char *err, size_t errlen);

int tr_cmd_export(int argc, char **argv);

#endif
