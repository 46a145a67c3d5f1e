/* reduce_shm: the reducer of CPU jobs (common/train/reducer.h). One training state in host shared memory for every
 * rank: a memfd made by drafter 0 at the run's first start (initialised by train_init), deposited with dflashd, and
 * handed to every rank at registration (dflashd keeps it in the fd store). Layout: header (the ranks' squared-norm
 * shares), state[0], state[1] (weights, m, v: 3 x numel each), grads[r] (numel each): (6 + D) x numel floats for D
 * ranks. Rank r reduces and applies the parameter range [numel*r/D, numel*(r+1)/D): the summed gradient of an
 * element is Σ_i grads[i] in rank order, times 1/weight_sum, computed the same way in both phases (no reduced
 * copy is kept). */
#ifndef DFLASH_REDUCE_SHM_H
#define DFLASH_REDUCE_SHM_H

#include "reducer.h"
#include "worker.h"

/* Map the state dflashd handed this rank (w->train_fd), or, on drafter 0 when there is none, make it for step
 * `step` and deposit it. */
int reduce_shm_open(reducer **out, worker_ctx *w, const drafter_layout *L, uint64_t step, errbuf *err);
/* Bytes of the state for numel parameters and D ranks. */
size_t reduce_shm_bytes(size_t numel, uint32_t nranks);

#endif
