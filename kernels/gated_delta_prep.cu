// gated_delta_prep: CUDA, one block per token. Each warp l2-normalises whole heads (q heads then k heads; a lane
// sums a strided slice, a shuffle reduction gives Σx²) and rewrites them in place; threads [0, hv) compute the gates.
#include <cuda_bf16.h>
#include <cstdint>

#include "cuda_check.h"
#include "gated_delta_prep.h"

static __global__ void gated_delta_prep_kernel(__nv_bfloat16 *qk, int ldqk, int hk, int dk, float *beta, float *g,
                                               int ldo, const __nv_bfloat16 *b, int ldb, const __nv_bfloat16 *a,
                                               int lda, const float *a_log, const float *dt_bias, int hv)
{
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const float qscale = rsqrtf((float)dk);
    for (int h = warp; h < 2 * hk; h += nwarps) {
        __nv_bfloat16 *v = qk + (size_t)t * ldqk + (size_t)h * dk;
        float ss = 0.0f;
        for (int i = lane; i < dk; i += 32) {
            float x = __bfloat162float(v[i]);
            ss += x * x;
        }
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float inv = 1.0f / sqrtf(ss + 1e-6f), scale = h < hk ? qscale : 1.0f;
        for (int i = lane; i < dk; i += 32) v[i] = __float2bfloat16_rn(__bfloat162float(v[i]) * inv * scale);
    }
    for (int h = threadIdx.x; h < hv; h += blockDim.x) {
        float bv = __bfloat162float(b[(size_t)t * ldb + h]);
        float x = __bfloat162float(a[(size_t)t * lda + h]) + dt_bias[h];
        float sp = x > 20.0f ? x : log1pf(expf(x));
        beta[(size_t)t * ldo + h] = 1.0f / (1.0f + expf(-bv));
        g[(size_t)t * ldo + h] = -expf(a_log[h]) * sp;
    }
}

extern "C" void gated_delta_prep_cuda(uint16_t *qk, int ldqk, int T, int hk, int dk, float *beta, float *g, int ldo,
                                      const uint16_t *b, int ldb, const uint16_t *a, int lda, const float *a_log,
                                      const float *dt_bias, int hv, void *stream)
{
    if (T <= 0) return;
    gated_delta_prep_kernel<<<(unsigned)T, 256, 0, (cudaStream_t)stream>>>(
        (__nv_bfloat16 *)qk, ldqk, hk, dk, beta, g, ldo, (const __nv_bfloat16 *)b, ldb, (const __nv_bfloat16 *)a, lda,
        a_log, dt_bias, hv);
    CHECK_CUDA_LAUNCH();
}
