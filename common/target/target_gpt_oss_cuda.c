/* target_gpt_oss_cuda: the gpt_oss family on one CUDA device (its row of the CUDA operations), following
 * target_gpt_oss.c (the CPU reference). Per layer: the attention sub-layer (attn_block_cuda with its gpt_oss options:
 * q|k|v and o biases, sink logits, the layer's sliding window; YaRN's attention factor in the logit scale), RMSNorm,
 * then the MoE block (moe_block_cuda with its options: the router's bias, top-k then softmax over the k as
 * norm_topk_prob, the experts' biases and the clamped SwiGLU in the grouped GEMMs' epilogues), its weighted combine
 * adding the residual. The experts come from gptoss_experts (HF parameters or MXFP4 blocks + scales, dequantised on
 * the host) as bf16. Its part of a decoding cache is attn_block_cuda's (every layer's keys and values; a sliding
 * layer reads its window of them). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "attn_block_cuda.h"
#include "cuda_check.h"
#include "gptoss_experts.h"
#include "moe_block_cuda.h"
#include "rand_fill.h"
#include "rmsnorm.h"
#include "target_model_cuda_impl.h"

typedef struct goc_layer {
    attn_cuda_layer attn;
    uint16_t *post_norm;              /* (H) */
    moe_cuda_layer mw;
} goc_layer;

typedef struct goss_cuda {
    goc_layer *l;                     /* (nlayers) */
    attn_cuda aw;                     /* workspaces for max_tokens rows */
    moe_cuda_shape ms;
    moe_cuda *moe;
} goss_cuda;

static int goc_create(target_cuda *m, errbuf *err)
{
    const hf_config *c = &m->cfg;
    const moe_cuda_shape ms = moe_cuda_shape_of(c);
    if (moe_cuda_check(&ms, err)) return -EINVAL;
    goss_cuda *d = xcalloc(1, sizeof *d);
    m->layers = d;
    d->ms = ms;
    d->l = xcalloc((size_t)m->nlayers, sizeof *d->l);
    for (int i = 0; i < m->nlayers; i++) {
        goc_layer *l = &d->l[i];
        attn_cuda_layer_alloc(m, &l->attn);
        l->attn.window = hf_layer_window(c, i);
        l->post_norm = target_cuda_alloc(m, (size_t)c->hidden_size * 2);
        moe_cuda_layer_alloc(m, &ms, &l->mw);
    }
    attn_cuda_alloc(m, &d->aw);
    d->moe = moe_cuda_create(m, &ms, m->max_tokens);
    return 0;
}

static void goc_destroy(target_cuda *m)
{
    goss_cuda *d = m->layers;
    if (!d) return;
    for (int i = 0; d->l && i < m->nlayers; i++) {
        attn_cuda_layer_free(&d->l[i].attn);
        moe_cuda_layer_free(&d->l[i].mw);
        target_cuda_free(&d->l[i].post_norm);
    }
    free(d->l);
    attn_cuda_free(&d->aw);
    moe_cuda_destroy(&d->moe);
    free(d);
    m->layers = NULL;
}

/* n fp32 host values to fp32 device memory. */
static void put_f32(float *dst, const float *src, size_t n)
{
    CHECK_CUDA(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyHostToDevice));
}

/* Layer i's MoE block: mlp.router.{weight,bias}, the experts (gptoss_experts). */
static int load_moe(target_cuda *m, const st_file *st, const char *prefix, int i, moe_cuda_layer *w, errbuf *err)
{
    const hf_config *c = &m->cfg;
    const int64_t H = c->hidden_size, E = c->num_experts, I = c->moe_intermediate_size;
    char n[192];
    snprintf(n, sizeof n, "%slayers.%d.mlp.router.weight", prefix, i);
    int rc = target_cuda_upload_tensor(st, n, w->router, E, H, err);
    if (rc) return rc;
    float *rb = NULL;
    snprintf(n, sizeof n, "%slayers.%d.mlp.router.bias", prefix, i);
    if ((rc = st_load_f32(st, n, &rb, 1, &E, NULL, err))) return rc;
    put_f32(w->router_b, rb, (size_t)E);
    free(rb);
    gptoss_experts x;
    rc = gptoss_experts_load(&x, st, c, prefix, i, err);
    if (!rc) {
        target_cuda_put(w->e_gu, x.gate_up, (size_t)(E * 2 * I * H), 0.0f);
        target_cuda_put(w->e_down, x.down, (size_t)(E * H * I), 0.0f);
        put_f32(w->e_gu_b, x.gate_up_b, (size_t)(E * 2 * I));
        put_f32(w->e_down_b, x.down_b, (size_t)(E * H));
    }
    gptoss_experts_free(&x);
    return rc;
}

static int goc_load(target_cuda *m, const st_file *st, const char *prefix, errbuf *err)
{
    const hf_config *c = &m->cfg;
    goss_cuda *d = m->layers;
    char n[192];
    int rc = 0;
    for (int i = 0; !rc && i < m->nlayers; i++) {
        goc_layer *l = &d->l[i];
        rc = attn_cuda_layer_load(m, &l->attn, st, prefix, i, err);
        snprintf(n, sizeof n, "%slayers.%d.post_attention_layernorm.weight", prefix, i);
        if (!rc) rc = target_cuda_upload_tensor(st, n, l->post_norm, c->hidden_size, 0, err);
        if (!rc) rc = load_moe(m, st, prefix, i, &l->mw, err);
    }
    return rc;
}

static void goc_init_random(target_cuda *m, uint64_t *seed, float a)
{
    goss_cuda *d = m->layers;
    for (int i = 0; i < m->nlayers; i++) {
        goc_layer *l = &d->l[i];
        attn_cuda_layer_init_random(m, &l->attn, seed, a);
        rand_fill_bf16_cuda(l->post_norm, (size_t)m->cfg.hidden_size, (*seed)++, 0.0f, 1.0f, m->stream);
        moe_cuda_layer_init_random(m, &d->ms, &l->mw, seed, a);
    }
}

static void goc_layer_forward(target_cuda *m, int li, const tc_rows *rows, const tc_kv_cache *kv, const uint16_t *r,
                              int ldr, uint16_t *dst, int ldd)
{
    const hf_config *c = &m->cfg;
    goss_cuda *d = m->layers;
    const goc_layer *l = &d->l[li];
    const int T = rows->T, H = c->hidden_size;
    attn_cuda_forward(m, &d->aw, &l->attn, li, rows, kv, r, ldr);
    rmsnorm_forward_cuda(m->u, H, m->x, H, l->post_norm, T, H, (float)c->rms_eps, m->stream);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
    moe_cuda_forward(m, d->moe, &l->mw, T, m->u, H, m->x, H, dst, ldd);
}

const target_cuda_ops target_gpt_oss_cuda = {
    .create = goc_create, .destroy = goc_destroy, .load = goc_load, .init_random = goc_init_random,
    .layer = goc_layer_forward, .cache_new = attn_cuda_cache_new, .cache_destroy = attn_cuda_cache_destroy,
    .cache_crop = NULL,
    .step_graph = 1, /* as qwen3_moe's: the attention block (window, sinks) and the layers read the positions from
                      * the device */
};
