/* matmul_swiglu: CPU reference of act = swiglu(x · w_guᵀ), the two-kernel path's steps and its bf16 rounding of gu. */
#include "matmul_swiglu.h"

#include <stddef.h>

#include "matmul.h"
#include "swiglu.h"
#include "util.h"

void matmul_swiglu_forward_cpu(float *act, int ldact, float *gu, const float *x, int ldx, const float *w_gu, int T,
                               int I, int H)
{
    const size_t n = (size_t)T * 2 * (size_t)I;
    matmul_forward_cpu(gu, 2 * I, x, ldx, w_gu, T, 2 * I, H, 0);
    for (size_t i = 0; i < n; i++) gu[i] = bf16_to_f32(f32_to_bf16(gu[i])); /* gu as the GEMM stores it */
    for (int r = 0; r < T; r++)
        swiglu_forward_cpu(act + (size_t)r * ldact, gu + (size_t)r * 2 * I, gu + (size_t)r * 2 * I + I, (size_t)I);
}
