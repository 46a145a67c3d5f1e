/* gated_delta_prep: CPU reference (target_hybrid.c's l2norm and gate formulas, with row strides). */
#include "gated_delta_prep.h"

#include <math.h>
#include <stddef.h>

#include "util.h"

void gated_delta_prep_cpu(float *qk, int ldqk, int T, int hk, int dk, float *beta, float *g, int ldo,
                          const float *b, int ldb, const float *a, int lda, const float *a_log, const float *dt_bias,
                          int hv)
{
    DF_ASSERT(T >= 0 && hk > 0 && dk > 0 && ldqk >= 2 * hk * dk && ldo >= hv && ldb >= hv && lda >= hv);
    const float qscale = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < 2 * hk; h++) {
            float *v = qk + (size_t)t * ldqk + (size_t)h * dk, ss = 0.0f;
            for (int i = 0; i < dk; i++) ss += v[i] * v[i];
            float inv = 1.0f / sqrtf(ss + 1e-6f), scale = h < hk ? qscale : 1.0f;
            for (int i = 0; i < dk; i++) v[i] = v[i] * inv * scale;
        }
        for (int h = 0; h < hv; h++) {
            float bv = b[(size_t)t * ldb + h], x = a[(size_t)t * lda + h] + dt_bias[h];
            float sp = x > 20.0f ? x : log1pf(expf(x));
            beta[(size_t)t * ldo + h] = 1.0f / (1.0f + expf(-bv));
            g[(size_t)t * ldo + h] = -expf(a_log[h]) * sp;
        }
    }
}
