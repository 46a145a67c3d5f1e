/* anchors: DFlash anchor sampling and block construction for one packed batch (spec: Anchors, Attention mask,
 * Loss). The mask is kept as the structure it is: per block, the context rows it may see (its sequence, positions
 * strictly before its anchor) and its own B slots; never a dense (Q, K) matrix. Output arrays are owned by the
 * drafter_blocks and freed by drafter_blocks_free. */
#ifndef DFLASH_ANCHORS_H
#define DFLASH_ANCHORS_H

#include <stdint.h>

typedef struct drafter_blocks {
    int nblocks, block_size;        /* N, B */
    int32_t *anchor, *anchor_seq;   /* (N): position inside its sequence, sequence index */
    int32_t *ctx_start, *ctx_len;   /* (N): visible context rows [ctx_start, ctx_start+ctx_len) of the batch */
    int32_t *block_ids, *block_pos; /* (N*B): anchor token then mask tokens; positions a+s */
    int32_t *labels;                /* (N*B): token a+k of the same sequence, 0 when the slot is not trained */
    float *weights;                 /* (N*B): exp(-(k-1)/gamma) for valid slots k >= 1, else 0 */
} drafter_blocks;

/* Position a of a sequence of len tokens can be an anchor: it and the next token are trained (the one rule). */
static inline int anchors_candidate(const uint8_t *loss_mask, int64_t a, int64_t len)
{
    return a + 1 < len && loss_mask[a] && loss_mask[a + 1];
}
/* A sequence of len tokens (the first len of a sample: what a batch keeps of it) has at least one anchor: some of
 * it is trained. */
int anchors_any(const uint8_t *loss_mask, int64_t len);
/* Draw anchors for a packed batch: per sequence up to max_anchors positions a with loss_mask[a] = loss_mask[a+1]
 * = 1 and a+1 inside the sequence, uniformly without replacement, sorted. Deterministic in (seed, epoch,
 * batch_id). Returns N; anchors/anchor_seq are xmalloc'd (caller frees). */
int anchors_sample(const int32_t *cu_seqlens, int nseq, const uint8_t *loss_mask, int max_anchors, uint64_t seed,
                   uint64_t epoch, uint64_t batch_id, int32_t **anchors, int32_t **anchor_seq);
/* Build the blocks for given anchors (sorted per sequence). loss_mask as bytes (0/1). */
void drafter_blocks_build(drafter_blocks *b, const int32_t *input_ids, const int32_t *cu_seqlens,
                          const uint8_t *loss_mask, const int32_t *anchors, const int32_t *anchor_seq, int nanchors,
                          int block_size, int mask_token_id, double gamma);
void drafter_blocks_free(drafter_blocks *b);
/* The one block of drafting at inference: allocate a one-block plan of block_size slots (no labels, zero weights),
 * then per call set it to anchor p of sequence 0 (context rows [0, p): the positions strictly before the block, as in
 * training) with slots [token, mask x (B-1)] at positions p..p+B-1. */
void drafter_blocks_alloc_one(drafter_blocks *b, int block_size);
void drafter_blocks_set_one(drafter_blocks *b, int p, int32_t token, int32_t mask_token_id);
/* The spec's gamma for a block size: 7 for 16, 5 for 10, 4 for 8; otherwise block_size/2 - 1, at least 1. */
double drafter_default_gamma(int block_size);

#endif
