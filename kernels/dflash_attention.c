/* dflash_attention (CPU reference): block-structured attention for DFlash training, flash-attention style.
 * Per block, per head, per query slot: a score buffer of length ctx_len + B over the visible keys (the block's
 * context rows first, then its own B block rows); softmax statistics in double; the backward recomputes the
 * probabilities from the saved lse (dS = p (dP - D), D = dout·out). */
#include "dflash_attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static float dot_f(const float *a, const float *b, int n)
{
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

static int max_ctx_len(const int32_t *ctx_start, const int32_t *ctx_len, int n)
{
    int m = 0;
    for (int j = 0; j < n; j++) {
        DF_ASSERT(ctx_start[j] >= 0 && ctx_len[j] >= 0);
        if (ctx_len[j] > m) m = ctx_len[j];
    }
    return m;
}

static void check_shape(const dflash_attn_shape *s)
{
    DF_ASSERT(s->nblocks >= 0 && s->block_size > 0 && s->hd > 0);
    DF_ASSERT(s->nkv > 0 && s->nh > 0 && s->nh % s->nkv == 0);
}

/* Key / value row r of block j: r < clen indexes the context rows, the rest the block's own rows. */
static inline const float *kv_row(const float *ctx, const float *blk, int j, int r, int cstart, int clen, int B,
                                  int ld)
{
    return r < clen ? ctx + (size_t)(cstart + r) * ld : blk + (size_t)(j * B + r - clen) * ld;
}

static inline float *kv_row_mut(float *ctx, float *blk, int j, int r, int cstart, int clen, int B, int ld)
{
    return r < clen ? ctx + (size_t)(cstart + r) * ld : blk + (size_t)(j * B + r - clen) * ld;
}

void dflash_attention_forward_cpu(float *out, float *lse, const float *q, const float *kc, const float *vc,
                                  const float *kb, const float *vb, const int32_t *ctx_start,
                                  const int32_t *ctx_len, const dflash_attn_shape *s)
{
    check_shape(s);
    const int N = s->nblocks, B = s->block_size, nh = s->nh, hd = s->hd, grp = s->nh / s->nkv;
    const int ldq = nh * hd, ldk = s->nkv * hd;
    int maxc = max_ctx_len(ctx_start, ctx_len, N);
    float *sc = xmalloc(sizeof(float) * (size_t)(maxc + B));
    double *acc = xmalloc(sizeof(double) * (size_t)hd);

    for (int j = 0; j < N; j++) {
        const int cs = ctx_start[j], cl = ctx_len[j], L = cl + B;
        for (int h = 0; h < nh; h++) {
            const int kh = h / grp;
            for (int i = 0; i < B; i++) {
                const size_t qi = (size_t)(j * B + i);
                const float *qr = q + qi * ldq + (size_t)h * hd;
                float mx = -INFINITY;
                for (int r = 0; r < L; r++) {
                    const float *kr = kv_row(kc, kb, j, r, cs, cl, B, ldk) + (size_t)kh * hd;
                    sc[r] = dot_f(qr, kr, hd) * s->scale;
                    if (sc[r] > mx) mx = sc[r];
                }
                double sum = 0.0;
                memset(acc, 0, sizeof(double) * (size_t)hd);
                for (int r = 0; r < L; r++) {
                    double p = exp((double)sc[r] - (double)mx);
                    sum += p;
                    const float *vr = kv_row(vc, vb, j, r, cs, cl, B, ldk) + (size_t)kh * hd;
                    for (int d = 0; d < hd; d++) acc[d] += p * vr[d];
                }
                float *orow = out + qi * ldq + (size_t)h * hd;
                for (int d = 0; d < hd; d++) orow[d] = (float)(acc[d] / sum);
                lse[qi * nh + h] = (float)((double)mx + log(sum));
            }
        }
    }
    free(acc);
    free(sc);
}

void dflash_attention_backward_cpu(float *dq, float *dkc, float *dvc, float *dkb, float *dvb, const float *dout,
                                   const float *out, const float *lse, const float *q, const float *kc,
                                   const float *vc, const float *kb, const float *vb, const int32_t *ctx_start,
                                   const int32_t *ctx_len, const dflash_attn_shape *s)
{
    check_shape(s);
    const int N = s->nblocks, B = s->block_size, nh = s->nh, hd = s->hd, grp = s->nh / s->nkv;
    const int ldq = nh * hd, ldk = s->nkv * hd;
    const float scale = s->scale;

    for (int j = 0; j < N; j++) {
        DF_ASSERT(ctx_start[j] >= 0 && ctx_len[j] >= 0);
        const int cs = ctx_start[j], cl = ctx_len[j], L = cl + B;
        for (int h = 0; h < nh; h++) {
            const int kh = h / grp;
            for (int i = 0; i < B; i++) {
                const size_t qi = (size_t)(j * B + i);
                const size_t off = qi * ldq + (size_t)h * hd;
                const float *qr = q + off, *dor = dout + off;
                float *dqr = dq + off;
                const float D = dot_f(dor, out + off, hd);
                const float l = lse[qi * nh + h];
                memset(dqr, 0, sizeof(float) * (size_t)hd);
                for (int r = 0; r < L; r++) {
                    const size_t kofs = (size_t)kh * hd;
                    const float *kr = kv_row(kc, kb, j, r, cs, cl, B, ldk) + kofs;
                    const float *vr = kv_row(vc, vb, j, r, cs, cl, B, ldk) + kofs;
                    float *dkr = kv_row_mut(dkc, dkb, j, r, cs, cl, B, ldk) + kofs;
                    float *dvr = kv_row_mut(dvc, dvb, j, r, cs, cl, B, ldk) + kofs;
                    const float p = expf(dot_f(qr, kr, hd) * scale - l);
                    const float dp = dot_f(dor, vr, hd);
                    const float ds = p * (dp - D) * scale;
                    for (int d = 0; d < hd; d++) {
                        dvr[d] += p * dor[d];
                        dqr[d] += ds * kr[d];
                        dkr[d] += ds * qr[d];
                    }
                }
            }
        }
    }
}
