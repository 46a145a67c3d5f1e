/* moe_router: CPU reference (target_hybrid.c's routing loop). */
#include "moe_router.h"

#include <math.h>
#include <stdlib.h>

#include "util.h"

void moe_router_topk_cpu(int32_t *sel, float *selw, const float *logits, int ldl, int T, int E, int K, int norm)
{
    DF_ASSERT(T >= 0 && E > 0 && K > 0 && K <= E && ldl >= E);
    float *p = xmalloc(sizeof(float) * (size_t)E);
    for (int t = 0; t < T; t++) {
        const float *l = logits + (size_t)t * ldl;
        float mx = l[0], sum = 0.0f, ksum = 0.0f;
        for (int e = 1; e < E; e++) mx = fmaxf(mx, l[e]);
        for (int e = 0; e < E; e++) sum += p[e] = expf(l[e] - mx);
        for (int e = 0; e < E; e++) p[e] /= sum;
        int32_t *st = sel + (size_t)t * K;
        float *wt = selw + (size_t)t * K;
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (p[e] >= 0.0f && (best < 0 || p[e] > p[best])) best = e;
            st[j] = best;
            wt[j] = p[best];
            ksum += p[best];
            p[best] = -1.0f; /* taken: below every probability */
        }
        if (norm)
            for (int j = 0; j < K; j++) wt[j] /= ksum;
    }
    free(p);
}
