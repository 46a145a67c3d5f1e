/* target_model_impl: the CPU target model's weights and scratch, for the modules that run it other ways than the
 * packed forward of target_model.c (decoding with a KV cache; other layer families). Only common/model includes it;
 * target_model.c owns loading and freeing. */
#ifndef DFLASH_TARGET_MODEL_IMPL_H
#define DFLASH_TARGET_MODEL_IMPL_H

#include "hf_config.h"

typedef struct target_layer {
    float *input_norm, *post_norm;       /* (H) */
    float *q_norm, *k_norm;              /* (hd), Qwen3 only */
    float *wq, *wk, *wv, *wo;            /* (nh*hd, H), (nkv*hd, H) x2, (H, nh*hd) */
    float *w_gate, *w_up, *w_down;       /* (I, H) x2, (H, I) */
} target_layer;

struct target_model {
    hf_config cfg;
    int nlayers;                         /* layers loaded: [0, nlayers) */
    int full;                            /* final norm + all layers loaded */
    float *embed, *lm_head, *final_norm;
    target_layer *layers;                /* NULL for a hybrid target (cfg.is_hybrid): its layers are in hybrid */
    double *inv_freq;                    /* (rotary_dim/2): hd/2 except for the partial RoPE of hybrid targets */
    /* scratch, grown to the largest batch seen */
    int scratch_tokens;
    float *x, *u, *q, *k, *v, *attn, *gate, *up;
    struct target_hybrid *hybrid;        /* the Qwen3.5-family layers (target_hybrid.h), NULL otherwise */
};

#endif
