#include "drafter_infer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "anchors.h"
#include "argmax.h"
#include "drafter_model.h"

struct drafter_infer {
    drafter_model *m;
    drafter_frozen fz;
    int B, V, KH;
    drafter_blocks blk;          /* one block, rebuilt in place per call */
    int32_t *pos;                /* (cap) positions 0..cap-1 of the context rows */
    int pos_cap;
    float *logits;               /* (B, V) when the caller wants only the draft */
};

/* Checks drafter_model_load does not make: the layer count of the target the drafter was made for. */
static int check_target(const hf_config *c, const char *dir, const hf_config *t, errbuf *err)
{
    if (c->num_target_layers != t->num_layers)
        return errbuf_set(err, EINVAL, "%s/config.json: num_target_layers %d disagrees with the target's "
                          "num_hidden_layers %d", dir, c->num_target_layers, t->num_layers);
    return 0;
}

static drafter_infer *infer_new(drafter_model *m, const target_model *tm)
{
    const hf_config *c = drafter_model_config(m);
    drafter_infer *d = xcalloc(1, sizeof *d);
    d->m = m;
    d->B = c->block_size;
    d->V = c->vocab_size;
    d->KH = c->num_taps * c->hidden_size;
    d->fz = (drafter_frozen){.embed = target_model_embedding(tm), .lm_head = target_model_lm_head(tm), .vocab = d->V};
    /* one block: ctx rows [0, p), slots at p..p+B-1, no labels (inference trains nothing) */
    drafter_blocks_alloc_one(&d->blk, d->B);
    d->logits = xmalloc(sizeof(float) * (size_t)d->B * (size_t)d->V);
    return d;
}

static int load(drafter_infer **out, const char *dir, const target_model *tm, int fresh, uint64_t seed, errbuf *err)
{
    const hf_config *t = target_model_config(tm);
    drafter_model *m = NULL;
    int rc = drafter_model_load(&m, dir, t, err);
    if (rc) return rc;
    if ((rc = check_target(drafter_model_config(m), dir, t, err))) {
        drafter_model_destroy(&m);
        return rc;
    }
    if (fresh) drafter_layout_init_weights(drafter_model_layout(m), drafter_weights(m), seed);
    *out = infer_new(m, tm);
    return 0;
}

int drafter_infer_load(drafter_infer **out, const char *dir, const target_model *tm, errbuf *err)
{
    return load(out, dir, tm, 0, 0, err);
}

int drafter_infer_load_fresh(drafter_infer **out, const char *dir, uint64_t seed, const target_model *tm,
                             errbuf *err)
{
    return load(out, dir, tm, 1, seed, err);
}

void drafter_infer_destroy(drafter_infer **dp)
{
    drafter_infer *d = *dp;
    if (!d) return;
    drafter_blocks_free(&d->blk);
    drafter_model_destroy(&d->m);
    free(d->pos);
    free(d->logits);
    free(d);
    *dp = NULL;
}

const hf_config *drafter_infer_config(const drafter_infer *d) { return drafter_model_config(d->m); }

void drafter_infer_block(drafter_infer *d, const float *ctx, int p, int32_t token, float *logits, int32_t *draft)
{
    DF_ASSERT(p >= 1);
    if (p > d->pos_cap) {
        d->pos_cap = p > 2 * d->pos_cap ? p : 2 * d->pos_cap;
        d->pos = xrealloc(d->pos, sizeof(int32_t) * (size_t)d->pos_cap);
        for (int t = 0; t < d->pos_cap; t++) d->pos[t] = t;
    }
    drafter_blocks *b = &d->blk;
    drafter_blocks_set_one(b, p, token, drafter_model_config(d->m)->mask_token_id);
    float *lg = logits ? logits : d->logits;
    drafter_outputs o = {.logits = lg};
    drafter_forward_backward(d->m, &d->fz, ctx, p, d->pos, b, 0, 1.0f, NULL, &o);
    if (draft) argmax_rows_cpu(draft, lg, d->V, d->B, d->V);
}
