/* Settings read from environment variables, each read and checked once at start by one of
 * these, then passed or stored: an integer in a range, a boolean 0|1, or one of a list of
 * words. A malformed value is one line, "NAME must be WHAT, got 'VALUE'", never silently
 * ignored. Here, in tr_parallel, because every layer that reads one can call it: the
 * collectives (comm/mpi.c), the model's backends and the trainer (tr_dsl, below them, reads
 * no environment). */
#ifndef TR_PARALLEL_ENV_H
#define TR_PARALLEL_ENV_H

#include <stddef.h>

/* Each returns 1 when NAME is set and valid (*out is its value), 0 when it is unset or empty
 * (*out untouched: the caller's default), -1 when malformed (the line in msg). */
/* A decimal integer lo <= N <= hi. */
int tr_env_int(const char *name, long lo, long hi, long *out, char *msg, size_t msglen);
/* 0 or 1. */
int tr_env_bool(const char *name, int *out, char *msg, size_t msglen);
/* One of words (NULL-terminated): *out is its index. */
int tr_env_word(const char *name, const char *const *words, int *out, char *msg,
                size_t msglen);
/* A name of 1 to maxlen letters, digits, '.', '-' or '_' (a host name): *out is the value.
 * Unlike the others, set but empty is malformed: a name cannot be empty. */
int tr_env_name(const char *name, size_t maxlen, const char **out, char *msg, size_t msglen);
/* The line for a variable of a form of its own ("NAME must be WHAT, got 'VALUE'"): -1. */
int tr_env_bad(const char *name, const char *what, const char *value, char *msg,
               size_t msglen);

#endif
