/* gated_rmsnorm: the gated RMSNorm of Gated DeltaNet's output (transformers' RMSNormGated, Qwen3.5 / Qwen3-Next):
 * per token t and head h, y = w · rmsnorm(x) · silu(z) over the head's dim values; w is the plain weight (not
 * zero-centred). fp32 math. */
#ifndef DFLASH_KERNEL_GATED_RMSNORM_H
#define DFLASH_KERNEL_GATED_RMSNORM_H

#include <stdint.h>

/* y, x, z: (T, heads*dim) with row strides ldy, ldx, ldz; w (dim). y may alias x. */
void gated_rmsnorm_cpu(float *y, int ldy, const float *x, int ldx, const float *z, int ldz, const float *w, int T,
                       int heads, int dim, float eps);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA, bf16 in/out, fp32 math; y may alias x. stream is a cudaStream_t. */
void gated_rmsnorm_cuda(uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *z, int ldz,
                        const uint16_t *w, int T, int heads, int dim, float eps, void *stream);
#ifdef __cplusplus
}
#endif

#endif
