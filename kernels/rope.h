/* rope: rotary position embedding, rotate-half layout (Qwen3/Llama/gpt-oss in transformers), with optional Llama-3
 * or YaRN frequency scaling. Angles are computed in double then rounded to float, as the goldens do. */
#ifndef DFLASH_KERNEL_ROPE_H
#define DFLASH_KERNEL_ROPE_H

#include <stdint.h>

typedef struct rope_params {
    double theta;
    int llama3;                    /* apply Llama-3 scaling with the fields below */
    double factor, low_freq_factor, high_freq_factor;
    int original_max_position;
    int yarn;                      /* YaRN (transformers' _compute_yarn_parameters) with factor, original_max_position
                                    * and the fields below; its attention factor is the caller's (hf_attn_scale) */
    double beta_fast, beta_slow;
    int truncate;                  /* round the correction range outwards (floor / ceil) */
} rope_params;

/* inv_freq[i] for i < head_dim/2: theta^(-2i/head_dim), then Llama-3 scaling when p->llama3, or YaRN's blend when
 * p->yarn: inv/factor on the slow dimensions, inv on the fast ones, a linear ramp between the correction range
 * [low, high] = the dimensions that turn beta_fast and beta_slow times over original_max_position positions. */
void rope_inv_freq(double *inv_freq, int head_dim, const rope_params *p);
/* Rotate x (n tokens, heads, head_dim; row stride ld elements between tokens) in place by position pos[t].
 * inverse != 0 applies the transposed rotation (the backward of the forward rotation). */
void rope_apply_cpu(float *x, int ld, int n, int heads, int head_dim, const int32_t *pos, const double *inv_freq,
                    int inverse);

#endif
