/* target_hybrid: the layers of the hybrid Qwen3.5 / Qwen3.5-MoE / Qwen3-Next targets on the CPU (fp32): Gated
 * DeltaNet linear attention, gated full attention with partial RoPE, zero-centred RMSNorm, dense SwiGLU or the sparse
 * MoE block with a sigmoid-gated shared expert. Internal to common/model: target_model.c loads it for hybrid configs
 * and runs its layers inside target_model_forward (same packed batch, same taps). The zero-centred norm weights are
 * stored as (1 + w). One forward at a time (it owns its scratch); errors name the checkpoint and the tensor. */
#ifndef DFLASH_TARGET_HYBRID_H
#define DFLASH_TARGET_HYBRID_H

#include "hf_config.h"
#include "safetensors.h"
#include "target_model.h"
#include "util.h"

typedef struct target_hybrid target_hybrid;

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

#endif
