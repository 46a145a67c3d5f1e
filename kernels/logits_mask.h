/* logits_mask: set the given token ids of every logits row to -inf, so that no argmax or sampling picks them
 * (`dflash generate --suppress`, e.g. the drafter's mask token). Ids outside [0, V) are the caller's error. */
#ifndef DFLASH_KERNEL_LOGITS_MASK_H
#define DFLASH_KERNEL_LOGITS_MASK_H

#include <stdint.h>

/* x (n, V; ld): x[r][ids[k]] = -inf for every row r and k < nids. */
void logits_mask_rows_cpu(float *x, int ld, int n, const int32_t *ids, int nids);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA, bf16 rows; ids is a device array. stream is a cudaStream_t. */
void logits_mask_rows_cuda(uint16_t *x, int ld, int n, const int32_t *ids, int nids, void *stream);
#ifdef __cplusplus
}
#endif

#endif
