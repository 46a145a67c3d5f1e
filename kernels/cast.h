/* cast: fp32 -> bf16 (round to nearest even, NaN kept a NaN), elementwise over a flat array: the compute copy of the
 * fp32 master weights. */
#ifndef DFLASH_CAST_H
#define DFLASH_CAST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
/* out[i] = bf16(in[i]) for i < n. */
void cast_f32_bf16_cpu(uint16_t *out, const float *in, size_t n);
/* CUDA: the same, bit-identical; device pointers; stream is a cudaStream_t. */
void cast_f32_bf16_cuda(uint16_t *out, const float *in, size_t n, void *stream);
#ifdef __cplusplus
}
#endif

#endif
