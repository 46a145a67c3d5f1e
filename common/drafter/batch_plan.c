#include "batch_plan.h"

#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "util.h"

typedef struct epoch_packing {
    uint64_t epoch;
    uint64_t *order;     /* sample order, (nsamples) */
    uint64_t *first;     /* batch i holds order[first[i] .. first[i+1]) , (nbatches+1) */
    uint64_t nbatches;
} epoch_packing;

struct batch_plan {
    const dataset *ds;
    uint64_t seed, nsamples;
    uint32_t max_tokens, max_seqs;
    epoch_packing cur;        /* the epoch last used */
    uint64_t *epoch_start;    /* first batch id of each epoch computed so far, (nknown+1) */
    uint64_t nknown;
};

static uint64_t sample_len(const batch_plan *p, uint64_t s)
{
    const uint32_t *t;
    const uint8_t *m;
    uint64_t len = 0;
    dataset_sample(p->ds, s, &t, &m, &len);
    return len < p->max_tokens ? len : p->max_tokens;
}

static void pack_epoch(batch_plan *p, uint64_t e, epoch_packing *out)
{
    free(out->order);
    free(out->first);
    uint64_t n = p->nsamples;
    out->epoch = e;
    out->order = xmalloc(sizeof(uint64_t) * (n ? n : 1));
    out->first = xmalloc(sizeof(uint64_t) * (n + 1));
    for (uint64_t i = 0; i < n; i++) out->order[i] = i;
    rng r;
    rng_seed(&r, p->seed, 0x0d7a, e, 0);
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = rng_below(&r, i), t = out->order[i - 1];
        out->order[i - 1] = out->order[j];
        out->order[j] = t;
    }
    uint64_t nb = 0, tok = 0, seqs = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = sample_len(p, out->order[i]);
        if (i == 0 || tok + len > p->max_tokens || seqs == p->max_seqs) {
            out->first[nb++] = i;
            tok = 0;
            seqs = 0;
        }
        tok += len;
        seqs++;
    }
    out->first[nb] = n;
    out->nbatches = nb;
}

batch_plan *batch_plan_new(const dataset *ds, uint64_t seed, uint32_t max_tokens, uint32_t max_seqs)
{
    batch_plan *p = xcalloc(1, sizeof *p);
    p->ds = ds;
    p->seed = seed;
    p->nsamples = dataset_count(ds);
    p->max_tokens = max_tokens;
    p->max_seqs = max_seqs;
    p->epoch_start = xcalloc(1, sizeof(uint64_t));
    p->cur.epoch = UINT64_MAX;
    DF_ASSERT(p->nsamples > 0);
    return p;
}

void batch_plan_free(batch_plan **pp)
{
    batch_plan *p = *pp;
    if (!p) return;
    free(p->cur.order);
    free(p->cur.first);
    free(p->epoch_start);
    free(p);
    *pp = NULL;
}

static void use_epoch(batch_plan *p, uint64_t e)
{
    if (p->cur.epoch != e) pack_epoch(p, e, &p->cur);
}

uint64_t batch_plan_epoch_batches(batch_plan *p, uint64_t e)
{
    use_epoch(p, e);
    return p->cur.nbatches;
}

void batch_plan_fill(batch_plan *p, uint64_t batch_id, struct token_batch *out, uint64_t *epoch_out)
{
    /* find the epoch: extend the table of epoch starts as far as needed */
    while (p->epoch_start[p->nknown] <= batch_id) {
        uint64_t nb = batch_plan_epoch_batches(p, p->nknown);
        p->epoch_start = xrealloc(p->epoch_start, sizeof(uint64_t) * (p->nknown + 2));
        p->epoch_start[p->nknown + 1] = p->epoch_start[p->nknown] + nb;
        p->nknown++;
    }
    uint64_t e = 0;
    while (p->epoch_start[e + 1] <= batch_id) e++;
    use_epoch(p, e);
    uint64_t i = batch_id - p->epoch_start[e], tok = 0;
    uint32_t nseq = 0;
    out->cu_seqlens[0] = 0;
    for (uint64_t j = p->cur.first[i]; j < p->cur.first[i + 1]; j++) {
        uint64_t s = p->cur.order[j], len = 0;
        const uint32_t *t;
        const uint8_t *m;
        dataset_sample(p->ds, s, &t, &m, &len);
        if (len > p->max_tokens) len = p->max_tokens;
        for (uint64_t k = 0; k < len; k++) {
            out->input_ids[tok + k] = (int32_t)t[k];
            out->loss_mask[tok + k] = m[k];
        }
        tok += len;
        out->sample_ids[nseq] = s;
        out->cu_seqlens[++nseq] = (int32_t)tok;
    }
    out->meta->batch_id = batch_id;
    out->meta->nseq = nseq;
    out->meta->ntok = (uint32_t)tok;
    if (epoch_out) *epoch_out = e;
}
