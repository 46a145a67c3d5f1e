/* gemv: the linear layer y = x · wᵀ (+ beta · c) for a few rows of x (decoding: one token, a small batch, a
 * verified block), where reading w once is the whole cost. Row-major shapes with explicit row strides, as matmul.h;
 * fp32 accumulation, one rounding of the sum. The CPU version is the reference. No allocation. */
#ifndef DFLASH_KERNEL_GEMV_H
#define DFLASH_KERNEL_GEMV_H

#include <stddef.h>
#include <stdint.h>

/* The most rows of x the CUDA kernel takes (above it cuBLASLt's tensor-core GEMMs are at the bandwidth bound). */
#define GEMV_MAX_M 16

/* y (m, n; ldy) = x (m, k; ldx) · w (n, k)ᵀ + beta · c (m, n; ldc); c may be NULL when beta == 0, and may be y
 * (ldc == ldy). Sums in double, rounded to float once. */
void gemv_forward_cpu(float *y, int ldy, const float *c, int ldc, float beta, const float *x, int ldx, const float *w,
                      int m, int n, int k);

#ifdef __cplusplus
extern "C" {
#endif
/* Whether gemv_forward_cuda takes these operands: 1 <= m <= GEMV_MAX_M, k and ldx multiples of 8, x and w 16-byte
 * aligned (16-byte loads of w's rows and x's rows). */
int gemv_cuda_takes(const uint16_t *x, int ldx, const uint16_t *w, int m, int n, int k);
/* CUDA, bf16 operands and output, fp32 accumulation; matmul_forward_cuda's contract (c may be y with ldc == ldy;
 * else the residual add reads c and writes y). Two kernels: GEMV_KERNEL_MMA on the tensor cores (mma.sync m16n8k16
 * with w as the 16-row operand: 16 output columns a CTA, its 8 warps splitting k, summed in a fixed order) and, for
 * m <= GEMV_FMA_MAX_M, GEMV_KERNEL_FMA on the CUDA cores (a warp per two output columns reading w's rows in
 * 512-byte pieces, 4 KiB in flight; where two columns a warp make too few warps for the memory, 2-8 warps share
 * them, each a part of k, their sums added in a fixed order: the split, a function of n and k only);
 * GEMV_KERNEL_FMA_UNSPLIT is the same kernel without the split (the one before it, bench_decode's A/B);
 * GEMV_KERNEL_AUTO takes the FMA one up to GEMV_FMA_AUTO_M rows (the unsplit one when the environment has
 * DFLASH_GEMV_SPLIT=1, read once). Each gives the same bits for the same call (not the same as each other).
 * Operands gemv_cuda_takes refuses abort with a message. stream: cudaStream_t. */
enum { GEMV_KERNEL_AUTO, GEMV_KERNEL_MMA, GEMV_KERNEL_FMA, GEMV_KERNEL_FMA_UNSPLIT };
#define GEMV_FMA_MAX_M 8
#define GEMV_FMA_AUTO_M 4
/* The decoding default (target_cuda_set_gemv_rows): the linear layers of at most this many rows run the GEMV, the
 * CUDA-core kernel. bench_decode's "linear layers alone" on the H200 (bench/RESULTS.md, issue 23): at m = 1 it
 * reads the Qwen3-8B q|k|v, o_proj, gate|up and lm_head weights faster than cuBLASLt (3.18 / 2.56 / 4.25 / 4.58
 * TB/s against 2.86 / 1.68 / 4.12 / 4.37) and down_proj a little slower (3.07 against 3.31); at m = 4 cuBLASLt
 * wins every shape, so 2 rows and more stay with cuBLASLt. */
#define GEMV_DEFAULT_ROWS 1
void gemv_forward_cuda(uint16_t *y, int ldy, const uint16_t *c, int ldc, float beta, const uint16_t *x, int ldx,
                       const uint16_t *w, int m, int n, int k, void *stream);
/* The same with the kernel named (the tests and the benchmark compare them). */
void gemv_forward_cuda_with(int kernel, uint16_t *y, int ldy, const uint16_t *c, int ldc, float beta,
                            const uint16_t *x, int ldx, const uint16_t *w, int m, int n, int k, void *stream);
/* The CUDA-core kernel with its k split named (1, 2, 4 or 8 warps a row pair; GEMV_KERNEL_FMA takes it from the
 * shape): bench_decode's sweep. */
void gemv_fma_split_forward_cuda(int split, uint16_t *y, int ldy, const uint16_t *c, int ldc, float beta,
                                 const uint16_t *x, int ldx, const uint16_t *w, int m, int n, int k, void *stream);
/* y = rmsnorm(x; norm_w, eps) · wᵀ (+ beta · c) with the CUDA-core kernel (m <= GEMV_FMA_MAX_M), the norm on the fly:
 * each warp sums x² beside its products with norm_w ⊙ x and scales its sums by the row's 1/rms (no normalised copy
 * of x, which is neither rounded to bf16: the bits differ from rmsnorm_forward_cuda + gemv_forward_cuda, within
 * their rounding). norm_w: k bf16 values, 16-byte aligned. The same call gives the same bits. */
int gemv_rmsnorm_cuda_takes(const uint16_t *x, int ldx, const uint16_t *norm_w, const uint16_t *w, int m, int n, int k);
void gemv_rmsnorm_forward_cuda(uint16_t *y, int ldy, const uint16_t *c, int ldc, float beta, const uint16_t *x,
                               int ldx, const uint16_t *norm_w, float eps, const uint16_t *w, int m, int n, int k,
                               void *stream);
/* y (m, n; ldy) = swiglu(rmsnorm(x; norm_w, eps) · w_guᵀ) with w_gu (2n, k) the gate's n rows then the up's n: the
 * fused gate|up projection and its SwiGLU in one CUDA-core GEMV (a warp takes gate row j and up row j, rounds both
 * sums to bf16 and writes silu(gate) * up): the bits of gemv_rmsnorm_forward_cuda into a (m, 2n) buffer and
 * swiglu_forward_cuda, without that buffer's pass. takes: gemv_rmsnorm_cuda_takes's operands, and not under
 * DFLASH_GEMV_SPLIT=1 (the A/B switch: the kernels before the split and the fold). */
int gemv_rmsnorm_swiglu_cuda_takes(const uint16_t *x, int ldx, const uint16_t *norm_w, const uint16_t *w_gu, int m,
                                   int n, int k, int ldy);
void gemv_rmsnorm_swiglu_forward_cuda(uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *norm_w,
                                      float eps, const uint16_t *w_gu, int m, int n, int k, void *stream);
#ifdef __cplusplus
}
#endif

#endif
