/* qk_norm_rope: the attention input transform of Qwen3/Llama in one pass: per-head RMSNorm of q and k (Qwen3's
 * q_norm/k_norm; skipped when the weight is NULL, as for Llama) followed by the rotate-half rotary embedding at each
 * token's position. q (T, nh*hd; ld) and k (T, nkv*hd; ld) are rewritten in place. The CPU version is the reference
 * composed of rmsnorm_forward_cpu and rope_apply_cpu; the CUDA version keeps the normalised value in fp32 and rounds
 * once. */
#ifndef DFLASH_KERNEL_QK_NORM_ROPE_H
#define DFLASH_KERNEL_QK_NORM_ROPE_H

#include <stddef.h>
#include <stdint.h>

/* q/k in place; q_w/k_w (hd) or NULL (no norm); inv_freq (hd/2) from rope_inv_freq. */
void qk_norm_rope_cpu(float *q, int ldq, float *k, int ldk, int n, int nh, int nkv, int hd, const float *q_w,
                      const float *k_w, float eps, const int32_t *pos, const double *inv_freq);
/* Backward of qk_norm_rope_cpu: dq (n, nh*hd; lddq) and dk (n, nkv*hd; lddk), the gradients of the outputs, are
 * rewritten in place into the gradients of the pre-norm inputs q (ldq) and k (ldk) that the forward was given;
 * dq_w/dk_w (hd) += the norm weights' gradients (skipped when NULL). The composition the drafter backward runs:
 * rope_apply_cpu(inverse = 1), then rmsnorm_backward_cpu over the heads of each token. dq/dk may be NULL with nh/nkv
 * heads skipped. */
/* Partial rotary (the hybrid targets): the same per-head norm over all hd values, then the rotate-half rotation of
 * only the first rd values of each head (pairs (i, i + rd/2), i < rd/2); inv_freq (rd/2) from rope_inv_freq(rd).
 * rd == hd gives qk_norm_rope_cpu. */
void qk_norm_rope_partial_cpu(float *q, int ldq, float *k, int ldk, int n, int nh, int nkv, int hd, int rd,
                              const float *q_w, const float *k_w, float eps, const int32_t *pos,
                              const double *inv_freq);
void qk_norm_rope_backward_cpu(float *dq, int lddq, float *dk, int lddk, const float *q, int ldq, const float *k,
                               int ldk, int n, int nh, int nkv, int hd, const float *q_w, const float *k_w,
                               float *dq_w, float *dk_w, float eps, const int32_t *pos, const double *inv_freq);

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA, bf16 in place, fp32 math. pos (n) and inv_freq (hd/2 doubles) are device arrays; q_w/k_w bf16 or NULL. */
void qk_norm_rope_cuda(uint16_t *q, int ldq, uint16_t *k, int ldk, int n, int nh, int nkv, int hd,
                       const uint16_t *q_w, const uint16_t *k_w, float eps, const int32_t *pos,
                       const double *inv_freq, void *stream);
/* qk_norm_rope_cuda and, in the same launch, the decoding cache's append (kv_attention.h's kv_cache_append_cuda):
 * the normed and rotated k rows and the v rows (n, nkv*hd; ldv) written at row pos[t] of sequence seq[t] of kc / vc
 * (seq and pos device arrays). The same bits as the two calls one after the other. */
void qk_norm_rope_append_cuda(uint16_t *q, int ldq, uint16_t *k, int ldk, const uint16_t *v, int ldv, int n, int nh,
                              int nkv, int hd, const uint16_t *q_w, const uint16_t *k_w, float eps,
                              const int32_t *pos, const double *inv_freq, uint16_t *kc, uint16_t *vc,
                              size_t seq_stride, const int32_t *seq, void *stream);
/* CUDA partial rotary (qk_norm_rope_partial_cpu), bf16 in place, fp32 math; hd <= 256, rd even, rd <= hd. */
void qk_norm_rope_partial_cuda(uint16_t *q, int ldq, uint16_t *k, int ldk, int n, int nh, int nkv, int hd, int rd,
                               const uint16_t *q_w, const uint16_t *k_w, float eps, const int32_t *pos,
                               const double *inv_freq, void *stream);
/* Bytes of fp32 workspace qk_norm_rope_backward_cuda needs (per-row-chunk partials of dq_w and dk_w). */
size_t qk_norm_rope_backward_cuda_workspace(int n, int nh, int nkv, int hd);
/* CUDA backward of qk_norm_rope_cuda, bf16 in place, fp32 math: dq (n, nh*hd; lddq) and dk (n, nkv*hd; lddk) become
 * the gradients of the saved pre-norm q (ldq) and k (ldk); dq_w/dk_w (hd, fp32) += the weights' gradients (skipped
 * when NULL; q_w/k_w NULL: no norm, rope only). dq or dk may be NULL (nh or nkv heads ignored). Deterministic: the
 * weight gradients go through workspace (qk_norm_rope_backward_cuda_workspace bytes) and a fixed-order sum. */
void qk_norm_rope_backward_cuda(uint16_t *dq, int lddq, uint16_t *dk, int lddk, const uint16_t *q, int ldq,
                                const uint16_t *k, int ldk, int n, int nh, int nkv, int hd, const uint16_t *q_w,
                                const uint16_t *k_w, float *dq_w, float *dk_w, float eps, const int32_t *pos,
                                const double *inv_freq, float *workspace, void *stream);
#ifdef __cplusplus
}
#endif

#endif
