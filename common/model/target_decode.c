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
    /* scratch for the tokens of one forward, grown to the largest call */
    int scratch_tokens;
    float *x, *u, *q, *attn, *gate, *up;
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
    float *bufs[] = {c->k, c->v, c->x, c->u, c->q, c->attn, c->gate, c->up};
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
    float **bufs[] = {&ca->x, &ca->u, &ca->q, &ca->attn, &ca->gate, &ca->up};
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

    const int H = c->hidden_size, hd = c->head_dim, nh = c->num_heads, nkv = c->num_kv_heads;
    const int qd = nh * hd, kd = ca->kd, I = c->intermediate_size, ld_aux = ntaps * H;
    const float eps = (float)c->rms_eps, scale = 1.0f / sqrtf((float)hd);
    scratch_reserve(ca, n);
    for (int t = 0; t < n; t++) ca->pos[t] = past + t, ca->seq[t] = seq;

    embedding_forward_cpu(ca->x, ids, n, m->embed, c->vocab_size, H);
    /* Every layer runs, whatever the taps: the cache needs each layer's keys and values at every position. */
    for (int li = 0; li < ca->nlayers; li++) {
        const target_layer *l = &m->layers[li];
        const size_t seq_stride = (size_t)ca->max_len * (size_t)kd, layer_off = (size_t)li * ca->nseq * seq_stride;
        const size_t new_off = (size_t)seq * seq_stride + (size_t)past * (size_t)kd;
        float *kc = ca->k + layer_off, *vc = ca->v + layer_off;
        /* the new rows' keys and values are computed in place in the cache (no separate append) */
        float *kn = kc + new_off, *vn = vc + new_off;
        rmsnorm_forward_cpu(ca->u, H, ca->x, H, l->input_norm, n, H, eps);
        matmul_forward_cpu(ca->q, qd, ca->u, H, l->wq, n, qd, H, 0);
        matmul_forward_cpu(kn, kd, ca->u, H, l->wk, n, kd, H, 0);
        matmul_forward_cpu(vn, kd, ca->u, H, l->wv, n, kd, H, 0);
        if (c->has_qk_norm) {
            rmsnorm_forward_cpu(ca->q, hd, ca->q, hd, l->q_norm, n * nh, hd, eps);
            rmsnorm_forward_cpu(kn, hd, kn, hd, l->k_norm, n * nkv, hd, eps);
        }
        rope_apply_cpu(ca->q, qd, n, nh, hd, ca->pos, m->inv_freq, 0);
        rope_apply_cpu(kn, kd, n, nkv, hd, ca->pos, m->inv_freq, 0);
        kv_attention_forward_cpu(ca->attn, qd, ca->q, qd, kc, vc, seq_stride, ca->seq, ca->pos, n, nh, nkv, hd, scale);
        matmul_forward_cpu(ca->x, H, ca->attn, qd, l->wo, n, H, qd, 1);
        rmsnorm_forward_cpu(ca->u, H, ca->x, H, l->post_norm, n, H, eps);
        matmul_forward_cpu(ca->gate, I, ca->u, H, l->w_gate, n, I, H, 0);
        matmul_forward_cpu(ca->up, I, ca->u, H, l->w_up, n, I, H, 0);
        swiglu_forward_cpu(ca->gate, ca->gate, ca->up, (size_t)n * (size_t)I);
        matmul_forward_cpu(ca->x, H, ca->gate, I, l->w_down, n, H, I, 1);
        /* taps: the residual stream after layer li, as target_model_forward captures it */
        for (int i = 0; aux && i < ntaps; i++) {
            if (taps[i] != li) continue;
            for (int t = 0; t < n; t++)
                memcpy(aux + (size_t)t * ld_aux + (size_t)i * H, ca->x + (size_t)t * H, sizeof(float) * (size_t)H);
        }
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
