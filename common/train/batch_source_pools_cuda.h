/* batch_source_pools_cuda: the batch source of a GPU drafter: the job's GPU pools, imported (batch_source_pools_cuda.c
 * says how). */
#ifndef DFLASH_BATCH_SOURCE_POOLS_CUDA_H
#define DFLASH_BATCH_SOURCE_POOLS_CUDA_H

#include "step.h"

/* device: the drafter's GPU (the pools must be on it); stream: the model backend's cudaStream_t. */
int batch_source_pools_cuda_create(batch_source **out, worker_ctx *w, int device, void *stream, errbuf *err);

#endif
