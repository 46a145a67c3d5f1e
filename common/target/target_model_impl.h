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

/* The activations of a dense layer's forward over T rows: x (T, H) the residual stream (in and out), u (T, H),
 * q and attn (T, nh*hd), k and v (T, nkv*hd; or rows of a KV cache), gate and up (T, I). */
typedef struct target_acts {
    float *x, *u, *q, *k, *v, *attn, *gate, *up;
} target_acts;

/* Where a dense layer's attention finds its keys and values. NULL: within each sequence of the packed rows
 * (cu_seqlens), from a->k / a->v. A cache: a->k / a->v point at the new rows' place in it (the layer computes them
 * there), and row t attends to keys [0, pos[t]] of sequence seq[t] of kc / vc (kv_attention's layout). */
typedef struct target_kv_view {
    const float *kc, *vc;
    size_t seq_stride;
    const int32_t *seq;
} target_kv_view;

struct target_model {
    hf_config cfg;
    int nlayers;                         /* layers loaded: [0, nlayers) */
    int full;                            /* final norm + all layers loaded */
    float *embed, *lm_head, *final_norm;
    target_layer *layers;                /* NULL for a hybrid target (cfg.is_hybrid): its layers are in hybrid */
    double *inv_freq;                    /* (rotary_dim/2): hd/2 except for the partial RoPE of hybrid targets */
    /* scratch, grown to the largest batch seen */
    int scratch_tokens;
    target_acts act;
    struct target_hybrid *hybrid;        /* the Qwen3.5-family layers (target_hybrid.h), NULL otherwise */
};

/* One Qwen3/Llama decoder layer li over T rows at positions pos: a->x updated in place; kv as above (cu_seqlens and
 * nseq are read only without one). */
void target_dense_layer_cpu(const target_model *m, int li, const target_acts *a, int T, const int32_t *pos,
                            const int32_t *cu_seqlens, int nseq, const target_kv_view *kv);
/* Tap capture: the residual stream x (T, H) goes to the column block of every tap equal to layer li in aux
 * (T, ntaps*H). */
void target_capture_taps_cpu(float *aux, const int *taps, int ntaps, int li, const float *x, int T, int H);

#endif
