/* target_decode_cuda: the CUDA target (target_model_cuda) decoding against a bf16 KV cache, the device twin of
 * target_decode.h. A cache holds nseq sequences of at most max_len positions. One call runs a step over several
 * sequences at once (each with its own number of new tokens: prefill, one decoded token, or a block to verify),
 * appending their keys and values, and gives the taps (the same columns as target_cuda_forward) and the logits of
 * every new row or of each sequence's last one. A step whose sequences all start empty runs the flash kernel over
 * the packed rows; otherwise the flash-decoding kernel reads the cache (a step of a shape seen before: one CUDA graph
 * launch, where the family's row allows it). Enqueued on the model's stream: the caller synchronises before reading
 * what it wrote. Errors name the sequence, the length and the limit. */
#ifndef DFLASH_TARGET_DECODE_CUDA_H
#define DFLASH_TARGET_DECODE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "target_model_cuda.h"
#include "util.h"

typedef struct target_cuda_cache target_cuda_cache;

/* A cache for m (fully loaded) of nseq x max_len positions; a step takes at most max_step_tokens new rows (and the
 * model's max_tokens). */
int target_cuda_cache_create(target_cuda_cache **out, target_cuda *m, int nseq, int max_len, int max_step_tokens,
                             errbuf *err);
void target_cuda_cache_destroy(target_cuda_cache **c);
int target_cuda_cache_length(const target_cuda_cache *c, int seq);
/* Device bytes of the cache and its workspaces. */
size_t target_cuda_cache_bytes(const target_cuda_cache *c);
/* A step: sequence seqs[i] (distinct) gets n[i] >= 1 tokens, ids concatenated in that order (host), at the
 * positions that follow what it holds. aux: device bf16 (T, ntaps*H; ld_aux) or NULL. logits: device bf16, (T, V)
 * in row order, or with last_only (nrun, V): each sequence's last new row; NULL: none. Refused, nothing changed,
 * when a sequence would pass max_len or the step max_step_tokens. */
int target_cuda_cache_forward(target_cuda_cache *c, int nrun, const int *seqs, const int *n, const int32_t *ids,
                              const int *taps, int ntaps, uint16_t *aux, int ld_aux, uint16_t *logits, int last_only,
                              errbuf *err);
/* Whether steps against the cache run as CUDA graphs (on by default, off when the environment has
 * DFLASH_DECODE_GRAPHS=0; target_decode_cuda.c says which steps and how).
 * Off drops the captured graphs. The outputs are the same bits either way. */
void target_cuda_cache_set_graphs(target_cuda_cache *c, int on);
/* Graphs captured over the cache's life and steps run as a graph launch. */
void target_cuda_cache_graph_stats(const target_cuda_cache *c, int *captured, long long *replayed);
/* Keep the first len positions of sequence seq (0 <= len <= its length). Hybrid targets, as on the CPU
 * (target_decode.h): the linear-attention states are restored by re-running the kept tokens of the sequence's last
 * step from the states before it (enqueued on the model's stream), so len must be 0 or at least the position where
 * that step started; -EINVAL otherwise, nothing changed. */
int target_cuda_cache_crop(target_cuda_cache *c, int seq, int len, errbuf *err);

#endif
