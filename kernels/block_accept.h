/* block_accept: the drafter's training-time accuracy metrics from the loss head's argmax. Per block j of B slots:
 * slot k >= 1 is valid when its weight is non-zero and correct when valid and argmax == label; the accepted run is
 * the number of correct slots from slot 1 up to the first slot that is not (spec: simulated acceptance length =
 * 1 + run). Integer counts only, so the result does not depend on the summation order. */
#ifndef DFLASH_KERNEL_BLOCK_ACCEPT_H
#define DFLASH_KERNEL_BLOCK_ACCEPT_H

#include <stdint.h>

/* slot_correct (B) = Σ_j correct(j, k) (slot_correct[0] = 0); *run_sum = Σ_j run_j. argmax, labels, weights
 * (nblocks*B). Overwrites the outputs. */
void block_accept_cpu(int64_t *slot_correct, int64_t *run_sum, const int32_t *argmax, const int32_t *labels,
                      const float *weights, int nblocks, int B);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA, one CTA, device pointers: out (B + 1) int64 = slot_correct[0..B) then run_sum, overwritten. B <= 64. No
 * host synchronisation; stream is a cudaStream_t. */
void block_accept_cuda(int64_t *out, const int32_t *argmax, const int32_t *labels, const float *weights, int nblocks,
                       int B, void *stream);
#ifdef __cplusplus
}
#endif

#endif
