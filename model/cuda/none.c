/* Stand-in for model/cuda/ when this build has no CUDA compiler: the CUDA backend is reported
 * as unavailable, with the reason, so `--device auto` falls back to the CPU. */
#include <stdio.h>
#include <math.h>
#include <string.h>

#include "model/backend.h"

const tr_backend *tr_backend_cuda(tr_dtype dtype, char *why, size_t whylen) {
    (void)dtype;
    snprintf(why, whylen, "this trainer was built without CUDA (no nvcc found when configuring)");
    return NULL;
}

void *tr_backend_cuda_stream(void) {
    return NULL;
}

double tr_backend_cuda_peak(tr_dtype dtype, char *name, size_t namelen) {
    (void)dtype;
    snprintf(name, namelen, "none");
    return 0;
}

int tr_backend_cuda_versions(tr_cuda_versions *v) {
    memset(v, 0, sizeof(*v));
    return -1;
}

int tr_backend_cuda_telemetry(tr_gpu_telemetry *t) {
    t->power_w = t->sm_mhz = t->temp_c = NAN;
    return -1;
}

void tr_backend_cuda_memory(size_t *now, size_t *peak) {
    if (now) *now = 0;
    if (peak) *peak = 0;
}

void tr_backend_cuda_step_done(int step) {
    (void)step;
}

int tr_backend_cuda_device_use(size_t *used, size_t *total) {
    *used = *total = 0;
    return -1;
}
