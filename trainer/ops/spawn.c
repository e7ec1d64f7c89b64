/* A child command in a process group of its own, with this process's stop signals passed on
 * to it (trainer/ops/spawn.h). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "parallel/comm/base.h"
#include "trainer/ops/spawn.h"
#include "trainer/trainer.h"

/* The signal that stops this process (forwarded to the child's group), and that group. */
static volatile sig_atomic_t g_signal, g_child;

static void on_signal(int sig) {
    g_signal = sig;
    if (g_child > 0) kill(-(pid_t)g_child, sig);
}

void tr_spawn_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal; /* no SA_RESTART: waits and sleeps return early */
    sigemptyset(&sa.sa_mask);
    int sigs[4] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
    for (int i = 0; i < 4; i++)
        sigaction(sigs[i], &sa, NULL);
}

int tr_spawn_signal(void) {
    return g_signal;
}

void tr_spawn_describe(int status, char *buf, size_t n) {
    if (WIFSIGNALED(status))
        snprintf(buf, n, "killed by %s (%d)", tr_signal_name(WTERMSIG(status)), WTERMSIG(status));
    else
        snprintf(buf, n, "exit status %d", WEXITSTATUS(status));
}

static void nap(double sec) {
    struct timespec ts = {(time_t)sec, (long)((sec - floor(sec)) * 1e9)};
    nanosleep(&ts, NULL);
}

void tr_spawn_sleep(double sec) {
    double until = tr_now() + sec;
    while (!g_signal) {
        double left = until - tr_now();
        if (left <= 0) break;
        nap(left);
    }
}

/* In the child: its own group, default signals, stdin from /dev/null (a launcher outside the
 * terminal's foreground group must not read it), the log; then the command. */
/* fd `to` from the file at path (appended to, or from its start): 0, or -1 said on stderr */
static int redirect(const char *path, int append, int to, const char *who) {
    int fd = open(path, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
    if (fd < 0) {
        fprintf(stderr, "%s: cannot write %s: %s\n", who, path, strerror(errno));
        return -1;
    }
    dup2(fd, to);
    close(fd);
    return 0;
}

static void child(char *const *argv, const char *out, const char *log, const sigset_t *old,
                  const char *who) {
    setpgid(0, 0);
    signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL), signal(SIGHUP, SIG_DFL);
    signal(SIGUSR1, SIG_DFL);
    sigprocmask(SIG_SETMASK, old, NULL);
    int in = open("/dev/null", O_RDONLY);
    if (in >= 0) dup2(in, 0), close(in);
    if (log && (redirect(log, 1, 2, who) || redirect(log, 1, 1, who))) _exit(127);
    if (out && redirect(out, 0, 1, who)) _exit(127);
    execvp(argv[0], argv);
    fprintf(stderr, "%s: cannot run '%s': %s\n", who, argv[0], strerror(errno));
    _exit(127);
}

int tr_spawn(char *const *argv, const char *out, const char *log, tr_spawn_poll poll,
             void *ctx, const char *who) {
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT), sigaddset(&block, SIGTERM), sigaddset(&block, SIGHUP);
    sigaddset(&block, SIGUSR1);
    sigprocmask(SIG_BLOCK, &block, &old);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) child(argv, out, log, &old, who);
    if (pid < 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        fprintf(stderr, "%s: cannot start the command: %s\n", who, strerror(errno));
        return -1;
    }
    setpgid(pid, pid); /* also here: no signal may reach the group before it exists */
    g_child = pid;
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (g_signal) kill(-pid, g_signal); /* arrived while blocked: it was not forwarded */
    int status = 0;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) {
            status = -1;
            break;
        }
        if (poll) poll(ctx, pid);
        nap(0.1);
    }
    g_child = 0;
    return status;
}
