// swiglu: CUDA silu(gate) * up over the fused gate|up projection output (row = [gate (dim) | up (dim)]), bf16 in
// and out, fp32 math, one rounding. 16-byte vectors (8 bf16) when dim, strides and pointers allow, else scalar.
#include <cuda_bf16.h>
#include <cstdint>

#include "cuda_check.h"
#include "swiglu.h"

static __device__ __forceinline__ float swiglu_act(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

static __global__ void swiglu_vec8_kernel(uint4 *out, int ldo8, const uint4 *gu, int ldgu8, int dim8, long long n8)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n8;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / dim8;
        int c = (int)(i - r * dim8);
        uint4 g = gu[r * ldgu8 + c], u = gu[r * ldgu8 + dim8 + c], o;
        const __nv_bfloat162 *g2 = reinterpret_cast<const __nv_bfloat162 *>(&g);
        const __nv_bfloat162 *u2 = reinterpret_cast<const __nv_bfloat162 *>(&u);
        __nv_bfloat162 *o2 = reinterpret_cast<__nv_bfloat162 *>(&o);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 gf = __bfloat1622float2(g2[j]), uf = __bfloat1622float2(u2[j]);
            o2[j] = __floats2bfloat162_rn(swiglu_act(gf.x, uf.x), swiglu_act(gf.y, uf.y));
        }
        out[r * ldo8 + c] = o;
    }
}

static __global__ void swiglu_kernel(__nv_bfloat16 *out, int ldo, const __nv_bfloat16 *gu, int ldgu, int dim,
                                     long long n)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / dim;
        int c = (int)(i - r * dim);
        float g = __bfloat162float(gu[r * ldgu + c]), u = __bfloat162float(gu[r * ldgu + dim + c]);
        out[r * ldo + c] = __float2bfloat16_rn(swiglu_act(g, u));
    }
}

extern "C" void swiglu_forward_cuda(uint16_t *out, int ldo, const uint16_t *gu, int ldgu, int rows, int dim,
                                    void *stream)
{
    if (rows <= 0 || dim <= 0) return;
    cudaStream_t st = (cudaStream_t)stream;
    const int threads = 256;
    bool vec = dim % 8 == 0 && ldo % 8 == 0 && ldgu % 8 == 0 && (uintptr_t)out % 16 == 0 && (uintptr_t)gu % 16 == 0;
    long long n = (long long)rows * (vec ? dim / 8 : dim);
    long long blocks = (n + threads - 1) / threads, cap = 132LL * 64;
    unsigned grid = (unsigned)(blocks < cap ? blocks : cap);
    if (vec)
        swiglu_vec8_kernel<<<grid, threads, 0, st>>>((uint4 *)out, ldo / 8, (const uint4 *)gu, ldgu / 8, dim / 8, n);
    else
        swiglu_kernel<<<grid, threads, 0, st>>>((__nv_bfloat16 *)out, ldo, (const __nv_bfloat16 *)gu, ldgu, dim, n);
    CHECK_CUDA_LAUNCH();
}
