/* target_dense_cuda: the dense family (Qwen3, Llama) on one CUDA device. Per layer: RMSNorm, one fused q|k|v GEMM,
 * per-head q/k norm + RoPE, flash attention (or, decoding, the rows' keys and values appended to the cache and
 * flash-decoding against it), o_proj GEMM whose epilogue adds the residual (beta = 1), RMSNorm, one fused gate|up
 * GEMM, SwiGLU, down_proj GEMM adding the residual. A tapped layer's down_proj writes its output (the residual
 * stream) straight into the tap column block of the caller's buffer (cuBLASLt C = residual, D = tap block), and the
 * next layer reads the residual from there: capture costs no kernel and no copy. Its part of a decoding cache: one
 * device allocation, per layer keys then values, each (nseq, max_len, nkv*hd) bf16. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "attention.h"
#include "cuda_check.h"
#include "kv_attention.h"
#include "matmul.h"
#include "qk_norm_rope.h"
#include "rand_fill.h"
#include "rmsnorm.h"
#include "swiglu.h"
#include "target_model_cuda_impl.h"

typedef struct tc_layer {
    uint16_t *input_norm, *post_norm; /* (H) */
    uint16_t *q_norm, *k_norm;        /* (hd), Qwen3 only */
    uint16_t *w_qkv;                  /* (qd + 2 kd, H): q_proj | k_proj | v_proj rows */
    uint16_t *w_o;                    /* (H, qd) */
    uint16_t *w_gu;                   /* (2 I, H): gate_proj | up_proj rows */
    uint16_t *w_down;                 /* (H, I) */
} tc_layer;

typedef struct dense_cuda {
    tc_layer *l;                      /* (nlayers) */
    uint16_t *qkv, *attn, *gu, *act;  /* workspaces for max_tokens rows */
} dense_cuda;

static int dc_create(target_cuda *m, errbuf *err)
{
    (void)err;
    const hf_config *c = &m->cfg;
    size_t H = (size_t)c->hidden_size, hd = (size_t)c->head_dim, qd = (size_t)c->num_heads * hd;
    size_t kd = (size_t)c->num_kv_heads * hd, I = (size_t)c->intermediate_size, t = (size_t)m->max_tokens;
    dense_cuda *d = xcalloc(1, sizeof *d);
    m->layers = d;
    d->l = xcalloc((size_t)m->nlayers, sizeof *d->l);
    for (int i = 0; i < m->nlayers; i++) {
        tc_layer *l = &d->l[i];
        l->input_norm = target_cuda_alloc(m, H * 2);
        l->post_norm = target_cuda_alloc(m, H * 2);
        if (c->has_qk_norm) {
            l->q_norm = target_cuda_alloc(m, hd * 2);
            l->k_norm = target_cuda_alloc(m, hd * 2);
        }
        l->w_qkv = target_cuda_alloc(m, (qd + 2 * kd) * H * 2);
        l->w_o = target_cuda_alloc(m, H * qd * 2);
        l->w_gu = target_cuda_alloc(m, 2 * I * H * 2);
        l->w_down = target_cuda_alloc(m, H * I * 2);
    }
    d->qkv = target_cuda_alloc(m, t * (qd + 2 * kd) * 2);
    d->attn = target_cuda_alloc(m, t * qd * 2);
    d->gu = target_cuda_alloc(m, t * 2 * I * 2);
    d->act = target_cuda_alloc(m, t * I * 2);
    return 0;
}

static void dc_destroy(target_cuda *m)
{
    dense_cuda *d = m->layers;
    if (!d) return;
    for (int i = 0; d->l && i < m->nlayers; i++) {
        tc_layer *l = &d->l[i];
        void *p[] = {&l->input_norm, &l->post_norm, &l->q_norm, &l->k_norm, &l->w_qkv, &l->w_o, &l->w_gu,
                     &l->w_down};
        for (size_t j = 0; j < sizeof p / sizeof p[0]; j++) target_cuda_free(p[j]);
    }
    free(d->l);
    void *b[] = {&d->qkv, &d->attn, &d->gu, &d->act};
    for (size_t j = 0; j < sizeof b / sizeof b[0]; j++) target_cuda_free(b[j]);
    free(d);
    m->layers = NULL;
}

static int dc_load(target_cuda *m, const st_file *st, const char *prefix, errbuf *err)
{
    const hf_config *c = &m->cfg;
    dense_cuda *d = m->layers;
    int64_t H = c->hidden_size, hd = c->head_dim, qd = (int64_t)c->num_heads * hd, kd = (int64_t)c->num_kv_heads * hd;
    int64_t I = c->intermediate_size;
    char n[192];
    int rc = 0;
    for (int i = 0; !rc && i < m->nlayers; i++) {
        tc_layer *l = &d->l[i];
#define UP(dst, suffix, a, b)                                           \
    if (rc == 0) {                                                       \
        snprintf(n, sizeof n, "%slayers.%d.%s", prefix, i, suffix);     \
        rc = target_cuda_upload_tensor(st, n, dst, a, b, err);           \
    }
        UP(l->input_norm, "input_layernorm.weight", H, 0);
        UP(l->post_norm, "post_attention_layernorm.weight", H, 0);
        if (c->has_qk_norm) {
            UP(l->q_norm, "self_attn.q_norm.weight", hd, 0);
            UP(l->k_norm, "self_attn.k_norm.weight", hd, 0);
        }
        UP(l->w_qkv, "self_attn.q_proj.weight", qd, H);
        UP(l->w_qkv + qd * H, "self_attn.k_proj.weight", kd, H);
        UP(l->w_qkv + (qd + kd) * H, "self_attn.v_proj.weight", kd, H);
        UP(l->w_o, "self_attn.o_proj.weight", H, qd);
        UP(l->w_gu, "mlp.gate_proj.weight", I, H);
        UP(l->w_gu + I * H, "mlp.up_proj.weight", I, H);
        UP(l->w_down, "mlp.down_proj.weight", H, I);
#undef UP
    }
    return rc;
}

static void dc_init_random(target_cuda *m, uint64_t *seed, float a)
{
    const hf_config *c = &m->cfg;
    dense_cuda *d = m->layers;
    size_t H = (size_t)c->hidden_size, hd = (size_t)c->head_dim;
    size_t qd = (size_t)c->num_heads * hd, kd = (size_t)c->num_kv_heads * hd, I = (size_t)c->intermediate_size;
    uint64_t s = *seed;
    for (int i = 0; i < m->nlayers; i++) {
        tc_layer *l = &d->l[i];
        rand_fill_bf16_cuda(l->input_norm, H, s++, 0.0f, 1.0f, m->stream);
        rand_fill_bf16_cuda(l->post_norm, H, s++, 0.0f, 1.0f, m->stream);
        if (l->q_norm) rand_fill_bf16_cuda(l->q_norm, hd, s++, 0.0f, 1.0f, m->stream);
        if (l->k_norm) rand_fill_bf16_cuda(l->k_norm, hd, s++, 0.0f, 1.0f, m->stream);
        rand_fill_bf16_cuda(l->w_qkv, (qd + 2 * kd) * H, s++, a, 0.0f, m->stream);
        rand_fill_bf16_cuda(l->w_o, H * qd, s++, a, 0.0f, m->stream);
        rand_fill_bf16_cuda(l->w_gu, 2 * I * H, s++, a, 0.0f, m->stream);
        rand_fill_bf16_cuda(l->w_down, H * I, s++, a, 0.0f, m->stream);
    }
    *seed = s;
}

/* The family's part of a decoding cache. */
typedef struct dc_cache {
    uint16_t *kv;                /* the cache: layer li keys at kc[li], values at vc[li] */
    uint16_t **kc, **vc;         /* (nlayers) */
    size_t seq_stride;
    float *workspace;            /* kv_attention_workspace_bytes(max_step, nh, hd, max_len - 1) */
} dc_cache;

static void dc_layer(target_cuda *m, int li, const tc_rows *rows, const tc_kv_cache *kv, const uint16_t *r, int ldr,
                     uint16_t *dst, int ldd)
{
    const hf_config *c = &m->cfg;
    dense_cuda *d = m->layers;
    const tc_layer *l = &d->l[li];
    const int T = rows->T, H = c->hidden_size, hd = c->head_dim, nh = c->num_heads, nkv = c->num_kv_heads;
    const int qd = nh * hd, kd = nkv * hd, I = c->intermediate_size, qkvw = qd + 2 * kd;
    const float eps = (float)c->rms_eps, scale = 1.0f / sqrtf((float)hd);
    cudaStream_t st = m->stream;
    const dc_cache *ca = kv ? kv->state : NULL;
    rmsnorm_forward_cuda(m->u, H, r, ldr, l->input_norm, T, H, eps, st);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
    matmul_forward_cuda(m->mm, d->qkv, qkvw, NULL, 0, 0.0f, m->u, H, l->w_qkv, T, qkvw, H, st);
    target_cuda_mark(m, TARGET_CUDA_MATMUL);
    qk_norm_rope_cuda(d->qkv, qkvw, d->qkv + qd, qkvw, T, nh, nkv, hd, l->q_norm, l->k_norm, eps, rows->pos,
                      m->d_inv_freq, st);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
    if (kv)
        kv_cache_append_cuda(ca->kc[li], ca->vc[li], ca->seq_stride, d->qkv + qd, qkvw, d->qkv + qd + kd, qkvw,
                             kv->seq, kv->pos, T, kd, st);
    if (!kv || kv->packed)
        attention_causal_forward_cuda(d->attn, qd, d->qkv, qkvw, d->qkv + qd, qkvw, d->qkv + qd + kd, qkvw, rows->cu,
                                      rows->nseq, rows->max_seqlen, nh, nkv, hd, scale, st);
    else
        kv_attention_forward_cuda(d->attn, qd, d->qkv, qkvw, ca->kc[li], ca->vc[li], ca->seq_stride, kv->seq,
                                  kv->pos, T, kv->max_pos, nh, nkv, hd, scale, ca->workspace, st);
    target_cuda_mark(m, TARGET_CUDA_ATTENTION);
    matmul_forward_cuda(m->mm, m->x, H, r, ldr, 1.0f, d->attn, qd, l->w_o, T, H, qd, st);
    target_cuda_mark(m, TARGET_CUDA_MATMUL);
    rmsnorm_forward_cuda(m->u, H, m->x, H, l->post_norm, T, H, eps, st);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
    matmul_forward_cuda(m->mm, d->gu, 2 * I, NULL, 0, 0.0f, m->u, H, l->w_gu, T, 2 * I, H, st);
    target_cuda_mark(m, TARGET_CUDA_MATMUL);
    swiglu_forward_cuda(d->act, I, d->gu, 2 * I, T, I, st);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
    matmul_forward_cuda(m->mm, dst, ldd, m->x, H, 1.0f, d->act, I, l->w_down, T, H, I, st);
    target_cuda_mark(m, TARGET_CUDA_MATMUL);
}

static int dc_cache_new(target_cuda *m, int nseq, int max_len, int max_step, void **state, size_t *bytes,
                        errbuf *err)
{
    const hf_config *c = &m->cfg;
    dc_cache *k = xcalloc(1, sizeof *k);
    const size_t kd = (size_t)c->num_kv_heads * (size_t)c->head_dim, L = (size_t)m->nlayers;
    k->seq_stride = (size_t)max_len * kd;
    const size_t per = (size_t)nseq * k->seq_stride, kvb = L * 2 * per * 2;
    cudaError_t e = cudaMalloc((void **)&k->kv, kvb);
    if (e != cudaSuccess) {
        free(k);
        return errbuf_set(err, ENOMEM, "KV cache of %d sequences x %d positions: %.2f GiB of device memory: %s", nseq,
                          max_len, (double)kvb / (1 << 30), cudaGetErrorString(e));
    }
    k->kc = xmalloc(L * sizeof *k->kc);
    k->vc = xmalloc(L * sizeof *k->vc);
    for (size_t li = 0; li < L; li++) k->kc[li] = k->kv + 2 * li * per, k->vc[li] = k->kv + (2 * li + 1) * per;
    size_t ws = kv_attention_workspace_bytes(max_step, c->num_heads, c->head_dim, max_len - 1);
    CHECK_CUDA(cudaMalloc((void **)&k->workspace, ws));
    *bytes += kvb + ws;
    *state = k;
    return 0;
}

static void dc_cache_destroy(void *state)
{
    dc_cache *k = state;
    CHECK_CUDA(cudaFree(k->kv));
    CHECK_CUDA(cudaFree(k->workspace));
    free(k->kc);
    free(k->vc);
    free(k);
}

const target_cuda_ops target_dense_cuda = {
    .create = dc_create, .destroy = dc_destroy, .load = dc_load, .init_random = dc_init_random, .layer = dc_layer,
    .cache_new = dc_cache_new, .cache_destroy = dc_cache_destroy, .cache_crop = NULL,
};
