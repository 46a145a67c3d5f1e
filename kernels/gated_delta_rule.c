/* gated_delta_rule: CPU reference, the token-by-token recurrence of transformers'
 * torch_recurrent_gated_delta_rule (fp32 state, one (Dk, Dv) state per value head and sequence). */
#include "gated_delta_rule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

void gated_delta_rule_forward_cpu(float *out, int ldo, const float *q, int ldq, const float *k, int ldk,
                                  const float *v, int ldv, const float *g, int ldg, const float *beta, int ldb,
                                  const int32_t *cu_seqlens, int nseq, int hk, int hv, int dk, int dv)
{
    DF_ASSERT(hk > 0 && hv % hk == 0 && dk > 0 && dv > 0 && nseq >= 0);
    DF_ASSERT(ldq >= hk * dk && ldk >= hk * dk && ldv >= hv * dv && ldo >= hv * dv && ldg >= hv && ldb >= hv);
    const int rep = hv / hk;
    float *S = xmalloc(sizeof(float) * (size_t)dk * (size_t)dv), *mem = xmalloc(sizeof(float) * (size_t)dv);
    for (int s = 0; s < nseq; s++) {
        for (int h = 0; h < hv; h++) {
            const int kh = h / rep;
            memset(S, 0, sizeof(float) * (size_t)dk * (size_t)dv);
            for (int t = cu_seqlens[s]; t < cu_seqlens[s + 1]; t++) {
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
    }
    free(S);
    free(mem);
}
