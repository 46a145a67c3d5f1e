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
    float mx = -INFINITY;
    for (int j = 0; j < nk; j++) {
        const float *kj = kh + (size_t)j * ldkv;
        float d = 0.0f;
        for (int e = 0; e < hd; e++) d += qh[e] * kj[e];
        p[j] = d * scale;
        if (p[j] > mx) mx = p[j];
    }
    float sum = 0.0f;
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
            int nk = t - start + 1; /* keys start..t */
            for (int h = 0; h < nh; h++) {
                const float *qh = q + (size_t)t * ldq + (size_t)h * hd;
                const float *kh = k + (size_t)start * ldkv + (size_t)(h / group) * hd;
                const float *vh = v + (size_t)start * ldkv + (size_t)(h / group) * hd;
                attention_row_cpu(out + (size_t)t * ldq + (size_t)h * hd, qh, kh, vh, nk, ldkv, hd, scale, p);
            }
        }
    }
    free(p);
}
