/* adamw CPU reference: two steps against a scalar sequence computed here in double from the AdamW formulas
 * (decoupled decay on and off, a clip coefficient applied to the gradient), the gradient square-sum in double,
 * the clip coefficient, and the learning-rate schedule at warm-up, peak, mid-decay and end. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "adamw.h"
#include "tests/test.h"
#include "util.h"

#define NP 6

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

static void run_two_steps(int decay, float wd, float scale)
{
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
}

TEST(two_steps_no_decay) { run_two_steps(0, 0.1f, 1.0f); }
TEST(two_steps_decay) { run_two_steps(1, 0.1f, 1.0f); }
TEST(two_steps_decay_clipped) { run_two_steps(1, 0.1f, 0.3f); }
TEST(two_steps_decay_flag_with_zero_wd) { run_two_steps(1, 0.0f, 0.5f); }

/* Decay on vs off differs by exactly the decoupled shrink on step one (same moments, same update). */
TEST(decay_is_decoupled)
{
    float a[NP], b[NP], ma[NP] = {0}, va[NP] = {0}, mb[NP] = {0}, vb[NP] = {0};
    for (int i = 0; i < NP; i++) a[i] = b[i] = p0[i];
    adamw_params hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.5f};
    adamw_step_cpu(a, g1, ma, va, NP, &hp, 1, 1.0f, 1);
    adamw_step_cpu(b, g1, mb, vb, NP, &hp, 1, 1.0f, 0);
    for (int i = 0; i < NP; i++) {
        EXPECT(ma[i] == mb[i] && va[i] == vb[i]);
        EXPECT_NEAR(a[i] - b[i], -1e-2 * 0.5 * p0[i], 5e-7);
    }
}

TEST(grad_sq_sum_in_double)
{
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

TEST(clip_coefficient)
{
    EXPECT(grad_clip_coef(0.5, 1.0f) == 1.0f);
    EXPECT_NEAR(grad_clip_coef(1.0, 1.0f), 1.0 / (1.0 + 1e-6), 1e-7);
    EXPECT(grad_clip_coef(1.0, 1.0f) < 1.0f); /* just below 1 */
    EXPECT_NEAR(grad_clip_coef(4.0, 1.0f), 1.0 / (4.0 + 1e-6), 1e-7);
    EXPECT_NEAR(grad_clip_coef(10.0, 2.5f), 2.5 / (10.0 + 1e-6), 1e-7);
    EXPECT(grad_clip_coef(100.0, 0.0f) == 1.0f);  /* clipping disabled */
    EXPECT(grad_clip_coef(100.0, -1.0f) == 1.0f);
    EXPECT(grad_clip_coef(0.0, 1.0f) == 1.0f);
}

TEST(lr_schedule_warmup_peak_end)
{
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

TEST_MAIN
