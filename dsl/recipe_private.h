/* Private header of the recipe DSL (dsl/recipe*.c): the state of one load, the error helpers,
 * the field schema and the constructor tables the files share. Nothing outside dsl/ includes
 * it; the public interface is dsl/recipe.h.
 *   recipe.c           loading: defaults, running the chunk, cross-section checks, free
 *   recipe_sandbox.c   the Lua state: limits (memory, instructions, time), the allowed
 *                      libraries, messages that point at the recipe's line
 *   recipe_schema.c    the field schema: reading and checking a constructor's fields
 *   recipe_layers.c    the layer constructors and model { }: the checked layer tree
 *   recipe_sections.c  knobs, data, optimizer, schedule, train, parallel, init = hf
 *   recipe_write.c     the resolved recipe written back as Lua (tr_recipe_write_lua) */
#ifndef TR_RECIPE_PRIVATE_H
#define TR_RECIPE_PRIVATE_H

#include <limits.h>
#include <stddef.h>

#include <lauxlib.h>
#include <lua.h>

#include "dsl/recipe.h"
#include "parallel/comm/base.h"

/* Copying layers to C recurses once per level, and a loop that nests shared subtrees can
 * describe exponentially many nodes: both are bounded while the recipe runs. */
#define MAX_DEPTH 32
#define MAX_NODES 100000L
#define LAYER_MT "tr.layer"
#define HF_MT "tr.hf"

#ifdef __GNUC__
#define TR_NORETURN __attribute__((noreturn))
#else
#define TR_NORETURN
#endif

/* Everything one load needs; reached from Lua through the allocator's user pointer. */
typedef struct {
    tr_recipe r;            /* filled while the recipe runs, handed out on success */
    const char *chunk;      /* the recipe's name in messages */
    const char *basedir;    /* data paths resolve against it */
    char stem[TR_NAME_MAX]; /* file name without .lua, for the default train.out */
    const tr_knob_set *sets;
    int n_sets;
    unsigned char set_target[TR_MAX_SETS]; /* per --set: SET_FREE until a section takes it */
    /* the --set knobs the recipe read since the last constructor finished, and ever (bit i:
       sets[i]): a field out of bounds names those read just before it, or one whose value it
       is, the user's own input */
    unsigned long long sets_read, sets_ever;
    size_t mem_used;
    int mem_exceeded;
    long long instr;
    int knobs_line, model_line, data_line, optim_line, sched_line, train_line, parallel_line;
    int sweep_line, eval_line;
    int min_lr_set;
    int done;       /* the chunk has finished: constructors refuse to run */
    int check_line; /* model-time check that failed: where, and what */
    char check_msg[1024];
    char where[LUA_IDSIZE]; /* source of a caller outside the recipe chunk (a load()ed one) */
    char msg[8192];         /* formatting scratch for messages */
    char list[TR_MAX_KNOBS * (TR_NAME_MAX + 2) + 64];
} recipe_ctx;

/* What a --set NAME=VALUE sets: a knob, or (train.NAME, or a NAME no knob shadows) one of
 * train { }'s fields, applied to its table before the schema reads it. */
enum { SET_FREE = 0, SET_KNOB, SET_TRAIN };

/* A layer while the recipe runs: a userdata holding the node, children in its user value. */
typedef struct {
    tr_node node;
    int depth;  /* levels of layers below and including this one */
    long count; /* nodes in this subtree, shared subtrees counted each time they appear */
} layer_ud;

/* The names of enumerated values, in enum order (NULL-terminated but for kind names). */
extern const char *const dsl_kind_names[TR_NODE_KIND_COUNT];
extern const char *const dsl_activation_names[];
extern const char *const dsl_tokenizer_names[];
extern const char *const dsl_decay_names[];
extern const char *const dsl_precision_names[];
extern const char *const dsl_recompute_names[];
extern const char *const dsl_pp_schedule_names[];

/* ---- errors (recipe_sandbox.c) ---------------------------------------------------------- */

recipe_ctx *dsl_ctx(lua_State *L);
/* Line of the nearest Lua function up the stack: the recipe line that called a constructor
 * (C functions in between, such as pcall, are skipped). *src names its chunk. */
int dsl_caller_line(lua_State *L, const char **src);
/* Raise `chunk:line: message`; line <= 0 means the caller's line. */
TR_PRINTF(3, 4) TR_NORETURN void dsl_raise_at(lua_State *L, int line, const char *fmt, ...);
/* Run the recipe text in a fresh sandboxed state with the constructors registered, then read
 * `init = hf "DIR"`. 0, or -1 with one line in err. */
int dsl_run(recipe_ctx *c, const char *text, size_t len, char *err, size_t errlen);

/* ---- the field schema (recipe_schema.c) ------------------------------------------------- */

typedef enum {
    FK_INT,
    FK_NUM,
    FK_BOOL,
    FK_STR,
    FK_ENUM,
    FK_ENUM_AUTO, /* one of choices, or "auto" */
    FK_INT_AUTO,
    FK_BOOL_AUTO,
    FK_PAIR,
    FK_TABLE,
    FK_LIST_AUTO, /* "auto" or a list of integers >= lo (no gaps, no named fields, at most hi
                    items): checked here, copied by the constructor */
    FK_TABLE_BOOL, /* a table of fields (i = 1; read by the constructor) or a boolean (b) */
    FK_ENUM_LIST  /* one of choices (choice), or a list of them (i: its length, at most hi;
                    checked here, copied by the constructor) */
} field_kind;
enum { LO_NONE = 0, LO_GE, LO_GT };
enum { HI_NONE = 0, HI_LE, HI_LT };

typedef struct {
    const char *name;
    field_kind kind;
    int required;
    int lo_kind;
    double lo;
    int hi_kind;
    double hi;
    const char *const *choices; /* FK_ENUM, FK_ENUM_AUTO: NULL-terminated */
} field_spec;

typedef struct {
    int present;
    lua_Integer i; /* FK_INT, FK_INT_AUTO (0 = auto) */
    double n;      /* FK_NUM */
    int b;         /* FK_BOOL, FK_BOOL_AUTO */
    const char *s; /* FK_STR: owned by the argument table, which outlives the read */
    int choice;    /* FK_ENUM, FK_ENUM_AUTO: index into choices */
    int is_auto;   /* FK_INT_AUTO, FK_BOOL_AUTO, FK_ENUM_AUTO, FK_LIST_AUTO: "auto" */
    double pair[2];
} field_val;

#define REQ 1
#define OPT 0
#define INT_FIELD(nm, req, lo)                                                                     \
    { nm, FK_INT, req, LO_GE, lo, HI_LE, INT_MAX, NULL }
#define INT_FIELD_MAX(nm, req, lo, hi)                                                             \
    { nm, FK_INT, req, LO_GE, lo, HI_LE, hi, NULL }
#define LONG_FIELD(nm, req, lo)                                                                    \
    { nm, FK_INT, req, LO_GE, lo, HI_LE, (double)LONG_MAX, NULL }
#define NSPECS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* A value's type for messages: Lua's name, except that layers are called layers. */
const char *dsl_type_word(lua_State *L, int idx);
void dsl_format_number(char *buf, size_t len, lua_State *L, int idx);
/* "a, b, c": names sorted, written into buf. */
const char *dsl_sorted_list(char *buf, size_t len, const char **names, int n);
/* Check the value on top of the stack against fs and store it in *out. */
void dsl_read_value(lua_State *L, const char *ctor, const field_spec *fs, field_val *out);
/* Read the fields of the table at index 1 into vals (one per spec). Array items are children:
 * their count and the largest index go to *n_items / *max_item when those are non-NULL, and
 * are an error otherwise. */
void dsl_read_fields(lua_State *L, const char *ctor, const field_spec *specs, int nspecs,
                     field_val *vals, int *n_items, lua_Integer *max_item);
/* Copy a checked string field into a fixed buffer. */
void dsl_copy_field(lua_State *L, char *dst, size_t cap, const char *ctor, const char *field,
                    const char *s);

/* ---- constructors (recipe_layers.c, recipe_sections.c) ---------------------------------- */

extern const luaL_Reg dsl_layer_ctors[];   /* model and its layers; NULL-terminated */
extern const luaL_Reg dsl_section_ctors[]; /* knobs, data, ..., parallel, hf, sweep */
int dsl_l_sweep(lua_State *L);             /* sweep { } (recipe_sections.c) */
int dsl_l_eval(lua_State *L);              /* eval { } (recipe_sections.c) */
/* "batch_tokens, checkpoint_every, ...": the fields of train { }, for messages. */
const char *dsl_train_field_list(void);
int dsl_layer_tostring(lua_State *L);      /* __tostring of a layer: "mlp (line 5)" */
void dsl_free_node(tr_node *n);

#endif
