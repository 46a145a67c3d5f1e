/* target_hybrid: the hybrid family (Qwen3.5 / Qwen3.5-MoE / Qwen3-Next targets) on the CPU (fp32): Gated DeltaNet
 * linear attention, gated full attention with partial RoPE, zero-centred RMSNorm, dense SwiGLU or the sparse MoE
 * block with a sigmoid-gated shared expert; its part of a decoding cache (the attention layers' keys and values,
 * the linear layers' conv and delta-rule states). Its row of the family table is target_hybrid_family
 * (target_family.h), its operations reached only through it; the zero-centred norm weights are stored as (1 + w).
 * Errors name the checkpoint and the tensor. */
#ifndef DFLASH_TARGET_HYBRID_H
#define DFLASH_TARGET_HYBRID_H

#include "safetensors.h"

/* The weight-name prefix of the text model in st: "model.language_model." (vision-language checkpoints) when its
 * embedding is there, else "model.". */
const char *target_hybrid_prefix(const st_file *st);

#endif
