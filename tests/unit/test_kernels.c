/* CPU operators of the target forward: each forward against a naive double-precision reference on odd shapes and
 * wide strides; the backwards the drafter reuses (matmul, rmsnorm, rope, swiglu) against central finite
 * differences of L = Σ dy ⊙ y. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "cast.h"
#include "colsum.h"
#include "embedding.h"
#include "matmul.h"
#include "rmsnorm.h"
#include "rope.h"
#include "swiglu.h"
#include "tests/test.h"
#include "util.h"

/* ---- helpers ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double rnd_uniform(void) /* [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static float *rnd_floats(size_t n, double amp)
{
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = (float)(amp * rnd_uniform());
    return p;
}

static float *dup_floats(const float *src, size_t n)
{
    float *p = xmalloc(n * sizeof *p);
    memcpy(p, src, n * sizeof *p);
    return p;
}

static double max_abs(const float *a, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}

/* Σ dy ⊙ y over a (rows, cols; ld) tensor, in double. */
static double dot_loss(const float *dy, const float *y, int rows, int cols, int ld)
{
    double s = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) s += (double)dy[(size_t)r * ld + c] * y[(size_t)r * ld + c];
    return s;
}

/* A loss of the parameters, evaluated in float by the operator under test. */
typedef double (*loss_fn)(void *ctx);

/* Central differences of loss() with respect to each of the n elements of p (step 1e-3) against the analytic
 * gradient an (row stride ld, cols per row). Fails when max |fd − an| > 1e-2 · max |an| (with a floor so an
 * all-zero gradient is still compared in absolute terms). */
static void check_grad(const char *what, float *p, int rows, int cols, int ld, const float *an, int an_ld,
                       loss_fn loss, void *ctx)
{
    const float h = 1e-3f;
    double amax = 0, err = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) amax = fmax(amax, fabs(an[(size_t)r * an_ld + c]));
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float *e = &p[(size_t)r * ld + c];
            float keep = *e;
            *e = keep + h;
            double lp = loss(ctx);
            *e = keep - h;
            double lm = loss(ctx);
            *e = keep;
            double fd = (lp - lm) / (2.0 * h);
            err = fmax(err, fabs(fd - an[(size_t)r * an_ld + c]));
        }
    double tol = 1e-2 * fmax(amax, 1e-2);
    if (!(err <= tol)) {
        fprintf(stderr, "  %s: max |fd - analytic| = %g > tol %g (max |analytic| %g)\n", what, err, tol, amax);
        test_failed_here = 1;
    }
}

/* ---- matmul ---- */

TEST(colsum_adds_every_row_into_dw)
{
    enum { P = 70, DIM = 9 };
    float part[P * DIM], dw[DIM];
    for (int i = 0; i < P * DIM; i++) part[i] = (float)((i * 37) % 11) - 5.0f;
    for (int c = 0; c < DIM; c++) dw[c] = (float)c;
    colsum_add_cpu(dw, part, P, DIM);
    for (int c = 0; c < DIM; c++) {
        double want = c;
        for (int p = 0; p < P; p++) want += part[p * DIM + c];
        EXPECT_NEAR(dw[c], want, 1e-4);
    }
}

TEST(cast_rounds_to_nearest_even_and_keeps_nan)
{
    const float in[] = {1.0f, 1.00390625f /* 1 + 2^-8: a tie, down to even */, 1.01171875f /* tie, up */, -2.5f,
                        NAN, INFINITY};
    uint16_t out[6];
    cast_f32_bf16_cpu(out, in, 6);
    EXPECT(out[0] == 0x3f80 && out[1] == 0x3f80 && out[2] == 0x3f82 && out[3] == 0xc020);
    EXPECT((out[4] & 0x7f80) == 0x7f80 && (out[4] & 0x7f) != 0);
    EXPECT(out[5] == 0x7f80);
}

TEST(matmul_forward_strided)
{
    int m = 13, n = 7, k = 19, ldx = 23, ldy = 11;
    float *x = rnd_floats((size_t)m * ldx, 1.0), *w = rnd_floats((size_t)n * k, 1.0);
    float *y = rnd_floats((size_t)m * ldy, 1.0), *y0 = dup_floats(y, (size_t)m * ldy);
    for (int acc = 0; acc <= 1; acc++) {
        memcpy(y, y0, (size_t)m * ldy * sizeof *y);
        matmul_forward_cpu(y, ldy, x, ldx, w, m, n, k, acc);
        double worst = 0;
        for (int i = 0; i < m; i++)
            for (int j = 0; j < ldy; j++) {
                if (j >= n) { /* padding columns are untouched */
                    EXPECT(y[(size_t)i * ldy + j] == y0[(size_t)i * ldy + j]);
                    continue;
                }
                double ref = acc ? y0[(size_t)i * ldy + j] : 0, mag = fabs(ref);
                for (int e = 0; e < k; e++) {
                    ref += (double)x[(size_t)i * ldx + e] * w[(size_t)j * k + e];
                    mag += fabs((double)x[(size_t)i * ldx + e] * w[(size_t)j * k + e]);
                }
                worst = fmax(worst, fabs(y[(size_t)i * ldy + j] - ref) / (mag + 1e-30));
            }
        EXPECT(worst < 1e-6);
    }
    free(x), free(w), free(y), free(y0);
}

TEST(matmul_forward_k_zero)
{
    float y[6] = {1, 2, 3, 4, 5, 6}, x[1] = {0}, w[1] = {0};
    matmul_forward_cpu(y, 3, x, 0, w, 2, 3, 0, 1);
    EXPECT(y[0] == 1 && y[5] == 6);
    matmul_forward_cpu(y, 3, x, 0, w, 2, 3, 0, 0);
    for (int i = 0; i < 6; i++) EXPECT(y[i] == 0);
}

struct mm_ctx {
    float *x, *w, *dy, *y;
    int m, n, k, ldx, ldy;
};

static double mm_loss(void *p)
{
    struct mm_ctx *c = p;
    matmul_forward_cpu(c->y, c->ldy, c->x, c->ldx, c->w, c->m, c->n, c->k, 0);
    return dot_loss(c->dy, c->y, c->m, c->n, c->ldy);
}

TEST(matmul_backward_finite_diff)
{
    struct mm_ctx c = {.m = 5, .n = 6, .k = 9, .ldx = 11, .ldy = 8};
    c.x = rnd_floats((size_t)c.m * c.ldx, 1.0);
    c.w = rnd_floats((size_t)c.n * c.k, 1.0);
    c.dy = rnd_floats((size_t)c.m * c.ldy, 1.0);
    c.y = xmalloc((size_t)c.m * c.ldy * sizeof *c.y);
    int lddx = 10;
    float *dx = rnd_floats((size_t)c.m * lddx, 1.0), *dx0 = dup_floats(dx, (size_t)c.m * lddx);
    float *dw = rnd_floats((size_t)c.n * c.k, 1.0), *dw0 = dup_floats(dw, (size_t)c.n * c.k);

    matmul_backward_cpu(dx, lddx, 0, dw, c.dy, c.ldy, c.x, c.ldx, c.w, c.m, c.n, c.k);
    /* dw accumulates: compare the increment */
    float *ddw = xmalloc((size_t)c.n * c.k * sizeof *ddw);
    for (int i = 0; i < c.n * c.k; i++) ddw[i] = dw[i] - dw0[i];
    check_grad("dx", c.x, c.m, c.k, c.ldx, dx, lddx, mm_loss, &c);
    check_grad("dw", c.w, c.n, c.k, c.k, ddw, c.k, mm_loss, &c);

    /* accumulate_dx adds to what was there; NULL dw is skipped */
    float *dxa = dup_floats(dx0, (size_t)c.m * lddx);
    matmul_backward_cpu(dxa, lddx, 1, NULL, c.dy, c.ldy, c.x, c.ldx, c.w, c.m, c.n, c.k);
    double worst = 0;
    for (int i = 0; i < c.m; i++)
        for (int e = 0; e < c.k; e++) {
            size_t o = (size_t)i * lddx + e;
            worst = fmax(worst, fabs(dxa[o] - (dx0[o] + dx[o])));
        }
    EXPECT(worst < 1e-5);
    /* NULL dx: only dw, accumulated again */
    float *dw1 = dup_floats(dw, (size_t)c.n * c.k);
    matmul_backward_cpu(NULL, 0, 0, dw, c.dy, c.ldy, c.x, c.ldx, c.w, c.m, c.n, c.k);
    worst = 0;
    for (int i = 0; i < c.n * c.k; i++) worst = fmax(worst, fabs(dw[i] - dw1[i] - ddw[i]));
    EXPECT(worst < 1e-5);
    free(c.x), free(c.w), free(c.dy), free(c.y), free(dx), free(dx0), free(dw), free(dw0), free(ddw), free(dxa), free(dw1);
}

/* ---- embedding ---- */

TEST(embedding_forward_gather)
{
    int vocab = 17, dim = 13, n = 9;
    float *table = rnd_floats((size_t)vocab * dim, 1.0), *out = xmalloc((size_t)n * dim * sizeof *out);
    int32_t ids[9] = {0, 16, 3, 3, 9, 1, 15, 0, 7};
    embedding_forward_cpu(out, ids, n, table, vocab, dim);
    for (int i = 0; i < n; i++)
        EXPECT(memcmp(out + (size_t)i * dim, table + (size_t)ids[i] * dim, (size_t)dim * sizeof *out) == 0);
    free(table), free(out);
}

static void embedding_expect_abort(int32_t bad)
{
    float table[8] = {0}, out[4];
    int32_t ids[2] = {1, bad};
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        embedding_forward_cpu(out, ids, 2, table, 4, 2);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
}

TEST(embedding_rejects_out_of_range_id)
{
    embedding_expect_abort(4);
    embedding_expect_abort(-1);
}

/* ---- rmsnorm ---- */

static void rmsnorm_ref(double *y, const float *x, const float *w, int dim, float eps)
{
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    double r = 1.0 / sqrt(ss / dim + eps);
    for (int i = 0; i < dim; i++) y[i] = w[i] * (x[i] * r);
}

TEST(rmsnorm_forward_strided_and_in_place)
{
    int rows = 7, dim = 37, ldx = 41, ldy = 39;
    float eps = 1e-6f;
    float *x = rnd_floats((size_t)rows * ldx, 3.0), *w = rnd_floats(dim, 1.5);
    x[0 * ldx + 5] = 0; /* a zero element and a tiny row */
    for (int i = 0; i < dim; i++) x[(size_t)2 * ldx + i] *= 1e-3f;
    float *y = xmalloc((size_t)rows * ldy * sizeof *y), *xi = dup_floats(x, (size_t)rows * ldx);
    double ref[37];
    rmsnorm_forward_cpu(y, ldy, x, ldx, w, rows, dim, eps);
    rmsnorm_forward_cpu(xi, ldx, xi, ldx, w, rows, dim, eps);
    double worst = 0, worst_ip = 0;
    for (int r = 0; r < rows; r++) {
        rmsnorm_ref(ref, x + (size_t)r * ldx, w, dim, eps);
        for (int i = 0; i < dim; i++) {
            double s = fabs(ref[i]) + 1e-30;
            worst = fmax(worst, fabs(y[(size_t)r * ldy + i] - ref[i]) / s);
            worst_ip = fmax(worst_ip, fabs(xi[(size_t)r * ldx + i] - ref[i]) / s);
        }
        for (int i = dim; i < ldx; i++) EXPECT(xi[(size_t)r * ldx + i] == x[(size_t)r * ldx + i]);
    }
    EXPECT(worst < 2e-6);
    EXPECT(worst_ip < 2e-6);
    free(x), free(w), free(y), free(xi);
}

struct rn_ctx {
    float *x, *w, *dy, *y;
    int rows, dim, ldx, ldy;
    float eps;
};

static double rn_loss(void *p)
{
    struct rn_ctx *c = p;
    rmsnorm_forward_cpu(c->y, c->ldy, c->x, c->ldx, c->w, c->rows, c->dim, c->eps);
    return dot_loss(c->dy, c->y, c->rows, c->dim, c->ldy);
}

TEST(rmsnorm_backward_finite_diff)
{
    struct rn_ctx c = {.rows = 4, .dim = 11, .ldx = 13, .ldy = 12, .eps = 1e-6f};
    c.x = rnd_floats((size_t)c.rows * c.ldx, 2.0);
    c.w = rnd_floats(c.dim, 1.5);
    c.dy = rnd_floats((size_t)c.rows * c.ldy, 1.0);
    c.y = xmalloc((size_t)c.rows * c.ldy * sizeof *c.y);
    int lddx = 14;
    float *dx = rnd_floats((size_t)c.rows * lddx, 1.0), *dx0 = dup_floats(dx, (size_t)c.rows * lddx);
    float *dw = rnd_floats(c.dim, 1.0), *dw0 = dup_floats(dw, c.dim), ddw[11];
    rmsnorm_backward_cpu(dx, lddx, 0, dw, c.dy, c.ldy, c.x, c.ldx, c.w, c.rows, c.dim, c.eps);
    for (int i = 0; i < c.dim; i++) ddw[i] = dw[i] - dw0[i];
    check_grad("dx", c.x, c.rows, c.dim, c.ldx, dx, lddx, rn_loss, &c);
    check_grad("dw", c.w, 1, c.dim, c.dim, ddw, c.dim, rn_loss, &c);

    float *dxa = dup_floats(dx0, (size_t)c.rows * lddx);
    rmsnorm_backward_cpu(dxa, lddx, 1, NULL, c.dy, c.ldy, c.x, c.ldx, c.w, c.rows, c.dim, c.eps);
    double worst = 0;
    for (int r = 0; r < c.rows; r++)
        for (int i = 0; i < lddx; i++) {
            size_t o = (size_t)r * lddx + i;
            worst = fmax(worst, fabs(dxa[o] - (i < c.dim ? dx0[o] + dx[o] : dx0[o])));
        }
    EXPECT(worst < 1e-5);
    free(c.x), free(c.w), free(c.dy), free(c.y), free(dx), free(dx0), free(dw), free(dw0), free(dxa);
}

/* ---- rope ---- */

TEST(rope_inv_freq_plain)
{
    rope_params p = {.theta = 1e6};
    double inv[11];
    rope_inv_freq(inv, 22, &p);
    for (int i = 0; i < 11; i++) EXPECT_NEAR(inv[i], exp(-(2.0 * i / 22) * log(1e6)), 1e-15);
}

TEST(rope_inv_freq_llama3_regimes)
{
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

TEST(rope_apply_matches_formula_and_inverts)
{
    int n = 6, heads = 3, hd = 22, ld = 3 * 22 + 5, half = hd / 2;
    rope_params p = {.theta = 1e6};
    double inv[11];
    rope_inv_freq(inv, hd, &p);
    int32_t pos[6] = {0, 1, 7, 130, 4095, 31999};
    float *x = rnd_floats((size_t)n * ld, 2.0), *y = dup_floats(x, (size_t)n * ld);
    rope_apply_cpu(y, ld, n, heads, hd, pos, inv, 0);
    double worst = 0;
    for (int t = 0; t < n; t++) {
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < half; i++) {
                const float *xh = x + (size_t)t * ld + (size_t)h * hd;
                const float *yh = y + (size_t)t * ld + (size_t)h * hd;
                double a = pos[t] * (1.0 / pow(1e6, 2.0 * i / hd));
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
    free(x), free(y);
}

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
    return dot_loss(c->dy, c->y, c->n, c->heads * c->hd, c->ld);
}

TEST(rope_backward_finite_diff)
{
    /* the backward of the rotation is the inverse rotation applied to dy */
    rope_params p = {.theta = 1e4};
    double inv[5];
    rope_inv_freq(inv, 10, &p);
    int32_t pos[3] = {0, 3, 17};
    struct rp_ctx c = {.n = 3, .heads = 2, .hd = 10, .ld = 23, .pos = pos, .inv = inv};
    c.x = rnd_floats((size_t)c.n * c.ld, 1.0);
    c.y = xmalloc((size_t)c.n * c.ld * sizeof *c.y);
    c.dy = rnd_floats((size_t)c.n * c.ld, 1.0);
    float *dx = dup_floats(c.dy, (size_t)c.n * c.ld);
    rope_apply_cpu(dx, c.ld, c.n, c.heads, c.hd, pos, inv, 1);
    check_grad("dx", c.x, c.n, c.heads * c.hd, c.ld, dx, c.ld, rp_loss, &c);
    free(c.x), free(c.y), free(c.dy), free(dx);
}

/* ---- attention ---- */

/* Dense (T, T) mask reference in double: key j visible to query t iff same sequence and j <= t. */
static void attention_dense_ref(double *out, const float *q, const float *k, const float *v, const int32_t *cu,
                                int nseq, int T, int nh, int nkv, int hd, double scale)
{
    int *seq = xmalloc((size_t)T * sizeof *seq);
    for (int s = 0; s < nseq; s++)
        for (int t = cu[s]; t < cu[s + 1]; t++) seq[t] = s;
    double *sc = xmalloc((size_t)T * sizeof *sc);
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

static void attention_check(int nh, int nkv, int hd)
{
    int32_t cu[6] = {0, 1, 8, 20, 23, 24}; /* lengths 1, 7, 12, 3, 1 */
    int nseq = 5, T = cu[nseq];
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
    for (int h = 0; h < nh; h++)
        for (int e = 0; e < hd; e++)
            EXPECT_NEAR(out[(size_t)h * hd + e], v[(size_t)(h / (nh / nkv)) * hd + e], 1e-6);
    free(q), free(k), free(v), free(out), free(ref);
}

TEST(attention_causal_gqa_vs_dense_mask)
{
    attention_check(4, 4, 19); /* GQA ratio 1 */
    attention_check(4, 2, 12); /* ratio 2 */
    attention_check(8, 2, 7);  /* ratio 4 */
    attention_check(4, 1, 33); /* ratio 4, one kv head */
}

/* ---- swiglu ---- */

TEST(swiglu_forward_and_alias)
{
    size_t n = 101;
    float *g = rnd_floats(n, 8.0), *u = rnd_floats(n, 3.0), *out = xmalloc(n * sizeof *out);
    g[0] = -100.0f, g[1] = 100.0f, g[2] = 0.0f;
    swiglu_forward_cpu(out, g, u, n);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double ref = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        worst = fmax(worst, fabs(out[i] - ref) / (fabs(ref) + 1e-30));
    }
    EXPECT(worst < 1e-6);
    float *ga = dup_floats(g, n), *ua = dup_floats(u, n);
    swiglu_forward_cpu(ga, ga, u, n);
    swiglu_forward_cpu(ua, g, ua, n);
    EXPECT(memcmp(ga, out, n * sizeof *out) == 0);
    EXPECT(memcmp(ua, out, n * sizeof *out) == 0);
    free(g), free(u), free(out), free(ga), free(ua);
}

struct sw_ctx {
    float *g, *u, *dy, *y;
    int n;
};

static double sw_loss(void *p)
{
    struct sw_ctx *c = p;
    swiglu_forward_cpu(c->y, c->g, c->u, (size_t)c->n);
    return dot_loss(c->dy, c->y, 1, c->n, c->n);
}

TEST(swiglu_backward_finite_diff)
{
    struct sw_ctx c = {.n = 37};
    c.g = rnd_floats(c.n, 4.0);
    c.u = rnd_floats(c.n, 2.0);
    c.dy = rnd_floats(c.n, 1.0);
    c.y = xmalloc((size_t)c.n * sizeof *c.y);
    float *dg = xmalloc((size_t)c.n * sizeof *dg), *du = xmalloc((size_t)c.n * sizeof *du);
    swiglu_backward_cpu(dg, du, c.dy, c.g, c.u, (size_t)c.n);
    check_grad("dgate", c.g, 1, c.n, c.n, dg, c.n, sw_loss, &c);
    check_grad("dup", c.u, 1, c.n, c.n, du, c.n, sw_loss, &c);
    EXPECT(max_abs(dg, c.n) > 0 && max_abs(du, c.n) > 0);
    free(c.g), free(c.u), free(c.dy), free(c.y), free(dg), free(du);
}

TEST_MAIN
