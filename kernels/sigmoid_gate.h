/* sigmoid_gate: the output gate of the hybrid targets' gated attention, y = x · sigmoid(gate) elementwise over
 * (rows, dim) with row strides. fp32 math. */
#ifndef DFLASH_KERNEL_SIGMOID_GATE_H
#define DFLASH_KERNEL_SIGMOID_GATE_H

#include <stdint.h>

/* y (rows, dim; ldy) = x (ldx) * sigmoid(gate (ldg)); y may alias x. */
void sigmoid_gate_cpu(float *y, int ldy, const float *x, int ldx, const float *gate, int ldg, int rows, int dim);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA, bf16 in/out; y may alias x. stream is a cudaStream_t. */
void sigmoid_gate_cuda(uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *gate, int ldg, int rows,
                       int dim, void *stream);
#ifdef __cplusplus
}
#endif

#endif
