/* attn_stack: the decoding cache of the attention-plus-MLP families on the CPU (attn_stack.h). */
#include "attn_stack.h"

#include <stdlib.h>

typedef struct attn_stack_cache {
    const attn_stack_ops *ops;
    attn_kv_cache kv;
    void *acts;                          /* a forward's rows (their keys and values are in the cache) */
} attn_stack_cache;

void *attn_stack_cache_new(const attn_stack_ops *ops, const target_model *m, int nseq, int max_len)
{
    attn_stack_cache *k = xcalloc(1, sizeof *k);
    k->ops = ops;
    k->acts = xcalloc(1, ops->acts_size);
    attn_kv_cache_init(&k->kv, &m->cfg, nseq, max_len);
    return k;
}

void attn_stack_cache_destroy(void *cs)
{
    attn_stack_cache *k = cs;
    attn_kv_cache_free(&k->kv);
    k->ops->free(k->acts);
    free(k->acts);
    free(k);
}

void attn_stack_cache_layer(void *cs, const target_model *m, int li, float *x, int seq, int past, int n,
                            const int32_t *pos, const int32_t *seqs)
{
    attn_stack_cache *k = cs;
    k->ops->reserve(k->acts, &m->cfg, n, 0);
    /* the new rows' keys and values are computed in place in the cache: the attention's k and v point there for
     * this layer, then back at the activations' own (which the cache's view must not free) */
    attn_acts *at = k->acts, own = *at;
    attn_kv_view kv;
    attn_kv_cache_rows(&k->kv, li, seq, past, seqs, at, &kv);
    k->ops->layer(m, li, x, k->acts, n, pos, NULL, 0, &kv);
    *at = own;
}

int attn_stack_cache_crop(void *cs, const target_model *m, int seq, int len, int held, int *rerun_from,
                          const int32_t **rerun_ids, errbuf *err)
{
    (void)cs, (void)m, (void)seq, (void)held, (void)rerun_ids, (void)err;
    *rerun_from = len;
    return 0;
}
