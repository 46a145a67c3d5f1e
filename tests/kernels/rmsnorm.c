/* rmsnorm: y = w ⊙ x / sqrt(mean(x²) + eps) and its backward. CPU: the forward against a double reference (strided,
 * in place, a zero element and a tiny row), the backward against central finite differences (dx accumulating).
 * CUDA: the forward (vector and scalar paths, strided, in place; padding columns untouched) and the backward (dx,
 * dx accumulating, dw += with and without) against rmsnorm_*_cpu on the same bf16 values, the backward twice. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rmsnorm.h"
#include "tests/kernel_cases.h"
#include "tests/test.h"
#include "util.h"

#define HBM_GBS 4300.0 /* H200 peak bandwidth, GB/s */
/* bf16 unit roundoff, and an allowance for fp32 differences in the reduction order and rsqrtf */
#define BF16_REL_TOL (0x1p-8 + 1e-5)

static void rmsnorm_ref(double *y, const float *x, const float *w, int dim, float eps)
{
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    double r = 1.0 / sqrt(ss / dim + eps);
    for (int i = 0; i < dim; i++) y[i] = w[i] * (x[i] * r);
}

/* rows dim ldx ldy in_place: the CPU check runs both y apart (ldy) and in place */
static void rmsnorm_forward_cpu_check(const kc_case *c)
{
    int rows = c->p[0], dim = c->p[1], ldx = c->p[2], ldy = c->p[3];
    float eps = 1e-6f;
    float *x = rnd_floats((size_t)rows * ldx, 3.0), *w = rnd_floats(dim, 1.5);
    x[0 * ldx + dim / 2] = 0; /* a zero element and a tiny row */
    if (rows > 2)
        for (int i = 0; i < dim; i++) x[(size_t)2 * ldx + i] *= 1e-3f;
    float *y = xmalloc((size_t)rows * ldy * sizeof *y), *xi = dup_floats(x, (size_t)rows * ldx);
    double *ref = xmalloc(sizeof(double) * (size_t)dim);
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
    free(x), free(w), free(y), free(xi), free(ref);
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
    return kc_dot_loss(c->dy, c->y, c->rows, c->dim, c->ldy);
}

/* rows dim ldx lddy lddx acc with_dw: the CPU check runs dx fresh and accumulating, dw += */
static void rmsnorm_backward_cpu_check(const kc_case *kc)
{
    struct rn_ctx c = {.rows = kc->p[0], .dim = kc->p[1], .ldx = kc->p[2], .ldy = kc->p[3], .eps = 1e-6f};
    int lddx = kc->p[4];
    c.x = rnd_floats((size_t)c.rows * c.ldx, 2.0);
    c.w = rnd_floats(c.dim, 1.5);
    c.dy = rnd_floats((size_t)c.rows * c.ldy, 1.0);
    c.y = xmalloc((size_t)c.rows * c.ldy * sizeof *c.y);
    float *dx = rnd_floats((size_t)c.rows * lddx, 1.0), *dx0 = dup_floats(dx, (size_t)c.rows * lddx);
    float *dw = rnd_floats(c.dim, 1.0), *dw0 = dup_floats(dw, c.dim), *ddw = xmalloc(sizeof(float) * (size_t)c.dim);
    rmsnorm_backward_cpu(dx, lddx, 0, dw, c.dy, c.ldy, c.x, c.ldx, c.w, c.rows, c.dim, c.eps);
    for (int i = 0; i < c.dim; i++) ddw[i] = dw[i] - dw0[i];
    kc_check_grad("dx", c.x, c.rows, c.dim, c.ldx, dx, lddx, rn_loss, &c);
    kc_check_grad("dw", c.w, 1, c.dim, c.dim, ddw, c.dim, rn_loss, &c);

    float *dxa = dup_floats(dx0, (size_t)c.rows * lddx);
    rmsnorm_backward_cpu(dxa, lddx, 1, NULL, c.dy, c.ldy, c.x, c.ldx, c.w, c.rows, c.dim, c.eps);
    double worst = 0;
    for (int r = 0; r < c.rows; r++)
        for (int i = 0; i < lddx; i++) {
            size_t o = (size_t)r * lddx + i;
            worst = fmax(worst, fabs(dxa[o] - (i < c.dim ? dx0[o] + dx[o] : dx0[o])));
        }
    EXPECT(worst < 1e-5);
    free(c.x), free(c.w), free(c.dy), free(c.y), free(dx), free(dx0), free(dw), free(dw0), free(dxa), free(ddw);
}

#ifdef DFLASH_CUDA
/* in_place runs with y == x (ldy = ldx). Columns past dim in y must stay untouched. */
static void rmsnorm_forward_cuda_check(const kc_case *c)
{
    int rows = c->p[0], dim = c->p[1], ldx = c->p[2], ldy = c->p[3], in_place = c->p[4];
    float eps = 1e-6f;
    if (in_place) ldy = ldx;
    size_t xn = (size_t)rows * ldx, yn = (size_t)rows * ldy;
    float *x_f = xmalloc(xn * sizeof *x_f), *w_f = xmalloc((size_t)dim * sizeof *w_f);
    uint16_t *x = rnd_bf16(xn, 3.0, x_f), *w = rnd_bf16(dim, 1.5, w_f);
    if (rows > 1) /* a row of tiny values, where eps matters */
        for (int i = 0; i < dim; i++) {
            x[(size_t)ldx + i] = f32_to_bf16(x_f[(size_t)ldx + i] * 1e-3f);
            x_f[(size_t)ldx + i] = bf16_to_f32(x[(size_t)ldx + i]);
        }
    float *ref = xmalloc(yn * sizeof *ref);
    rmsnorm_forward_cpu(ref, ldy, x_f, ldx, w_f, rows, dim, eps);

    uint16_t *y0 = in_place ? x : rnd_bf16(yn, 1.0, NULL);
    uint16_t *d_x = dev_upload(x, xn * sizeof *x), *d_w = dev_upload(w, (size_t)dim * sizeof *w);
    uint16_t *d_y = in_place ? d_x : dev_upload(y0, yn * sizeof *y0);
    rmsnorm_forward_cuda(d_y, ldy, d_x, ldx, d_w, rows, dim, eps, stream);
    uint16_t *y = dev_get(d_y, yn * sizeof *y);

    double err = 0; /* relative to the reference value, with an absolute floor for values near 0 */
    int pad_changed = 0;
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < dim; i++) {
            double want = ref[(size_t)r * ldy + i], got = bf16_to_f32(y[(size_t)r * ldy + i]);
            err = fmax(err, fabs(got - want) / fmax(fabs(want), 1e-3));
        }
        for (int i = dim; i < ldy; i++) pad_changed |= y[(size_t)r * ldy + i] != y0[(size_t)r * ldy + i];
    }
    char name[128];
    snprintf(name, sizeof name, "rmsnorm_forward_cuda rows=%d dim=%d ldx=%d ldy=%d%s", rows, dim, ldx, ldy,
             in_place ? " in_place" : "");
    kc_report(name, pad_changed ? INFINITY : err, BF16_REL_TOL);

    CHECK_CUDA(cudaFree(d_x));
    CHECK_CUDA(cudaFree(d_w));
    if (!in_place) CHECK_CUDA(cudaFree(d_y));
    if (!in_place) free(y0);
    free(x_f), free(w_f), free(x), free(w), free(ref), free(y);
}

/* dx (added into dx0 when acc) and dw (+= into dw0 when with_dw). Columns of dx past dim must stay untouched. */
static void rmsnorm_backward_cuda_check(const kc_case *c)
{
    int rows = c->p[0], dim = c->p[1], ldx = c->p[2], lddy = c->p[3], lddx = c->p[4], acc = c->p[5];
    int with_dw = c->p[6];
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
    kc_report(name, e, 0x1p-8 * mx); /* one bf16 rounding (2^-9 of the value) + fp32 noise: 2^-8·max|ref| */
    if (with_dw) {
        double ew = err_f32(gotw[0], dw_ref, (size_t)dim, NULL);
        snprintf(name, sizeof name, "rmsnorm_backward_cuda dw rows=%d dim=%d", rows, dim);
        kc_report(name, ew, 1e-5 * dw_sum + 1e-6); /* fp32 sums in another order: 1e-5·max_col Σ|dy·x̂| */
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

void kc_time_rmsnorm_backward(void)
{
    const int rows = 8192, dim = 4096;
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
#endif

const kc_op kc_rmsnorm_forward = {"rmsnorm_forward", "bf16", "rows dim ldx ldy in_place", rmsnorm_forward_cpu_check,
                                  KC_CUDA(rmsnorm_forward_cuda_check)};
const kc_op kc_rmsnorm_backward = {"rmsnorm_backward", "bf16 (dw f32)", "rows dim ldx lddy lddx acc with_dw",
                                   rmsnorm_backward_cpu_check, KC_CUDA(rmsnorm_backward_cuda_check)};
