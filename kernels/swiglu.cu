// swiglu: CUDA silu(gate) * up over the fused gate|up projection output (row = [gate (dim) | up (dim)]) and its
// backward, bf16 in and out, fp32 math, one rounding. 16-byte vectors (8 bf16) when dim, strides and pointers allow,
// else scalar.
#include <cuda_bf16.h>
#include <cstdint>

#include "cuda_check.h"
#include "swiglu.h"
#include "swiglu_act.cuh"

// Vector path: a 2-d grid, blockIdx.y walks the rows and blockIdx.x covers a row's columns in pieces of
// SWIGLU_VPT·blockDim vectors; a thread loads all of its gate and up vectors before it computes (2·SWIGLU_VPT
// 16-byte loads in flight), and no index is divided.
#define SWIGLU_VPT 2
static __global__ void swiglu_vec8_kernel(uint4 *out, int ldo8, const uint4 *gu, int ldgu8, int dim8, int rows)
{
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const uint4 *g = gu + (size_t)r * ldgu8, *u = g + dim8;
        uint4 *o = out + (size_t)r * ldo8;
        const int c0 = blockIdx.x * (SWIGLU_VPT * blockDim.x) + threadIdx.x;
        uint4 gv[SWIGLU_VPT], uv[SWIGLU_VPT];
#pragma unroll
        for (int j = 0; j < SWIGLU_VPT; j++) {
            const int c = c0 + j * blockDim.x;
            if (c < dim8) gv[j] = g[c], uv[j] = u[c];
        }
#pragma unroll
        for (int j = 0; j < SWIGLU_VPT; j++) {
            const int c = c0 + j * blockDim.x;
            if (c >= dim8) break;
            uint4 ov;
            const __nv_bfloat162 *g2 = reinterpret_cast<const __nv_bfloat162 *>(&gv[j]);
            const __nv_bfloat162 *u2 = reinterpret_cast<const __nv_bfloat162 *>(&uv[j]);
            __nv_bfloat162 *o2 = reinterpret_cast<__nv_bfloat162 *>(&ov);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float2 gf = __bfloat1622float2(g2[e]), uf = __bfloat1622float2(u2[e]);
                o2[e] = __floats2bfloat162_rn(swiglu_act(gf.x, uf.x), swiglu_act(gf.y, uf.y));
            }
            o[c] = ov;
        }
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
    if (dim % 8 == 0 && ldo % 8 == 0 && ldgu % 8 == 0 && (uintptr_t)out % 16 == 0 && (uintptr_t)gu % 16 == 0) {
        const int dim8 = dim / 8, per = (dim8 + SWIGLU_VPT - 1) / SWIGLU_VPT;
        const int threads = per >= 256 ? 256 : (per + 31) / 32 * 32;
        const dim3 grid((unsigned)((dim8 + SWIGLU_VPT * threads - 1) / (SWIGLU_VPT * threads)),
                        (unsigned)(rows < 65535 ? rows : 65535));
        swiglu_vec8_kernel<<<grid, threads, 0, st>>>((uint4 *)out, ldo / 8, (const uint4 *)gu, ldgu / 8, dim8, rows);
        CHECK_CUDA_LAUNCH();
        return;
    }
    const int threads = 256;
    long long n = (long long)rows * dim;
    long long blocks = (n + threads - 1) / threads, cap = 132LL * 64;
    unsigned grid = (unsigned)(blocks < cap ? blocks : cap);
    swiglu_kernel<<<grid, threads, 0, st>>>((__nv_bfloat16 *)out, ldo, (const __nv_bfloat16 *)gu, ldgu, dim, n);
    CHECK_CUDA_LAUNCH();
}

// Backward, in swiglu_backward_cpu's operation order: s = σ(g), dgate = d·u·s·(1 + g·(1 − s)), dup = d·g·s. expf
// (not __expf): a memory-bound kernel can afford the accurate one. Each thread reads its gate/up elements before it
// writes the same positions, so dgu may be gu.
static __device__ __forceinline__ void swiglu_grad(float d, float g, float u, float *dg, float *du)
{
    float s = 1.0f / (1.0f + expf(-g));
    *dg = d * u * s * (1.0f + g * (1.0f - s));
    *du = d * g * s;
}

static __global__ void swiglu_backward_vec8_kernel(uint4 *dgu, int lddgu8, const uint4 *dout, int lddout8,
                                                   const uint4 *gu, int ldgu8, int dim8, long long n8)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n8;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / dim8;
        int c = (int)(i - r * dim8);
        uint4 g = gu[r * ldgu8 + c], u = gu[r * ldgu8 + dim8 + c], d = dout[r * lddout8 + c], og, ou;
        const __nv_bfloat162 *g2 = reinterpret_cast<const __nv_bfloat162 *>(&g);
        const __nv_bfloat162 *u2 = reinterpret_cast<const __nv_bfloat162 *>(&u);
        const __nv_bfloat162 *d2 = reinterpret_cast<const __nv_bfloat162 *>(&d);
        __nv_bfloat162 *og2 = reinterpret_cast<__nv_bfloat162 *>(&og), *ou2 = reinterpret_cast<__nv_bfloat162 *>(&ou);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 gf = __bfloat1622float2(g2[j]), uf = __bfloat1622float2(u2[j]), df = __bfloat1622float2(d2[j]);
            float dg0, du0, dg1, du1;
            swiglu_grad(df.x, gf.x, uf.x, &dg0, &du0);
            swiglu_grad(df.y, gf.y, uf.y, &dg1, &du1);
            og2[j] = __floats2bfloat162_rn(dg0, dg1);
            ou2[j] = __floats2bfloat162_rn(du0, du1);
        }
        dgu[r * lddgu8 + c] = og;
        dgu[r * lddgu8 + dim8 + c] = ou;
    }
}

static __global__ void swiglu_backward_kernel(__nv_bfloat16 *dgu, int lddgu, const __nv_bfloat16 *dout, int lddout,
                                              const __nv_bfloat16 *gu, int ldgu, int dim, long long n)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / dim;
        int c = (int)(i - r * dim);
        float g = __bfloat162float(gu[r * ldgu + c]), u = __bfloat162float(gu[r * ldgu + dim + c]);
        float dg, du;
        swiglu_grad(__bfloat162float(dout[r * lddout + c]), g, u, &dg, &du);
        dgu[r * lddgu + c] = __float2bfloat16_rn(dg);
        dgu[r * lddgu + dim + c] = __float2bfloat16_rn(du);
    }
}

extern "C" void swiglu_backward_cuda(uint16_t *dgu, int lddgu, const uint16_t *dout, int lddout, const uint16_t *gu,
                                     int ldgu, int rows, int dim, void *stream)
{
    if (rows <= 0 || dim <= 0) return;
    cudaStream_t st = (cudaStream_t)stream;
    const int threads = 256;
    bool vec = dim % 8 == 0 && lddgu % 8 == 0 && lddout % 8 == 0 && ldgu % 8 == 0 && (uintptr_t)dgu % 16 == 0 &&
               (uintptr_t)dout % 16 == 0 && (uintptr_t)gu % 16 == 0;
    long long n = (long long)rows * (vec ? dim / 8 : dim);
    long long blocks = (n + threads - 1) / threads, cap = 132LL * 64;
    unsigned grid = (unsigned)(blocks < cap ? blocks : cap);
    if (vec)
        swiglu_backward_vec8_kernel<<<grid, threads, 0, st>>>((uint4 *)dgu, lddgu / 8, (const uint4 *)dout,
                                                              lddout / 8, (const uint4 *)gu, ldgu / 8, dim / 8, n);
    else
        swiglu_backward_kernel<<<grid, threads, 0, st>>>((__nv_bfloat16 *)dgu, lddgu, (const __nv_bfloat16 *)dout,
                                                         lddout, (const __nv_bfloat16 *)gu, ldgu, dim, n);
    CHECK_CUDA_LAUNCH();
}
