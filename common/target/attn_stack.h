/* attn_stack: what the families whose every layer is attn_block's attention plus an MLP (dense, qwen3_moe, gpt_oss)
 * share on the CPU, as target_cpu_ops: the layers (m->layers: an attn_stack_layers), the packed forward's
 * activations, and a decoding cache of attn_block's keys and values of every layer plus the activations of a
 * forward's new rows (their keys and values computed in place in the cache). A family gives its layer (weights:
 * load, free), its activations (a struct whose first member is attn_acts: reserve, free) and its layer function
 * through one attn_stack_ops; its load is attn_stack_load with them, every other operation is one of these. */
#ifndef DFLASH_ATTN_STACK_H
#define DFLASH_ATTN_STACK_H

#include <stddef.h>
#include <stdint.h>

#include "attn_block.h"
#include "target_model_impl.h"
#include "util.h"

typedef struct attn_stack_ops {
    size_t layer_size;                   /* the family's layer (its weights) */
    /* layer i of c from st under prefix into layer (zeroed); on failure layer holds what was loaded */
    int (*load_layer)(const st_file *st, const hf_config *c, const char *prefix, int i, void *layer, errbuf *err);
    void (*free_layer)(void *layer);
    size_t acts_size;                    /* the family's activations; their first member is an attn_acts */
    /* grow acts to T rows (with k and v unless they live in a cache); free them */
    void (*reserve)(void *acts, const hf_config *c, int T, int with_kv);
    void (*free)(void *acts);
    /* decoder layer li over T rows x (T, H) at positions pos, in place; kv as attn_block_forward_cpu's */
    void (*layer)(const target_model *m, int li, float *x, void *acts, int T, const int32_t *pos,
                  const int32_t *cu_seqlens, int nseq, const attn_kv_view *kv);
} attn_stack_ops;

/* m->layers of such a family */
typedef struct attn_stack_layers {
    const attn_stack_ops *ops;
    int n;
    char *l;                             /* n layers of ops->layer_size bytes */
    void *acts;                          /* the packed forward's */
} attn_stack_layers;

/* Layer li's weights (the family's layer struct). */
static inline const void *attn_stack_layer(const target_model *m, int li)
{
    const attn_stack_layers *s = m->layers;
    return s->l + (size_t)li * s->ops->layer_size;
}

int attn_stack_load(const attn_stack_ops *ops, target_model *m, const st_file *st, const char *prefix, errbuf *err);
void attn_stack_destroy(target_model *m);
void attn_stack_layer_packed(target_model *m, int li, float *x, const target_batch *b);
void *attn_stack_cache_new(const target_model *m, int nseq, int max_len);
void attn_stack_cache_destroy(void *cs);
void attn_stack_cache_layer(void *cs, const target_model *m, int li, float *x, int seq, int past, int n,
                            const int32_t *pos, const int32_t *seqs);
/* Keys and values past len are simply overwritten later: nothing to re-run. */
int attn_stack_cache_crop(void *cs, const target_model *m, int seq, int len, int held, int *rerun_from,
                          const int32_t **rerun_ids, errbuf *err);

#endif
