/* rand_fill: deterministic bf16 random tensors, element i = bf16(bias + scale * u_i) with u_i uniform in [-1, 1)
 * drawn from splitmix64(seed, i). The CPU and CUDA versions give bit-identical tensors, so a test can build a
 * checkpoint on the host and a benchmark can make 16 GB of weights on the device without touching the host. */
#ifndef DFLASH_KERNEL_RAND_FILL_H
#define DFLASH_KERNEL_RAND_FILL_H

#include <stddef.h>
#include <stdint.h>

/* out (n) bf16 bits. */
void rand_fill_bf16_cpu(uint16_t *out, size_t n, uint64_t seed, float scale, float bias);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA: the same values into device memory; stream is a cudaStream_t. */
void rand_fill_bf16_cuda(uint16_t *out, size_t n, uint64_t seed, float scale, float bias, void *stream);
#ifdef __cplusplus
}
#endif

#endif
