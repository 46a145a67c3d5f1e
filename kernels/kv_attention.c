/* kv_attention: CPU reference. One query row and head at a time through attention.c's attention_row_cpu, a scratch
 * row of scores as long as the row's key range. */
#include "kv_attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "util.h"

void kv_cache_append_cpu(float *kc, float *vc, size_t seq_stride, const float *k, int ldk, const float *v, int ldv,
                         const int32_t *seq, const int32_t *pos, int T, int kd)
{
    for (int t = 0; t < T; t++) {
        size_t at = (size_t)seq[t] * seq_stride + (size_t)pos[t] * (size_t)kd;
        memcpy(kc + at, k + (size_t)t * (size_t)ldk, sizeof(float) * (size_t)kd);
        memcpy(vc + at, v + (size_t)t * (size_t)ldv, sizeof(float) * (size_t)kd);
    }
}

void kv_attention_forward_cpu(float *out, int ldo, const float *q, int ldq, const float *kc, const float *vc,
                              size_t seq_stride, const int32_t *seq, const int32_t *pos, int T, int nh, int nkv, int hd,
                              float scale)
{
    kv_attention_opts_forward_cpu(out, ldo, q, ldq, kc, vc, seq_stride, seq, pos, T, nh, nkv, hd, scale, NULL);
}

void kv_attention_opts_forward_cpu(float *out, int ldo, const float *q, int ldq, const float *kc, const float *vc,
                                   size_t seq_stride, const int32_t *seq, const int32_t *pos, int T, int nh, int nkv,
                                   int hd, float scale, const attention_opts *o)
{
    const int window = o ? o->window : 0;
    const float *sinks = o ? o->sinks : NULL;
    DF_ASSERT(nh > 0 && nkv > 0 && nh % nkv == 0 && hd > 0);
    const int group = nh / nkv;
    const size_t kd = (size_t)nkv * (size_t)hd;
    int maxk = 1;
    for (int t = 0; t < T; t++)
        if (pos[t] + 1 > maxk) maxk = pos[t] + 1;
    float *p = xmalloc(sizeof(float) * (size_t)maxk);
    for (int t = 0; t < T; t++) {
        const int k0 = window > 0 && pos[t] - window + 1 > 0 ? pos[t] - window + 1 : 0;
        const int nk = pos[t] + 1 - k0;
        const float *ks = kc + (size_t)seq[t] * seq_stride + (size_t)k0 * kd;
        const float *vs = vc + (size_t)seq[t] * seq_stride + (size_t)k0 * kd;
        for (int h = 0; h < nh; h++) {
            const float *qh = q + (size_t)t * (size_t)ldq + (size_t)h * (size_t)hd;
            const size_t off = (size_t)(h / group) * (size_t)hd;
            attention_row_sink_cpu(out + (size_t)t * (size_t)ldo + (size_t)h * (size_t)hd, qh, ks + off, vs + off, nk,
                                   kd, hd, scale, sinks ? sinks[h] : -INFINITY, p);
        }
    }
    free(p);
}
