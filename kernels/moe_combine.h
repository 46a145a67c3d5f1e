/* moe_combine: the output of the sparse MoE block added to the residual stream, deterministically (a gather, no
 * atomics): per token t,
 *   out[t] = resid[t] + Σ_j w[t, j] · ys[row[t, j]] + sigmoid(sg[t]) · shared[t]
 * where ys holds the experts' outputs in expert-sorted row order, row[t, j] is the sorted row of the token's j-th
 * pick and w its routing weight; the shared-expert term is skipped when shared is NULL, and ungated (a gate of 1)
 * when sg is NULL. fp32 sums. */
#ifndef DFLASH_KERNEL_MOE_COMBINE_H
#define DFLASH_KERNEL_MOE_COMBINE_H

#include <stdint.h>

/* out, resid (T, H; ldo, ldr; out may be resid); ys (T*K rows, H; ldy); row, w (T, K); shared (T, H; lds) or NULL;
 * sg (T; ldsg: the gate logit of token t at sg[t * ldsg]) or NULL. */
void moe_combine_cpu(float *out, int ldo, const float *resid, int ldr, const float *ys, int ldy, const int32_t *row,
                     const float *w, int T, int K, int H, const float *shared, int lds, const float *sg, int ldsg);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA: bf16 out/resid/ys/shared, int32 row, fp32 w and sg (device arrays); out may be resid. stream is a
 * cudaStream_t. */
void moe_combine_cuda(uint16_t *out, int ldo, const uint16_t *resid, int ldr, const uint16_t *ys, int ldy,
                      const int32_t *row, const float *w, int T, int K, int H, const uint16_t *shared, int lds,
                      const float *sg, int ldsg, void *stream);
#ifdef __cplusplus
}
#endif

#endif
