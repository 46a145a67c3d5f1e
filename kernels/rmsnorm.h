/* rmsnorm: y = w * x / sqrt(mean(x²) + eps) over the last dim, and its backward. Per-head q/k norm is the same
 * operator over rows = tokens*heads, dim = head_dim. Row strides in elements; y may alias x (in place). */
#ifndef DFLASH_KERNEL_RMSNORM_H
#define DFLASH_KERNEL_RMSNORM_H

#include <stddef.h>
#include <stdint.h>

/* y (rows, dim; ldy) = rmsnorm(x (rows, dim; ldx)) * w (dim). */
void rmsnorm_forward_cpu(float *y, int ldy, const float *x, int ldx, const float *w, int rows, int dim, float eps);
/* dx (rows, dim; lddx) = ∂/∂x (added when accumulate_dx); dw (dim) += ∂/∂w (skipped when NULL). Needs the forward
 * input x. dx must not alias x or dy. */
void rmsnorm_backward_cpu(float *dx, int lddx, int accumulate_dx, float *dw, const float *dy, int lddy,
                          const float *x, int ldx, const float *w, int rows, int dim, float eps);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA, bf16 in/out, fp32 math: y = rmsnorm(x) * w; stream is a cudaStream_t. */
void rmsnorm_forward_cuda(uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *w, int rows, int dim,
                          float eps, void *stream);
/* Bytes of fp32 workspace rmsnorm_backward_cuda needs for (rows, dim) when dw != NULL: per-row-chunk partials of dw. */
size_t rmsnorm_backward_cuda_workspace(int rows, int dim);
/* CUDA backward, bf16 in/out, fp32 math: dx (rows, dim; lddx) = ∂/∂x (bf16(dx + ∂/∂x) when accumulate_dx); dw (dim,
 * fp32) += ∂/∂w unless NULL. Deterministic: dw partials go to workspace (rmsnorm_backward_cuda_workspace bytes, may
 * be NULL when dw is) and are summed in a fixed order, no atomics. dx must not alias x or dy. */
void rmsnorm_backward_cuda(uint16_t *dx, int lddx, int accumulate_dx, float *dw, const uint16_t *dy, int lddy,
                           const uint16_t *x, int ldx, const uint16_t *w, int rows, int dim, float eps,
                           float *workspace, void *stream);
#ifdef __cplusplus
}
#endif

#endif
