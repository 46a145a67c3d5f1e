/* causal_conv1d: CPU reference (the same loop as target_hybrid.c's conv, with row strides). */
#include "causal_conv1d.h"

#include <math.h>
#include <stddef.h>

#include "util.h"

void causal_conv1d_silu_cpu(float *y, int ldy, const float *x, int ldx, const float *w, int C, int K,
                            const int32_t *cu_seqlens, int nseq)
{
    DF_ASSERT(C > 0 && K > 0 && ldy >= C && ldx >= C && nseq >= 0);
    for (int s = 0; s < nseq; s++) {
        const int t0 = cu_seqlens[s], t1 = cu_seqlens[s + 1];
        for (int t = t0; t < t1; t++)
            for (int ch = 0; ch < C; ch++) {
                const float *wc = w + (size_t)ch * K;
                float acc = 0.0f;
                for (int j = 0; j < K; j++) {
                    int src = t - (K - 1) + j;
                    if (src >= t0) acc += wc[j] * x[(size_t)src * ldx + ch];
                }
                y[(size_t)t * ldy + ch] = acc / (1.0f + expf(-acc));
            }
    }
}
