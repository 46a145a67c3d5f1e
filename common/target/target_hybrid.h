/* target_hybrid: the layers of the hybrid Qwen3.5 / Qwen3.5-MoE / Qwen3-Next targets on the CPU (fp32): Gated
 * DeltaNet linear attention, gated full attention with partial RoPE, zero-centred RMSNorm, dense SwiGLU or the sparse
 * MoE block with a sigmoid-gated shared expert. Internal to common/model: target_model.c loads it for hybrid configs
 * and runs its layers inside target_model_forward (same packed batch, same taps). The zero-centred norm weights are
 * stored as (1 + w). target_hybrid_layer_forward: one at a time (it uses the layers' own scratch); the decoding
 * forward (target_decode.c) brings its own scratch and states and only reads the layers. Errors name the checkpoint
 * and the tensor. */
#ifndef DFLASH_TARGET_HYBRID_H
#define DFLASH_TARGET_HYBRID_H

#include "hf_config.h"
#include "safetensors.h"
#include "target_model.h"
#include "target_model_impl.h"
#include "util.h"

typedef struct target_hybrid target_hybrid;
typedef struct target_hybrid_scratch target_hybrid_scratch;

/* One sequence's decoding state at one layer (target_hybrid_layer_decode), owned by the caller. */
typedef struct target_hybrid_state {
    float *conv;        /* linear attention: (K-1, C) conv inputs of the rows before the new ones (C: 2HK*Dk+HV*Dv) */
    float *delta;       /* linear attention: (HV, Dk, Dv) the delta-rule state */
    float *k, *v;       /* full attention: the new rows' place in the cache, (n, nkv*hd) each */
    target_kv_view kv;  /* full attention: the cache (kv.seq: (n) the sequence of each new row) */
} target_hybrid_state;

/* The weight-name prefix of the text model in st: "model.language_model." (vision-language checkpoints) when its
 * embedding is there, else "model.". */
const char *target_hybrid_prefix(const st_file *st);
/* Load layers [0, nlayers) of c from st (names under prefix); Qwen3.5 layout (in_proj_qkv, in_proj_z, in_proj_b,
 * in_proj_a) or Qwen3-Next's fused in_proj_qkvz / in_proj_ba, per-expert or fused (gate_up_proj) MoE experts. */
int target_hybrid_load(target_hybrid **out, const st_file *st, const hf_config *c, const char *prefix, int nlayers,
                       errbuf *err);
void target_hybrid_destroy(target_hybrid **h);
/* Decoder layer li over the packed batch b: the residual stream x (T, H) is updated in place. inv_freq holds the
 * rotary_dim/2 frequencies of the partial RoPE. */
void target_hybrid_layer_forward(target_hybrid *h, const hf_config *c, int li, float *x, const target_batch *b,
                                 const double *inv_freq);
/* Whether layer li is a linear-attention (Gated DeltaNet) layer. */
int target_hybrid_layer_linear(const target_hybrid *h, int li);
/* Decoder layer li over the n new rows x (n, H) of one sequence at positions pos (n), continuing from st: a linear
 * layer reads and updates st->conv and st->delta, a full-attention layer writes the rows' keys and values at
 * st->k / st->v and attends through st->kv. Only reads h; s is the caller's scratch. */
void target_hybrid_layer_decode(const target_hybrid *h, target_hybrid_scratch *s, const hf_config *c, int li,
                                float *x, int n, const int32_t *pos, const double *inv_freq,
                                const target_hybrid_state *st);
target_hybrid_scratch *target_hybrid_scratch_new(void);
void target_hybrid_scratch_destroy(target_hybrid_scratch **s);

#endif
