/* gemv_forward_cuda (kernels/gemv.h), both of its kernels (the tensor-core one for every m, the CUDA-core one for
 * m <= GEMV_FMA_MAX_M), against the CPU reference: every row count 1..16 of x (one and two MMA n-tiles),
 * output widths that are not multiples of the CTA's 16 columns, k from 8 to 12288 (one warp's chunk, partial chunks,
 * several rounds of the 8 warps), row strides wider than the rows, a residual read from another buffer and in place
 * (c == y), the Qwen3-8B decoding shapes (q|k|v, o_proj, gate|up, down_proj, lm_head at m = 1 and 16). Each case
 * runs twice and must give the same bits; outputs past the (m, n) block must stay unwritten (poisoned). The kernel's
 * output against cuBLASLt's (matmul_forward_cuda) on the 8B shapes within bf16 rounding. The CUDA-core kernel with
 * the RMSNorm on the fly (gemv_rmsnorm_forward_cuda) against rmsnorm_forward_cpu then gemv_forward_cpu in fp32, on
 * the same cases (x's rows far from unit RMS).
 * Prints "ok <case> ..." / "FAIL <case> ..."; exit status 0 only when every case passed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "gemv.h"
#include "gpu_test.h"
#include "matmul.h"
#include "rmsnorm.h"
#include "util.h"

typedef struct gcase {
    int m, n, k, ldx_pad, ldy_pad, resid; /* resid: 0 none, 1 from c, 2 in place */
} gcase;

#define KERNEL_NORM 100 /* gemv_rmsnorm_forward_cuda */

/* One kernel on the case's operands, twice: against the reference, the same bits both times, nothing written past
 * the (m, n) block; against cuBLASLt's output when given. */
static void run_kernel(const gcase *g, int kernel, const uint16_t *dx, const uint16_t *dw, const uint16_t *dc,
                       const uint16_t *dnw, float eps, const float *ref, const float *fcb)
{
    const int m = g->m, n = g->n, k = g->k, ldx = k + g->ldx_pad, ldy = n + g->ldy_pad, ldc = n + 3;
    const float beta = g->resid ? 1.0f : 0.0f;
    uint16_t *got[2];
    for (int rep = 0; rep < 2; rep++) {
        uint16_t *dy = dev_poisoned((size_t)m * ldy);
        const uint16_t *c = NULL;
        int lc = 0;
        if (g->resid == 1) c = dc, lc = ldc;
        if (g->resid == 2) { /* y holds the residual: rows of c copied into y's stride */
            CHECK_CUDA(cudaMemcpy2D(dy, (size_t)ldy * 2, dc, (size_t)ldc * 2, (size_t)n * 2, (size_t)m,
                                    cudaMemcpyDeviceToDevice));
            c = dy, lc = ldy;
        }
        if (kernel == KERNEL_NORM)
            gemv_rmsnorm_forward_cuda(dy, ldy, c, lc, beta, dx, ldx, dnw, eps, dw, m, n, k, stream);
        else
            gemv_forward_cuda_with(kernel, dy, ldy, c, lc, beta, dx, ldx, dw, m, n, k, stream);
        got[rep] = dev_get(dy, (size_t)m * ldy * 2);
        CHECK_CUDA(cudaFree(dy));
    }
    uint16_t *block = xmalloc((size_t)m * n * 2);
    size_t stray = 0;
    for (int r = 0; r < m; r++) {
        memcpy(block + (size_t)r * n, got[0] + (size_t)r * ldy, (size_t)n * 2);
        for (int j = n; j < ldy; j++) stray += got[0][(size_t)r * ldy + j] != 0xffff;
    }
    char name[200];
    const char *how[3] = {"", " + residual", " + residual in place"};
    const char *kn = kernel == KERNEL_NORM ? "fma+rmsnorm" : kernel == GEMV_KERNEL_FMA ? "fma" : "mma";
    snprintf(name, sizeof name, "gemv %s m=%d n=%d k=%d ldx=%d ldy=%d%s", kn, m, n, k, ldx, ldy, how[g->resid]);
    compare_bf16(name, block, ref, (size_t)m * n, 4e-3, 1e-2);
    int same = !memcmp(got[0], got[1], (size_t)m * ldy * 2);
    printf("%s %s: twice the same bits (%s), %zu values past the block written\n", same && !stray ? "ok" : "FAIL",
           name, same ? "yes" : "no", stray);
    if (!same || stray) failures++;
    if (fcb) { /* cuBLASLt on the same operands: the two agree within their bf16 roundings */
        snprintf(name, sizeof name, "gemv %s m=%d n=%d k=%d%s against cuBLASLt", kn, m, n, k, how[g->resid]);
        compare_bf16(name, block, fcb, (size_t)m * n, 6e-3, 2e-2);
    }
    free(got[0]), free(got[1]), free(block);
}

/* A case's operands and reference made once, then every kernel that takes it: the tensor-core one, the CUDA-core
 * one (m <= GEMV_FMA_MAX_M); norm: the CUDA-core one with the RMSNorm on the fly, x's rows at RMS 3 (the 1/rms
 * matters), the reference normalised in fp32. */
static void run_case(const gcase *g, matmul_cuda *mm, int norm)
{
    const float eps = 1e-6f;
    const int m = g->m, n = g->n, k = g->k, ldx = k + g->ldx_pad, ldy = n + g->ldy_pad, ldc = n + 3;
    const float beta = g->resid ? 1.0f : 0.0f;
    float *fx = xmalloc(sizeof(float) * (size_t)m * ldx), *fw = xmalloc(sizeof(float) * (size_t)n * k);
    float *fc = xmalloc(sizeof(float) * (size_t)m * ldc), *ref = xmalloc(sizeof(float) * (size_t)m * n);
    uint16_t *hx = rnd_bf16((size_t)m * ldx, 1.0, fx), *hw = rnd_bf16((size_t)n * k, 1.0 / sqrt((double)k), fw);
    uint16_t *hc = rnd_bf16((size_t)m * ldc, 1.0, fc);
    float *fnw = xmalloc(sizeof(float) * (size_t)k), *fxn = xmalloc(sizeof(float) * (size_t)m * ldx);
    uint16_t *hnw = rnd_bf16((size_t)k, 0.5, fnw);
    for (int i = 0; i < k; i++) fnw[i] += 1.0f, hnw[i] = f32_to_bf16(fnw[i]), fnw[i] = bf16_to_f32(hnw[i]);
    if (norm) {
        for (size_t i = 0; i < (size_t)m * ldx; i++) hx[i] = f32_to_bf16(3.0f * fx[i]), fx[i] = bf16_to_f32(hx[i]);
        rmsnorm_forward_cpu(fxn, ldx, fx, ldx, fnw, m, k, eps);
    }
    gemv_forward_cpu(ref, n, g->resid ? fc : NULL, ldc, beta, norm ? fxn : fx, ldx, fw, m, n, k);
    uint16_t *dx = dev_upload(hx, (size_t)m * ldx * 2), *dw = dev_upload(hw, (size_t)n * k * 2);
    uint16_t *dnw = dev_upload(hnw, (size_t)k * 2), *dc = dev_upload(hc, (size_t)m * ldc * 2);
    float *fcb = NULL;
    if (mm && !norm) {
        uint16_t *dy = dev_poisoned((size_t)m * ldy);
        matmul_forward_cuda(mm, dy, ldy, g->resid ? dc : NULL, ldc, beta, dx, ldx, dw, m, n, k, stream);
        uint16_t *cb = dev_get(dy, (size_t)m * ldy * 2);
        fcb = xmalloc(sizeof(float) * (size_t)m * n);
        for (int r = 0; r < m; r++)
            for (int j = 0; j < n; j++) fcb[(size_t)r * n + j] = bf16_to_f32(cb[(size_t)r * ldy + j]);
        CHECK_CUDA(cudaFree(dy));
        free(cb);
    }
    if (norm) {
        run_kernel(g, KERNEL_NORM, dx, dw, dc, dnw, eps, ref, NULL);
    } else {
        run_kernel(g, GEMV_KERNEL_MMA, dx, dw, dc, dnw, eps, ref, fcb);
        if (m <= GEMV_FMA_MAX_M) run_kernel(g, GEMV_KERNEL_FMA, dx, dw, dc, dnw, eps, ref, fcb);
    }
    void *d[] = {dx, dw, dc, dnw};
    for (size_t i = 0; i < 4; i++) CHECK_CUDA(cudaFree(d[i]));
    free(fnw), free(fxn), free(hnw), free(fcb);
    free(fx), free(fw), free(fc), free(ref), free(hx), free(hw), free(hc);
}

int main(void)
{
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaStreamCreate(&stream));
    static const gcase small[] = {
        {1, 1, 8, 0, 0, 0},     {2, 17, 64, 8, 3, 0},    {3, 33, 136, 0, 0, 1},   {4, 100, 1000, 16, 5, 2},
        {5, 48, 128, 0, 0, 0},  {6, 7, 1032, 0, 0, 1},   {7, 250, 520, 8, 0, 0},  {8, 129, 2048, 0, 1, 2},
        {9, 64, 264, 0, 0, 0},  {10, 31, 4096, 8, 0, 1}, {11, 16, 24, 0, 0, 0},   {12, 500, 1024, 0, 7, 2},
        {13, 129, 2056, 0, 0, 1}, {14, 3, 12288, 0, 0, 0}, {15, 80, 640, 24, 2, 0}, {16, 1000, 1024, 0, 0, 2},
    };
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
        run_case(&small[i], NULL, 0);
        if (small[i].m <= GEMV_FMA_MAX_M) run_case(&small[i], NULL, 1);
    }
    /* the Qwen3-8B decoding shapes (H 4096, I 12288, q|k|v 6144, vocab 151936), against cuBLASLt as well */
    matmul_cuda *mm = matmul_cuda_create(0);
    static const gcase qwen[] = {
        {1, 6144, 4096, 0, 0, 0},  {1, 4096, 4096, 0, 0, 1}, {1, 24576, 4096, 0, 0, 0}, {1, 4096, 12288, 0, 0, 2},
        {4, 4096, 12288, 0, 0, 1}, {16, 6144, 4096, 0, 0, 0}, {16, 4096, 12288, 0, 0, 1}, {1, 151936, 4096, 0, 0, 0},
    };
    static const gcase qnorm[] = {{1, 6144, 4096, 0, 0, 0}, {4, 24576, 4096, 0, 0, 0}}; /* q|k|v, gate|up */
    for (size_t i = 0; i < sizeof qnorm / sizeof qnorm[0]; i++) run_case(&qnorm[i], NULL, 1);
    for (size_t i = 0; i < sizeof qwen / sizeof qwen[0]; i++) run_case(&qwen[i], mm, 0);
    matmul_cuda_destroy(&mm);
    printf("%s test_gemv_gpu: %d failures\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
