/* target_decode: the CPU target's decoding cache, generic part: the arguments, the lengths, the embedding, the loop
 * over every layer through the family's cache operations (target_cpu_ops: the keys and values, the recurrent
 * states), the final norm and lm_head. The cache owns its scratch and only reads the model. */
#include "target_decode.h"
#include "target_model_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "argmax.h"
#include "embedding.h"
#include "matmul.h"
#include "rmsnorm.h"

struct target_cache {
    const target_model *m;
    const target_cpu_ops *ops;      /* the model's family's */
    void *cs;                       /* the family's part (keys and values, states) */
    int nseq, max_len;
    int *len;                       /* (nseq) positions held */
    /* the rows of one forward, grown to the largest call: residual stream and final-norm rows (n, H), absolute
     * position and sequence of each new token (n) */
    int scratch_tokens;
    float *x, *u;
    int32_t *pos, *seq;
};

int target_cache_create(target_cache **out, target_model *m, int nseq, int max_len, errbuf *err)
{
    *out = NULL;
    int rc = target_family_require(&m->cfg, TARGET_BACKEND_CPU, TARGET_CAN_DECODE, "decoding with a KV cache", NULL,
                                   err);
    if (rc) return rc;
    if (!m->full)
        return errbuf_set(err, EINVAL, "decoding needs the whole target (final norm and lm_head), but only layers "
                          "0..%d are loaded", m->nlayers - 1);
    if (nseq < 1 || max_len < 1)
        return errbuf_set(err, EINVAL, "KV cache of %d sequences x %d positions: both must be at least 1", nseq,
                          max_len);
    target_cache *ca = xcalloc(1, sizeof *ca);
    ca->m = m;
    ca->ops = m->fam->cpu;
    ca->nseq = nseq;
    ca->max_len = max_len;
    ca->len = xcalloc((size_t)nseq, sizeof *ca->len);
    ca->cs = ca->ops->cache_new(m, nseq, max_len);
    *out = ca;
    return 0;
}

void target_cache_destroy(target_cache **cp)
{
    target_cache *c = *cp;
    if (!c) return;
    c->ops->cache_destroy(c->cs);
    free(c->x);
    free(c->u);
    free(c->pos);
    free(c->seq);
    free(c->len);
    free(c);
    *cp = NULL;
}

int target_cache_length(const target_cache *c, int seq)
{
    DF_ASSERT(seq >= 0 && seq < c->nseq);
    return c->len[seq];
}

int target_cache_capacity(const target_cache *c) { return c->max_len; }

static void scratch_reserve(target_cache *ca, int n)
{
    if (n <= ca->scratch_tokens) return;
    const size_t t = (size_t)n, H = (size_t)ca->m->cfg.hidden_size;
    free(ca->x);
    free(ca->u);
    free(ca->pos);
    free(ca->seq);
    ca->x = xmalloc(t * H * sizeof(float));
    ca->u = xmalloc(t * H * sizeof(float));
    ca->pos = xmalloc(t * sizeof *ca->pos);
    ca->seq = xmalloc(t * sizeof *ca->seq);
    ca->scratch_tokens = n;
}

/* The forward of target_cache_forward; logits get rows [logits_from, n) only. keep: the family records what a later
 * crop into this forward needs (0 when a crop re-runs the recorded ids). */
static int cache_forward(target_cache *ca, int seq, const int32_t *ids, int n, const int *taps, int ntaps, float *aux,
                         float *logits, int logits_from, int keep, errbuf *err)
{
    const target_model *m = ca->m;
    const hf_config *c = &m->cfg;
    if (seq < 0 || seq >= ca->nseq)
        return errbuf_set(err, EINVAL, "sequence %d: the cache holds sequences 0..%d", seq, ca->nseq - 1);
    const int past = ca->len[seq];
    if (n < 1) return errbuf_set(err, EINVAL, "sequence %d: a forward needs at least one token (got %d)", seq, n);
    if (n > ca->max_len - past)
        return errbuf_set(err, ENOSPC, "sequence %d: %d positions held + %d new = %lld exceed the cache's %d", seq,
                          past, n, (long long)past + n, ca->max_len);
    for (int t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab_size)
            return errbuf_set(err, EINVAL, "sequence %d: token id %d at position %d is outside the vocabulary (%d)",
                              seq, ids[t], past + t, c->vocab_size);
    int deepest;
    int rc = target_request_depth(c, m->nlayers, m->full, taps, aux ? ntaps : 0, 1, &deepest, err);
    if (rc) return errbuf_wrap(err, rc, "sequence %d", seq);

    const int H = c->hidden_size;
    const float eps = (float)c->rms_eps;
    scratch_reserve(ca, n);
    for (int t = 0; t < n; t++) ca->pos[t] = past + t, ca->seq[t] = seq;

    embedding_forward_cpu(ca->x, ids, n, m->embed, c->vocab_size, H);
    if (ca->ops->cache_begin) ca->ops->cache_begin(ca->cs, seq, past, ids, n, keep);
    /* Every layer runs, whatever the taps: the cache needs each layer's keys and values (or states) at every
     * position. */
    for (int li = 0; li < c->num_layers; li++) {
        ca->ops->cache_layer(ca->cs, m, li, ca->x, seq, past, n, ca->pos, ca->seq);
        target_capture_taps_cpu(aux, taps, ntaps, li, ca->x, n, H);
    }
    if (logits) {
        size_t off = (size_t)logits_from * (size_t)H;
        rmsnorm_forward_cpu(ca->u, H, ca->x + off, H, m->final_norm, n - logits_from, H, eps);
        matmul_forward_cpu(logits, c->vocab_size, ca->u, H, m->lm_head, n - logits_from, c->vocab_size, H, 0);
    }
    ca->len[seq] = past + n;
    return 0;
}

int target_cache_forward(target_cache *c, int seq, const int32_t *ids, int n, const int *taps, int ntaps, float *aux,
                         float *logits, errbuf *err)
{
    return cache_forward(c, seq, ids, n, taps, ntaps, aux, logits, 0, 1, err);
}

int target_cache_forward_last(target_cache *c, int seq, const int32_t *ids, int n, const int *taps, int ntaps,
                              float *aux, float *logits, errbuf *err)
{
    return cache_forward(c, seq, ids, n, taps, ntaps, aux, logits, n > 0 ? n - 1 : 0, 1, err);
}

int target_cache_crop(target_cache *c, int seq, int len, errbuf *err)
{
    if (seq < 0 || seq >= c->nseq)
        return errbuf_set(err, EINVAL, "crop: sequence %d: the cache holds sequences 0..%d", seq, c->nseq - 1);
    if (len < 0 || len > c->len[seq])
        return errbuf_set(err, EINVAL, "crop: sequence %d holds %d positions; cannot keep %d", seq, c->len[seq], len);
    int from = len;
    const int32_t *rerun = NULL;
    int n = c->ops->cache_crop(c->cs, c->m, seq, len, c->len[seq], &from, &rerun, err);
    if (n < 0) return n;
    c->len[seq] = from;
    if (n > 0) {
        int rc = cache_forward(c, seq, rerun, n, NULL, 0, NULL, NULL, 0, 0, err);
        DF_ASSERT(rc == 0); /* the same tokens it already ran, at the same positions */
    }
    c->len[seq] = len;
    return 0;
}

static int suppressed(int32_t v, const int32_t *suppress, int nsuppress)
{
    for (int i = 0; i < nsuppress; i++)
        if (suppress[i] == v) return 1;
    return 0;
}

int32_t target_logits_argmax(const float *row, int vocab, const int32_t *suppress, int nsuppress)
{
    int32_t best = -1;
    if (nsuppress == 0) {
        argmax_rows_cpu(&best, row, vocab, 1, vocab);
        return best;
    }
    /* argmax_rows_cpu's rule (first index of the maximum; NaN never wins) over the ids left */
    float bv = -INFINITY;
    for (int v = 0; v < vocab; v++) {
        if (suppressed(v, suppress, nsuppress)) continue;
        if (best < 0) best = v;
        if (row[v] > bv) bv = row[v], best = v;
    }
    return best;
}

static int sample_item_cmp(const void *a, const void *b)
{
    const target_sample_item *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

int32_t target_logits_sample(const float *row, int vocab, const int32_t *suppress, int nsuppress, double temperature,
                             double top_p, double u, target_sample_item *scratch)
{
    float mx = -INFINITY;
    int n = 0;
    for (int v = 0; v < vocab; v++) {
        if (isnan(row[v]) || suppressed(v, suppress, nsuppress)) continue;
        scratch[n++] = (target_sample_item){.p = row[v], .id = v};
        if (row[v] > mx) mx = row[v];
    }
    if (n == 0) return -1;
    if (mx == -INFINITY || mx == INFINITY) return target_logits_argmax(row, vocab, suppress, nsuppress);
    for (int i = 0; i < n; i++) scratch[i].p = (float)exp(((double)scratch[i].p - (double)mx) / temperature);
    int keep = n;
    double total = 0.0;
    if (top_p < 1.0) {
        double all = 0.0;
        for (int i = 0; i < n; i++) all += scratch[i].p;
        qsort(scratch, (size_t)n, sizeof *scratch, sample_item_cmp);
        for (keep = 0; keep < n && (keep == 0 || total < top_p * all);) total += scratch[keep++].p;
    } else {
        for (int i = 0; i < n; i++) total += scratch[i].p;
    }
    const double target = u * total;
    double acc = 0.0;
    for (int i = 0; i < keep; i++) {
        acc += scratch[i].p;
        if (acc > target) return scratch[i].id;
    }
    return scratch[keep - 1].id; /* rounding left the draw at the very end */
}
