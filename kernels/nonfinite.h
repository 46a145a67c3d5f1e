/* nonfinite: whether a tensor holds a NaN or an infinity, per group of columns: the cheap check after a forward (the
 * target's tapped hidden states, its logits) that turns poisoned weights into an error naming where they show.
 * x is (n, G*C; ld): group g of row r is x[r][g*C .. g*C+C). flags[g] is set to 1 when group g of any row holds a
 * non-finite value and is never cleared here (the caller zeroes it). */
#ifndef DFLASH_KERNEL_NONFINITE_H
#define DFLASH_KERNEL_NONFINITE_H

#include <stdint.h>

/* CPU, fp32; flags may be NULL. Returns the first non-finite element as r * G*C + column (row-major), or -1. */
int64_t nonfinite_groups_cpu(uint32_t *flags, const float *x, int ld, int n, int G, int C);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA, bf16; flags (G) is device memory. stream is a cudaStream_t. */
void nonfinite_groups_cuda(uint32_t *flags, const uint16_t *x, int ld, int n, int G, int C, void *stream);
#ifdef __cplusplus
}
#endif

#endif
