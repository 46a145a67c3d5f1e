/* gemv: CPU reference of the few-row linear layer. */
#include "gemv.h"

void gemv_forward_cpu(float *y, int ldy, const float *c, int ldc, float beta, const float *x, int ldx, const float *w,
                      int m, int n, int k)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0.0;
            for (int p = 0; p < k; p++) s += (double)x[(size_t)i * ldx + p] * (double)w[(size_t)j * k + p];
            if (beta != 0.0f) s += (double)beta * (double)c[(size_t)i * ldc + j]; /* read before write: c may be y */
            y[(size_t)i * ldy + j] = (float)s;
        }
}
