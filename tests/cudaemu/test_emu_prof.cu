/* Test of the emulator's memory-access profiler (emu_prof.cc): kernels with known access
 * patterns, each figure expected from the hardware's rules as stated there and worked out in
 * the comment beside it, never from the profiler's code. Then its shared-memory race check
 * (TR_EMU_RACE=1), each case in a forked child: races across warps and within a warp must be
 * reported with the kernel's name, and the same kernels made correct (a barrier, __syncwarp)
 * must run clean, as must lanes writing the two halves of one word. Compiled like the profiling build of
 * model/cuda/ (to_cc.sh, emu.h, -DEMU_PROF, -fsanitize=thread without its runtime). Prints one
 * line per check; exits 0 only when all pass. */
#ifndef EMU_PROF
#error "test_emu_prof.cu tests the emulator's profiler; tests/CMakeLists.txt builds it"
#endif

#include <cuda_runtime.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "emu_prof.h"

static int n_pass, n_fail;

/* figures of one kernel: global (g) or shared (s), loads (ld) or stores (st) */
enum { GLD, GST, SLD, SST };
static void expect(const char *k, int what, unsigned long long req, unsigned long long cost,
                   unsigned long long ideal, const char *why) {
    emu_prof_figures f;
    if (!emu_prof_get(k, &f)) {
        printf("FAIL %s: the profiler has nothing for it\n", k);
        n_fail++;
        return;
    }
    int sh = what >= SLD, wr = what == GST || what == SST;
    static const char *name[] = {"global loads", "global stores", "shared loads", "shared stores"};
    int ok = f.req[sh][wr] == req && f.cost[sh][wr] == cost && f.ideal[sh][wr] == ideal;
    printf("%s %-14s %-13s: %llu requests, %s %llu (ideal %llu); expected %llu, %llu, %llu: %s\n",
           ok ? "PASS" : "FAIL", k, name[what], f.req[sh][wr], sh ? "wavefronts" : "sectors",
           f.cost[sh][wr], f.ideal[sh][wr], req, cost, ideal, why);
    ok ? n_pass++ : n_fail++;
}

/* ---- global memory ------------------------------------------------------------------------ */

/* 64 threads: 2 warps, each a request of 32 consecutive floats = 128 B = 4 sectors. The
 * volatile local array lives on the thread's stack and must not be counted. */
__global__ void copy_k(float *o, const float *in) {
    volatile float tmp[4];
    int i = threadIdx.x;
    tmp[i & 3] = in[i];
    o[i] = tmp[i & 3];
}
/* lane i reads in[32 i]: 32 different sectors for 128 useful bytes (ideal 4) */
__global__ void strided_k(float *o, const float *in) { o[threadIdx.x] = in[threadIdx.x * 32]; }
/* one float off a 256-byte boundary: bytes 4..131 span 5 sectors (ideal 4) */
__global__ void offset_k(float *o, const float *in) { o[threadIdx.x] = in[threadIdx.x + 1]; }
/* 16-byte accesses: 32 lanes x 16 B = 512 B = 16 sectors */
__global__ void vec_k(uint4 *o, const uint4 *in) { o[threadIdx.x] = in[threadIdx.x]; }
/* every lane reads the same float: 1 sector, 4 bytes, ideal 1 */
__global__ void bcast_k(float *o, const float *in) { o[threadIdx.x] = in[0]; }
/* a loop: lane i reads in[4 i + k] at iteration k, 4 requests from one load instruction, each
 * 32 floats 16 B apart: 512 B span = 16 sectors for 128 B (ideal 4) */
__global__ void loop_k(float *o, const float *in, int n) {
    for (int k = 0; k < n; k++) o[threadIdx.x + 32 * k] = in[threadIdx.x * 4 + k];
}

/* ---- shared memory -------------------------------------------------------------------------
 * Each kernel stores a pattern, waits, loads the same pattern (index from an argument, so
 * the compiler cannot forward the stored value), and writes it out coalesced. */

/* column of a 32 x 32 float array: all 32 lanes in bank 0, 32 distinct words: 32 wavefronts */
__global__ void smem_col_k(float *o, int c) {
    __shared__ float s[32][32];
    s[threadIdx.x][c] = (float)threadIdx.x;
    __syncthreads();
    o[threadIdx.x] = s[threadIdx.x][c];
}
/* the same column with rows padded to 33 floats: word 33 i + c, banks all distinct: 1 */
__global__ void smem_pad_k(float *o, int c) {
    __shared__ float s[32][33];
    s[threadIdx.x][c] = (float)threadIdx.x;
    __syncthreads();
    o[threadIdx.x] = s[threadIdx.x][c];
}
/* store a row (1 wavefront), load one word from all lanes (broadcast: 1 wavefront, ideal 1) */
__global__ void smem_bcast_k(float *o, int c) {
    __shared__ float s[32];
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    o[threadIdx.x] = s[c];
}
/* 2-byte elements: lanes 2k and 2k+1 share a word, 16 words in 16 banks: 1 wavefront */
__global__ void smem_half_k(unsigned short *o, int c) {
    __shared__ unsigned short s[64];
    s[threadIdx.x + c] = (unsigned short)threadIdx.x;
    __syncthreads();
    o[threadIdx.x] = s[threadIdx.x + c];
}
/* 16-byte accesses, served a quarter warp (8 lanes) at a time. Consecutive: each quarter
 * covers 128 B = 32 banks once, 4 wavefronts in all, the ideal. Stride 128 B (8 uint4): each
 * quarter's 8 lanes all hit banks 0-3, 8 distinct words per bank: 8 wavefronts per quarter,
 * 32 in all against an ideal 4. */
__global__ void smem_vec_k(uint4 *o, int stride) {
    __shared__ uint4 s[32 * 8];
    s[threadIdx.x * stride] = make_uint4(threadIdx.x, 0, 0, 0);
    __syncthreads();
    o[threadIdx.x] = s[threadIdx.x * stride];
}
/* dynamic shared memory, stride 2 floats: lanes i and i + 16 share a bank with distinct
 * words: 2 wavefronts, ideal 1 */
__global__ void smem_dyn_k(float *o) {
    extern __shared__ float d[];
    d[threadIdx.x * 2] = (float)threadIdx.x;
    __syncthreads();
    o[threadIdx.x] = d[threadIdx.x * 2];
}

/* ---- the race check ------------------------------------------------------------------------ */

/* 64 threads: each writes its slot, then reads the slot 32 away, a thread of the other warp.
 * Without the barrier that read races with the other warp's write. */
__global__ void race_xwarp_k(float *o, int sync) {
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = (float)t;
    if (sync) __syncthreads();
    o[blockIdx.x * 64 + t] = s[(t + 32) % 64];
}
/* one warp: lane l reads lane l^1's slot; without __syncwarp the lanes are not ordered */
__global__ void race_lane_k(float *o, int sync) {
    __shared__ float s[32];
    int l = threadIdx.x;
    s[l] = (float)l;
    if (sync) __syncwarp();
    o[l] = s[l ^ 1];
}
/* lanes 2k and 2k+1 write the two halves of one 4-byte word, then (after a barrier) all read:
 * no byte is touched by two threads unordered */
__global__ void race_halves_k(unsigned short *o) {
    __shared__ unsigned short s[32];
    s[threadIdx.x] = (unsigned short)threadIdx.x;
    __syncthreads();
    o[blockIdx.x * 32 + threadIdx.x] = s[31 - threadIdx.x];
}

/* block b writes o[b], then reads o[b - 1], which block b - 1 writes in the same launch: a
 * race the emulator's block order would hide (block b - 1 always ran first) */
__global__ void race_blocks_k(float *o, int neighbour) {
    if (threadIdx.x == 0) {
        o[blockIdx.x] = (float)blockIdx.x;
        if (neighbour && blockIdx.x > 0) o[64 + blockIdx.x] = o[blockIdx.x - 1];
    }
}

static float *race_buf;
static void run_xwarp_racy(void) { race_xwarp_k<<<1, 64>>>(race_buf, 0); }
static void run_xwarp_sync(void) { race_xwarp_k<<<2, 64>>>(race_buf, 1); }
static void run_lane_racy(void) { race_lane_k<<<1, 32>>>(race_buf, 0); }
static void run_lane_sync(void) { race_lane_k<<<1, 32>>>(race_buf, 1); }
static void run_halves(void) { race_halves_k<<<2, 32>>>((unsigned short *)race_buf); }
static void run_blocks_racy(void) { race_blocks_k<<<4, 32>>>(race_buf, 1); }
static void run_blocks_apart(void) {
    race_blocks_k<<<4, 32>>>(race_buf, 0); /* then read in a second launch: ordered */
    race_blocks_k<<<4, 32>>>(race_buf, 0);
}

/* runs fn in a forked child with environment variable `var` set to `val` (and TR_EMU_PROF
 * unset unless that is var); its stderr goes to buf (NUL-terminated); returns its wait status */
static int in_child(void (*fn)(void), const char *var, const char *val, char *buf, size_t cap) {
    int pfd[2];
    if (pipe(pfd)) {
        perror("pipe");
        exit(2);
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        dup2(pfd[1], 2);
        unsetenv("TR_EMU_PROF");
        setenv(var, val, 1);
        fn();
        cudaDeviceSynchronize(); /* launches are queued: they run by here at the latest */
        _exit(0);
    }
    close(pfd[1]);
    size_t n = 0;
    ssize_t k;
    while (n < cap - 1 && (k = read(pfd[0], buf + n, cap - 1 - n)) > 0)
        n += (size_t)k;
    buf[n] = 0;
    close(pfd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

/* fn under TR_EMU_RACE=1; want != NULL: the child must abort with a report naming `want`;
 * want == NULL: it must finish cleanly with no report */
static void expect_race(void (*fn)(void), const char *want, const char *what) {
    char buf[4096];
    int st = in_child(fn, "TR_EMU_RACE", "1", buf, sizeof(buf));
    int died = WIFSIGNALED(st), reported = strstr(buf, "-memory race") != NULL;
    int ok = want ? died && reported && strstr(buf, want) : WIFEXITED(st) && !WEXITSTATUS(st) && !reported;
    char *nl = strchr(buf, '\n');
    if (nl) *nl = 0;
    printf("%s race check: %s: %s\n", ok ? "PASS" : "FAIL", what,
           *buf ? buf : (WIFEXITED(st) ? "ran clean" : "died without a report"));
    ok ? n_pass++ : n_fail++;
}

/* TR_EMU_PROF naming a file that cannot be written: one line naming it, exit 2, at the first
 * launch (not a lost profile at exit) */
static void check_bad_profile_path(void) {
    char buf[1024];
    int st = in_child(run_halves, "TR_EMU_PROF", "/nonexistent-dir/profile.txt", buf, sizeof(buf));
    int lines = 0;
    for (char *c = buf; *c; c++) lines += *c == '\n';
    int ok = WIFEXITED(st) && WEXITSTATUS(st) == 2 && lines == 1 &&
             strstr(buf, "TR_EMU_PROF=/nonexistent-dir/profile.txt: cannot write");
    char *nl = strchr(buf, '\n');
    if (nl) *nl = 0;
    printf("%s TR_EMU_PROF to a path that cannot be written: exit %d, '%s'\n", ok ? "PASS" : "FAIL",
           WIFEXITED(st) ? WEXITSTATUS(st) : -1, buf);
    ok ? n_pass++ : n_fail++;
}

int main(void) {
    float *in, *o;
    uint4 *vin, *vo;
    if (cudaMalloc((void **)&in, 4096 * sizeof(float)) || cudaMalloc((void **)&o, 4096 * sizeof(float)) ||
        cudaMalloc((void **)&vin, 256 * sizeof(uint4)) || cudaMalloc((void **)&vo, 256 * sizeof(uint4))) {
        printf("FAIL cudaMalloc\n");
        return 1;
    }
    /* the race checks first, in children, before this process has cached the setting */
    race_buf = o;
    expect_race(run_xwarp_racy, "race_xwarp_k", "warps exchange through shared memory without a barrier");
    expect_race(run_xwarp_sync, NULL, "the same with __syncthreads");
    expect_race(run_lane_racy, "(same warp", "lanes exchange without __syncwarp");
    expect_race(run_lane_sync, NULL, "the same with __syncwarp");
    expect_race(run_halves, NULL, "lanes write the two halves of one word");
    expect_race(run_blocks_racy, "global-memory race in kernel race_blocks_k",
                "a block reads what another block writes in the same launch");
    expect_race(run_blocks_apart, NULL, "blocks write their own elements, in two launches");
    check_bad_profile_path();
    setenv("TR_EMU_PROF", "1", 1); /* on, and the table at exit to stderr */

    copy_k<<<1, 64>>>(o, in);
    strided_k<<<1, 32>>>(o, in);
    offset_k<<<1, 32>>>(o, in);
    vec_k<<<1, 32>>>(vo, vin);
    bcast_k<<<1, 32>>>(o, in);
    loop_k<<<1, 32>>>(o, in, 4);
    smem_col_k<<<1, 32>>>(o, 0);
    smem_pad_k<<<1, 32>>>(o, 0);
    smem_bcast_k<<<1, 32>>>(o, 5);
    smem_half_k<<<1, 32>>>((unsigned short *)o, 0);
    smem_vec_k<<<1, 32>>>(vo, 1);
    smem_vec_k<<<1, 32>>>(vo, 8);
    smem_dyn_k<<<2, 32, 64 * sizeof(float)>>>(o);
    cudaDeviceSynchronize(); /* the launches have run */

    expect("copy_k", GLD, 2, 8, 8, "two warps, coalesced; stack accesses not counted");
    expect("copy_k", GST, 2, 8, 8, "two warps, coalesced");
    expect("strided_k", GLD, 1, 32, 4, "stride 128 B: a sector per lane");
    expect("offset_k", GLD, 1, 5, 4, "misaligned by 4 B: one sector more");
    expect("vec_k", GLD, 1, 16, 16, "16-byte loads, coalesced");
    expect("vec_k", GST, 1, 16, 16, "16-byte stores, coalesced");
    expect("bcast_k", GLD, 1, 1, 1, "one address for all lanes");
    expect("loop_k", GLD, 4, 64, 16, "one load instruction, 4 iterations, stride 16 B");
    expect("loop_k", GST, 4, 16, 16, "coalesced stores in the loop");
    expect("smem_col_k", SST, 1, 32, 1, "column: 32-way bank conflict");
    expect("smem_col_k", SLD, 1, 32, 1, "column: 32-way bank conflict");
    expect("smem_pad_k", SST, 1, 1, 1, "padded column: no conflict");
    expect("smem_pad_k", SLD, 1, 1, 1, "padded column: no conflict");
    expect("smem_bcast_k", SST, 1, 1, 1, "row: no conflict");
    expect("smem_bcast_k", SLD, 1, 1, 1, "broadcast of one word");
    expect("smem_half_k", SST, 1, 1, 1, "2-byte elements, two per word");
    expect("smem_vec_k", SST, 2, 4 + 32, 4 + 4, "16 B: consecutive 4 wavefronts, stride 128 B 32");
    expect("smem_vec_k", SLD, 2, 4 + 32, 4 + 4, "the same loads");
    expect("smem_dyn_k", SST, 2, 4, 2, "dynamic shared memory, stride 2 floats, 2 blocks");
    expect("smem_dyn_k", GST, 2, 8, 8, "coalesced, 2 blocks");
    printf("%d checks passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
