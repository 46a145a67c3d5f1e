/* cross_entropy: the drafter loss head. For a chunk of n rows of final hidden states, logits = h · lm_headᵀ over
 * the whole vocabulary (in a caller-provided (n, V) workspace, so only one chunk's logits exist at a time), the
 * per-row cross-entropy against a label, the argmax, and optionally the gradient with respect to h for the loss
 * Σ_rows weight·CE · loss_scale. lm_head is frozen: no gradient for it. Rows with weight 0 are skipped (CE 0). */
#ifndef DFLASH_KERNEL_CROSS_ENTROPY_H
#define DFLASH_KERNEL_CROSS_ENTROPY_H

#include <stdint.h>

/* h (n, H); lm_head (V, H); labels, weights (n); outputs: ce (n) unweighted CE (0 where weight == 0), argmax (n)
 * (may be NULL), dh (n, H) overwritten with ∂(Σ weight·CE·loss_scale)/∂h (NULL = no backward);
 * logits_ws (n*V floats) scratch. */
void cross_entropy_chunk_cpu(float *ce, int32_t *argmax, float *dh, const float *h, int n, int H,
                             const float *lm_head, int V, const int32_t *labels, const float *weights,
                             float loss_scale, float *logits_ws);

#endif
