/* target_dense: the dense family (Qwen3, Llama: every layer RMSNorm, attention with optional q/k norm and full
 * RoPE, SwiGLU MLP) on the CPU, fp32: its row of the family table, its layers, and its part of a decoding cache
 * (the keys and values of every layer). The packed forward and decoding run the same layer function, attending
 * within the packed sequences or against the cache. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "kv_attention.h"
#include "matmul.h"
#include "rmsnorm.h"
#include "rope.h"
#include "swiglu.h"
#include "target_model_impl.h"

typedef struct dense_layer {
    float *input_norm, *post_norm;       /* (H) */
    float *q_norm, *k_norm;              /* (hd), Qwen3 only */
    float *wq, *wk, *wv, *wo;            /* (nh*hd, H), (nkv*hd, H) x2, (H, nh*hd) */
    float *w_gate, *w_up, *w_down;       /* (I, H) x2, (H, I) */
} dense_layer;

/* The activations of a layer over T rows besides the residual stream x (T, H): u (T, H), q and attn (T, nh*hd),
 * k and v (T, nkv*hd; or rows of a KV cache), gate and up (T, I). */
typedef struct dense_acts {
    float *u, *q, *k, *v, *attn, *gate, *up;
    int rows;                            /* rows they hold */
} dense_acts;

typedef struct dense_layers {
    int n;
    dense_layer *l;                      /* (n) */
    dense_acts act;                      /* the packed forward's */
} dense_layers;

/* Grow a to T rows (with k and v unless the rows' keys and values live in a cache). */
static void acts_reserve(dense_acts *a, const hf_config *c, int T, int with_kv)
{
    if (T <= a->rows) return;
    size_t H = (size_t)c->hidden_size, qd = (size_t)c->num_heads * (size_t)c->head_dim;
    size_t kd = (size_t)c->num_kv_heads * (size_t)c->head_dim, I = (size_t)c->intermediate_size, t = (size_t)T;
    float **bufs[] = {&a->u, &a->q, &a->attn, &a->gate, &a->up, &a->k, &a->v};
    size_t sizes[] = {t * H, t * qd, t * qd, t * I, t * I, t * kd, t * kd};
    size_t n = with_kv ? 7 : 5;
    for (size_t i = 0; i < n; i++) {
        free(*bufs[i]);
        *bufs[i] = xmalloc(sizes[i] * sizeof(float));
    }
    a->rows = T;
}

static void acts_free(dense_acts *a)
{
    float *bufs[] = {a->u, a->q, a->attn, a->gate, a->up, a->k, a->v};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    *a = (dense_acts){0};
}

static int load_tensor(const st_file *st, const char *name, float **out, int64_t d0, int64_t d1, errbuf *err)
{
    int64_t shape[2] = {d0, d1};
    return st_load_f32(st, name, out, d1 > 0 ? 2 : 1, shape, NULL, err);
}

static int load_layer(const st_file *st, const hf_config *c, const char *prefix, int i, dense_layer *l, errbuf *err)
{
    char n[192];
    int64_t H = c->hidden_size, hd = c->head_dim, qd = (int64_t)c->num_heads * hd, kd = (int64_t)c->num_kv_heads * hd;
    int64_t I = c->intermediate_size;
    int rc = 0;
#define LOAD(field, suffix, a, b)                                                  \
    if (rc == 0) {                                                                  \
        snprintf(n, sizeof n, "%slayers.%d.%s", prefix, i, suffix);                \
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

static void free_layer(dense_layer *l)
{
    float **p[] = {&l->input_norm, &l->post_norm, &l->q_norm, &l->k_norm, &l->wq, &l->wk,
                   &l->wv, &l->wo, &l->w_gate, &l->w_up, &l->w_down};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) XFREE(*p[i]);
}

static void dense_destroy(target_model *m)
{
    dense_layers *d = m->layers;
    if (!d) return;
    for (int i = 0; i < d->n; i++) free_layer(&d->l[i]);
    free(d->l);
    acts_free(&d->act);
    free(d);
    m->layers = NULL;
}

static int dense_load(target_model *m, const st_file *st, const char *prefix, errbuf *err)
{
    dense_layers *d = xcalloc(1, sizeof *d);
    m->layers = d;
    d->l = xcalloc((size_t)m->nlayers, sizeof *d->l);
    d->n = m->nlayers;
    for (int i = 0; i < m->nlayers; i++) {
        int rc = load_layer(st, &m->cfg, prefix, i, &d->l[i], err);
        if (rc) return rc; /* the caller destroys the model */
    }
    return 0;
}

/* Where a layer's attention finds its keys and values. NULL: within each sequence of the packed rows (cu_seqlens),
 * from a->k / a->v. A cache: a->k / a->v point at the new rows' place in it (the layer computes them there), and
 * row t attends to keys [0, pos[t]] of sequence seq[t] of kc / vc (kv_attention's layout). */
typedef struct kv_view {
    const float *kc, *vc;
    size_t seq_stride;
    const int32_t *seq;
} kv_view;

/* Decoder layer li over T rows x (T, H) at positions pos, in place; kv as above (cu_seqlens and nseq are read only
 * without one). */
static void target_dense_layer_cpu(const target_model *m, int li, float *x, const dense_acts *a, int T,
                                   const int32_t *pos, const int32_t *cu_seqlens, int nseq, const kv_view *kv)
{
    const hf_config *c = &m->cfg;
    const dense_layer *l = &((const dense_layers *)m->layers)->l[li];
    const int H = c->hidden_size, hd = c->head_dim, nh = c->num_heads, nkv = c->num_kv_heads;
    const int qd = nh * hd, kd = nkv * hd, I = c->intermediate_size;
    const float eps = (float)c->rms_eps, scale = 1.0f / sqrtf((float)hd);
    rmsnorm_forward_cpu(a->u, H, x, H, l->input_norm, T, H, eps);
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
    matmul_forward_cpu(x, H, a->attn, qd, l->wo, T, H, qd, 1);
    rmsnorm_forward_cpu(a->u, H, x, H, l->post_norm, T, H, eps);
    matmul_forward_cpu(a->gate, I, a->u, H, l->w_gate, T, I, H, 0);
    matmul_forward_cpu(a->up, I, a->u, H, l->w_up, T, I, H, 0);
    swiglu_forward_cpu(a->gate, a->gate, a->up, (size_t)T * (size_t)I);
    matmul_forward_cpu(x, H, a->gate, I, l->w_down, T, H, I, 1);
}

static void dense_layer_packed(target_model *m, int li, float *x, const target_batch *b)
{
    dense_layers *d = m->layers;
    acts_reserve(&d->act, &m->cfg, b->ntok, 1);
    target_dense_layer_cpu(m, li, x, &d->act, b->ntok, b->positions, b->cu_seqlens, b->nseq, NULL);
}

/* ---- decoding: every layer's keys and values, (nlayers, nseq, max_len, kd), post q/k norm and RoPE ---- */

typedef struct dense_cache {
    int nseq, max_len, kd;
    float *k, *v;
    dense_acts act;                      /* a forward's rows (their k and v are in the cache) */
} dense_cache;

static void *dense_cache_new(const target_model *m, int nseq, int max_len)
{
    const hf_config *c = &m->cfg;
    dense_cache *k = xcalloc(1, sizeof *k);
    k->nseq = nseq, k->max_len = max_len, k->kd = c->num_kv_heads * c->head_dim;
    size_t n = (size_t)c->num_layers * (size_t)nseq * (size_t)max_len * (size_t)k->kd;
    k->k = xmalloc((n ? n : 1) * sizeof *k->k);
    k->v = xmalloc((n ? n : 1) * sizeof *k->v);
    return k;
}

static void dense_cache_destroy(void *cs)
{
    dense_cache *k = cs;
    free(k->k);
    free(k->v);
    acts_free(&k->act);
    free(k);
}

static void dense_cache_layer(void *cs, const target_model *m, int li, float *x, int seq, int past, int n,
                              const int32_t *pos, const int32_t *seqs)
{
    dense_cache *k = cs;
    acts_reserve(&k->act, &m->cfg, n, 0);
    const size_t seq_stride = (size_t)k->max_len * (size_t)k->kd;
    const size_t layer_off = (size_t)li * k->nseq * seq_stride;
    const size_t new_off = (size_t)seq * seq_stride + (size_t)past * (size_t)k->kd;
    /* the new rows' keys and values are computed in place in the cache (no separate append) */
    dense_acts a = k->act;
    a.k = k->k + layer_off + new_off, a.v = k->v + layer_off + new_off;
    kv_view kv = {.kc = k->k + layer_off, .vc = k->v + layer_off, .seq_stride = seq_stride, .seq = seqs};
    target_dense_layer_cpu(m, li, x, &a, n, pos, NULL, 0, &kv);
}

static int dense_cache_crop(void *cs, const target_model *m, int seq, int len, int held, int *rerun_from,
                            const int32_t **rerun_ids, errbuf *err)
{
    (void)cs, (void)m, (void)seq, (void)held, (void)rerun_ids, (void)err;
    *rerun_from = len; /* the keys and values past len are simply overwritten later */
    return 0;
}

static const target_cpu_ops dense_cpu = {
    .load = dense_load, .destroy = dense_destroy, .layer = dense_layer_packed,
    .cache_new = dense_cache_new, .cache_destroy = dense_cache_destroy, .cache_layer = dense_cache_layer, .cache_crop = dense_cache_crop,
};

static int dense_takes(const hf_config *c) { return !c->is_hybrid && (c->arch == HF_ARCH_QWEN3 || c->arch == HF_ARCH_LLAMA); }
static const char *dense_prefix(const st_file *st) { (void)st; return "model."; }
static int dense_rope_dims(const hf_config *c) { return c->head_dim; }

const target_family target_dense_family = {
    .name = "dense",
    .about = "qwen3 and llama targets",
    .takes = dense_takes,
    .can = {[TARGET_BACKEND_CPU] = TARGET_CAN_FORWARD | TARGET_CAN_DECODE,
            [TARGET_BACKEND_CUDA] = TARGET_CAN_FORWARD | TARGET_CAN_DECODE},
    .prefix = dense_prefix,
    .norm_add = 0.0f,
    .rope_dims = dense_rope_dims,
    .cpu = &dense_cpu,
};
