/* rope: rotary position embedding, rotate-half layout (Qwen3/Llama in transformers), with optional Llama-3
 * frequency scaling. Angles are computed in double then rounded to float, as the goldens do. */
#ifndef DFLASH_KERNEL_ROPE_H
#define DFLASH_KERNEL_ROPE_H

#include <stdint.h>

typedef struct rope_params {
    double theta;
    int llama3;                    /* apply Llama-3 scaling with the fields below */
    double factor, low_freq_factor, high_freq_factor;
    int original_max_position;
} rope_params;

/* inv_freq[i] for i < head_dim/2: theta^(-2i/head_dim), then Llama-3 scaling when p->llama3. */
void rope_inv_freq(double *inv_freq, int head_dim, const rope_params *p);
/* Rotate x (n tokens, heads, head_dim; row stride ld elements between tokens) in place by position pos[t].
 * inverse != 0 applies the transposed rotation (the backward of the forward rotation). */
void rope_apply_cpu(float *x, int ld, int n, int heads, int head_dim, const int32_t *pos, const double *inv_freq,
                    int inverse);

#endif
