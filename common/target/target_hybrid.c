/* target_hybrid: the hybrid family's decoder layers on the CPU, following transformers' modeling_qwen3_5(_moe).py and
 * modeling_qwen3_next.py (torch fallback paths); its part of a decoding cache; its row of the family table. */
#include "target_hybrid.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "causal_conv1d.h"
#include "gated_delta_prep.h"
#include "gated_delta_rule.h"
#include "gated_rmsnorm.h"
#include "kv_attention.h"
#include "matmul.h"
#include "mlp_block.h"
#include "moe_block.h"
#include "rmsnorm.h"
#include "rope.h"
#include "sigmoid_gate.h"
#include "target_model_impl.h"

typedef struct target_hybrid target_hybrid;
typedef struct target_hybrid_scratch target_hybrid_scratch;

/* A full-attention layer's cache: row t attends to keys [0, pos[t]] of sequence seq[t] of kc / vc (kv_attention's
 * layout). */
typedef struct hybrid_kv_view {
    const float *kc, *vc;
    size_t seq_stride;
    const int32_t *seq;
} hybrid_kv_view;

/* One sequence's decoding state at one layer (layer_decode). */
typedef struct hybrid_state {
    float *conv;        /* linear attention: (K-1, C) conv inputs of the rows before the new ones (C: 2HK*Dk+HV*Dv) */
    float *delta;       /* linear attention: (HV, Dk, Dv) the delta-rule state */
    float *k, *v;       /* full attention: the new rows' place in the cache, (n, nkv*hd) each */
    hybrid_kv_view kv;  /* full attention: the cache (kv.seq: (n) the sequence of each new row) */
} hybrid_state;

typedef struct hybrid_layer {
    int linear, moe;
    float *input_norm, *post_norm;          /* (H), as 1 + w */
    /* gated full attention */
    float *wq;                              /* (nh*2*hd, H): per head [q (hd) | gate (hd)] */
    float *wk, *wv, *wo;                    /* (nkv*hd, H) x2, (H, nh*hd) */
    float *q_norm, *k_norm;                 /* (hd), as 1 + w */
    /* Gated DeltaNet */
    float *w_qkv;                           /* (2*HK*Dk + HV*Dv, H): [q | k | v] */
    float *w_z;                             /* (HV*Dv, H) */
    float *w_b, *w_a;                       /* (HV, H) */
    float *conv;                            /* (2*HK*Dk + HV*Dv, Kc) depthwise */
    float *a_log, *dt_bias;                 /* (HV) */
    float *gnorm;                           /* (Dv), plain weight (RMSNormGated) */
    float *w_out;                           /* (H, HV*Dv) */
    mlp_block mlp;                          /* the dense MLP (layers without experts) */
    moe_block moe_w;                        /* the sparse MoE block (moe_block.h) */
} hybrid_layer;

enum { HB_U, HB_A, HB_B, HB_C, HB_D, HB_E, HB_N };

struct target_hybrid_scratch {
    size_t cap[HB_N];
    float *buf[HB_N];                       /* grown on demand */
    moe_scratch moe;                        /* the MoE block's */
};

struct target_hybrid {
    int nlayers;
    hybrid_layer *layers;
    target_hybrid_scratch scratch;          /* target_hybrid_layer_forward's */
};

static target_hybrid_scratch *target_hybrid_scratch_new(void) { return xcalloc(1, sizeof(target_hybrid_scratch)); }

static void scratch_free(target_hybrid_scratch *h)
{
    for (int i = 0; i < HB_N; i++) free(h->buf[i]);
    moe_scratch_free(&h->moe);
}

static void target_hybrid_scratch_destroy(target_hybrid_scratch **sp)
{
    if (!*sp) return;
    scratch_free(*sp);
    free(*sp);
    *sp = NULL;
}

static float *scratch(target_hybrid_scratch *h, int i, size_t n)
{
    if (h->cap[i] < n) {
        free(h->buf[i]);
        h->buf[i] = xmalloc(sizeof(float) * n);
        h->cap[i] = n;
    }
    return h->buf[i];
}

const char *target_hybrid_prefix(const st_file *st)
{
    return st_find(st, "model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
}

/* ---- loading ---- */

typedef struct loader {
    const st_file *st;
    const char *prefix;
    int layer;
    errbuf *err;
} loader;

static int ld_name(const loader *L, char *n, size_t cap, const char *suffix)
{
    return snprintf(n, cap, "%slayers.%d.%s", L->prefix, L->layer, suffix);
}

static int ld_has(const loader *L, const char *suffix)
{
    char n[256];
    ld_name(L, n, sizeof n, suffix);
    return st_find(L->st, n) != NULL;
}

/* Tensor `suffix` of the layer, shape (d0[, d1[, d2]]) (0 ends the shape). */
static int ld(const loader *L, const char *suffix, float **out, int64_t d0, int64_t d1, int64_t d2)
{
    char n[256];
    ld_name(L, n, sizeof n, suffix);
    int64_t shape[3] = {d0, d1, d2};
    int nd = d2 > 0 ? 3 : d1 > 0 ? 2 : 1;
    return st_load_f32(L->st, n, out, nd, shape, NULL, L->err);
}

static void add_one(float *w, int64_t n)
{
    for (int64_t i = 0; i < n; i++) w[i] += 1.0f;
}

/* Qwen3-Next's fused projections, per q/k head group g of r = HV/HK value heads:
 * in_proj_qkvz rows [q (Dk) | k (Dk) | v (r*Dv) | z (r*Dv)], in_proj_ba rows [b (r) | a (r)]
 * (transformers' fix_query_key_value_ordering). */
static int load_qwen3_next_proj(const loader *L, const hf_config *c, hybrid_layer *l)
{
    const int64_t H = c->hidden_size, HK = c->linear_num_k_heads, HV = c->linear_num_v_heads;
    const int64_t Dk = c->linear_k_head_dim, Dv = c->linear_v_head_dim, r = HV / HK;
    const int64_t grp = 2 * Dk + 2 * r * Dv, C = 2 * HK * Dk + HV * Dv;
    float *qkvz = NULL, *ba = NULL;
    int rc = ld(L, "linear_attn.in_proj_qkvz.weight", &qkvz, HK * grp, H, 0);
    if (!rc) rc = ld(L, "linear_attn.in_proj_ba.weight", &ba, HK * 2 * r, H, 0);
    if (rc) goto out;
    l->w_qkv = xmalloc(sizeof(float) * (size_t)(C * H));
    l->w_z = xmalloc(sizeof(float) * (size_t)(HV * Dv * H));
    l->w_b = xmalloc(sizeof(float) * (size_t)(HV * H));
    l->w_a = xmalloc(sizeof(float) * (size_t)(HV * H));
    const size_t row = sizeof(float) * (size_t)H;
    for (int64_t g = 0; g < HK; g++) {
        const float *src = qkvz + g * grp * H;
        memcpy(l->w_qkv + (g * Dk) * H, src, row * (size_t)Dk);
        memcpy(l->w_qkv + (HK * Dk + g * Dk) * H, src + Dk * H, row * (size_t)Dk);
        memcpy(l->w_qkv + (2 * HK * Dk + g * r * Dv) * H, src + 2 * Dk * H, row * (size_t)(r * Dv));
        memcpy(l->w_z + (g * r * Dv) * H, src + (2 * Dk + r * Dv) * H, row * (size_t)(r * Dv));
        const float *bsrc = ba + g * 2 * r * H;
        memcpy(l->w_b + (g * r) * H, bsrc, row * (size_t)r);
        memcpy(l->w_a + (g * r) * H, bsrc + r * H, row * (size_t)r);
    }
out:
    free(qkvz);
    free(ba);
    return rc;
}

static int load_linear_attn(const loader *L, const hf_config *c, hybrid_layer *l)
{
    const int64_t H = c->hidden_size, HK = c->linear_num_k_heads, HV = c->linear_num_v_heads;
    const int64_t Dk = c->linear_k_head_dim, Dv = c->linear_v_head_dim, C = 2 * HK * Dk + HV * Dv;
    int rc;
    if (ld_has(L, "linear_attn.in_proj_qkvz.weight")) {
        rc = load_qwen3_next_proj(L, c, l);
    } else {
        rc = ld(L, "linear_attn.in_proj_qkv.weight", &l->w_qkv, C, H, 0);
        if (!rc) rc = ld(L, "linear_attn.in_proj_z.weight", &l->w_z, HV * Dv, H, 0);
        if (!rc) rc = ld(L, "linear_attn.in_proj_b.weight", &l->w_b, HV, H, 0);
        if (!rc) rc = ld(L, "linear_attn.in_proj_a.weight", &l->w_a, HV, H, 0);
    }
    /* conv1d.weight is (C, 1, K) as nn.Conv1d stores it; some converters squeeze it to (C, K) */
    char n[256];
    ld_name(L, n, sizeof n, "linear_attn.conv1d.weight");
    const st_tensor *cw = st_find(L->st, n);
    int squeezed = cw && cw->ndim == 2;
    if (!rc) rc = ld(L, "linear_attn.conv1d.weight", &l->conv, C, squeezed ? c->linear_conv_kernel : 1,
                     squeezed ? 0 : c->linear_conv_kernel);
    if (!rc) rc = ld(L, "linear_attn.A_log", &l->a_log, HV, 0, 0);
    if (!rc) rc = ld(L, "linear_attn.dt_bias", &l->dt_bias, HV, 0, 0);
    if (!rc) rc = ld(L, "linear_attn.norm.weight", &l->gnorm, Dv, 0, 0);
    if (!rc) rc = ld(L, "linear_attn.out_proj.weight", &l->w_out, H, HV * Dv, 0);
    return rc;
}

static int load_full_attn(const loader *L, const hf_config *c, hybrid_layer *l)
{
    const int64_t H = c->hidden_size, hd = c->head_dim, nh = c->num_heads, nkv = c->num_kv_heads;
    int rc = ld(L, "self_attn.q_proj.weight", &l->wq, nh * 2 * hd, H, 0);
    if (!rc) rc = ld(L, "self_attn.k_proj.weight", &l->wk, nkv * hd, H, 0);
    if (!rc) rc = ld(L, "self_attn.v_proj.weight", &l->wv, nkv * hd, H, 0);
    if (!rc) rc = ld(L, "self_attn.o_proj.weight", &l->wo, H, nh * hd, 0);
    if (!rc) rc = ld(L, "self_attn.q_norm.weight", &l->q_norm, hd, 0, 0);
    if (!rc) rc = ld(L, "self_attn.k_norm.weight", &l->k_norm, hd, 0, 0);
    if (!rc) {
        add_one(l->q_norm, hd);
        add_one(l->k_norm, hd);
    }
    return rc;
}

static void free_layer(hybrid_layer *l)
{
    float **p[] = {&l->input_norm, &l->post_norm, &l->wq, &l->wk, &l->wv, &l->wo, &l->q_norm, &l->k_norm,
                   &l->w_qkv, &l->w_z, &l->w_b, &l->w_a, &l->conv, &l->a_log, &l->dt_bias, &l->gnorm,
                   &l->w_out};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) XFREE(*p[i]);
    moe_block_free(&l->moe_w);
    mlp_block_free(&l->mlp);
}

static void target_hybrid_destroy(target_hybrid **hp);

static int target_hybrid_load(target_hybrid **out, const st_file *st, const hf_config *c, const char *prefix,
                              int nlayers, errbuf *err)
{
    DF_ASSERT(c->is_hybrid && nlayers <= c->num_layers && nlayers <= HF_MAX_LAYERS);
    target_hybrid *h = xcalloc(1, sizeof *h);
    h->layers = xcalloc((size_t)nlayers, sizeof *h->layers);
    h->nlayers = nlayers;
    const int64_t H = c->hidden_size;
    int rc = 0;
    for (int i = 0; i < nlayers && !rc; i++) {
        hybrid_layer *l = &h->layers[i];
        loader L = {.st = st, .prefix = prefix, .layer = i, .err = err};
        l->linear = c->layer_linear[i];
        l->moe = c->num_experts > 0 && c->layer_moe[i];
        rc = ld(&L, "input_layernorm.weight", &l->input_norm, H, 0, 0);
        if (!rc) rc = ld(&L, "post_attention_layernorm.weight", &l->post_norm, H, 0, 0);
        if (!rc) {
            add_one(l->input_norm, H);
            add_one(l->post_norm, H);
            rc = l->linear ? load_linear_attn(&L, c, l) : load_full_attn(&L, c, l);
        }
        if (!rc && l->moe) rc = moe_block_load(&l->moe_w, st, c, prefix, i, err);
        else if (!rc) rc = mlp_block_load(&l->mlp, st, c, prefix, i, err);
    }
    if (rc) {
        target_hybrid_destroy(&h);
        return rc;
    }
    *out = h;
    return 0;
}

static void target_hybrid_destroy(target_hybrid **hp)
{
    target_hybrid *h = *hp;
    if (!h) return;
    for (int i = 0; i < h->nlayers; i++) free_layer(&h->layers[i]);
    free(h->layers);
    scratch_free(&h->scratch);
    free(h);
    *hp = NULL;
}

/* ---- forward ---- */

/* The token rows of one layer call: T rows at positions pos; packed sequences (cu_seqlens, nseq) when st is NULL,
 * else the new rows of one sequence continuing from its states st. */
typedef struct rows {
    int T, nseq;
    const int32_t *pos, *cu_seqlens;
    const hybrid_state *st;
} rows;

static void linear_attn_forward(target_hybrid_scratch *h, const hf_config *c, const hybrid_layer *l, float *x,
                                const float *u, const rows *b)
{
    const int T = b->T, H = c->hidden_size, HK = c->linear_num_k_heads, HV = c->linear_num_v_heads;
    const int Dk = c->linear_k_head_dim, Dv = c->linear_v_head_dim, K = c->linear_conv_kernel;
    const int C = 2 * HK * Dk + HV * Dv, VD = HV * Dv;
    const float eps = (float)c->rms_eps;
    float *mixed = scratch(h, HB_A, (size_t)T * C), *conv = scratch(h, HB_B, (size_t)T * C);
    float *z = scratch(h, HB_C, (size_t)T * VD), *ba = scratch(h, HB_D, (size_t)T * 2 * HV);
    float *core = scratch(h, HB_E, (size_t)T * VD);
    matmul_forward_cpu(mixed, C, u, H, l->w_qkv, T, C, H, 0);
    matmul_forward_cpu(z, VD, u, H, l->w_z, T, VD, H, 0);
    matmul_forward_cpu(ba, 2 * HV, u, H, l->w_b, T, HV, H, 0);         /* b in columns [0, HV) */
    matmul_forward_cpu(ba + HV, 2 * HV, u, H, l->w_a, T, HV, H, 0);    /* a in columns [HV, 2HV) */
    if (b->st) causal_conv1d_silu_state_cpu(conv, C, mixed, C, l->conv, C, K, T, b->st->conv);
    else causal_conv1d_silu_cpu(conv, C, mixed, C, l->conv, C, K, b->cu_seqlens, b->nseq);
    float *q = conv, *k = conv + HK * Dk, *v = conv + 2 * HK * Dk;
    /* q, k l2-normalised (q scaled by Dk^-1/2); beta = sigmoid(b) over the b columns, g over the a columns */
    gated_delta_prep_cpu(q, C, T, HK, Dk, ba, ba + HV, 2 * HV, ba, 2 * HV, ba + HV, 2 * HV, l->a_log, l->dt_bias, HV);
    if (b->st)
        gated_delta_rule_forward_state_cpu(core, VD, q, C, k, C, v, C, ba + HV, 2 * HV, ba, 2 * HV, T, HK, HV, Dk, Dv,
                                           b->st->delta);
    else
        gated_delta_rule_forward_cpu(core, VD, q, C, k, C, v, C, ba + HV, 2 * HV, ba, 2 * HV, b->cu_seqlens, b->nseq,
                                     HK, HV, Dk, Dv);
    /* RMSNormGated per (token, value head): w * rmsnorm(o) * silu(z) */
    gated_rmsnorm_cpu(core, VD, core, VD, z, VD, l->gnorm, T, HV, Dv, eps);
    matmul_forward_cpu(x, H, core, VD, l->w_out, T, H, VD, 1);
}

static void full_attn_forward(target_hybrid_scratch *h, const hf_config *c, const hybrid_layer *l, float *x,
                              const float *u, const rows *b, const double *inv_freq)
{
    const int T = b->T, H = c->hidden_size, hd = c->head_dim, nh = c->num_heads, nkv = c->num_kv_heads;
    const int qd = nh * hd, kd = nkv * hd, rd = c->rotary_dim;
    const float eps = (float)c->rms_eps;
    float *qg = scratch(h, HB_A, (size_t)T * 2 * qd), *q = scratch(h, HB_B, (size_t)T * qd);
    /* decoding computes the new rows' keys and values in place in the cache */
    float *k = b->st ? b->st->k : scratch(h, HB_C, (size_t)T * kd);
    float *v = b->st ? b->st->v : scratch(h, HB_D, (size_t)T * kd);
    float *attn = scratch(h, HB_E, (size_t)T * qd);
    matmul_forward_cpu(qg, 2 * qd, u, H, l->wq, T, 2 * qd, H, 0);
    matmul_forward_cpu(k, kd, u, H, l->wk, T, kd, H, 0);
    matmul_forward_cpu(v, kd, u, H, l->wv, T, kd, H, 0);
    /* q_proj's output viewed (T, nh, 2*hd) and chunked in two: q is the first hd of each head, the gate the second */
    for (int t = 0; t < T; t++)
        for (int hh = 0; hh < nh; hh++)
            memcpy(q + (size_t)t * qd + (size_t)hh * hd, qg + (size_t)t * 2 * qd + (size_t)hh * 2 * hd,
                   sizeof(float) * (size_t)hd);
    rmsnorm_forward_cpu(q, hd, q, hd, l->q_norm, T * nh, hd, eps);
    rmsnorm_forward_cpu(k, hd, k, hd, l->k_norm, T * nkv, hd, eps);
    /* partial RoPE: the first rotary_dim of each head, rotate-half within them (text positions: every mrope section
     * sees the same position, so it is plain RoPE) */
    for (int hh = 0; hh < nh; hh++) rope_apply_cpu(q + (size_t)hh * hd, qd, T, 1, rd, b->pos, inv_freq, 0);
    for (int hh = 0; hh < nkv; hh++) rope_apply_cpu(k + (size_t)hh * hd, kd, T, 1, rd, b->pos, inv_freq, 0);
    const float scale = 1.0f / sqrtf((float)hd);
    if (b->st)
        kv_attention_forward_cpu(attn, qd, q, qd, b->st->kv.kc, b->st->kv.vc, b->st->kv.seq_stride, b->st->kv.seq,
                                 b->pos, T, nh, nkv, hd, scale);
    else
        attention_causal_forward_cpu(attn, q, k, v, b->cu_seqlens, b->nseq, nh, nkv, hd, scale);
    /* output gate: row (t, head) of attn times sigmoid of that head's gate half of q_proj's output */
    sigmoid_gate_cpu(attn, hd, attn, hd, qg + hd, 2 * hd, T * nh, hd);
    matmul_forward_cpu(x, H, attn, qd, l->wo, T, H, qd, 1);
}

static void layer_forward(const target_hybrid *hy, target_hybrid_scratch *h, const hf_config *c, int li, float *x,
                          const rows *b, const double *inv_freq)
{
    DF_ASSERT(li >= 0 && li < hy->nlayers);
    const hybrid_layer *l = &hy->layers[li];
    const int T = b->T, H = c->hidden_size;
    const float eps = (float)c->rms_eps;
    float *u = scratch(h, HB_U, (size_t)T * H);
    rmsnorm_forward_cpu(u, H, x, H, l->input_norm, T, H, eps);
    if (l->linear) linear_attn_forward(h, c, l, x, u, b);
    else full_attn_forward(h, c, l, x, u, b, inv_freq);
    u = scratch(h, HB_U, (size_t)T * H);
    rmsnorm_forward_cpu(u, H, x, H, l->post_norm, T, H, eps);
    if (l->moe) {
        moe_block_forward_cpu(&l->moe_w, c, &h->moe, x, u, T);
    } else {
        const int I = c->intermediate_size;
        moe_swiglu_mlp_cpu(x, u, T, H, I, l->mlp.w_gate, l->mlp.w_up, l->mlp.w_down, scratch(h, HB_A, (size_t)T * I),
                           scratch(h, HB_B, (size_t)T * I));
    }
}

static void target_hybrid_layer_forward(target_hybrid *h, const hf_config *c, int li, float *x,
                                        const target_batch *b, const double *inv_freq)
{
    rows r = {.T = b->ntok, .nseq = b->nseq, .pos = b->positions, .cu_seqlens = b->cu_seqlens};
    layer_forward(h, &h->scratch, c, li, x, &r, inv_freq);
}

static int target_hybrid_layer_linear(const target_hybrid *h, int li)
{
    DF_ASSERT(li >= 0 && li < h->nlayers);
    return h->layers[li].linear;
}

/* Decoder layer li over the n new rows x (n, H) of one sequence at positions pos (n), continuing from st: a linear
 * layer reads and updates st->conv and st->delta, a full-attention layer writes the rows' keys and values at
 * st->k / st->v and attends through st->kv. Only reads h; s is the cache's scratch. */
static void target_hybrid_layer_decode(const target_hybrid *h, target_hybrid_scratch *s, const hf_config *c, int li,
                                       float *x, int n, const int32_t *pos, const double *inv_freq,
                                       const hybrid_state *st)
{
    DF_ASSERT(st && n >= 0);
    rows r = {.T = n, .pos = pos, .st = st};
    layer_forward(h, s, c, li, x, &r, inv_freq);
}

/* ---- the family's CPU operations ---- */

static int hy_load(target_model *m, const st_file *st, const char *prefix, errbuf *err)
{
    target_hybrid *h = NULL;
    int rc = target_hybrid_load(&h, st, &m->cfg, prefix, m->nlayers, err);
    m->layers = h;
    return rc;
}

static void hy_destroy(target_model *m)
{
    target_hybrid *h = m->layers;
    target_hybrid_destroy(&h);
    m->layers = NULL;
}

static void hy_layer(target_model *m, int li, float *x, const target_batch *b)
{
    target_hybrid_layer_forward(m->layers, &m->cfg, li, x, b, m->inv_freq);
}

/* Decoding: the full-attention layers' keys and values (nkvl, nseq, max_len, kd); per linear-attention layer and
 * sequence the conv history and the delta-rule state, and copies of both as they were before the sequence's last
 * forward, whose ids are kept: a crop within that forward restores the copies and re-runs its first tokens
 * (recomputing costs a forward of the kept tokens; keeping every token's delta state would cost HV*Dk*Dv floats per
 * token and layer). */
typedef struct hybrid_cache {
    int nseq, max_len, kd;
    int *slot;                      /* (nlayers) index of layer li among the full (or the linear) layers */
    int nlin, nkvl;                 /* linear layers; layers with keys and values */
    size_t conv_n, delta_n;         /* floats per (linear layer, sequence): (K-1)*C, HV*Dk*Dv */
    float *k, *v;
    float *conv, *delta;            /* (nlin, nseq, conv_n), (nlin, nseq, delta_n) */
    float *conv0, *delta0;          /* the same before the last forward */
    int *start;                     /* (nseq) position of the last forward's first token, -1 before any */
    int32_t *last_ids;              /* (nseq, max_len) its ids (len - start of them are still held) */
    target_hybrid_scratch *hs;
} hybrid_cache;

static void *hy_cache_new(const target_model *m, int nseq, int max_len)
{
    const hf_config *c = &m->cfg;
    hybrid_cache *ca = xcalloc(1, sizeof *ca);
    ca->nseq = nseq, ca->max_len = max_len, ca->kd = c->num_kv_heads * c->head_dim;
    const size_t C = 2 * (size_t)c->linear_num_k_heads * c->linear_k_head_dim +
                     (size_t)c->linear_num_v_heads * c->linear_v_head_dim;
    ca->conv_n = (size_t)(c->linear_conv_kernel - 1) * C;
    ca->delta_n = (size_t)c->linear_num_v_heads * c->linear_k_head_dim * c->linear_v_head_dim;
    ca->slot = xcalloc((size_t)c->num_layers, sizeof *ca->slot);
    for (int li = 0; li < c->num_layers; li++)
        ca->slot[li] = target_hybrid_layer_linear(m->layers, li) ? ca->nlin++ : ca->nkvl++;
    size_t nc = (size_t)ca->nlin * nseq * ca->conv_n, nd = (size_t)ca->nlin * nseq * ca->delta_n;
    ca->conv = xcalloc(nc ? nc : 1, sizeof(float));
    ca->conv0 = xcalloc(nc ? nc : 1, sizeof(float));
    ca->delta = xcalloc(nd ? nd : 1, sizeof(float));
    ca->delta0 = xcalloc(nd ? nd : 1, sizeof(float));
    ca->start = xmalloc((size_t)nseq * sizeof *ca->start);
    for (int s = 0; s < nseq; s++) ca->start[s] = -1;
    ca->last_ids = xmalloc((size_t)nseq * (size_t)max_len * sizeof *ca->last_ids);
    ca->hs = target_hybrid_scratch_new();
    size_t n = (size_t)ca->nkvl * (size_t)nseq * (size_t)max_len * (size_t)ca->kd;
    ca->k = xmalloc((n ? n : 1) * sizeof *ca->k);
    ca->v = xmalloc((n ? n : 1) * sizeof *ca->v);
    return ca;
}

static void hy_cache_destroy(void *cs)
{
    hybrid_cache *c = cs;
    float *bufs[] = {c->k, c->v, c->conv, c->delta, c->conv0, c->delta0};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(c->slot);
    free(c->start);
    free(c->last_ids);
    target_hybrid_scratch_destroy(&c->hs);
    free(c);
}

/* Linear layer slot's state of sequence seq in buf (conv, delta, or their copies). */
static float *lin_state(const hybrid_cache *ca, float *buf, size_t per, int slot, int seq)
{
    return buf + ((size_t)slot * (size_t)ca->nseq + (size_t)seq) * per;
}

/* Copy sequence seq's linear-attention states from (sc, sd) to (dc, dd). */
static void lin_states_copy(hybrid_cache *ca, int seq, float *dc, float *dd, float *sc, float *sd)
{
    for (int l = 0; l < ca->nlin; l++) {
        memcpy(lin_state(ca, dc, ca->conv_n, l, seq), lin_state(ca, sc, ca->conv_n, l, seq),
               sizeof(float) * ca->conv_n);
        memcpy(lin_state(ca, dd, ca->delta_n, l, seq), lin_state(ca, sd, ca->delta_n, l, seq),
               sizeof(float) * ca->delta_n);
    }
}

static void hy_cache_begin(void *cs, int seq, int past, const int32_t *ids, int n, int keep)
{
    hybrid_cache *ca = cs;
    if (!keep) return;
    lin_states_copy(ca, seq, ca->conv0, ca->delta0, ca->conv, ca->delta);
    ca->start[seq] = past;
    memcpy(ca->last_ids + (size_t)seq * (size_t)ca->max_len, ids, sizeof *ids * (size_t)n);
}

static void hy_cache_layer(void *cs, const target_model *m, int li, float *x, int seq, int past, int n,
                           const int32_t *pos, const int32_t *seqs)
{
    hybrid_cache *ca = cs;
    const int sl = ca->slot[li];
    hybrid_state st = {0};
    if (target_hybrid_layer_linear(m->layers, li)) {
        st.conv = lin_state(ca, ca->conv, ca->conv_n, sl, seq);
        st.delta = lin_state(ca, ca->delta, ca->delta_n, sl, seq);
    } else {
        const size_t seq_stride = (size_t)ca->max_len * (size_t)ca->kd;
        const size_t layer_off = (size_t)sl * ca->nseq * seq_stride;
        const size_t new_off = (size_t)seq * seq_stride + (size_t)past * (size_t)ca->kd;
        st.k = ca->k + layer_off + new_off, st.v = ca->v + layer_off + new_off;
        st.kv = (hybrid_kv_view){.kc = ca->k + layer_off, .vc = ca->v + layer_off, .seq_stride = seq_stride,
                                 .seq = seqs};
    }
    target_hybrid_layer_decode(m->layers, ca->hs, &m->cfg, li, x, n, pos, m->inv_freq, &st);
}

static int hy_cache_crop(void *cs, const target_model *m, int seq, int len, int held, int *rerun_from,
                         const int32_t **rerun_ids, errbuf *err)
{
    hybrid_cache *c = cs;
    *rerun_from = len;
    if (len == 0) { /* empty: the states of a sequence start */
        for (int l = 0; l < c->nlin; l++) {
            memset(lin_state(c, c->conv, c->conv_n, l, seq), 0, sizeof(float) * c->conv_n);
            memset(lin_state(c, c->delta, c->delta_n, l, seq), 0, sizeof(float) * c->delta_n);
        }
        c->start[seq] = -1;
        return 0;
    }
    if (len == held) return 0;
    const int start = c->start[seq];
    if (start < 0 || len < start)
        return errbuf_set(err, EINVAL, "crop: sequence %d of a hybrid target (%s): cannot go back to %d positions, "
                          "before the start (%d) of its last forward: the linear-attention states are kept for "
                          "that forward only", seq, m->cfg.model_type, len, start < 0 ? held : start);
    /* the states before the last forward, then its first len - start tokens again */
    lin_states_copy(c, seq, c->conv, c->delta, c->conv0, c->delta0);
    *rerun_from = start;
    *rerun_ids = c->last_ids + (size_t)seq * (size_t)c->max_len;
    return len - start;
}

static const target_cpu_ops hybrid_cpu = {
    .load = hy_load, .destroy = hy_destroy, .layer = hy_layer,
    .cache_new = hy_cache_new, .cache_destroy = hy_cache_destroy, .cache_begin = hy_cache_begin,
    .cache_layer = hy_cache_layer, .cache_crop = hy_cache_crop,
};

static int hy_takes(const hf_config *c) { return c->is_hybrid; }
static int hy_rope_dims(const hf_config *c) { return c->rotary_dim; } /* partial RoPE */

const target_family target_hybrid_family = {
    .name = "hybrid",
    .about = "the hybrid Qwen3.5 family of Gated DeltaNet targets (qwen3_5, qwen3_5_moe, qwen3_next)",
    .takes = hy_takes,
    .can = {[TARGET_BACKEND_CPU] = TARGET_CAN_FORWARD | TARGET_CAN_DECODE,
            [TARGET_BACKEND_CUDA] = TARGET_CAN_FORWARD | TARGET_CAN_DECODE},
    .prefix = target_hybrid_prefix,
    .norm_add = 1.0f, /* zero-centred RMSNorm: the scale is 1 + w */
    .rope_dims = hy_rope_dims,
    .cpu = &hybrid_cpu,
};
