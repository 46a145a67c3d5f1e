/* matmul: y = x·wᵀ (+ C) and its backward. CPU: the forward against a naive double sum on wide strides (padding
 * columns untouched, accumulate on and off), k = 0, the backward against central finite differences of
 * L = Σ dy ⊙ y (dx accumulating, NULL dx / NULL dw). CUDA (cuBLASLt): the bf16 forward (+ a residual C != D), the
 * backward (dx bf16, dw fp32 = or +=, no allocation on a shape's second call) and the fp32-output forward against
 * matmul_*_cpu on the same bf16 values. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.h"
#include "tests/kernel_cases.h"
#include "tests/test.h"
#include "util.h"

/* ---- forward: m n k ldx ldy with_c ---- */

static void matmul_forward_cpu_check(const kc_case *c)
{
    int m = c->p[0], n = c->p[1], k = c->p[2], ldx = c->p[3], ldy = c->p[4];
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

static void matmul_k0_cpu_check(const kc_case *c)
{
    (void)c;
    float y[6] = {1, 2, 3, 4, 5, 6}, x[1] = {0}, w[1] = {0};
    matmul_forward_cpu(y, 3, x, 0, w, 2, 3, 0, 1);
    EXPECT(y[0] == 1 && y[5] == 6);
    matmul_forward_cpu(y, 3, x, 0, w, 2, 3, 0, 0);
    for (int i = 0; i < 6; i++) EXPECT(y[i] == 0);
}

/* ---- backward: m n k lddy ldx lddx acc_dx acc_dw ---- */

struct mm_ctx {
    float *x, *w, *dy, *y;
    int m, n, k, ldx, ldy;
};

static double mm_loss(void *p)
{
    struct mm_ctx *c = p;
    matmul_forward_cpu(c->y, c->ldy, c->x, c->ldx, c->w, c->m, c->n, c->k, 0);
    return kc_dot_loss(c->dy, c->y, c->m, c->n, c->ldy);
}

static void matmul_backward_cpu_check(const kc_case *kc)
{
    struct mm_ctx c = {.m = kc->p[0], .n = kc->p[1], .k = kc->p[2], .ldy = kc->p[3], .ldx = kc->p[4]};
    int lddx = kc->p[5];
    c.x = rnd_floats((size_t)c.m * c.ldx, 1.0);
    c.w = rnd_floats((size_t)c.n * c.k, 1.0);
    c.dy = rnd_floats((size_t)c.m * c.ldy, 1.0);
    c.y = xmalloc((size_t)c.m * c.ldy * sizeof *c.y);
    float *dx = rnd_floats((size_t)c.m * lddx, 1.0), *dx0 = dup_floats(dx, (size_t)c.m * lddx);
    float *dw = rnd_floats((size_t)c.n * c.k, 1.0), *dw0 = dup_floats(dw, (size_t)c.n * c.k);

    matmul_backward_cpu(dx, lddx, 0, dw, c.dy, c.ldy, c.x, c.ldx, c.w, c.m, c.n, c.k);
    /* dw accumulates: compare the increment */
    float *ddw = xmalloc((size_t)c.n * c.k * sizeof *ddw);
    for (int i = 0; i < c.n * c.k; i++) ddw[i] = dw[i] - dw0[i];
    kc_check_grad("dx", c.x, c.m, c.k, c.ldx, dx, lddx, mm_loss, &c);
    kc_check_grad("dw", c.w, c.n, c.k, c.k, ddw, c.k, mm_loss, &c);

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

/* m n k accumulate: the CPU reference of the fp32-output forward is matmul_forward_cpu at the device's strides */
static void matmul_forward_f32_cpu_check(const kc_case *c)
{
    const int m = c->p[0], n = c->p[1], k = c->p[2];
    kc_case f = {.op = c->op, .p = {m, n, k, k + 8, (n + 3) / 4 * 4 + 4, c->p[3]}};
    matmul_forward_cpu_check(&f);
}

#ifdef DFLASH_CUDA
static matmul_cuda *the_mm(void)
{
    static matmul_cuda *mm;
    if (!mm) mm = matmul_cuda_create(0);
    return mm;
}

/* y = x·wᵀ (+ c) through cuBLASLt; with c, C and D are different buffers with different row strides. */
static void matmul_forward_cuda_check(const kc_case *kc)
{
    int m = kc->p[0], n = kc->p[1], k = kc->p[2], ldx = kc->p[3], ldy = kc->p[4], with_c = kc->p[5], ldc = n + 8;
    matmul_cuda *mm = the_mm();
    float *x_f = xmalloc((size_t)m * ldx * 4), *w_f = xmalloc((size_t)n * k * 4), *c_f = xmalloc((size_t)m * ldc * 4);
    uint16_t *x = rnd_bf16((size_t)m * ldx, 1.0, x_f), *w = rnd_bf16((size_t)n * k, 0.5, w_f);
    uint16_t *c = rnd_bf16((size_t)m * ldc, 2.0, c_f);
    float *ref = xmalloc((size_t)m * ldy * 4);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) ref[(size_t)i * ldy + j] = with_c ? c_f[(size_t)i * ldc + j] : 0.0f;
    matmul_forward_cpu(ref, ldy, x_f, ldx, w_f, m, n, k, 1);
    uint16_t *d_x = dev_upload(x, (size_t)m * ldx * 2), *d_w = dev_upload(w, (size_t)n * k * 2);
    uint16_t *d_c = dev_upload(c, (size_t)m * ldc * 2), *d_y = dev_poisoned((size_t)m * ldy);
    matmul_forward_cuda(mm, d_y, ldy, with_c ? d_c : NULL, ldc, with_c ? 1.0f : 0.0f, d_x, ldx, d_w, m, n, k, stream);
    uint16_t *y = dev_get(d_y, ((size_t)m * ldy) * 2);
    double nr = 0, e = err_vs_max(y, ldy, ref, ldy, m, n, &nr);
    char name[160];
    snprintf(name, sizeof name, "matmul_forward_cuda m=%d n=%d k=%d ldx=%d ldy=%d%s (max err / max|ref|)", m, n, k,
             ldx, ldy, with_c ? " +residual C!=D" : "");
    kc_report(name, e, 4e-3); /* one bf16 rounding of the output (2^-9 of the value) + fp32 accumulation order */
    CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_w)); CHECK_CUDA(cudaFree(d_c)); CHECK_CUDA(cudaFree(d_y));
    free(x_f), free(w_f), free(c_f), free(x), free(w), free(c), free(ref), free(y);
}

static void matmul_backward_cuda_check(const kc_case *kc)
{
    int m = kc->p[0], n = kc->p[1], k = kc->p[2], lddy = kc->p[3], ldx = kc->p[4], lddx = kc->p[5];
    int acc_dx = kc->p[6], acc_dw = kc->p[7];
    matmul_cuda *mm = the_mm();
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
    kc_report(name, e, 4e-3 * mx); /* one bf16 rounding of the output (2^-9) + fp32 order, as the forward's test */
    snprintf(name, sizeof name, "matmul_backward_cuda dw fp32 %s%s", base, acc_dw ? " +=" : " =");
    kc_report(name, err_f32(gotw[0], dw_ref, nw, NULL), 1e-5 * bw + 1e-6); /* fp32 sums: 1e-5·max Σ|dy||x| */
    snprintf(name, sizeof name, "matmul_backward_cuda %s dx", base);
    report_same_bits(name, got[0], got[1], ndx * 2, 0);
    snprintf(name, sizeof name, "matmul_backward_cuda %s dw", base);
    report_same_bits(name, gotw[0], gotw[1], nw * 4, 1);
    snprintf(name, sizeof name, "matmul_backward_cuda no allocation on a shape's 2nd call %s (device bytes)", base);
    kc_report(name, fabs((double)free0 - (double)free1), 0.0);
    CHECK_CUDA(cudaFree(d_dy)); CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_w)); CHECK_CUDA(cudaFree(d_dx));
    CHECK_CUDA(cudaFree(d_dw));
    free(dy_f), free(x_f), free(w_f), free(dx_f), free(dy), free(x), free(w), free(dx0), free(dw0), free(dw_ref);
    free(ady), free(ax), free(bound);
    for (int r = 0; r < 2; r++) free(got[r]), free(gotw[r]);
}

/* m n k accumulate */
static void matmul_forward_f32_cuda_check(const kc_case *kc)
{
    int m = kc->p[0], n = kc->p[1], k = kc->p[2], accumulate = kc->p[3];
    matmul_cuda *mm = the_mm();
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
    kc_report(name, e, 1e-5 * max_of(bound, ny) + 1e-6); /* fp32 sums: 1e-5·max Σ|x||w| */
    report_same_bits(name, got[0], got[1], ny * 4, 1);
    CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_w)); CHECK_CUDA(cudaFree(d_y));
    free(x_f), free(w_f), free(x), free(w), free(y0), free(ref), free(ax), free(aw), free(bound), free(got[0]),
        free(got[1]);
}

/* Timing only (and bitwise repeatability) at a drafter-sized shape: no CPU reference. */
void kc_time_matmul_backward(void)
{
    const int m = 8192, n = 4096, k = 4096;
    matmul_cuda *mm = the_mm();
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


/* The survey of issue 23: every cuBLASLt heuristic candidate (up to 16) timed at the shapes that matter, the Qwen3-8B
 * target forward (19218 tokens), the drafter step (8192 block rows, 3072 context rows; forward, backward dx bf16,
 * backward dw fp32 +=) and cross_entropy's two chunk GEMMs (the logits: the fp32 forward; dh: a backward dx). Each
 * candidate: its configuration, waves and time; each shape: the heuristic's first, the fastest, matmul_algo_pick's
 * choice (DFLASH_GEMM_PICK) and the candidate without split-K with the most waves, with their TFLOP/s. */
enum { SV_FWD, SV_FWD_F32, SV_DX, SV_DW };
typedef struct {
    const char *name;
    int kind, m, n, k, extra; /* extra: the residual C (forward), accumulate (dx) */
} sv_shape;

void kc_time_matmul_survey(void)
{
    static const sv_shape shapes[] = {
        {"target q|k|v", SV_FWD, 19218, 6144, 4096, 0},
        {"target o_proj +C", SV_FWD, 19218, 4096, 4096, 1},
        {"target gate|up", SV_FWD, 19218, 24576, 4096, 0},
        {"target down +C", SV_FWD, 19218, 4096, 12288, 1},
        {"drafter fc", SV_FWD, 3072, 4096, 20480, 0},
        {"drafter q|k|v", SV_FWD, 8192, 6144, 4096, 0},
        {"drafter k|v ctx", SV_FWD, 3072, 2048, 4096, 0},
        {"drafter o +C", SV_FWD, 8192, 4096, 4096, 1},
        {"drafter gate|up", SV_FWD, 8192, 24576, 4096, 0},
        {"drafter down +C", SV_FWD, 8192, 4096, 12288, 1},
        {"drafter down dx", SV_DX, 8192, 4096, 12288, 0},
        {"drafter gate|up dx", SV_DX, 8192, 24576, 4096, 0},
        {"drafter o dx", SV_DX, 8192, 4096, 4096, 0},
        {"drafter q|k|v dx", SV_DX, 8192, 6144, 4096, 0},
        {"drafter k|v ctx dx +=", SV_DX, 3072, 2048, 4096, 1},
        {"drafter down dw", SV_DW, 8192, 4096, 12288, 0},
        {"drafter gate|up dw", SV_DW, 8192, 24576, 4096, 0},
        {"drafter o dw", SV_DW, 8192, 4096, 4096, 0},
        {"drafter q|k|v dw", SV_DW, 8192, 6144, 4096, 0},
        {"drafter k|v ctx dw", SV_DW, 3072, 2048, 4096, 0},
        {"drafter fc dw", SV_DW, 3072, 4096, 20480, 0},
        {"ce logits f32", SV_FWD_F32, 1024, 151936, 4096, 0},
        {"ce dh (dx)", SV_DX, 1024, 151936, 4096, 0},
    };
    const int ns = (int)(sizeof shapes / sizeof shapes[0]), iters = 5;
    /* buffers for the largest operand of each role: x (or dy), w, the output, the residual */
    size_t nx = 0, nw = 0, ny = 0, nc = 0;
    for (int i = 0; i < ns; i++) {
        const sv_shape *s = &shapes[i];
        size_t mk = (size_t)s->m * s->k, mn = (size_t)s->m * s->n, nk = (size_t)s->n * s->k;
        size_t in = s->kind == SV_FWD || s->kind == SV_FWD_F32 ? mk : mn + (s->kind == SV_DW ? mk : 0);
        size_t out = s->kind == SV_FWD ? mn : s->kind == SV_FWD_F32 ? 2 * mn : s->kind == SV_DX ? mk : 2 * nk;
        if (in > nx) nx = in;
        if (nk > nw) nw = nk;
        if (out > ny) ny = out;
        if (s->kind == SV_FWD && s->extra && mn > nc) nc = mn;
    }
    const size_t chunk = (size_t)1 << 22;
    uint16_t *h = rnd_bf16(chunk, 1.0, NULL);
    uint16_t *d_x = dev_upload(NULL, nx * 2), *d_w = dev_upload(NULL, nw * 2), *d_c = dev_upload(NULL, nc * 2);
    uint16_t *d_y = dev_upload(NULL, ny * 2);
    uint16_t *fill[2] = {d_x, d_c};
    size_t nfill[2] = {nx, nc};
    for (int b = 0; b < 2; b++)
        for (size_t o = 0; o < nfill[b]; o += chunk)
            CHECK_CUDA(cudaMemcpyAsync(fill[b] + o, h, (nfill[b] - o < chunk ? nfill[b] - o : chunk) * 2,
                                       cudaMemcpyHostToDevice, stream));
    for (size_t o = 0; o < nw; o += chunk)
        CHECK_CUDA(cudaMemcpyAsync(d_w + o, h, (nw - o < chunk ? nw - o : chunk) * 2, cudaMemcpyHostToDevice, stream));
    CHECK_CUDA(cudaMemsetAsync(d_y, 0, ny * 2, stream));
    matmul_cuda *mm = matmul_cuda_create(0);
    const char *rule = getenv("DFLASH_GEMM_PICK");
    printf("matmul survey: up to 16 heuristic candidates per shape, %d timed calls each after a warm-up; the pick "
           "rule: %s\n", iters, rule && *rule ? rule : "default");
    /* the clocks up first: a second of the largest forward */
    for (int i = 0; i < 150; i++)
        matmul_forward_cuda(mm, d_y, 24576, NULL, 0, 0.0f, d_x, 4096, d_w, 19218, 24576, 4096, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    double sum[4] = {0, 0, 0, 0}; /* ms of the first, the fastest, the pick, the no-split-K most-waves */
    char summary[32][200];
    for (int i = 0; i < ns; i++) {
        const sv_shape *s = &shapes[i];
        matmul_algo al[16];
        int na = 0, pick = 0;
        matmul_cuda_survey(mm, al, 16, iters, &na, &pick);
        switch (s->kind) {
        case SV_FWD:
            matmul_forward_cuda(mm, d_y, s->n, s->extra ? d_c : NULL, s->n, s->extra ? 1.0f : 0.0f, d_x, s->k, d_w,
                                s->m, s->n, s->k, stream);
            break;
        case SV_FWD_F32:
            matmul_forward_f32_cuda(mm, (float *)d_y, s->n, 0.0f, d_x, s->k, d_w, s->m, s->n, s->k, stream);
            break;
        case SV_DX:
            matmul_backward_cuda(mm, d_y, s->k, s->extra, NULL, 0, d_x, s->n, NULL, 0, d_w, s->m, s->n, s->k, stream);
            break;
        default:
            matmul_backward_cuda(mm, NULL, 0, 0, (float *)d_y, 1, d_x, s->n, d_x + (size_t)s->m * s->n, s->k, d_w,
                                 s->m, s->n, s->k, stream);
            break;
        }
        matmul_cuda_survey(mm, NULL, 0, 0, NULL, NULL);
        const double flop = 2.0 * s->m * (double)s->n * s->k;
        int fastest = 0, waves = -1;
        for (int j = 0; j < na; j++) {
            const matmul_algo *a = &al[j];
            if (a->ms > 0 && (al[fastest].ms <= 0 || a->ms < al[fastest].ms)) fastest = j;
            if (a->runnable && a->splitk <= 1 && (waves < 0 || a->waves > al[waves].waves)) waves = j;
            printf("survey %-22s m %5d n %6d k %5d #%-2d algo %2d tile %3d stages %3d splitk %2d red %u cluster %2d "
                   "swz %d cust %d ws %6.1f MB waves %6.2f: %7.3f ms %4.0f TFLOP/s\n", s->name, s->m, s->n, s->k, j,
                   a->id, a->tile, a->stages, a->splitk, (unsigned)a->reduction, a->cluster, a->swizzle, a->custom,
                   a->workspace / 1e6, a->waves, a->ms, a->ms > 0 ? flop / a->ms / 1e9 : 0.0);
        }
        if (waves < 0) waves = 0;
        const int idx[4] = {0, fastest, pick, waves};
        for (int q = 0; q < 4; q++) sum[q] += al[idx[q]].ms;
#define TF(j) (al[j].ms > 0 ? flop / al[j].ms / 1e9 : 0.0)
        snprintf(summary[i], sizeof summary[i],
                 "%-22s first #%d %4.0f | fastest #%-2d %4.0f | pick #%-2d %4.0f | nosplit-waves #%-2d %4.0f TFLOP/s",
                 s->name, 0, TF(0), fastest, TF(fastest), pick, TF(pick), waves, TF(waves));
#undef TF
    }
    printf("matmul survey summary (TFLOP/s):\n");
    for (int i = 0; i < ns; i++) printf("survey summary %s\n", summary[i]);
    printf("survey summary total ms over the shapes: first %.2f, fastest %.2f, pick %.2f, nosplit-waves %.2f\n", sum[0],
           sum[1], sum[2], sum[3]);
    matmul_cuda_destroy(&mm);
    CHECK_CUDA(cudaFree(d_x)); CHECK_CUDA(cudaFree(d_w)); CHECK_CUDA(cudaFree(d_c)); CHECK_CUDA(cudaFree(d_y));
    free(h);
}
#endif

/* matmul_algo_pick on made-up heuristic answers (a host rule, no device work): the first unless the output is fp32
 * with an inner dimension <= 4096 and the first fills the GPU; then the runnable candidate without split-K with the
 * most waves (the earliest on a tie). With DFLASH_GEMM_PICK=first (the rule is read once a process): always the first. */
static void matmul_pick_check(const kc_case *kc)
{
    (void)kc;
    const char *env = getenv("DFLASH_GEMM_PICK");
    const int first_only = env && !strcmp(env, "first");
    /* waves, split-K, runnable */
    static const float waves[6] = {28.8f, 36.0f, 70.0f, 80.0f, 64.0f, 64.0f};
    static const int splitk[6] = {1, 1, 4, 1, 1, 1}, runnable[6] = {1, 1, 1, 0, 1, 1};
    matmul_algo a[6];
    memset(a, 0, sizeof a);
    for (int i = 0; i < 6; i++) a[i].waves = waves[i], a[i].splitk = splitk[i], a[i].runnable = runnable[i];
    struct { int out_bytes, inner_k, want; } t[] = {
        {4, 4096, 4}, /* fp32 out, inner 4096: most waves, not split-K, runnable, the earliest of a tie */
        {4, 3072, 4}, /* fp32 out, inner 3072: the same */
        {2, 2048, 0}, /* bf16 out, inner 2048: the first */
        {2, 4096, 0}, /* bf16 out, inner 4096: the first */
        {4, 8192, 0}, /* fp32 out, inner 8192: the first */
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        EXPECT(matmul_algo_pick(a, 6, t[i].out_bytes, t[i].inner_k) == (first_only ? 0 : t[i].want));
    EXPECT(matmul_algo_pick(a, 1, 4, 4096) == 0); /* one candidate: it */
    a[0].waves = 0.5f;
    EXPECT(matmul_algo_pick(a, 6, 4, 4096) == 0); /* the first under one wave: the first */
}

const kc_op kc_matmul_forward = {"matmul_forward", "bf16", "m n k ldx ldy with_c", matmul_forward_cpu_check,
                                 KC_CUDA(matmul_forward_cuda_check)};
const kc_op kc_matmul_forward_k0 = {"matmul_forward_k0", "f32", "", matmul_k0_cpu_check, NULL};
const kc_op kc_matmul_backward = {"matmul_backward", "bf16 (dw f32)", "m n k lddy ldx lddx acc_dx acc_dw",
                                  matmul_backward_cpu_check, KC_CUDA(matmul_backward_cuda_check)};
const kc_op kc_matmul_pick = {"matmul_pick", "-", "", matmul_pick_check, NULL}; /* a host rule: no device work */
const kc_op kc_matmul_forward_f32 = {"matmul_forward_f32", "bf16->f32", "m n k accumulate", matmul_forward_f32_cpu_check,
                                     KC_CUDA(matmul_forward_f32_cuda_check)};
