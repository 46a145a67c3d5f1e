/* qk_norm_rope: the attention input transform of Qwen3/Llama in one pass: per-head RMSNorm of q and k (Qwen3's
 * q_norm/k_norm; skipped when the weight is NULL, as for Llama) followed by the rotate-half rotary embedding at each
 * token's position. q (T, nh*hd; ld) and k (T, nkv*hd; ld) are rewritten in place. The CPU version is the reference
 * composed of rmsnorm_forward_cpu and rope_apply_cpu; the CUDA version keeps the normalised value in fp32 and rounds
 * once. */
#ifndef DFLASH_KERNEL_QK_NORM_ROPE_H
#define DFLASH_KERNEL_QK_NORM_ROPE_H

#include <stdint.h>

/* q/k in place; q_w/k_w (hd) or NULL (no norm); inv_freq (hd/2) from rope_inv_freq. */
void qk_norm_rope_cpu(float *q, int ldq, float *k, int ldk, int n, int nh, int nkv, int hd, const float *q_w,
                      const float *k_w, float eps, const int32_t *pos, const double *inv_freq);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA, bf16 in place, fp32 math. pos (n) and inv_freq (hd/2 doubles) are device arrays; q_w/k_w bf16 or NULL. */
void qk_norm_rope_cuda(uint16_t *q, int ldq, uint16_t *k, int ldk, int n, int nh, int nkv, int hd,
                       const uint16_t *q_w, const uint16_t *k_w, float eps, const int32_t *pos,
                       const double *inv_freq, void *stream);
#ifdef __cplusplus
}
#endif

#endif
