/* attention: CPU reference of causal GQA self-attention over packed sequences. Single-threaded; one query row of
 * scores at a time (a scratch row as long as the longest sequence). */
#include "attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "progress.h"
#include "util.h"

void attention_row_cpu(float *oh, const float *qh, const float *kh, const float *vh, int nk, size_t ldkv, int hd,
                       float scale, float *p)
{
    attention_row_sink_cpu(oh, qh, kh, vh, nk, ldkv, hd, scale, -INFINITY, p);
}

void attention_row_sink_cpu(float *oh, const float *qh, const float *kh, const float *vh, int nk, size_t ldkv, int hd,
                            float scale, float sink, float *p)
{
    float mx = sink;
    for (int j = 0; j < nk; j++) {
        const float *kj = kh + (size_t)j * ldkv;
        float d = 0.0f;
        for (int e = 0; e < hd; e++) d += qh[e] * kj[e];
        p[j] = d * scale;
        if (p[j] > mx) mx = p[j];
    }
    float sum = sink == -INFINITY ? 0.0f : expf(sink - mx);
    for (int j = 0; j < nk; j++) {
        p[j] = expf(p[j] - mx);
        sum += p[j];
    }
    memset(oh, 0, (size_t)hd * sizeof *oh);
    for (int j = 0; j < nk; j++) {
        const float *vj = vh + (size_t)j * ldkv;
        float pj = p[j];
        for (int e = 0; e < hd; e++) oh[e] += pj * vj[e];
    }
    float inv = 1.0f / sum;
    for (int e = 0; e < hd; e++) oh[e] *= inv;
    progress_bump(); /* a long sequence's attention is a long computation: a sign of life (progress.h) */
}

void attention_causal_forward_cpu(float *out, const float *q, const float *k, const float *v,
                                  const int32_t *cu_seqlens, int nseq, int nh, int nkv, int hd, float scale)
{
    attention_causal_opts_forward_cpu(out, q, k, v, cu_seqlens, nseq, nh, nkv, hd, scale, NULL);
}

void attention_causal_opts_forward_cpu(float *out, const float *q, const float *k, const float *v,
                                       const int32_t *cu_seqlens, int nseq, int nh, int nkv, int hd, float scale,
                                       const attention_opts *o)
{
    const int window = o ? o->window : 0;
    const float *sinks = o ? o->sinks : NULL;
    DF_ASSERT(nseq >= 0 && nh > 0 && nkv > 0 && nh % nkv == 0 && hd > 0 && cu_seqlens[0] == 0);
    int group = nh / nkv;
    size_t ldq = (size_t)nh * hd, ldkv = (size_t)nkv * hd;
    int maxlen = 0;
    for (int s = 0; s < nseq; s++) {
        DF_ASSERT(cu_seqlens[s + 1] >= cu_seqlens[s]);
        int len = cu_seqlens[s + 1] - cu_seqlens[s];
        if (len > maxlen) maxlen = len;
    }
    float *p = xmalloc((size_t)(maxlen ? maxlen : 1) * sizeof *p);
    for (int s = 0; s < nseq; s++) {
        int start = cu_seqlens[s], end = cu_seqlens[s + 1];
        for (int t = start; t < end; t++) {
            int k0 = window > 0 && t - window + 1 > start ? t - window + 1 : start;
            int nk = t - k0 + 1; /* keys k0..t */
            for (int h = 0; h < nh; h++) {
                const float *qh = q + (size_t)t * ldq + (size_t)h * hd;
                const float *kh = k + (size_t)k0 * ldkv + (size_t)(h / group) * hd;
                const float *vh = v + (size_t)k0 * ldkv + (size_t)(h / group) * hd;
                attention_row_sink_cpu(out + (size_t)t * ldq + (size_t)h * hd, qh, kh, vh, nk, ldkv, hd, scale,
                                       sinks ? sinks[h] : -INFINITY, p);
            }
        }
    }
    free(p);
}
