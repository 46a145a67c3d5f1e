/* matmul: the linear layer y = x · wᵀ and its backward, on OpenBLAS (CPU). Shapes are row-major with explicit row
 * strides (ld, in elements) so that results can land in column blocks of wider tensors. No allocation. */
#ifndef DFLASH_KERNEL_MATMUL_H
#define DFLASH_KERNEL_MATMUL_H

/* y (m, n; row stride ldy) = x (m, k; ldx) · w (n, k)ᵀ, plus the old y when accumulate != 0. */
void matmul_forward_cpu(float *y, int ldy, const float *x, int ldx, const float *w, int m, int n, int k,
                        int accumulate);
/* Backward of matmul_forward_cpu for dy (m, n; lddy):
 *   dx (m, k; lddx) = dy · w   (added to dx when accumulate_dx; skipped when dx is NULL)
 *   dw (n, k)      += dyᵀ · x  (always accumulated; skipped when dw is NULL) */
void matmul_backward_cpu(float *dx, int lddx, int accumulate_dx, float *dw, const float *dy, int lddy,
                         const float *x, int ldx, const float *w, int m, int n, int k);

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA (cuBLASLt): bf16 operands, fp32 accumulation, bf16 output. One matmul_cuda per thread/stream owns the
 * cuBLASLt handle, the workspace and a cache of descriptors and chosen algorithms per shape (created once, so the
 * steady state allocates nothing). Failures exit through CHECK_* (cuda_check.h). */
typedef struct matmul_cuda matmul_cuda;
/* Handle with a device workspace of workspace_bytes (0: 64 MiB). */
matmul_cuda *matmul_cuda_create(size_t workspace_bytes);
void matmul_cuda_destroy(matmul_cuda **h);
/* y (m, n; ldy) = x (m, k; ldx) · w (n, k)ᵀ + beta · c (m, n; ldc). c may be NULL when beta == 0, and may be y
 * (then ldc must equal ldy); with c != y the residual add reads c and writes y (zero-copy capture). */
void matmul_forward_cuda(matmul_cuda *h, uint16_t *y, int ldy, const uint16_t *c, int ldc, float beta,
                         const uint16_t *x, int ldx, const uint16_t *w, int m, int n, int k, void *stream);
/* y (m, n; ldy) fp32 = x (m, k; ldx) · w (n, k)ᵀ + beta · y (bf16 operands, fp32 accumulation and output). */
void matmul_forward_f32_cuda(matmul_cuda *h, float *y, int ldy, float beta, const uint16_t *x, int ldx,
                             const uint16_t *w, int m, int n, int k, void *stream);
/* Backward of matmul_forward_cuda for dy (m, n; lddy), bf16 operands, fp32 accumulation:
 *   dx (m, k; lddx) bf16  = dy · w    (+ old dx when accumulate_dx; skipped when dx is NULL)
 *   dw (n, k)      fp32   = dyᵀ · x   (+ old dw when accumulate_dw, else overwritten unread; skipped when NULL)
 * Deterministic (heuristic algorithm cached per shape, no in-place split-K reduction): the same call gives the same
 * bits; nothing is allocated after the first call of a shape. */
void matmul_backward_cuda(matmul_cuda *h, uint16_t *dx, int lddx, int accumulate_dx, float *dw, int accumulate_dw,
                          const uint16_t *dy, int lddy, const uint16_t *x, int ldx, const uint16_t *w, int m, int n,
                          int k, void *stream);

/* Which of cuBLASLt's heuristic candidates a GEMM runs: one rule for every cuBLASLt GEMM of the project (this
 * module's and cross_entropy_cuda's), a function of the heuristic's answer only, so the same algorithm (and the same
 * bits) every run; never chosen by timing. A candidate as the rule sees it: */
typedef struct matmul_algo {
    int32_t id, tile, stages, splitk, reduction, cluster, swizzle, custom, runnable;
    float waves;   /* the heuristic's wavesCount */
    size_t workspace;
    float ms;      /* matmul_cuda_survey's timing (-1: not runnable) */
} matmul_algo;
/* The index of the candidate to run among a[0..n) (n >= 1, in the heuristic's order) for a GEMM whose output
 * elements are out_bytes wide and whose inner (reduction) dimension is inner_k, by the rule DFLASH_GEMM_PICK names
 * (read once): "first" the heuristic's first answer; unset or "default": the first, except where the output is fp32
 * with inner_k <= 4096 and the first fills the GPU: the candidate without split-K
 * with the most waves (measured: matmul.c). An unknown value exits naming it. */
int matmul_algo_pick(const matmul_algo *a, int n, int out_bytes, int inner_k);
/* Diagnostics (timing tests): with out != NULL, each GEMM the handle's next calls make is not run once through its
 * cached algorithm but with each of up to max_out (<= 16) of cuBLASLt's heuristic candidates for it (the same
 * preference as the cache's), one warm-up and iters timed calls each; out[0..*nout) describes them (ms: the mean),
 * *picked = matmul_algo_pick's choice. out NULL: survey off. */
void matmul_cuda_survey(matmul_cuda *h, matmul_algo *out, int max_out, int iters, int *nout, int *picked);
#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include <cublasLt.h>
/* matmul_algo_pick over a cuBLASLt heuristic answer (the rule's one function, for cross_entropy.cu's GEMMs too). */
int matmul_lt_pick(const cublasLtMatmulHeuristicResult_t *res, int nres, int out_bytes, int inner_k);
/* cuBLASLt's heuristic candidates (at most max, best first by its model; returns how many) for the GEMM that desc and
 * the layouts describe, under the project's one preference (for cross_entropy.cu's GEMMs too): at most
 * workspace_bytes of workspace, split-K only through a separate fp32 reduction pass (no in-place reduction into the
 * output: the same bits every call), the operands' alignments in bytes (A, B, C, D). */
int matmul_lt_candidates(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                         cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                         size_t workspace_bytes, const uint32_t align[4], cublasLtMatmulHeuristicResult_t *res, int max);
#endif

#endif
