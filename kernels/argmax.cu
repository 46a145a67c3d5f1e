// argmax: one CTA of 256 threads per row; each thread keeps the first maximum of its strided share, then a shared
// reduction that prefers the larger value and, on equal values, the lower index (the CPU reference's first maximum).
#include <cuda_bf16.h>
#include <cstdint>
#include <math.h>

#include "argmax.h"
#include "cuda_check.h"

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ bool better(float v, int i, float bv, int bi)
{
    return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(int32_t *out, const __nv_bfloat16 *x, int ld, int V)
{
    __shared__ float sv[kThreads];
    __shared__ int si[kThreads];
    const __nv_bfloat16 *row = x + (size_t)blockIdx.x * ld;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < V; i += kThreads) {
        float v = __bfloat162float(row[i]);
        if (v > bv || (bi == 0x7fffffff && !isnan(v))) bv = v, bi = i; // strided: a later equal value never wins
    }
    sv[threadIdx.x] = bv, si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && better(sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x], si[threadIdx.x]))
            sv[threadIdx.x] = sv[threadIdx.x + s], si[threadIdx.x] = si[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = si[0] == 0x7fffffff ? 0 : si[0];
}

} // namespace

extern "C" void argmax_rows_cuda(int32_t *out, const uint16_t *x, int ld, int n, int V, void *stream)
{
    if (n <= 0) return;
    argmax_kernel<<<n, kThreads, 0, (cudaStream_t)stream>>>(out, (const __nv_bfloat16 *)x, ld, V);
    CHECK_CUDA_LAUNCH();
}
