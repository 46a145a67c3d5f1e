/* qk_norm_rope: CPU reference, the composition the CPU target forward runs (rmsnorm per head, then rope). */
#include "qk_norm_rope.h"

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
