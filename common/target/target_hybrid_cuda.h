/* target_hybrid_cuda: the layers of the hybrid Qwen3.5 / Qwen3.5-MoE / Qwen3-Next targets on one CUDA device (the
 * CUDA side of target_hybrid.c), bf16 weights and activations, fp32 accumulation, fp32 delta-rule state. Internal
 * to common/model: target_model_cuda.c creates it for hybrid configs and runs its layer loop in place of the Qwen3
 * one (same packed batch, taps, last and logits). The zero-centred norm weights are stored as bf16(1 + w). Errors
 * name the checkpoint and tensor; CUDA failures exit through CHECK_*. */
#ifndef DFLASH_TARGET_HYBRID_CUDA_H
#define DFLASH_TARGET_HYBRID_CUDA_H

#include <stdint.h>

#include "safetensors.h"
#include "target_model_cuda_impl.h"
#include "util.h"

/* Weight buffers and workspaces of m's nlayers layers for m->max_tokens rows (m->cfg is hybrid); sets m->hy. */
int target_hybrid_cuda_create(target_cuda *m, errbuf *err);
void target_hybrid_cuda_destroy(target_cuda *m);
/* Upload layers [0, m->nlayers) from st (names under prefix, "model." or "model.language_model."): Qwen3.5's or
 * Qwen3-Next's projection layout, per-expert or fused experts, as target_hybrid.c reads them. */
int target_hybrid_cuda_load(target_cuda *m, const st_file *st, const char *prefix, errbuf *err);
/* Upload the zero-centred norm `name` (n) as bf16(1 + w) (the final norm). */
int target_hybrid_cuda_upload_norm(const st_file *st, const char *name, uint16_t *dst, int n, errbuf *err);
/* Deterministic random weights from *seed (advanced): linear weights uniform with half-width a, zero-centred norms
 * 1, the gated norm 1, conv weights of half-width 0.5, A_log = log(U[1, 16)), dt_bias 1. */
void target_hybrid_cuda_init_random(target_cuda *m, uint64_t *seed, float a);
/* The hybrid form of target_cuda_run_layers (no KV cache). */
void target_hybrid_cuda_run_layers(target_cuda *m, const tc_rows *rows, int deepest, const int *taps, int ntaps,
                                   uint16_t *aux, int ld_aux, uint16_t *last, uint16_t *logits,
                                   const int32_t *logit_rows, int nlogit);

#endif
