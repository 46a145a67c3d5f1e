/* gated_rmsnorm: CPU reference, rmsnorm_forward_cpu per head then the silu(z) factor (target_hybrid.c's order). */
#include "gated_rmsnorm.h"

#include <math.h>
#include <stddef.h>

#include "rmsnorm.h"
#include "util.h"

void gated_rmsnorm_cpu(float *y, int ldy, const float *x, int ldx, const float *z, int ldz, const float *w, int T,
                       int heads, int dim, float eps)
{
    DF_ASSERT(T >= 0 && heads > 0 && dim > 0 && ldy >= heads * dim && ldx >= heads * dim && ldz >= heads * dim);
    for (int t = 0; t < T; t++) {
        float *yt = y + (size_t)t * ldy;
        const float *zt = z + (size_t)t * ldz;
        rmsnorm_forward_cpu(yt, dim, x + (size_t)t * ldx, dim, w, heads, dim, eps);
        for (int i = 0; i < heads * dim; i++) yt[i] *= zt[i] / (1.0f + expf(-zt[i]));
    }
}
