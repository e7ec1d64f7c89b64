/* Running a command as a child in a process group of its own (trainer/ops/spawn.c), for the
 * subcommands that drive other runs (supervise, sweep): SIGINT, SIGTERM, SIGHUP and SIGUSR1
 * to this process are passed on to the child's group (a run saves a checkpoint and stops on
 * SIGINT, SIGTERM and SIGUSR1), and remembered so that the caller stops after it. */
#ifndef TR_SPAWN_H
#define TR_SPAWN_H

#include <stddef.h>
#include <sys/types.h>

/* Install the handlers that pass signals on (once, before the first tr_spawn). */
void tr_spawn_handlers(void);
/* The signal that asked this process to stop, 0 when none came. */
int tr_spawn_signal(void);

/* Called about every 0.1 s while the child runs (pid: its process group too); NULL: none. */
typedef void (*tr_spawn_poll)(void *ctx, pid_t pid);

/* Run argv (NULL-terminated, found on PATH) with stdin from /dev/null, stdout and stderr
 * appended to `log` (NULL: this process's own; with `out`, stdout is written to that file
 * instead, from its start); its wait status, or -1 when it could not be started (said in one
 * line on stderr, prefixed with `who`). */
int tr_spawn(char *const *argv, const char *out, const char *log, tr_spawn_poll poll,
             void *ctx, const char *who);

/* A wait status in words: "exit status 3", "killed by SIGKILL (9)". */
void tr_spawn_describe(int status, char *buf, size_t n);

/* Sleep sec seconds, cut short by a signal to this process. */
void tr_spawn_sleep(double sec);

#endif
