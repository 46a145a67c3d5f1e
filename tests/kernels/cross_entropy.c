/* cross_entropy: the fused lm_head + cross-entropy chunk. CPU (cross_entropy_chunk_cpu): CE against a naive double
 * log-softmax, argmax (ties to the lowest index), dh against central finite differences of Σ w·CE·loss_scale, zero
 * rows where the weight is 0, all weights 0. CUDA (cross_entropy_cuda) against the CPU on the same bf16 inputs: h and
 * lm_head random bf16 (lm_head scaled so that logits have a standard deviation near 3, like a trained head), labels
 * random, weights the DFlash per-slot decay exp(-(k-1)/7) in blocks of 16 with slot 0 and ~10% of the others 0.
 * Compared: ce, argmax (a mismatch passes only where the reference's top logits are within bf16 tolerance: counted),
 * dh, Σ w·CE; rows of weight 0 must read ce 0 and dh 0; dh's padding columns must stay untouched; two runs, the
 * forward-only run and runs at the other overlap levels (one stream; row kernels only on the side stream) must agree
 * bit for bit. cpu_rows > 0 checks that many rows on
 * the CPU (a large vocabulary); rows 1: the call gets the list of the rows of non-zero weight (as the drafter does),
 * the others must read argmax -1 and are not compared; timed: the timing of the Qwen3 shape (the reporting run
 * only). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cross_entropy.h"
#include "matmul.h"
#include "rand_fill.h"
#include "tests/kernel_cases.h"
#include "tests/test.h"
#include "util.h"

#define BF16_EPS 0x1p-8 /* bf16 relative spacing */

/* ---- CPU: n H V (the other parameters are the device's) ---- */

typedef struct ce_case {
    int N, H, V;
    float *h, *lm, *w;
    int32_t *lab;
} ce_case;

static float frand(void) { return (float)rnd_uniform(); }

static void case_init(ce_case *c, int N, int H, int V)
{
    c->N = N, c->H = H, c->V = V;
    c->h = xmalloc(sizeof(float) * (size_t)N * H), c->lm = xmalloc(sizeof(float) * (size_t)V * H);
    c->w = xmalloc(sizeof(float) * (size_t)N), c->lab = xmalloc(sizeof(int32_t) * (size_t)N);
    for (int i = 0; i < N * H; i++) c->h[i] = 2.0f * frand();
    for (int i = 0; i < V * H; i++) c->lm[i] = frand();
    for (int i = 0; i < N; i++) {
        c->lab[i] = (int32_t)((i * 11 + 5) % V);
        c->w[i] = (float)exp(-(double)(i % 16) / 3.0);
    }
    if (N > 2) c->w[2] = 0.0f, c->lab[2] = -1; /* a padded slot: label unused when the weight is 0 */
    if (N > 5) c->w[5] = 0.0f;
}

static void case_free(ce_case *c) { free(c->h), free(c->lm), free(c->w), free(c->lab); }

/* Naive CE of row i in double, with h given in double so finite differences are clean. */
static double naive_ce(const ce_case *c, const double *hrow, int label, int *amax)
{
    const int V = c->V, H = c->H;
    double *lg = xmalloc(sizeof(double) * (size_t)V), mx = -INFINITY;
    for (int k = 0; k < V; k++) {
        lg[k] = 0;
        for (int e = 0; e < H; e++) lg[k] += hrow[e] * c->lm[k * H + e];
        if (lg[k] > mx) { mx = lg[k]; if (amax) *amax = k; }
    }
    double s = 0;
    for (int k = 0; k < V; k++) s += exp(lg[k] - mx);
    double r = mx + log(s) - lg[label];
    free(lg);
    return r;
}

/* ce and argmax against the naive ones; dh against central differences (the forward's results the same with and
 * without the backward); every weight 0: ce 0 and dh 0. */
static void cross_entropy_cpu_check(const kc_case *kc)
{
    const int N = kc->p[0], H = kc->p[1], V = kc->p[2];
    ce_case c;
    case_init(&c, N, H, V);
    float *ce = xmalloc(sizeof(float) * N), *ws = xmalloc(sizeof(float) * (size_t)N * V);
    float *dh = xmalloc(sizeof(float) * (size_t)N * H), *ce2 = xmalloc(sizeof(float) * N);
    int32_t *am = xmalloc(sizeof(int32_t) * N);
    double *hrow = xmalloc(sizeof(double) * H), *hp = xmalloc(sizeof(double) * H), *hm = xmalloc(sizeof(double) * H);
    for (int i = 0; i < N; i++) { ce[i] = 99.0f; am[i] = -7; }
    cross_entropy_chunk_cpu(ce, am, NULL, c.h, N, H, c.lm, V, c.lab, c.w, 1.0f, ws);
    for (int i = 0; i < N; i++) {
        for (int e = 0; e < H; e++) hrow[e] = c.h[i * H + e];
        int ra = -1;
        double rce = naive_ce(&c, hrow, c.lab[i] < 0 ? 0 : c.lab[i], &ra);
        if (c.w[i] == 0.0f) EXPECT(ce[i] == 0.0f);
        else EXPECT_NEAR(ce[i], rce, 1e-5 * (1 + rce));
        EXPECT(am[i] == ra);
    }

    const float scale = 0.37f;
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
                double step = 1e-4;
                for (int f = 0; f < H; f++) hp[f] = hm[f] = c.h[i * H + f];
                hp[e] += step;
                hm[e] -= step;
                fd = (double)c.w[i] * scale *
                     (naive_ce(&c, hp, c.lab[i], NULL) - naive_ce(&c, hm, c.lab[i], NULL)) / (2 * step);
            }
            double g = dh[i * H + e];
            if (c.w[i] == 0.0f) EXPECT(g == 0.0);
            else EXPECT_NEAR(g, fd, 1e-5 + 1e-3 * fabs(fd));
            num += (g - fd) * (g - fd);
            den += fd * fd;
        }
    }
    EXPECT(den > 0 && sqrt(num) <= 1e-4 * sqrt(den));

    for (int i = 0; i < N; i++) c.w[i] = 0.0f;
    for (int i = 0; i < N * H; i++) dh[i] = 1.0f;
    for (int i = 0; i < N; i++) ce[i] = 1.0f;
    cross_entropy_chunk_cpu(ce, NULL, dh, c.h, N, H, c.lm, V, c.lab, c.w, 1.0f, ws);
    for (int i = 0; i < N; i++) EXPECT(ce[i] == 0.0f);
    for (int i = 0; i < N * H; i++) EXPECT(dh[i] == 0.0f);
    free(ce), free(ws), free(dh), free(ce2), free(am), free(hrow), free(hp), free(hm);
    case_free(&c);
}

static void argmax_ties_cpu_check(const kc_case *kc)
{
    (void)kc;
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

#ifdef DFLASH_CUDA
static void report(const char *shape, const char *what, double err, double tol)
{
    int ok = err <= tol; /* NaN fails */
    printf("%s %s %s max_abs_err=%.3g tol=%.3g\n", ok ? "ok" : "FAIL", shape, what, err, tol);
    fflush(stdout);
    if (!ok) failures++;
}

static void report_bool(const char *shape, const char *what, int ok)
{
    printf("%s %s %s\n", ok ? "ok" : "FAIL", shape, what);
    fflush(stdout);
    if (!ok) failures++;
}

static void *dev_alloc(size_t bytes)
{
    void *d = NULL;
    CHECK_CUDA(cudaMalloc(&d, bytes ? bytes : 16));
    return d;
}

typedef struct gpu_out {
    float *ce;
    int32_t *am;
    double sum;
    uint16_t *dh; /* (n, lddh) */
} gpu_out;

static void gpu_out_free(gpu_out *o)
{
    free(o->ce), free(o->am), free(o->dh);
}

/* One call; dh poisoned (0xffff, NaN) beforehand except where want_dh is 0. */
/* The arguments of the timed calls (the context, dh and the row list vary from one timing to the next). */
typedef struct ce_args {
    int n, ldh, lddh, nrows;
    float scale;
    const uint16_t *h, *lm;
    const int32_t *lab;
    const float *w;
    float *ce;
    int32_t *am;
    double *sum;
} ce_args;

/* The mean time of iters calls of cross_entropy_cuda after warm untimed ones, in ms. */
static float ce_time_ms(cross_entropy_cuda_ctx *cx, const ce_args *a, uint16_t *dh, const int32_t *rows, int warm,
                        int iters)
{
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    for (int it = 0; it < warm + iters; it++) {
        if (it == warm) CHECK_CUDA(cudaEventRecord(e0, stream));
        cross_entropy_cuda(cx, a->ce, a->am, a->sum, dh, a->lddh, a->h, a->ldh, a->lm, a->lab, a->w, a->scale, a->n,
                           rows, a->nrows, stream);
    }
    CHECK_CUDA(cudaEventRecord(e1, stream));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    return ms / iters;
}

static void gpu_run(gpu_out *o, cross_entropy_cuda_ctx *ctx, int n, int H, int ldh, int lddh, const uint16_t *d_h,
                    const uint16_t *d_lm, const int32_t *d_lab, const float *d_w, float scale, float *d_ce,
                    int32_t *d_am, double *d_sum, uint16_t *d_dh, int want_dh, const int32_t *d_rows, int nrows)
{
    (void)H;
    CHECK_CUDA(cudaMemsetAsync(d_ce, 0xff, (size_t)n * 4 + 4, stream));
    CHECK_CUDA(cudaMemsetAsync(d_am, 0xff, (size_t)n * 4 + 4, stream));
    if (want_dh) CHECK_CUDA(cudaMemsetAsync(d_dh, 0xff, (size_t)n * lddh * 2, stream));
    cross_entropy_cuda(ctx, d_ce, d_am, d_sum, want_dh ? d_dh : NULL, lddh, d_h, ldh, d_lm, d_lab, d_w, scale, n,
                       d_rows, nrows, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaGetLastError());
    o->ce = dev_get(d_ce, (size_t)n * 4);
    o->am = dev_get(d_am, (size_t)n * 4);
    double *s = dev_get(d_sum, sizeof(double));
    o->sum = *s;
    free(s);
    o->dh = want_dh ? dev_get(d_dh, (size_t)n * lddh * 2) : NULL;
}

/* n rows of hidden size H and vocabulary V; ctx_rows sizes the context (its chunk is min(ctx_rows, 1024));
 * cpu_rows 0: check every row on the CPU, else that many rows spread over the chunks (first, chunk seams, last). */
static void cross_entropy_cuda_check(const kc_case *c)
{
    int n = c->p[0], H = c->p[1], V = c->p[2], ldh = c->p[3], lddh = c->p[4], ctx_rows = c->p[5], cpu_rows = c->p[6];
    int timed = c->p[7] && kc_reporting(), listed = c->p[8];
    char shape[64];
    snprintf(shape, sizeof shape, "cross_entropy_cuda n=%d H=%d V=%d", n, H, V);
    printf("== %s: n=%d H=%d V=%d ldh=%d lddh=%d ctx_rows=%d rows=%s\n", shape, n, H, V, ldh, lddh, ctx_rows,
           listed ? "the weighted ones" : "all");
    fflush(stdout);
    /* inputs, on the device first (rand_fill), then downloaded for the CPU */
    uint16_t *d_h = dev_alloc((size_t)n * ldh * 2), *d_lm = dev_alloc((size_t)V * H * 2);
    rand_fill_bf16_cuda(d_h, (size_t)n * ldh, 0x1234 + (uint64_t)n, 1.0f, 0.0f, stream);
    rand_fill_bf16_cuda(d_lm, (size_t)V * H, 0x5678 + (uint64_t)V, 9.0f / sqrtf((float)H), 0.0f, stream);
    int32_t *lab = xmalloc((size_t)n * 4);
    float *w = xmalloc((size_t)n * 4);
    double wsum = 0;
    for (int i = 0; i < n; i++) {
        int k = i % 16;
        lab[i] = (int32_t)(rnd_u64() % (uint64_t)V);
        w[i] = (k == 0 || rnd_u64() % 10 == 0) ? 0.0f : expf(-(float)(k - 1) / 7.0f);
        if (w[i] == 0.0f && rnd_u64() % 2) lab[i] = -1; /* untrained rows may carry no label */
    }
    if (n > 1) lab[1] = V - 1, w[1] = 1.0f; /* the last vocabulary entry */
    if (n > 2) lab[2] = 0, w[2] = 1.0f;
    wsum = 0;
    for (int i = 0; i < n; i++) wsum += w[i];
    const float scale = (float)(1.0 / wsum);
    int32_t *d_lab = dev_alloc((size_t)n * 4);
    float *d_w = dev_alloc((size_t)n * 4), *d_ce = dev_alloc((size_t)n * 4 + 4);
    int32_t *d_am = dev_alloc((size_t)n * 4 + 4);
    double *d_sum = dev_alloc(sizeof(double));
    uint16_t *d_dh = dev_alloc((size_t)n * lddh * 2);
    CHECK_CUDA(cudaMemcpy(d_lab, lab, (size_t)n * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_w, w, (size_t)n * 4, cudaMemcpyHostToDevice));
    /* the row list: the rows of non-zero weight, ascending */
    int32_t *rl = xmalloc((size_t)n * 4 + 4);
    int nrows = 0;
    for (int i = 0; i < n; i++)
        if (w[i] != 0.0f) rl[nrows++] = i;
    int32_t *d_rows = NULL;
    if (listed) {
        d_rows = dev_alloc((size_t)nrows * 4);
        CHECK_CUDA(cudaMemcpy(d_rows, rl, (size_t)nrows * 4, cudaMemcpyHostToDevice));
    }

    cross_entropy_cuda_ctx *ctx = cross_entropy_cuda_create(ctx_rows, H, V, 0);
    printf("%s workspace %.1f MB\n", shape, cross_entropy_cuda_workspace_bytes(ctx) / 1e6);
    gpu_out a, b, f, s1, s2;
    gpu_run(&a, ctx, n, H, ldh, lddh, d_h, d_lm, d_lab, d_w, scale, d_ce, d_am, d_sum, d_dh, 1, d_rows, nrows);
    gpu_run(&b, ctx, n, H, ldh, lddh, d_h, d_lm, d_lab, d_w, scale, d_ce, d_am, d_sum, d_dh, 1, d_rows, nrows);
    gpu_run(&f, ctx, n, H, ldh, lddh, d_h, d_lm, d_lab, d_w, scale, d_ce, d_am, d_sum, d_dh, 0, d_rows, nrows);
    cross_entropy_cuda_set_overlap(ctx, 0);
    gpu_run(&s1, ctx, n, H, ldh, lddh, d_h, d_lm, d_lab, d_w, scale, d_ce, d_am, d_sum, d_dh, 1, d_rows, nrows);
    cross_entropy_cuda_set_overlap(ctx, 1);
    gpu_run(&s2, ctx, n, H, ldh, lddh, d_h, d_lm, d_lab, d_w, scale, d_ce, d_am, d_sum, d_dh, 1, d_rows, nrows);
    cross_entropy_cuda_set_overlap(ctx, 2);
    report_bool(shape, "determinism (two runs: ce, argmax, dh, sum bitwise)",
                !memcmp(a.ce, b.ce, (size_t)n * 4) && !memcmp(a.am, b.am, (size_t)n * 4) &&
                    !memcmp(a.dh, b.dh, (size_t)n * lddh * 2) && !memcmp(&a.sum, &b.sum, sizeof a.sum));
    report_bool(shape, "one stream equals two (overlap levels 0, 1, 2: ce, argmax, dh, sum bitwise)",
                !memcmp(a.ce, s1.ce, (size_t)n * 4) && !memcmp(a.am, s1.am, (size_t)n * 4) &&
                    !memcmp(a.dh, s1.dh, (size_t)n * lddh * 2) && !memcmp(&a.sum, &s1.sum, sizeof a.sum) &&
                    !memcmp(a.ce, s2.ce, (size_t)n * 4) && !memcmp(a.am, s2.am, (size_t)n * 4) &&
                    !memcmp(a.dh, s2.dh, (size_t)n * lddh * 2) && !memcmp(&a.sum, &s2.sum, sizeof a.sum));
    report_bool(shape, "forward-only equals forward+backward (ce, argmax, sum bitwise)",
                !memcmp(a.ce, f.ce, (size_t)n * 4) && !memcmp(a.am, f.am, (size_t)n * 4) &&
                    !memcmp(&a.sum, &f.sum, sizeof a.sum));

    /* every row: weight 0 -> ce 0 and dh 0; dh padding untouched (still the 0xffff poison) */
    int zero_bad = 0, pad_bad = 0, unlisted_bad = 0;
    for (int i = 0; i < n; i++) {
        const uint16_t *r = a.dh + (size_t)i * lddh;
        if (w[i] == 0.0f) {
            zero_bad += a.ce[i] != 0.0f;
            for (int j = 0; j < H; j++) zero_bad += (r[j] & 0x7fff) != 0;
            unlisted_bad += listed && (a.am[i] != -1 || f.am[i] != -1);
        }
        for (int j = H; j < lddh; j++) pad_bad += r[j] != 0xffff;
    }
    report_bool(shape, "weight-0 rows read ce 0 and dh 0", zero_bad == 0);
    if (listed) report_bool(shape, "rows outside the list read argmax -1", unlisted_bad == 0);
    report_bool(shape, "dh padding columns untouched", pad_bad == 0);
    /* the sum against the host's sum of the GPU's own ce (all rows) */
    double host_sum = 0;
    for (int i = 0; i < n; i++) host_sum += (double)w[i] * a.ce[i];
    report(shape, "sum(w*ce) device vs host sum of device ce (relative)", fabs(a.sum - host_sum) / fabs(host_sum),
           1e-12);

    /* the CPU reference on the checked rows */
    int nr = cpu_rows ? cpu_rows : n;
    int *rows = xmalloc((size_t)nr * sizeof *rows);
    if (!cpu_rows) {
        for (int i = 0; i < n; i++) rows[i] = i;
    } else { /* first 16, 16 across each of the first two multiples of the chunk size, the rest at the end */
        int k = 0, chunk = ctx_rows < 1024 ? ctx_rows : 1024;
        for (int i = 0; i < 16 && k < nr; i++) rows[k++] = i;
        for (int s = 1; s <= 2 && k < nr; s++)
            for (int i = s * chunk - 8; i < s * chunk + 8 && k < nr; i++) rows[k++] = i;
        for (int i = n - (nr - k); k < nr; i++) rows[k++] = i;
    }
    uint16_t *hb = dev_get(d_h, (size_t)n * ldh * 2), *lmb = dev_get(d_lm, (size_t)V * H * 2);
    float *lm = xmalloc((size_t)V * H * 4), *hs = xmalloc((size_t)nr * H * 4), *ws = xmalloc((size_t)nr * V * 4);
    for (size_t i = 0; i < (size_t)V * H; i++) lm[i] = bf16_to_f32(lmb[i]);
    int32_t *lab_s = xmalloc((size_t)nr * 4), *am_ref = xmalloc((size_t)nr * 4);
    float *w_s = xmalloc((size_t)nr * 4), *ce_ref = xmalloc((size_t)nr * 4), *dh_ref = xmalloc((size_t)nr * H * 4);
    for (int k = 0; k < nr; k++) {
        for (int j = 0; j < H; j++) hs[(size_t)k * H + j] = bf16_to_f32(hb[(size_t)rows[k] * ldh + j]);
        lab_s[k] = lab[rows[k]], w_s[k] = w[rows[k]];
    }
    double t0 = now_seconds();
    cross_entropy_chunk_cpu(ce_ref, am_ref, NULL, hs, nr, H, lm, V, lab_s, w_s, scale, ws); /* ws keeps logits */
    /* argmax: a mismatch is allowed only where the GPU's pick is within bf16 tolerance of the reference maximum */
    int mism = 0, near_ties = 0, bad_am = 0;
    double ce_err = 0, sum_ref = 0, sum_gpu_rows = 0;
    for (int k = 0; k < nr; k++) {
        const float *x = ws + (size_t)k * V;
        float top = x[am_ref[k]], second = -INFINITY;
        for (int v = 0; v < V; v++)
            if (v != am_ref[k] && x[v] > second) second = x[v];
        double tie_tol = BF16_EPS * fabs(top);
        near_ties += top - second <= tie_tol;
        int g = a.am[rows[k]];
        if (listed && w_s[k] == 0.0f) g = am_ref[k]; /* not computed: checked above */
        if (g != am_ref[k]) {
            mism++;
            if (g < 0 || g >= V || !(top - x[g] <= tie_tol)) bad_am++;
        }
        ce_err = fmax(ce_err, isnan(a.ce[rows[k]]) ? INFINITY : fabs((double)a.ce[rows[k]] - ce_ref[k]));
        sum_ref += (double)w_s[k] * ce_ref[k];
        sum_gpu_rows += (double)w_s[k] * a.ce[rows[k]];
    }
    cross_entropy_chunk_cpu(ce_ref, NULL, dh_ref, hs, nr, H, lm, V, lab_s, w_s, scale, ws);
    printf("%s cpu reference on %d rows: %.2f s\n", shape, nr, now_seconds() - t0);
    /* fp32 logits on both sides, only the summation order differs: ~1e-5 expected */
    report(shape, "ce", ce_err, 1e-3);
    printf("%s %s argmax mismatches=%d (all within bf16 tolerance of the top logit: %s), near-ties=%d of %d rows\n",
           bad_am ? "FAIL" : "ok", shape, mism, bad_am ? "NO" : "yes", near_ties, nr);
    if (bad_am) failures++;
    /* Σ w·CE over the checked rows, relative */
    report(shape, "sum(w*ce) vs cpu over checked rows (relative)", fabs(sum_gpu_rows - sum_ref) / fabs(sum_ref),
           1e-5);
    /* dh: bf16 G (2^-9 per element) and a bf16 output (2^-9 of the value): tol 2^-7 of max|dh_ref| */
    double mx = 0, e = 0, se = 0, sr = 0;
    for (int k = 0; k < nr; k++)
        for (int j = 0; j < H; j++) {
            double r = dh_ref[(size_t)k * H + j], g = bf16_to_f32(a.dh[(size_t)rows[k] * lddh + j]);
            mx = fmax(mx, fabs(r));
            e = fmax(e, isnan(g) ? INFINITY : fabs(g - r));
            se += (g - r) * (g - r), sr += r * r;
        }
    char what[128];
    snprintf(what, sizeof what, "dh (max|dh_ref|=%.3g, rel l2 err %.2g)", mx, sqrt(se / sr));
    report(shape, what, e, 0x1p-7 * mx);

    if (timed) {
        const int iters = 5;
        const ce_args ca = {.n = n, .ldh = ldh, .lddh = lddh, .nrows = nrows, .scale = scale, .h = d_h, .lm = d_lm,
                            .lab = d_lab, .w = d_w, .ce = d_ce, .am = d_am, .sum = d_sum};
        for (int pass = 0; pass < 2; pass++) {
            int bwd = pass == 0;
            const float ms = ce_time_ms(ctx, &ca, bwd ? d_dh : NULL, d_rows, 0, iters);
            double flop = (bwd ? 4.0 : 2.0) * n * (double)V * H, done = flop * (listed ? nrows : n) / n;
            printf("%s time %s: %.2f ms, %.0f TFLOP/s over all %d rows (%d GEMMs, %.3g FLOP), %.0f TFLOP/s over the "
                   "%d computed, against 790\n", shape, bwd ? "forward+backward" : "forward only", ms,
                   flop / (ms * 1e-3) / 1e12, n, bwd ? 2 : 1, flop, done / (ms * 1e-3) / 1e12, listed ? nrows : n);
        }
        /* the same at overlap levels 0 and 1, and without the row list */
        for (int pass = 0; pass < 3; pass++) {
            cross_entropy_cuda_set_overlap(ctx, pass == 2 ? 2 : pass);
            const float ms = ce_time_ms(ctx, &ca, d_dh, pass == 2 ? NULL : d_rows, 1, iters);
            printf("%s time forward+backward %s: %.2f ms, %.0f TFLOP/s over all %d rows\n", shape,
                   pass == 2 ? "of every row (no list), overlap 2" : pass ? "overlap 1 (row kernels only)"
                                                                     : "overlap 0 (one stream)", ms,
                   4.0 * n * (double)V * H / (ms * 1e-3) / 1e12, n);
        }
        cross_entropy_cuda_set_overlap(ctx, 2);
        /* other chunk sizes (workspace against GEMM efficiency) */
        const int chunks[] = {512, 2048, 4096};
        for (int ci = 0; ci < 3; ci++) {
            cross_entropy_cuda_ctx *cx = cross_entropy_cuda_create(n, H, V, chunks[ci]);
            const float ms = ce_time_ms(cx, &ca, d_dh, d_rows, 1, iters);
            printf("%s time forward+backward at chunk %d (workspace %.0f MB): %.2f ms, %.0f TFLOP/s\n", shape,
                   chunks[ci], cross_entropy_cuda_workspace_bytes(cx) / 1e6, ms,
                   4.0 * n * (double)V * H / (ms * 1e-3) / 1e12);
            cross_entropy_cuda_destroy(&cx);
        }
        /* cuBLASLt's heuristic alternatives for the two chunk GEMMs (the one matmul_algo_pick runs marked) */
        for (int k = 0; k < 3; k++) { /* logits at a full and a half chunk, dh at a full one */
            const int which = k == 2, m = k == 1 ? 512 : 1024;
            cross_entropy_algo al[8];
            int na = cross_entropy_cuda_survey(ctx, which, m, d_h, ldh, d_lm, al, 8, stream);
            for (int i = 0; i < na; i++)
                printf("%s heuristic #%d for the %s GEMM (m %d)%s: algo %d tile %u splitk %d reduction %u stages %u "
                       "cluster %u waves %.2f: %.3f ms, %.0f TFLOP/s\n", shape, i, which ? "dh" : "logits", m,
                       al[i].used ? " (used)" : "", al[i].id, al[i].tile, al[i].splitk, al[i].reduction,
                       al[i].stages, al[i].cluster, al[i].waves, al[i].ms,
                       al[i].ms > 0 ? 2.0 * m * (double)V * H / (al[i].ms * 1e-3) / 1e12 : 0.0);
        }
        /* the ceiling of the first GEMM: the project's plain bf16-output GEMM of one chunk's shape */
        matmul_cuda *mm = matmul_cuda_create(0);
        const int m = 1024;
        uint16_t *d_y = dev_alloc((size_t)m * V * 2);
        matmul_forward_cuda(mm, d_y, V, NULL, 0, 0.0f, d_h, ldh, d_lm, m, V, H, stream);
        cudaEvent_t e0, e1;
        CHECK_CUDA(cudaEventCreate(&e0));
        CHECK_CUDA(cudaEventCreate(&e1));
        CHECK_CUDA(cudaEventRecord(e0, stream));
        for (int it = 0; it < iters; it++) matmul_forward_cuda(mm, d_y, V, NULL, 0, 0.0f, d_h, ldh, d_lm, m, V, H, stream);
        CHECK_CUDA(cudaEventRecord(e1, stream));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        ms /= iters;
        printf("%s reference: matmul_forward_cuda (%d, %d, %d) bf16 out: %.3f ms, %.0f TFLOP/s\n", shape, m, V, H, ms,
               2.0 * m * (double)V * H / (ms * 1e-3) / 1e12);
        CHECK_CUDA(cudaFree(d_y));
        matmul_cuda_destroy(&mm);
        CHECK_CUDA(cudaEventDestroy(e0));
        CHECK_CUDA(cudaEventDestroy(e1));
    }

    cross_entropy_cuda_destroy(&ctx);
    if (ctx) failures++; /* _destroy nulls the pointer */
    gpu_out_free(&a), gpu_out_free(&b), gpu_out_free(&f), gpu_out_free(&s1), gpu_out_free(&s2);
    if (d_rows) CHECK_CUDA(cudaFree(d_rows));
    free(rl);
    CHECK_CUDA(cudaFree(d_h)); CHECK_CUDA(cudaFree(d_lm)); CHECK_CUDA(cudaFree(d_lab)); CHECK_CUDA(cudaFree(d_w));
    CHECK_CUDA(cudaFree(d_ce)); CHECK_CUDA(cudaFree(d_am)); CHECK_CUDA(cudaFree(d_sum)); CHECK_CUDA(cudaFree(d_dh));
    free(lab), free(w), free(rows), free(hb), free(lmb), free(lm), free(hs), free(ws), free(lab_s), free(am_ref);
    free(w_s), free(ce_ref), free(dh_ref);
}

#endif

const kc_op kc_cross_entropy = {"cross_entropy", "bf16 (ce f32)", "n H V ldh lddh ctx_rows cpu_rows timed rows",
                                cross_entropy_cpu_check, KC_CUDA(cross_entropy_cuda_check)};
const kc_op kc_cross_entropy_argmax_ties = {"cross_entropy_argmax_ties", "f32", "", argmax_ties_cpu_check, NULL};
