# Sourced by the benches that run on a cluster in a box (tests/cluster/cluster.sh): the
# checks of their arguments and of the machine, each one line and an exit (2: an argument, 1:
# the machine). box_args STEPS REPS checks the step and run counts (2 steps are warm-up) and
# sets T, the trainer timed (TRAINER, or build/trainer); box_machine CORES TOOL... checks root,
# the tools and the cores (nproc without OMP_NUM_THREADS, which GNU nproc honours).
box_args() {
    [[ $1 =~ ^[0-9]+$ ]] && [ "$1" -ge 4 ] || { echo "bench: steps '$1': 4 or more (2 are warm-up)"; exit 2; }
    [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] || { echo "bench: reps '$2': 1 or more"; exit 2; }
    T=$(realpath "${TRAINER:-build/trainer}")
    [ -x "$T" ] || { echo "bench: no trainer at $T (build it, or set TRAINER)"; exit 1; }
}
box_machine() {
    local cores=$1 c
    shift
    [ "$(id -u)" = 0 ] || { echo "bench: a cluster in a box needs root"; exit 1; }
    for c in "$@"; do command -v "$c" >/dev/null || { echo "bench: needs $c"; exit 1; }; done
    [ "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" -ge "$cores" ] ||
        { echo "bench: needs $cores cores"; exit 1; }
}
