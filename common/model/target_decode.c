/* target_decode: the CPU target forward of target_model.c, run over the new tokens of one sequence against the keys
 * and values its earlier positions left in the cache. The cache owns its scratch and only reads the model. */
#include "target_decode.h"
#include "target_model_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "argmax.h"
#include "embedding.h"
#include "kv_attention.h"
#include "matmul.h"
#include "rmsnorm.h"
#include "rope.h"
#include "swiglu.h"

struct target_cache {
    const target_model *m;
    int nseq, max_len, nlayers, kd;
    int *len;         /* (nseq) positions held */
    float *k, *v;     /* (nlayers, nseq, max_len, kd): post qk-norm and rope keys, values (kv_attention layout) */
    /* activations of the tokens of one forward, grown to the largest call (k and v point into the cache) */
    int scratch_tokens;
    target_acts act;
    int32_t *pos, *seq; /* (n): absolute position and sequence of each new token, for kv_attention */
};

int target_cache_create(target_cache **out, target_model *m, int nseq, int max_len, errbuf *err)
{
    *out = NULL;
    const hf_config *c = &m->cfg;
    if (c->arch != HF_ARCH_QWEN3 && c->arch != HF_ARCH_LLAMA)
        return errbuf_set(err, ENOTSUP, "decoding with a KV cache supports qwen3 and llama targets; this target is %s",
                          c->model_type);
    if (!m->full)
        return errbuf_set(err, EINVAL, "decoding needs the whole target (final norm and lm_head), but only layers "
                          "0..%d are loaded", m->nlayers - 1);
    if (nseq < 1 || max_len < 1)
        return errbuf_set(err, EINVAL, "KV cache of %d sequences x %d positions: both must be at least 1", nseq,
                          max_len);
    target_cache *ca = xcalloc(1, sizeof *ca);
    ca->m = m;
    ca->nseq = nseq;
    ca->max_len = max_len;
    ca->nlayers = c->num_layers;
    ca->kd = c->num_kv_heads * c->head_dim;
    ca->len = xcalloc((size_t)nseq, sizeof *ca->len);
    size_t n = (size_t)ca->nlayers * (size_t)nseq * (size_t)max_len * (size_t)ca->kd;
    ca->k = xmalloc(n * sizeof *ca->k);
    ca->v = xmalloc(n * sizeof *ca->v);
    *out = ca;
    return 0;
}

void target_cache_destroy(target_cache **cp)
{
    target_cache *c = *cp;
    if (!c) return;
    float *bufs[] = {c->k, c->v, c->act.x, c->act.u, c->act.q, c->act.attn, c->act.gate, c->act.up};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
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
    const hf_config *c = &ca->m->cfg;
    size_t H = (size_t)c->hidden_size, qd = (size_t)c->num_heads * (size_t)c->head_dim;
    size_t I = (size_t)c->intermediate_size, t = (size_t)n;
    target_acts *a = &ca->act;
    float **bufs[] = {&a->x, &a->u, &a->q, &a->attn, &a->gate, &a->up};
    size_t sizes[] = {t * H, t * H, t * qd, t * qd, t * I, t * I};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        free(*bufs[i]);
        *bufs[i] = xmalloc(sizes[i] * sizeof(float));
    }
    free(ca->pos);
    free(ca->seq);
    ca->pos = xmalloc(t * sizeof *ca->pos);
    ca->seq = xmalloc(t * sizeof *ca->seq);
    ca->scratch_tokens = n;
}

/* The forward of target_cache_forward; logits get rows [logits_from, n) only. */
static int cache_forward(target_cache *ca, int seq, const int32_t *ids, int n, const int *taps, int ntaps, float *aux,
                         float *logits, int logits_from, errbuf *err)
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

    const int H = c->hidden_size, kd = ca->kd;
    const float eps = (float)c->rms_eps;
    scratch_reserve(ca, n);
    for (int t = 0; t < n; t++) ca->pos[t] = past + t, ca->seq[t] = seq;

    target_acts a = ca->act;
    embedding_forward_cpu(a.x, ids, n, m->embed, c->vocab_size, H);
    /* Every layer runs, whatever the taps: the cache needs each layer's keys and values at every position. */
    const size_t seq_stride = (size_t)ca->max_len * (size_t)kd;
    for (int li = 0; li < ca->nlayers; li++) {
        const size_t layer_off = (size_t)li * ca->nseq * seq_stride;
        const size_t new_off = (size_t)seq * seq_stride + (size_t)past * (size_t)kd;
        /* the new rows' keys and values are computed in place in the cache (no separate append) */
        a.k = ca->k + layer_off + new_off, a.v = ca->v + layer_off + new_off;
        target_kv_view kv = {.kc = ca->k + layer_off, .vc = ca->v + layer_off, .seq_stride = seq_stride,
                             .seq = ca->seq};
        target_dense_layer_cpu(m, li, &a, n, ca->pos, NULL, 0, &kv);
        target_capture_taps_cpu(aux, taps, ntaps, li, a.x, n, H);
    }
    if (logits) {
        size_t off = (size_t)logits_from * (size_t)H;
        rmsnorm_forward_cpu(a.u, H, a.x + off, H, m->final_norm, n - logits_from, H, eps);
        matmul_forward_cpu(logits, c->vocab_size, a.u, H, m->lm_head, n - logits_from, c->vocab_size, H, 0);
    }
    ca->len[seq] = past + n;
    return 0;
}

int target_cache_forward(target_cache *c, int seq, const int32_t *ids, int n, const int *taps, int ntaps, float *aux,
                         float *logits, errbuf *err)
{
    return cache_forward(c, seq, ids, n, taps, ntaps, aux, logits, 0, err);
}

int target_cache_forward_last(target_cache *c, int seq, const int32_t *ids, int n, const int *taps, int ntaps,
                              float *aux, float *logits, errbuf *err)
{
    return cache_forward(c, seq, ids, n, taps, ntaps, aux, logits, n > 0 ? n - 1 : 0, err);
}

int target_cache_crop(target_cache *c, int seq, int len, errbuf *err)
{
    if (seq < 0 || seq >= c->nseq)
        return errbuf_set(err, EINVAL, "crop: sequence %d: the cache holds sequences 0..%d", seq, c->nseq - 1);
    if (len < 0 || len > c->len[seq])
        return errbuf_set(err, EINVAL, "crop: sequence %d holds %d positions; cannot keep %d", seq, c->len[seq], len);
    c->len[seq] = len;
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
        int skip = 0;
        for (int i = 0; i < nsuppress && !skip; i++) skip = suppress[i] == v;
        if (skip) continue;
        if (best < 0) best = v;
        if (row[v] > bv) bv = row[v], best = v;
    }
    return best;
}
