/* Private to the emulated cuDNN and included by nothing else: the descriptor and the helpers
 * shared by emu_cudnn.cc (descriptors, attributes, finalization: every call but
 * cudnnBackendExecute) and emu_cudnn_exec.cc (cudnnBackendExecute: the host interpreter). */
#ifndef TR_EMU_CUDNN_PRIVATE_H
#define TR_EMU_CUDNN_PRIVATE_H
#include <cudnn_graph.h>

#include <cstddef>
#include <cstdint>
#include <vector>

struct cudnnContext {
    unsigned magic;
    cudaStream_t stream;
};

namespace emu_cudnn {

const unsigned kHandleMagic = 0xC0D17E55u, kDescMagic = 0xDE5C0001u;

/* one line to stderr: "emu cudnn: fn: message" */
void complain(const char *fn, const char *fmt, ...);

enum Pattern { PAT_NONE, PAT_SDPA_FWD, PAT_SDPA_BWD };

struct Desc {
    unsigned magic = kDescMagic;
    cudnnBackendDescriptorType_t type;
    bool fin = false;
    /* tensor */
    int64_t dtype = -1, nd = 0, dim[8] = {}, str[8] = {}, uid = -1, align = 0;
    bool has_str = false, virt = false, byval = false;
    /* pointwise / matmul / reduction descriptors */
    int64_t mode = -1, prec = -1, axis = -1;
    /* operations: x, b, y, t (pointwise), a, b, c (matmul as x, b, y), x, y (reduction, reshape) */
    Desc *op = nullptr, *x = nullptr, *b = nullptr, *y = nullptr, *t = nullptr;
    /* graph */
    std::vector<Desc *> ops, order; /* order: topological, set by Finalize */
    cudnnHandle_t handle = nullptr;
    Pattern pattern = PAT_NONE;
    /* heuristics, engine, config, plan */
    Desc *graph = nullptr, *engine = nullptr, *cfg = nullptr;
    bool owns_engine = false; /* a config the heuristics filled: its engine goes with it */
    int64_t heur_mode = -1, gidx = -1, ws = 0;
    /* variant pack */
    std::vector<int64_t> uids;
    std::vector<void *> ptrs;
    void *wsptr = nullptr;
    bool has_ws = false;
};

/* d as a descriptor this emulator created and has not destroyed, or NULL */
Desc *live(cudnnBackendDescriptor_t d);
/* one past the largest element offset */
int64_t span(const Desc *t);
/* bytes per element of an emulated data type; 0 for the others */
size_t dt_size(int64_t dt);

} // namespace emu_cudnn

#endif
