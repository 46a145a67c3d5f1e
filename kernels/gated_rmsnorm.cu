// gated_rmsnorm: CUDA, one warp per (token, head) row: lanes sum x² over a strided slice (shuffle reduction), then
// each lane writes the elements it read, so y may alias x.
#include <cuda_bf16.h>
#include <cstdint>

#include "cuda_check.h"
#include "gated_rmsnorm.h"

static __global__ void gated_rmsnorm_kernel(__nv_bfloat16 *y, int ldy, const __nv_bfloat16 *x, int ldx,
                                            const __nv_bfloat16 *z, int ldz, const __nv_bfloat16 *w, int T, int heads,
                                            int dim, float eps)
{
    const long long row = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= (long long)T * heads) return;
    const int t = (int)(row / heads), h = (int)(row - (long long)t * heads);
    const __nv_bfloat16 *xr = x + (size_t)t * ldx + (size_t)h * dim, *zr = z + (size_t)t * ldz + (size_t)h * dim;
    __nv_bfloat16 *yr = y + (size_t)t * ldy + (size_t)h * dim;
    float ss = 0.0f;
    for (int i = lane; i < dim; i += 32) {
        float v = __bfloat162float(xr[i]);
        ss += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float rstd = rsqrtf(ss / (float)dim + eps);
    for (int i = lane; i < dim; i += 32) {
        float v = __bfloat162float(w[i]) * (__bfloat162float(xr[i]) * rstd), zz = __bfloat162float(zr[i]);
        yr[i] = __float2bfloat16_rn(v * (zz / (1.0f + __expf(-zz))));
    }
}

extern "C" void gated_rmsnorm_cuda(uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *z, int ldz,
                                   const uint16_t *w, int T, int heads, int dim, float eps, void *stream)
{
    if (T <= 0 || heads <= 0) return;
    const int warps = 8;
    const long long rows = (long long)T * heads;
    gated_rmsnorm_kernel<<<(unsigned)((rows + warps - 1) / warps), warps * 32, 0, (cudaStream_t)stream>>>(
        (__nv_bfloat16 *)y, ldy, (const __nv_bfloat16 *)x, ldx, (const __nv_bfloat16 *)z, ldz,
        (const __nv_bfloat16 *)w, T, heads, dim, eps);
    CHECK_CUDA_LAUNCH();
}
