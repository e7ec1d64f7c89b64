/* Bus bandwidth of comm.h's device collectives (all-reduce, reduce-scatter, all-gather) against
 * NCCL called directly on the same GPUs and buffers, by nccl-tests' definitions: bytes is the
 * full buffer (all-reduce's buffer, reduce-scatter's input, all-gather's output), algbw =
 * bytes / time, busbw = algbw * 2(p-1)/p for all-reduce and algbw * (p-1)/p for the other two
 * (what each link of a ring carries, comparable across p). A time is the slowest rank's mean
 * over --iters calls issued back to back after --warmup calls, from a barrier to the compute
 * stream drained: comm.h's wait orders that stream after the operation, and direct NCCL runs
 * on that stream itself, so both are timed by the same cudaStreamSynchronize.
 *
 *   mpirun -np N comm_bench [options]   one rank per GPU: comm.h over NCCL, against NCCL
 *   TR_COMM_DEVICE=nccl comm_bench      one rank: busbw is 0 by definition; per-call times of
 *                                       comm.h and NCCL on a communicator of one instead
 *   mpirun -np 2 comm_bench             two ranks on one GPU: comm.h's staged transport (host
 *                                       round trip over MPI); NCCL refuses a shared GPU
 * options: --min BYTES (1M) --max BYTES (1G) --factor F (4) --iters N (20) --warmup N (5)
 *          --dtype bf16|f32|both (both) --op all_reduce|reduce_scatter|all_gather|all (all)
 *          --no-nccl (comm.h only). BYTES takes K, M, G (powers of 1024).
 * Rank 0 prints the table and `summary:` lines (bench/comm.sh collects them). Exits 77 without
 * a CUDA device. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/backend.h"
#include "parallel/comm/comm.h"

typedef struct {
    const char *name;
    tr_comm_op op;
    double bus; /* busbw / algbw on p ranks is bus * (p - 1) / p */
} op_info;
static const op_info ops[] = {
    {"all_reduce", TR_COMM_OP_ALL_REDUCE, 2.0},
    {"reduce_scatter", TR_COMM_OP_REDUCE_SCATTER, 1.0},
    {"all_gather", TR_COMM_OP_ALL_GATHER, 1.0},
};
enum { N_OPS = sizeof ops / sizeof ops[0] };

typedef struct {
    tr_comm *w;
    int rank, size;
    cudaStream_t stream; /* the backend's compute stream */
    ncclComm_t nc;       /* direct NCCL; NULL when not measured */
    void *a, *b;         /* device buffers of max bytes each */
    int iters, warmup;
} bench;

/* A bench, not a library: a failed CUDA or NCCL call ends the job (mpirun ends the others). */
static void die(const bench *x, const char *what, const char *why) {
    fprintf(stderr, "comm_bench: rank %d: %s: %s\n", x->rank, what, why);
    fflush(stderr);
    exit(1);
}
#define CUDA_CHECK(x, call)                                                                        \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) die(x, #call, cudaGetErrorString(e_));                              \
    } while (0)
#define NCCL_CHECK(x, call)                                                                        \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) die(x, #call, ncclGetErrorString(r_));                              \
    } while (0)

/* "64M" -> 64 << 20 (K, M, G: powers of 1024, an optional B or iB after them); 0 when not a
 * size */
static size_t parse_bytes(const char *s) {
    char *end;
    double v = strtod(s, &end), unit = 1;
    const char *units = "KMG";
    const char *u = *end ? strchr(units, *end & ~0x20) : NULL;
    if (u && *end) {
        for (const char *q = units; q <= u; q++)
            unit *= 1024;
        end++;
    }
    if (strcmp(end, "") && strcmp(end, "B") && strcmp(end, "iB")) return 0;
    return v >= 1 ? (size_t)(v * unit) : 0;
}

static const char *human(size_t bytes, char *buf, size_t len) {
    if (bytes >= (1u << 30) && bytes % (1u << 30) == 0)
        snprintf(buf, len, "%zuG", bytes >> 30);
    else if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
        snprintf(buf, len, "%zuM", bytes >> 20);
    else if (bytes >= 1024 && bytes % 1024 == 0)
        snprintf(buf, len, "%zuK", bytes >> 10);
    else
        snprintf(buf, len, "%zu", bytes);
    return buf;
}

/* One call of op on n elements (per-rank count as comm.h and NCCL take it) through comm.h
 * (nccl = 0) or NCCL directly. All-reduce in place on a; reduce-scatter a -> b; all-gather
 * a -> b. */
static void launch(const bench *x, int nccl, const op_info *o, size_t n, tr_comm_dtype t) {
    if (!nccl) {
        tr_comm_req *r =
            tr_comm_start(x->w, o->op, x->a, o->op == TR_COMM_OP_ALL_REDUCE ? x->a : x->b, n, t, -1,
                          0, TR_COMM_DEVICE);
        if (!r) die(x, o->name, "tr_comm_start refused the operation");
        tr_comm_wait(r);
        return;
    }
    ncclDataType_t nt = t == TR_COMM_BF16 ? ncclBfloat16 : ncclFloat32;
    if (o->op == TR_COMM_OP_ALL_REDUCE)
        NCCL_CHECK(x, ncclAllReduce(x->a, x->a, n, nt, ncclSum, x->nc, x->stream));
    else if (o->op == TR_COMM_OP_REDUCE_SCATTER)
        NCCL_CHECK(x, ncclReduceScatter(x->a, x->b, n, nt, ncclSum, x->nc, x->stream));
    else
        NCCL_CHECK(x, ncclAllGather(x->a, x->b, n, nt, x->nc, x->stream));
}

/* Seconds per call, the slowest rank's. */
static double time_calls(const bench *x, int nccl, const op_info *o, size_t n, tr_comm_dtype t) {
    for (int i = 0; i < x->warmup; i++)
        launch(x, nccl, o, n, t);
    CUDA_CHECK(x, cudaStreamSynchronize(x->stream));
    tr_comm_barrier(x->w);
    double t0 = tr_now();
    for (int i = 0; i < x->iters; i++)
        launch(x, nccl, o, n, t);
    CUDA_CHECK(x, cudaStreamSynchronize(x->stream));
    double mine = (tr_now() - t0) / x->iters, worst = 0;
    double *all = malloc((size_t)x->size * sizeof *all);
    if (!all || tr_comm_all_gather(x->w, &mine, all, 1, TR_COMM_F64))
        die(x, "timing", "all_gather");
    for (int r = 0; r < x->size; r++)
        if (all[r] > worst) worst = all[r];
    free(all);
    return worst;
}

/* How many distinct GPUs the ranks drive, and the first one's name. */
static int count_gpus(const bench *x, char *name, size_t len) {
    int dev;
    struct cudaDeviceProp p;
    CUDA_CHECK(x, cudaGetDevice(&dev));
    CUDA_CHECK(x, cudaGetDeviceProperties(&p, dev));
    snprintf(name, len, "%s", p.name);
    unsigned char *all = malloc((size_t)x->size * 16);
    if (!all || tr_comm_all_gather(x->w, p.uuid.bytes, all, 16, TR_COMM_BYTE))
        die(x, "the GPU census", "all_gather");
    int distinct = 0;
    for (int i = 0; i < x->size; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = !memcmp(all + 16 * i, all + 16 * j, 16);
        distinct += !seen;
    }
    free(all);
    return distinct;
}

/* Direct NCCL over the world (rank 0's unique id broadcast through comm.h); NULL, said why,
 * when it cannot be made. */
static ncclComm_t nccl_open(const bench *x, char *why, size_t len) {
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    int bad = x->rank == 0 && ncclGetUniqueId(&id) != ncclSuccess;
    if (tr_comm_all_reduce(x->w, &bad, 1, TR_COMM_I32) || bad) {
        snprintf(why, len, "ncclGetUniqueId failed");
        return NULL;
    }
    if (tr_comm_broadcast(x->w, &id, sizeof id, TR_COMM_BYTE, 0))
        die(x, "the NCCL id", "broadcast");
    ncclComm_t nc = NULL;
    ncclResult_t rc = ncclCommInitRank(&nc, x->size, id, x->rank);
    bad = rc != ncclSuccess;
    if (tr_comm_all_reduce(x->w, &bad, 1, TR_COMM_I32) || bad) {
        snprintf(why, len, "ncclCommInitRank failed on %d rank(s)%s%s", bad,
                 rc != ncclSuccess ? ": " : "", rc != ncclSuccess ? ncclGetErrorString(rc) : "");
        if (rc == ncclSuccess) ncclCommDestroy(nc);
        return NULL;
    }
    return nc;
}

static void usage(void) {
    fprintf(stderr, "usage: comm_bench [--min BYTES] [--max BYTES] [--factor F] [--iters N] "
                    "[--warmup N] [--dtype bf16|f32|both] [--op NAME|all] [--no-nccl]\n");
}

int main(int argc, char **argv) {
    char err[256];
    tr_comm *w;
    if (tr_comm_init(&w, &argc, &argv, 120, err, sizeof err)) {
        fprintf(stderr, "comm_bench: %s\n", err);
        return 1;
    }
    bench x = {.w = w, .rank = tr_comm_rank(w), .size = tr_comm_size(w), .iters = 20, .warmup = 5};
    size_t lo = 1 << 20, hi = (size_t)1 << 30;
    int factor = 4, want_nccl = 1, dt_mask = 3, op_mask = 7;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (!strcmp(a, "--no-nccl")) {
            want_nccl = 0;
            continue;
        }
        if (!v)
            ok = 0;
        else if (!strcmp(a, "--min"))
            ok = (lo = parse_bytes(v)) > 0;
        else if (!strcmp(a, "--max"))
            ok = (hi = parse_bytes(v)) > 0;
        else if (!strcmp(a, "--factor"))
            ok = (factor = atoi(v)) >= 2;
        else if (!strcmp(a, "--iters"))
            ok = (x.iters = atoi(v)) >= 1;
        else if (!strcmp(a, "--warmup"))
            ok = (x.warmup = atoi(v)) >= 0;
        else if (!strcmp(a, "--dtype"))
            ok = (dt_mask = !strcmp(v, "bf16")   ? 1
                            : !strcmp(v, "f32")  ? 2
                            : !strcmp(v, "both") ? 3
                                                 : 0);
        else if (!strcmp(a, "--op")) {
            op_mask = !strcmp(v, "all") ? 7 : 0;
            for (int k = 0; k < N_OPS; k++)
                if (!strcmp(v, ops[k].name)) op_mask = 1 << k;
            ok = op_mask != 0;
        } else
            ok = 0;
        if (!ok) {
            if (x.rank == 0) {
                fprintf(stderr, "comm_bench: bad argument '%s%s%s'\n", a, v ? " " : "", v ? v : "");
                usage();
            }
            tr_comm_free(w);
            return 2;
        }
        i++;
    }
    if (lo > hi) {
        if (x.rank == 0) fprintf(stderr, "comm_bench: --min %zu is above --max %zu\n", lo, hi);
        tr_comm_free(w);
        return 2;
    }

    if (!tr_backend_cuda(TR_DTYPE_BF16, err, sizeof err)) {
        if (x.rank == 0) printf("comm_bench: no CUDA device: %s: nothing measured\n", err);
        tr_comm_free(w);
        return 77;
    }
    x.stream = (cudaStream_t)tr_backend_cuda_stream();
    if (tr_comm_device_init(x.stream, err, sizeof err)) die(&x, "tr_comm_device_init", err);
    char gpu[256];
    int gpus = count_gpus(&x, gpu, sizeof gpu);
    CUDA_CHECK(&x, cudaMalloc(&x.a, hi));
    CUDA_CHECK(&x, cudaMalloc(&x.b, hi));
    /* zeros: sums stay finite however many times a buffer is reduced into itself */
    CUDA_CHECK(&x, cudaMemsetAsync(x.a, 0, hi, x.stream));
    CUDA_CHECK(&x, cudaMemsetAsync(x.b, 0, hi, x.stream));
    CUDA_CHECK(&x, cudaStreamSynchronize(x.stream));

    /* the first device operation picks comm.h's transport; then the direct communicator */
    launch(&x, 0, &ops[0], 1, TR_COMM_F32);
    CUDA_CHECK(&x, cudaStreamSynchronize(x.stream));
    const char *transport = tr_comm_device_transport(w);
    char why[256] = "";
    if (!want_nccl)
        snprintf(why, sizeof why, "--no-nccl");
    else if (gpus < x.size)
        snprintf(why, sizeof why, "%d ranks share %d GPU%s: NCCL refuses two ranks on one GPU",
                 x.size, gpus, gpus > 1 ? "s" : "");
    else
        x.nc = nccl_open(&x, why, sizeof why);
    int nv = 0;
    ncclGetVersion(&nv);

    int p = x.size;
    char h1[32], h2[32];
    if (x.rank == 0) {
        printf("comm_bench: %d rank%s on %d GPU%s (%s); comm.h device transport: %s; direct NCCL "
               "%d.%d.%d: %s\n",
               p, p > 1 ? "s" : "", gpus, gpus > 1 ? "s" : "", gpu, transport, nv / 10000,
               nv / 100 % 100, nv % 100, x.nc ? "measured" : why);
        printf("comm_bench: bytes %s to %s by x%d, %d calls timed after %d warm-up, time = the "
               "slowest rank's mean per call\n",
               human(lo, h1, sizeof h1), human(hi, h2, sizeof h2), factor, x.iters, x.warmup);
        if (p == 1)
            printf("comm_bench: 1 rank: bus bandwidth is 0 by definition (busbw = algbw x "
                   "2(n-1)/n or (n-1)/n, n = 1): multi-GPU figures cannot be measured on one "
                   "GPU; what can: each call's time through comm.h (transport %s) and NCCL on a "
                   "communicator of one, and their ratio\n",
                   transport);
        if (!strcmp(transport, "staged"))
            printf("comm_bench: staged transport: each call copies device -> pinned host, runs "
                   "the MPI operation, copies back: a host round trip, not a GPU link\n");
        if (p > 1)
            printf("\n%-15s %-5s %11s | %10s %8s %8s | %10s %8s %8s | %s\n", "op", "dtype", "bytes",
                   "comm.h us", "algbw", "busbw", "NCCL us", "algbw", "busbw", "busbw comm.h/NCCL");
        else
            printf("\n%-15s %-5s %11s | %12s %8s | %12s %8s | %s\n", "op", "dtype", "bytes",
                   "comm.h us", "GB/s", "NCCL us", "GB/s", "time comm.h/NCCL");
    }

    typedef struct {
        double bus_c, bus_n, us_c, us_n;
        size_t bytes;
    } best;
    for (int dt = 0; dt < 2; dt++) {
        if (!(dt_mask & (1 << dt))) continue;
        tr_comm_dtype t = dt == 0 ? TR_COMM_BF16 : TR_COMM_F32;
        const char *tn = dt == 0 ? "bf16" : "f32";
        size_t es = dt == 0 ? 2 : 4;
        for (int k = 0; k < N_OPS; k++) {
            if (!(op_mask & (1 << k))) continue;
            const op_info *o = &ops[k];
            best last = {0, 0, 0, 0, 0}, first = {0, 0, 0, 0, 0};
            for (size_t s = lo; s <= hi; s = s * (size_t)factor) {
                /* per-rank count; reduce-scatter's input and all-gather's output are p of them */
                size_t n = o->op == TR_COMM_OP_ALL_REDUCE ? s / es : s / (es * (size_t)p);
                if (n == 0) continue;
                size_t bytes = o->op == TR_COMM_OP_ALL_REDUCE ? n * es : n * es * (size_t)p;
                double t_c = time_calls(&x, 0, o, n, t),
                       t_n = x.nc ? time_calls(&x, 1, o, n, t) : 0;
                double alg_c = bytes / t_c / 1e9, bus_c = alg_c * o->bus * (p - 1) / p;
                double alg_n = x.nc ? bytes / t_n / 1e9 : 0, bus_n = alg_n * o->bus * (p - 1) / p;
                best row = {bus_c, bus_n, t_c * 1e6, t_n * 1e6, bytes};
                if (!first.bytes) first = row;
                last = row;
                if (x.rank != 0) continue;
                if (p > 1 && x.nc)
                    printf("%-15s %-5s %11zu | %10.1f %8.2f %8.2f | %10.1f %8.2f %8.2f | %.3f\n",
                           o->name, tn, bytes, t_c * 1e6, alg_c, bus_c, t_n * 1e6, alg_n, bus_n,
                           bus_c / bus_n);
                else if (p > 1)
                    printf("%-15s %-5s %11zu | %10.1f %8.2f %8.2f | %10s %8s %8s | n/a\n", o->name,
                           tn, bytes, t_c * 1e6, alg_c, bus_c, "n/a", "n/a", "n/a");
                else if (x.nc)
                    printf("%-15s %-5s %11zu | %12.1f %8.2f | %12.1f %8.2f | %.3f\n", o->name, tn,
                           bytes, t_c * 1e6, alg_c, t_n * 1e6, alg_n, t_c / t_n);
                else
                    printf("%-15s %-5s %11zu | %12.1f %8.2f | %12s %8s | n/a\n", o->name, tn, bytes,
                           t_c * 1e6, alg_c, "n/a", "n/a");
                fflush(stdout);
            }
            if (x.rank != 0 || !last.bytes) continue;
            /* one line per op and dtype for the summaries: the largest size's bus bandwidth,
               or on one rank the smallest size's time per call */
            if (p > 1 && x.nc)
                printf("summary: %s %s %s: busbw comm.h %.1f GB/s, NCCL %.1f GB/s (%.2f), %d "
                       "ranks, %s\n",
                       o->name, tn, human(last.bytes, h1, sizeof h1), last.bus_c, last.bus_n,
                       last.bus_c / last.bus_n, p, transport);
            else if (p > 1)
                printf("summary: %s %s %s: busbw comm.h %.1f GB/s (%s, %d ranks on %d GPU%s), "
                       "NCCL n/a\n",
                       o->name, tn, human(last.bytes, h1, sizeof h1), last.bus_c, transport, p,
                       gpus, gpus > 1 ? "s" : "");
            else
                printf("summary: %s %s %s: 1 rank, busbw 0 by definition; per call comm.h %.1f "
                       "us (%s), NCCL %s\n",
                       o->name, tn, human(first.bytes, h1, sizeof h1), first.us_c, transport,
                       x.nc ? (snprintf(h2, sizeof h2, "%.1f us", first.us_n), h2) : "n/a");
        }
    }
    if (x.nc) ncclCommDestroy(x.nc);
    cudaFree(x.a);
    cudaFree(x.b);
    tr_comm_free(w);
    return 0;
}
