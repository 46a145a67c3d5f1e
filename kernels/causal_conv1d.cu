// causal_conv1d: CUDA causal depthwise conv1d + SiLU. One thread per (token, channel); consecutive threads take
// consecutive channels of one token, so the loads of x rows and the store of y are coalesced. A thread finds its
// sequence's first token by binary search over cu_seqlens (nseq is small), then sums K taps in fp32.
#include <cuda_bf16.h>
#include <cstdint>

#include "causal_conv1d.h"
#include "cuda_check.h"

static __global__ void causal_conv1d_silu_kernel(__nv_bfloat16 *y, int ldy, const __nv_bfloat16 *x, int ldx,
                                                 const __nv_bfloat16 *w, int C, int K, const int32_t *cu, int nseq,
                                                 int T)
{
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)T * C) return;
    const int t = (int)(i / C), ch = (int)(i - (long long)t * C);
    int lo = 0, hi = nseq - 1; // the last sequence s with cu[s] <= t
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (cu[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    const int t0 = cu[lo];
    float acc = 0.0f;
    for (int j = 0; j < K; j++) {
        int src = t - (K - 1) + j;
        if (src >= t0) acc += __bfloat162float(w[(size_t)ch * K + j]) * __bfloat162float(x[(size_t)src * ldx + ch]);
    }
    y[(size_t)t * ldy + ch] = __float2bfloat16_rn(acc / (1.0f + __expf(-acc)));
}

extern "C" void causal_conv1d_silu_cuda(uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *w, int C,
                                        int K, const int32_t *cu_seqlens, int nseq, int T, void *stream)
{
    if (T <= 0 || C <= 0 || nseq <= 0) return;
    const int threads = 256;
    const long long n = (long long)T * C;
    causal_conv1d_silu_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, (cudaStream_t)stream>>>(
        (__nv_bfloat16 *)y, ldy, (const __nv_bfloat16 *)x, ldx, (const __nv_bfloat16 *)w, C, K, cu_seqlens, nseq, T);
    CHECK_CUDA_LAUNCH();
}
