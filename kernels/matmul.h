/* matmul: the linear layer y = x · wᵀ and its backward, on OpenBLAS (CPU). Shapes are row-major with explicit row
 * strides (ld, in elements) so that results can land in column blocks of wider tensors. No allocation. */
#ifndef DFLASH_KERNEL_MATMUL_H
#define DFLASH_KERNEL_MATMUL_H

/* y (m, n; row stride ldy) = x (m, k; ldx) · w (n, k)ᵀ, plus the old y when accumulate != 0. */
void matmul_forward_cpu(float *y, int ldy, const float *x, int ldx, const float *w, int m, int n, int k,
                        int accumulate);
/* Backward of matmul_forward_cpu for dy (m, n; lddy):
 *   dx (m, k; lddx) = dy · w   (added to dx when accumulate_dx; skipped when dx is NULL)
 *   dw (n, k)      += dyᵀ · x  (always accumulated; skipped when dw is NULL) */
void matmul_backward_cpu(float *dx, int lddx, int accumulate_dx, float *dw, const float *dy, int lddy,
                         const float *x, int ldx, const float *w, int m, int n, int k);

#endif
