/* bias_add: a bias vector added to every row of a matrix (gpt-oss's q/k/v/o and router biases, after their GEMMs). */
#ifndef DFLASH_KERNEL_BIAS_ADD_H
#define DFLASH_KERNEL_BIAS_ADD_H

#include <stdint.h>

/* x (rows, n; row stride ld) += b (n) on every row; b NULL: nothing. */
void bias_add_cpu(float *x, int ld, int rows, int n, const float *b);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA: the same on bf16 rows (fp32 sum, rounded once) or fp32 rows; b fp32 on the device. stream: a cudaStream_t. */
void bias_add_bf16_cuda(uint16_t *x, int ld, int rows, int n, const float *b, void *stream);
void bias_add_f32_cuda(float *x, int ld, int rows, int n, const float *b, void *stream);
#ifdef __cplusplus
}
#endif

#endif
