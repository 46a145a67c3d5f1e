// rand_fill: CUDA deterministic bf16 random fill, bit-identical to rand_fill_bf16_cpu (explicitly rounded multiply
// and add, no fma; round-to-nearest-even to bf16). Grid-stride loop.
#include <cstdint>

#include "cuda_check.h"
#include "rand_fill.h"

static __global__ void rand_fill_kernel(uint16_t *out, size_t n, uint64_t seed, float scale, float bias)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        float u = __fsub_rn(__fmul_rn((float)(int32_t)(uint32_t)(z >> 40), 0x1p-23f), 1.0f);
        float f = __fadd_rn(__fmul_rn(scale, u), bias);
        uint32_t b = __float_as_uint(f);
        b += 0x7fffu + ((b >> 16) & 1u);
        out[i] = (uint16_t)(b >> 16);
    }
}

extern "C" void rand_fill_bf16_cuda(uint16_t *out, size_t n, uint64_t seed, float scale, float bias, void *stream)
{
    if (n == 0) return;
    const int threads = 256;
    size_t blocks = (n + threads - 1) / threads, cap = 132 * 32;
    rand_fill_kernel<<<(unsigned)(blocks < cap ? blocks : cap), threads, 0, (cudaStream_t)stream>>>(out, n, seed,
                                                                                                     scale, bias);
    CHECK_CUDA_LAUNCH();
}
