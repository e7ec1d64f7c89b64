/* Private to the emulator's own test, shared by its two files: test_emu_runtime.cu (the
 * reporting, checks 1, 2, 3, 5 and main) and test_emu_runtime_hazards.cu (checks 4, 6, 7, 8,
 * 9). */
#ifndef TR_TEST_EMU_RUNTIME_H
#define TR_TEST_EMU_RUNTIME_H
#ifndef TR_CUDA_EMU
#error                                                                                             \
    "test_emu_runtime.cu tests the CPU emulator (tests/cudaemu/); it is built by tests/CMakeLists.txt"
#endif

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define FULL 0xffffffffu

/* one line, PASS or FAIL, counted for main's summary */
void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

/* test_emu_runtime.cu */
void *dev_alloc(size_t n);
void to_host(void *h, const void *d, size_t n);

/* test_emu_runtime_hazards.cu */
void check_smem(void);
void check_detection(void);
void check_order(void);
void check_api(void);
void check_adversarial(void);

#endif
