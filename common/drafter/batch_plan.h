/* batch_plan: which samples form packed batch b, as a pure function of (dataset, seed, batch id). Epoch e visits
 * every sample once in an order shuffled from (seed, e) and packs them greedily into batches of at most
 * max_tokens tokens and max_seqs sequences (a longer sample is cut to max_tokens). Batch ids run on across epochs.
 * Epoch packings are computed on demand and cached. Single-threaded per object. */
#ifndef DFLASH_BATCH_PLAN_H
#define DFLASH_BATCH_PLAN_H

#include <stdint.h>

#include "shard.h"
#include "token_ring.h"

typedef struct batch_plan batch_plan;

batch_plan *batch_plan_new(const dataset *ds, uint64_t seed, uint32_t max_tokens, uint32_t max_seqs);
void batch_plan_free(batch_plan **p);
/* Fill a token-ring batch with batch `batch_id`; *epoch_out (may be NULL) gets its epoch. */
void batch_plan_fill(batch_plan *p, uint64_t batch_id, struct token_batch *out, uint64_t *epoch_out);
/* Batches in epoch e. */
uint64_t batch_plan_epoch_batches(batch_plan *p, uint64_t epoch);

#endif
