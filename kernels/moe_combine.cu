// moe_combine: CUDA, one thread per (token, column) (grid-stride), or per (token, 8 columns) with 16-byte loads
// when every row is 16-byte aligned: each output element gathers its K expert rows and the shared expert's value in
// a fixed order, so the result does not depend on scheduling (and both paths give the same bits).
#include <cuda_bf16.h>
#include <cstdint>

#include "cuda_check.h"
#include "moe_combine.h"

static __global__ void moe_combine_kernel(__nv_bfloat16 *out, int ldo, const __nv_bfloat16 *resid, int ldr,
                                          const __nv_bfloat16 *ys, int ldy, const int32_t *row, const float *w, int T,
                                          int K, int H, const __nv_bfloat16 *shared, int lds, const float *sg,
                                          int ldsg)
{
    const long long n = (long long)T * H;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int t = (int)(i / H), c = (int)(i - (long long)t * H);
        float acc = 0.0f;
        for (int j = 0; j < K; j++)
            acc += w[(size_t)t * K + j] * __bfloat162float(ys[(size_t)row[(size_t)t * K + j] * ldy + c]);
        if (shared)
            acc += __bfloat162float(shared[(size_t)t * lds + c]) / (sg ? 1.0f + expf(-sg[(size_t)t * ldsg]) : 1.0f);
        out[(size_t)t * ldo + c] = __float2bfloat16_rn(__bfloat162float(resid[(size_t)t * ldr + c]) + acc);
    }
}

static __global__ void moe_combine_vec8_kernel(__nv_bfloat16 *out, int ldo, const __nv_bfloat16 *resid, int ldr,
                                               const __nv_bfloat16 *ys, int ldy, const int32_t *row, const float *w,
                                               int T, int K, int H, const __nv_bfloat16 *shared, int lds,
                                               const float *sg, int ldsg)
{
    const int H8 = H / 8;
    const long long n = (long long)T * H8;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int t = (int)(i / H8), c = (int)(i - (long long)t * H8) * 8;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int j = 0; j < K; j++) {
            const float wj = w[(size_t)t * K + j];
            const uint4 v = *reinterpret_cast<const uint4 *>(ys + (size_t)row[(size_t)t * K + j] * ldy + c);
            const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const float2 f = __bfloat1622float2(h[q]);
                acc[2 * q] += wj * f.x, acc[2 * q + 1] += wj * f.y;
            }
        }
        if (shared) {
            const float d = sg ? 1.0f + expf(-sg[(size_t)t * ldsg]) : 1.0f;
            const uint4 v = *reinterpret_cast<const uint4 *>(shared + (size_t)t * lds + c);
            const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const float2 f = __bfloat1622float2(h[q]);
                acc[2 * q] += f.x / d, acc[2 * q + 1] += f.y / d;
            }
        }
        const uint4 rv = *reinterpret_cast<const uint4 *>(resid + (size_t)t * ldr + c);
        const __nv_bfloat162 *rh = reinterpret_cast<const __nv_bfloat162 *>(&rv);
        uint4 o;
        __nv_bfloat162 *oh = reinterpret_cast<__nv_bfloat162 *>(&o);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float2 f = __bfloat1622float2(rh[q]);
            oh[q] = __floats2bfloat162_rn(f.x + acc[2 * q], f.y + acc[2 * q + 1]);
        }
        *reinterpret_cast<uint4 *>(out + (size_t)t * ldo + c) = o;
    }
}

static bool mc_al16(const void *p, int ld) { return ((uintptr_t)p & 15) == 0 && ld % 8 == 0; }

extern "C" void moe_combine_cuda(uint16_t *out, int ldo, const uint16_t *resid, int ldr, const uint16_t *ys, int ldy,
                                 const int32_t *row, const float *w, int T, int K, int H, const uint16_t *shared,
                                 int lds, const float *sg, int ldsg, void *stream)
{
    if (T <= 0 || H <= 0) return;
    const int threads = 256;
    if (H % 8 == 0 && mc_al16(out, ldo) && mc_al16(resid, ldr) && mc_al16(ys, ldy) && (!shared || mc_al16(shared, lds))) {
        long long blocks = ((long long)T * (H / 8) + threads - 1) / threads;
        if (blocks > 65535LL * 16) blocks = 65535LL * 16;
        moe_combine_vec8_kernel<<<(unsigned)blocks, threads, 0, (cudaStream_t)stream>>>(
            (__nv_bfloat16 *)out, ldo, (const __nv_bfloat16 *)resid, ldr, (const __nv_bfloat16 *)ys, ldy, row, w, T,
            K, H, (const __nv_bfloat16 *)shared, lds, sg, ldsg);
        CHECK_CUDA_LAUNCH();
        return;
    }
    const long long n = (long long)T * H;
    long long blocks = (n + threads - 1) / threads;
    if (blocks > 65535LL * 16) blocks = 65535LL * 16;
    moe_combine_kernel<<<(unsigned)blocks, threads, 0, (cudaStream_t)stream>>>(
        (__nv_bfloat16 *)out, ldo, (const __nv_bfloat16 *)resid, ldr, (const __nv_bfloat16 *)ys, ldy, row, w, T, K, H,
        (const __nv_bfloat16 *)shared, lds, sg, ldsg);
    CHECK_CUDA_LAUNCH();
}
