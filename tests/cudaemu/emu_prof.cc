/* The CUDA emulator's memory-access profiler: how a kernel's warps use global and shared
 * memory, from the access pattern alone, on a machine without a GPU.
 *
 * The profiling build compiles the kernels' .cc files with -fsanitize=thread and links no
 * ThreadSanitizer runtime: the compiler then calls __tsan_readN / __tsan_writeN (below) before
 * every load and store the kernel makes, with its address. Each access is kept, per thread,
 * with the call site (the return address: one per load or store instruction of the source)
 * until the thread's warp reaches a warp operation, a barrier or its end (emu_runtime.cc
 * calls emu_prof_flush_warp then). The lanes of a warp run the same instructions in the same
 * order, so the k-th access from call site P of each lane is one warp-wide request, the unit
 * the hardware serves, and each request is costed:
 *
 *   global memory: the 32-byte sectors it touches, against the fewest that could hold its
 *     distinct bytes (ceil(bytes / 32)); efficiency = ideal / actual, 100% when coalesced.
 *   shared memory: the wavefronts it needs. Memory is 32 banks of 4-byte words; in one
 *     wavefront each bank serves one word (any number of lanes reading that word: broadcast).
 *     Accesses of 8 and 16 bytes are served a half and a quarter warp at a time. Wavefronts of
 *     a phase = the most distinct words any one bank holds; ideal = ceil(distinct words / 32).
 *     conflict = wavefronts / ideal, 1.00 when free of bank conflicts.
 *
 * These are the hardware's rules for the unit of service (NVIDIA's CUDA C++ Best Practices
 * Guide, "Coalesced access to global memory" and "Shared memory and memory banks"); what they
 * cost in time depends on caches and latency hiding, which no emulator models. Which accesses
 * the compiler keeps in registers also differs between g++ (here, -O1) and nvcc: the figures
 * describe the source's loads and stores. Accesses to a thread's own stack (local variables)
 * are not counted.
 *
 * TR_EMU_PROF=FILE (or 1 for stderr) prints one line per kernel at exit.
 *
 * The same hooks serve a race check, TR_EMU_RACE=1 (below): unordered accesses to one byte of
 * shared memory by two threads of a block, and to global memory by two blocks of a launch. */
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "emu_prof.h"

std::string where(uintptr_t pc); /* below */

namespace {

struct access {
    uintptr_t pc, addr;
    unsigned size;
    unsigned char write, shared;
};

struct counts {
    unsigned long long launches = 0;
    unsigned long long req[2][2] = {};  /* [shared][write] warp-wide requests */
    unsigned long long cost[2][2] = {}; /* sectors (global) or wavefronts (shared) */
    unsigned long long ideal[2][2] = {};
};

struct site { /* one load or store instruction of the source */
    unsigned long long req = 0, cost = 0, ideal = 0;
    int shared = 0, write = 0;
};

struct state {
    int on = -1;   /* TR_EMU_PROF: the profile */
    int race = -1; /* TR_EMU_RACE: the race check */
    FILE *out = nullptr; /* where the profile goes at exit */
    const char *kernel = nullptr;
    const unsigned char *dyn = nullptr;
    size_t dyn_bytes = 0;
    std::vector<access> lane[1024];
    std::map<std::string, counts> by_kernel;
    std::map<std::string, std::map<uintptr_t, site>> sites;
};
state &P = *new state; /* never destroyed: the report at exit runs after static destructors */

extern "C" char __start_emu_shared[] __attribute__((weak));
extern "C" char __stop_emu_shared[] __attribute__((weak));

int env_on(const char *name) {
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0");
}
/* TR_EMU_PROF=FILE: the file is opened when the profile starts, so that a path that cannot
 * be written stops the program at once, in one line, instead of losing the profile at exit */
int enabled(void) {
    if (P.on < 0) {
        P.on = env_on("TR_EMU_PROF");
        const char *e = getenv("TR_EMU_PROF");
        if (P.on && strcmp(e, "1") && !(P.out = fopen(e, "w"))) {
            fprintf(stderr, "cuda emulator: TR_EMU_PROF=%s: cannot write the profile there: %s\n",
                    e, strerror(errno));
            exit(2);
        }
        if (P.on && !P.out) P.out = stderr;
    }
    return P.on;
}
int racing(void) {
    if (P.race < 0) P.race = env_on("TR_EMU_RACE");
    return P.race;
}

/* distinct byte ranges of one request, merged */
void merged(std::vector<std::pair<uintptr_t, uintptr_t>> &iv) {
    std::sort(iv.begin(), iv.end());
    size_t o = 0;
    for (size_t i = 0; i < iv.size(); i++) {
        if (o && iv[i].first <= iv[o - 1].second)
            iv[o - 1].second = std::max(iv[o - 1].second, iv[i].second);
        else
            iv[o++] = iv[i];
    }
    iv.resize(o);
}

void cost_global(counts &c, site &st, const std::vector<const access *> &r) {
    std::vector<std::pair<uintptr_t, uintptr_t>> iv;
    for (const access *a : r) iv.push_back({a->addr, a->addr + a->size});
    merged(iv);
    unsigned long long bytes = 0, sectors = 0;
    uintptr_t last = UINTPTR_MAX;
    for (auto &x : iv) {
        bytes += x.second - x.first;
        for (uintptr_t s = x.first >> 5; s <= (x.second - 1) >> 5; s++)
            if (s != last) sectors++, last = s;
    }
    int w = r[0]->write;
    c.req[0][w]++;
    c.cost[0][w] += sectors;
    c.ideal[0][w] += (bytes + 31) / 32;
    st.req++, st.cost += sectors, st.ideal += (bytes + 31) / 32;
}

void cost_shared(counts &c, site &st, const std::vector<const access *> &r,
                 const unsigned lane_of[]) {
    unsigned size = 0;
    for (const access *a : r) size = std::max(size, a->size);
    int phases = size > 8 ? 4 : size > 4 ? 2 : 1, w = r[0]->write;
    unsigned long long waves = 0, ideal = 0;
    for (int ph = 0; ph < phases; ph++) {
        std::vector<uintptr_t> words;
        for (size_t i = 0; i < r.size(); i++) {
            if ((int)(lane_of[i] * phases / 32) != ph) continue;
            for (uintptr_t wd = r[i]->addr >> 2; wd <= (r[i]->addr + r[i]->size - 1) >> 2; wd++)
                words.push_back(wd);
        }
        if (words.empty()) continue;
        std::sort(words.begin(), words.end());
        words.erase(std::unique(words.begin(), words.end()), words.end());
        unsigned per_bank[32] = {0}, most = 0;
        for (uintptr_t wd : words) most = std::max(most, ++per_bank[wd & 31]);
        waves += most;
        ideal += (words.size() + 31) / 32;
    }
    c.req[1][w]++;
    c.cost[1][w] += waves;
    c.ideal[1][w] += ideal;
    st.req++, st.cost += waves, st.ideal += ideal;
}


/* ---- the shared-memory race check (TR_EMU_RACE=1) -----------------------------------------
 * Two accesses to one byte of shared memory by different threads race when at least one is a
 * write and nothing orders them: no __syncthreads between them (each barrier, and each block,
 * starts a new epoch), and, for two lanes of one warp, no warp operation either (__syncwarp,
 * a shuffle, mma: each starts a new epoch of that warp). Lanes of a warp are not in lockstep
 * on Volta and later, so an unsynchronized exchange between them is a race there too. Each
 * byte keeps its last write and its last two readers, so a race is never reported where
 * there is none; with three or more readers of one byte in an epoch one may go unseen. The
 * first race aborts the program with both source lines. */
struct stamp {
    uint64_t epoch = 0, wepoch = 0; /* 0: none */
    uintptr_t pc = 0;
    int thread = -1;
};
struct shadow {
    stamp w, r[2];
};
uint64_t epoch_now = 1, wepoch_next = 1;
uint64_t wepoch_of[1024 / 32];
std::vector<shadow> sh_dyn, sh_static;

/* a (earlier) and the access now by thread t: ordered? */
inline bool ordered(const stamp &a, int t) {
    if (a.epoch != epoch_now || a.thread == t || a.thread < 0) return true;
    return a.thread / 32 == t / 32 && a.wepoch != wepoch_of[t / 32];
}

[[noreturn]] void report_race(const stamp &a, int awrite, uintptr_t pc, int t, int write,
                              size_t off, int dyn) {
    fprintf(stderr,
            "cuda emulator: shared-memory race in kernel %s: thread %d %s at %s and thread %d "
            "%s at %s touch byte %zu of %s shared memory with no barrier between them%s\n",
            P.kernel, a.thread, awrite ? "writes" : "reads", where(a.pc).c_str(), t,
            write ? "writes" : "reads", where(pc).c_str(), off, dyn ? "dynamic" : "static",
            a.thread / 32 == t / 32 ? " (same warp: no __syncwarp or warp operation either)" : "");
    fflush(stderr);
    abort();
}

void race_check(uintptr_t pc, uintptr_t a, unsigned size, int write, int dyn) {
    std::vector<shadow> &v = dyn ? sh_dyn : sh_static;
    uintptr_t base = dyn ? (uintptr_t)P.dyn : (uintptr_t)__start_emu_shared;
    size_t n = dyn ? P.dyn_bytes : (size_t)(__stop_emu_shared - __start_emu_shared);
    if (v.size() < n) v.resize(n);
    int t = emu_thread_now;
    stamp now;
    now.epoch = epoch_now, now.wepoch = wepoch_of[t / 32], now.pc = pc, now.thread = t;
    for (uintptr_t b = a; b < a + size && b - base < n; b++) {
        shadow &s = v[b - base];
        if (!ordered(s.w, t)) report_race(s.w, 1, pc, t, write, b - base, dyn);
        if (write) {
            for (const stamp &r : s.r)
                if (!ordered(r, t)) report_race(r, 0, pc, t, write, b - base, dyn);
            s.w = now;
        } else if (s.r[0].thread != t || s.r[0].epoch != epoch_now) {
            s.r[1] = s.r[0];
            s.r[0] = now;
        }
    }
}

/* Global memory, within one launch: blocks are not ordered, so a 2-byte granule (the smallest
 * element the kernels store) that one block writes and another block reads or writes in the
 * same launch is a race (on the GPU the outcome depends on which block runs first; the
 * emulator runs them in order and would hide it). Each granule touched keeps its writing
 * block and its reading block (or "several") and their source lines, in pages of shadow kept
 * for the launch and dropped when it ends: 6 times the memory the launch touches. */
struct gpage { /* the 4096 bytes of one page, in 2048 granules */
    int w[2048], r[2048];             /* writing / reading block; -1 none, r -2 several */
    uint16_t wsite[2048], rsite[2048]; /* their source lines, as indices into `sites` */
    gpage() {
        memset(w, 0xff, sizeof(w));
        memset(r, 0xff, sizeof(r));
    }
};
std::unordered_map<uintptr_t, std::unique_ptr<gpage>> gmem;
std::vector<uintptr_t> sites; /* the call sites seen, so a granule keeps 2 bytes, not 8 */
std::unordered_map<uintptr_t, uint16_t> site_of;

uint16_t site_index(uintptr_t pc) {
    auto it = site_of.find(pc);
    if (it != site_of.end()) return it->second;
    uint16_t k = (uint16_t)(sites.size() < 65535 ? sites.size() : 65535);
    if (sites.size() < 65535) sites.push_back(pc);
    site_of[pc] = k;
    return k;
}
uintptr_t site_pc(uint16_t k) { return k < sites.size() ? sites[k] : 0; }

[[noreturn]] void report_global_race(int ob, int owrite, uintptr_t opc, int b, int write,
                                     uintptr_t pc) {
    char who[32];
    if (ob >= 0)
        snprintf(who, sizeof(who), "block %d", ob);
    else
        snprintf(who, sizeof(who), "several blocks");
    fprintf(stderr,
            "cuda emulator: global-memory race in kernel %s: %s %s at %s and block %d %s at %s "
            "the same bytes in one launch (blocks are not ordered)\n",
            P.kernel, who, owrite ? "write" : "read", where(opc).c_str(), b,
            write ? "writes" : "reads", where(pc).c_str());
    fflush(stderr);
    abort();
}

void global_race_check(uintptr_t pc, uintptr_t a, unsigned size, int write) {
    int b = emu_block_now();
    gpage *pg = nullptr;
    uintptr_t cur = UINTPTR_MAX;
    uint16_t here = site_index(pc);
    for (uintptr_t x = a & ~(uintptr_t)1; x < a + size; x += 2) {
        if (x >> 12 != cur) {
            cur = x >> 12;
            auto &slot = gmem[cur];
            if (!slot) slot.reset(new gpage());
            pg = slot.get();
        }
        unsigned i = (unsigned)(x & 4095) >> 1;
        if (pg->w[i] >= 0 && pg->w[i] != b)
            report_global_race(pg->w[i], 1, site_pc(pg->wsite[i]), b, write, pc);
        if (write) {
            if (pg->r[i] != -1 && pg->r[i] != b) /* -2: one of several */
                report_global_race(pg->r[i], 0, site_pc(pg->rsite[i]), b, write, pc);
            pg->w[i] = b, pg->wsite[i] = here;
        } else if (pg->r[i] == -1) {
            pg->r[i] = b, pg->rsite[i] = here;
        } else if (pg->r[i] != b) {
            pg->r[i] = -2;
        }
    }
}

inline void record(uintptr_t pc, const void *p, unsigned size, int write) {
    if (!P.kernel) return;
    uintptr_t a = (uintptr_t)p;
    int shared;
    if (P.dyn && a >= (uintptr_t)P.dyn && a < (uintptr_t)P.dyn + P.dyn_bytes) {
        shared = 1;
        if (P.race) race_check(pc, a, size, write, 1);
    } else if (__start_emu_shared && a >= (uintptr_t)__start_emu_shared &&
               a < (uintptr_t)__stop_emu_shared) {
        shared = 1;
        if (P.race) race_check(pc, a, size, write, 0);
    } else if ((P.on || P.race) && emu_is_device(p, size)) {
        shared = 0;
        if (P.race) global_race_check(pc, a, size, write);
    } else {
        return; /* the thread's stack, or the emulator's own state (threadIdx and the like) */
    }
    if (P.on)
        P.lane[emu_thread_now].push_back(
            access{pc, a, size, (unsigned char)write, (unsigned char)shared});
}

} // namespace

void emu_prof_launch(const char *kernel, const void *dyn, size_t dyn_bytes) {
    int prof = enabled(), race = racing(); /* both read now: record() tests P.on, P.race */
    if (!prof && !race) return;
    P.kernel = kernel;
    P.dyn = (const unsigned char *)dyn;
    P.dyn_bytes = dyn_bytes;
    if (kernel && P.on) P.by_kernel[kernel].launches++;
    if (!kernel) gmem.clear(); /* the launch ended: later launches are ordered after it */
}

void emu_prof_barrier(void) { epoch_now++; }

void emu_prof_flush_warp(int w, int nthreads) {
    wepoch_of[w] = ++wepoch_next;
    if (!enabled() || !P.kernel) return;
    int lo = w * 32, hi = std::min(lo + 32, nthreads);
    size_t any = 0;
    for (int i = lo; i < hi; i++) any += P.lane[i].size();
    if (!any) return;
    /* request = (call site, occurrence) */
    std::map<std::pair<uintptr_t, unsigned>, std::vector<const access *>> req;
    std::map<std::pair<uintptr_t, unsigned>, std::vector<unsigned>> lanes;
    for (int i = lo; i < hi; i++) {
        std::unordered_map<uintptr_t, unsigned> seen;
        for (const access &a : P.lane[i]) {
            auto key = std::make_pair(a.pc, seen[a.pc]++);
            req[key].push_back(&a);
            lanes[key].push_back((unsigned)(i - lo));
        }
    }
    counts &c = P.by_kernel[P.kernel];
    auto &sites = P.sites[P.kernel];
    for (auto &kv : req) {
        const access *a = kv.second[0];
        site &st = sites[a->pc];
        st.shared = a->shared, st.write = a->write;
        if (a->shared)
            cost_shared(c, st, kv.second, lanes[kv.first].data());
        else
            cost_global(c, st, kv.second);
    }
    for (int i = lo; i < hi; i++) P.lane[i].clear();
}

int emu_prof_get(const char *kernel, emu_prof_figures *f) {
    auto it = P.by_kernel.find(kernel);
    if (it == P.by_kernel.end()) return 0;
    const counts &c = it->second;
    f->launches = c.launches;
    memcpy(f->req, c.req, sizeof(f->req));
    memcpy(f->cost, c.cost, sizeof(f->cost));
    memcpy(f->ideal, c.ideal, sizeof(f->ideal));
    return 1;
}

/* file:line of the instruction before the return address pc, else the offset in its object */
std::string where(uintptr_t pc) {
    Dl_info d;
    char buf[512];
    if (!dladdr((void *)pc, &d) || !d.dli_fname) return "?";
    uintptr_t off = pc - 1 - (uintptr_t)d.dli_fbase;
    snprintf(buf, sizeof(buf), "addr2line -e '%s' 0x%lx 2>/dev/null", d.dli_fname, (unsigned long)off);
    std::string line;
    if (FILE *p = popen(buf, "r")) {
        if (fgets(buf, sizeof(buf), p)) line = buf;
        pclose(p);
    }
    while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
    if (line.empty() || line[0] == '?') {
        snprintf(buf, sizeof(buf), "%s+0x%lx", d.dli_fname, (unsigned long)off);
        return buf;
    }
    size_t cut = line.find(" (discriminator");
    if (cut != std::string::npos) line.resize(cut);
    size_t slash = line.rfind('/');
    if (slash != std::string::npos) line = line.substr(slash + 1);
    /* the profiled objects are the .cc copies to_cc.sh made of .cu files, line for line */
    size_t cc = line.find(".cc:");
    if (cc != std::string::npos) line.replace(cc, 3, ".cu");
    return line;
}

static double ratio(unsigned long long a, unsigned long long b) { return b ? (double)a / b : 0; }

__attribute__((destructor)) static void emu_prof_report(void) {
    if (P.on != 1 || !P.out) return;
    FILE *f = P.out;
    std::vector<std::pair<std::string, counts>> rows(P.by_kernel.begin(), P.by_kernel.end());
    unsigned long long all = 0;
    for (auto &r : rows) all += r.second.cost[0][0] + r.second.cost[0][1];
    std::sort(rows.begin(), rows.end(), [](const auto &a, const auto &b) {
        return a.second.cost[0][0] + a.second.cost[0][1] > b.second.cost[0][0] + b.second.cost[0][1];
    });
    fprintf(f, "%-22s %8s %7s | %10s %6s %10s %6s | %10s %8s %10s %8s\n", "kernel", "launches",
            "sectors", "gld req", "eff", "gst req", "eff", "lds req", "conflict", "sts req",
            "conflict");
    for (auto &r : rows) {
        const counts &c = r.second;
        fprintf(f, "%-22s %8llu %6.1f%% | %10llu %5.0f%% %10llu %5.0f%% | %10llu %8.2f %10llu %8.2f\n",
                r.first.c_str(), c.launches, 100 * ratio(c.cost[0][0] + c.cost[0][1], all),
                c.req[0][0], 100 * ratio(c.ideal[0][0], c.cost[0][0]), c.req[0][1],
                100 * ratio(c.ideal[0][1], c.cost[0][1]), c.req[1][0],
                ratio(c.cost[1][0], c.ideal[1][0]), c.req[1][1], ratio(c.cost[1][1], c.ideal[1][1]));
    }
    /* each kernel's worst instructions: the most cost over the ideal, at most 3 per kernel */
    fprintf(f, "\nwhere the cost exceeds the ideal (source lines by addr2line where it can):\n");
    for (auto &r : rows) {
        std::vector<std::pair<uintptr_t, site>> v(P.sites[r.first].begin(), P.sites[r.first].end());
        std::sort(v.begin(), v.end(), [](const auto &a, const auto &b) {
            return a.second.cost - a.second.ideal > b.second.cost - b.second.ideal;
        });
        for (size_t i = 0; i < v.size() && i < 3; i++) {
            const site &st = v[i].second;
            if (st.cost <= st.ideal) break;
            fprintf(f, "  %-22s %s %s %8llu requests, %5.2fx the ideal %s at %s\n", r.first.c_str(),
                    st.shared ? "shared" : "global", st.write ? "store" : "load ", st.req,
                    ratio(st.cost, st.ideal), st.shared ? "wavefronts" : "sectors   ",
                    where(v[i].first).c_str());
        }
    }
    if (f != stderr) fclose(f);
}

/* ---- the instrumentation's entry points (GCC's -fsanitize=thread ABI) -------------------- */
#define PC() ((uintptr_t)__builtin_return_address(0))
extern "C" {
#define RW(n)                                                                                  \
    void __tsan_read##n(void *p) { record(PC(), p, n, 0); }                                    \
    void __tsan_write##n(void *p) { record(PC(), p, n, 1); }                                   \
    void __tsan_unaligned_read##n(void *p) { record(PC(), p, n, 0); }                          \
    void __tsan_unaligned_write##n(void *p) { record(PC(), p, n, 1); }
RW(1)
RW(2)
RW(4)
RW(8)
RW(16)
#undef RW
/* the signatures of GCC's built-in declarations, which it makes in any sanitizer build */
void __tsan_read_range(void *p, long n) { record(PC(), p, (unsigned)n, 0); }
void __tsan_write_range(void *p, long n) { record(PC(), p, (unsigned)n, 1); }
void __tsan_init(void) {}
void __tsan_func_entry(void *) {}
void __tsan_func_exit(void *) {}
void __tsan_vptr_update(void *, void *) {}
void __tsan_vptr_read(void *) {}
}
