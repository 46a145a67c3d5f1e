// moe_combine: CUDA, one thread per (token, column) (grid-stride): each output element gathers its K expert rows
// and the shared expert's value in a fixed order, so the result does not depend on scheduling.
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

extern "C" void moe_combine_cuda(uint16_t *out, int ldo, const uint16_t *resid, int ldr, const uint16_t *ys, int ldy,
                                 const int32_t *row, const float *w, int T, int K, int H, const uint16_t *shared,
                                 int lds, const float *sg, int ldsg, void *stream)
{
    if (T <= 0 || H <= 0) return;
    const long long n = (long long)T * H;
    const int threads = 256;
    long long blocks = (n + threads - 1) / threads;
    if (blocks > 65535LL * 16) blocks = 65535LL * 16;
    moe_combine_kernel<<<(unsigned)blocks, threads, 0, (cudaStream_t)stream>>>(
        (__nv_bfloat16 *)out, ldo, (const __nv_bfloat16 *)resid, ldr, (const __nv_bfloat16 *)ys, ldy, row, w, T, K, H,
        (const __nv_bfloat16 *)shared, lds, sg, ldsg);
    CHECK_CUDA_LAUNCH();
}
