// rmsnorm: CUDA forward and backward, bf16 in/out with fp32 math. Forward: one block per row; each thread sums x²
// over a strided slice, a warp-shuffle then shared-memory reduction gives the row's mean, and the same threads write
// y = bf16(w * (x * rstd)), the form the CPU reference computes. When the row is a multiple of 8 elements (at most
// 8192), 16-byte aligned with aligned strides, each thread holds one 16-byte vector in registers: x is read once;
// up to 4096 such rows go one warp per row instead (rmsnorm_forward_row_kernel).
// The backward is described above its kernels.
#include <cuda_bf16.h>
#include <cstdint>

#include "colsum.h"
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

// Warp-per-row path (dim <= 32·8·16 = 4096): lane l holds the vectors l, l+32, ... (VPL of them) of its row, all
// loaded before the first use, so a warp keeps VPL 16-byte loads in flight and no block barrier separates the
// reduction from the loads (the block-per-row kernel above has one load per thread in flight, then waits on
// __syncthreads). Each lane writes only what it read: y may alias x.
#define RMSNORM_ROW_WARPS 4 /* ~150 registers at VPL 16: 3 blocks, 12 warps per SM */
template <int VPL>
static __global__ void __launch_bounds__(RMSNORM_ROW_WARPS * 32)
    rmsnorm_forward_row_kernel(uint4 *y, int ldy8, const uint4 *x, int ldx8, const uint4 *w, int rows, int dim8,
                               float eps)
{
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * RMSNORM_ROW_WARPS + threadIdx.x / 32;
    if (row >= rows) return;
    const uint4 *xr = x + (size_t)row * ldx8;
    uint4 xv[VPL];
#pragma unroll
    for (int j = 0; j < VPL; j++) {
        const int i = lane + 32 * j;
        xv[j] = i < dim8 ? xr[i] : make_uint4(0, 0, 0, 0);
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < VPL; j++) {
        const uint16_t *xh = reinterpret_cast<const uint16_t *>(&xv[j]);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            float v = rmsnorm_bf16_load(xh + e);
            ss += v * v;
        }
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float rstd = rsqrtf(ss / (float)(dim8 * 8) + eps);
    uint4 *yr = y + (size_t)row * ldy8;
#pragma unroll
    for (int j = 0; j < VPL; j++) {
        const int i = lane + 32 * j;
        if (i >= dim8) break;
        uint4 wv = w[i], yv;
        const uint16_t *xh = reinterpret_cast<const uint16_t *>(&xv[j]), *wh = reinterpret_cast<const uint16_t *>(&wv);
        uint16_t *yh = reinterpret_cast<uint16_t *>(&yv);
#pragma unroll
        for (int e = 0; e < 8; e++) yh[e] = rmsnorm_bf16_store(rmsnorm_bf16_load(wh + e) * (rmsnorm_bf16_load(xh + e) * rstd));
        yr[i] = yv;
    }
}

template <int VPL>
static void rmsnorm_row_launch(uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *w, int rows, int dim,
                               float eps, cudaStream_t st)
{
    const unsigned grid = (unsigned)((rows + RMSNORM_ROW_WARPS - 1) / RMSNORM_ROW_WARPS);
    rmsnorm_forward_row_kernel<VPL><<<grid, RMSNORM_ROW_WARPS * 32, 0, st>>>(
        (uint4 *)y, ldy / 8, (const uint4 *)x, ldx / 8, (const uint4 *)w, rows, dim / 8, eps);
}

extern "C" void rmsnorm_forward_cuda(uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *w, int rows,
                                     int dim, float eps, void *stream)
{
    if (rows <= 0 || dim <= 0) return;
    const bool vec = dim % 8 == 0 && ldx % 8 == 0 && ldy % 8 == 0 && (uintptr_t)x % 16 == 0 &&
                     (uintptr_t)y % 16 == 0 && (uintptr_t)w % 16 == 0;
    if (vec && dim <= 32 * 8 * 16) {
        const int vpl = (dim / 8 + 31) / 32;
        cudaStream_t st = (cudaStream_t)stream;
        if (vpl <= 1) rmsnorm_row_launch<1>(y, ldy, x, ldx, w, rows, dim, eps, st);
        else if (vpl <= 2) rmsnorm_row_launch<2>(y, ldy, x, ldx, w, rows, dim, eps, st);
        else if (vpl <= 4) rmsnorm_row_launch<4>(y, ldy, x, ldx, w, rows, dim, eps, st);
        else if (vpl <= 8) rmsnorm_row_launch<8>(y, ldy, x, ldx, w, rows, dim, eps, st);
        else if (vpl <= 12) rmsnorm_row_launch<12>(y, ldy, x, ldx, w, rows, dim, eps, st);
        else rmsnorm_row_launch<16>(y, ldy, x, ldx, w, rows, dim, eps, st);
        CHECK_CUDA_LAUNCH();
        return;
    }
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

// ---- backward ----
// One block per chunk of consecutive rows (the chunking depends on rows only, so the result is reproducible); per
// row the block reduces (Σx², Σ dy·w·x) together, writes dx = rstd·(dy·w − x̂·mean(dy·w·x̂)) and keeps its columns'
// share of dw = Σ dy·x̂ in registers (vector path) or in its own workspace row (scalar path). A second kernel sums the
// chunk rows of the workspace in a fixed order into dw. No atomics anywhere: two runs give the same bits.

#define RMS_BWD_MAX_CHUNKS 264 /* two per SM on an H100/H200; a constant so the result never depends on the GPU */

static int rmsnorm_bwd_rows_per_chunk(int rows)
{
    int chunks = rows < RMS_BWD_MAX_CHUNKS ? rows : RMS_BWD_MAX_CHUNKS;
    return (rows + chunks - 1) / chunks;
}

static int rmsnorm_bwd_chunks(int rows)
{
    int rpc = rmsnorm_bwd_rows_per_chunk(rows);
    return (rows + rpc - 1) / rpc;
}

// Sum of a float2 over the block, every thread gets it. Two shared buffers alternate between calls, so one
// __syncthreads per call is enough inside a loop (a warp can only come back to a buffer after every warp has passed
// the next call's barrier, i.e. after they all read it).
static __device__ float2 rmsnorm_block_sum2(float2 v, int parity)
{
    __shared__ float2 sums[2][32];
    for (int o = 16; o > 0; o >>= 1) {
        v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
        v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
    if (lane == 0) sums[parity][warp] = v;
    __syncthreads();
    v = lane < nwarps ? sums[parity][lane] : make_float2(0.0f, 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
        v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
        v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
    }
    return v;
}

// Vector path: thread i holds columns 8i..8i+7 (one 16-byte vector of x, dy, dx per row); the next row's x and dy
// are loaded before this row's reduction so the loads overlap it. At most 64 registers: two 512-thread blocks per SM.
template <bool ACC>
static __global__ void __launch_bounds__(1024) rmsnorm_backward_vec8_kernel(uint4 *dx, int lddx8, const uint4 *dy, int lddy8, const uint4 *x,
                                                    int ldx8, const uint4 *w, int rows, int dim8, int rpc, float eps,
                                                    float *part)
{
    const int i = threadIdx.x;
    const bool on = i < dim8;
    const int r0 = blockIdx.x * rpc, r1 = min(rows, r0 + rpc);
    float wf[8], dwacc[8];
    uint4 wv = on ? w[i] : make_uint4(0, 0, 0, 0);
    const uint16_t *wh = reinterpret_cast<const uint16_t *>(&wv);
#pragma unroll
    for (int j = 0; j < 8; j++) wf[j] = rmsnorm_bf16_load(wh + j), dwacc[j] = 0.0f;
    const float inv_dim = 1.0f / (float)(dim8 * 8);
    uint4 xn = make_uint4(0, 0, 0, 0), dyn = make_uint4(0, 0, 0, 0);
    if (on) xn = x[(size_t)r0 * ldx8 + i], dyn = dy[(size_t)r0 * lddy8 + i];
    for (int r = r0; r < r1; r++) {
        uint4 xv = xn, dyv = dyn;
        if (on && r + 1 < r1) xn = x[(size_t)(r + 1) * ldx8 + i], dyn = dy[(size_t)(r + 1) * lddy8 + i];
        const uint16_t *xh = reinterpret_cast<const uint16_t *>(&xv), *dh = reinterpret_cast<const uint16_t *>(&dyv);
        float xf[8], gf[8];
        float2 s = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            xf[j] = rmsnorm_bf16_load(xh + j);
            float d = rmsnorm_bf16_load(dh + j);
            gf[j] = d * wf[j];
            s.x += xf[j] * xf[j];
            s.y += gf[j] * xf[j];
        }
        s = rmsnorm_block_sum2(s, r & 1);
        const float rstd = rsqrtf(s.x * inv_dim + eps);
        const float cm = s.y * rstd * inv_dim; // mean(g · x̂)
        if (!on) continue;
        uint4 out;
        uint16_t *oh = reinterpret_cast<uint16_t *>(&out);
        uint4 old = make_uint4(0, 0, 0, 0);
        if (ACC) old = dx[(size_t)r * lddx8 + i];
        const uint16_t *olh = reinterpret_cast<const uint16_t *>(&old);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float xhat = xf[j] * rstd;
            float g = rstd * (gf[j] - xhat * cm);
            if (ACC) g += rmsnorm_bf16_load(olh + j);
            oh[j] = rmsnorm_bf16_store(g);
            dwacc[j] += rmsnorm_bf16_load(dh + j) * xhat;
        }
        dx[(size_t)r * lddx8 + i] = out;
    }
    if (part && on) {
        float4 *p = reinterpret_cast<float4 *>(part + (size_t)blockIdx.x * dim8 * 8) + 2 * i;
        p[0] = make_float4(dwacc[0], dwacc[1], dwacc[2], dwacc[3]);
        p[1] = make_float4(dwacc[4], dwacc[5], dwacc[6], dwacc[7]);
    }
}

// Scalar path (any dim, stride, alignment): two passes over each row; this block's dw share accumulates in its own
// workspace row (each element touched by one thread only).
static __global__ void rmsnorm_backward_kernel(uint16_t *dx, int lddx, int acc, const uint16_t *dy, int lddy,
                                               const uint16_t *x, int ldx, const uint16_t *w, int rows, int dim,
                                               int rpc, float eps, float *part)
{
    const int r0 = blockIdx.x * rpc, r1 = min(rows, r0 + rpc);
    float *pr = part ? part + (size_t)blockIdx.x * dim : NULL;
    for (int r = r0; r < r1; r++) {
        const uint16_t *xr = x + (size_t)r * ldx, *dyr = dy + (size_t)r * lddy;
        uint16_t *dxr = dx + (size_t)r * lddx;
        float2 s = make_float2(0.0f, 0.0f);
        for (int i = threadIdx.x; i < dim; i += blockDim.x) {
            float xv = rmsnorm_bf16_load(xr + i);
            s.x += xv * xv;
            s.y += rmsnorm_bf16_load(dyr + i) * rmsnorm_bf16_load(w + i) * xv;
        }
        s = rmsnorm_block_sum2(s, r & 1);
        const float rstd = rsqrtf(s.x / (float)dim + eps);
        const float cm = s.y * rstd / (float)dim;
        for (int i = threadIdx.x; i < dim; i += blockDim.x) {
            float d = rmsnorm_bf16_load(dyr + i), xhat = rmsnorm_bf16_load(xr + i) * rstd;
            float g = rstd * (d * rmsnorm_bf16_load(w + i) - xhat * cm);
            if (acc) g += rmsnorm_bf16_load(dxr + i);
            dxr[i] = rmsnorm_bf16_store(g);
            if (pr) pr[i] = (r == r0 ? 0.0f : pr[i]) + d * xhat;
        }
    }
}


extern "C" size_t rmsnorm_backward_cuda_workspace(int rows, int dim)
{
    if (rows <= 0 || dim <= 0) return 0;
    return (size_t)rmsnorm_bwd_chunks(rows) * (size_t)dim * sizeof(float);
}

extern "C" void rmsnorm_backward_cuda(uint16_t *dx, int lddx, int accumulate_dx, float *dw, const uint16_t *dy,
                                      int lddy, const uint16_t *x, int ldx, const uint16_t *w, int rows, int dim,
                                      float eps, float *workspace, void *stream)
{
    if (rows <= 0 || dim <= 0) return;
    if (dw && !workspace) {
        fprintf(stderr, "rmsnorm_backward_cuda: dw needs a workspace of rmsnorm_backward_cuda_workspace() bytes\n");
        exit(1);
    }
    cudaStream_t st = (cudaStream_t)stream;
    const int rpc = rmsnorm_bwd_rows_per_chunk(rows), chunks = rmsnorm_bwd_chunks(rows);
    float *part = dw ? workspace : NULL;
    if (dim % 8 == 0 && dim <= 8192 && ldx % 8 == 0 && lddy % 8 == 0 && lddx % 8 == 0 && (uintptr_t)x % 16 == 0 &&
        (uintptr_t)dy % 16 == 0 && (uintptr_t)dx % 16 == 0 && (uintptr_t)w % 16 == 0 &&
        (uintptr_t)workspace % 16 == 0) {
        int threads = (dim / 8 + 31) / 32 * 32;
        if (accumulate_dx)
            rmsnorm_backward_vec8_kernel<true><<<chunks, threads, 0, st>>>(
                (uint4 *)dx, lddx / 8, (const uint4 *)dy, lddy / 8, (const uint4 *)x, ldx / 8, (const uint4 *)w, rows,
                dim / 8, rpc, eps, part);
        else
            rmsnorm_backward_vec8_kernel<false><<<chunks, threads, 0, st>>>(
                (uint4 *)dx, lddx / 8, (const uint4 *)dy, lddy / 8, (const uint4 *)x, ldx / 8, (const uint4 *)w, rows,
                dim / 8, rpc, eps, part);
    } else {
        int threads = dim >= 1024 ? 1024 : (dim + 31) / 32 * 32;
        rmsnorm_backward_kernel<<<chunks, threads, 0, st>>>(dx, lddx, accumulate_dx, dy, lddy, x, ldx, w, rows, dim,
                                                            rpc, eps, part);
    }
    CHECK_CUDA_LAUNCH();
    if (!dw) return;
    colsum_add_cuda(dw, workspace, chunks, dim, st);
    CHECK_CUDA_LAUNCH();
}
