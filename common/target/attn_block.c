/* attn_block: the Qwen3 / Llama attention sub-layer and its KV cache on the CPU; moved out of target_dense.c so that
 * the dense and qwen3_moe families run the one block. */
#include "attn_block.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "attention.h"
#include "bias_add.h"
#include "kv_attention.h"
#include "matmul.h"
#include "rmsnorm.h"
#include "rope.h"

int attn_block_load(attn_block *a, const st_file *st, const hf_config *c, const char *prefix, int layer, errbuf *err)
{
    char n[192];
    const int64_t H = c->hidden_size, hd = c->head_dim, qd = (int64_t)c->num_heads * hd;
    const int64_t kd = (int64_t)c->num_kv_heads * hd;
    int rc = 0;
    *a = (attn_block){0};
#define LOAD(field, suffix, d0, d1)                                                \
    if (rc == 0) {                                                                  \
        int64_t shape[2] = {d0, d1};                                                \
        snprintf(n, sizeof n, "%slayers.%d.%s", prefix, layer, suffix);            \
        rc = st_load_f32(st, n, &a->field, d1 > 0 ? 2 : 1, shape, NULL, err);       \
    }
    LOAD(input_norm, "input_layernorm.weight", H, 0);
    LOAD(wq, "self_attn.q_proj.weight", qd, H);
    LOAD(wk, "self_attn.k_proj.weight", kd, H);
    LOAD(wv, "self_attn.v_proj.weight", kd, H);
    LOAD(wo, "self_attn.o_proj.weight", H, qd);
    if (c->has_qk_norm) {
        LOAD(q_norm, "self_attn.q_norm.weight", hd, 0);
        LOAD(k_norm, "self_attn.k_norm.weight", hd, 0);
    }
    if (c->attention_bias) {
        LOAD(bq, "self_attn.q_proj.bias", qd, 0);
        LOAD(bk, "self_attn.k_proj.bias", kd, 0);
        LOAD(bv, "self_attn.v_proj.bias", kd, 0);
        LOAD(bo, "self_attn.o_proj.bias", H, 0);
    }
    if (c->attn_sinks) LOAD(sinks, "self_attn.sinks", c->num_heads, 0);
#undef LOAD
    a->window = hf_layer_window(c, layer);
    return rc;
}

void attn_block_free(attn_block *a)
{
    float **p[] = {&a->input_norm, &a->q_norm, &a->k_norm, &a->wq, &a->wk, &a->wv, &a->wo, &a->bq, &a->bk, &a->bv,
                   &a->bo, &a->sinks};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) XFREE(*p[i]);
}

void attn_acts_reserve(attn_acts *a, const hf_config *c, int T, int with_kv)
{
    if (T <= a->rows) return;
    size_t H = (size_t)c->hidden_size, qd = (size_t)c->num_heads * (size_t)c->head_dim;
    size_t kd = (size_t)c->num_kv_heads * (size_t)c->head_dim, t = (size_t)T;
    float **bufs[] = {&a->u, &a->q, &a->attn, &a->k, &a->v};
    size_t sizes[] = {t * H, t * qd, t * qd, t * kd, t * kd};
    size_t n = with_kv ? 5 : 3;
    for (size_t i = 0; i < n; i++) {
        free(*bufs[i]);
        *bufs[i] = xmalloc(sizes[i] * sizeof(float));
    }
    a->rows = T;
}

void attn_acts_free(attn_acts *a)
{
    float *bufs[] = {a->u, a->q, a->attn, a->k, a->v};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    *a = (attn_acts){0};
}

void attn_block_forward_cpu(const attn_block *w, const hf_config *c, const double *inv_freq, float *x,
                            const attn_acts *a, int T, const int32_t *pos, const int32_t *cu_seqlens, int nseq,
                            const attn_kv_view *kv)
{
    const int H = c->hidden_size, hd = c->head_dim, nh = c->num_heads, nkv = c->num_kv_heads;
    const int qd = nh * hd, kd = nkv * hd;
    const float eps = (float)c->rms_eps, scale = hf_attn_scale(c);
    rmsnorm_forward_cpu(a->u, H, x, H, w->input_norm, T, H, eps);
    matmul_forward_cpu(a->q, qd, a->u, H, w->wq, T, qd, H, 0);
    matmul_forward_cpu(a->k, kd, a->u, H, w->wk, T, kd, H, 0);
    matmul_forward_cpu(a->v, kd, a->u, H, w->wv, T, kd, H, 0);
    bias_add_cpu(a->q, qd, T, qd, w->bq);
    bias_add_cpu(a->k, kd, T, kd, w->bk);
    bias_add_cpu(a->v, kd, T, kd, w->bv);
    if (c->has_qk_norm) {
        rmsnorm_forward_cpu(a->q, hd, a->q, hd, w->q_norm, T * nh, hd, eps);
        rmsnorm_forward_cpu(a->k, hd, a->k, hd, w->k_norm, T * nkv, hd, eps);
    }
    rope_apply_cpu(a->q, qd, T, nh, hd, pos, inv_freq, 0);
    rope_apply_cpu(a->k, kd, T, nkv, hd, pos, inv_freq, 0);
    const attention_opts o = {.window = w->window, .sinks = w->sinks};
    if (kv)
        kv_attention_opts_forward_cpu(a->attn, qd, a->q, qd, kv->kc, kv->vc, kv->seq_stride, kv->seq, pos, T, nh, nkv,
                                      hd, scale, &o);
    else
        attention_causal_opts_forward_cpu(a->attn, a->q, a->k, a->v, cu_seqlens, nseq, nh, nkv, hd, scale, &o);
    matmul_forward_cpu(x, H, a->attn, qd, w->wo, T, H, qd, 1);
    bias_add_cpu(x, H, T, H, w->bo);
}

void attn_kv_cache_init(attn_kv_cache *k, const hf_config *c, int nseq, int max_len)
{
    k->nseq = nseq, k->max_len = max_len, k->kd = c->num_kv_heads * c->head_dim;
    size_t n = (size_t)c->num_layers * (size_t)nseq * (size_t)max_len * (size_t)k->kd;
    k->k = xmalloc((n ? n : 1) * sizeof *k->k);
    k->v = xmalloc((n ? n : 1) * sizeof *k->v);
}

void attn_kv_cache_free(attn_kv_cache *k)
{
    free(k->k);
    free(k->v);
    *k = (attn_kv_cache){0};
}

void attn_kv_cache_rows(const attn_kv_cache *k, int li, int seq, int past, const int32_t *seqs, attn_acts *a,
                        attn_kv_view *kv)
{
    const size_t seq_stride = (size_t)k->max_len * (size_t)k->kd;
    const size_t layer_off = (size_t)li * k->nseq * seq_stride;
    const size_t new_off = (size_t)seq * seq_stride + (size_t)past * (size_t)k->kd;
    a->k = k->k + layer_off + new_off, a->v = k->v + layer_off + new_off;
    *kv = (attn_kv_view){.kc = k->k + layer_off, .vc = k->v + layer_off, .seq_stride = seq_stride, .seq = seqs};
}
