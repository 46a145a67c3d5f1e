// causal_conv1d: CUDA causal depthwise conv1d + SiLU. One thread per (token, channel); consecutive threads take
// consecutive channels of one token, so the loads of x rows and the store of y are coalesced. A thread finds its
// sequence's first token by binary search over cu_seqlens (nseq is small), then sums K taps in fp32. Decoding (the
// _state entry): taps before the sequence's first row read its carried history, and nseq*(K-1)*C more threads write
// the new history (the last K-1 rows of [history; rows]) into the sequence's output slot.
#include <cuda_bf16.h>
#include <cstdint>

#include "causal_conv1d.h"
#include "cuda_check.h"

static __global__ void causal_conv1d_silu_kernel(__nv_bfloat16 *y, int ldy, const __nv_bfloat16 *x, int ldx,
                                                 const __nv_bfloat16 *w, int C, int K, const int32_t *cu, int nseq,
                                                 int T, __nv_bfloat16 *hist, const int32_t *hist_in,
                                                 const int32_t *hist_out)
{
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const size_t slot = (size_t)(K - 1) * C;
    if (i >= (long long)T * C) { // the new histories (decoding only)
        const long long j = i - (long long)T * C;
        if (!hist || j >= (long long)nseq * (K - 1) * C) return;
        const int s = (int)(j / (long long)slot), r = (int)((j / C) % (K - 1)), ch = (int)(j % C);
        const int t0 = cu[s], n = cu[s + 1] - t0, src = n + r - (K - 1); // < 0: row n + r of the old history
        __nv_bfloat16 val = __float2bfloat16_rn(0.0f);
        if (src >= 0) val = x[(size_t)(t0 + src) * ldx + ch];
        else if (hist_in[s] >= 0) val = hist[(size_t)hist_in[s] * slot + (size_t)(n + r) * C + ch];
        hist[(size_t)hist_out[s] * slot + (size_t)r * C + ch] = val;
        return;
    }
    const int t = (int)(i / C), ch = (int)(i - (long long)t * C);
    int lo = 0, hi = nseq - 1; // the last sequence s with cu[s] <= t
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (cu[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    const int t0 = cu[lo];
    const __nv_bfloat16 *h = hist && hist_in[lo] >= 0 ? hist + (size_t)hist_in[lo] * slot : NULL;
    float acc = 0.0f;
    for (int j = 0; j < K; j++) {
        int src = t - (K - 1) + j;
        if (src >= t0) acc += __bfloat162float(w[(size_t)ch * K + j]) * __bfloat162float(x[(size_t)src * ldx + ch]);
        else if (h) acc += __bfloat162float(w[(size_t)ch * K + j]) * __bfloat162float(h[(size_t)(K - 1 + src - t0) * C + ch]);
    }
    y[(size_t)t * ldy + ch] = __float2bfloat16_rn(acc / (1.0f + __expf(-acc)));
}

static void launch(uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *w, int C, int K,
                   const int32_t *cu_seqlens, int nseq, int T, uint16_t *hist, const int32_t *hist_in,
                   const int32_t *hist_out, void *stream)
{
    if (T < 0 || C <= 0 || nseq <= 0) return;
    const int threads = 256;
    const long long n = (long long)T * C + (hist ? (long long)nseq * (K - 1) * C : 0);
    if (n <= 0) return;
    causal_conv1d_silu_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, (cudaStream_t)stream>>>(
        (__nv_bfloat16 *)y, ldy, (const __nv_bfloat16 *)x, ldx, (const __nv_bfloat16 *)w, C, K, cu_seqlens, nseq, T,
        (__nv_bfloat16 *)hist, hist_in, hist_out);
    CHECK_CUDA_LAUNCH();
}

extern "C" void causal_conv1d_silu_cuda(uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *w, int C,
                                        int K, const int32_t *cu_seqlens, int nseq, int T, void *stream)
{
    if (T <= 0) return;
    launch(y, ldy, x, ldx, w, C, K, cu_seqlens, nseq, T, NULL, NULL, NULL, stream);
}

extern "C" void causal_conv1d_silu_state_cuda(uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *w,
                                              int C, int K, const int32_t *cu_seqlens, int nseq, int T,
                                              uint16_t *hist, const int32_t *hist_in, const int32_t *hist_out,
                                              void *stream)
{
    launch(y, ldy, x, ldx, w, C, K, cu_seqlens, nseq, T, hist, hist_in, hist_out, stream);
}
