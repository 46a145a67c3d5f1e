/* rand_fill: CPU reference (splitmix64 per element, fp32 value without fused multiply-add, bf16 round-to-nearest-even). */
#include "rand_fill.h"

#include <string.h>

static uint16_t rand_fill_one(size_t i, uint64_t seed, float scale, float bias)
{
    uint64_t z = seed + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float u = (float)(int32_t)(uint32_t)(z >> 40) * 0x1p-23f - 1.0f; /* 24 bits: exact in fp32, [-1, 1) */
    volatile float prod = scale * u;                                  /* no contraction into an fma */
    float f = prod + bias;
    uint32_t b;
    memcpy(&b, &f, 4);
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

void rand_fill_bf16_cpu(uint16_t *out, size_t n, uint64_t seed, float scale, float bias)
{
    for (size_t i = 0; i < n; i++) out[i] = rand_fill_one(i, seed, scale, bias);
}
