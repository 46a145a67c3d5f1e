/* gemv: y = x·wᵀ (+ beta·c) for the few rows of a decoding step (kernels/gemv.h), and the same with the RMSNorm of x
 * on the fly. CPU: gemv_forward_cpu against a naive double sum on wide strides (padding columns untouched), the
 * residual from another buffer and in place (c == y). CUDA: the kernels of gemv_forward_cuda_with (the tensor-core
 * one for every m, the CUDA-core one for m <= GEMV_FMA_MAX_M with its k split and without) and
 * gemv_rmsnorm_forward_cuda (x's rows at RMS 3, so that the 1/rms matters) against the CPU reference on the same bf16
 * values; nothing written past the (m, n) block (the output starts poisoned); with vs_cublas, each kernel's output
 * against cuBLASLt's (matmul_forward_cuda) on the same operands within their bf16 roundings; gate|up with SwiGLU
 * folded in against the CPU and bit for bit against the unfolded path. The driver's second run gives the same bits
 * (kernel_cases.h). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemv.h"
#include "rmsnorm.h"
#include "swiglu.h"
#include "tests/kernel_cases.h"
#include "tests/test.h"
#include "util.h"

#ifdef DFLASH_CUDA
#include "matmul.h"
#endif

/* ---- gemv_forward: m n k ldx ldy resid vs_cublas (resid 0: none, 1: c in its own buffer, 2: in place, c == y) ---- */

static void gemv_forward_cpu_check(const kc_case *c)
{
    const int m = c->p[0], n = c->p[1], k = c->p[2], ldx = c->p[3], ldy = c->p[4], resid = c->p[5], ldc = n + 3;
    float *x = rnd_floats((size_t)m * ldx, 1.0), *w = rnd_floats((size_t)n * k, 1.0);
    float *cb = rnd_floats((size_t)m * ldc, 1.0), *y = rnd_floats((size_t)m * ldy, 1.0);
    float *y0 = dup_floats(y, (size_t)m * ldy);
    const float *cres = resid == 1 ? cb : resid == 2 ? y : NULL;
    const int lc = resid == 1 ? ldc : ldy;
    gemv_forward_cpu(y, ldy, cres, lc, resid ? 1.0f : 0.0f, x, ldx, w, m, n, k);
    double worst = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldy; j++) {
            const size_t o = (size_t)i * ldy + j;
            if (j >= n) { /* padding columns are untouched */
                EXPECT(y[o] == y0[o]);
                continue;
            }
            double ref = resid == 1 ? cb[(size_t)i * ldc + j] : resid == 2 ? y0[o] : 0.0, mag = fabs(ref);
            for (int e = 0; e < k; e++) {
                ref += (double)x[(size_t)i * ldx + e] * w[(size_t)j * k + e];
                mag += fabs((double)x[(size_t)i * ldx + e] * w[(size_t)j * k + e]);
            }
            worst = fmax(worst, fabs(y[o] - ref) / (mag + 1e-30));
        }
    EXPECT(worst < 1e-6);
    free(x), free(w), free(cb), free(y), free(y0);
}

#ifdef DFLASH_CUDA
/* The operands of a row, on the host (fp32 copies of the bf16 values) and on the device. norm: x's rows at RMS 3
 * and norm weights around 1 (nw), the reference normalising x in fp32 first. */
typedef struct gemv_ops {
    int m, n, k, ldx, ldy, resid, ldc;
    float beta, *ref;
    uint16_t *dx, *dw, *dc, *dnw;
} gemv_ops;

static gemv_ops gemv_ops_make(const kc_case *kc, int norm, float eps)
{
    gemv_ops g = {.m = kc->p[0], .n = kc->p[1], .k = kc->p[2], .ldx = kc->p[3], .ldy = kc->p[4], .resid = kc->p[5]};
    const int m = g.m, n = g.n, k = g.k, ldx = g.ldx;
    g.ldc = n + 3, g.beta = g.resid ? 1.0f : 0.0f;
    float *fx = xmalloc(sizeof(float) * (size_t)m * ldx), *fw = xmalloc(sizeof(float) * (size_t)n * k);
    float *fc = xmalloc(sizeof(float) * (size_t)m * g.ldc), *fnw = xmalloc(sizeof(float) * (size_t)k);
    uint16_t *hx = rnd_bf16((size_t)m * ldx, norm ? 3.0 : 1.0, fx), *hw = rnd_bf16((size_t)n * k, 1.0 / sqrt(k), fw);
    uint16_t *hc = rnd_bf16((size_t)m * g.ldc, 1.0, fc), *hnw = rnd_bf16((size_t)k, 0.5, fnw);
    for (int i = 0; i < k; i++) hnw[i] = f32_to_bf16(fnw[i] + 1.0f), fnw[i] = bf16_to_f32(hnw[i]);
    float *xin = fx;
    if (norm) {
        xin = xmalloc(sizeof(float) * (size_t)m * ldx);
        rmsnorm_forward_cpu(xin, ldx, fx, ldx, fnw, m, k, eps);
    }
    g.ref = xmalloc(sizeof(float) * (size_t)m * n);
    gemv_forward_cpu(g.ref, n, g.resid ? fc : NULL, g.ldc, g.beta, xin, ldx, fw, m, n, k);
    g.dx = dev_upload(hx, (size_t)m * ldx * 2), g.dw = dev_upload(hw, (size_t)n * k * 2);
    g.dc = dev_upload(hc, (size_t)m * g.ldc * 2), g.dnw = dev_upload(hnw, (size_t)k * 2);
    if (xin != fx) free(xin);
    free(fx), free(fw), free(fc), free(fnw), free(hx), free(hw), free(hc), free(hnw);
    return g;
}

static void gemv_ops_free(gemv_ops *g)
{
    void *d[] = {g->dx, g->dw, g->dc, g->dnw};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) CHECK_CUDA(cudaFree(d[i]));
    free(g->ref);
}

/* A poisoned output, holding c's rows for the in-place residual (resid 2): y and its residual */
static uint16_t *gemv_out(const gemv_ops *g, const uint16_t **c, int *ldc)
{
    uint16_t *dy = dev_poisoned((size_t)g->m * g->ldy);
    *c = g->resid == 1 ? g->dc : NULL, *ldc = g->ldc;
    if (g->resid == 2) {
        CHECK_CUDA(cudaMemcpy2D(dy, (size_t)g->ldy * 2, g->dc, (size_t)g->ldc * 2, (size_t)g->n * 2, (size_t)g->m,
                                cudaMemcpyDeviceToDevice));
        *c = dy, *ldc = g->ldy;
    }
    return dy;
}

/* The (m, n) block of a downloaded output (ldy) as fp32, and how many values past the block are not the poison. */
static float *gemv_block(const gemv_ops *g, const uint16_t *y, size_t *stray)
{
    float *b = xmalloc(sizeof(float) * (size_t)g->m * g->n);
    *stray = 0;
    for (int r = 0; r < g->m; r++)
        for (int j = 0; j < g->ldy; j++) {
            if (j < g->n) b[(size_t)r * g->n + j] = bf16_to_f32(y[(size_t)r * g->ldy + j]);
            else *stray += y[(size_t)r * g->ldy + j] != 0xffff;
        }
    return b;
}

/* One kernel's output (downloaded, ldy) against the reference, the poison past the block, and cuBLASLt's (fcb, when
 * given). */
static void gemv_judge(const gemv_ops *g, const char *kname, const uint16_t *y, const float *fcb)
{
    static const char *const how[3] = {"", " + residual", " + residual in place"};
    char name[200];
    size_t stray;
    float *b = gemv_block(g, y, &stray);
    uint16_t *bb = xmalloc((size_t)g->m * g->n * 2);
    for (size_t i = 0; i < (size_t)g->m * g->n; i++) bb[i] = f32_to_bf16(b[i]);
    snprintf(name, sizeof name, "gemv %s m=%d n=%d k=%d ldx=%d ldy=%d%s", kname, g->m, g->n, g->k, g->ldx, g->ldy,
             how[g->resid]);
    compare_bf16(name, bb, g->ref, (size_t)g->m * g->n, 4e-3, 1e-2); /* one bf16 rounding + fp32 order */
    snprintf(name, sizeof name, "gemv %s m=%d n=%d k=%d: values written past the (m, n) block", kname, g->m, g->n, g->k);
    kc_report(name, (double)stray, 0.0);
    if (fcb) { /* cuBLASLt on the same operands: the two agree within their two bf16 roundings */
        snprintf(name, sizeof name, "gemv %s m=%d n=%d k=%d%s against cuBLASLt", kname, g->m, g->n, g->k,
                 how[g->resid]);
        compare_bf16(name, bb, fcb, (size_t)g->m * g->n, 6e-3, 2e-2);
    }
    free(b), free(bb);
}

static void gemv_forward_cuda_check(const kc_case *kc)
{
    gemv_ops g = gemv_ops_make(kc, 0, 0.0f);
    const uint16_t *c;
    int ldc;
    float *fcb = NULL;
    if (kc->p[6]) { /* cuBLASLt's output, downloaded without recording it (the driver compares the kernels' runs) */
        static matmul_cuda *mm;
        if (!mm) mm = matmul_cuda_create(0);
        uint16_t *dy = gemv_out(&g, &c, &ldc), *h = xmalloc((size_t)g.m * g.ldy * 2);
        matmul_forward_cuda(mm, dy, g.ldy, c, ldc, g.beta, g.dx, g.ldx, g.dw, g.m, g.n, g.k, stream);
        CHECK_CUDA(cudaStreamSynchronize(stream));
        CHECK_CUDA(cudaMemcpy(h, dy, (size_t)g.m * g.ldy * 2, cudaMemcpyDeviceToHost));
        size_t stray;
        fcb = gemv_block(&g, h, &stray);
        CHECK_CUDA(cudaFree(dy));
        free(h);
    }
    static const int kernels[] = {GEMV_KERNEL_MMA, GEMV_KERNEL_FMA, GEMV_KERNEL_FMA_UNSPLIT};
    static const char *const kname[] = {"mma", "fma", "fma unsplit"};
    for (int i = 0; i < 3; i++) {
        if (kernels[i] != GEMV_KERNEL_MMA && g.m > GEMV_FMA_MAX_M) continue;
        uint16_t *dy = gemv_out(&g, &c, &ldc);
        gemv_forward_cuda_with(kernels[i], dy, g.ldy, c, ldc, g.beta, g.dx, g.ldx, g.dw, g.m, g.n, g.k, stream);
        uint16_t *y = dev_get(dy, (size_t)g.m * g.ldy * 2);
        gemv_judge(&g, kname[i], y, fcb);
        CHECK_CUDA(cudaFree(dy));
        free(y);
    }
    free(fcb);
    gemv_ops_free(&g);
}

/* ---- gemv_rmsnorm: m n k ldx ldy resid (m <= GEMV_FMA_MAX_M) ---- */
static void gemv_rmsnorm_cuda_check(const kc_case *kc)
{
    const float eps = 1e-6f;
    gemv_ops g = gemv_ops_make(kc, 1, eps);
    const uint16_t *c;
    int ldc;
    uint16_t *dy = gemv_out(&g, &c, &ldc);
    gemv_rmsnorm_forward_cuda(dy, g.ldy, c, ldc, g.beta, g.dx, g.ldx, g.dnw, eps, g.dw, g.m, g.n, g.k, stream);
    uint16_t *y = dev_get(dy, (size_t)g.m * g.ldy * 2);
    gemv_judge(&g, "fma+rmsnorm", y, NULL);
    CHECK_CUDA(cudaFree(dy));
    free(y);
    gemv_ops_free(&g);
}

/* ---- gemv_rmsnorm_swiglu: m I k ldx ldy (m <= GEMV_FMA_MAX_M; w: 2I rows, the gate's then the up's) ----
 * Against the CPU reference (rmsnorm_forward_cpu, gemv_forward_cpu of the 2I rows rounded to bf16, then
 * swiglu_forward_cpu), and bit for bit against the path it replaces: gemv_rmsnorm_forward_cuda into a (m, 2I) buffer,
 * then swiglu_forward_cuda. */
static void gemv_rmsnorm_swiglu_cuda_check(const kc_case *kc)
{
    const float eps = 1e-6f;
    const int m = kc->p[0], I = kc->p[1], k = kc->p[2], ldx = kc->p[3], ldy = kc->p[4];
    const kc_case wide = {.op = kc->op, .p = {m, 2 * I, k, ldx, 2 * I, 0}};
    gemv_ops g = gemv_ops_make(&wide, 1, eps); /* ref: the (m, 2I) gate|up of the normalised x */
    float *ref = xmalloc(sizeof(float) * (size_t)m * I);
    for (size_t i = 0; i < (size_t)m * 2 * I; i++) g.ref[i] = bf16_to_f32(f32_to_bf16(g.ref[i]));
    for (int r = 0; r < m; r++)
        swiglu_forward_cpu(ref + (size_t)r * I, g.ref + (size_t)r * 2 * I, g.ref + (size_t)r * 2 * I + I, (size_t)I);
    char name[200];
    if (!gemv_rmsnorm_swiglu_cuda_takes(g.dx, ldx, g.dnw, g.dw, m, I, k, ldy)) {
        snprintf(name, sizeof name, "gemv_rmsnorm_swiglu m=%d I=%d k=%d: the fold is taken (DFLASH_GEMV_SPLIT unset)",
                 m, I, k);
        kc_report(name, 1.0, 0.0);
    } else {
        uint16_t *dy = dev_poisoned((size_t)m * ldy), *dgu = dev_poisoned((size_t)m * 2 * I);
        uint16_t *dact = dev_poisoned((size_t)m * ldy);
        gemv_rmsnorm_swiglu_forward_cuda(dy, ldy, g.dx, ldx, g.dnw, eps, g.dw, m, I, k, stream);
        gemv_rmsnorm_forward_cuda(dgu, 2 * I, NULL, 0, 0.0f, g.dx, ldx, g.dnw, eps, g.dw, m, 2 * I, k, stream);
        swiglu_forward_cuda(dact, ldy, dgu, 2 * I, m, I, stream);
        uint16_t *y = dev_get(dy, (size_t)m * ldy * 2), *a = dev_get(dact, (size_t)m * ldy * 2);
        uint16_t *blk = xmalloc((size_t)m * I * 2);
        size_t stray = 0, differ = 0;
        for (int r = 0; r < m; r++)
            for (int j = 0; j < ldy; j++) {
                const size_t o = (size_t)r * ldy + j;
                if (j < I) blk[(size_t)r * I + j] = y[o], differ += y[o] != a[o];
                else stray += y[o] != 0xffff;
            }
        snprintf(name, sizeof name, "gemv_rmsnorm_swiglu m=%d I=%d k=%d ldx=%d ldy=%d", m, I, k, ldx, ldy);
        compare_bf16(name, blk, ref, (size_t)m * I, 8e-3, 2e-2); /* gate|up's rounding, then the output's */
        snprintf(name, sizeof name, "gemv_rmsnorm_swiglu m=%d I=%d k=%d: values unlike gemv_rmsnorm + swiglu", m, I, k);
        kc_report(name, (double)differ, 0.0);
        snprintf(name, sizeof name, "gemv_rmsnorm_swiglu m=%d I=%d k=%d: values written past the (m, I) block", m, I,
                 k);
        kc_report(name, (double)stray, 0.0);
        CHECK_CUDA(cudaFree(dy));
        CHECK_CUDA(cudaFree(dgu));
        CHECK_CUDA(cudaFree(dact));
        free(y), free(a), free(blk);
    }
    free(ref);
    gemv_ops_free(&g);
}
#endif

const kc_op kc_gemv_forward = {"gemv_forward", "bf16", "m n k ldx ldy resid vs_cublas", gemv_forward_cpu_check,
                               KC_CUDA(gemv_forward_cuda_check)};
const kc_op kc_gemv_rmsnorm = {"gemv_rmsnorm", "bf16", "m n k ldx ldy resid", NULL, KC_CUDA(gemv_rmsnorm_cuda_check)};
const kc_op kc_gemv_rmsnorm_swiglu = {"gemv_rmsnorm_swiglu", "bf16", "m I k ldx ldy", NULL,
                                      KC_CUDA(gemv_rmsnorm_swiglu_cuda_check)};
