/* reduce_cuda: the reducer of a GPU drafter rank (common/train/reducer.h), one rank per GPU. The fp32 master
 * weights and AdamW moments, double-buffered by step parity, this rank's fp32 gradient and the step's squared norm
 * live in one CUDA VMM allocation on the drafter's GPU that the rank makes at the run's first start (initialised by
 * train_init on the host) and deposits with dflashd (an fd and the GPU's UUID); a restarted rank re-imports it, so
 * a SIGKILL anywhere loses nothing and the step in flight is redone from the progress words. The compute copy of
 * the weights (bf16) is the rank's own, remade from the fp32 state of the step it is asked for. Several ranks
 * (NCCL) are the multi-GPU issue's; this one reduces a single rank. Calls are asynchronous on the reducer's stream
 * except apply, which returns the norm (the commit's one host synchronisation). */
#ifndef DFLASH_REDUCE_CUDA_H
#define DFLASH_REDUCE_CUDA_H

#include "reducer.h"
#include "worker.h"

/* Map the state dflashd handed this rank (w->train_fd, on the GPU its UUID names), or make it for step `step` on
 * GPU `device` and deposit it. stream: the model backend's cudaStream_t (the reducer works on the same stream). */
int reduce_cuda_open(reducer **out, worker_ctx *w, const drafter_layout *L, uint64_t step, int device, void *stream,
                     errbuf *err);

#endif
