// cast: CUDA fp32 -> bf16, bit-identical to cast_f32_bf16_cpu (round to nearest even; a NaN stays a quiet NaN).
// Grid-stride loop, 4 elements per thread per iteration when the pointers allow 16-byte loads.
#include <cstdint>

#include "cast.h"
#include "cuda_check.h"

static __device__ __forceinline__ uint16_t to_bf16(float f)
{
    uint32_t b = __float_as_uint(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40u); /* NaN: keep it one */
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

static __global__ void cast_kernel(uint16_t *out, const float *in, size_t n)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (((uintptr_t)in & 15) == 0 && ((uintptr_t)out & 7) == 0) {
        const size_t n4 = n / 4;
        for (size_t j = i; j < n4; j += stride) {
            float4 v = reinterpret_cast<const float4 *>(in)[j];
            ushort4 o = make_ushort4(to_bf16(v.x), to_bf16(v.y), to_bf16(v.z), to_bf16(v.w));
            reinterpret_cast<ushort4 *>(out)[j] = o;
        }
        for (size_t j = n4 * 4 + i; j < n; j += stride) out[j] = to_bf16(in[j]);
        return;
    }
    for (; i < n; i += stride) out[i] = to_bf16(in[i]);
}

extern "C" void cast_f32_bf16_cuda(uint16_t *out, const float *in, size_t n, void *stream)
{
    if (n == 0) return;
    const int threads = 256;
    size_t blocks = (n / 4 + threads - 1) / threads + 1, cap = 132 * 16;
    cast_kernel<<<(unsigned)(blocks < cap ? blocks : cap), threads, 0, (cudaStream_t)stream>>>(out, in, n);
    CHECK_CUDA_LAUNCH();
}
