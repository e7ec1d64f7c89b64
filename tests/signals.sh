#!/usr/bin/env bash
# A run asked to stop (trainer/run/stop.c), and its log in files and terminals:
#  1. SIGTERM to a 1-process run: exit 143, one line on stderr naming the step and the saved
#     checkpoint (checkpoint_every is 0: the stop saves anyway), a "stop" line in
#     attempts.jsonl; --resume then ends with the losses and final parameters bitwise those of
#     an uninterrupted run. SIGUSR1 likewise (138). SIGINT twice ends the run at once (nothing
#     saved). A run under `trainer supervise` stopped that way is not relaunched.
#  2. 2 ranks under mpirun (skipped without it): SIGTERM to mpirun (which passes it on to the
#     ranks a second later), SIGTERM to rank 1 alone (rank 0 learns of it in the step's
#     gather) and SIGUSR1 to mpirun: every rank stops after the same step, the checkpoint is
#     published, and --resume ends bitwise as an uninterrupted 2-rank run.
#  3. the progress: under mpirun into a file one line per log step, no \r or escape sequence;
#     on a real terminal (script(1)) the line is rewritten; --progress lines there prints
#     lines; bad --progress and TR_PROGRESS values are one line each.
# The runs are dp_tiny.lua's 20 steps with rank 0 made 100 ms slower a step
# (TR_FAULT_SLOW_RANK), so that a signal sent once the first step is logged lands mid-run.
# usage: tests/signals.sh path/to/trainer   (run from the repository root)
set -u
T="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
R=tests/recipes_good/dp_tiny.lua
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
mpi=1
command -v mpirun >/dev/null || mpi=0

# reference NAME LAUNCHER...: an uninterrupted run into $tmp/NAME (and NAME.params)
reference() {
    local name=$1
    shift
    TR_DUMP_PARAMS="$tmp/$name.params" "$@" "$T" run "$R" --out "$tmp/$name" >"$tmp/$name.log" 2>&1 ||
        { bad "$name: the uninterrupted run failed"; cat "$tmp/$name.log"; }
}

# wait_first_step OUT: until metrics.jsonl has a step (rank 0 logged one), at most 30 s
wait_first_step() {
    for _ in $(seq 300); do
        [ -s "$1/metrics.jsonl" ] && return 0
        sleep 0.1
    done
    return 1
}

# rank_pid OUT RANK: the process of that rank of the run writing into OUT
rank_pid() {
    local p
    for p in $(pgrep -f -- "--out $1\$"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" &&
            { echo "$p"; return; }
    done
}

# stopped NAME SIG EXIT: the run into $tmp/NAME exited EXIT, said its one line for SIG and
# saved the checkpoint it names; the step it stopped at in $step
stopped() {
    local name=$1 sig=$2 want=$3 out=$tmp/$1
    local line
    line=$(grep "^trainer run: " "$tmp/$name.err")
    step=$(sed -n "s|^trainer run: $sig at step \([0-9]*\): saved checkpoint step_0*\1 in $out; resume with --resume\$|\1|p" \
        <<<"$line")
    if [ "$rc" = "$want" ] && [ -n "$step" ] && [ "$(grep -c . <<<"$line")" = 1 ] &&
        [ -f "$out/checkpoints/$(printf step_%08d "$step")/manifest.yaml" ] &&
        grep -q "\"event\": \"stop\".*\"last_step\": $step, \"signal\": \"$sig\"" "$out/attempts.jsonl"; then
        ok "$name: $sig: exit $rc, stopped after step $step of 20, checkpoint saved: $line"
    else
        bad "$name: $sig: exit $rc (want $want), stderr:"
        cat "$tmp/$name.err"
        ls "$out/checkpoints" 2>&1
        step=
    fi
}

# resumed NAME REF LAUNCHER...: --resume of $tmp/NAME ends bitwise as $tmp/REF
resumed() {
    local name=$1 ref=$2
    shift 2
    [ -n "$step" ] || return
    TR_DUMP_PARAMS="$tmp/$name.params" "$@" "$T" run "$R" --out "$tmp/$name" --resume \
        >"$tmp/$name.resume.log" 2>&1 || { bad "$name: --resume failed"; cat "$tmp/$name.resume.log"; return; }
    if diff <(losses "$tmp/$ref/metrics.jsonl") <(losses "$tmp/$name/metrics.jsonl") >/dev/null &&
        cmp -s "$tmp/$ref.params" "$tmp/$name.params"; then
        ok "$name: --resume from step $step: losses and final parameters bitwise the uninterrupted run's"
    else
        bad "$name: --resume from step $step differs from the uninterrupted run"
    fi
}

# ---- 1. one process ----------------------------------------------------------------------
reference ref1
one() { # NAME SIG...: a 1-process run, the signals sent 0.1 s apart once step 1 is logged
    local name=$1
    shift
    mkdir -p "$tmp/$name"
    TR_FAULT_SLOW_RANK=0:${slow:-100} "$T" run "$R" --out "$tmp/$name" >"$tmp/$name.log" \
        2>"$tmp/$name.err" &
    local pid=$!
    wait_first_step "$tmp/$name"
    for s in "$@"; do
        kill -"$s" "$pid"
        sleep 0.1
    done
    wait "$pid"
    rc=$?
}
one term TERM
[ "$(wc -l <"$tmp/term.err")" = 1 ] || bad "term: more than its line on stderr"
stopped term SIGTERM 143
resumed term ref1
one usr1 USR1
stopped usr1 SIGUSR1 138
resumed usr1 ref1
slow=1000 one int2 INT INT # steps of a second: both land in step 2
if [ "$rc" = 130 ] && ! grep -q "saved checkpoint" "$tmp/int2.err" && [ ! -e "$tmp/int2/checkpoints" ] &&
    grep -q '"event": "stopped".*"SIGINT"' "$tmp/int2/attempts.jsonl"; then
    ok "int2: SIGINT twice: ended at once (status 130, nothing saved, its \"stopped\" line written)"
else
    bad "int2: SIGINT twice: status $rc"
    cat "$tmp/int2.err"
fi

# under the supervisor, the run alone stopped: not relaunched, the run's status
mkdir -p "$tmp/sup"
TR_FAULT_SLOW_RANK=0:100 "$T" supervise --backoff 0 -- "$T" run "$R" --out "$tmp/sup" \
    >"$tmp/sup.log" 2>"$tmp/sup.err" &
sup=$!
wait_first_step "$tmp/sup"
kill -TERM "$(pgrep -P "$sup")" # the run, not the supervisor
wait "$sup"
rc=$?
if [ "$rc" = 143 ] && grep -q "^supervise: attempt 1 was asked to stop by SIGTERM after step [0-9]* and saved checkpoint step_[0-9]*: not relaunched" "$tmp/sup.log" &&
    [ "$(grep -c '"event": "start"' "$tmp/sup/attempts.jsonl")" = 1 ]; then
    ok "supervise: a run stopped by its own SIGTERM is not relaunched (exit 143): $(grep '^supervise:' "$tmp/sup.log")"
else
    bad "supervise: exit $rc"
    cat "$tmp/sup.log" "$tmp/sup.err"
fi

# ---- 3. the progress on a terminal and in files (1 process) --------------------------------
script -qec "$T run $R --out $tmp/pty --steps 6" /dev/null >"$tmp/pty.log" 2>&1
grep -q $'\r\033\[Kstep 2/6' "$tmp/pty.log" && ok "progress: a terminal's line is rewritten" ||
    { bad "progress: no rewritten line on a terminal"; cat -A "$tmp/pty.log" | tail -5; }
script -qec "$T run $R --out $tmp/pty --steps 6 --overwrite --progress lines" /dev/null >"$tmp/ptyl.log" 2>&1
! grep -q $'\033' "$tmp/ptyl.log" && [ "$(grep -c '^step' "$tmp/ptyl.log")" = 3 ] &&
    ok "progress: --progress lines on a terminal: lines of steps 1, 5, 6" ||
    { bad "progress: --progress lines still rewrites"; cat -A "$tmp/ptyl.log" | tail -5; }
"$T" run "$R" --progress bars >"$tmp/bad.log" 2>&1
[ $? = 2 ] && [ "$(cat "$tmp/bad.log")" = "trainer run: --progress must be tty or lines, got 'bars'" ] &&
    ok "progress: a bad --progress is one line (exit 2)" || { bad "progress: bad --progress said:"; cat "$tmp/bad.log"; }
TR_PROGRESS=fancy "$T" run "$R" --out "$tmp/badenv" >"$tmp/badenv.log" 2>&1
grep -qx "trainer run: TR_PROGRESS must be tty or lines, got 'fancy'" "$tmp/badenv.log" &&
    ok "progress: a bad TR_PROGRESS is one line" || { bad "progress: bad TR_PROGRESS said:"; tail -3 "$tmp/badenv.log"; }
grep -q "^done: 20 steps in .* tok/s, .* GFLOP/s, MFU .* (mean over the run)" "$tmp/ref1.log" &&
    ok "progress: the done line gives the mean over the run" || bad "progress: no mean over the run"

[ $mpi = 1 ] || { echo "SKIP the mpirun half: no mpirun"; exit $fail; }

# ---- 2. two ranks under mpirun -------------------------------------------------------------
MPI=(mpirun -np 2 --oversubscribe)
reference ref2 "${MPI[@]}"
# under a launcher's pseudo-terminal into a file: one line per log step (1, 5, 10, 15, 20)
if ! grep -q $'[\r\033]' "$tmp/ref2.log" && [ "$(grep -c '^step' "$tmp/ref2.log")" = 5 ] &&
    grep -q '^step 10/20 | loss [0-9.]* | lr .* | val_loss' "$tmp/ref2.log"; then
    ok "progress: mpirun into a file: one line per log step, no \\r or escape sequences"
else
    bad "progress: mpirun's log:"
    cat -A "$tmp/ref2.log" | grep step
fi

two() { # NAME SIG TARGET: a 2-rank run, SIG sent to TARGET (mpirun or a rank) after step 1
    local name=$1 sig=$2 target=$3
    mkdir -p "$tmp/$name"
    TR_FAULT_SLOW_RANK=0:100 "${MPI[@]}" "$T" run "$R" --out "$tmp/$name" >"$tmp/$name.log" 2>"$tmp/$name.err" &
    local pid=$!
    wait_first_step "$tmp/$name"
    [ "$target" = mpirun ] && kill -"$sig" "$pid" || kill -"$sig" "$(rank_pid "$tmp/$name" "$target")"
    wait "$pid"
    rc=$?
}
# mpirun passes SIGTERM on a second after it got it and kills the ranks a second later: the
# stop's save has that second (odls_base_sigkill_timeout); it exits 1 as it ended the job
two mpi_term TERM mpirun
stopped mpi_term SIGTERM 1
resumed mpi_term ref2 "${MPI[@]}"
two rank1_term TERM 1
stopped rank1_term SIGTERM 143
resumed rank1_term ref2 "${MPI[@]}"
two mpi_usr1 USR1 mpirun
stopped mpi_usr1 SIGUSR1 138
resumed mpi_usr1 ref2 "${MPI[@]}"

# a scheduler's SIGTERM to the supervisor of a 2-rank run: it passes the signal on, every rank
# stops after the same step and saves, the supervisor says so and exits 143 without a
# relaunch; a supervised --resume then ends bitwise as the uninterrupted 2-rank run
mkdir -p "$tmp/sup2"
TR_FAULT_SLOW_RANK=0:100 "$T" supervise --backoff 0 -- "${MPI[@]}" "$T" run "$R" --out "$tmp/sup2" \
    >"$tmp/sup2.log" 2>"$tmp/sup2.err" &
sup=$!
wait_first_step "$tmp/sup2"
kill -TERM "$sup"
wait "$sup"
rc=$?
if [ "$rc" = 143 ] && grep -q "^supervise: stopped by SIGTERM (passed on to the command)" "$tmp/sup2.log" &&
    [ "$(grep -c '"event": "start"' "$tmp/sup2/attempts.jsonl")" = 1 ]; then
    stopped sup2 SIGTERM 143
    resumed sup2 ref2 "$T" supervise --backoff 0 -- "${MPI[@]}"
else
    bad "supervise around mpirun, SIGTERM to the supervisor: exit $rc"
    cat "$tmp/sup2.log" "$tmp/sup2.err"
fi
exit $fail
