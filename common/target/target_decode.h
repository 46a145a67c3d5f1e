/* target_decode: the frozen target decoding against a KV cache (CPU backend; Qwen3, Llama and the hybrid Qwen3.5
 * family: for those the cache also holds each sequence's linear-attention states). A cache holds
 * nseq independent sequences of at most max_len positions each. A forward appends n tokens of one sequence at the
 * positions that follow what the cache holds (prefill: the whole prompt; decode: one token; verify: a block of B
 * tokens), and gives for each of them the tapped hidden states (the same taps and values as target_model_forward
 * over the whole text) and the logits. Every layer runs on every forward (the cache needs all of them), so the model
 * must be fully loaded. Crop keeps a prefix (the accepted part of a verified block; on a hybrid target it may not go
 * back past the start of the sequence's last forward, except to 0). Errors name the sequence, the
 * length and the limit; a refused call changes nothing. A cache owns its scratch and only reads the model: several
 * threads may each drive their own cache over one shared model at the same time. */
#ifndef DFLASH_TARGET_DECODE_H
#define DFLASH_TARGET_DECODE_H

#include <stdint.h>

#include "target_model.h"
#include "util.h"

typedef struct target_cache target_cache;

/* A cache for model m (fully loaded: logits need the final norm and lm_head), nseq sequences of max_len positions.
 * -ENOTSUP when the target's family cannot decode on the CPU (its row in target_family.h says so), the message
 * naming the model_type and the family. */
int target_cache_create(target_cache **out, target_model *m, int nseq, int max_len, errbuf *err);
void target_cache_destroy(target_cache **c);
/* Positions sequence seq holds. */
int target_cache_length(const target_cache *c, int seq);
int target_cache_capacity(const target_cache *c);
/* Run ids[0..n) of sequence seq at positions [len, len+n), appending their keys and values. aux (n, ntaps*H) gets
 * the taps, logits (n, V) the logits; either may be NULL. Refused (nothing changed) when len+n > max_len. */
int target_cache_forward(target_cache *c, int seq, const int32_t *ids, int n, const int *taps, int ntaps, float *aux,
                         float *logits, errbuf *err);
/* As target_cache_forward, but logits (1, V) of the last of the n tokens only (a prompt's prefill: no (n, V)). */
int target_cache_forward_last(target_cache *c, int seq, const int32_t *ids, int n, const int *taps, int ntaps,
                              float *aux, float *logits, errbuf *err);
/* Keep the first len positions of sequence seq (0 <= len <= its length). Hybrid targets: the linear-attention states
 * are restored by re-running the kept tokens of the last forward from the states before it, so len must be 0 or at
 * least the position where the sequence's last forward started (decoding never needs more); -EINVAL otherwise,
 * nothing changed. */
int target_cache_crop(target_cache *c, int seq, int len, errbuf *err);

/* Greedy choice: the highest logit of row (vocab) over ids not in suppress[0..nsuppress), the lowest id on ties;
 * -1 when every id is suppressed. */
int32_t target_logits_argmax(const float *row, int vocab, const int32_t *suppress, int nsuppress);

/* One entry of target_logits_sample's scratch (the caller provides vocab of them). */
typedef struct target_sample_item {
    float p;
    int32_t id;
} target_sample_item;
/* Sampled choice at temperature > 0, a pure function of its inputs: over the ids left (not in suppress, logit not
 * NaN), p ∝ exp((logit − max) / temperature); top_p < 1 keeps the smallest set of the most likely ids whose mass
 * reaches top_p (order: p descending, then id ascending), top_p = 1 keeps all of them in id order; the answer is
 * the id at which the running mass of that sequence first exceeds u × its total (u in [0, 1)). Every id left at
 * -inf: the greedy choice. -1 when every id is suppressed. */
int32_t target_logits_sample(const float *row, int vocab, const int32_t *suppress, int nsuppress, double temperature,
                             double top_p, double u, target_sample_item *scratch);

#endif
