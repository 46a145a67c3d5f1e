/* attn_stack: the decoding cache of the families whose every layer is attn_block's attention plus an MLP (dense,
 * qwen3_moe, gpt_oss) on the CPU, as target_cpu_ops' cache operations: attn_block's cache of every layer's keys and
 * values and the activations of a forward's new rows, whose keys and values are computed in place in the cache.
 * A family gives its layer function and its activations (a struct whose first member is attn_acts) through one
 * attn_stack_ops, and its cache_new is attn_stack_cache_new with it; the other three are these functions. */
#ifndef DFLASH_ATTN_STACK_H
#define DFLASH_ATTN_STACK_H

#include <stddef.h>
#include <stdint.h>

#include "attn_block.h"
#include "target_model_impl.h"
#include "util.h"

typedef struct attn_stack_ops {
    size_t acts_size;                    /* the family's activations; their first member is an attn_acts */
    /* grow acts to T rows (with k and v unless they live in a cache); free them */
    void (*reserve)(void *acts, const hf_config *c, int T, int with_kv);
    void (*free)(void *acts);
    /* decoder layer li over T rows x (T, H) at positions pos, in place; kv as attn_block_forward_cpu's */
    void (*layer)(const target_model *m, int li, float *x, void *acts, int T, const int32_t *pos,
                  const int32_t *cu_seqlens, int nseq, const attn_kv_view *kv);
} attn_stack_ops;

void *attn_stack_cache_new(const attn_stack_ops *ops, const target_model *m, int nseq, int max_len);
void attn_stack_cache_destroy(void *cs);
void attn_stack_cache_layer(void *cs, const target_model *m, int li, float *x, int seq, int past, int n,
                            const int32_t *pos, const int32_t *seqs);
/* Keys and values past len are simply overwritten later: nothing to re-run. */
int attn_stack_cache_crop(void *cs, const target_model *m, int seq, int len, int held, int *rerun_from,
                          const int32_t **rerun_ids, errbuf *err);

#endif
