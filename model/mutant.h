/* Mutation testing of the waits the device code relies on: TR_WAIT(site, statement) is the
 * statement (a cudaStreamWaitEvent, a synchronization, a tr_comm_wait), except in a program
 * linked with the CUDA emulator when TR_EMU_MUTANT names the site: then the wait is skipped,
 * and tests/emu_mutant.sh shows that the emulator's adversarial scheduler catches it (wrong
 * numbers or a named hazard; tests/cudaemu/emu_runtime.cc). tr_emu_mutant is defined only by
 * the emulator: elsewhere the weak reference is NULL and the statement always runs. */
#ifndef TR_MUTANT_H
#define TR_MUTANT_H

#ifdef __cplusplus
extern "C" {
#endif
/* 1 when TR_EMU_MUTANT names site (the emulator counts the waits it skipped) */
int tr_emu_mutant(const char *site) __attribute__((weak));
#ifdef __cplusplus
}
#endif

#define TR_WAIT(site, stmt)                                                                        \
    do {                                                                                           \
        if (!(tr_emu_mutant && tr_emu_mutant(site))) { stmt; }                                     \
    } while (0)

#endif
