/* matmul: y = x · wᵀ and its backward on OpenBLAS (row-major, explicit row strides). */
#include "matmul.h"

#include <cblas.h>
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
