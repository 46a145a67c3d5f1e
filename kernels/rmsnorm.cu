// rmsnorm: CUDA forward, bf16 in/out with fp32 math. One block per row; each thread sums x² over a strided
// slice, a warp-shuffle then shared-memory reduction gives the row's mean, and the same threads write
// y = bf16(w * (x * rstd)), the form the CPU reference computes. When the row is a multiple of 8 elements (at most
// 8192), 16-byte aligned with aligned strides, each thread holds one 16-byte vector in registers: x is read once.
#include <cuda_bf16.h>
#include <cstdint>

#include "cuda_check.h"
#include "rmsnorm.h"

static __device__ __forceinline__ float rmsnorm_bf16_load(const uint16_t *p)
{
    return __uint_as_float((unsigned)*p << 16);
}

static __device__ __forceinline__ uint16_t rmsnorm_bf16_store(float f)
{
    __nv_bfloat16 b = __float2bfloat16_rn(f);
    return *reinterpret_cast<uint16_t *>(&b);
}

// Sum over the block; every thread gets the result. blockDim.x is a multiple of 32, at most 1024.
static __device__ float rmsnorm_block_sum(float v)
{
    __shared__ float warp_sums[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    v = lane < nwarps ? warp_sums[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __global__ void rmsnorm_forward_kernel(uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *w,
                                              int dim, float eps)
{
    const uint16_t *xr = x + (size_t)blockIdx.x * ldx;
    uint16_t *yr = y + (size_t)blockIdx.x * ldy;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = rmsnorm_bf16_load(xr + i);
        ss += v * v;
    }
    ss = rmsnorm_block_sum(ss);
    float rstd = rsqrtf(ss / (float)dim + eps);
    // each thread writes only the elements it read: y may alias x (in place), as on the CPU
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] = rmsnorm_bf16_store(rmsnorm_bf16_load(w + i) * (rmsnorm_bf16_load(xr + i) * rstd));
}

static __global__ void rmsnorm_forward_vec8_kernel(uint4 *y, int ldy8, const uint4 *x, int ldx8, const uint4 *w,
                                                   int dim8, float eps)
{
    const int i = threadIdx.x;
    uint4 xv = make_uint4(0, 0, 0, 0), wv = make_uint4(0, 0, 0, 0);
    if (i < dim8) xv = x[(size_t)blockIdx.x * ldx8 + i], wv = w[i];
    const uint16_t *xh = reinterpret_cast<const uint16_t *>(&xv), *wh = reinterpret_cast<const uint16_t *>(&wv);
    float xf[8], ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) xf[j] = rmsnorm_bf16_load(xh + j), ss += xf[j] * xf[j];
    ss = rmsnorm_block_sum(ss);
    float rstd = rsqrtf(ss / (float)(dim8 * 8) + eps);
    if (i >= dim8) return;
    uint4 yv;
    uint16_t *yh = reinterpret_cast<uint16_t *>(&yv);
#pragma unroll
    for (int j = 0; j < 8; j++) yh[j] = rmsnorm_bf16_store(rmsnorm_bf16_load(wh + j) * (xf[j] * rstd));
    y[(size_t)blockIdx.x * ldy8 + i] = yv;
}

extern "C" void rmsnorm_forward_cuda(uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *w, int rows,
                                     int dim, float eps, void *stream)
{
    if (rows <= 0 || dim <= 0) return;
    if (dim % 8 == 0 && dim <= 8192 && ldx % 8 == 0 && ldy % 8 == 0 && (uintptr_t)x % 16 == 0 &&
        (uintptr_t)y % 16 == 0 && (uintptr_t)w % 16 == 0) {
        int threads = (dim / 8 + 31) / 32 * 32;
        rmsnorm_forward_vec8_kernel<<<rows, threads, 0, (cudaStream_t)stream>>>((uint4 *)y, ldy / 8, (const uint4 *)x,
                                                                               ldx / 8, (const uint4 *)w, dim / 8, eps);
        CHECK_CUDA_LAUNCH();
        return;
    }
    int threads = dim >= 1024 ? 1024 : (dim + 31) / 32 * 32;
    rmsnorm_forward_kernel<<<rows, threads, 0, (cudaStream_t)stream>>>(y, ldy, x, ldx, w, dim, eps);
    CHECK_CUDA_LAUNCH();
}
