/* cross_entropy CPU reference: CE against a naive double log-softmax, argmax (ties to the lowest index), dh
 * against central finite differences of Σ w·CE·loss_scale, and zero rows where the weight is 0. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cross_entropy.h"
#include "tests/test.h"
#include "util.h"

#define N 7
#define H 16
#define V 37

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

typedef struct ce_case {
    float h[N * H], lm[V * H], w[N];
    int32_t lab[N];
} ce_case;

static void case_init(ce_case *c)
{
    for (int i = 0; i < N * H; i++) c->h[i] = 2.0f * frand();
    for (int i = 0; i < V * H; i++) c->lm[i] = frand();
    for (int i = 0; i < N; i++) {
        c->lab[i] = (int32_t)((i * 11 + 5) % V);
        c->w[i] = (float)exp(-(double)i / 3.0);
    }
    c->w[2] = 0.0f;
    c->lab[2] = -1; /* a padded slot: label unused when the weight is 0 */
    c->w[5] = 0.0f;
}

/* Naive CE of row i in double, with h given in double so finite differences are clean. */
static double naive_ce(const double *hrow, const float *lm, int label, int *amax)
{
    double lg[V], mx = -INFINITY;
    for (int k = 0; k < V; k++) {
        lg[k] = 0;
        for (int e = 0; e < H; e++) lg[k] += hrow[e] * lm[k * H + e];
        if (lg[k] > mx) { mx = lg[k]; if (amax) *amax = k; }
    }
    double s = 0;
    for (int k = 0; k < V; k++) s += exp(lg[k] - mx);
    return mx + log(s) - lg[label];
}

TEST(ce_and_argmax_match_naive)
{
    ce_case c;
    case_init(&c);
    float ce[N], ws[N * V];
    int32_t am[N];
    for (int i = 0; i < N; i++) { ce[i] = 99.0f; am[i] = -7; }
    cross_entropy_chunk_cpu(ce, am, NULL, c.h, N, H, c.lm, V, c.lab, c.w, 1.0f, ws);
    for (int i = 0; i < N; i++) {
        double hrow[H];
        for (int e = 0; e < H; e++) hrow[e] = c.h[i * H + e];
        int ra = -1;
        double rce = naive_ce(hrow, c.lm, c.lab[i] < 0 ? 0 : c.lab[i], &ra);
        if (c.w[i] == 0.0f) EXPECT(ce[i] == 0.0f);
        else EXPECT_NEAR(ce[i], rce, 1e-5 * (1 + rce));
        EXPECT(am[i] == ra);
    }
}

TEST(argmax_ties_take_lowest_index)
{
    /* small integers: every logit is exact in float whatever the summation order */
    float h[2 * 4] = {1, 2, 0, -1, 0, 0, 1, 1};
    float lm[6 * 4] = {0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 3, 3, 1, 2, 0, 0};
    /* row 0 logits: 0, 2, 5, 0, -3, 5 -> tie between 2 and 5; row 1: 0, 2, 0, 0, 6, 0 -> 4 */
    int32_t lab[2] = {1, 0}, am[2] = {-1, -1};
    float w[2] = {1, 0}, ce[2], ws[2 * 6];
    cross_entropy_chunk_cpu(ce, am, NULL, h, 2, 4, lm, 6, lab, w, 1.0f, ws);
    EXPECT(am[0] == 2);
    EXPECT(am[1] == 4);
    /* row 0: lse of {0,2,5,0,-3,5} minus logit 2 */
    double s = exp(0) + exp(2) + exp(5) + exp(0) + exp(-3) + exp(5);
    EXPECT_NEAR(ce[0], log(s) - 2.0, 1e-5);
    EXPECT(ce[1] == 0.0f);
}

TEST(dh_matches_finite_differences)
{
    ce_case c;
    case_init(&c);
    const float scale = 0.37f;
    float ce[N], dh[N * H], ws[N * V], ce2[N];
    for (int i = 0; i < N * H; i++) dh[i] = 55.0f; /* must be overwritten */
    cross_entropy_chunk_cpu(ce, NULL, dh, c.h, N, H, c.lm, V, c.lab, c.w, scale, ws);
    /* the forward results do not depend on whether the backward ran */
    cross_entropy_chunk_cpu(ce2, NULL, NULL, c.h, N, H, c.lm, V, c.lab, c.w, scale, ws);
    for (int i = 0; i < N; i++) EXPECT(ce[i] == ce2[i]);

    double num = 0, den = 0;
    for (int i = 0; i < N; i++) {
        for (int e = 0; e < H; e++) {
            double fd = 0;
            if (c.w[i] != 0.0f) {
                double hp[H], hm[H], step = 1e-4;
                for (int f = 0; f < H; f++) hp[f] = hm[f] = c.h[i * H + f];
                hp[e] += step;
                hm[e] -= step;
                fd = (double)c.w[i] * scale *
                     (naive_ce(hp, c.lm, c.lab[i], NULL) - naive_ce(hm, c.lm, c.lab[i], NULL)) / (2 * step);
            }
            double g = dh[i * H + e];
            if (c.w[i] == 0.0f) EXPECT(g == 0.0);
            else EXPECT_NEAR(g, fd, 1e-5 + 1e-3 * fabs(fd));
            num += (g - fd) * (g - fd);
            den += fd * fd;
        }
    }
    EXPECT(den > 0 && sqrt(num) <= 1e-4 * sqrt(den));
}

TEST(all_zero_weights_give_zeros)
{
    ce_case c;
    case_init(&c);
    for (int i = 0; i < N; i++) c.w[i] = 0.0f;
    float ce[N], dh[N * H], ws[N * V];
    for (int i = 0; i < N * H; i++) dh[i] = 1.0f;
    for (int i = 0; i < N; i++) ce[i] = 1.0f;
    cross_entropy_chunk_cpu(ce, NULL, dh, c.h, N, H, c.lm, V, c.lab, c.w, 1.0f, ws);
    for (int i = 0; i < N; i++) EXPECT(ce[i] == 0.0f);
    for (int i = 0; i < N * H; i++) EXPECT(dh[i] == 0.0f);
}

TEST_MAIN
