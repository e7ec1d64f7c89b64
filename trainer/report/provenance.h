/* Provenance of a run (trainer/report/provenance.c): OUT/provenance.json records what is needed to
 * repeat a run and to know whether a repeat may differ (the trainer's build, backend, device,
 * libraries, layout, command line, seeds, data and recipe), and tr_provenance_diff says what
 * differs between two such records and whether those differences can change the numbers.
 *
 * The document, as rank 0 of `trainer run` writes it at setup:
 *   trainer   {version, commit ("-dirty": uncommitted changes; "unknown" without git), built
 *              (UTC date of the build), binary (FNV-1a 64 of the executable's bytes)}
 *   build     {type, compiler, flags, cuda, emulator, sanitize, native}
 *   backend, device, driver (CUDA driver version; null on the CPU)
 *   libraries {blas, mpi, lua, yaml, cuda, cublaslt, cudnn, nccl} (null: not in this build)
 *   layout    {dp, tp, pp, zero, sequence_parallel, micro_batch, accumulation, ...}
 *   ranks, hosts (distinct host names), command (shell-quoted), cwd
 *   seeds     {train}: train.seed, which seeds the initialisation, the data shuffles and the
 *              end-of-run sample (the recipe has no other seed)
 *   data      {fingerprint (tr_loader_fingerprint, 16 hex digits), train, val}
 *   recipe    {file: FNV-1a 64 of OUT/recipe.lua's bytes as written; training: the same of the
 *              recipe without its output folder and layout (what the numbers depend on beyond
 *              the layout, which has fields of its own)}
 *   time (UTC ISO 8601 start), resume (the step resumed from, or null), attempt (1, 2, ...)
 */
#ifndef TR_PROVENANCE_H
#define TR_PROVENANCE_H

#include <stddef.h>

#include "data/json.h"

/* The build this binary comes from: made at build time by trainer/build_info.cmake into the
 * build folder (a rebuild after a commit updates it). Strings, never NULL. */
typedef struct {
    const char *version;  /* the CMake project's VERSION */
    const char *commit;   /* git hash, "-dirty" appended with uncommitted changes; "unknown" */
    const char *built;    /* UTC date, YYYY-MM-DD */
    const char *type;     /* CMAKE_BUILD_TYPE */
    const char *compiler; /* "GNU 12.2.0" */
    const char *flags;    /* the C flags of the build type */
    const char *cuda, *sanitize, *native; /* the options TR_CUDA, ...: "ON" / "OFF" */
} tr_build_info;
extern const tr_build_info tr_build;

/* More fields than a provenance document has: enough for tr_provenance_diff's out. */
#define TR_PROV_MAX_DIFFS 128

/* One field that differs between two provenance documents. */
typedef struct {
    char field[96]; /* flattened: "libraries.nccl", "layout.tp" */
    char a[256];    /* the value in a, compact JSON ("(absent)" when a lacks it), cut at 255 */
    char b[256];    /* the same in b */
    int numbers;    /* 1: a difference here can change the numbers (the losses, the weights) */
} tr_prov_diff;

/* Every field of a and b (parsed provenance.json documents) whose values differ, objects
 * flattened into dotted names, arrays compared whole: up to max of them into out (out may be
 * NULL when max is 0), in a's order then the fields only b has. Returns how many differ (which
 * may be more than max). Fields that cannot change the numbers: trainer.built, recipe.file
 * (it names the output folder; recipe.training and layout cover the rest), command, cwd,
 * hosts, time, resume, attempt; every other field, known or not, can. */
int tr_provenance_diff(const tr_json *a, const tr_json *b, tr_prov_diff *out, int max);

/* One line on whether two runs are comparable, from their n differences d (all of them, as
 * tr_provenance_diff returned them):
 *  - "bitwise comparable" (nothing differs that can change the numbers; the fields that do
 *    differ follow in parentheses);
 *  - "comparable within tolerance: differ in layout.tp, ..." (the same experiment run
 *    another way: another layout, build, device or library);
 *  - "different experiments: differ in seeds.train, ..." (recipe.training, seeds or data). */
void tr_provenance_verdict(const tr_prov_diff *d, int n, char *buf, size_t len);

/* FNV-1a 64 of n bytes, continuing from h (start with TR_FNV1A_START). */
#define TR_FNV1A_START 0xcbf29ce484222325ULL
unsigned long long tr_fnv1a(unsigned long long h, const void *p, size_t n);

#endif
