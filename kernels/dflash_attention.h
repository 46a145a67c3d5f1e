/* dflash_attention: the DFlash training attention. Queries are the N*B block slots; keys/values are the context
 * rows (from F, the fused target hidden states) plus the block rows. The mask is kept as the structure it is:
 * block j sees context rows [ctx_start[j], ctx_start[j] + ctx_len[j]) (its sequence, positions strictly before
 * its anchor) and its own B block rows, both directions; nothing else. GQA; no (Q, K) matrix is ever built.
 * The forward saves the log-sum-exp per (query, head) for the backward. */
#ifndef DFLASH_KERNEL_DFLASH_ATTENTION_H
#define DFLASH_KERNEL_DFLASH_ATTENTION_H

#include <stdint.h>

typedef struct dflash_attn_shape {
    int nblocks;      /* N */
    int block_size;   /* B */
    int nh, nkv, hd;  /* query heads, kv heads, head dim */
    float scale;      /* 1/sqrt(hd) */
} dflash_attn_shape;

/* out (N*B, nh*hd); q (N*B, nh*hd); kc, vc (T, nkv*hd) context keys/values; kb, vb (N*B, nkv*hd) block
 * keys/values; ctx_start/ctx_len (N); lse (N*B, nh) written for the backward. */
void dflash_attention_forward_cpu(float *out, float *lse, const float *q, const float *kc, const float *vc,
                                  const float *kb, const float *vb, const int32_t *ctx_start,
                                  const int32_t *ctx_len, const dflash_attn_shape *s);
/* Gradients from dout (N*B, nh*hd): dq (overwritten), dkc/dvc (T, nkv*hd) and dkb/dvb (N*B, nkv*hd) accumulated
 * (+=; the caller zeroes them). Needs the forward's inputs, out and lse. */
void dflash_attention_backward_cpu(float *dq, float *dkc, float *dvc, float *dkb, float *dvb, const float *dout,
                                   const float *out, const float *lse, const float *q, const float *kc,
                                   const float *vc, const float *kb, const float *vb, const int32_t *ctx_start,
                                   const int32_t *ctx_len, const dflash_attn_shape *s);

#endif
