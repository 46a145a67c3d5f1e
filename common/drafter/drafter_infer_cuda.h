/* drafter_infer_cuda: the DFlash drafter at inference on the GPU, the device twin of drafter_infer.h. One call drafts
 * one block: [last committed token, MASK x (B-1)] at positions p..p+B-1, conditioned on the target's taps of
 * positions 0..p-1 (device bf16). It is drafter_cuda's training forward (drafter_cuda_forward_logits) with a single
 * anchor at p and no backward, so training and serving share one computation. Weights: the z-lab checkpoint read
 * and checked on the host as drafter_infer does (hidden size, vocab, tap layers, target layer count), then bf16 on
 * the device; the frozen embedding and lm_head come from the target's checkpoint. One object per thread; errors
 * name the file and field. */
#ifndef DFLASH_DRAFTER_INFER_CUDA_H
#define DFLASH_DRAFTER_INFER_CUDA_H

#include <stdint.h>

#include "hf_config.h"
#include "util.h"

typedef struct drafter_infer_cuda drafter_infer_cuda;

/* The drafter of dir for the target checkpoint target_dir (its config: target), on the current device, for contexts
 * of at most max_ctx positions. fresh: the untrained drafter of dir's config, weights from seed
 * (drafter_layout_init_weights, as a job's step 0). */
int drafter_infer_cuda_load(drafter_infer_cuda **out, const char *dir, const char *target_dir, const hf_config *target,
                            int fresh, uint64_t seed, int max_ctx, errbuf *err);
void drafter_infer_cuda_destroy(drafter_infer_cuda **d);
const hf_config *drafter_infer_cuda_config(const drafter_infer_cuda *d);

/* Draft one block. ctx: device bf16 (p, K*H), row stride K*H: the taps of positions 0..p-1, 1 <= p <= max_ctx;
 * token: the last committed token, at position p. draft (B, host): the argmax of each slot (ties to the lower id;
 * slot 0 is the input token's). Returns when the draft is on the host. */
int drafter_infer_cuda_block(drafter_infer_cuda *d, const uint16_t *ctx, int p, int32_t token, int32_t *draft,
                             errbuf *err);

#endif
