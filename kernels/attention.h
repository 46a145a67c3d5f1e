/* attention: causal self-attention over packed variable-length sequences (cu_seqlens), GQA, for the target
 * forward. Never materialises a (T, T) score matrix: one row of scores per query at a time. */
#ifndef DFLASH_KERNEL_ATTENTION_H
#define DFLASH_KERNEL_ATTENTION_H

#include <stdint.h>

/* out (T, nh*hd) = softmax(q kᵀ * scale + causal mask within each sequence) v.
 * q (T, nh*hd), k and v (T, nkv*hd); query head h uses kv head h / (nh/nkv). cu_seqlens has nseq+1 entries,
 * cu_seqlens[nseq] = T. */
void attention_causal_forward_cpu(float *out, const float *q, const float *k, const float *v,
                                  const int32_t *cu_seqlens, int nseq, int nh, int nkv, int hd, float scale);

#endif
