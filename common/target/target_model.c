#include "target_model.h"
#include "target_model_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "kv_attention.h"
#include "embedding.h"
#include "matmul.h"
#include "rmsnorm.h"
#include "rope.h"
#include "safetensors.h"
#include "swiglu.h"
#include "target_hybrid.h"

static int load_tensor(const st_file *st, const char *name, float **out, int64_t d0, int64_t d1, errbuf *err)
{
    int64_t shape[2] = {d0, d1};
    return st_load_f32(st, name, out, d1 > 0 ? 2 : 1, shape, NULL, err);
}

static int load_layer(const st_file *st, const hf_config *c, int i, target_layer *l, errbuf *err)
{
    char n[160];
    int64_t H = c->hidden_size, hd = c->head_dim, qd = (int64_t)c->num_heads * hd, kd = (int64_t)c->num_kv_heads * hd;
    int64_t I = c->intermediate_size;
    int rc = 0;
#define LOAD(field, suffix, a, b)                                                  \
    if (rc == 0) {                                                                  \
        snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix);                    \
        rc = load_tensor(st, n, &l->field, a, b, err);                              \
    }
    LOAD(input_norm, "input_layernorm.weight", H, 0);
    LOAD(post_norm, "post_attention_layernorm.weight", H, 0);
    LOAD(wq, "self_attn.q_proj.weight", qd, H);
    LOAD(wk, "self_attn.k_proj.weight", kd, H);
    LOAD(wv, "self_attn.v_proj.weight", kd, H);
    LOAD(wo, "self_attn.o_proj.weight", H, qd);
    if (c->has_qk_norm) {
        LOAD(q_norm, "self_attn.q_norm.weight", hd, 0);
        LOAD(k_norm, "self_attn.k_norm.weight", hd, 0);
    }
    LOAD(w_gate, "mlp.gate_proj.weight", I, H);
    LOAD(w_up, "mlp.up_proj.weight", I, H);
    LOAD(w_down, "mlp.down_proj.weight", H, I);
#undef LOAD
    return rc;
}

static void free_layer(target_layer *l)
{
    float **p[] = {&l->input_norm, &l->post_norm, &l->q_norm, &l->k_norm, &l->wq, &l->wk,
                   &l->wv, &l->wo, &l->w_gate, &l->w_up, &l->w_down};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) XFREE(*p[i]);
}

int target_model_load(target_model **out, const char *dir, int max_layer, errbuf *err)
{
    target_model *m = xcalloc(1, sizeof *m);
    st_file *st = NULL;
    int rc = hf_config_load(&m->cfg, dir, err);
    if (rc) goto fail;
    const hf_config *c = &m->cfg;
    if (max_layer >= c->num_layers) {
        rc = errbuf_set(err, EINVAL, "%s: layer %d requested but the model has %d layers", dir, max_layer,
                        c->num_layers);
        goto fail;
    }
    m->full = max_layer < 0;
    m->nlayers = m->full ? c->num_layers : max_layer + 1;
    rc = st_open(&st, dir, err);
    if (rc) goto fail;
    /* hybrid vision-language checkpoints keep the text model under model.language_model. */
    const char *prefix = c->is_hybrid ? target_hybrid_prefix(st) : "model.";
    char name[160];
    snprintf(name, sizeof name, "%sembed_tokens.weight", prefix);
    rc = load_tensor(st, name, &m->embed, c->vocab_size, c->hidden_size, err);
    if (rc) goto fail;
    if (c->tie_embeddings) {
        m->lm_head = m->embed;
    } else {
        rc = load_tensor(st, "lm_head.weight", &m->lm_head, c->vocab_size, c->hidden_size, err);
        if (rc) goto fail;
    }
    if (m->full) {
        snprintf(name, sizeof name, "%snorm.weight", prefix);
        rc = load_tensor(st, name, &m->final_norm, c->hidden_size, 0, err);
        if (rc) goto fail;
        if (c->is_hybrid) /* zero-centred RMSNorm: the scale is 1 + w */
            for (int i = 0; i < c->hidden_size; i++) m->final_norm[i] += 1.0f;
    }
    if (c->is_hybrid) {
        rc = target_hybrid_load(&m->hybrid, st, c, prefix, m->nlayers, err);
        if (rc) goto fail;
    } else {
        m->layers = xcalloc((size_t)m->nlayers, sizeof *m->layers);
        for (int i = 0; i < m->nlayers; i++) {
            rc = load_layer(st, c, i, &m->layers[i], err);
            if (rc) goto fail;
        }
    }
    /* partial RoPE (hybrid targets) rotates the first rotary_dim dimensions of each head */
    const int rd = c->is_hybrid ? c->rotary_dim : c->head_dim;
    m->inv_freq = xmalloc(sizeof(double) * (size_t)(rd / 2));
    rope_params rp = {.theta = c->rope_theta, .llama3 = c->rope_llama3, .factor = c->rope_factor,
                      .low_freq_factor = c->rope_low_freq_factor, .high_freq_factor = c->rope_high_freq_factor,
                      .original_max_position = c->rope_original_max_position};
    rope_inv_freq(m->inv_freq, rd, &rp);
    /* transformers keeps inv_freq as a float buffer that follows the model's dtype when the model is cast
     * (model.to(torch.bfloat16)): a bf16 checkpoint's reference forward rotates with bf16-rounded frequencies. */
    if (!strcmp(c->torch_dtype, "bfloat16"))
        for (int i = 0; i < rd / 2; i++) m->inv_freq[i] = bf16_to_f32(f32_to_bf16((float)m->inv_freq[i]));
    st_close(&st);
    *out = m;
    return 0;
fail:
    st_close(&st);
    target_model_destroy(&m);
    return rc;
}

void target_model_destroy(target_model **mp)
{
    target_model *m = *mp;
    if (!m) return;
    if (m->layers)
        for (int i = 0; i < m->nlayers; i++) free_layer(&m->layers[i]);
    free(m->layers);
    target_hybrid_destroy(&m->hybrid);
    if (m->lm_head != m->embed) free(m->lm_head);
    free(m->embed);
    free(m->final_norm);
    free(m->inv_freq);
    float *scratch[] = {m->act.x, m->act.u, m->act.q, m->act.k, m->act.v, m->act.attn, m->act.gate, m->act.up};
    for (size_t i = 0; i < sizeof scratch / sizeof scratch[0]; i++) free(scratch[i]);
    free(m);
    *mp = NULL;
}

const hf_config *target_model_config(const target_model *m) { return &m->cfg; }
const float *target_model_embedding(const target_model *m) { return m->embed; }
const float *target_model_lm_head(const target_model *m) { return m->lm_head; }
int target_model_loaded_layers(const target_model *m) { return m->nlayers - 1; }

static void scratch_reserve(target_model *m, int T)
{
    if (T <= m->scratch_tokens) return;
    const hf_config *c = &m->cfg;
    size_t H = (size_t)c->hidden_size, qd = (size_t)c->num_heads * (size_t)c->head_dim;
    size_t kd = (size_t)c->num_kv_heads * (size_t)c->head_dim, I = (size_t)c->intermediate_size, t = (size_t)T;
    target_acts *a = &m->act;
    float **bufs[] = {&a->x, &a->u, &a->q, &a->k, &a->v, &a->attn, &a->gate, &a->up};
    size_t sizes[] = {t * H, t * H, t * qd, t * kd, t * kd, t * qd, t * I, t * I};
    /* a hybrid target's layers keep their own scratch (target_hybrid.c): the residual stream and the final norm's
     * output are all this one needs */
    size_t n = m->hybrid ? 2 : sizeof sizes / sizeof sizes[0];
    for (size_t i = 0; i < n; i++) {
        free(*bufs[i]);
        *bufs[i] = xmalloc(sizes[i] * sizeof(float));
    }
    m->scratch_tokens = T;
}

int target_batch_check(const hf_config *c, const target_batch *b, errbuf *err)
{
    if (b->ntok <= 0 || b->nseq <= 0 || b->cu_seqlens[0] != 0 || b->cu_seqlens[b->nseq] != b->ntok)
        return errbuf_set(err, EINVAL, "batch: cu_seqlens must run from 0 to %d tokens over %d sequences", b->ntok,
                          b->nseq);
    for (int s = 0; s < b->nseq; s++)
        if (b->cu_seqlens[s + 1] < b->cu_seqlens[s])
            return errbuf_set(err, EINVAL, "batch: cu_seqlens decreases at sequence %d", s);
    for (int t = 0; t < b->ntok; t++) {
        if (b->input_ids[t] < 0 || b->input_ids[t] >= c->vocab_size)
            return errbuf_set(err, EINVAL, "batch: token id %d at position %d is outside the vocabulary (%d)",
                              b->input_ids[t], t, c->vocab_size);
    }
    return 0;
}

int target_request_depth(const hf_config *c, int nlayers, int full, const int *taps, int ntaps, int want_output,
                         int *deepest_out, errbuf *err)
{
    int deepest = -1;
    for (int i = 0; i < ntaps; i++) {
        if (taps[i] < 0 || taps[i] >= c->num_layers)
            return errbuf_set(err, EINVAL, "tap %d: layer %d is outside the target's %d layers", i, taps[i],
                              c->num_layers);
        if (taps[i] > deepest) deepest = taps[i];
    }
    if (want_output) {
        if (!full)
            return errbuf_set(err, EINVAL, "last hidden state or logits requested from a target loaded up to layer %d",
                              nlayers - 1);
        deepest = c->num_layers - 1;
    }
    if (deepest >= nlayers)
        return errbuf_set(err, EINVAL, "tap layer %d requested but only layers 0..%d are loaded", deepest,
                          nlayers - 1);
    *deepest_out = deepest;
    return 0;
}

void target_dense_layer_cpu(const target_model *m, int li, const target_acts *a, int T, const int32_t *pos,
                            const int32_t *cu_seqlens, int nseq, const target_kv_view *kv)
{
    const hf_config *c = &m->cfg;
    const target_layer *l = &m->layers[li];
    const int H = c->hidden_size, hd = c->head_dim, nh = c->num_heads, nkv = c->num_kv_heads;
    const int qd = nh * hd, kd = nkv * hd, I = c->intermediate_size;
    const float eps = (float)c->rms_eps, scale = 1.0f / sqrtf((float)hd);
    rmsnorm_forward_cpu(a->u, H, a->x, H, l->input_norm, T, H, eps);
    matmul_forward_cpu(a->q, qd, a->u, H, l->wq, T, qd, H, 0);
    matmul_forward_cpu(a->k, kd, a->u, H, l->wk, T, kd, H, 0);
    matmul_forward_cpu(a->v, kd, a->u, H, l->wv, T, kd, H, 0);
    if (c->has_qk_norm) {
        rmsnorm_forward_cpu(a->q, hd, a->q, hd, l->q_norm, T * nh, hd, eps);
        rmsnorm_forward_cpu(a->k, hd, a->k, hd, l->k_norm, T * nkv, hd, eps);
    }
    rope_apply_cpu(a->q, qd, T, nh, hd, pos, m->inv_freq, 0);
    rope_apply_cpu(a->k, kd, T, nkv, hd, pos, m->inv_freq, 0);
    if (kv)
        kv_attention_forward_cpu(a->attn, qd, a->q, qd, kv->kc, kv->vc, kv->seq_stride, kv->seq, pos, T, nh, nkv, hd,
                                 scale);
    else
        attention_causal_forward_cpu(a->attn, a->q, a->k, a->v, cu_seqlens, nseq, nh, nkv, hd, scale);
    matmul_forward_cpu(a->x, H, a->attn, qd, l->wo, T, H, qd, 1);
    rmsnorm_forward_cpu(a->u, H, a->x, H, l->post_norm, T, H, eps);
    matmul_forward_cpu(a->gate, I, a->u, H, l->w_gate, T, I, H, 0);
    matmul_forward_cpu(a->up, I, a->u, H, l->w_up, T, I, H, 0);
    swiglu_forward_cpu(a->gate, a->gate, a->up, (size_t)T * (size_t)I);
    matmul_forward_cpu(a->x, H, a->gate, I, l->w_down, T, H, I, 1);
}

void target_capture_taps_cpu(float *aux, const int *taps, int ntaps, int li, const float *x, int T, int H)
{
    const size_t ld = (size_t)ntaps * (size_t)H;
    for (int i = 0; aux && i < ntaps; i++) {
        if (taps[i] != li) continue;
        for (int t = 0; t < T; t++) memcpy(aux + (size_t)t * ld + (size_t)i * H, x + (size_t)t * H, sizeof(float) * (size_t)H);
    }
}

int target_model_forward(target_model *m, const target_batch *b, const int *taps, int ntaps, float *aux, float *last,
                         float *logits, errbuf *err)
{
    const hf_config *c = &m->cfg;
    int deepest, rc = target_batch_check(c, b, err);
    if (!rc) rc = target_request_depth(c, m->nlayers, m->full, taps, aux ? ntaps : 0, last || logits, &deepest, err);
    if (rc) return rc;
    const int T = b->ntok, H = c->hidden_size;
    const float eps = (float)c->rms_eps;
    scratch_reserve(m, T);

    float *x = m->act.x;
    embedding_forward_cpu(x, b->input_ids, T, m->embed, c->vocab_size, H);
    for (int li = 0; li <= deepest; li++) {
        if (m->hybrid) target_hybrid_layer_forward(m->hybrid, c, li, x, b, m->inv_freq);
        else target_dense_layer_cpu(m, li, &m->act, T, b->positions, b->cu_seqlens, b->nseq, NULL);
        /* CPU capture: the residual stream row goes to its tap column block (the CUDA path writes it from the
         * residual-add kernel itself). A layer may be tapped more than once. */
        target_capture_taps_cpu(aux, taps, ntaps, li, x, T, H);
    }
    if (last) memcpy(last, x, sizeof(float) * (size_t)T * (size_t)H);
    if (logits) {
        rmsnorm_forward_cpu(m->act.u, H, x, H, m->final_norm, T, H, eps);
        matmul_forward_cpu(logits, c->vocab_size, m->act.u, H, m->lm_head, T, c->vocab_size, H, 0);
    }
    return 0;
}

void target_default_taps(int num_layers, int k, int *taps)
{
    if (k == 1) {
        taps[0] = num_layers / 2;
        return;
    }
    for (int i = 0; i < k; i++) taps[i] = (int)nearbyint(1.0 + (double)i * (num_layers - 4) / (double)(k - 1));
}
