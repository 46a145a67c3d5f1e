/* Rotary embeddings and causal attention of the target: rope_inv_freq (plain, Llama-3, YaRN), rope_apply (the
 * formula, its inverse, its backward by finite differences), qk_norm_rope (the fused per-head RMSNorm + rope, forward
 * and backward; partial rotary) and attention_causal_forward (packed sequences, GQA) against a dense-mask double
 * reference on the CPU; the CUDA kernels against the CPU references on the same bf16 values, the Hopper attention
 * (attention_wgmma, attention_sm90.cu) by name with its staging and the dispatch bitwise equal to it. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "qk_norm_rope.h"
#include "rope.h"
#include "tests/kernel_cases.h"
#include "tests/test.h"
#include "util.h"

/* ---- rope_inv_freq: regime (0 RoPE, 1 Llama-3, 2 YaRN, 3 YaRN truncated) ---- */

/* YaRN: gpt-oss-20b's correction range is dims [8.09, 17.39] of 32 (theta 150000, 64 dims, 4096 positions, beta 32
 * and 1, not truncated): below it the frequencies are RoPE's, above it divided by 32, a linear blend between;
 * truncated, the range widens to whole dimensions [8, 18]. */
static void rope_inv_freq_yarn_check(int truncate)
{
    rope_params p = {.theta = 150000, .yarn = 1, .factor = 32, .original_max_position = 4096, .beta_fast = 32,
                     .beta_slow = 1, .truncate = truncate};
    double inv[32];
    rope_inv_freq(inv, 64, &p);
    if (truncate) {
        EXPECT(inv[8] == 1.0 / pow(150000.0, 16.0 / 64));
        EXPECT_NEAR(inv[13], 1.0 / pow(150000.0, 26.0 / 64) * (0.5 + 0.5 / 32), 1e-15);
        return;
    }
    const double low = 64 * log(4096 / (32 * 2 * M_PI)) / (2 * log(150000.0));
    const double high = 64 * log(4096 / (1 * 2 * M_PI)) / (2 * log(150000.0));
    EXPECT(low > 8 && low < 9 && high > 17 && high < 18);
    for (int i = 0; i < 32; i++) {
        double base = 1.0 / pow(150000.0, 2.0 * i / 64), r = (i - low) / (high - low);
        r = r < 0 ? 0 : r > 1 ? 1 : r;
        EXPECT_NEAR(inv[i], base * (1 - r) + base / 32 * r, 1e-15 * base);
        if (i <= 8) EXPECT(inv[i] == base);
        if (i >= 18) EXPECT_NEAR(inv[i], base / 32, 1e-16 * base);
        if (i >= 9 && i <= 17) EXPECT(inv[i] < base && inv[i] > base / 32);
    }
}

static void rope_inv_freq_cpu_check(const kc_case *c)
{
    if (c->p[0] >= 2) {
        rope_inv_freq_yarn_check(c->p[0] == 3);
        return;
    }
    if (!c->p[0]) {
        rope_params p = {.theta = 1e6};
        double inv[11];
        rope_inv_freq(inv, 22, &p);
        for (int i = 0; i < 11; i++) EXPECT_NEAR(inv[i], exp(-(2.0 * i / 22) * log(1e6)), 1e-15);
        return;
    }
    /* Llama-3.x: factor 8, low 1, high 4, original 8192, theta 500000, d 128. Wavelength 2π/inv: below 2048
     * unchanged (i <= 28), above 8192 divided by 8 (i >= 35), smoothly blended between (i 29..34). Values
     * computed by hand from the transformers formula. */
    rope_params p = {.theta = 500000.0, .llama3 = 1, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                     .original_max_position = 8192};
    double inv[64];
    rope_inv_freq(inv, 128, &p);
    struct { int i; double v; } want[] = {
        {0, 1.0},                                      /* high frequency: unchanged */
        {28, 0.0032114459947525913},                   /* wavelen 1956.5 < 2048: unchanged */
        {29, 0.002166570763503359},                    /* wavelen 2401.7: smooth 0.8036 */
        {32, 0.0005248461609929547},                   /* inv 1/sqrt(5e5), wavelen 4442.9: smooth 0.2813 */
        {34, 0.00017850781276799638},                  /* wavelen 6695.1: smooth 0.0745 */
        {35, 9.556212353964683e-05},                   /* wavelen 8218.7 > 8192: inv / 8 */
        {63, 3.068925988914511e-07},                   /* lowest frequency: inv / 8 */
    };
    for (size_t j = 0; j < sizeof want / sizeof want[0]; j++)
        EXPECT_NEAR(inv[want[j].i] / want[j].v, 1.0, 1e-12);
}

/* ---- rope_apply: n heads hd ld theta, aux = the n positions ---- */

struct rp_ctx {
    float *x, *y, *dy;
    int n, heads, hd, ld;
    const int32_t *pos;
    const double *inv;
};

static double rp_loss(void *p)
{
    struct rp_ctx *c = p;
    memcpy(c->y, c->x, (size_t)c->n * c->ld * sizeof *c->y);
    rope_apply_cpu(c->y, c->ld, c->n, c->heads, c->hd, c->pos, c->inv, 0);
    return kc_dot_loss(c->dy, c->y, c->n, c->heads * c->hd, c->ld);
}

/* The rotation against the formula in double (columns past the heads untouched), the inverse rotation back to x,
 * and the backward (the inverse rotation of dy) against central finite differences. */
static void rope_apply_cpu_check(const kc_case *c)
{
    int n = c->p[0], heads = c->p[1], hd = c->p[2], ld = c->p[3], half = hd / 2;
    double theta = c->p[4];
    rope_params p = {.theta = theta};
    double *inv = xmalloc(sizeof(double) * (size_t)half);
    rope_inv_freq(inv, hd, &p);
    int32_t *pos = xmalloc(sizeof(int32_t) * (size_t)n);
    for (int t = 0; t < n; t++) pos[t] = c->aux[t];
    float *x = rnd_floats((size_t)n * ld, 2.0), *y = dup_floats(x, (size_t)n * ld);
    rope_apply_cpu(y, ld, n, heads, hd, pos, inv, 0);
    double worst = 0;
    for (int t = 0; t < n; t++) {
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < half; i++) {
                const float *xh = x + (size_t)t * ld + (size_t)h * hd;
                const float *yh = y + (size_t)t * ld + (size_t)h * hd;
                double a = pos[t] * (1.0 / pow(theta, 2.0 * i / hd));
                double r1 = xh[i] * cos(a) - xh[i + half] * sin(a);
                double r2 = xh[i + half] * cos(a) + xh[i] * sin(a);
                worst = fmax(worst, fmax(fabs(yh[i] - r1), fabs(yh[i + half] - r2)));
            }
        for (int e = heads * hd; e < ld; e++) EXPECT(y[(size_t)t * ld + e] == x[(size_t)t * ld + e]);
    }
    EXPECT(worst < 2e-6);
    rope_apply_cpu(y, ld, n, heads, hd, pos, inv, 1);
    worst = 0;
    for (size_t i = 0; i < (size_t)n * ld; i++) worst = fmax(worst, fabs(y[i] - x[i]));
    EXPECT(worst < 2e-6);

    /* the backward of the rotation is the inverse rotation applied to dy */
    struct rp_ctx fc = {.n = n, .heads = heads, .hd = hd, .ld = ld, .pos = pos, .inv = inv};
    fc.x = rnd_floats((size_t)n * ld, 1.0);
    fc.y = xmalloc((size_t)n * ld * sizeof *fc.y);
    fc.dy = rnd_floats((size_t)n * ld, 1.0);
    float *dx = dup_floats(fc.dy, (size_t)n * ld);
    rope_apply_cpu(dx, ld, n, heads, hd, pos, inv, 1);
    kc_check_grad("dx", fc.x, n, heads * hd, ld, dx, ld, rp_loss, &fc);
    free(fc.x), free(fc.y), free(fc.dy), free(dx);
    free(x), free(y), free(inv), free(pos);
}

/* ---- attention: nh nkv hd amp, seqs ---- */

/* Dense (T, T) mask reference in double: key j visible to query t iff same sequence and j <= t. */
static void attention_dense_ref(double *out, const float *q, const float *k, const float *v, const int32_t *cu,
                                int nseq, int T, int nh, int nkv, int hd, double scale)
{
    int *seq = xmalloc((size_t)(T ? T : 1) * sizeof *seq);
    for (int s = 0; s < nseq; s++)
        for (int t = cu[s]; t < cu[s + 1]; t++) seq[t] = s;
    double *sc = xmalloc((size_t)(T ? T : 1) * sizeof *sc);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            int kh = h / (nh / nkv);
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < T; j++) {
                if (seq[j] != seq[t] || j > t) { sc[j] = -INFINITY; continue; }
                double d = 0;
                for (int e = 0; e < hd; e++)
                    d += (double)q[((size_t)t * nh + h) * hd + e] * k[((size_t)j * nkv + kh) * hd + e];
                sc[j] = d * scale;
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j < T; j++) sum += sc[j] == -INFINITY ? 0 : exp(sc[j] - mx);
            for (int e = 0; e < hd; e++) {
                double o = 0;
                for (int j = 0; j < T; j++)
                    if (sc[j] != -INFINITY) o += exp(sc[j] - mx) / sum * v[((size_t)j * nkv + kh) * hd + e];
                out[((size_t)t * nh + h) * hd + e] = o;
            }
        }
    free(seq), free(sc);
}

static int32_t *cu_of(const kc_case *c, int *T, int *maxlen)
{
    int32_t *cu = xmalloc(sizeof(int32_t) * (size_t)(c->nseqs + 1));
    cu[0] = 0;
    int m = 0;
    for (int s = 0; s < c->nseqs; s++) cu[s + 1] = cu[s] + c->seqs[s], m = c->seqs[s] > m ? c->seqs[s] : m;
    *T = cu[c->nseqs];
    if (maxlen) *maxlen = m;
    return cu;
}

static void attention_cpu_check(const kc_case *c)
{
    int nh = c->p[0], nkv = c->p[1], hd = c->p[2], T, nseq = c->nseqs;
    int32_t *cu = cu_of(c, &T, NULL);
    float scale = 1.0f / sqrtf((float)hd);
    float *q = rnd_floats((size_t)T * nh * hd, 2.0), *k = rnd_floats((size_t)T * nkv * hd, 2.0);
    float *v = rnd_floats((size_t)T * nkv * hd, 1.0), *out = rnd_floats((size_t)T * nh * hd, 1.0);
    double *ref = xmalloc((size_t)T * nh * hd * sizeof *ref);
    attention_causal_forward_cpu(out, q, k, v, cu, nseq, nh, nkv, hd, scale);
    attention_dense_ref(ref, q, k, v, cu, nseq, T, nh, nkv, hd, scale);
    double worst = 0;
    for (size_t i = 0; i < (size_t)T * nh * hd; i++) worst = fmax(worst, fabs(out[i] - ref[i]));
    if (!(worst < 2e-6)) {
        fprintf(stderr, "  nh %d nkv %d hd %d: max err %g\n", nh, nkv, hd, worst);
        test_failed_here = 1;
    }
    /* a length-1 sequence attends only to itself: out = v */
    for (int s = 0; s < nseq; s++)
        if (c->seqs[s] == 1)
            for (int h = 0; h < nh; h++)
                for (int e = 0; e < hd; e++)
                    EXPECT_NEAR(out[((size_t)cu[s] * nh + h) * hd + e],
                                v[((size_t)cu[s] * nkv + h / (nh / nkv)) * hd + e], 1e-6);
    free(q), free(k), free(v), free(out), free(ref), free(cu);
}

/* ---- qk_norm_rope (CPU): n nh nkv hd with_norm maxpos | partial: n nh nkv hd rd vs_full ---- */

static int32_t *qk_positions(int n, int maxpos)
{
    int32_t *pos = xmalloc((size_t)n * 4);
    for (int t = 0; t < n; t++) pos[t] = (int32_t)((rnd_uniform() + 1.0) * 0.5 * maxpos);
    pos[0] = 0, pos[n - 1] = maxpos;
    return pos;
}

/* Per head: w ⊙ x / sqrt(mean(x²) + eps) (w NULL: x), then the rotate-half rotation of its first rd values by
 * pos·theta^(-2i/rd), in double; columns past the q and k heads untouched. */
static void qk_ref(double *y, const float *x, int ld, int n, int nh, int nkv, int hd, int rd, const float *qw,
                   const float *kw, float eps, const int32_t *pos, double theta)
{
    double *h = xmalloc(sizeof(double) * (size_t)hd);
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < ld; i++) y[(size_t)t * ld + i] = x[(size_t)t * ld + i];
        for (int hh = 0; hh < nh + nkv; hh++) {
            const float *xr = x + (size_t)t * ld + (size_t)hh * hd, *w = hh < nh ? qw : kw;
            double ss = 0;
            for (int i = 0; i < hd; i++) ss += (double)xr[i] * xr[i];
            double r = w ? 1.0 / sqrt(ss / hd + eps) : 1.0;
            for (int i = 0; i < hd; i++) h[i] = w ? w[i] * (xr[i] * r) : xr[i];
            double *yr = y + (size_t)t * ld + (size_t)hh * hd;
            for (int i = 0; i < hd; i++) yr[i] = h[i];
            for (int i = 0; i < rd / 2; i++) {
                double a = pos[t] * pow(theta, -2.0 * i / rd);
                yr[i] = h[i] * cos(a) - h[i + rd / 2] * sin(a);
                yr[i + rd / 2] = h[i + rd / 2] * cos(a) + h[i] * sin(a);
            }
        }
    }
    free(h);
}

static void qk_compare(const double *ref, const float *got, size_t n)
{
    double e = 0, mx = 0;
    for (size_t i = 0; i < n; i++) e = fmax(e, fabs(got[i] - ref[i])), mx = fmax(mx, fabs(ref[i]));
    EXPECT(e <= 1e-5 * fmax(1.0, mx)); /* fp32 math: a few ulp of the largest value */
    if (test_failed_here) fprintf(stderr, "  max err %g, max |ref| %g\n", e, mx);
}

static void qk_norm_rope_cpu_check(const kc_case *c)
{
    int n = c->p[0], nh = c->p[1], nkv = c->p[2], hd = c->p[3], with_norm = c->p[4], maxpos = c->p[5];
    int ld = (nh + 2 * nkv) * hd;
    float *x = rnd_floats((size_t)n * ld, 3.0), *qw = rnd_floats(hd, 1.5), *kw = rnd_floats(hd, 1.5);
    float *y = dup_floats(x, (size_t)n * ld);
    double *ref = xmalloc(sizeof(double) * (size_t)n * ld), *inv = xmalloc(sizeof(double) * (size_t)hd / 2);
    int32_t *pos = qk_positions(n, maxpos);
    rope_params rp = {.theta = 1e6};
    rope_inv_freq(inv, hd, &rp);
    qk_norm_rope_cpu(y, ld, y + (size_t)nh * hd, ld, n, nh, nkv, hd, with_norm ? qw : NULL, with_norm ? kw : NULL,
                     1e-6f, pos, inv);
    qk_ref(ref, x, ld, n, nh, nkv, hd, hd, with_norm ? qw : NULL, with_norm ? kw : NULL, 1e-6f, pos, 1e6);
    qk_compare(ref, y, (size_t)n * ld);
    free(x), free(qw), free(kw), free(y), free(ref), free(inv), free(pos);
}

static void qk_norm_rope_partial_cpu_check(const kc_case *c)
{
    int n = c->p[0], nh = c->p[1], nkv = c->p[2], hd = c->p[3], rd = c->p[4];
    const int qd = nh * hd, kd = nkv * hd, ld = 2 * qd + 2 * kd; /* q|gate|k|v as the hybrid forward lays them out */
    float *x = rnd_floats((size_t)n * ld, 2.0), *qw = rnd_floats(hd, 1.0), *kw = rnd_floats(hd, 1.0);
    int32_t *pos = xmalloc(sizeof(int32_t) * (size_t)n);
    for (int t = 0; t < n; t++) pos[t] = t < n / 2 ? t : 5000 + 37 * t;
    double *inv = xmalloc(sizeof(double) * (size_t)rd / 2);
    rope_params rp = {.theta = 1e7};
    rope_inv_freq(inv, rd, &rp);
    /* the reference's layout: q heads then k heads; the kernel's: q at 0, k at 2 qd */
    float *y = dup_floats(x, (size_t)n * ld);
    qk_norm_rope_partial_cpu(y, ld, y + 2 * qd, ld, n, nh, nkv, hd, rd, qw, kw, 1e-6f, pos, inv);
    int ldr = qd + kd;
    float *xr = xmalloc(sizeof(float) * (size_t)n * ldr), *yr = xmalloc(sizeof(float) * (size_t)n * ldr);
    for (int t = 0; t < n; t++) {
        memcpy(xr + (size_t)t * ldr, x + (size_t)t * ld, sizeof(float) * qd);
        memcpy(xr + (size_t)t * ldr + qd, x + (size_t)t * ld + 2 * qd, sizeof(float) * kd);
        memcpy(yr + (size_t)t * ldr, y + (size_t)t * ld, sizeof(float) * qd);
        memcpy(yr + (size_t)t * ldr + qd, y + (size_t)t * ld + 2 * qd, sizeof(float) * kd);
        /* the gate and v columns untouched */
        EXPECT(memcmp(y + (size_t)t * ld + qd, x + (size_t)t * ld + qd, sizeof(float) * qd) == 0);
        EXPECT(memcmp(y + (size_t)t * ld + 2 * qd + kd, x + (size_t)t * ld + 2 * qd + kd, sizeof(float) * kd) == 0);
    }
    double *ref = xmalloc(sizeof(double) * (size_t)n * ldr);
    qk_ref(ref, xr, ldr, n, nh, nkv, hd, rd, qw, kw, 1e-6f, pos, 1e7);
    qk_compare(ref, yr, (size_t)n * ldr);
    free(x), free(qw), free(kw), free(pos), free(inv), free(y), free(xr), free(yr), free(ref);
}

struct qk_ctx {
    float *x, *y, *g, *qw, *kw;
    int n, nh, nkv, hd, ld;
    const int32_t *pos;
    const double *inv;
};

static double qk_loss(void *p)
{
    struct qk_ctx *c = p;
    memcpy(c->y, c->x, sizeof(float) * (size_t)c->n * c->ld);
    qk_norm_rope_cpu(c->y, c->ld, c->y + (size_t)c->nh * c->hd, c->ld, c->n, c->nh, c->nkv, c->hd, c->qw, c->kw, 1e-6f,
                     c->pos, c->inv);
    return kc_dot_loss(c->g, c->y, c->n, (c->nh + c->nkv) * c->hd, c->ld);
}

/* n nh nkv hd with_norm maxpos no_q: dq|dk and dq_w/dk_w against central finite differences of Σ g ⊙ y */
static void qk_norm_rope_backward_cpu_check(const kc_case *kc)
{
    const int n = kc->p[0], nh = kc->p[1], nkv = kc->p[2], hd = kc->p[3], with_norm = kc->p[4], no_q = kc->p[6];
    struct qk_ctx c = {.n = n, .nh = nh, .nkv = nkv, .hd = hd, .ld = (nh + 2 * nkv) * hd};
    const size_t nx = (size_t)n * c.ld;
    c.x = rnd_floats(nx, 2.0), c.g = rnd_floats(nx, 1.0), c.y = xmalloc(sizeof(float) * nx);
    float *qw = rnd_floats(hd, 1.5), *kw = rnd_floats(hd, 1.5);
    c.qw = with_norm ? qw : NULL, c.kw = with_norm ? kw : NULL;
    int32_t *pos = qk_positions(n, kc->p[5]);
    double *inv = xmalloc(sizeof(double) * (size_t)hd / 2);
    rope_params rp = {.theta = 1e6};
    rope_inv_freq(inv, hd, &rp);
    c.pos = pos, c.inv = inv;
    float *d = dup_floats(c.g, nx), *dqw = xcalloc((size_t)hd, sizeof(float)), *dkw = xcalloc((size_t)hd, sizeof(float));
    qk_norm_rope_backward_cpu(no_q ? NULL : d, c.ld, d + (size_t)nh * hd, c.ld, c.x, c.ld, c.x + (size_t)nh * hd, c.ld,
                              n, nh, nkv, hd, c.qw, c.kw, dqw, dkw, 1e-6f, pos, inv);
    if (!no_q) kc_check_grad("dq", c.x, n, nh * hd, c.ld, d, c.ld, qk_loss, &c);
    kc_check_grad("dk", c.x + (size_t)nh * hd, n, nkv * hd, c.ld, d + (size_t)nh * hd, c.ld, qk_loss, &c);
    if (with_norm) {
        if (!no_q) kc_check_grad("dq_w", qw, 1, hd, hd, dqw, hd, qk_loss, &c);
        kc_check_grad("dk_w", kw, 1, hd, hd, dkw, hd, qk_loss, &c);
    }
    for (int t = 0; t < n; t++) /* v columns untouched; q columns too when dq is NULL */
        for (int i = 0; i < c.ld; i++)
            if (i >= (nh + nkv) * hd || (no_q && i < nh * hd)) EXPECT(d[(size_t)t * c.ld + i] == c.g[(size_t)t * c.ld + i]);
    free(c.x), free(c.g), free(c.y), free(qw), free(kw), free(pos), free(inv), free(d), free(dqw), free(dkw);
}

/* ---- attention_qfold: nh nkv hd with_norm bitwise, seqs (qk_norm_rope's Q side folded into the attention) ---- */

/* Each packed row's position: its place in its sequence, odd sequences from 30000 on (the angle's reduction at long
 * positions) */
static int32_t *qfold_positions(const int32_t *cu, int nseq, int T)
{
    int32_t *pos = xmalloc(sizeof(int32_t) * (size_t)(T ? T : 1));
    for (int s = 0; s < nseq; s++)
        for (int t = cu[s]; t < cu[s + 1]; t++) pos[t] = t - cu[s] + (s % 2) * 30000;
    return pos;
}

/* The fold's reference, the composition the unfused forward runs: qk_norm_rope_cpu on q and k of the packed
 * (T, (nh + 2 nkv) hd) rows x (in place), then attention_causal_forward_cpu into ref (T, nh hd); with round_qk the
 * normed q and k are rounded to bf16 in between (as the device stores them). */
static void qfold_reference(float *ref, float *x, const int32_t *cu, int nseq, int T, int nh, int nkv, int hd,
                            const float *qw, const float *kw, const int32_t *pos, const double *inv, int round_qk)
{
    const int ld = (nh + 2 * nkv) * hd, qd = nh * hd, kd = nkv * hd;
    qk_norm_rope_cpu(x, ld, x + qd, ld, T, nh, nkv, hd, qw, kw, 1e-6f, pos, inv);
    float *q = xmalloc((size_t)(T ? T : 1) * qd * 4), *k = xmalloc((size_t)(T ? T : 1) * kd * 4);
    float *v = xmalloc((size_t)(T ? T : 1) * kd * 4);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < qd + kd; i++)
            if (round_qk) x[(size_t)t * ld + i] = bf16_to_f32(f32_to_bf16(x[(size_t)t * ld + i]));
        memcpy(q + (size_t)t * qd, x + (size_t)t * ld, (size_t)qd * 4);
        memcpy(k + (size_t)t * kd, x + (size_t)t * ld + qd, (size_t)kd * 4);
        memcpy(v + (size_t)t * kd, x + (size_t)t * ld + qd + kd, (size_t)kd * 4);
    }
    attention_causal_forward_cpu(ref, q, k, v, cu, nseq, nh, nkv, hd, 1.0f / sqrtf((float)hd));
    free(q), free(k), free(v);
}

/* The reference against the naive double composition: qk_ref's norm and rotation, then the dense-mask attention */
static void attention_qfold_cpu_check(const kc_case *c)
{
    const int nh = c->p[0], nkv = c->p[1], hd = c->p[2], with_norm = c->p[3], nseq = c->nseqs;
    int T;
    int32_t *cu = cu_of(c, &T, NULL), *pos = qfold_positions(cu, nseq, T);
    const int ld = (nh + 2 * nkv) * hd, qd = nh * hd, kd = nkv * hd;
    float *x = rnd_floats((size_t)T * ld, 3.0), *qw = rnd_floats(hd, 1.5), *kw = rnd_floats(hd, 1.5);
    double *inv = xmalloc(sizeof(double) * (size_t)hd / 2);
    rope_params rp = {.theta = 1e6};
    rope_inv_freq(inv, hd, &rp);
    float *y = dup_floats(x, (size_t)T * ld), *ref = xmalloc(sizeof(float) * (size_t)T * qd);
    qfold_reference(ref, y, cu, nseq, T, nh, nkv, hd, with_norm ? qw : NULL, with_norm ? kw : NULL, pos, inv, 0);
    /* naive: q and k normed and rotated in double (qk_ref), then the attention in double */
    double *xn = xmalloc(sizeof(double) * (size_t)T * ld), *want = xmalloc(sizeof(double) * (size_t)T * qd);
    qk_ref(xn, x, ld, T, nh, nkv, hd, hd, with_norm ? qw : NULL, with_norm ? kw : NULL, 1e-6f, pos, 1e6);
    float *q = xmalloc(sizeof(float) * (size_t)T * qd), *k = xmalloc(sizeof(float) * (size_t)T * kd);
    float *v = xmalloc(sizeof(float) * (size_t)T * kd);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < qd + 2 * kd; i++) {
            float f = (float)xn[(size_t)t * ld + i];
            if (i < qd) q[(size_t)t * qd + i] = f;
            else if (i < qd + kd) k[(size_t)t * kd + i - qd] = f;
            else v[(size_t)t * kd + i - qd - kd] = f;
        }
    attention_dense_ref(want, q, k, v, cu, nseq, T, nh, nkv, hd, 1.0 / sqrt((double)hd));
    double e = 0, mx = 0;
    for (size_t i = 0; i < (size_t)T * qd; i++) e = fmax(e, fabs(ref[i] - want[i])), mx = fmax(mx, fabs(want[i]));
    EXPECT(e <= 1e-4 * fmax(1.0, mx)); /* fp32 norm, rotation and softmax against double */
    if (test_failed_here) fprintf(stderr, "  max err %g, max |ref| %g\n", e, mx);
    /* a length-1 sequence attends only to itself: out = its v, untouched by the norm */
    for (int s = 0; s < nseq; s++)
        if (c->seqs[s] == 1)
            for (int h = 0; h < nh; h++)
                for (int i = 0; i < hd; i++)
                    EXPECT_NEAR(ref[(size_t)cu[s] * qd + (size_t)h * hd + i],
                                x[(size_t)cu[s] * ld + qd + kd + (size_t)(h / (nh / nkv)) * hd + i], 1e-6);
    free(cu), free(pos), free(x), free(qw), free(kw), free(inv), free(y), free(ref), free(xn), free(want), free(q);
    free(k), free(v);
}

#ifdef DFLASH_CUDA
/* q and k inside one (n, qd + 2 kd) buffer as in the forward; positions up to maxpos. n nh nkv hd with_norm maxpos */
static void qk_norm_rope_cuda_check(const kc_case *c)
{
    int n = c->p[0], nh = c->p[1], nkv = c->p[2], hd = c->p[3], with_norm = c->p[4], maxpos = c->p[5];
    int ld = (nh + 2 * nkv) * hd;
    size_t nx = (size_t)n * ld;
    float *x_f = xmalloc(nx * 4), *qw_f = xmalloc((size_t)hd * 4), *kw_f = xmalloc((size_t)hd * 4);
    uint16_t *x = rnd_bf16(nx, 3.0, x_f), *qw = rnd_bf16((size_t)hd, 1.5, qw_f), *kw = rnd_bf16((size_t)hd, 1.5, kw_f);
    int32_t *pos = xmalloc((size_t)n * 4);
    for (int t = 0; t < n; t++) pos[t] = (int32_t)((rnd_uniform() + 1.0) * 0.5 * maxpos);
    pos[0] = 0, pos[n - 1] = maxpos;
    double *inv = xmalloc(sizeof(double) * (size_t)hd / 2);
    rope_params rp = {.theta = 1e6};
    rope_inv_freq(inv, hd, &rp);
    qk_norm_rope_cpu(x_f, ld, x_f + (size_t)nh * hd, ld, n, nh, nkv, hd, with_norm ? qw_f : NULL,
                     with_norm ? kw_f : NULL, 1e-6f, pos, inv);
    uint16_t *d_x = dev_upload(x, nx * 2), *d_qw = dev_upload(qw, (size_t)hd * 2), *d_kw = dev_upload(kw, (size_t)hd * 2);
    int32_t *d_pos = dev_upload(pos, (size_t)n * 4);
    double *d_inv = dev_upload(inv, sizeof(double) * (size_t)hd / 2);
    qk_norm_rope_cuda(d_x, ld, d_x + (size_t)nh * hd, ld, n, nh, nkv, hd, with_norm ? d_qw : NULL,
                      with_norm ? d_kw : NULL, 1e-6f, d_pos, d_inv, stream);
    uint16_t *y = dev_get(d_x, (nx) * 2);
    /* q|k columns changed as the reference says; v columns untouched (the reference leaves them as they were) */
    double err = 0, nr = 0;
    err = err_vs_max(y, ld, x_f, ld, n, (nh + nkv) * hd, &nr);
    for (size_t t = 0; t < (size_t)n; t++)
        for (int i = (nh + nkv) * hd; i < ld; i++)
            if (y[t * ld + i] != x[t * ld + i]) err = INFINITY;
    char name[160];
    snprintf(name, sizeof name, "qk_norm_rope_cuda n=%d nh=%d nkv=%d hd=%d norm=%d maxpos=%d (max err / max|ref|)", n,
             nh, nkv, hd, with_norm, maxpos);
    kc_report(name, err, 0x1p-8); /* one bf16 rounding of each output (fp32 math in between) */
    CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_qw)); CHECK_CUDA(cudaFree(d_kw));
    CHECK_CUDA(cudaFree(d_pos)); CHECK_CUDA(cudaFree(d_inv));
    free(x_f), free(qw_f), free(kw_f), free(x), free(qw), free(kw), free(pos), free(inv), free(y);
}

/* dq|dk packed in one (n, (nh + 2 nkv) hd) gradient buffer as the fused qkv projection's, the saved pre-norm q|k in
 * another; v columns must stay untouched. no_q: dq NULL (context keys only). n nh nkv hd with_norm maxpos no_q */
static void qk_norm_rope_backward_cuda_check(const kc_case *c)
{
    int n = c->p[0], nh = c->p[1], nkv = c->p[2], hd = c->p[3], with_norm = c->p[4], maxpos = c->p[5], no_q = c->p[6];
    const float eps = 1e-6f;
    int ld = (nh + 2 * nkv) * hd, half = hd / 2;
    size_t nx = (size_t)n * ld;
    float *g_f = xmalloc(nx * 4), *x_f = xmalloc(nx * 4), *qw_f = xmalloc((size_t)hd * 4), *kw_f = xmalloc((size_t)hd * 4);
    uint16_t *g = rnd_bf16(nx, 1.0, g_f), *x = rnd_bf16(nx, 3.0, x_f);
    uint16_t *qw = rnd_bf16((size_t)hd, 1.5, qw_f), *kw = rnd_bf16((size_t)hd, 1.5, kw_f);
    int32_t *pos = xmalloc((size_t)n * 4);
    for (int t = 0; t < n; t++) pos[t] = (int32_t)((rnd_uniform() + 1.0) * 0.5 * maxpos);
    pos[0] = 0, pos[n - 1] = maxpos;
    double *inv = xmalloc(sizeof(double) * (size_t)half);
    rope_params rp = {.theta = 1e6};
    rope_inv_freq(inv, hd, &rp);
    float *dqw0 = rnd_f32((size_t)hd, 1.0, 0.0), *dkw0 = rnd_f32((size_t)hd, 1.0, 0.0);
    float *dqw_ref = xmalloc((size_t)hd * 4), *dkw_ref = xmalloc((size_t)hd * 4);
    memcpy(dqw_ref, dqw0, (size_t)hd * 4), memcpy(dkw_ref, dkw0, (size_t)hd * 4);
    /* dw bound: Σ_rows |x̂|·(|d_i| + |d_partner|) per column, an upper bound of Σ |g·x̂| (g is a rotation of d) */
    double bq = 0, bk = 0;
    double *cs = xcalloc((size_t)2 * hd, sizeof(double));
    for (int t = 0; t < n; t++)
        for (int h = 0; h < nh + nkv; h++) {
            const float *xr = x_f + (size_t)t * ld + (size_t)h * hd, *gr = g_f + (size_t)t * ld + (size_t)h * hd;
            double ss = 0;
            for (int i = 0; i < hd; i++) ss += (double)xr[i] * xr[i];
            double rstd = 1.0 / sqrt(ss / hd + eps);
            for (int i = 0; i < hd; i++)
                cs[(h >= nh) * hd + i] += fabs(xr[i] * rstd) * (fabs(gr[i]) + fabs(gr[(i + half) % hd]));
        }
    for (int i = 0; i < hd; i++) bq = fmax(bq, cs[i]), bk = fmax(bk, cs[hd + i]);
    float *ref = xmalloc(nx * 4);
    memcpy(ref, g_f, nx * 4);
    qk_norm_rope_backward_cpu(no_q ? NULL : ref, ld, ref + (size_t)nh * hd, ld, x_f, ld, x_f + (size_t)nh * hd, ld, n,
                              nh, nkv, hd, with_norm ? qw_f : NULL, with_norm ? kw_f : NULL, dqw_ref, dkw_ref, eps, pos,
                              inv);

    uint16_t *d_g = dev_upload(g, nx * 2), *d_x = dev_upload(x, nx * 2);
    uint16_t *d_qw = dev_upload(qw, (size_t)hd * 2), *d_kw = dev_upload(kw, (size_t)hd * 2);
    int32_t *d_pos = dev_upload(pos, (size_t)n * 4);
    double *d_inv = dev_upload(inv, sizeof(double) * (size_t)half);
    float *d_dqw = dev_upload(dqw0, (size_t)hd * 4), *d_dkw = dev_upload(dkw0, (size_t)hd * 4);
    float *d_ws = dev_upload(NULL, qk_norm_rope_backward_cuda_workspace(n, nh, nkv, hd));
    uint16_t *got[2];
    float *gq[2], *gk[2];
    for (int run = 0; run < 2; run++) {
        dev_put(d_g, g, nx * 2), dev_put(d_dqw, dqw0, (size_t)hd * 4), dev_put(d_dkw, dkw0, (size_t)hd * 4);
        qk_norm_rope_backward_cuda(no_q ? NULL : d_g, ld, d_g + (size_t)nh * hd, ld, d_x, ld, d_x + (size_t)nh * hd,
                                   ld, n, nh, nkv, hd, with_norm ? d_qw : NULL, with_norm ? d_kw : NULL, d_dqw, d_dkw,
                                   eps, d_pos, d_inv, d_ws, stream);
        got[run] = dev_get(d_g, nx * 2), gq[run] = dev_get(d_dqw, (size_t)hd * 4), gk[run] = dev_get(d_dkw, (size_t)hd * 4);
    }
    double mx = 0, e = err_bf16(got[0], ld, ref, ld, n, (nh + nkv) * hd, &mx);
    for (size_t t = 0; t < (size_t)n; t++) /* v columns untouched; q columns too when dq is NULL */
        for (int i = 0; i < ld; i++)
            if ((i >= (nh + nkv) * hd || (no_q && i < nh * hd)) && got[0][t * ld + i] != g[t * ld + i]) e = INFINITY;
    char name[200], base[160];
    snprintf(base, sizeof base, "n=%d nh=%d nkv=%d hd=%d norm=%d maxpos=%d%s", n, nh, nkv, hd, with_norm, maxpos,
             no_q ? " dq=NULL" : "");
    snprintf(name, sizeof name, "qk_norm_rope_backward_cuda dq|dk %s", base);
    kc_report(name, e, 0x1p-8 * mx); /* one bf16 rounding of each output, fp32 math in between: 2^-8·max|ref| */
    if (with_norm) {
        if (!no_q) {
            snprintf(name, sizeof name, "qk_norm_rope_backward_cuda dq_w %s", base);
            kc_report(name, err_f32(gq[0], dqw_ref, (size_t)hd, NULL), 1e-5 * bq + 1e-6); /* fp32 order: 1e-5·Σ|g·x̂| */
        }
        snprintf(name, sizeof name, "qk_norm_rope_backward_cuda dk_w %s", base);
        kc_report(name, err_f32(gk[0], dkw_ref, (size_t)hd, NULL), 1e-5 * bk + 1e-6);
    }
    snprintf(name, sizeof name, "qk_norm_rope_backward_cuda %s dq|dk", base);
    report_same_bits(name, got[0], got[1], nx * 2, 0);
    snprintf(name, sizeof name, "qk_norm_rope_backward_cuda %s dq_w", base);
    report_same_bits(name, gq[0], gq[1], (size_t)hd * 4, 1);
    snprintf(name, sizeof name, "qk_norm_rope_backward_cuda %s dk_w", base);
    report_same_bits(name, gk[0], gk[1], (size_t)hd * 4, 1);
    CHECK_CUDA(cudaFree(d_g)); CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_qw)); CHECK_CUDA(cudaFree(d_kw));
    CHECK_CUDA(cudaFree(d_pos)); CHECK_CUDA(cudaFree(d_inv)); CHECK_CUDA(cudaFree(d_dqw)); CHECK_CUDA(cudaFree(d_dkw));
    CHECK_CUDA(cudaFree(d_ws));
    free(g_f), free(x_f), free(qw_f), free(kw_f), free(g), free(x), free(qw), free(kw), free(pos), free(inv);
    free(dqw0), free(dkw0), free(dqw_ref), free(dkw_ref), free(cs), free(ref);
    for (int r = 0; r < 2; r++) free(got[r]), free(gq[r]), free(gk[r]);
}

/* q and k as column blocks of one (n, ld) projection row, as the hybrid forward lays them out.
 * n nh nkv hd rd vs_full */
static void qk_norm_rope_partial_cuda_check(const kc_case *c)
{
    int n = c->p[0], nh = c->p[1], nkv = c->p[2], hd = c->p[3], rd = c->p[4], vs_full = c->p[5];
    const int qd = nh * hd, kd = nkv * hd, ld = 2 * qd + 2 * kd;
    float *pf = xmalloc(sizeof(float) * (size_t)n * ld), *wq = xmalloc(sizeof(float) * hd), *wk = xmalloc(sizeof(float) * hd);
    uint16_t *ph = rnd_bf16((size_t)n * ld, 2.0, pf), *wqh = rnd_bf16(hd, 1.0, wq), *wkh = rnd_bf16(hd, 1.0, wk);
    int32_t *pos = xmalloc(sizeof(int32_t) * (size_t)n);
    for (int t = 0; t < n; t++) pos[t] = t < n / 2 ? t : 5000 + 37 * t;
    double *inv = xmalloc(sizeof(double) * (size_t)rd / 2);
    rope_params rp = {.theta = 1e7};
    rope_inv_freq(inv, rd, &rp);
    uint16_t *dp = dev_upload(ph, (size_t)n * ld * 2), *dwq = dev_upload(wqh, (size_t)hd * 2);
    uint16_t *dwk = dev_upload(wkh, (size_t)hd * 2);
    int32_t *dpos = dev_upload(pos, sizeof(int32_t) * (size_t)n);
    double *dinv = dev_upload(inv, sizeof(double) * (size_t)rd / 2);
    qk_norm_rope_partial_cpu(pf, ld, pf + 2 * qd, ld, n, nh, nkv, hd, rd, wq, wk, 1e-6f, pos, inv);
    qk_norm_rope_partial_cuda(dp, ld, dp + 2 * qd, ld, n, nh, nkv, hd, rd, dwq, dwk, 1e-6f, dpos, dinv, stream);
    char name[160];
    snprintf(name, sizeof name, "qk_norm_rope_partial n=%d nh=%d nkv=%d hd=%d rd=%d (positions to %d)", n, nh, nkv,
             hd, rd, pos[n - 1]);
    uint16_t *a = dev_get(dp, (size_t)n * ld * 2);
    compare_bf16(name, a, pf, (size_t)n * ld, 1e-2, 1e-2);
    if (vs_full) { /* rd == hd: the same as the existing kernel */
        uint16_t *dp2 = dev_upload(ph, (size_t)n * ld * 2);
        qk_norm_rope_cuda(dp2, ld, dp2 + 2 * qd, ld, n, nh, nkv, hd, dwq, dwk, 1e-6f, dpos, dinv, stream);
        uint16_t *b = dev_get(dp2, (size_t)n * ld * 2);
        float *bf = xmalloc(sizeof(float) * (size_t)n * ld);
        for (size_t i = 0; i < (size_t)n * ld; i++) bf[i] = bf16_to_f32(b[i]);
        compare_bf16("qk_norm_rope_partial(rd = hd) vs qk_norm_rope_cuda", a, bf, (size_t)n * ld, 4e-3, 1e-2);
        free(b), free(bf);
        CHECK_CUDA(cudaFree(dp2));
    }
    free(a);
    CHECK_CUDA(cudaFree(dp)); CHECK_CUDA(cudaFree(dwq)); CHECK_CUDA(cudaFree(dwk)); CHECK_CUDA(cudaFree(dpos));
    CHECK_CUDA(cudaFree(dinv));
    free(pf), free(wq), free(wk), free(ph), free(wqh), free(wkh), free(pos), free(inv);
}

/* The causal attention's operands of a row (nh nkv hd amp, c->seqs): q|k|v packed in one (T, (nh + 2 nkv) hd) bf16
 * buffer as in the forward, uploaded (*d_x, with *d_cu), and the CPU reference (T, nh hd) on the same values; the
 * caller frees the returned reference, *cu, and the device buffers. */
static float *attention_operands(const kc_case *c, int32_t **cu, int *T, int *maxlen, uint16_t **d_x, int32_t **d_cu)
{
    const int nh = c->p[0], nkv = c->p[1], hd = c->p[2], nseq = c->nseqs;
    *cu = cu_of(c, T, maxlen);
    const int ld = (nh + 2 * nkv) * hd, qd = nh * hd, kd = nkv * hd;
    const size_t nx = (size_t)*T * ld;
    float *x_f = xmalloc(nx * 4);
    uint16_t *x = rnd_bf16(nx, c->p[3], x_f);
    float *q = xmalloc((size_t)*T * qd * 4), *k = xmalloc((size_t)*T * kd * 4), *v = xmalloc((size_t)*T * kd * 4);
    for (int t = 0; t < *T; t++) {
        memcpy(q + (size_t)t * qd, x_f + (size_t)t * ld, (size_t)qd * 4);
        memcpy(k + (size_t)t * kd, x_f + (size_t)t * ld + qd, (size_t)kd * 4);
        memcpy(v + (size_t)t * kd, x_f + (size_t)t * ld + qd + kd, (size_t)kd * 4);
    }
    float *ref = xmalloc((size_t)*T * qd * 4);
    attention_causal_forward_cpu(ref, q, k, v, *cu, nseq, nh, nkv, hd, 1.0f / sqrtf((float)hd));
    *d_x = dev_upload(x, nx * 2);
    *d_cu = dev_upload(*cu, sizeof(int32_t) * (size_t)(nseq + 1));
    free(x_f), free(x), free(q), free(k), free(v);
    return ref;
}

/* q|k|v packed in one (T, (nh + 2 nkv) hd) buffer as in the forward; out with its own stride. nh nkv hd amp */
static void attention_cuda_check(const kc_case *c)
{
    int nh = c->p[0], nkv = c->p[1], hd = c->p[2], nseq = c->nseqs, T, maxlen;
    int32_t *cu, *d_cu;
    uint16_t *d_x;
    float *ref = attention_operands(c, &cu, &T, &maxlen, &d_x, &d_cu), scale = 1.0f / sqrtf((float)hd);
    const int ld = (nh + 2 * nkv) * hd, qd = nh * hd, kd = nkv * hd, ldo = qd + 8;
    uint16_t *d_o = dev_poisoned((size_t)T * ldo);
    attention_causal_forward_cuda(d_o, ldo, d_x, ld, d_x + qd, ld, d_x + qd + kd, ld, d_cu, nseq, maxlen, nh, nkv, hd,
                                  scale, stream);
    uint16_t *o = dev_get(d_o, ((size_t)T * ldo) * 2);
    double nr = 0, e = err_vs_max(o, ldo, ref, qd, T, qd, &nr);
    char name[160];
    snprintf(name, sizeof name, "attention_causal_forward_cuda T=%d nseq=%d nh=%d nkv=%d hd=%d maxlen=%d", T, nseq, nh,
             nkv, hd, maxlen);
    /* P is rounded to bf16 before P·V (2^-9 relative per weight) and the output once: max err / max|ref| 1e-2,
     * ‖err‖/‖ref‖ 5e-3 */
    int ok = e <= 1e-2 && nr <= 5e-3;
    printf("%s %s max_err/max_ref=%.3g (tol 1e-2) norm_rel=%.3g (tol 5e-3)\n", ok ? "ok" : "FAIL", name, e, nr);
    fflush(stdout);
    if (!ok) failures++;
    CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_o)); CHECK_CUDA(cudaFree(d_cu));
    free(cu), free(ref), free(o);
}

/* the wgmma rows' device check: 1 (the row skipped, saying why) on a device other than sm_90 */
static int skipped_unless_sm90(void)
{
    int dev = 0, major = 0, minor = 0;
    CHECK_CUDA(cudaGetDevice(&dev));
    CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major * 10 + minor == 90) return 0;
    char why[128];
    snprintf(why, sizeof why, "the wgmma kernel is built for sm_90a, this device is sm_%d%d", major, minor);
    kc_skip(why);
    return 1;
}

/* The Hopper kernel (attention_sm90.cu: wgmma, TMA) by name against the CPU reference, with attention_cuda_check's
 * tolerances; then a second run, the cp.async staging (instead of TMA) and attention_causal_forward_cuda (which
 * chooses this kernel on sm_90) bitwise identical to the first run. On a device other than sm_90 the row is skipped;
 * on sm_90 a head_dim it should take and does not fails. nh nkv hd amp */
static void attention_wgmma_cuda_check(const kc_case *c)
{
    int nh = c->p[0], nkv = c->p[1], hd = c->p[2], nseq = c->nseqs, T, maxlen;
    if (skipped_unless_sm90()) return;
    if (!attention_wgmma_supported(hd)) {
        printf("FAIL attention_wgmma hd=%d: an sm_90 device, yet attention_wgmma_supported(%d) is 0\n", hd, hd);
        failures++;
        return;
    }
    int32_t *cu, *d_cu;
    uint16_t *d_x;
    float *ref = attention_operands(c, &cu, &T, &maxlen, &d_x, &d_cu), scale = 1.0f / sqrtf((float)hd);
    /* out with its own stride */
    const int ld = (nh + 2 * nkv) * hd, qd = nh * hd, kd = nkv * hd, ldo = qd + 8;
    const size_t no = (size_t)T * ldo;
    enum { kRuns = 4 };
    /* 0, 1: TMA staging twice; 2: cp.async staging; 3: the automatic choice */
    static const char *const kSame[kRuns] = {"", "a second run", "cp.async staging", "attention_causal_forward_cuda"};
    uint16_t *d_o[kRuns], *o[kRuns];
    for (int r = 0; r < kRuns; r++) d_o[r] = dev_poisoned(no);
    for (int r = 0; r < kRuns; r++) {
        if (r < kRuns - 1)
            attention_wgmma_forward_cuda(d_o[r], ldo, d_x, ld, d_x + qd, ld, d_x + qd + kd, ld, d_cu, nseq, maxlen, nh,
                                         nkv, hd, scale, r < 2, stream);
        else
            attention_causal_forward_cuda(d_o[r], ldo, d_x, ld, d_x + qd, ld, d_x + qd + kd, ld, d_cu, nseq, maxlen,
                                          nh, nkv, hd, scale, stream);
        o[r] = dev_get(d_o[r], no * 2);
    }
    char name[256];
    snprintf(name, sizeof name, "attention_wgmma T=%d nseq=%d nh=%d nkv=%d hd=%d maxlen=%d", T, nseq, nh, nkv, hd,
             maxlen);
    double nr = 0, e = err_vs_max(o[0], ldo, ref, qd, T, qd, &nr);
    int ok = e <= 1e-2 && nr <= 5e-3;
    printf("%s %s max_err/max_ref=%.3g (tol 1e-2) norm_rel=%.3g (tol 5e-3)", ok ? "ok" : "FAIL", name, e, nr);
    if (!ok) { /* where: the (token, head, column) of the largest error */
        double w = -1;
        int wt = 0, wi = 0;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < qd; i++) {
                double g = bf16_to_f32(o[0][(size_t)t * ldo + i]);
                double d = isnan(g) ? INFINITY : fabs(g - ref[(size_t)t * qd + i]);
                if (d > w) w = d, wt = t, wi = i;
            }
        printf(" worst at token %d head %d column %d: got %g want %g", wt, wi / hd, wi % hd,
               bf16_to_f32(o[0][(size_t)wt * ldo + wi]), ref[(size_t)wt * qd + wi]);
    }
    printf("\n");
    if (!ok) failures++;
    for (int r = 1; r < kRuns; r++) {
        size_t diff = 0;
        for (size_t i = 0; i < no; i++) diff += o[r][i] != o[0][i];
        printf("%s %s: %s bitwise identical to the first run (%zu of %zu values differ)\n", diff ? "FAIL" : "ok", name,
               kSame[r], diff, no);
        if (diff) failures++;
    }
    fflush(stdout);
    for (int r = 0; r < kRuns; r++) {
        CHECK_CUDA(cudaFree(d_o[r]));
        free(o[r]);
    }
    CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_cu));
    free(cu), free(ref);
}

/* The fold on the device (sm_90 only; skipped elsewhere). The packed (T, (nh + 2 nkv) hd) rows, raw, go two ways:
 * unfused, qk_norm_rope_cuda on q and k then the Hopper attention by name; folded, qk_norm_rope_cuda on k only
 * (q = NULL, nh = 0) then attention_wgmma_qfold_forward_cuda (TMA, and again with cp.async staging). The folded
 * output against the CPU reference (qfold_reference, q and k rounded to bf16) with attention_cuda_check's
 * tolerances; bitwise equal to the unfused one where `bitwise` (qk_norm_rope_cuda takes q by its per-token kernel,
 * whose arithmetic the fold reproduces), else within those tolerances of it; the cp.async staging bitwise equal to
 * TMA's; k of the k-only call bitwise equal to the full call's where `bitwise`; q left raw in memory. Then the public
 * path: attention_qfold_applies (1 exactly when DFLASH_ATTENTION_QFOLD is 1 or begin; begin also picks the kernel's
 * variant without passes ahead for every folded launch here) and, as
 * attn_block_cuda.c runs it, attention_causal_qfold_forward_cuda with the fold (then bitwise the folded output) or
 * without it after the full qk_norm_rope_cuda (then bitwise the unfused one). nh nkv hd with_norm bitwise */
static void attention_qfold_cuda_check(const kc_case *c)
{
    const int nh = c->p[0], nkv = c->p[1], hd = c->p[2], with_norm = c->p[3], bitwise = c->p[4], nseq = c->nseqs;
    if (skipped_unless_sm90()) return;
    int T, maxlen;
    int32_t *cu = cu_of(c, &T, &maxlen), *pos = qfold_positions(cu, nseq, T);
    const int ld = (nh + 2 * nkv) * hd, qd = nh * hd, kd = nkv * hd, ldo = qd + 8;
    const size_t nx = (size_t)T * ld, no = (size_t)T * ldo;
    float *x_f = xmalloc(nx * 4), *qw_f = xmalloc((size_t)hd * 4), *kw_f = xmalloc((size_t)hd * 4);
    uint16_t *x = rnd_bf16(nx, 3.0, x_f), *qw = rnd_bf16((size_t)hd, 1.5, qw_f), *kw = rnd_bf16((size_t)hd, 1.5, kw_f);
    double *inv = xmalloc(sizeof(double) * (size_t)hd / 2);
    rope_params rp = {.theta = 1e6};
    rope_inv_freq(inv, hd, &rp);
    float *ref = xmalloc(sizeof(float) * (size_t)T * qd);
    qfold_reference(ref, x_f, cu, nseq, T, nh, nkv, hd, with_norm ? qw_f : NULL, with_norm ? kw_f : NULL, pos, inv, 1);
    const float scale = 1.0f / sqrtf((float)hd);
    uint16_t *d_full = dev_upload(x, nx * 2), *d_konly = dev_upload(x, nx * 2), *d_qw = dev_upload(qw, (size_t)hd * 2);
    uint16_t *d_kw = dev_upload(kw, (size_t)hd * 2), *d_pub = dev_upload(x, nx * 2);
    int32_t *d_pos = dev_upload(pos, sizeof(int32_t) * (size_t)T), *d_cu = dev_upload(cu, sizeof(int32_t) * (nseq + 1));
    double *d_inv = dev_upload(inv, sizeof(double) * (size_t)hd / 2);
    const uint16_t *wq = with_norm ? d_qw : NULL, *wk = with_norm ? d_kw : NULL;
    const attention_qfold fold = {wq, 1e-6f, d_pos, d_inv};
    enum { kUnfused, kFold, kFoldCp, kPublic, kOuts };
    uint16_t *d_o[kOuts], *o[kOuts];
    for (int r = 0; r < kOuts; r++) d_o[r] = dev_poisoned(no);
    /* unfused: q and k normed and rotated in memory, then the attention */
    qk_norm_rope_cuda(d_full, ld, d_full + qd, ld, T, nh, nkv, hd, wq, wk, 1e-6f, d_pos, d_inv, stream);
    attention_wgmma_forward_cuda(d_o[kUnfused], ldo, d_full, ld, d_full + qd, ld, d_full + qd + kd, ld, d_cu, nseq,
                                 maxlen, nh, nkv, hd, scale, 1, stream);
    /* folded: k only in memory, q in the attention (TMA, then cp.async staging) */
    qk_norm_rope_cuda(NULL, ld, d_konly + qd, ld, T, 0, nkv, hd, NULL, wk, 1e-6f, d_pos, d_inv, stream);
    for (int r = kFold; r <= kFoldCp; r++)
        attention_wgmma_qfold_forward_cuda(d_o[r], ldo, d_konly, ld, d_konly + qd, ld, d_konly + qd + kd, ld, d_cu,
                                           nseq, maxlen, nh, nkv, hd, scale, r == kFold, &fold, stream);
    /* the public path as attn_block_cuda.c takes it */
    const int applies = attention_qfold_applies(d_o[kPublic], ldo, d_pub, ld, d_pub + qd, ld, d_pub + qd + kd, ld, hd,
                                                0, NULL);
    qk_norm_rope_cuda(applies ? NULL : d_pub, ld, d_pub + qd, ld, T, applies ? 0 : nh, nkv, hd, wq, wk, 1e-6f, d_pos,
                      d_inv, stream);
    attention_causal_qfold_forward_cuda(d_o[kPublic], ldo, d_pub, ld, d_pub + qd, ld, d_pub + qd + kd, ld, d_cu, nseq,
                                        maxlen, nh, nkv, hd, scale, 0, NULL, applies ? &fold : NULL, stream);
    for (int r = 0; r < kOuts; r++) o[r] = dev_get(d_o[r], no * 2);
    uint16_t *full = dev_get(d_full, nx * 2), *konly = dev_get(d_konly, nx * 2);

    char name[256];
    snprintf(name, sizeof name, "attention_qfold T=%d nseq=%d nh=%d nkv=%d hd=%d norm=%d maxlen=%d", T, nseq, nh, nkv,
             hd, with_norm, maxlen);
    double nr = 0, e = err_vs_max(o[kFold], ldo, ref, qd, T, qd, &nr);
    int ok = e <= 1e-2 && nr <= 5e-3;
    printf("%s %s: folded vs the CPU reference max_err/max_ref=%.3g (tol 1e-2) norm_rel=%.3g (tol 5e-3)\n",
           ok ? "ok" : "FAIL", name, e, nr);
    if (!ok) failures++;
    /* folded against unfused: the same bits, or (a per-row qk_norm_rope kernel) the same tolerances */
    size_t diff = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < qd; i++) diff += o[kFold][(size_t)t * ldo + i] != o[kUnfused][(size_t)t * ldo + i];
    if (bitwise) {
        printf("%s %s: folded bitwise identical to qk_norm_rope_cuda + attention (%zu of %zu values differ)\n",
               diff ? "FAIL" : "ok", name, diff, (size_t)T * qd);
        if (diff) failures++;
    } else {
        float *uf = xmalloc(sizeof(float) * (size_t)T * qd);
        for (int t = 0; t < T; t++)
            for (int i = 0; i < qd; i++) uf[(size_t)t * qd + i] = bf16_to_f32(o[kUnfused][(size_t)t * ldo + i]);
        double nr2 = 0, e2 = err_vs_max(o[kFold], ldo, uf, qd, T, qd, &nr2);
        int ok2 = e2 <= 1e-2 && nr2 <= 5e-3;
        printf("%s %s: folded vs qk_norm_rope_cuda + attention (its per-row kernel: not bitwise, %zu of %zu values "
               "differ) max_err/max=%.3g (tol 1e-2) norm_rel=%.3g (tol 5e-3)\n", ok2 ? "ok" : "FAIL", name, diff,
               (size_t)T * qd, e2, nr2);
        if (!ok2) failures++;
        free(uf);
    }
    /* the cp.async staging: the same bits; memory: k of the k-only call, q raw */
    size_t dcp = 0, dk = 0, dq = 0;
    for (size_t i = 0; i < no; i++) dcp += o[kFoldCp][i] != o[kFold][i];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < qd + kd; i++) {
            const size_t j = (size_t)t * ld + i;
            if (i < qd) dq += konly[j] != x[j];
            else dk += konly[j] != full[j];
        }
    printf("%s %s: cp.async staging bitwise identical to TMA's (%zu of %zu values differ)\n", dcp ? "FAIL" : "ok", name,
           dcp, no);
    printf("%s %s: q left raw in memory (%zu values changed)\n", dq ? "FAIL" : "ok", name, dq);
    failures += dcp != 0, failures += dq != 0;
    if (bitwise) {
        printf("%s %s: k of the k-only qk_norm_rope_cuda bitwise identical to the full call's (%zu differ)\n",
               dk ? "FAIL" : "ok", name, dk);
        failures += dk != 0;
    }
    /* the public path: the switch read as the environment says, the output as the path it chose */
    const char *env = getenv("DFLASH_ATTENTION_QFOLD");
    const int want = env && (!strcmp(env, "1") || !strcmp(env, "begin")) && attention_wgmma_chosen(hd);
    size_t dp = 0;
    for (size_t i = 0; i < no; i++) dp += o[kPublic][i] != o[applies ? kFold : kUnfused][i];
    if (!applies && !attention_wgmma_chosen(hd)) { /* DFLASH_ATTENTION=mma_sync: the other kernel, its own bits */
        double nrp = 0, ep = err_vs_max(o[kPublic], ldo, ref, qd, T, qd, &nrp);
        const int okp = applies == want && ep <= 1e-2 && nrp <= 5e-3;
        printf("%s %s: attention_qfold_applies 0 (wgmma not chosen); the public path by mma.sync max_err/max_ref=%.3g "
               "norm_rel=%.3g\n", okp ? "ok" : "FAIL", name, ep, nrp);
        failures += !okp;
    } else {
        printf("%s %s: attention_qfold_applies %d (DFLASH_ATTENTION_QFOLD=%s); attention_causal_qfold_forward_cuda "
               "bitwise identical to the %s path (%zu of %zu values differ)\n",
               applies == want && !dp ? "ok" : "FAIL", name, applies, env ? env : "(unset)",
               applies ? "folded" : "unfused", dp, no);
        failures += applies != want || dp != 0;
    }
    fflush(stdout);
    for (int r = 0; r < kOuts; r++) {
        CHECK_CUDA(cudaFree(d_o[r]));
        free(o[r]);
    }
    CHECK_CUDA(cudaFree(d_full)); CHECK_CUDA(cudaFree(d_konly)); CHECK_CUDA(cudaFree(d_pub));
    CHECK_CUDA(cudaFree(d_qw)); CHECK_CUDA(cudaFree(d_kw)); CHECK_CUDA(cudaFree(d_pos)); CHECK_CUDA(cudaFree(d_cu));
    CHECK_CUDA(cudaFree(d_inv));
    free(cu), free(pos), free(x_f), free(qw_f), free(kw_f), free(x), free(qw), free(kw), free(inv), free(ref);
    free(full), free(konly);
}
#endif

const kc_op kc_rope_inv_freq = {"rope_inv_freq", "f64", "regime", rope_inv_freq_cpu_check, NULL};
const kc_op kc_rope_apply = {"rope_apply", "f32", "n heads hd ld theta", rope_apply_cpu_check, NULL};
const kc_op kc_qk_norm_rope = {"qk_norm_rope", "bf16", "n nh nkv hd with_norm maxpos", qk_norm_rope_cpu_check,
                               KC_CUDA(qk_norm_rope_cuda_check)};
const kc_op kc_qk_norm_rope_backward = {"qk_norm_rope_backward", "bf16 (dw f32)", "n nh nkv hd with_norm maxpos no_q",
                                        qk_norm_rope_backward_cpu_check, KC_CUDA(qk_norm_rope_backward_cuda_check)};
const kc_op kc_qk_norm_rope_partial = {"qk_norm_rope_partial", "bf16", "n nh nkv hd rd vs_full",
                                       qk_norm_rope_partial_cpu_check,
                                       KC_CUDA(qk_norm_rope_partial_cuda_check)};
const kc_op kc_attention_causal = {"attention_causal_forward", "bf16", "nh nkv hd amp", attention_cpu_check,
                                   KC_CUDA(attention_cuda_check)};
/* no CPU check of its own: its reference is attention_causal_forward's, checked by that op's rows */
const kc_op kc_attention_wgmma = {"attention_wgmma", "bf16", "nh nkv hd amp", NULL,
                                  KC_CUDA(attention_wgmma_cuda_check)};
/* the Q side of qk_norm_rope folded into the Hopper attention (attention_qfold) */
const kc_op kc_attention_qfold = {"attention_qfold", "bf16", "nh nkv hd with_norm bitwise", attention_qfold_cpu_check,
                                  KC_CUDA(attention_qfold_cuda_check)};
