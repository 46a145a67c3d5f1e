/* rmsnorm: CPU reference. Matches the fp32 PyTorch form w * (x * rsqrt(mean(x²) + eps)): the mean is accumulated
 * in double and rounded to float, the reciprocal root is taken in float. */
#include "rmsnorm.h"

#include <math.h>

#include "util.h"

/* 1/sqrt(mean(x²) + eps) of one row. */
static float rmsnorm_row_rstd(const float *x, int dim, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    float var = (float)(ss / dim);
    return 1.0f / sqrtf(var + eps);
}

void rmsnorm_forward_cpu(float *y, int ldy, const float *x, int ldx, const float *w, int rows, int dim, float eps)
{
    DF_ASSERT(rows >= 0 && dim > 0 && ldy >= dim && ldx >= dim);
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * ldx;
        float *yr = y + (size_t)r * ldy;
        float rstd = rmsnorm_row_rstd(xr, dim, eps); /* before any write: y may alias x */
        for (int i = 0; i < dim; i++) yr[i] = w[i] * (xr[i] * rstd);
    }
}

void rmsnorm_backward_cpu(float *dx, int lddx, int accumulate_dx, float *dw, const float *dy, int lddy,
                          const float *x, int ldx, const float *w, int rows, int dim, float eps)
{
    DF_ASSERT(rows >= 0 && dim > 0 && lddx >= dim && lddy >= dim && ldx >= dim);
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * ldx;
        const float *dyr = dy + (size_t)r * lddy;
        float *dxr = dx + (size_t)r * lddx;
        float rstd = rmsnorm_row_rstd(xr, dim, eps);
        /* with xhat = x·rstd and g = dy·w: dx = rstd · (g − xhat · mean(g·xhat)) */
        double c = 0.0;
        for (int i = 0; i < dim; i++) c += (double)(dyr[i] * w[i]) * (xr[i] * rstd);
        float cm = (float)(c / dim);
        for (int i = 0; i < dim; i++) {
            float xhat = xr[i] * rstd;
            float g = rstd * (dyr[i] * w[i] - xhat * cm);
            dxr[i] = accumulate_dx ? dxr[i] + g : g;
            if (dw) dw[i] += dyr[i] * xhat;
        }
    }
}
