/* moe_gemm: CPU reference. */
#include "moe_gemm.h"

#include <math.h>
#include <stddef.h>

#include "swiglu.h"
#include "util.h"

void moe_gemm_gate_up_cpu(float *act, int ldact, const float *x, int ldx, const int32_t *row_token,
                          const int32_t *off, int E, int H, int Im, int Is, const float *w_gu, const float *ws_gu)
{
    moe_gemm_gate_up_opts_cpu(act, ldact, x, ldx, row_token, off, E, H, Im, Is, w_gu, ws_gu, NULL);
}

void moe_gemm_gate_up_opts_cpu(float *act, int ldact, const float *x, int ldx, const int32_t *row_token,
                               const int32_t *off, int E, int H, int Im, int Is, const float *w_gu, const float *ws_gu,
                               const moe_gemm_opts *o)
{
    const float *bias = o ? o->bias : NULL;
    const float alpha = o ? o->alpha : 0.0f, limit = o ? o->limit : 0.0f;
    for (int g = 0; g <= E; g++) {
        const int I = g < E ? Im : Is;
        const float *w = g < E ? w_gu + (size_t)g * 2 * Im * H : ws_gu;
        DF_ASSERT(off[g + 1] == off[g] || (w && ldact >= I));
        for (int r = off[g]; r < off[g + 1]; r++) {
            const float *xr = x + (size_t)row_token[r] * ldx;
            for (int j = 0; j < I; j++) {
                const float *wg = w + (size_t)j * H, *wu = w + (size_t)(I + j) * H;
                float a = 0.0f, b = 0.0f;
                for (int k = 0; k < H; k++) a += xr[k] * wg[k], b += xr[k] * wu[k];
                if (bias && g < E) a += bias[(size_t)g * 2 * Im + j], b += bias[(size_t)g * 2 * Im + Im + j];
                if (limit > 0)
                    swiglu_clamped_forward_cpu(act + (size_t)r * ldact + j, &a, &b, 1, alpha, limit);
                else
                    act[(size_t)r * ldact + j] = a / (1.0f + expf(-a)) * b;
            }
        }
    }
}

void moe_gemm_down_cpu(float *y, int ldy, const float *act, int ldact, const int32_t *off, int E, int H, int Im,
                       int Is, const float *w_down, const float *ws_down)
{
    moe_gemm_down_opts_cpu(y, ldy, act, ldact, off, E, H, Im, Is, w_down, ws_down, NULL);
}

void moe_gemm_down_opts_cpu(float *y, int ldy, const float *act, int ldact, const int32_t *off, int E, int H, int Im,
                            int Is, const float *w_down, const float *ws_down, const moe_gemm_opts *o)
{
    const float *bias = o ? o->bias : NULL;
    for (int g = 0; g <= E; g++) {
        const int I = g < E ? Im : Is;
        const float *w = g < E ? w_down + (size_t)g * H * Im : ws_down;
        DF_ASSERT(off[g + 1] == off[g] || (w && ldy >= H));
        for (int r = off[g]; r < off[g + 1]; r++) {
            const float *ar = act + (size_t)r * ldact;
            for (int n = 0; n < H; n++) {
                const float *wr = w + (size_t)n * I;
                float a = 0.0f;
                for (int k = 0; k < I; k++) a += ar[k] * wr[k];
                y[(size_t)r * ldy + n] = a + (bias && g < E ? bias[(size_t)g * H + n] : 0.0f);
            }
        }
    }
}
