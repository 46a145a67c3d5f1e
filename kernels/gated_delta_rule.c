/* gated_delta_rule: CPU reference, the token-by-token recurrence of transformers'
 * torch_recurrent_gated_delta_rule (fp32 state, one (Dk, Dv) state per value head and sequence). One loop: the
 * packed form runs each sequence from a zero state. */
#include "gated_delta_rule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

void gated_delta_rule_forward_state_cpu(float *out, int ldo, const float *q, int ldq, const float *k, int ldk,
                                        const float *v, int ldv, const float *g, int ldg, const float *beta, int ldb,
                                        int T, int hk, int hv, int dk, int dv, float *state)
{
    DF_ASSERT(hk > 0 && hv % hk == 0 && dk > 0 && dv > 0 && T >= 0);
    DF_ASSERT(ldq >= hk * dk && ldk >= hk * dk && ldv >= hv * dv && ldo >= hv * dv && ldg >= hv && ldb >= hv);
    const int rep = hv / hk;
    float *mem = xmalloc(sizeof(float) * (size_t)dv);
    for (int h = 0; h < hv; h++) {
        const int kh = h / rep;
        float *S = state + (size_t)h * dk * dv;
        for (int t = 0; t < T; t++) {
            const float *qt = q + (size_t)t * ldq + (size_t)kh * dk, *kt = k + (size_t)t * ldk + (size_t)kh * dk;
            const float *vt = v + (size_t)t * ldv + (size_t)h * dv;
            const float decay = expf(g[(size_t)t * ldg + h]), b = beta[(size_t)t * ldb + h];
            float *ot = out + (size_t)t * ldo + (size_t)h * dv;
            for (int j = 0; j < dv; j++) mem[j] = 0.0f;
            for (int i = 0; i < dk; i++) {
                float *Si = S + (size_t)i * dv;
                for (int j = 0; j < dv; j++) {
                    Si[j] *= decay;
                    mem[j] += Si[j] * kt[i];
                }
            }
            for (int j = 0; j < dv; j++) mem[j] = (vt[j] - mem[j]) * b; /* the delta, scaled by beta */
            for (int j = 0; j < dv; j++) ot[j] = 0.0f;
            for (int i = 0; i < dk; i++) {
                float *Si = S + (size_t)i * dv;
                for (int j = 0; j < dv; j++) {
                    Si[j] += kt[i] * mem[j];
                    ot[j] += Si[j] * qt[i];
                }
            }
        }
    }
    free(mem);
}

void gated_delta_rule_forward_cpu(float *out, int ldo, const float *q, int ldq, const float *k, int ldk,
                                  const float *v, int ldv, const float *g, int ldg, const float *beta, int ldb,
                                  const int32_t *cu_seqlens, int nseq, int hk, int hv, int dk, int dv)
{
    DF_ASSERT(nseq >= 0);
    const size_t n = (size_t)hv * (size_t)dk * (size_t)dv;
    float *S = xmalloc(sizeof(float) * n);
    for (int s = 0; s < nseq; s++) {
        const size_t t0 = (size_t)cu_seqlens[s];
        memset(S, 0, sizeof(float) * n);
        gated_delta_rule_forward_state_cpu(out + t0 * ldo, ldo, q + t0 * ldq, ldq, k + t0 * ldk, ldk, v + t0 * ldv, ldv,
                                           g + t0 * ldg, ldg, beta + t0 * ldb, ldb, cu_seqlens[s + 1] - cu_seqlens[s],
                                           hk, hv, dk, dv, S);
    }
    free(S);
}
