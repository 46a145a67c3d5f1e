/* attn_stack: the decoding cache of the attention-plus-MLP families on the CPU (attn_stack.h). */
#include "attn_stack.h"

#include <stdlib.h>

typedef struct attn_stack_cache {
    const attn_stack_ops *ops;
    attn_kv_cache kv;
    void *acts;                          /* a forward's rows (their keys and values are in the cache) */
} attn_stack_cache;

int attn_stack_load(const attn_stack_ops *ops, target_model *m, const st_file *st, const char *prefix, errbuf *err)
{
    attn_stack_layers *s = xcalloc(1, sizeof *s);
    m->layers = s;
    s->ops = ops;
    s->l = xcalloc((size_t)m->nlayers, ops->layer_size);
    s->n = m->nlayers;
    s->acts = xcalloc(1, ops->acts_size);
    for (int i = 0; i < m->nlayers; i++) {
        int rc = ops->load_layer(st, &m->cfg, prefix, i, s->l + (size_t)i * ops->layer_size, err);
        if (rc) return rc; /* the caller destroys the model */
    }
    return 0;
}

void attn_stack_destroy(target_model *m)
{
    attn_stack_layers *s = m->layers;
    if (!s) return;
    for (int i = 0; i < s->n; i++) s->ops->free_layer(s->l + (size_t)i * s->ops->layer_size);
    free(s->l);
    s->ops->free(s->acts);
    free(s->acts);
    free(s);
    m->layers = NULL;
}

void attn_stack_layer_packed(target_model *m, int li, float *x, const target_batch *b)
{
    attn_stack_layers *s = m->layers;
    s->ops->reserve(s->acts, &m->cfg, b->ntok, 1);
    s->ops->layer(m, li, x, s->acts, b->ntok, b->positions, b->cu_seqlens, b->nseq, NULL);
}

void *attn_stack_cache_new(const target_model *m, int nseq, int max_len)
{
    const attn_stack_ops *ops = ((const attn_stack_layers *)m->layers)->ops;
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
