/* Stopping a run on request: SIGINT (Ctrl-C), SIGTERM (a scheduler's preemption) and SIGUSR1
 * (Slurm's `--signal=USR1@120` ahead of a time limit) make every rank stop after the same
 * step, save a checkpoint there and exit with 128 + the signal, so that --resume continues
 * exactly where the run stopped. A second signal ends the process at once. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "trainer/run/run.h"

/* The handler only notes the signal: everything else happens at the step boundary. */
static volatile sig_atomic_t g_signal, g_listen;

static void on_signal(int sig) {
    if (!g_signal) tr_ledger_signal_line(sig); /* stays if a SIGKILL follows */
    if (g_signal || !g_listen) {               /* asked twice, or past the step loop */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    g_signal = sig;
}

void run_stop_listen(int on) {
    static const int sigs[3] = {SIGINT, SIGTERM, SIGUSR1};
    g_listen = on;
    if (!on) return; /* the handler stays: a signal now ends the process after its line */
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART; /* reads, writes and MPI's waits go on after the handler */
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; i++)
        sigaction(sigs[i], &sa, NULL);
}

int run_stop_signal(void) {
    return g_signal;
}

/* The save at the stop, unless the step loop's own checkpoint of this step was just taken:
 * with checkpoint_every 0 the writer is set up here (its host copy is allocated only when a
 * stop needs it). 0 once the checkpoint is published, -1 with the reason in x->err. */
static int save_here(run_ctx *x, int step, int saved) {
    if (!x->ckw) {
        /* --resume already checked that OUT is shared; a failure is said by setup_failed */
        if (run_open_checkpoints(x, !x->o.resume)) {
            snprintf(x->err, sizeof(x->err), "the checkpoint writer could not be set up");
            return -1;
        }
    }
    if (!saved) run_checkpoint(x, step);
    /* rank 0 publishes once every rank's part is written: its wait covers them all */
    long long failed = tr_ckpt_wait(x->ckw, x->err, sizeof(x->err)) != 0;
    tr_comm_all_reduce(x->world, &failed, 1, TR_COMM_I64);
    if (failed && !x->err[0]) snprintf(x->err, sizeof(x->err), "another rank's part failed");
    return failed ? -1 : 0;
}

int run_stop_save(run_ctx *x, int step, int saved) {
    int sig = x->stop_sig;
    const char *name = tr_signal_name(sig);
    x->err[0] = '\0';
    int bad = save_here(x, step, saved);
    char ckpt[32];
    snprintf(ckpt, sizeof(ckpt), "step_%08d", step);
    if (x->rank == 0) {
        if (bad)
            fprintf(stderr,
                    "%strainer run: %s at step %d: nothing was saved (%s); --resume continues "
                    "from the newest checkpoint before it\n",
                    x->tty ? "\n" : "", name, step, x->err);
        else
            fprintf(stderr,
                    "%strainer run: %s at step %d: saved checkpoint %s in %s; resume with "
                    "--resume\n",
                    x->tty ? "\n" : "", name, step, ckpt, x->r.train.out);
        fflush(stderr);
    }
    tr_ledger_stop(x->ledger, step, name, bad ? NULL : ckpt);
    /* under mpirun a rank that exits first makes the launcher kill the others: leave together,
       after the publication */
    tr_comm_barrier(x->world);
    return bad ? 1 : 128 + sig;
}
