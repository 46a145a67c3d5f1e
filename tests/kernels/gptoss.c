/* gpt-oss's kernel options. CPU: the attention references with sink logits and a sliding window (packed, and against
 * a KV cache: the same bits) against a direct double softmax over the masked scores, the plain kernel's bits without
 * either; the MoE GEMMs' expert biases and clamped SwiGLU epilogue against double sums; bias_add; the clamped SwiGLU
 * on chosen values. CUDA against those references on the same bf16-exact inputs: the causal flash attention (head_dim
 * 16 and 64) and its scalar path (head_dim 40) with sinks and windows (none, 5: shorter than the sequences and than a
 * key tile, 100: longer than some), the KV-cache attention with the same, the grouped MoE GEMMs (gate pre-activations
 * past the clamp), bias_add on bf16 and (exactly) fp32 rows. The GPU output is bf16 (one rounding of an fp32 result):
 * tolerances 1e-2 on the relative norm and the max error. YaRN's frequency table is a rope_inv_freq regime
 * (rope_attention.c). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "bias_add.h"
#include "kv_attention.h"
#include "moe_gemm.h"
#include "moe_group.h"
#include "swiglu.h"
#include "tests/kernel_cases.h"
#include "tests/test.h"
#include "util.h"

#define TOL 1e-2

/* the sink logit of head h (nh > 4 repeats them) */
static float sink_of(int h)
{
    static const float s[4] = {1.5f, -2.0f, 4.0f, 0.0f};
    return s[h % 4];
}

static int32_t *cu_of(const kc_case *c, int *T, int *maxlen)
{
    int32_t *cu = xmalloc(sizeof(int32_t) * (size_t)(c->nseqs + 1));
    int m = 0;
    cu[0] = 0;
    for (int s = 0; s < c->nseqs; s++) cu[s + 1] = cu[s] + c->seqs[s], m = c->seqs[s] > m ? c->seqs[s] : m;
    *T = cu[c->nseqs];
    *maxlen = m;
    return cu;
}

/* ---- attention with sinks and a window: nh nkv hd window sinks, seqs ---- */

/* Direct: row t of a sequence starting at `start`, head h: softmax over [scores of keys max(start, t-W+1)..t, sink]
 * in double, the sink dropped. s: scratch of t - start + 1 scores. */
static void direct(double *o, double *s, const float *q, const float *k, const float *v, int t, int start, int W,
                   int nh, int nkv, int hd, int h, float scale, const float *sinks)
{
    const int g = nh / nkv, k0 = W > 0 && t - W + 1 > start ? t - W + 1 : start;
    double mx = sinks ? sinks[h] : -INFINITY, sum = 0;
    for (int j = k0; j <= t; j++) {
        double d = 0;
        for (int e = 0; e < hd; e++)
            d += (double)q[(size_t)t * nh * hd + h * hd + e] * k[(size_t)j * nkv * hd + h / g * hd + e];
        s[j - k0] = d * scale;
        if (s[j - k0] > mx) mx = s[j - k0];
    }
    if (sinks) sum += exp(sinks[h] - mx);
    for (int j = k0; j <= t; j++) sum += exp(s[j - k0] - mx);
    for (int e = 0; e < hd; e++) o[e] = 0;
    for (int j = k0; j <= t; j++)
        for (int e = 0; e < hd; e++) o[e] += exp(s[j - k0] - mx) / sum * v[(size_t)j * nkv * hd + h / g * hd + e];
}

/* attention_causal_opts_forward_cpu against direct(); kv_attention_opts_forward_cpu on the same rows placed in a cache
 * gives the same bits. Without window and sinks: the plain kernel's bits, and sinks of 3 shrink the output of the
 * first one-token sequence (v · 1/(1 + e^(3-s))). */
static void attention_opts_cpu_check(const kc_case *c)
{
    const int nh = c->p[0], nkv = c->p[1], hd = c->p[2], W = c->p[3], with_sinks = c->p[4], nseq = c->nseqs;
    int T, maxlen;
    int32_t *cu = cu_of(c, &T, &maxlen);
    const size_t nq = (size_t)T * nh * hd, nk = (size_t)T * nkv * hd;
    float *q = rnd_floats(nq, 2.0), *k = rnd_floats(nk, 2.0), *v = rnd_floats(nk, 1.0);
    float *o = xmalloc(sizeof(float) * nq), *o2 = xmalloc(sizeof(float) * nq), *sinks = xmalloc(sizeof(float) * nh);
    for (int h = 0; h < nh; h++) sinks[h] = sink_of(h);
    const float scale = 1.0f / sqrtf((float)hd);
    const attention_opts op = {.window = W, .sinks = with_sinks ? sinks : NULL};
    attention_causal_opts_forward_cpu(o, q, k, v, cu, nseq, nh, nkv, hd, scale, &op);
    double worst = 0, *ref = xmalloc(sizeof(double) * (size_t)hd), *s = xmalloc(sizeof(double) * (size_t)maxlen);
    for (int sq = 0; sq < nseq; sq++)
        for (int t = cu[sq]; t < cu[sq + 1]; t++)
            for (int h = 0; h < nh; h++) {
                direct(ref, s, q, k, v, t, cu[sq], W, nh, nkv, hd, h, scale, op.sinks);
                for (int e = 0; e < hd; e++) worst = fmax(worst, fabs(ref[e] - o[(size_t)t * nh * hd + h * hd + e]));
            }
    EXPECT(worst < 1e-6);
    if (!(worst < 1e-6)) fprintf(stderr, "  max |packed - direct| = %g\n", worst);
    /* the KV-cache reference: the same rows at their positions of one cache sequence each */
    const size_t stride = (size_t)(maxlen + 10) * nkv * hd;
    float *kc = xcalloc((size_t)nseq * stride, sizeof(float)), *vc = xcalloc((size_t)nseq * stride, sizeof(float));
    int32_t *seqs = xmalloc(sizeof(int32_t) * (size_t)T), *pos = xmalloc(sizeof(int32_t) * (size_t)T);
    for (int sq = 0; sq < nseq; sq++)
        for (int t = cu[sq]; t < cu[sq + 1]; t++) seqs[t] = sq, pos[t] = t - cu[sq];
    kv_cache_append_cpu(kc, vc, stride, k, nkv * hd, v, nkv * hd, seqs, pos, T, nkv * hd);
    kv_attention_opts_forward_cpu(o2, nh * hd, q, nh * hd, kc, vc, stride, seqs, pos, T, nh, nkv, hd, scale, &op);
    EXPECT(!memcmp(o, o2, sizeof(float) * nq));
    if (W == 0 && !with_sinks) {
        attention_causal_forward_cpu(o2, q, k, v, cu, nseq, nh, nkv, hd, scale);
        EXPECT(!memcmp(o, o2, sizeof(float) * nq));
        float *threes = xmalloc(sizeof(float) * nh);
        for (int h = 0; h < nh; h++) threes[h] = 3;
        attention_causal_opts_forward_cpu(o, q, k, v, cu, nseq, nh, nkv, hd, scale, &(attention_opts){.sinks = threes});
        int one = -1;
        for (int sq = nseq - 1; sq >= 0; sq--)
            if (c->seqs[sq] == 1) one = cu[sq];
        REQUIRE(one >= 0); /* the rows give this check a one-token sequence */
        EXPECT(fabsf(o[(size_t)one * nh * hd]) < fabsf(o2[(size_t)one * nh * hd]));
        free(threes);
    }
    free(cu), free(q), free(k), free(v), free(o), free(o2), free(sinks), free(ref), free(s), free(kc), free(vc);
    free(seqs), free(pos);
}

/* ---- the MoE GEMMs with gpt-oss's options: T K E H Im (no shared expert) ---- */

/* T tokens' K distinct picks of E experts (for K <= E/3), every expert in use */
static int32_t *opts_picks(int T, int K, int E)
{
    int32_t *sel = xmalloc(sizeof(int32_t) * (size_t)T * K);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) sel[t * K + j] = (t * 7 + j * 3) % E;
    return sel;
}

/* moe_gemm_gate_up_opts_cpu (bias, clamped SwiGLU alpha 1.702 limit 7) and moe_gemm_down_opts_cpu (bias) against
 * double sums over moe_group_cpu's rows; some gate pre-activation reaches the clamp. */
static void moe_gemm_opts_cpu_check(const kc_case *c)
{
    const int T = c->p[0], K = c->p[1], E = c->p[2], H = c->p[3], Im = c->p[4];
    const int TK = T * K, R = TK, lda = Im + 8, mt = moe_group_max_tiles(TK, E, 0, MOE_GEMM_BM);
    int32_t *sel = opts_picks(T, K, E);
    float *x = rnd_floats((size_t)T * H, 2.0), *wgu = rnd_floats((size_t)E * 2 * Im * H, 8.0 / sqrt((double)H));
    float *wd = rnd_floats((size_t)E * H * Im, 1.0 / sqrt((double)Im));
    float *bgu = rnd_floats((size_t)E * 2 * Im, 1.0), *bd = rnd_floats((size_t)E * H, 1.0);
    int32_t *off = xmalloc(sizeof(int32_t) * (size_t)(E + 2)), *rt = xmalloc(sizeof(int32_t) * (size_t)R);
    int32_t *sr = xmalloc(sizeof(int32_t) * (size_t)TK), *tl = xmalloc(sizeof(int32_t) * 3 * (size_t)mt);
    moe_group_cpu(sel, T, K, E, 0, MOE_GEMM_BM, off, rt, sr, tl);
    const moe_gemm_opts ogu = {.bias = bgu, .alpha = 1.702f, .limit = 7.0f}, odn = {.bias = bd};
    float *act = xcalloc((size_t)R * lda, sizeof(float)), *ys = xcalloc((size_t)R * H, sizeof(float));
    moe_gemm_gate_up_opts_cpu(act, lda, x, H, rt, off, E, H, Im, 0, wgu, NULL, &ogu);
    moe_gemm_down_opts_cpu(ys, H, act, lda, off, E, H, Im, 0, wd, NULL, &odn);
    double ea = 0, ma = 0, ey = 0, my = 0;
    int clamped = 0;
    for (int g = 0; g < E; g++)
        for (int r = off[g]; r < off[g + 1]; r++) {
            const float *xr = x + (size_t)rt[r] * H, *Wg = wgu + (size_t)g * 2 * Im * H, *Wd = wd + (size_t)g * H * Im;
            for (int j = 0; j < Im; j++) {
                double gs = bgu[g * 2 * Im + j], us = bgu[g * 2 * Im + Im + j];
                for (int e = 0; e < H; e++)
                    gs += (double)xr[e] * Wg[(size_t)j * H + e], us += (double)xr[e] * Wg[(size_t)(Im + j) * H + e];
                clamped += gs > 7.0;
                gs = fmin(gs, 7.0), us = fmax(fmin(us, 7.0), -7.0);
                double a = (us + 1) * gs / (1.0 + exp(-1.702 * gs));
                ea = fmax(ea, fabs(act[(size_t)r * lda + j] - a)), ma = fmax(ma, fabs(a));
            }
            for (int n = 0; n < H; n++) {
                double y = bd[g * H + n];
                for (int j = 0; j < Im; j++) y += (double)act[(size_t)r * lda + j] * Wd[(size_t)n * Im + j];
                ey = fmax(ey, fabs(ys[(size_t)r * H + n] - y)), my = fmax(my, fabs(y));
            }
        }
    EXPECT(clamped > 0);
    EXPECT(ea <= 1e-5 * fmax(1.0, ma));
    EXPECT(ey <= 1e-5 * fmax(1.0, my));
    if (test_failed_here)
        fprintf(stderr, "  act err %g (max %g), y err %g (max %g), %d clamped\n", ea, ma, ey, my, clamped);
    free(sel), free(x), free(wgu), free(wd), free(bgu), free(bd), free(off), free(rt), free(sr), free(tl), free(act);
    free(ys);
}

/* ---- bias_add: rows n ld ---- */

/* x += b on the first n columns of every row, the same float sums; columns past n and b NULL leave x as it was */
static void bias_add_cpu_check(const kc_case *c)
{
    const int rows = c->p[0], n = c->p[1], ld = c->p[2];
    const size_t nx = (size_t)rows * ld;
    float *x = rnd_floats(nx, 2.0), *b = rnd_floats((size_t)n, 1.0), *y = dup_floats(x, nx);
    bias_add_cpu(y, ld, rows, n, b);
    int bad = 0;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < ld; i++) {
            const float want = i < n ? x[(size_t)r * ld + i] + b[i] : x[(size_t)r * ld + i];
            bad += memcmp(&want, &y[(size_t)r * ld + i], sizeof want) != 0;
        }
    EXPECT(bad == 0);
    memcpy(y, x, nx * sizeof *y);
    bias_add_cpu(y, ld, rows, n, NULL);
    EXPECT(!memcmp(x, y, nx * sizeof *y));
    free(x), free(b), free(y);
}

/* ---- swiglu_clamped_forward (no shape: chosen values at the clamp's edges) ---- */

static void swiglu_clamped_cpu_check(const kc_case *c)
{
    (void)c;
    const float gate[] = {0.0f, 1.0f, -2.0f, 7.0f, 10.0f, 3.0f, 3.0f, -30.0f};
    const float up[] = {0.0f, 0.5f, 1.0f, 2.0f, 2.0f, 9.0f, -9.0f, 1.0f};
    float out[8];
    swiglu_clamped_forward_cpu(out, gate, up, 8, 1.702f, 7.0f);
    for (int i = 0; i < 8; i++) {
        double g = fmin(gate[i], 7.0), u = fmax(fmin(up[i], 7.0), -7.0);
        EXPECT_NEAR(out[i], (u + 1) * g / (1 + exp(-1.702 * g)), 1e-6 * fmax(1, fabs(out[i])));
    }
    EXPECT(out[3] == out[4]);                       /* the gate is clamped above at 7 */
    EXPECT_NEAR(out[5], -out[6] * 8.0 / 6.0, 1e-5); /* up clamped to +-7: (7+1) vs (-7+1) */
    EXPECT(out[7] > -1e-15f && out[7] <= 0.0f);     /* no clamp below: -30 * sigmoid(-51) */
    /* aliasing: out = gate */
    float g2[8];
    memcpy(g2, gate, sizeof g2);
    swiglu_clamped_forward_cpu(g2, g2, up, 8, 1.702f, 7.0f);
    EXPECT(!memcmp(g2, out, sizeof out));
}

#ifdef DFLASH_CUDA
static void cmp_dev(const char *name, const uint16_t *d, const float *ref, size_t n)
{
    uint16_t *h = dev_get(d, n * 2);
    compare_bf16(name, h, ref, n, TOL, TOL);
    free(h);
}

/* Packed attention over the row's sequences and, for the same rows placed in a cache, the KV-cache attention; window
 * W, sinks on or off. nh nkv hd window sinks */
static void attention_opts_cuda_check(const kc_case *c)
{
    const int nh = c->p[0], nkv = c->p[1], hd = c->p[2], W = c->p[3], with_sinks = c->p[4], nseq = c->nseqs;
    const int qd = nh * hd, kd = nkv * hd;
    int T, maxlen;
    int32_t *cu = cu_of(c, &T, &maxlen);
    float *qf = xmalloc(sizeof(float) * T * qd), *kf = xmalloc(sizeof(float) * T * kd);
    float *vf = xmalloc(sizeof(float) * T * kd), *ref = xmalloc(sizeof(float) * T * qd);
    uint16_t *qh = rnd_bf16((size_t)T * qd, 2.0, qf), *kh = rnd_bf16((size_t)T * kd, 2.0, kf);
    uint16_t *vh = rnd_bf16((size_t)T * kd, 1.0, vf);
    float *sinks = xmalloc(sizeof(float) * nh);
    for (int h = 0; h < nh; h++) sinks[h] = sink_of(h);
    const float scale = 1.0f / sqrtf((float)hd);
    const attention_opts o = {.window = W, .sinks = with_sinks ? sinks : NULL};
    attention_causal_opts_forward_cpu(ref, qf, kf, vf, cu, nseq, nh, nkv, hd, scale, &o);
    uint16_t *dq = dev_upload(qh, (size_t)T * qd * 2), *dk = dev_upload(kh, (size_t)T * kd * 2);
    uint16_t *dv = dev_upload(vh, (size_t)T * kd * 2), *dout = dev_poisoned((size_t)T * qd);
    int32_t *dcu = dev_upload(cu, sizeof(int32_t) * (size_t)(nseq + 1));
    float *dsinks = with_sinks ? dev_upload(sinks, sizeof(float) * nh) : NULL;
    attention_causal_opts_forward_cuda(dout, qd, dq, qd, dk, kd, dv, kd, dcu, nseq, maxlen, nh, nkv, hd, scale, W,
                                       dsinks, stream);
    char name[160];
    snprintf(name, sizeof name, "attention_opts hd=%d window=%d sinks=%d%s", hd, W, with_sinks,
             hd % 16 ? " (scalar path)" : "");
    cmp_dev(name, dout, ref, (size_t)T * qd);
    /* the KV cache: sequence s's rows at positions 0.. of cache sequence s (10 rows to spare) */
    int32_t *seq = xmalloc(sizeof(int32_t) * T), *pos = xmalloc(sizeof(int32_t) * T);
    for (int s = 0; s < nseq; s++)
        for (int t = cu[s]; t < cu[s + 1]; t++) seq[t] = s, pos[t] = t - cu[s];
    const int cap = maxlen + 10;
    const size_t stride = (size_t)cap * kd;
    uint16_t *dkc = dev_upload(NULL, nseq * stride * 2), *dvc = dev_upload(NULL, nseq * stride * 2);
    int32_t *dseq = dev_upload(seq, sizeof(int32_t) * T), *dpos = dev_upload(pos, sizeof(int32_t) * T);
    float *ws = dev_upload(NULL, kv_attention_workspace_bytes(T, nh, hd, cap - 1));
    CHECK_CUDA(cudaMemset(ws, 0, kv_attention_workspace_bytes(T, nh, hd, cap - 1))); /* its counters start at 0 */
    kv_cache_append_cuda(dkc, dvc, stride, dk, kd, dv, kd, dseq, dpos, T, kd, stream);
    uint16_t *dout2 = dev_poisoned((size_t)T * qd);
    kv_attention_opts_forward_cuda(dout2, qd, dq, qd, dkc, dvc, stride, dseq, dpos, T, maxlen - 1, nh, nkv, hd, scale,
                                   W, dsinks, ws, stream);
    snprintf(name, sizeof name, "kv_attention_opts hd=%d window=%d sinks=%d", hd, W, with_sinks);
    cmp_dev(name, dout2, ref, (size_t)T * qd);
    void *d[] = {dq, dk, dv, dout, dcu, dkc, dvc, dseq, dpos, ws, dout2};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) CHECK_CUDA(cudaFree(d[i]));
    if (dsinks) CHECK_CUDA(cudaFree(dsinks));
    free(cu), free(qf), free(kf), free(vf), free(ref), free(qh), free(kh), free(vh), free(sinks), free(seq), free(pos);
}

/* The grouped GEMMs with gpt-oss's options on the device schedule, against moe_gemm_*_opts_cpu on the same bf16
 * values (the down GEMM on the GPU's act). T K E H Im */
static void moe_gemm_opts_cuda_check(const kc_case *c)
{
    const int T = c->p[0], K = c->p[1], E = c->p[2], H = c->p[3], Im = c->p[4];
    const int TK = T * K, R = TK, lda = Im + 8, mt = moe_group_max_tiles(TK, E, 0, MOE_GEMM_BM);
    int32_t *sel = opts_picks(T, K, E);
    float *xf = xmalloc(sizeof(float) * (size_t)T * H), *wgu = xmalloc(sizeof(float) * (size_t)E * 2 * Im * H);
    float *wd = xmalloc(sizeof(float) * (size_t)E * H * Im);
    float *bgu = xmalloc(sizeof(float) * (size_t)E * 2 * Im), *bd = xmalloc(sizeof(float) * (size_t)E * H);
    uint16_t *xh = rnd_bf16((size_t)T * H, 2.0, xf);
    uint16_t *wguh = rnd_bf16((size_t)E * 2 * Im * H, 8.0 / sqrt((double)H), wgu); /* gate/up past +-7 often */
    uint16_t *wdh = rnd_bf16((size_t)E * H * Im, 1.0 / sqrt((double)Im), wd);
    for (int i = 0; i < E * 2 * Im; i++) bgu[i] = (float)rnd_uniform();
    for (int i = 0; i < E * H; i++) bd[i] = (float)rnd_uniform();
    int32_t *off = xmalloc(sizeof(int32_t) * (size_t)(E + 2)), *rt = xmalloc(sizeof(int32_t) * (size_t)R);
    int32_t *sr = xmalloc(sizeof(int32_t) * (size_t)TK), *tl = xmalloc(sizeof(int32_t) * 3 * (size_t)mt);
    moe_group_cpu(sel, T, K, E, 0, MOE_GEMM_BM, off, rt, sr, tl);
    const moe_gemm_opts ogu = {.bias = bgu, .alpha = 1.702f, .limit = 7.0f}, odn = {.bias = bd};
    float *act = xcalloc((size_t)R * lda, sizeof(float)), *ys = xcalloc((size_t)R * H, sizeof(float));
    moe_gemm_gate_up_opts_cpu(act, lda, xf, H, rt, off, E, H, Im, 0, wgu, NULL, &ogu);
    int clamped = 0;
    for (int e = 0; e < E; e++) /* some gate pre-activation past the limit (the clamp is exercised) */
        for (int r = off[e]; r < off[e + 1]; r++)
            for (int j = 0; j < Im; j++) {
                float g = bgu[e * 2 * Im + j];
                for (int k = 0; k < H; k++) g += xf[(size_t)rt[r] * H + k] * wgu[((size_t)e * 2 * Im + j) * H + k];
                clamped += g > 7.0f;
            }
    int32_t *dsel = dev_upload(sel, sizeof(int32_t) * (size_t)TK), *doff = dev_upload(NULL, sizeof(int32_t) * (size_t)(E + 2));
    int32_t *drt = dev_upload(NULL, sizeof(int32_t) * (size_t)R), *dsr = dev_upload(NULL, sizeof(int32_t) * (size_t)TK);
    int32_t *dtl = dev_upload(NULL, sizeof(int32_t) * 3 * (size_t)mt), *dnt = dev_upload(NULL, sizeof(int32_t));
    void *work = dev_upload(NULL, moe_group_cuda_workspace(TK, E));
    uint16_t *dx = dev_upload(xh, (size_t)T * H * 2), *dwgu = dev_upload(wguh, (size_t)E * 2 * Im * H * 2);
    uint16_t *dwd = dev_upload(wdh, (size_t)E * H * Im * 2);
    float *dbgu = dev_upload(bgu, sizeof(float) * (size_t)E * 2 * Im), *dbd = dev_upload(bd, sizeof(float) * (size_t)E * H);
    uint16_t *dact = dev_poisoned((size_t)R * lda), *dys = dev_poisoned((size_t)R * H);
    moe_group_cuda(dsel, T, K, E, 0, MOE_GEMM_BM, doff, drt, dsr, dtl, dnt, work, stream);
    const moe_gemm_opts dgu = {.bias = dbgu, .alpha = 1.702f, .limit = 7.0f}, ddn = {.bias = dbd};
    moe_gemm_gate_up_opts_cuda(dact, lda, dx, H, drt, dtl, dnt, mt, E, H, Im, 0, dwgu, NULL, &dgu, stream);
    moe_gemm_down_opts_cuda(dys, H, dact, lda, dtl, dnt, mt, E, H, Im, 0, dwd, NULL, &ddn, stream);
    uint16_t *gact = dev_get(dact, (size_t)R * lda * 2), *ga = xmalloc(sizeof(uint16_t) * (size_t)R * Im);
    float *ra = xmalloc(sizeof(float) * (size_t)R * Im), *gaf = xmalloc(sizeof(float) * (size_t)R * lda);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < Im; j++) ga[r * Im + j] = gact[(size_t)r * lda + j], ra[r * Im + j] = act[(size_t)r * lda + j];
    char name[160];
    snprintf(name, sizeof name, "moe_gemm_gate_up bias+clamped swiglu T=%d K=%d E=%d H=%d Im=%d (%d clamped)", T, K,
             E, H, Im, clamped);
    compare_bf16(name, ga, ra, (size_t)R * Im, TOL, TOL);
    if (!clamped) {
        printf("FAIL moe_gemm_gate_up: no gate pre-activation reached the clamp\n");
        failures++;
    }
    for (size_t i = 0; i < (size_t)R * lda; i++) gaf[i] = bf16_to_f32(gact[i]);
    moe_gemm_down_opts_cpu(ys, H, gaf, lda, off, E, H, Im, 0, wd, NULL, &odn);
    snprintf(name, sizeof name, "moe_gemm_down bias T=%d K=%d E=%d H=%d Im=%d", T, K, E, H, Im);
    cmp_dev(name, dys, ys, (size_t)R * H);
    void *d[] = {dsel, doff, drt, dsr, dtl, dnt, work, dx, dwgu, dwd, dbgu, dbd, dact, dys};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) CHECK_CUDA(cudaFree(d[i]));
    free(sel), free(xf), free(wgu), free(wd), free(bgu), free(bd), free(xh), free(wguh), free(wdh), free(off), free(rt);
    free(sr), free(tl), free(act), free(ys), free(gact), free(ga), free(ra), free(gaf);
}

/* bias_add_bf16_cuda against bias_add_cpu (one bf16 rounding), bias_add_f32_cuda exactly. rows n ld */
static void bias_add_cuda_check(const kc_case *c)
{
    const int rows = c->p[0], n = c->p[1], ld = c->p[2];
    float *xf = xmalloc(sizeof(float) * rows * ld), *b = xmalloc(sizeof(float) * n);
    uint16_t *xh = rnd_bf16((size_t)rows * ld, 2.0, xf);
    for (int i = 0; i < n; i++) b[i] = (float)rnd_uniform();
    uint16_t *dx = dev_upload(xh, (size_t)rows * ld * 2);
    float *db = dev_upload(b, sizeof(float) * n), *dxf = dev_upload(xf, sizeof(float) * rows * ld);
    bias_add_bf16_cuda(dx, ld, rows, n, db, stream);
    bias_add_f32_cuda(dxf, ld, rows, n, db, stream);
    bias_add_cpu(xf, ld, rows, n, b);
    char name[160];
    snprintf(name, sizeof name, "bias_add_bf16 rows=%d n=%d ld=%d", rows, n, ld);
    cmp_dev(name, dx, xf, (size_t)rows * ld);
    float *g = dev_get(dxf, sizeof(float) * rows * ld);
    const int same = !memcmp(g, xf, sizeof(float) * rows * ld);
    printf("%s bias_add_f32 rows=%d n=%d ld=%d: %s\n", same ? "ok" : "FAIL", rows, n, ld, same ? "exact" : "differs");
    if (!same) failures++;
    CHECK_CUDA(cudaFree(dx));
    CHECK_CUDA(cudaFree(db));
    CHECK_CUDA(cudaFree(dxf));
    free(xf), free(b), free(xh), free(g);
}
#endif

const kc_op kc_attention_opts = {"attention_opts", "bf16", "nh nkv hd window sinks", attention_opts_cpu_check,
                                 KC_CUDA(attention_opts_cuda_check)};
const kc_op kc_moe_gemm_opts = {"moe_gemm_opts", "bf16 (bias f32)", "T K E H Im", moe_gemm_opts_cpu_check,
                                KC_CUDA(moe_gemm_opts_cuda_check)};
const kc_op kc_bias_add = {"bias_add", "bf16|f32 (bias f32)", "rows n ld", bias_add_cpu_check,
                           KC_CUDA(bias_add_cuda_check)};
const kc_op kc_swiglu_clamped = {"swiglu_clamped_forward", "f32", "", swiglu_clamped_cpu_check, NULL};
