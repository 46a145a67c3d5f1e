/* drafter_infer: the DFlash drafter at inference on the CPU. One call drafts one block: [last committed token,
 * MASK x (B-1)] at positions p..p+B-1, conditioned on the target's taps of positions 0..p-1. It is the training
 * forward (drafter_forward_backward) with a single anchor at p, so training and serving share one computation. It
 * loads z-lab checkpoints and checks them against the target (hidden size, vocab, tap layers, target layer count,
 * mask token): the error names the drafter's config.json, the field and the target's value. The frozen embedding
 * and lm_head are the target model's (borrowed: the target outlives the drafter). One object per thread. */
#ifndef DFLASH_DRAFTER_INFER_H
#define DFLASH_DRAFTER_INFER_H

#include <stdint.h>

#include "hf_config.h"
#include "target_model.h"
#include "util.h"

typedef struct drafter_infer drafter_infer;

/* Load the drafter checkpoint in dir (config.json + model.safetensors) for target tm. */
int drafter_infer_load(drafter_infer **out, const char *dir, const target_model *tm, errbuf *err);
/* The untrained drafter of dir's config: fresh weights from seed exactly as a job initialises them at step 0
 * (drafter_layout_init_weights; a job uses job.seed). dir's weights are read (and checked) but not used. */
int drafter_infer_load_fresh(drafter_infer **out, const char *dir, uint64_t seed, const target_model *tm,
                             errbuf *err);
void drafter_infer_destroy(drafter_infer **d);
const hf_config *drafter_infer_config(const drafter_infer *d);

/* Draft one block. ctx (p, K*H): the taps of positions 0..p-1 (K = the drafter's tap count), p >= 1; token: the
 * last committed token, at position p. logits (B, V) get the drafter's logits of the B slots (may be NULL); draft
 * (B) the argmax of each slot (ties to the lower id; slot 0 is the input token's slot), may be NULL. */
void drafter_infer_block(drafter_infer *d, const float *ctx, int p, int32_t token, float *logits, int32_t *draft);

#endif
