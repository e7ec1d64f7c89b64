/* The CUDA emulator's device: its identity and properties, and its memory: allocations
 * (planned: none after the first training step), pinned host memory, copies and memsets, which
 * are work on their stream like kernels (emu_sched.cc). Test-only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "emu.h"
#include "emu_async.h"
#include "emu_runtime_private.h"
#undef warpSize /* a field of cudaDeviceProp below */

using namespace emu_rt;

/* ---- the CUDA runtime API subset ----------------------------------------------------------
 * Allocations are tracked so that copies name a bad device pointer instead of corrupting the
 * host heap; fresh allocations are filled with 0xff (NaN in fp32 and bf16). */

static std::map<uintptr_t, size_t> allocs;
static std::map<uintptr_t, size_t> host_allocs; /* cudaMallocHost's: host memory, not device */

static uintptr_t dev_lo, dev_hi; /* the allocation is_dev found last (cudaFree forgets it) */
static int is_dev(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    if (a >= dev_lo && a + n <= dev_hi) return 1;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin()) return 0;
    --it;
    if (a >= it->first && a + n <= it->first + it->second) {
        dev_lo = it->first, dev_hi = it->first + it->second;
        return 1;
    }
    return 0;
}
int emu_is_device(const void *p, size_t n) { return is_dev(p, n); }

/* ---- this process's device ---------------------------------------------------------------
 * Every emulated process is a GPU of its own, as NCCL and the device transport tell GPUs
 * apart: the UUID hashes the host name and the process id, and the PCI address spells the
 * process id (unique on a host). TR_EMU_DEVICE=<name> replaces the process id by the name's
 * hash: processes given one name play ranks sharing one GPU. Read at every call, so that a
 * test can change it. */
static uint64_t mix64(uint64_t x) { /* splitmix64's finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t hash_str(const char *p, uint64_t h) { /* FNV-1a */
    for (; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    return h;
}

struct device_id {
    cudaUUID_t uuid;
    int domain, bus, dev;
};

static device_id device_identity(void) {
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    const char *name = getenv("TR_EMU_DEVICE");
    uint64_t v =
        name && *name ? hash_str(name, 0xcbf29ce484222325ull) & 0x1fffffff : (uint64_t)getpid();
    uint64_t h = hash_str(host, 0xcbf29ce484222325ull);
    uint64_t u[2] = {mix64(h ^ v), mix64(h + 0x9e3779b97f4a7c15ull * (v + 1))};
    device_id d;
    memcpy(d.uuid.bytes, u, sizeof(d.uuid.bytes));
    d.bus = (int)(v & 0xff);
    d.dev = (int)((v >> 8) & 0x1f);
    d.domain = (int)((v >> 13) & 0xffff);
    return d;
}

extern "C" {

/* the toolkit whose headers the emulator is built with, as driver and runtime alike */
cudaError_t cudaDriverGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
    if (d != 0) return cudaErrorInvalidDevice;
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "CUDA emulator (CPU)");
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->totalGlobalMem = (size_t)8 << 30;
    p->sharedMemPerBlock = SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = SMEM_OPTIN;
    p->maxThreadsPerBlock = MAX_THREADS;
    p->warpSize = 32;
    device_id id = device_identity();
    p->uuid = id.uuid;
    p->pciDomainID = id.domain;
    p->pciBusID = id.bus;
    p->pciDeviceID = id.dev;
    return cudaSuccess;
}

/* "domain:bus:device.function" in hexadecimal, as CUDA writes it */
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int d) {
    if (d != 0) return cudaErrorInvalidDevice;
    if (!id || len <= 0) return cudaErrorInvalidValue;
    device_id di = device_identity();
    snprintf(id, (size_t)len, "%04x:%02x:%02x.0", di.domain, di.bus, di.dev);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d) {
    if (d != 0) return cudaErrorInvalidDevice;
    switch (a) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = SMEM_OPTIN; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = SMEM_DEFAULT; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *v = 132; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; return cudaSuccess;
    case cudaDevAttrPciBusId: *v = device_identity().bus; return cudaSuccess;
    case cudaDevAttrPciDeviceId: *v = device_identity().dev; return cudaSuccess;
    case cudaDevAttrPciDomainId: *v = device_identity().domain; return cudaSuccess;
    default:
        fprintf(stderr, "cuda emulator: cudaDeviceGetAttribute(%d) is not emulated\n", (int)a);
        return cudaErrorInvalidValue;
    }
}


/* Device memory is planned (issue 33): the trainer allocates every device byte before its
 * first optimizer step ends and tells so (emu_mem_step, through tr_backend_cuda_step_done);
 * a cudaMalloc after that fails the run with one line naming its size and the step. */
static struct {
    int step;                     /* the last training step reported done; 0: none yet */
    unsigned long long live, peak; /* bytes held by cudaMalloc now, and at most */
} mem;

void emu_mem_step(int step) { mem.step = step; }

void emu_mem_counts(emu_mem_stats *s) {
    s->mallocs = stats.mallocs, s->frees = stats.frees;
    s->bytes = stats.malloc_bytes, s->live = mem.live, s->peak = mem.peak;
}

cudaError_t cudaMalloc(void **p, size_t n) {
    if (mem.step > 0)
        die("cudaMalloc of %zu bytes after training step %d: every device byte must be allocated "
            "before the first optimizer step ends (%llu bytes were, in %lu calls)",
            n, mem.step, stats.malloc_bytes, stats.mallocs);
    /* 256-byte aligned like cudaMalloc, and exactly n bytes (at least 1, so that every pointer
     * is distinct) so that AddressSanitizer sees an access past the end */
    void *q = NULL;
    if (posix_memalign(&q, 256, n ? n : 1)) return cudaErrorMemoryAllocation;
    memset(q, 0xff, n);
    allocs[(uintptr_t)q] = n;
    stats.mallocs++;
    stats.malloc_bytes += n;
    mem.live += n;
    if (mem.live > mem.peak) mem.peak = mem.live;
    *p = q;
    return cudaSuccess;
}

/* The device's memory as cudaGetDeviceProperties gives it, less what cudaMalloc holds: the
 * emulated device has no context, library or NCCL buffers of its own. */
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    *total_b = p.totalGlobalMem;
    *free_b = mem.live < p.totalGlobalMem ? p.totalGlobalMem - mem.live : 0;
    return cudaSuccess;
}

/* cudaFree and cudaFreeHost wait for the device, as CUDA's do: an operation still pending
 * may read or write the memory */
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end()) return cudaErrorInvalidValue;
    drain_all();
    stats.frees++;
    mem.live -= it->second;
    allocs.erase(it);
    dev_lo = dev_hi = 0;
    free(p);
    return cudaSuccess;
}

/* Pinned host memory is plain host memory here; tracked only so that cudaFreeHost can refuse
 * a pointer it did not give. */
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
    unsigned known = cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
    if (!p || (flags & ~known)) return cudaErrorInvalidValue;
    void *q = NULL;
    if (posix_memalign(&q, 256, n ? n : 1)) return cudaErrorMemoryAllocation;
    host_allocs[(uintptr_t)q] = n;
    *p = q;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) {
    return cudaHostAlloc(p, n, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    auto it = host_allocs.find((uintptr_t)p);
    if (it == host_allocs.end()) return cudaErrorInvalidValue;
    drain_all();
    host_allocs.erase(it);
    free(p);
    return cudaSuccess;
}

static int is_pinned(const void *p, size_t n) { /* inside one cudaMallocHost allocation */
    uintptr_t a = (uintptr_t)p;
    auto it = host_allocs.upper_bound(a);
    if (it == host_allocs.begin()) return 0;
    --it;
    return a >= it->first && a + n <= it->first + it->second;
}

struct copy_job {
    void *dst;
    const void *src;
    size_t n;
    void *staged; /* the source, copied when the call was made; freed after */
    int host_src; /* src is host memory read when the copy runs (in host_reads meanwhile) */
    void *watch;  /* adversarial runs: the host source as it was at the call, which it must
                     still be when the copy runs */
};
/* the host memory that queued copies are still to read (under the lock) */
static std::vector<copy_job *> host_reads;
[[noreturn]] static void source_hazard(const copy_job *j) {
    fprintf(stderr,
            "cuda emulator: hazard: cudaMemcpyAsync's host source %p (%zu bytes) was written "
            "before the copy ran (a missing wait: the host reused the source without "
            "synchronizing with the copy's stream)\n",
            j->src, j->n);
    fflush(stderr);
    abort();
}

static void run_copy(void *c) {
    copy_job *j = (copy_job *)c;
    if (j->watch && memcmp(j->watch, j->src, j->n)) source_hazard(j);
    memmove(j->dst, j->staged ? j->staged : j->src, j->n);
    free(j->staged), free(j->watch);
    if (j->host_src)
        host_reads.erase(std::find(host_reads.begin(), host_reads.end(), j));
    delete j;
}
static int host_read_pending(const void *p, size_t n) {
    for (const copy_job *j : host_reads)
        if ((uintptr_t)j->src < (uintptr_t)p + n && (uintptr_t)p < (uintptr_t)j->src + j->n)
            return 1;
    return 0;
}

/* A copy on s, run when the scheduler reaches it; its source is read and its destination
 * written then. Host memory too: the host must synchronize before it reads a device-to-host
 * copy's result, or reuses a copy's source, pinned or pageable (CUDA: a copy with pageable
 * memory "might be synchronous"; the eager mode reads a pageable source at the call). The
 * host destination of a device-to-host copy holds NaN (0xff bytes) until the copy has run,
 * unless a queued copy still reads that memory, and a host source written before its copy
 * ran is a named hazard (adversarial runs keep a copy of it to compare). Host to host is
 * synchronous. */
static cudaError_t copy_async(void *dst, const void *src, size_t n, cudaMemcpyKind k,
                              cudaStream_t s) {
    int dd = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
    int sd = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
    if (k == cudaMemcpyDefault) dd = is_dev(dst, n), sd = is_dev(src, n);
    if ((dd && !is_dev(dst, n)) || (sd && !is_dev(src, n))) {
        fprintf(stderr, "cuda emulator: cudaMemcpy kind %d with a %s pointer outside any "
                        "allocation (%zu bytes)\n", (int)k, dd && !is_dev(dst, n) ? "destination" : "source", n);
        return cudaErrorInvalidValue;
    }
    if (dd && !sd) stats.h2d++, stats.h2d_bytes += n;
    if (sd && !dd) stats.d2h++, stats.d2h_bytes += n;
    if (!n) return cudaSuccess;
    if (!dd && !sd) {
        emu_stream_drain(s);
        memmove(dst, src, n);
        return cudaSuccess;
    }
    copy_job *j = new copy_job{dst, src, n, NULL, 0, NULL};
    int eager = emu_sched_eager();
    if (!sd && eager && !is_pinned(src, n)) {
        j->staged = malloc(n);
        if (!j->staged) die("out of memory staging a copy of %zu bytes", n);
        memcpy(j->staged, src, n);
    } else if (!sd) {
        if (!eager && (j->watch = malloc(n))) memcpy(j->watch, src, n);
        std::lock_guard<std::mutex> g(q_mu); /* run_copy erases under it */
        j->host_src = 1;
        host_reads.push_back(j);
    }
    if (!dd && !eager) {
        std::lock_guard<std::mutex> g(q_mu);
        if (!host_read_pending(dst, n)) memset(dst, 0xff, n);
    }
    emu_stream_exec(s, "cudaMemcpyAsync", run_copy, j);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s) {
    return copy_async(dst, src, n, k, s);
}
/* work on the legacy default stream, which the host waits for */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k) {
    cudaError_t e = copy_async(dst, src, n, k, 0);
    if (e == cudaSuccess) emu_stream_drain(0);
    return e;
}
struct memset_job {
    void *p;
    int v;
    size_t n;
};
static void run_memset(void *c) {
    memset_job *j = (memset_job *)c;
    memset(j->p, j->v, j->n);
    delete j;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    if (!is_dev(p, n)) return cudaErrorInvalidValue;
    if (n) emu_stream_exec(s, "cudaMemsetAsync", run_memset, new memset_job{p, v, n});
    return cudaSuccess;
}
/* asynchronous with respect to the host for device memory (CUDA's "API synchronization
 * behavior"), on the legacy default stream */
cudaError_t cudaMemset(void *p, int v, size_t n) {
    return cudaMemsetAsync(p, v, n, 0);
}

} /* extern "C" */
