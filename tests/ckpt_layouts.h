/* Shared by test_ckpt_pp.c and test_ckpt_tp.c: checkpoints saved from and loaded into layouts
 * (dp x pp x tp, virtual stages, ZeRO stage). Every rank of a layout builds its part of a model
 * case, sets its parameters and AdamW moments to values derived from each global tensor's name
 * and element index, and saves; every checkpoint is loaded into every layout and every element
 * a rank keeps is compared bitwise; the Hugging Face export of each checkpoint must be the
 * reference layout's byte for byte, and importing that export must give the reference values.
 * Under mpirun -np 2 or -np 4; alone, one process plays every rank of the layouts without dp
 * or tp in turn. Test code only. */
#ifndef TR_TESTS_CKPT_LAYOUTS_H
#define TR_TESTS_CKPT_LAYOUTS_H

#include <stddef.h>

#include "dsl/recipe.h"
#include "model/model.h"
#include "parallel/comm/comm.h"
#include "parallel/dp.h"
#include "parallel/layout.h"

typedef struct {
    const char *name, *recipe;
    int pad_vocab;
} ckl_case;

/* v: chunks per stage (virtual stages; stage p holds chunks p, p + pp, ...). bare: one process
 * as the trainer builds it without parallelism (no padded vocabulary, no data-parallel
 * runtime); only dp = pp = tp = v = 1, zero 0. zbv: with v 2, zb-v's V (stage p holds chunks
 * p and 2 pp - 1 - p). */
typedef struct {
    int dp, pp, tp, zero, v, bare, zbv;
} ckl_layout;

/* One rank's part of a layout: its model, data-parallel runtime and groups. */
typedef struct {
    tr_model *m;
    tr_dp *d;
    tr_comm *dpc, *ppc, *tpc;
} ckl_part;

extern int ckl_fails, ckl_me, ckl_world; /* failures of this process so far; rank, world */
extern tr_comm *ckl_comm;
extern const char *ckl_root; /* the test's folder */

/* A failure: counted, and printed as "FAIL rank R: message". */
#ifdef __GNUC__
__attribute__((format(printf, 1, 2)))
#endif
void ckl_bad(const char *fmt, ...);

/* The world (1 rank when alone_ok, 2 or 4), the model cases and a fresh folder under /tmp
 * named after the test. 0 to go on, else the exit code (77: skipped, 1: failed). */
int ckl_start(int *argc, char ***argv, const char *test, const ckl_case *cases, int alone_ok);
/* Every rank's failures summed, the folder removed, "ok"/"FAIL" printed; the exit code. */
int ckl_end(void);
/* Model case mc's recipe into r; -1 (a failure) if it does not load. */
int ckl_recipe(int mc, tr_recipe *r);

/* Everything for model case mc over layouts ls[0..nl), ls[0] the reference (one process):
 * every layout saves, every checkpoint is loaded into every layout, every export compared
 * with the reference's and the reference's imported into every layout. */
void ckl_matrix(const tr_recipe *r, int mc, const ckl_layout *ls, int nl);

/* The pieces, for a test's own cases. */
void ckl_layout_name(char *buf, size_t n, const ckl_layout *l);
void ckl_dir(char *buf, size_t n, int mc, const ckl_layout *l); /* l's checkpoint folder */
/* Where l's chunk c starts (an even cut of the blocks), and the layout its checkpoints record:
 * that cut, run by interleaved (v > 1) or 1f1b over 2 x pp micro-batches. */
int ckl_chunk_start(const tr_recipe *r, const ckl_layout *l, int c);
tr_layout ckl_saved_layout(const tr_recipe *r, const ckl_layout *l);
/* The groups of l over the world (every rank calls it); then rank's model of l. */
int ckl_groups(ckl_part *pt, const ckl_layout *l);
int ckl_build(ckl_part *pt, const tr_recipe *r, int mc, const ckl_layout *l, int rank);
void ckl_unbuild(ckl_part *pt);
/* Every rank of l saves its part into out; `skip` (>= 0): that rank writes nothing. Rank 0's
 * error (or "") in err0. */
void ckl_save_to(const tr_recipe *r, int mc, const ckl_layout *l, const char *out, int skip,
                 char *err0, size_t errlen);

#endif
