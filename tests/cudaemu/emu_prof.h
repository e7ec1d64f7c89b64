/* The CUDA emulator's memory-access profiler (emu_prof.cc) and what it needs of the runtime
 * (emu_runtime.cc). */
#ifndef TR_EMU_PROF_H
#define TR_EMU_PROF_H
#include <stddef.h>

extern int emu_thread_now; /* the running fiber's index in its block */
int emu_block_now(void);   /* the running block's index in its grid */
int emu_is_device(const void *p, size_t n);

/* a launch of `kernel` starts (NULL: it ended), with its dynamic shared memory */
void emu_prof_launch(const char *kernel, const void *dyn, size_t dyn_bytes);
/* every live thread of warp w has reached a warp operation, a barrier or its end */
void emu_prof_flush_warp(int w, int nthreads);
/* a block starts, or its barrier opens: a new epoch for the race check */
void emu_prof_barrier(void);

/* what the profiler counted for `kernel` so far: [shared][write] requests, their cost
 * (sectors or wavefronts) and the ideal cost; 0 when it has nothing for that kernel */
struct emu_prof_figures {
    unsigned long long launches, req[2][2], cost[2][2], ideal[2][2];
};
int emu_prof_get(const char *kernel, struct emu_prof_figures *f);
#endif
