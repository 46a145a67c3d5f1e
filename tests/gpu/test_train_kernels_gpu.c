/* The training step's backward and optimizer kernels against their CPU references on random data (run on the GPU
 * machine): rmsnorm, qk_norm_rope, swiglu and matmul backward, grad_sq_sum and adamw_apply. Inputs are drawn in fp32
 * and rounded to bf16; the CPU reference runs in fp32 on the same bf16 values. Each check prints
 * "<name> max_abs_err=<e> tol=<t> ok|FAIL" (the tolerance's derivation is next to it); every kernel is also run twice
 * on the same inputs and must give the same bits. Timings: rmsnorm backward and adamw_apply in GB/s against the
 * H200's ~4.3 TB/s, matmul backward in TFLOP/s. Exit status 0 only when every check passed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "adamw.h"
#include "cast.h"
#include "colsum.h"
#include "cuda_check.h"
#include "gpu_test.h"
#include "matmul.h"
#include "qk_norm_rope.h"
#include "rmsnorm.h"
#include "rope.h"
#include "swiglu.h"
#include "util.h"

#define HBM_GBS 4300.0 /* H200 peak bandwidth, GB/s */



static float *rnd_f32(size_t n, double amp, double bias)
{
    float *h = xmalloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = (float)(bias + amp * rnd_uniform());
    return h;
}


static void dev_put(void *d, const void *src, size_t bytes)
{
    CHECK_CUDA(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
}


static void report(const char *name, double err, double tol)
{
    int ok = err <= tol; /* NaN fails */
    printf("%s max_abs_err=%.3g tol=%.3g %s\n", name, err, tol, ok ? "ok" : "FAIL");
    fflush(stdout);
    if (!ok) failures++;
}

/* Two runs' outputs must be the same bits: prints the largest difference (0 when identical) against tol 0. */
static void report_same_bits(const char *name, const void *a, const void *b, size_t bytes, int is_f32)
{
    double err = 0;
    if (memcmp(a, b, bytes)) {
        err = INFINITY; /* bits differ; say by how much where the type allows */
        if (is_f32) {
            err = 0;
            for (size_t i = 0; i < bytes / 4; i++) err = fmax(err, fabs(((const float *)a)[i] - ((const float *)b)[i]));
            if (err == 0) err = INFINITY;
        }
    }
    char full[256];
    snprintf(full, sizeof full, "determinism %s (two runs, bitwise)", name);
    report(full, err, 0.0);
}

/* max |bf16 got - ref| over a (rows, cols) block; NaN -> inf. *mx = max |ref|. */
static double err_bf16(const uint16_t *got, int ldg, const float *ref, int ldr, int rows, int cols, double *mx)
{
    double e = 0, m = 0;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < cols; i++) {
            double g = bf16_to_f32(got[(size_t)r * ldg + i]), w = ref[(size_t)r * ldr + i];
            if (isnan(g)) return INFINITY;
            e = fmax(e, fabs(g - w)), m = fmax(m, fabs(w));
        }
    if (mx) *mx = m;
    return e;
}

static double err_f32(const float *got, const float *ref, size_t n, double *mx)
{
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) return INFINITY;
        e = fmax(e, fabs((double)got[i] - ref[i])), m = fmax(m, fabs(ref[i]));
    }
    if (mx) *mx = m;
    return e;
}

static float elapsed_ms(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0;
    CHECK_CUDA(cudaEventSynchronize(b));
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

/* ---- rmsnorm backward ---- */

/* dx (added into dx0 when acc) and dw (+= into dw0 when with_dw). Columns of dx past dim must stay untouched. */
static void check_rmsnorm_bwd(int rows, int dim, int ldx, int lddy, int lddx, int acc, int with_dw)
{
    const float eps = 1e-6f;
    size_t nx = (size_t)rows * ldx, ndy = (size_t)rows * lddy, ndx = (size_t)rows * lddx;
    float *x_f = xmalloc(nx * 4), *dy_f = xmalloc(ndy * 4), *w_f = xmalloc((size_t)dim * 4), *dx_f = xmalloc(ndx * 4);
    uint16_t *x = rnd_bf16(nx, 3.0, x_f), *dy = rnd_bf16(ndy, 1.0, dy_f), *w = rnd_bf16((size_t)dim, 1.5, w_f);
    uint16_t *dx0 = rnd_bf16(ndx, 0.5, dx_f);
    if (rows > 1) /* a row of tiny values, where eps matters */
        for (int i = 0; i < dim; i++) {
            x[(size_t)ldx + i] = f32_to_bf16(x_f[(size_t)ldx + i] * 1e-3f);
            x_f[(size_t)ldx + i] = bf16_to_f32(x[(size_t)ldx + i]);
        }
    float *dw0 = rnd_f32((size_t)dim, 1.0, 0.0), *dw_ref = xmalloc((size_t)dim * 4);
    memcpy(dw_ref, dw0, (size_t)dim * 4);
    rmsnorm_backward_cpu(dx_f, lddx, acc, with_dw ? dw_ref : NULL, dy_f, lddy, x_f, ldx, w_f, rows, dim, eps);
    /* dw bound: Σ_r |dy·x̂| per column (x̂ in double) */
    double dw_sum = 0;
    double *colsum = xcalloc((size_t)dim, sizeof(double));
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)x_f[(size_t)r * ldx + i] * x_f[(size_t)r * ldx + i];
        double rstd = 1.0 / sqrt(ss / dim + eps);
        for (int i = 0; i < dim; i++) colsum[i] += fabs(dy_f[(size_t)r * lddy + i] * x_f[(size_t)r * ldx + i] * rstd);
    }
    for (int i = 0; i < dim; i++) dw_sum = fmax(dw_sum, colsum[i]);

    uint16_t *d_x = dev_upload(x, nx * 2), *d_dy = dev_upload(dy, ndy * 2), *d_w = dev_upload(w, (size_t)dim * 2);
    uint16_t *d_dx = dev_upload(dx0, ndx * 2);
    float *d_dw = dev_upload(dw0, (size_t)dim * 4);
    size_t ws = rmsnorm_backward_cuda_workspace(rows, dim);
    float *d_ws = dev_upload(NULL, ws);
    uint16_t *got[2];
    float *gotw[2];
    for (int run = 0; run < 2; run++) {
        dev_put(d_dx, dx0, ndx * 2), dev_put(d_dw, dw0, (size_t)dim * 4);
        rmsnorm_backward_cuda(d_dx, lddx, acc, with_dw ? d_dw : NULL, d_dy, lddy, d_x, ldx, d_w, rows, dim, eps,
                              with_dw ? d_ws : NULL, stream);
        got[run] = dev_get(d_dx, ndx * 2), gotw[run] = dev_get(d_dw, (size_t)dim * 4);
    }
    double mx = 0, e = err_bf16(got[0], lddx, dx_f, lddx, rows, dim, &mx);
    for (int r = 0; r < rows; r++)
        for (int i = dim; i < lddx; i++)
            if (got[0][(size_t)r * lddx + i] != dx0[(size_t)r * lddx + i]) e = INFINITY;
    char name[200];
    snprintf(name, sizeof name, "rmsnorm_backward_cuda dx rows=%d dim=%d ld=%d/%d/%d%s", rows, dim, ldx, lddy, lddx,
             acc ? " accumulate" : "");
    report(name, e, 0x1p-8 * mx); /* one bf16 rounding (2^-9 of the value) + fp32 noise: 2^-8·max|ref| */
    if (with_dw) {
        double ew = err_f32(gotw[0], dw_ref, (size_t)dim, NULL);
        snprintf(name, sizeof name, "rmsnorm_backward_cuda dw rows=%d dim=%d", rows, dim);
        report(name, ew, 1e-5 * dw_sum + 1e-6); /* fp32 sums in another order: 1e-5·max_col Σ|dy·x̂| */
    }
    snprintf(name, sizeof name, "rmsnorm_backward_cuda rows=%d dim=%d%s dx", rows, dim, acc ? " acc" : "");
    report_same_bits(name, got[0], got[1], ndx * 2, 0);
    if (with_dw) {
        snprintf(name, sizeof name, "rmsnorm_backward_cuda rows=%d dim=%d dw", rows, dim);
        report_same_bits(name, gotw[0], gotw[1], (size_t)dim * 4, 1);
    }
    CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_dy)); CHECK_CUDA(cudaFree(d_w));
    CHECK_CUDA(cudaFree(d_dx)); CHECK_CUDA(cudaFree(d_dw)); CHECK_CUDA(cudaFree(d_ws));
    free(x_f), free(dy_f), free(w_f), free(dx_f), free(x), free(dy), free(w), free(dx0), free(dw0), free(dw_ref);
    free(colsum), free(got[0]), free(got[1]), free(gotw[0]), free(gotw[1]);
}

static void time_rmsnorm_bwd(int rows, int dim)
{
    size_t n = (size_t)rows * dim;
    uint16_t *h = rnd_bf16(n, 2.0, NULL), *hw = rnd_bf16((size_t)dim, 1.0, NULL);
    uint16_t *d_x = dev_upload(h, n * 2), *d_dy = dev_upload(h, n * 2), *d_dx = dev_upload(NULL, n * 2);
    uint16_t *d_w = dev_upload(hw, (size_t)dim * 2);
    float *d_dw = dev_upload(NULL, (size_t)dim * 4), *d_ws = dev_upload(NULL, rmsnorm_backward_cuda_workspace(rows, dim));
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a)); CHECK_CUDA(cudaEventCreate(&b));
    for (int acc = 0; acc < 2; acc++) {
        rmsnorm_backward_cuda(d_dx, dim, acc, d_dw, d_dy, dim, d_x, dim, d_w, rows, dim, 1e-6f, d_ws, stream);
        const int iters = 20;
        CHECK_CUDA(cudaEventRecord(a, stream));
        for (int i = 0; i < iters; i++)
            rmsnorm_backward_cuda(d_dx, dim, acc, d_dw, d_dy, dim, d_x, dim, d_w, rows, dim, 1e-6f, d_ws, stream);
        CHECK_CUDA(cudaEventRecord(b, stream));
        double ms = elapsed_ms(a, b) / iters, bytes = (double)n * 2 * (3 + acc);
        printf("timing rmsnorm_backward_cuda rows=%d dim=%d%s (+dw): %.1f us, %.0f GB/s (%.0f%% of %.0f GB/s; bytes = "
               "x, dy, dx%s)\n", rows, dim, acc ? " accumulate" : "", ms * 1e3, bytes / ms / 1e6,
               100.0 * bytes / ms / 1e6 / HBM_GBS, HBM_GBS, acc ? " read+write" : "");
    }
    CHECK_CUDA(cudaEventDestroy(a)); CHECK_CUDA(cudaEventDestroy(b));
    CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_dy)); CHECK_CUDA(cudaFree(d_dx)); CHECK_CUDA(cudaFree(d_w));
    CHECK_CUDA(cudaFree(d_dw)); CHECK_CUDA(cudaFree(d_ws));
    free(h), free(hw);
}

/* ---- qk_norm_rope backward ---- */

/* dq|dk packed in one (n, (nh + 2 nkv) hd) gradient buffer as the fused qkv projection's, the saved pre-norm q|k in
 * another; v columns must stay untouched. no_q: dq NULL (context keys only). */
static void check_qk_bwd(int n, int nh, int nkv, int hd, int with_norm, int maxpos, int no_q)
{
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
    report(name, e, 0x1p-8 * mx); /* one bf16 rounding of each output, fp32 math in between: 2^-8·max|ref| */
    if (with_norm) {
        if (!no_q) {
            snprintf(name, sizeof name, "qk_norm_rope_backward_cuda dq_w %s", base);
            report(name, err_f32(gq[0], dqw_ref, (size_t)hd, NULL), 1e-5 * bq + 1e-6); /* fp32 order: 1e-5·Σ|g·x̂| */
        }
        snprintf(name, sizeof name, "qk_norm_rope_backward_cuda dk_w %s", base);
        report(name, err_f32(gk[0], dkw_ref, (size_t)hd, NULL), 1e-5 * bk + 1e-6);
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

/* ---- swiglu backward ---- */

static void check_swiglu_bwd(int rows, int dim, int ldgu, int lddo, int in_place)
{
    int lddgu = in_place ? ldgu : ldgu + 8;
    size_t ng = (size_t)rows * ldgu, nd = (size_t)rows * lddo, ndg = (size_t)rows * lddgu;
    float *gu_f = xmalloc(ng * 4), *do_f = xmalloc(nd * 4), *ref = xmalloc((size_t)rows * 2 * dim * 4);
    uint16_t *gu = rnd_bf16(ng, 6.0, gu_f), *dout = rnd_bf16(nd, 1.0, do_f);
    for (int r = 0; r < rows; r++)
        swiglu_backward_cpu(ref + (size_t)r * 2 * dim, ref + (size_t)r * 2 * dim + dim, do_f + (size_t)r * lddo,
                            gu_f + (size_t)r * ldgu, gu_f + (size_t)r * ldgu + dim, (size_t)dim);
    uint16_t *d_gu = dev_upload(gu, ng * 2), *d_do = dev_upload(dout, nd * 2);
    uint16_t *d_dgu = in_place ? d_gu : dev_upload(NULL, ndg * 2);
    uint16_t *got[2];
    for (int run = 0; run < 2; run++) {
        if (in_place) dev_put(d_gu, gu, ng * 2);
        else CHECK_CUDA(cudaMemset(d_dgu, 0xff, ndg * 2)); /* NaN poison: an unwritten element fails */
        swiglu_backward_cuda(d_dgu, lddgu, d_do, lddo, d_gu, ldgu, rows, dim, stream);
        got[run] = dev_get(d_dgu, ndg * 2);
    }
    double mx = 0, e = err_bf16(got[0], lddgu, ref, 2 * dim, rows, 2 * dim, &mx);
    char name[200];
    snprintf(name, sizeof name, "swiglu_backward_cuda rows=%d dim=%d ldgu=%d lddout=%d%s", rows, dim, ldgu, lddo,
             in_place ? " in_place" : "");
    report(name, e, 0x1p-8 * mx); /* one bf16 rounding per output; expf within 2 ulp of the CPU's */
    report_same_bits(name, got[0], got[1], ndg * 2, 0);
    CHECK_CUDA(cudaFree(d_gu)); CHECK_CUDA(cudaFree(d_do));
    if (!in_place) CHECK_CUDA(cudaFree(d_dgu));
    free(gu_f), free(do_f), free(ref), free(gu), free(dout), free(got[0]), free(got[1]);
}

/* ---- matmul backward / fp32 forward ---- */

/* |a|·|b| bound of a product's fp32 sums: the CPU matmul on absolute values. */
static float *abs_copy(const float *a, size_t n)
{
    float *b = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) b[i] = fabsf(a[i]);
    return b;
}

static double max_of(const float *a, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, a[i]);
    return m;
}

static void check_matmul_bwd(matmul_cuda *mm, int m, int n, int k, int lddy, int ldx, int lddx, int acc_dx,
                             int acc_dw)
{
    size_t ndy = (size_t)m * lddy, nx = (size_t)m * ldx, nw = (size_t)n * k, ndx = (size_t)m * lddx;
    float *dy_f = xmalloc(ndy * 4), *x_f = xmalloc(nx * 4), *w_f = xmalloc(nw * 4), *dx_f = xmalloc(ndx * 4);
    uint16_t *dy = rnd_bf16(ndy, 1.0, dy_f), *x = rnd_bf16(nx, 1.0, x_f), *w = rnd_bf16(nw, 0.5, w_f);
    uint16_t *dx0 = rnd_bf16(ndx, 2.0, dx_f);
    float *dw0 = rnd_f32(nw, 1.0, 0.0), *dw_ref = xcalloc(nw, 4);
    if (acc_dw) memcpy(dw_ref, dw0, nw * 4);
    matmul_backward_cpu(dx_f, lddx, acc_dx, dw_ref, dy_f, lddy, x_f, ldx, w_f, m, n, k);
    float *ady = abs_copy(dy_f, ndy), *ax = abs_copy(x_f, nx), *bound = xcalloc(nw, 4);
    matmul_backward_cpu(NULL, 0, 0, bound, ady, lddy, ax, ldx, NULL, m, n, k);
    double bw = max_of(bound, nw);

    uint16_t *d_dy = dev_upload(dy, ndy * 2), *d_x = dev_upload(x, nx * 2), *d_w = dev_upload(w, nw * 2);
    uint16_t *d_dx = dev_upload(dx0, ndx * 2);
    float *d_dw = dev_upload(dw0, nw * 4);
    uint16_t *got[2];
    float *gotw[2];
    size_t free0 = 0, free1 = 0, total = 0;
    for (int run = 0; run < 2; run++) {
        dev_put(d_dx, dx0, ndx * 2), dev_put(d_dw, dw0, nw * 4);
        CHECK_CUDA(cudaDeviceSynchronize());
        if (run == 1) CHECK_CUDA(cudaMemGetInfo(&free0, &total));
        matmul_backward_cuda(mm, d_dx, lddx, acc_dx, d_dw, acc_dw, d_dy, lddy, d_x, ldx, d_w, m, n, k, stream);
        got[run] = dev_get(d_dx, ndx * 2), gotw[run] = dev_get(d_dw, nw * 4);
        if (run == 1) CHECK_CUDA(cudaMemGetInfo(&free1, &total));
    }
    double mx = 0, e = err_bf16(got[0], lddx, dx_f, lddx, m, k, &mx);
    for (int r = 0; r < m; r++)
        for (int i = k; i < lddx; i++)
            if (got[0][(size_t)r * lddx + i] != dx0[(size_t)r * lddx + i]) e = INFINITY;
    char name[200], base[120];
    snprintf(base, sizeof base, "m=%d n=%d k=%d ld=%d/%d/%d", m, n, k, lddy, ldx, lddx);
    snprintf(name, sizeof name, "matmul_backward_cuda dx %s%s", base, acc_dx ? " accumulate" : "");
    report(name, e, 4e-3 * mx); /* one bf16 rounding of the output (2^-9) + fp32 order, as the forward's test */
    snprintf(name, sizeof name, "matmul_backward_cuda dw fp32 %s%s", base, acc_dw ? " +=" : " =");
    report(name, err_f32(gotw[0], dw_ref, nw, NULL), 1e-5 * bw + 1e-6); /* fp32 sums: 1e-5·max Σ|dy||x| */
    snprintf(name, sizeof name, "matmul_backward_cuda %s dx", base);
    report_same_bits(name, got[0], got[1], ndx * 2, 0);
    snprintf(name, sizeof name, "matmul_backward_cuda %s dw", base);
    report_same_bits(name, gotw[0], gotw[1], nw * 4, 1);
    snprintf(name, sizeof name, "matmul_backward_cuda no allocation on a shape's 2nd call %s (device bytes)", base);
    report(name, fabs((double)free0 - (double)free1), 0.0);
    CHECK_CUDA(cudaFree(d_dy)); CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_w)); CHECK_CUDA(cudaFree(d_dx));
    CHECK_CUDA(cudaFree(d_dw));
    free(dy_f), free(x_f), free(w_f), free(dx_f), free(dy), free(x), free(w), free(dx0), free(dw0), free(dw_ref);
    free(ady), free(ax), free(bound);
    for (int r = 0; r < 2; r++) free(got[r]), free(gotw[r]);
}

static void check_matmul_fwd_f32(matmul_cuda *mm, int m, int n, int k, int accumulate)
{
    int ldx = k + 8, ldy = (n + 3) / 4 * 4 + 4; /* fp32 rows 16-byte aligned, with padding columns */
    size_t nx = (size_t)m * ldx, nw = (size_t)n * k, ny = (size_t)m * ldy;
    float *x_f = xmalloc(nx * 4), *w_f = xmalloc(nw * 4);
    uint16_t *x = rnd_bf16(nx, 1.0, x_f), *w = rnd_bf16(nw, 0.5, w_f);
    float *y0 = rnd_f32(ny, 2.0, 0.0), *ref = xmalloc(ny * 4);
    memcpy(ref, y0, ny * 4);
    matmul_forward_cpu(ref, ldy, x_f, ldx, w_f, m, n, k, accumulate);
    float *ax = abs_copy(x_f, nx), *aw = abs_copy(w_f, nw), *bound = xcalloc(ny, 4);
    matmul_forward_cpu(bound, ldy, ax, ldx, aw, m, n, k, 0);
    uint16_t *d_x = dev_upload(x, nx * 2), *d_w = dev_upload(w, nw * 2);
    float *d_y = dev_upload(y0, ny * 4), *got[2];
    for (int run = 0; run < 2; run++) {
        dev_put(d_y, y0, ny * 4);
        matmul_forward_f32_cuda(mm, d_y, ldy, accumulate ? 1.0f : 0.0f, d_x, ldx, d_w, m, n, k, stream);
        got[run] = dev_get(d_y, ny * 4);
    }
    double e = 0;
    for (int r = 0; r < m; r++)
        for (int i = 0; i < ldy; i++) {
            size_t j = (size_t)r * ldy + i;
            e = fmax(e, i < n ? fabs((double)got[0][j] - ref[j]) : (got[0][j] == y0[j] ? 0 : INFINITY));
            if (isnan(got[0][j])) e = INFINITY;
        }
    char name[200];
    snprintf(name, sizeof name, "matmul_forward_f32_cuda m=%d n=%d k=%d%s", m, n, k, accumulate ? " +=" : "");
    report(name, e, 1e-5 * max_of(bound, ny) + 1e-6); /* fp32 sums: 1e-5·max Σ|x||w| */
    report_same_bits(name, got[0], got[1], ny * 4, 1);
    CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_w)); CHECK_CUDA(cudaFree(d_y));
    free(x_f), free(w_f), free(x), free(w), free(y0), free(ref), free(ax), free(aw), free(bound), free(got[0]),
        free(got[1]);
}

/* Timing only (and bitwise repeatability) at a drafter-sized shape: no CPU reference. */
static void time_matmul_bwd(matmul_cuda *mm, int m, int n, int k)
{
    size_t ndy = (size_t)m * n, nx = (size_t)m * k, nw = (size_t)n * k;
    uint16_t *h = rnd_bf16(ndy > nx ? (ndy > nw ? ndy : nw) : (nx > nw ? nx : nw), 1.0, NULL);
    uint16_t *d_dy = dev_upload(h, ndy * 2), *d_x = dev_upload(h, nx * 2), *d_w = dev_upload(h, nw * 2);
    uint16_t *d_dx = dev_upload(NULL, nx * 2);
    float *d_dw = dev_upload(NULL, nw * 4);
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a)); CHECK_CUDA(cudaEventCreate(&b));
    const int iters = 10;
    double flops = 2.0 * m * n * (double)k;
    for (int which = 0; which < 2; which++) { /* 0: dx only, 1: dw (+=) only */
        uint16_t *dx = which == 0 ? d_dx : NULL;
        float *dw = which == 1 ? d_dw : NULL;
        matmul_backward_cuda(mm, dx, k, 0, dw, 1, d_dy, n, d_x, k, d_w, m, n, k, stream);
        CHECK_CUDA(cudaEventRecord(a, stream));
        for (int i = 0; i < iters; i++) matmul_backward_cuda(mm, dx, k, 0, dw, 1, d_dy, n, d_x, k, d_w, m, n, k, stream);
        CHECK_CUDA(cudaEventRecord(b, stream));
        double ms = elapsed_ms(a, b) / iters;
        printf("timing matmul_backward_cuda %s m=%d n=%d k=%d: %.3f ms, %.0f TFLOP/s\n",
               which == 0 ? "dx (bf16)" : "dw (fp32 +=)", m, n, k, ms, flops / ms / 1e9);
    }
    /* bitwise repeatability at this shape: dw overwritten (=) twice, dx twice */
    void *r[2][2];
    for (int run = 0; run < 2; run++) {
        matmul_backward_cuda(mm, d_dx, k, 0, d_dw, 0, d_dy, n, d_x, k, d_w, m, n, k, stream);
        r[run][0] = dev_get(d_dx, nx * 2), r[run][1] = dev_get(d_dw, nw * 4);
    }
    char name[160];
    snprintf(name, sizeof name, "matmul_backward_cuda m=%d n=%d k=%d dx", m, n, k);
    report_same_bits(name, r[0][0], r[1][0], nx * 2, 0);
    snprintf(name, sizeof name, "matmul_backward_cuda m=%d n=%d k=%d dw", m, n, k);
    report_same_bits(name, r[0][1], r[1][1], nw * 4, 1);
    CHECK_CUDA(cudaEventDestroy(a)); CHECK_CUDA(cudaEventDestroy(b));
    CHECK_CUDA(cudaFree(d_dy)); CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_w)); CHECK_CUDA(cudaFree(d_dx));
    CHECK_CUDA(cudaFree(d_dw));
    free(h), free(r[0][0]), free(r[0][1]), free(r[1][0]), free(r[1][1]);
}

/* ---- grad_sq_sum + adamw_apply ---- */

/* in_place: dst = src; misalign: every buffer shifted by one float (scalar path); nan_grad / nan_loss: the guard. */
static void check_adamw(size_t n, float wd, float clip, double grad_amp, float scale, int in_place, int misalign,
                        int nan_grad, int nan_loss)
{
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
        report(name, fabs(sq[0] - sq_ref) / sq_ref, 1e-11); /* double sums of n terms in another order */
    }
    snprintf(name, sizeof name, "grad_sq_sum_cuda n=%zu", n);
    report_same_bits(name, &sq[0], &sq[1], 8, 0);
    int want_skip = nan_grad || nan_loss;
    snprintf(name, sizeof name, "adamw_apply_cuda skipped flag %s (|flag - %d|)", base, want_skip);
    report(name, fabs((double)skipped[0] - want_skip) + fabs((double)skipped[1] - want_skip), 0.0);
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
    report(name, e_w, 0x1p-22 * mw);
    snprintf(name, sizeof name, "adamw_apply_cuda m %s", base);
    report(name, e_m, 0x1p-22 * mm_);
    snprintf(name, sizeof name, "adamw_apply_cuda v %s", base);
    report(name, e_v, 0x1p-22 * mv);
    printf("  (adamw_apply_cuda %s: %zu of %zu elements not bit-identical to the CPU)\n", base, ndiff, n);
    snprintf(name, sizeof name, "adamw_apply_cuda bf16 copy == bf16(new w) %s (elements differing)", base);
    report(name, (double)bdiff, 0.0);
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
static void time_adamw(void)
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

/* colsum_add_cuda against its CPU reference (same order): bit-identical. */
static void check_colsum(int nparts, int dim)
{
    float *part = rnd_f32((size_t)nparts * dim, 1.0, 0.0), *dw = rnd_f32((size_t)dim, 1.0, 0.0);
    float *d_part = dev_upload(part, sizeof(float) * (size_t)nparts * dim), *d_dw = dev_upload(dw, sizeof(float) * dim);
    colsum_add_cpu(dw, part, nparts, dim);
    colsum_add_cuda(d_dw, d_part, nparts, dim, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    float *got = dev_get(d_dw, sizeof(float) * dim);
    double diff = 0;
    for (int c = 0; c < dim; c++) diff += memcmp(&got[c], &dw[c], 4) != 0;
    char name[96];
    snprintf(name, sizeof name, "colsum_add_cuda nparts=%d dim=%d (elements not bit-identical)", nparts, dim);
    report(name, diff, 0);
    free(part); free(dw); free(got);
    CHECK_CUDA(cudaFree(d_part)); CHECK_CUDA(cudaFree(d_dw));
}

/* cast_f32_bf16_cuda against its CPU reference: bit-identical (NaN and the aligned/unaligned paths included). */
static void check_cast(size_t n, size_t offset)
{
    float *x = rnd_f32(n + offset, 3.0, 0.0);
    if (n > 2) x[offset + 1] = NAN;
    uint16_t *want = xmalloc(2 * n);
    cast_f32_bf16_cpu(want, x + offset, n);
    float *d_x = dev_upload(x, sizeof(float) * (n + offset));
    uint16_t *d_y;
    CHECK_CUDA(cudaMalloc((void **)&d_y, 2 * n + 2));
    cast_f32_bf16_cuda(d_y, d_x + offset, n, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    uint16_t *got = dev_get(d_y, 2 * n);
    double diff = 0;
    for (size_t i = 0; i < n; i++) diff += got[i] != want[i];
    char name[96];
    snprintf(name, sizeof name, "cast_f32_bf16_cuda n=%zu offset=%zu (elements not bit-identical)", n, offset);
    report(name, diff, 0);
    free(x); free(want); free(got);
    CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_y));
}

int main(void)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("test_train_kernels_gpu: no CUDA device (%s) FAIL\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 1;
    }
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaStreamCreate(&stream));

    check_cast(1000003, 0);
    check_cast(37, 1);
    check_colsum(1, 5);
    check_colsum(264, 4096);
    check_colsum(77, 130);

    /* rmsnorm backward: rows 1, 7, 333 x dims 64, 128, 4096 (vector path), then the scalar path */
    const int rows_set[] = {1, 7, 333}, dims_set[] = {64, 128, 4096};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            int r = rows_set[i], d = dims_set[j];
            check_rmsnorm_bwd(r, d, d, d, d, (i + j) % 2, 1);
        }
    check_rmsnorm_bwd(333, 4096, 4104, 4112, 4120, 1, 1); /* strided, accumulate */
    check_rmsnorm_bwd(7, 128, 128, 128, 136, 0, 0);       /* dw NULL */
    check_rmsnorm_bwd(7, 37, 41, 40, 39, 1, 1);           /* odd dim and strides: scalar path */
    check_rmsnorm_bwd(5, 5000, 5003, 5001, 5007, 0, 1);   /* more columns than threads */
    check_rmsnorm_bwd(1000, 8192, 8192, 8192, 8192, 0, 1); /* 1024-thread vector blocks, 4 rows per chunk */

    /* qk_norm_rope backward: GQA groups of 3 (nh 6, nkv 2), then Qwen3-8B heads, odd head_dim, no norm, dq NULL */
    check_qk_bwd(1, 6, 2, 128, 1, 10, 0);
    check_qk_bwd(7, 6, 2, 128, 1, 3000, 0);
    check_qk_bwd(333, 6, 2, 64, 1, 40000, 0);
    check_qk_bwd(50, 32, 8, 128, 1, 40000, 0);
    check_qk_bwd(11, 3, 1, 10, 1, 100, 0);  /* head_dim not a multiple of 4: one element per lane */
    check_qk_bwd(20, 8, 8, 64, 0, 5000, 0); /* Llama: rope only */
    check_qk_bwd(333, 6, 2, 128, 1, 3000, 1); /* context keys: dq NULL */
    check_qk_bwd(3000, 6, 2, 128, 1, 3000, 0); /* rows > chunks: several rows per warp */

    /* swiglu backward */
    check_swiglu_bwd(1, 64, 128, 64, 0);
    check_swiglu_bwd(7, 128, 264, 136, 0);
    check_swiglu_bwd(333, 4096, 8192, 4096, 0);
    check_swiglu_bwd(7, 13, 26, 13, 0);   /* scalar path */
    check_swiglu_bwd(37, 768, 1536, 768, 1); /* in place: dgu = gu */

    /* matmul backward and the fp32-output forward */
    matmul_cuda *mm = matmul_cuda_create(0);
    check_matmul_bwd(mm, 37, 129, 200, 136, 208, 200, 0, 1);
    check_matmul_bwd(mm, 37, 129, 200, 136, 208, 216, 1, 0);
    check_matmul_bwd(mm, 1, 64, 128, 64, 128, 128, 1, 1);
    check_matmul_bwd(mm, 333, 4096, 128, 4096, 128, 128, 0, 1);
    check_matmul_bwd(mm, 7, 128, 4096, 128, 4096, 4096, 1, 1);
    check_matmul_bwd(mm, 200, 1000, 4096, 1000, 4104, 4096, 0, 1);
    check_matmul_fwd_f32(mm, 37, 129, 200, 0);
    check_matmul_fwd_f32(mm, 77, 384, 256, 1);

    /* optimizer */
    const float third = 1.0f / 3.0f; /* a loss-weight normaliser that is not a power of two */
    check_adamw(1000003, 0.0f, 1.0f, 1e-3, 1.0f, 0, 0, 0, 0);  /* norm < clip: coef 1 */
    check_adamw(1000003, 0.1f, 1.0f, 1.0, third, 0, 0, 0, 0);  /* clipped, decay on alternate ranges */
    check_adamw(333, 0.1f, 1.0f, 1.0, third, 1, 0, 0, 0);      /* in place */
    check_adamw(4099, 0.1f, 0.5f, 1.0, third, 0, 1, 0, 0);     /* misaligned: scalar path */
    check_adamw(7, 0.0f, 0.0f, 1.0, 1.0f, 0, 0, 0, 0);         /* clip disabled */
    check_adamw(100003, 0.1f, 1.0f, 1.0, third, 0, 0, 1, 0);   /* NaN in the gradient: skipped, dst = src */
    check_adamw(100003, 0.1f, 1.0f, 1.0, third, 1, 0, 1, 0);   /* the same in place */
    check_adamw(100003, 0.1f, 1.0f, 1.0, third, 0, 0, 0, 1);   /* NaN loss: skipped */

    /* timings */
    time_rmsnorm_bwd(8192, 4096);
    time_adamw();
    time_matmul_bwd(mm, 8192, 4096, 4096);

    /* last: shapes whose rows are not 16-byte aligned (odd leading dimensions), should cuBLASLt refuse one */
    check_matmul_bwd(mm, 37, 129, 200, 129, 201, 203, 1, 1);
    matmul_cuda_destroy(&mm);

    CHECK_CUDA(cudaStreamDestroy(stream));
    printf("test_train_kernels_gpu: %d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
