/* qk_norm_rope: CPU reference, the composition the CPU target forward runs (rmsnorm per head, then rope), and its
 * backward as the CPU drafter backward composes it (inverse rope, then rmsnorm backward). */
#include "qk_norm_rope.h"

#include <stdlib.h>
#include <string.h>

#include "rmsnorm.h"
#include "rope.h"
#include "util.h"

void qk_norm_rope_cpu(float *q, int ldq, float *k, int ldk, int n, int nh, int nkv, int hd, const float *q_w,
                      const float *k_w, float eps, const int32_t *pos, const double *inv_freq)
{
    DF_ASSERT(n >= 0 && ldq >= nh * hd && ldk >= nkv * hd);
    for (int t = 0; t < n && (q_w || k_w); t++) {
        if (q_w) rmsnorm_forward_cpu(q + (size_t)t * ldq, hd, q + (size_t)t * ldq, hd, q_w, nh, hd, eps);
        if (k_w) rmsnorm_forward_cpu(k + (size_t)t * ldk, hd, k + (size_t)t * ldk, hd, k_w, nkv, hd, eps);
    }
    rope_apply_cpu(q, ldq, n, nh, hd, pos, inv_freq, 0);
    rope_apply_cpu(k, ldk, n, nkv, hd, pos, inv_freq, 0);
}

void qk_norm_rope_partial_cpu(float *q, int ldq, float *k, int ldk, int n, int nh, int nkv, int hd, int rd,
                              const float *q_w, const float *k_w, float eps, const int32_t *pos,
                              const double *inv_freq)
{
    DF_ASSERT(n >= 0 && ldq >= nh * hd && ldk >= nkv * hd && rd > 0 && rd % 2 == 0 && rd <= hd);
    for (int t = 0; t < n && (q_w || k_w); t++) {
        if (q_w) rmsnorm_forward_cpu(q + (size_t)t * ldq, hd, q + (size_t)t * ldq, hd, q_w, nh, hd, eps);
        if (k_w) rmsnorm_forward_cpu(k + (size_t)t * ldk, hd, k + (size_t)t * ldk, hd, k_w, nkv, hd, eps);
    }
    for (int h = 0; h < nh; h++) rope_apply_cpu(q + (size_t)h * hd, ldq, n, 1, rd, pos, inv_freq, 0);
    for (int h = 0; h < nkv; h++) rope_apply_cpu(k + (size_t)h * hd, ldk, n, 1, rd, pos, inv_freq, 0);
}

/* dx of one token's heads in place: rmsnorm_backward_cpu needs dx apart from dy, so through tmp (heads*hd). */
static void qk_norm_backward_token(float *d, const float *x, int heads, int hd, const float *w, float *dw, float eps,
                                   float *tmp)
{
    rmsnorm_backward_cpu(tmp, hd, 0, dw, d, hd, x, hd, w, heads, hd, eps);
    memcpy(d, tmp, sizeof(float) * (size_t)heads * hd);
}

void qk_norm_rope_backward_cpu(float *dq, int lddq, float *dk, int lddk, const float *q, int ldq, const float *k,
                               int ldk, int n, int nh, int nkv, int hd, const float *q_w, const float *k_w,
                               float *dq_w, float *dk_w, float eps, const int32_t *pos, const double *inv_freq)
{
    if (!dq) nh = 0;
    if (!dk) nkv = 0;
    DF_ASSERT(n >= 0 && (!nh || (lddq >= nh * hd && ldq >= nh * hd)) &&
              (!nkv || (lddk >= nkv * hd && ldk >= nkv * hd)));
    /* rope is a rotation: its backward is the inverse rotation */
    if (nh) rope_apply_cpu(dq, lddq, n, nh, hd, pos, inv_freq, 1);
    if (nkv) rope_apply_cpu(dk, lddk, n, nkv, hd, pos, inv_freq, 1);
    if (!(nh && q_w) && !(nkv && k_w)) return;
    float *tmp = xmalloc(sizeof(float) * (size_t)(nh > nkv ? nh : nkv) * hd);
    /* token by token, heads in order: dw accumulates in the drafter's (token, head) row order */
    for (int t = 0; t < n && nh && q_w; t++)
        qk_norm_backward_token(dq + (size_t)t * lddq, q + (size_t)t * ldq, nh, hd, q_w, dq_w, eps, tmp);
    for (int t = 0; t < n && nkv && k_w; t++)
        qk_norm_backward_token(dk + (size_t)t * lddk, k + (size_t)t * ldk, nkv, hd, k_w, dk_w, eps, tmp);
    free(tmp);
}
