/* The CUDA emulator's asynchronous work (emu_sched.cc): operations that stay pending on a
 * stream after the call that gave them returns (NCCL emulated over MPI, emu_nccl.cc), so that
 * streams and events order them as CUDA documents, as they do kernels and copies (work the
 * host runs when the runtime's scheduler reaches it: emu.h's emu_stream_exec). */
#ifndef TR_EMU_ASYNC_H
#define TR_EMU_ASYNC_H
#include <cuda_runtime.h>
#include <stddef.h>

/* Appends an operation to s's queue (0, cudaStreamLegacy, cudaStreamPerThread: the default
 * stream). test(ctx) returns 1 once it is complete; finish(ctx) (NULL: none) then runs once,
 * after every earlier operation of s has finished. Both run holding the runtime's lock, on
 * whichever thread makes progress (one querying an event, too): they must not block or call
 * the CUDA runtime. */
void emu_stream_enqueue(cudaStream_t s, int (*test)(void *ctx), void (*finish)(void *ctx),
                        void *ctx);

/* Completes what work newly given to s would wait for: s's queue, and with CUDA's legacy
 * default stream the default stream's (for a stream created without cudaStreamNonBlocking) or
 * every such stream's (for the default stream). Blocks, polling without holding the lock. */
void emu_stream_drain(cudaStream_t s);

/* Blocks until no pending operation has match(ctx, key) == 1 (completing those before it on
 * its stream too). */
void emu_stream_drain_matching(int (*match)(void *ctx, void *key), void *key);

/* Removes every pending operation with match(ctx, key) == 1 without testing or finishing it,
 * as though it had completed (what waits for it goes on). dropped(ctx) (NULL: none) runs for
 * each, holding the lock. Returns how many it removed. */
int emu_stream_drop(int (*match)(void *ctx, void *key), void *key, void (*dropped)(void *ctx));

/* 1 when the runtime runs each piece of work when it is given (TR_EMU_SCHED=eager), 0 when
 * its scheduler defers it and picks the order adversarially (the default; emu_sched.cc) */
int emu_sched_eager(void);

/* 1 when [p, p + n) lies inside one cudaMalloc allocation (not cudaMallocHost's). Only from
 * the thread that allocates. */
int emu_is_device(const void *p, size_t n);

#endif
