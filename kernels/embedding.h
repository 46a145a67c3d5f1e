/* embedding: rows of a frozen table gathered by token id. ids must be < vocab (checked, DF_ASSERT). */
#ifndef DFLASH_KERNEL_EMBEDDING_H
#define DFLASH_KERNEL_EMBEDDING_H

#include <stdint.h>

/* out (n, dim) = table[ids[i]] ; table (vocab, dim). */
void embedding_forward_cpu(float *out, const int32_t *ids, int n, const float *table, int vocab, int dim);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA: out (n, dim) bf16 from a bf16 table; stream is a cudaStream_t. */
void embedding_forward_cuda(uint16_t *out, const int32_t *ids, int n, const uint16_t *table, int dim, void *stream);
#ifdef __cplusplus
}
#endif

#endif
