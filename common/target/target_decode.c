/* target_decode: the CPU target forward of target_model.c, run over the new tokens of one sequence against the keys
 * and values its earlier positions left in the cache (and, for a hybrid target, the linear-attention states they
 * left). The cache owns its scratch and only reads the model. */
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
#include "target_hybrid.h"

struct target_cache {
    const target_model *m;
    int nseq, max_len, nlayers, kd;
    int *len;         /* (nseq) positions held */
    float *k, *v;     /* (nlayers, nseq, max_len, kd): post qk-norm and rope keys, values (kv_attention layout) */
    /* activations of the tokens of one forward, grown to the largest call (k and v point into the cache) */
    int scratch_tokens;
    target_acts act;
    int32_t *pos, *seq; /* (n): absolute position and sequence of each new token, for kv_attention */
    /* Hybrid targets (m->hybrid): k and v hold the full-attention layers only; per linear-attention layer and
     * sequence the conv history and the delta-rule state, and copies of both as they were before the sequence's
     * last forward, whose ids are kept: a crop within that forward restores the copies and re-runs its first tokens
     * (recomputing costs a forward of the kept tokens; keeping every token's delta state would cost HV*Dk*Dv floats
     * per token and layer). */
    int *slot;                      /* (nlayers) index of layer li among the full (or the linear) layers */
    int nlin, nkvl;                 /* linear layers; layers with keys and values */
    size_t conv_n, delta_n;         /* floats per (linear layer, sequence): (K-1)*C, HV*Dk*Dv */
    float *conv, *delta;            /* (nlin, nseq, conv_n), (nlin, nseq, delta_n) */
    float *conv0, *delta0;          /* the same before the last forward */
    int *start;                     /* (nseq) position of the last forward's first token, -1 before any */
    int32_t *last_ids;              /* (nseq, max_len) its ids (len - start of them are still held) */
    target_hybrid_scratch *hs;
};

int target_cache_create(target_cache **out, target_model *m, int nseq, int max_len, errbuf *err)
{
    *out = NULL;
    const hf_config *c = &m->cfg;
    if (c->arch != HF_ARCH_QWEN3 && c->arch != HF_ARCH_LLAMA && !(c->is_hybrid && m->hybrid))
        return errbuf_set(err, ENOTSUP, "decoding with a KV cache supports qwen3 and llama targets and the hybrid "
                          "Qwen3.5 family; this target is %s", c->model_type);
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
    ca->nkvl = ca->nlayers;
    if (m->hybrid) {
        const size_t C = 2 * (size_t)c->linear_num_k_heads * c->linear_k_head_dim +
                         (size_t)c->linear_num_v_heads * c->linear_v_head_dim;
        ca->conv_n = (size_t)(c->linear_conv_kernel - 1) * C;
        ca->delta_n = (size_t)c->linear_num_v_heads * c->linear_k_head_dim * c->linear_v_head_dim;
        ca->slot = xcalloc((size_t)ca->nlayers, sizeof *ca->slot);
        ca->nkvl = 0;
        for (int li = 0; li < ca->nlayers; li++)
            ca->slot[li] = target_hybrid_layer_linear(m->hybrid, li) ? ca->nlin++ : ca->nkvl++;
        size_t nc = (size_t)ca->nlin * nseq * ca->conv_n, nd = (size_t)ca->nlin * nseq * ca->delta_n;
        ca->conv = xcalloc(nc ? nc : 1, sizeof(float));
        ca->conv0 = xcalloc(nc ? nc : 1, sizeof(float));
        ca->delta = xcalloc(nd ? nd : 1, sizeof(float));
        ca->delta0 = xcalloc(nd ? nd : 1, sizeof(float));
        ca->start = xmalloc((size_t)nseq * sizeof *ca->start);
        for (int s = 0; s < nseq; s++) ca->start[s] = -1;
        ca->last_ids = xmalloc((size_t)nseq * (size_t)max_len * sizeof *ca->last_ids);
        ca->hs = target_hybrid_scratch_new();
    }
    size_t n = (size_t)ca->nkvl * (size_t)nseq * (size_t)max_len * (size_t)ca->kd;
    if (!n) n = 1;
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
    float *hbufs[] = {c->conv, c->delta, c->conv0, c->delta0};
    for (size_t i = 0; i < sizeof hbufs / sizeof hbufs[0]; i++) free(hbufs[i]);
    free(c->slot);
    free(c->start);
    free(c->last_ids);
    target_hybrid_scratch_destroy(&c->hs);
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
    /* a hybrid target's layers bring their own scratch (hs): the residual stream and the final norm's rows */
    size_t nb = ca->hs ? 2 : sizeof sizes / sizeof sizes[0];
    for (size_t i = 0; i < nb; i++) {
        free(*bufs[i]);
        *bufs[i] = xmalloc(sizes[i] * sizeof(float));
    }
    free(ca->pos);
    free(ca->seq);
    ca->pos = xmalloc(t * sizeof *ca->pos);
    ca->seq = xmalloc(t * sizeof *ca->seq);
    ca->scratch_tokens = n;
}

/* Linear layer slot's state of sequence seq in buf (conv, delta, or their copies). */
static float *lin_state(const target_cache *ca, float *buf, size_t per, int slot, int seq)
{
    return buf + ((size_t)slot * (size_t)ca->nseq + (size_t)seq) * per;
}

/* Copy sequence seq's linear-attention states from (sc, sd) to (dc, dd). */
static void lin_states_copy(target_cache *ca, int seq, float *dc, float *dd, float *sc, float *sd)
{
    for (int l = 0; l < ca->nlin; l++) {
        memcpy(lin_state(ca, dc, ca->conv_n, l, seq), lin_state(ca, sc, ca->conv_n, l, seq),
               sizeof(float) * ca->conv_n);
        memcpy(lin_state(ca, dd, ca->delta_n, l, seq), lin_state(ca, sd, ca->delta_n, l, seq),
               sizeof(float) * ca->delta_n);
    }
}

/* The forward of target_cache_forward; logits get rows [logits_from, n) only. keep: record the states before it and
 * its ids for a later crop (0 when a crop re-runs the recorded ids). */
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

    const int H = c->hidden_size, kd = ca->kd;
    const float eps = (float)c->rms_eps;
    scratch_reserve(ca, n);
    for (int t = 0; t < n; t++) ca->pos[t] = past + t, ca->seq[t] = seq;

    target_acts a = ca->act;
    embedding_forward_cpu(a.x, ids, n, m->embed, c->vocab_size, H);
    /* Every layer runs, whatever the taps: the cache needs each layer's keys and values at every position. */
    const size_t seq_stride = (size_t)ca->max_len * (size_t)kd;
    if (ca->hs) {
        if (keep) {
            lin_states_copy(ca, seq, ca->conv0, ca->delta0, ca->conv, ca->delta);
            ca->start[seq] = past;
            memcpy(ca->last_ids + (size_t)seq * (size_t)ca->max_len, ids, sizeof *ids * (size_t)n);
        }
        for (int li = 0; li < ca->nlayers; li++) {
            const int sl = ca->slot[li];
            target_hybrid_state st = {0};
            if (target_hybrid_layer_linear(m->hybrid, li)) {
                st.conv = lin_state(ca, ca->conv, ca->conv_n, sl, seq);
                st.delta = lin_state(ca, ca->delta, ca->delta_n, sl, seq);
            } else {
                const size_t layer_off = (size_t)sl * ca->nseq * seq_stride;
                const size_t new_off = (size_t)seq * seq_stride + (size_t)past * (size_t)kd;
                st.k = ca->k + layer_off + new_off, st.v = ca->v + layer_off + new_off;
                st.kv = (target_kv_view){.kc = ca->k + layer_off, .vc = ca->v + layer_off, .seq_stride = seq_stride,
                                         .seq = ca->seq};
            }
            target_hybrid_layer_decode(m->hybrid, ca->hs, c, li, a.x, n, ca->pos, m->inv_freq, &st);
            target_capture_taps_cpu(aux, taps, ntaps, li, a.x, n, H);
        }
    }
    for (int li = 0; li < ca->nlayers && !ca->hs; li++) {
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
    if (c->hs && len == 0) { /* empty: the states of a sequence start */
        for (int l = 0; l < c->nlin; l++) {
            memset(lin_state(c, c->conv, c->conv_n, l, seq), 0, sizeof(float) * c->conv_n);
            memset(lin_state(c, c->delta, c->delta_n, l, seq), 0, sizeof(float) * c->delta_n);
        }
        c->start[seq] = -1;
    } else if (c->hs && len < c->len[seq]) {
        const int start = c->start[seq];
        if (start < 0 || len < start)
            return errbuf_set(err, EINVAL, "crop: sequence %d of a hybrid target (%s): cannot go back to %d positions, "
                              "before the start (%d) of its last forward: the linear-attention states are kept for "
                              "that forward only", seq, c->m->cfg.model_type, len, start < 0 ? c->len[seq] : start);
        /* the states before the last forward, then its first len - start tokens again */
        lin_states_copy(c, seq, c->conv, c->delta, c->conv0, c->delta0);
        c->len[seq] = start;
        if (len > start) {
            int rc = cache_forward(c, seq, c->last_ids + (size_t)seq * (size_t)c->max_len, len - start, NULL, 0, NULL,
                                   NULL, 0, 0, err);
            DF_ASSERT(rc == 0); /* the same tokens it already ran, at the same positions */
        }
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
