#!/usr/bin/env bash
# Every test: build with warnings as errors and run ctest, then the same tests again in an
# AddressSanitizer + UndefinedBehaviorSanitizer build. This is what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# test-only packages: a private single-node Slurm cluster for tests/slurm.sh; ip and tc for
# the cluster in a box of tests/cluster/ (and Slurm on its hosts)
TR_EXTRA_PKGS="slurmd slurmctld slurm-client munge libpmix-dev iproute2 tcpdump" ./setup.sh -DTR_WERROR=ON
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
# Open MPI's ob1 messaging layer, the one it selects on these machines anyway, named so that
# no process first starts the libraries of the cm layer's fabrics (libfabric, PSM, PSM2),
# which it then closes: 0.2 s of each MPI process's start-up here (0.37 s against 0.17 s for
# 2 ranks that only start and end), paid by every multi-process test run
export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}"
# two tests at a time on two cores: each test's processes wait on each other often enough
# (collectives, files, links shaped by tc) that the suite takes about 30% less time; no test
# depends on timing, only on bounded liveness
jobs=$(nproc)
ctest --test-dir build --output-on-failure -j "$jobs"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTR_WERROR=ON -DTR_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$(nproc)"
# the cluster tests (label cluster: hosts in network namespaces) run in the plain pass only:
# they test the network and the launchers, whose code the sanitizers see in the other tests;
# and so does the fuzz test, whose targets are built with the sanitizers already
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE "cluster|fuzz"
