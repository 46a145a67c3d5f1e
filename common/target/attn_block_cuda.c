/* attn_block_cuda: the Qwen3 / Llama attention sub-layer and its KV cache on CUDA; moved out of target_dense_cuda.c
 * so that the dense and qwen3_moe families run the one block. */
#include "attn_block_cuda.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "attention.h"
#include "bias_add.h"
#include "cuda_check.h"
#include "kv_attention.h"
#include "matmul.h"
#include "qk_norm_rope.h"
#include "rand_fill.h"
#include "rmsnorm.h"

void attn_cuda_layer_alloc(target_cuda *m, attn_cuda_layer *l)
{
    const hf_config *c = &m->cfg;
    const size_t H = (size_t)c->hidden_size, hd = (size_t)c->head_dim, qd = (size_t)c->num_heads * hd;
    const size_t kd = (size_t)c->num_kv_heads * hd;
    *l = (attn_cuda_layer){0};
    l->input_norm = target_cuda_alloc(m, H * 2);
    if (c->has_qk_norm) {
        l->q_norm = target_cuda_alloc(m, hd * 2);
        l->k_norm = target_cuda_alloc(m, hd * 2);
    }
    l->w_qkv = target_cuda_alloc(m, (qd + 2 * kd) * H * 2);
    l->w_o = target_cuda_alloc(m, H * qd * 2);
    if (c->attention_bias) {
        l->b_qkv = target_cuda_alloc(m, (qd + 2 * kd) * sizeof(float));
        l->b_o = target_cuda_alloc(m, H * sizeof(float));
    }
    if (c->attn_sinks) l->sinks = target_cuda_alloc(m, (size_t)c->num_heads * sizeof(float));
}

void attn_cuda_layer_free(attn_cuda_layer *l)
{
    void *p[] = {&l->input_norm, &l->q_norm, &l->k_norm, &l->w_qkv, &l->w_o, &l->b_qkv, &l->b_o, &l->sinks};
    for (size_t j = 0; j < sizeof p / sizeof p[0]; j++) target_cuda_free(p[j]);
}

/* A 1-d tensor of len values into fp32 device memory. */
static int upload_f32(const st_file *st, const char *name, float *dst, int64_t len, errbuf *err)
{
    float *f = NULL;
    int rc = st_load_f32(st, name, &f, 1, &len, NULL, err);
    if (!rc) CHECK_CUDA(cudaMemcpy(dst, f, sizeof(float) * (size_t)len, cudaMemcpyHostToDevice));
    free(f);
    return rc;
}

int attn_cuda_layer_load(target_cuda *m, attn_cuda_layer *l, const st_file *st, const char *prefix, int layer,
                         errbuf *err)
{
    const hf_config *c = &m->cfg;
    const int64_t H = c->hidden_size, hd = c->head_dim, qd = (int64_t)c->num_heads * hd;
    const int64_t kd = (int64_t)c->num_kv_heads * hd;
    char n[192];
    int rc = 0;
#define UP(dst, suffix, a, b)                                             \
    if (rc == 0) {                                                         \
        snprintf(n, sizeof n, "%slayers.%d.%s", prefix, layer, suffix);   \
        rc = target_cuda_upload_tensor(st, n, dst, a, b, err);             \
    }
    UP(l->input_norm, "input_layernorm.weight", H, 0);
    if (c->has_qk_norm) {
        UP(l->q_norm, "self_attn.q_norm.weight", hd, 0);
        UP(l->k_norm, "self_attn.k_norm.weight", hd, 0);
    }
    UP(l->w_qkv, "self_attn.q_proj.weight", qd, H);
    UP(l->w_qkv + qd * H, "self_attn.k_proj.weight", kd, H);
    UP(l->w_qkv + (qd + kd) * H, "self_attn.v_proj.weight", kd, H);
    UP(l->w_o, "self_attn.o_proj.weight", H, qd);
#undef UP
#define UPF(dst, suffix, len)                                             \
    if (rc == 0) {                                                         \
        snprintf(n, sizeof n, "%slayers.%d.%s", prefix, layer, suffix);   \
        rc = upload_f32(st, n, dst, len, err);                             \
    }
    if (c->attention_bias) {
        UPF(l->b_qkv, "self_attn.q_proj.bias", qd);
        UPF(l->b_qkv + qd, "self_attn.k_proj.bias", kd);
        UPF(l->b_qkv + qd + kd, "self_attn.v_proj.bias", kd);
        UPF(l->b_o, "self_attn.o_proj.bias", H);
    }
    if (c->attn_sinks) UPF(l->sinks, "self_attn.sinks", c->num_heads);
#undef UPF
    return rc;
}

void attn_cuda_layer_init_random(target_cuda *m, attn_cuda_layer *l, uint64_t *seed, float a)
{
    const hf_config *c = &m->cfg;
    const size_t H = (size_t)c->hidden_size, hd = (size_t)c->head_dim, qd = (size_t)c->num_heads * hd;
    const size_t kd = (size_t)c->num_kv_heads * hd;
    uint64_t s = *seed;
    rand_fill_bf16_cuda(l->input_norm, H, s++, 0.0f, 1.0f, m->stream);
    if (l->q_norm) rand_fill_bf16_cuda(l->q_norm, hd, s++, 0.0f, 1.0f, m->stream);
    if (l->k_norm) rand_fill_bf16_cuda(l->k_norm, hd, s++, 0.0f, 1.0f, m->stream);
    rand_fill_bf16_cuda(l->w_qkv, (qd + 2 * kd) * H, s++, a, 0.0f, m->stream);
    rand_fill_bf16_cuda(l->w_o, H * qd, s++, a, 0.0f, m->stream);
    if (l->b_qkv) CHECK_CUDA(cudaMemsetAsync(l->b_qkv, 0, (qd + 2 * kd) * sizeof(float), m->stream));
    if (l->b_o) CHECK_CUDA(cudaMemsetAsync(l->b_o, 0, H * sizeof(float), m->stream));
    if (l->sinks) CHECK_CUDA(cudaMemsetAsync(l->sinks, 0, (size_t)c->num_heads * sizeof(float), m->stream));
    *seed = s;
}

void attn_cuda_alloc(target_cuda *m, attn_cuda *w)
{
    const hf_config *c = &m->cfg;
    const size_t hd = (size_t)c->head_dim, qd = (size_t)c->num_heads * hd, kd = (size_t)c->num_kv_heads * hd;
    const size_t t = (size_t)m->max_tokens;
    w->qkv = target_cuda_alloc(m, t * (qd + 2 * kd) * 2);
    w->attn = target_cuda_alloc(m, t * qd * 2);
}

void attn_cuda_free(attn_cuda *w)
{
    target_cuda_free(&w->qkv);
    target_cuda_free(&w->attn);
}

/* The cache: layer li keys at kc[li], values at vc[li]. */
typedef struct attn_cuda_cache {
    uint16_t *kv;
    uint16_t **kc, **vc;         /* (nlayers) */
    size_t seq_stride;
    float *workspace;            /* kv_attention_workspace_bytes(max_step, nh, hd, max_len - 1) */
} attn_cuda_cache;

void attn_cuda_forward(target_cuda *m, const attn_cuda *w, const attn_cuda_layer *l, int li, const tc_rows *rows,
                       const tc_kv_cache *kv, const uint16_t *r, int ldr)
{
    const hf_config *c = &m->cfg;
    const int T = rows->T, H = c->hidden_size, hd = c->head_dim, nh = c->num_heads, nkv = c->num_kv_heads;
    const int qd = nh * hd, kd = nkv * hd, qkvw = qd + 2 * kd;
    const float eps = (float)c->rms_eps, scale = hf_attn_scale(c);
    cudaStream_t st = m->stream;
    const attn_cuda_cache *ca = kv ? kv->state : NULL;
    target_cuda_norm_linear(m, w->qkv, qkvw, m->u, r, ldr, l->input_norm, eps, l->w_qkv, T, qkvw, H);
    target_cuda_mark(m, TARGET_CUDA_MATMUL);
    bias_add_bf16_cuda(w->qkv, qkvw, T, qkvw, l->b_qkv, st);
    /* the packed causal attention may take q's norm and rotation itself (attention_qfold_applies: opt-in); then
     * qk_norm_rope does k only */
    const int packed = !kv || kv->packed;
    const attention_qfold fold = {l->q_norm, eps, rows->pos, m->d_inv_freq};
    const int qfold = packed && attention_qfold_applies(w->attn, qd, w->qkv, qkvw, w->qkv + qd, qkvw, w->qkv + qd + kd,
                                                        qkvw, hd, l->window, l->sinks);
    uint16_t *qn = qfold ? NULL : w->qkv;
    const int nhn = qfold ? 0 : nh;
    if (kv) /* norm, rotation and the cache's append of the rows' keys and values in one launch */
        qk_norm_rope_append_cuda(qn, qkvw, w->qkv + qd, qkvw, w->qkv + qd + kd, qkvw, T, nhn, nkv, hd, l->q_norm,
                                 l->k_norm, eps, rows->pos, m->d_inv_freq, ca->kc[li], ca->vc[li], ca->seq_stride,
                                 kv->seq, st);
    else
        qk_norm_rope_cuda(qn, qkvw, w->qkv + qd, qkvw, T, nhn, nkv, hd, l->q_norm, l->k_norm, eps, rows->pos,
                          m->d_inv_freq, st);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
    if (packed)
        attention_causal_qfold_forward_cuda(w->attn, qd, w->qkv, qkvw, w->qkv + qd, qkvw, w->qkv + qd + kd, qkvw,
                                            rows->cu, rows->nseq, rows->max_seqlen, nh, nkv, hd, scale, l->window,
                                            l->sinks, qfold ? &fold : NULL, st);
    else
        kv_attention_opts_forward_cuda(w->attn, qd, w->qkv, qkvw, ca->kc[li], ca->vc[li], ca->seq_stride, kv->seq,
                                       kv->pos, T, kv->max_pos, nh, nkv, hd, scale, l->window, l->sinks,
                                       ca->workspace, st);
    target_cuda_mark(m, TARGET_CUDA_ATTENTION);
    target_cuda_linear(m, m->x, H, r, ldr, 1.0f, w->attn, qd, l->w_o, T, H, qd);
    target_cuda_mark(m, TARGET_CUDA_MATMUL);
    bias_add_bf16_cuda(m->x, H, T, H, l->b_o, st);
}

int attn_cuda_cache_new(target_cuda *m, int nseq, int max_len, int max_step, void **state, size_t *bytes,
                        errbuf *err)
{
    const hf_config *c = &m->cfg;
    attn_cuda_cache *k = xcalloc(1, sizeof *k);
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
    CHECK_CUDA(cudaMemset(k->workspace, 0, ws)); /* kv_attention's counters start at zero */
    *bytes += kvb + ws;
    *state = k;
    return 0;
}

void attn_cuda_cache_destroy(void *state)
{
    attn_cuda_cache *k = state;
    CHECK_CUDA(cudaFree(k->kv));
    CHECK_CUDA(cudaFree(k->workspace));
    free(k->kc);
    free(k->vc);
    free(k);
}
