/* What the emulated NCCL (emu_nccl.cc) tells its tests beyond NCCL's own API: how this process
 * created its communicators. */
#ifndef TR_EMU_NCCL_H
#define TR_EMU_NCCL_H

#ifdef __cplusplus
extern "C" {
#endif

/* Communicators this process created so far: `alone` by an ncclCommInitRank outside any
 * group, `grouped` inside groups, and `groups` the ncclGroupEnd calls that created them. */
void emu_nccl_census(int *alone, int *grouped, int *groups);

#ifdef __cplusplus
}
#endif

#endif
