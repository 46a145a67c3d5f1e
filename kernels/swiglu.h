/* swiglu: out = silu(gate) * up elementwise, and its backward. */
#ifndef DFLASH_KERNEL_SWIGLU_H
#define DFLASH_KERNEL_SWIGLU_H

#include <stddef.h>

/* out[i] = gate[i] / (1 + exp(-gate[i])) * up[i]; out may alias gate or up. */
void swiglu_forward_cpu(float *out, const float *gate, const float *up, size_t n);
/* dgate[i], dup[i] from dout and the forward inputs (overwritten, not accumulated). */
void swiglu_backward_cpu(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);
/* gpt-oss's clamped variant (transformers' GptOssExperts): g = min(gate, limit), u = clamp(up, -limit, limit),
 * out[i] = (u + 1) * g * sigmoid(alpha * g); out may alias gate or up. */
void swiglu_clamped_forward_cpu(float *out, const float *gate, const float *up, size_t n, float alpha, float limit);


#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA, bf16 in/out, fp32 math: out (rows, dim; ldo) = silu(gu[:, :dim]) * gu[:, dim:2*dim] for gu (rows, 2*dim;
 * ldgu), the fused gate|up projection's output. out must not overlap gu. stream is a cudaStream_t. */
void swiglu_forward_cuda(uint16_t *out, int ldo, const uint16_t *gu, int ldgu, int rows, int dim, void *stream);
/* CUDA backward, bf16 in/out, fp32 math as swiglu_backward_cpu: dgu (rows, 2*dim; lddgu) = [dgate | dup] from dout
 * (rows, dim; lddout) and the forward's gu (rows, 2*dim; ldgu); overwritten. dgu may be gu itself (same stride). */
void swiglu_backward_cuda(uint16_t *dgu, int lddgu, const uint16_t *dout, int lddout, const uint16_t *gu, int ldgu,
                          int rows, int dim, void *stream);
#ifdef __cplusplus
}
#endif

#endif
