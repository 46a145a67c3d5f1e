/* The optimizer: adamw_step_cpu (two steps against the AdamW formulas in double; decay decoupled), grad_sq_sum_cpu
 * (in double), grad_clip_coef, lr_schedule; on the device grad_sq_sum_cuda and adamw_apply_cuda (ranges with and
 * without decay, in place, misaligned, NaN gradient or loss: the step skipped) against the CPU step. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "adamw.h"
#include "tests/kernel_cases.h"
#include "tests/test.h"
#include "util.h"

#define NP 6
#define HBM_GBS 4300.0 /* H200 peak bandwidth, GB/s */

static const float p0[NP] = {1.0f, -0.5f, 0.25f, 2.0f, -1.5f, 0.0f};
static const float g1[NP] = {0.1f, -0.2f, 0.0f, 3.0f, 1e-4f, -0.7f};
static const float g2[NP] = {-0.3f, -0.2f, 0.5f, 1.0f, 2e-4f, 0.7f};

/* Expected parameters after two steps, in double, straight from the formulas. */
static void expected_two_steps(double *pe, double *me, double *ve, double lr1, double lr2, double b1, double b2,
                               double eps, double wd, int decay, double scale)
{
    const float *gs[2] = {g1, g2};
    const double lrs[2] = {lr1, lr2};
    for (int i = 0; i < NP; i++) {
        double p = p0[i], m = 0, v = 0;
        for (int t = 1; t <= 2; t++) {
            double lr = lrs[t - 1];
            if (decay && wd != 0) p *= 1 - lr * wd;
            double g = (double)gs[t - 1][i] * scale;
            m = b1 * m + (1 - b1) * g;
            v = b2 * v + (1 - b2) * g * g;
            double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
            p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps);
        }
        pe[i] = p;
        me[i] = m;
        ve[i] = v;
    }
}

/* decay wd_milli scale_milli: two steps against the formulas; then decay on vs off differs by exactly the
 * decoupled shrink on step one (same moments, same update) */
static void adamw_step_cpu_check(const kc_case *c)
{
    int decay = c->p[0];
    float wd = c->p[1] / 1000.0f, scale = c->p[2] / 1000.0f;
    float p[NP], m[NP] = {0}, v[NP] = {0};
    for (int i = 0; i < NP; i++) p[i] = p0[i];
    adamw_params hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = wd};
    adamw_step_cpu(p, g1, m, v, NP, &hp, 1, scale, decay);
    hp.lr = 5e-3f;
    adamw_step_cpu(p, g2, m, v, NP, &hp, 2, scale, decay);
    double pe[NP], me[NP], ve[NP];
    expected_two_steps(pe, me, ve, 1e-2f, 5e-3f, 0.9f, 0.95f, 1e-8f, wd, decay, scale);
    for (int i = 0; i < NP; i++) {
        EXPECT_NEAR(p[i], pe[i], 1e-6 * (1 + fabs(pe[i])));
        EXPECT_NEAR(m[i], me[i], 1e-6 * (1e-3 + fabs(me[i])));
        EXPECT_NEAR(v[i], ve[i], 1e-6 * (1e-6 + fabs(ve[i])));
    }
    if (test_failed_here) fprintf(stderr, "  (decay=%d wd=%g scale=%g)\n", decay, wd, scale);

    float a[NP], b[NP], ma[NP] = {0}, va[NP] = {0}, mb[NP] = {0}, vb[NP] = {0};
    for (int i = 0; i < NP; i++) a[i] = b[i] = p0[i];
    adamw_params hq = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.5f};
    adamw_step_cpu(a, g1, ma, va, NP, &hq, 1, 1.0f, 1);
    adamw_step_cpu(b, g1, mb, vb, NP, &hq, 1, 1.0f, 0);
    for (int i = 0; i < NP; i++) {
        EXPECT(ma[i] == mb[i] && va[i] == vb[i]);
        EXPECT_NEAR(a[i] - b[i], -1e-2 * 0.5 * p0[i], 5e-7);
    }
}

static void grad_sq_sum_cpu_check(const kc_case *c)
{
    (void)c;
    float g[5] = {1, -2, 3, 0.5f, -0.25f};
    EXPECT_NEAR(grad_sq_sum_cpu(g, 5), 1 + 4 + 9 + 0.25 + 0.0625, 1e-12);
    /* 2^22 equal terms: a float accumulator would stall far from the true sum */
    size_t n = (size_t)1 << 22;
    float *x = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) x[i] = 0.1f;
    double want = (double)n * (double)0.1f * (double)0.1f;
    EXPECT_NEAR(grad_sq_sum_cpu(x, n), want, 1e-9 * want);
    free(x);
    EXPECT(grad_sq_sum_cpu(g, 0) == 0.0);
}

static void grad_clip_coef_cpu_check(const kc_case *c)
{
    (void)c;
    EXPECT(grad_clip_coef(0.5, 1.0f) == 1.0f);
    EXPECT_NEAR(grad_clip_coef(1.0, 1.0f), 1.0 / (1.0 + 1e-6), 1e-7);
    EXPECT(grad_clip_coef(1.0, 1.0f) < 1.0f); /* just below 1 */
    EXPECT_NEAR(grad_clip_coef(4.0, 1.0f), 1.0 / (4.0 + 1e-6), 1e-7);
    EXPECT_NEAR(grad_clip_coef(10.0, 2.5f), 2.5 / (10.0 + 1e-6), 1e-7);
    EXPECT(grad_clip_coef(100.0, 0.0f) == 1.0f);  /* clipping disabled */
    EXPECT(grad_clip_coef(100.0, -1.0f) == 1.0f);
    EXPECT(grad_clip_coef(0.0, 1.0f) == 1.0f);
}

static void lr_schedule_cpu_check(const kc_case *c)
{
    (void)c;
    const float peak = 1e-3f, lo = 1e-5f;
    /* warm-up of 10 steps over a 110-step run */
    EXPECT_NEAR(lr_schedule(0, 10, 110, peak, lo), peak * 0.1, 1e-10);
    EXPECT_NEAR(lr_schedule(4, 10, 110, peak, lo), peak * 0.5, 1e-10);
    EXPECT_NEAR(lr_schedule(9, 10, 110, peak, lo), peak, 1e-10);
    EXPECT_NEAR(lr_schedule(10, 10, 110, peak, lo), peak, 1e-10);          /* cosine starts at the peak */
    EXPECT_NEAR(lr_schedule(60, 10, 110, peak, lo), lo + 0.5 * (peak - lo), 1e-10);
    double q = lo + 0.5 * (peak - lo) * (1 + cos(M_PI * 0.25));
    EXPECT_NEAR(lr_schedule(35, 10, 110, peak, lo), q, 1e-10);
    EXPECT_NEAR(lr_schedule(110, 10, 110, peak, lo), lo, 1e-10);
    EXPECT_NEAR(lr_schedule(500, 10, 110, peak, lo), lo, 1e-10);          /* clamped past the end */
    /* no warm-up: step 0 is the peak */
    EXPECT_NEAR(lr_schedule(0, 0, 100, peak, lo), peak, 1e-10);
    /* total <= warmup: decay span treated as one step */
    EXPECT_NEAR(lr_schedule(5, 5, 5, peak, lo), peak, 1e-10);
    EXPECT_NEAR(lr_schedule(6, 5, 5, peak, lo), lo, 1e-10);
}

#ifdef DFLASH_CUDA
/* n wd_milli clip_milli grad_amp_micro scale_den in_place misalign nan_grad nan_loss (scale = 1/scale_den).
 * in_place: dst = src; misalign: every buffer shifted by one float (scalar path); nan_grad / nan_loss: the guard. */
static void adamw_apply_cuda_check(const kc_case *c)
{
    size_t n = (size_t)c->p[0];
    float wd = c->p[1] / 1000.0f, clip = c->p[2] / 1000.0f, scale = 1.0f / (float)c->p[4];
    double grad_amp = c->p[3] / 1e6;
    int in_place = c->p[5], misalign = c->p[6], nan_grad = c->p[7], nan_loss = c->p[8];
    const int off = misalign ? 1 : 0;
    float *w = rnd_f32(n, 1.0, 0.0), *m = rnd_f32(n, 0.01, 0.0), *v = rnd_f32(n, 1e-4, 1e-4);
    float *g = rnd_f32(n, grad_amp, 0.0);
    if (nan_grad) g[n / 2] = NAN;
    float *gs = xmalloc(n * 4); /* the gradient the CPU reducer hands the step: fp32(g · scale) */
    for (size_t i = 0; i < n; i++) gs[i] = g[i] * scale;
    /* ranges: five slices of uneven sizes, alternating decay, covering [0, n) */
    adamw_range rg[5];
    size_t cuts[6] = {0, n / 7, n / 7 + 3, n / 2, n - n / 5, n};
    for (int i = 1; i < 6; i++) cuts[i] = cuts[i] < cuts[i - 1] ? cuts[i - 1] : cuts[i] > n ? n : cuts[i];
    for (int i = 0; i < 5; i++) rg[i] = (adamw_range){cuts[i], cuts[i + 1] - cuts[i], i % 2 == 0, 0};
    adamw_params p = {.lr = 6e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = wd};
    const long step = 7;
    float loss = nan_loss ? NAN : 2.5f;

    size_t bytes = (n + 4) * 4;
    float *d_w = dev_upload(NULL, bytes), *d_m = dev_upload(NULL, bytes), *d_v = dev_upload(NULL, bytes);
    float *d_g = dev_upload(NULL, bytes), *d_loss = dev_upload(&loss, 4);
    float *d_w2 = in_place ? d_w : dev_upload(NULL, bytes), *d_m2 = in_place ? d_m : dev_upload(NULL, bytes);
    float *d_v2 = in_place ? d_v : dev_upload(NULL, bytes);
    uint16_t *d_b = dev_upload(NULL, (n + 8) * 2);
    adamw_range *d_rg = dev_upload(rg, sizeof rg);
    double *d_sq = dev_upload(NULL, 8);
    int *d_skip = dev_upload(NULL, 4);
    void *d_ws = dev_upload(NULL, grad_sq_sum_cuda_workspace(n));
    dev_put(d_g + off, g, n * 4);
    double sq[2];
    float *rw[2], *rm[2], *rv[2];
    uint16_t *rb[2];
    int skipped[2];
    for (int run = 0; run < 2; run++) {
        dev_put(d_w + off, w, n * 4), dev_put(d_m + off, m, n * 4), dev_put(d_v + off, v, n * 4);
        if (!in_place) { /* poison: what the kernel does not write shows */
            CHECK_CUDA(cudaMemset(d_w2, 0xff, bytes)); CHECK_CUDA(cudaMemset(d_m2, 0xff, bytes));
            CHECK_CUDA(cudaMemset(d_v2, 0xff, bytes));
        }
        CHECK_CUDA(cudaMemset(d_b, 0xff, (n + 8) * 2));
        CHECK_CUDA(cudaMemset(d_skip, 0x7f, 4));
        grad_sq_sum_cuda(d_sq, d_g + off, n, scale, d_ws, stream);
        adamw_apply_cuda(d_w2 + off, d_m2 + off, d_v2 + off, d_b + off, d_w + off, d_m + off, d_v + off, d_g + off,
                         scale, n, d_rg, 5, d_sq, nan_loss || run ? d_loss : NULL, clip, &p, step, d_skip, stream);
        double *s = dev_get(d_sq, 8);
        int *sk = dev_get(d_skip, 4);
        sq[run] = *s, skipped[run] = *sk;
        free(s), free(sk);
        rw[run] = dev_get(d_w2 + off, n * 4), rm[run] = dev_get(d_m2 + off, n * 4), rv[run] = dev_get(d_v2 + off, n * 4);
        rb[run] = dev_get(d_b + off, n * 2);
    }
    char base[160], name[240];
    snprintf(base, sizeof base, "n=%zu wd=%g clip=%g scale=%g%s%s%s%s", n, wd, clip, scale, in_place ? " in_place" : "",
             misalign ? " misaligned" : "", nan_grad ? " nan_grad" : "", nan_loss ? " nan_loss" : "");
    if (!nan_grad) {
        double sq_ref = grad_sq_sum_cpu(gs, n);
        snprintf(name, sizeof name, "grad_sq_sum_cuda n=%zu%s (relative to the CPU's double sum)", n,
                 misalign ? " misaligned" : "");
        kc_report(name, fabs(sq[0] - sq_ref) / sq_ref, 1e-11); /* double sums of n terms in another order */
    }
    snprintf(name, sizeof name, "grad_sq_sum_cuda n=%zu", n);
    report_same_bits(name, &sq[0], &sq[1], 8, 0);
    int want_skip = nan_grad || nan_loss;
    snprintf(name, sizeof name, "adamw_apply_cuda skipped flag %s (|flag - %d|)", base, want_skip);
    kc_report(name, fabs((double)skipped[0] - want_skip) + fabs((double)skipped[1] - want_skip), 0.0);
    float *ew = xmalloc(n * 4), *em = xmalloc(n * 4), *ev = xmalloc(n * 4);
    memcpy(ew, w, n * 4), memcpy(em, m, n * 4), memcpy(ev, v, n * 4);
    if (!want_skip) { /* the CPU step with the clip coefficient of the GPU's norm (the norm is checked above) */
        float coef = grad_clip_coef(sqrt(sq[0]), clip);
        for (int i = 0; i < 5; i++)
            adamw_step_cpu(ew + rg[i].offset, gs + rg[i].offset, em + rg[i].offset, ev + rg[i].offset, rg[i].numel, &p,
                           step, coef, rg[i].decay);
    }
    /* the same operations in the same order, IEEE-rounded on both sides: the same bits are expected; the tolerance
     * allows 2 ulp */
    double mw = 0, mm_ = 0, mv = 0;
    double e_w = err_f32(rw[0], ew, n, &mw), e_m = err_f32(rm[0], em, n, &mm_), e_v = err_f32(rv[0], ev, n, &mv);
    size_t ndiff = 0, bdiff = 0;
    for (size_t i = 0; i < n; i++) {
        ndiff += memcmp(&rw[0][i], &ew[i], 4) || memcmp(&rm[0][i], &em[i], 4) || memcmp(&rv[0][i], &ev[i], 4);
        bdiff += rb[0][i] != f32_to_bf16(rw[0][i]);
    }
    snprintf(name, sizeof name, "adamw_apply_cuda w %s", base);
    kc_report(name, e_w, 0x1p-22 * mw);
    snprintf(name, sizeof name, "adamw_apply_cuda m %s", base);
    kc_report(name, e_m, 0x1p-22 * mm_);
    snprintf(name, sizeof name, "adamw_apply_cuda v %s", base);
    kc_report(name, e_v, 0x1p-22 * mv);
    printf("  (adamw_apply_cuda %s: %zu of %zu elements not bit-identical to the CPU)\n", base, ndiff, n);
    snprintf(name, sizeof name, "adamw_apply_cuda bf16 copy == bf16(new w) %s (elements differing)", base);
    kc_report(name, (double)bdiff, 0.0);
    snprintf(name, sizeof name, "adamw_apply_cuda %s w", base);
    report_same_bits(name, rw[0], rw[1], n * 4, 1);
    snprintf(name, sizeof name, "adamw_apply_cuda %s m", base);
    report_same_bits(name, rm[0], rm[1], n * 4, 1);
    snprintf(name, sizeof name, "adamw_apply_cuda %s v", base);
    report_same_bits(name, rv[0], rv[1], n * 4, 1);
    snprintf(name, sizeof name, "adamw_apply_cuda %s bf16", base);
    report_same_bits(name, rb[0], rb[1], n * 2, 0);
    CHECK_CUDA(cudaFree(d_w)); CHECK_CUDA(cudaFree(d_m)); CHECK_CUDA(cudaFree(d_v)); CHECK_CUDA(cudaFree(d_g));
    CHECK_CUDA(cudaFree(d_loss)); CHECK_CUDA(cudaFree(d_b)); CHECK_CUDA(cudaFree(d_rg)); CHECK_CUDA(cudaFree(d_sq));
    CHECK_CUDA(cudaFree(d_skip)); CHECK_CUDA(cudaFree(d_ws));
    if (!in_place) {
        CHECK_CUDA(cudaFree(d_w2)); CHECK_CUDA(cudaFree(d_m2)); CHECK_CUDA(cudaFree(d_v2));
    }
    free(w), free(m), free(v), free(g), free(gs), free(ew), free(em), free(ev);
    for (int r = 0; r < 2; r++) free(rw[r]), free(rm[r]), free(rv[r]), free(rb[r]);
}

/* 1.05e9 parameters (the Qwen3-8B drafter) when the device holds 30 bytes per parameter, else 2.5e8. Values from a
 * byte pattern (0x3c3c3c3c = 0.0115 as fp32): timing does not need random ones. */
void kc_time_adamw(void)
{
    size_t fr = 0, tot = 0;
    CHECK_CUDA(cudaMemGetInfo(&fr, &tot));
    size_t n = (size_t)1050000000;
    if ((double)fr < 32.0 * n + (2ull << 30)) n = 250000000;
    float *buf[7];
    for (int i = 0; i < 7; i++) { /* w m v (src), w m v (dst), grad */
        CHECK_CUDA(cudaMalloc((void **)&buf[i], n * 4));
        CHECK_CUDA(cudaMemset(buf[i], 0x3c, n * 4));
    }
    uint16_t *bf = NULL;
    CHECK_CUDA(cudaMalloc((void **)&bf, n * 2));
    adamw_range rg = {0, n, 1, 0};
    adamw_range *d_rg = dev_upload(&rg, sizeof rg);
    double *d_sq = dev_upload(NULL, 8);
    int *d_skip = dev_upload(NULL, 4);
    void *d_ws = dev_upload(NULL, grad_sq_sum_cuda_workspace(n));
    adamw_params p = {.lr = 6e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.01f};
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a)); CHECK_CUDA(cudaEventCreate(&b));
    grad_sq_sum_cuda(d_sq, buf[6], n, 0.5f, d_ws, stream);
    const int iters = 5;
    CHECK_CUDA(cudaEventRecord(a, stream));
    for (int i = 0; i < iters; i++) grad_sq_sum_cuda(d_sq, buf[6], n, 0.5f, d_ws, stream);
    CHECK_CUDA(cudaEventRecord(b, stream));
    double ms = elapsed_ms(a, b) / iters, bytes = 4.0 * n;
    printf("timing grad_sq_sum_cuda n=%zu: %.3f ms, %.0f GB/s (%.0f%% of %.0f GB/s; bytes = grad)\n", n, ms,
           bytes / ms / 1e6, 100.0 * bytes / ms / 1e6 / HBM_GBS, HBM_GBS);
    for (int step = 1; step <= 2; step++) /* warm-up, both parities */
        adamw_apply_cuda(buf[3], buf[4], buf[5], bf, buf[0], buf[1], buf[2], buf[6], 0.5f, n, d_rg, 1, d_sq, NULL,
                         1.0f, &p, step, d_skip, stream);
    CHECK_CUDA(cudaEventRecord(a, stream));
    for (int i = 0; i < iters; i++) { /* double-buffered by step parity */
        int s = i % 2 ? 3 : 0, d = i % 2 ? 0 : 3;
        adamw_apply_cuda(buf[d], buf[d + 1], buf[d + 2], bf, buf[s], buf[s + 1], buf[s + 2], buf[6], 0.5f, n, d_rg, 1,
                         d_sq, NULL, 1.0f, &p, 3 + i, d_skip, stream);
    }
    CHECK_CUDA(cudaEventRecord(b, stream));
    ms = elapsed_ms(a, b) / iters, bytes = 30.0 * n;
    printf("timing adamw_apply_cuda n=%zu: %.3f ms, %.0f GB/s (%.0f%% of %.0f GB/s; bytes = 16 read + 12 + 2 written "
           "per parameter)\n", n, ms, bytes / ms / 1e6, 100.0 * bytes / ms / 1e6 / HBM_GBS, HBM_GBS);
    CHECK_CUDA(cudaEventDestroy(a)); CHECK_CUDA(cudaEventDestroy(b));
    for (int i = 0; i < 7; i++) CHECK_CUDA(cudaFree(buf[i]));
    CHECK_CUDA(cudaFree(bf)); CHECK_CUDA(cudaFree(d_rg)); CHECK_CUDA(cudaFree(d_sq)); CHECK_CUDA(cudaFree(d_skip));
    CHECK_CUDA(cudaFree(d_ws));
}
#endif

const kc_op kc_adamw_step = {"adamw_step", "f32", "decay wd_milli scale_milli", adamw_step_cpu_check, NULL};
const kc_op kc_grad_sq_sum = {"grad_sq_sum", "f32->f64", "", grad_sq_sum_cpu_check, NULL};
const kc_op kc_grad_clip_coef = {"grad_clip_coef", "f64", "", grad_clip_coef_cpu_check, NULL};
const kc_op kc_lr_schedule = {"lr_schedule", "f64", "", lr_schedule_cpu_check, NULL};
const kc_op kc_adamw_apply = {"adamw_apply", "f32 (+bf16 copy)",
                              "n wd_milli clip_milli grad_amp_micro scale_den in_place misalign nan_grad nan_loss", NULL,
                              KC_CUDA(adamw_apply_cuda_check)};
