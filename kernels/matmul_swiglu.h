/* matmul_swiglu: the gate|up projection and its SwiGLU in one operator, act = swiglu(x · w_guᵀ) with w_gu (2I, H) the
 * nn.Linear layout of the fused projection (the gate's I rows, then the up's I): act (T, I) = silu(gate) * up with
 * gate and up rounded to bf16 as the two-kernel path (matmul_forward_cuda into gu (T, 2I), then swiglu_forward_cuda)
 * stores them. The CUDA kernel keeps gu in its accumulators and never writes it. No allocation; errors exit with a
 * message naming the shape. */
#ifndef DFLASH_KERNEL_MATMUL_SWIGLU_H
#define DFLASH_KERNEL_MATMUL_SWIGLU_H

#include <stdint.h>

/* act (T, I; ldact) = swiglu of gu (T, 2I; row stride 2I) = x (T, H; ldx) · w_gu (2I, H)ᵀ, each gu value rounded to
 * bf16 before the SwiGLU (gu is the caller's scratch and holds those rounded values after the call): the reference
 * of matmul_swiglu_forward_cuda (matmul_forward_cpu, the rounding, swiglu_forward_cpu). */
void matmul_swiglu_forward_cpu(float *act, int ldact, float *gu, const float *x, int ldx, const float *w_gu, int T,
                               int I, int H);

#ifdef __cplusplus
extern "C" {
#endif
/* Whether matmul_swiglu_forward_cuda takes these operands: an sm_90 device (the kernel is sm_90a only) whose driver
 * makes tensor maps; I and H multiples of 64; ldx a multiple of 8 (>= H), x and w_gu 16-byte aligned (TMA);
 * ldact even (>= I), act 4-byte aligned (bf16 pairs). T >= 0 is arbitrary. */
int matmul_swiglu_cuda_takes(const uint16_t *act, int ldact, const uint16_t *x, int ldx, const uint16_t *w_gu, int T,
                             int I, int H);
/* CUDA, bf16 operands and output, fp32 accumulation: act (T, I; ldact) = swiglu(x (T, H; ldx) · w_gu (2I, H)ᵀ) on
 * the Hopper tensor cores (wgmma, TMA; a persistent warp-specialised GEMM whose tile holds gate and up columns c of
 * one thread). Where cuBLASLt rounds gate and up to the same bf16 values the act bits equal matmul_forward_cuda +
 * swiglu_forward_cuda's (the accumulation order differs, so in general they agree within the rounding). The same call
 * gives the same bits. Operands matmul_swiglu_cuda_takes refuses exit naming the shape. stream: cudaStream_t.
 * The schedules: MATMUL_SWIGLU_COOPERATIVE (both consumer warpgroups on one 128 x 128 act tile),
 * MATMUL_SWIGLU_PINGPONG (each on its own 128 x 64 tile, one's epilogue under the other's GEMM),
 * MATMUL_SWIGLU_CLUSTER (the cooperative one on clusters of 2 CTAs sharing each B tile by TMA multicast: half the
 * weight bytes from L2), MATMUL_SWIGLU_COOPERATIVE_TMASTORE, MATMUL_SWIGLU_CLUSTER_TMASTORE,
 * MATMUL_SWIGLU_PINGPONG_TMASTORE (those three storing act through shared memory and TMA, the next GEMM under the
 * stores; where act is not 16-byte aligned or ldact not a multiple of 8 they store directly, as their twins), and
 * MATMUL_SWIGLU_PINGPONG_WIDE (ping-pong with each consumer on its own 64 x 128 act tile: the cooperative one's
 * per-warpgroup product, one's epilogue under the other's GEMM). MATMUL_SWIGLU_AUTO is
 * MATMUL_SWIGLU_COOPERATIVE_TMASTORE (the fastest in the H200's 8B target step, cluster_tmastore even with it) unless
 * the environment names another by DFLASH_MATMUL_SWIGLU=cooperative|pingpong|cluster|cooperative_tmastore|
 * cluster_tmastore|pingpong_tmastore|pingpong_wide (matmul_swiglu_kernel_name's names; read once; another name
 * exits). All give the same bits (the same k order per output, the same epilogue arithmetic). */
enum {
    MATMUL_SWIGLU_AUTO,
    MATMUL_SWIGLU_COOPERATIVE,
    MATMUL_SWIGLU_PINGPONG,
    MATMUL_SWIGLU_CLUSTER,
    MATMUL_SWIGLU_COOPERATIVE_TMASTORE,
    MATMUL_SWIGLU_CLUSTER_TMASTORE,
    MATMUL_SWIGLU_PINGPONG_TMASTORE,
    MATMUL_SWIGLU_PINGPONG_WIDE,
    MATMUL_SWIGLU_NKERNELS
};
void matmul_swiglu_forward_cuda(uint16_t *act, int ldact, const uint16_t *x, int ldx, const uint16_t *w_gu, int T,
                                int I, int H, void *stream);
/* The same with the schedule named (the tests and the timing compare them). */
void matmul_swiglu_forward_cuda_with(int kernel, uint16_t *act, int ldact, const uint16_t *x, int ldx,
                                     const uint16_t *w_gu, int T, int I, int H, void *stream);
/* A schedule's DFLASH_MATMUL_SWIGLU name ("cooperative", ...); NULL for none (AUTO, out of range). */
const char *matmul_swiglu_kernel_name(int kernel);
#ifdef __cplusplus
}
#endif

#endif
