/* dflash_attention (CPU reference): block-structured attention for DFlash training, flash-attention style.
 * Per block, per head, per query slot: a score buffer over the keys the slot sees (the block's context rows first,
 * then its own block rows; all ctx_len + B of them without a window, dflash_attn_window's with one); softmax
 * statistics in double; the backward recomputes the probabilities from the saved lse (dS = p (dP - D),
 * D = dout·out). */
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
    DF_ASSERT(s->nkv > 0 && s->nh > 0 && s->nh % s->nkv == 0 && s->window >= 0);
}

/* The keys one query slot sees: ncv context rows from row cfirst, then the block rows from bfirst; nk in all. */
typedef struct slot_keys {
    int cfirst, ncv, bfirst, nk;
} slot_keys;

static slot_keys keys_of(int j, int i, int cs, int cl, const dflash_attn_shape *s)
{
    int c0, b0, b1;
    dflash_attn_window(cl, s->block_size, i, s->window, &c0, &b0, &b1);
    slot_keys k = {cs + c0, cl - c0, j * s->block_size + b0, 0};
    k.nk = k.ncv + (b1 - b0);
    return k;
}

/* Key / value row r of a slot's keys: r < ncv indexes the context rows, the rest the block's own rows. */
static inline const float *kv_row(const float *ctx, const float *blk, const slot_keys *k, int r, int ld)
{
    return r < k->ncv ? ctx + (size_t)(k->cfirst + r) * ld : blk + (size_t)(k->bfirst + r - k->ncv) * ld;
}

static inline float *kv_row_mut(float *ctx, float *blk, const slot_keys *k, int r, int ld)
{
    return r < k->ncv ? ctx + (size_t)(k->cfirst + r) * ld : blk + (size_t)(k->bfirst + r - k->ncv) * ld;
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
        const int cs = ctx_start[j], cl = ctx_len[j];
        for (int h = 0; h < nh; h++) {
            const int kh = h / grp;
            for (int i = 0; i < B; i++) {
                const slot_keys ks = keys_of(j, i, cs, cl, s);
                const int L = ks.nk;
                const size_t qi = (size_t)(j * B + i);
                const float *qr = q + qi * ldq + (size_t)h * hd;
                float mx = -INFINITY;
                for (int r = 0; r < L; r++) {
                    const float *kr = kv_row(kc, kb, &ks, r, ldk) + (size_t)kh * hd;
                    sc[r] = dot_f(qr, kr, hd) * s->scale;
                    if (sc[r] > mx) mx = sc[r];
                }
                double sum = 0.0;
                memset(acc, 0, sizeof(double) * (size_t)hd);
                for (int r = 0; r < L; r++) {
                    double p = exp((double)sc[r] - (double)mx);
                    sum += p;
                    const float *vr = kv_row(vc, vb, &ks, r, ldk) + (size_t)kh * hd;
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
        const int cs = ctx_start[j], cl = ctx_len[j];
        for (int h = 0; h < nh; h++) {
            const int kh = h / grp;
            for (int i = 0; i < B; i++) {
                const slot_keys ks = keys_of(j, i, cs, cl, s);
                const int L = ks.nk;
                const size_t qi = (size_t)(j * B + i);
                const size_t off = qi * ldq + (size_t)h * hd;
                const float *qr = q + off, *dor = dout + off;
                float *dqr = dq + off;
                const float D = dot_f(dor, out + off, hd);
                const float l = lse[qi * nh + h];
                memset(dqr, 0, sizeof(float) * (size_t)hd);
                for (int r = 0; r < L; r++) {
                    const size_t kofs = (size_t)kh * hd;
                    const float *kr = kv_row(kc, kb, &ks, r, ldk) + kofs;
                    const float *vr = kv_row(vc, vb, &ks, r, ldk) + kofs;
                    float *dkr = kv_row_mut(dkc, dkb, &ks, r, ldk) + kofs;
                    float *dvr = kv_row_mut(dvc, dvb, &ks, r, ldk) + kofs;
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
