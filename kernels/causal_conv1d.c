/* causal_conv1d: CPU reference, one loop: the packed form runs each sequence from an empty history. */
#include "causal_conv1d.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "util.h"

void causal_conv1d_silu_state_cpu(float *y, int ldy, const float *x, int ldx, const float *w, int C, int K, int T,
                                  float *state)
{
    DF_ASSERT(C > 0 && K > 0 && ldy >= C && ldx >= C && T >= 0);
    for (int t = 0; t < T; t++)
        for (int ch = 0; ch < C; ch++) {
            const float *wc = w + (size_t)ch * K;
            float acc = 0.0f;
            for (int j = 0; j < K; j++) {
                int src = t - (K - 1) + j; /* < 0: row K-1+src of the history */
                if (src >= 0) acc += wc[j] * x[(size_t)src * ldx + ch];
                else if (state) acc += wc[j] * state[(size_t)(K - 1 + src) * C + ch];
            }
            y[(size_t)t * ldy + ch] = acc / (1.0f + expf(-acc));
        }
    if (!state) return;
    /* the new history: the last K-1 rows of [state; x], in increasing order (row r reads row T+r >= r) */
    for (int r = 0; r < K - 1; r++) {
        int src = T + r - (K - 1);
        float *dst = state + (size_t)r * C;
        if (src >= 0) memcpy(dst, x + (size_t)src * ldx, sizeof(float) * (size_t)C);
        else memmove(dst, state + (size_t)(T + r) * C, sizeof(float) * (size_t)C);
    }
}

void causal_conv1d_silu_cpu(float *y, int ldy, const float *x, int ldx, const float *w, int C, int K,
                            const int32_t *cu_seqlens, int nseq)
{
    DF_ASSERT(C > 0 && K > 0 && ldy >= C && ldx >= C && nseq >= 0);
    for (int s = 0; s < nseq; s++) {
        const int t0 = cu_seqlens[s], t1 = cu_seqlens[s + 1];
        causal_conv1d_silu_state_cpu(y + (size_t)t0 * ldy, ldy, x + (size_t)t0 * ldx, ldx, w, C, K, t1 - t0, NULL);
    }
}
