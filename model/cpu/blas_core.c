/* OpenBLAS's kernels, named where its own choice fell short of the CPU.
 *
 * OpenBLAS picks its kernels once, when it is loaded, from the CPU's family and model numbers.
 * A model newer than the library falls back to kernels older than the CPU: Debian 12's
 * OpenBLAS 0.3.21 on an Intel Xeon of model 207 (Emerald Rapids, AVX-512) took its SSE3
 * "Prescott" set, and its sgemm ran 6.7x slower than on the AVX-512 "SkylakeX" set the CPU
 * runs (34 against 217 GFLOP/s, the start-up's sgemm probe on one process of 2 threads). A
 * process cannot change them once loaded; OPENBLAS_CORETYPE names them before. */
#include "model/backend.h"

#include <cblas.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

#ifdef OPENBLAS_VERSION
/* The kernel set of OpenBLAS's x86 ones that this CPU's features run: SkylakeX's with AVX-512
 * (F, BW, DQ and VL, and the system saving their registers: __builtin_cpu_supports asks
 * both), Haswell's with AVX2 and FMA, else none to name. */
static const char *core_for_features(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return NULL;
}

/* Whether core (openblas_get_corename) is one of OpenBLAS's x86 kernel sets older than AVX2:
 * what it falls back to for a CPU it does not know (Zen, Haswell and newer are its own
 * choices, kept). */
static int blas_fallback(const char *core) {
    static const char *old[] = {"Unknown",  "Katmai",      "Coppermine", "Northwood",
                                "Prescott", "Core2",       "Penryn",     "Dunnington",
                                "Nehalem",  "Sandybridge", "Atom",       "Nano"};
    for (size_t i = 0; core && i < sizeof old / sizeof *old; i++)
        if (!strcasecmp(core, old[i])) return 1;
    return 0;
}
#endif

void tr_backend_cpu_blas_core(char **argv) {
#ifdef OPENBLAS_VERSION
    if (getenv("OPENBLAS_CORETYPE")) return; /* the user's choice, or ours after the exec */
    const char *want = core_for_features(), *core = openblas_get_corename();
    if (!want || !blas_fallback(core)) return;
    if (setenv("OPENBLAS_CORETYPE", want, 1)) return;
    execv("/proc/self/exe", argv); /* the same program, arguments and environment, and this */
    unsetenv("OPENBLAS_CORETYPE"); /* no exec: the kernels it chose */
#else
    (void)argv;
#endif
}
