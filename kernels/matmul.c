/* matmul: y = x · wᵀ and its backward on OpenBLAS (row-major, explicit row strides). */
#include "matmul.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "progress.h"
#include "util.h"

void matmul_forward_cpu(float *y, int ldy, const float *x, int ldx, const float *w, int m, int n, int k,
                        int accumulate)
{
    DF_ASSERT(m >= 0 && n >= 0 && k >= 0 && ldy >= n && ldx >= k);
    progress_bump(); /* every product is a sign of life for the worker's liveness thread (progress.h) */
    if (m == 0 || n == 0) return;
    if (k == 0) { /* empty product; BLAS would reject ldx/ldw of 0 */
        if (!accumulate)
            for (int i = 0; i < m; i++) memset(y + (size_t)i * ldy, 0, (size_t)n * sizeof *y);
        return;
    }
    /* OpenBLAS zeroes C when beta == 0, so an uninitialised y is fine. */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, ldx, w, k,
                accumulate ? 1.0f : 0.0f, y, ldy);
}

void matmul_backward_cpu(float *dx, int lddx, int accumulate_dx, float *dw, const float *dy, int lddy,
                         const float *x, int ldx, const float *w, int m, int n, int k)
{
    DF_ASSERT(m >= 0 && n >= 0 && k >= 0 && lddy >= n);
    progress_bump();
    if (m == 0 || k == 0) return;
    if (dx) {
        DF_ASSERT(lddx >= k);
        if (n == 0) {
            if (!accumulate_dx)
                for (int i = 0; i < m; i++) memset(dx + (size_t)i * lddx, 0, (size_t)k * sizeof *dx);
        } else {
            /* dx (m, k) = dy (m, n) · w (n, k) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n, 1.0f, dy, lddy, w, k,
                        accumulate_dx ? 1.0f : 0.0f, dx, lddx);
        }
    }
    if (dw && n > 0) {
        DF_ASSERT(ldx >= k);
        /* dw (n, k) += dyᵀ (n, m) · x (m, k) */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, dy, lddy, x, ldx, 1.0f, dw, k);
    }
}

/* The pick rule (DFLASH_GEMM_PICK, read once a process): 0 the heuristic's first answer, 1 the default. */
static int pick_rule = 1;
static pthread_once_t pick_rule_once = PTHREAD_ONCE_INIT;

static void matmul_pick_rule_read(void)
{
    const char *v = getenv("DFLASH_GEMM_PICK");
    if (!v || !*v || !strcmp(v, "default")) return;
    if (!strcmp(v, "first")) {
        pick_rule = 0;
        return;
    }
    fprintf(stderr, "DFLASH_GEMM_PICK=%s: unknown GEMM pick rule (default, first)\n", v);
    exit(1);
}

/* The default: the heuristic's first answer, except for a GEMM whose output is fp32 with an inner dimension of at
 * most 4096 (the output heavy for the work) and whose first answer fills the GPU (>= 1 wave): there the candidate
 * without split-K with the most waves (the first when none). Measured on the H200 (the matmul_survey timing, 8
 * candidates each, TFLOP/s first -> this rule's pick): cross_entropy's logits GEMM (fp32, m 1024, n 151936, k 4096)
 * 654 -> 787; the drafter's fc dw (fp32, inner 3072) 676 -> 747, k|v dw (fp32, inner 3072) 602 -> 661. bf16 outputs
 * keep the first: the one small one that gained (the drafter's k|v dx, inner 2048: 597 -> 658) was the only bf16
 * shape of inner <= 2048 measured (the qwen3_moe and hybrid-MoE shapes of hidden 2048 were not). Elsewhere "most
 * waves" loses where it matters: the target's gate|up (19218 x 24576 x 4096) 821 -> 671, o_proj 633 -> 580, the
 * drafter's gate|up dx 801 -> 656, and over the target step and the drafter step's GEMMs (weighted by calls) it took
 * 504 ms against the first's 460 (the fastest candidate of each shape: 445). */
int matmul_algo_pick(const matmul_algo *a, int n, int out_bytes, int inner_k)
{
    pthread_once(&pick_rule_once, matmul_pick_rule_read);
    int best = 0;
    if (pick_rule == 0 || n < 1 || out_bytes < 4 || inner_k > 4096 || a[0].waves < 1.0f) return best;
    float most = -1.0f;
    for (int i = 0; i < n; i++) {
        if (!a[i].runnable || a[i].splitk > 1) continue;
        if (a[i].waves > most) most = a[i].waves, best = i;
    }
    return best;
}
