// bias_add: one thread per element, a grid-stride loop over rows x n.
#include <cuda_bf16.h>
#include <cstdint>

#include "bias_add.h"
#include "cuda_check.h"

namespace {

template <typename T> __device__ __forceinline__ float load(const T *p);
template <> __device__ __forceinline__ float load(const float *p) { return *p; }
template <> __device__ __forceinline__ float load(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store(float *p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

template <typename T> __global__ void bias_add_kernel(T *x, int ld, int rows, int n, const float *b)
{
    const long long total = (long long)rows * n;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int r = (int)(i / n), c = (int)(i - (long long)r * n);
        T *p = x + (size_t)r * ld + c;
        store(p, load(p) + b[c]);
    }
}

template <typename T> void launch(T *x, int ld, int rows, int n, const float *b, void *stream)
{
    if (!b || rows <= 0 || n <= 0) return;
    const long long total = (long long)rows * n;
    const unsigned blocks = (unsigned)((total + 255) / 256 < 65535 * 4 ? (total + 255) / 256 : 65535 * 4);
    bias_add_kernel<T><<<blocks, 256, 0, (cudaStream_t)stream>>>(x, ld, rows, n, b);
    CHECK_CUDA_LAUNCH();
}

} // namespace

extern "C" void bias_add_bf16_cuda(uint16_t *x, int ld, int rows, int n, const float *b, void *stream)
{
    launch((__nv_bfloat16 *)x, ld, rows, n, b, stream);
}

extern "C" void bias_add_f32_cuda(float *x, int ld, int rows, int n, const float *b, void *stream)
{
    launch(x, ld, rows, n, b, stream);
}
