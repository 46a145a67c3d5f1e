/* argmax: the index of each row's largest value (greedy decoding). Ties go to the lowest index, as torch.argmax;
 * NaN is never chosen over a number. */
#ifndef DFLASH_KERNEL_ARGMAX_H
#define DFLASH_KERNEL_ARGMAX_H

#include <stdint.h>

/* out (n) = argmax of each row of x (n, V; ld). */
void argmax_rows_cpu(int32_t *out, const float *x, int ld, int n, int V);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA, bf16 rows, device out; one CTA per row. stream is a cudaStream_t. */
void argmax_rows_cuda(int32_t *out, const uint16_t *x, int ld, int n, int V, void *stream);
#ifdef __cplusplus
}
#endif

#endif
