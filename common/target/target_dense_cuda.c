/* target_dense_cuda: the dense family (Qwen3, Llama) on one CUDA device. Per layer: the attention sub-layer
 * (attn_block_cuda: RMSNorm, one fused q|k|v GEMM, per-head q/k norm + RoPE, flash attention or, decoding,
 * flash-decoding against the cache, o_proj GEMM adding the residual), then the MLP sub-layer (mlp_block_cuda:
 * RMSNorm, one fused gate|up GEMM, SwiGLU, down_proj GEMM adding the residual). A tapped layer's down_proj writes its output (the residual stream) straight
 * into the tap column block of the caller's buffer (cuBLASLt C = residual, D = tap block), and the next layer reads
 * the residual from there: capture costs no kernel and no copy. Its part of a decoding cache is attn_block_cuda's
 * (every layer's keys and values). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "attn_block_cuda.h"
#include "mlp_block_cuda.h"
#include "rand_fill.h"
#include "target_model_cuda_impl.h"

typedef struct tc_layer {
    attn_cuda_layer attn;
    uint16_t *post_norm;              /* (H) */
    mlp_cuda_layer mlp;
} tc_layer;

typedef struct dense_cuda {
    tc_layer *l;                      /* (nlayers) */
    attn_cuda aw;                     /* workspaces for max_tokens rows */
    mlp_cuda mw;
} dense_cuda;

static int dc_create(target_cuda *m, errbuf *err)
{
    (void)err;
    const hf_config *c = &m->cfg;
    const size_t H = (size_t)c->hidden_size;
    dense_cuda *d = xcalloc(1, sizeof *d);
    m->layers = d;
    d->l = xcalloc((size_t)m->nlayers, sizeof *d->l);
    for (int i = 0; i < m->nlayers; i++) {
        tc_layer *l = &d->l[i];
        attn_cuda_layer_alloc(m, &l->attn);
        l->post_norm = target_cuda_alloc(m, H * 2);
        mlp_cuda_layer_alloc(m, &l->mlp);
    }
    attn_cuda_alloc(m, &d->aw);
    mlp_cuda_alloc(m, &d->mw);
    return 0;
}

static void dc_destroy(target_cuda *m)
{
    dense_cuda *d = m->layers;
    if (!d) return;
    for (int i = 0; d->l && i < m->nlayers; i++) {
        tc_layer *l = &d->l[i];
        attn_cuda_layer_free(&l->attn);
        target_cuda_free(&l->post_norm);
        mlp_cuda_layer_free(&l->mlp);
    }
    free(d->l);
    attn_cuda_free(&d->aw);
    mlp_cuda_free(&d->mw);
    free(d);
    m->layers = NULL;
}

static int dc_load(target_cuda *m, const st_file *st, const char *prefix, errbuf *err)
{
    const hf_config *c = &m->cfg;
    dense_cuda *d = m->layers;
    char n[192];
    int rc = 0;
    for (int i = 0; !rc && i < m->nlayers; i++) {
        tc_layer *l = &d->l[i];
        rc = attn_cuda_layer_load(m, &l->attn, st, prefix, i, err);
        snprintf(n, sizeof n, "%slayers.%d.post_attention_layernorm.weight", prefix, i);
        if (!rc) rc = target_cuda_upload_tensor(st, n, l->post_norm, c->hidden_size, 0, err);
        if (!rc) rc = mlp_cuda_layer_load(m, &l->mlp, st, prefix, i, err);
    }
    return rc;
}

static void dc_init_random(target_cuda *m, uint64_t *seed, float a)
{
    const hf_config *c = &m->cfg;
    dense_cuda *d = m->layers;
    for (int i = 0; i < m->nlayers; i++) {
        tc_layer *l = &d->l[i];
        attn_cuda_layer_init_random(m, &l->attn, seed, a);
        rand_fill_bf16_cuda(l->post_norm, (size_t)c->hidden_size, (*seed)++, 0.0f, 1.0f, m->stream);
        mlp_cuda_layer_init_random(m, &l->mlp, seed, a);
    }
}

static void dc_layer(target_cuda *m, int li, const tc_rows *rows, const tc_kv_cache *kv, const uint16_t *r, int ldr,
                     uint16_t *dst, int ldd)
{
    dense_cuda *d = m->layers;
    const tc_layer *l = &d->l[li];
    attn_cuda_forward(m, &d->aw, &l->attn, li, rows, kv, r, ldr);
    mlp_cuda_forward(m, &d->mw, &l->mlp, l->post_norm, rows->T, dst, ldd);
}

const target_cuda_ops target_dense_cuda = {
    .create = dc_create, .destroy = dc_destroy, .load = dc_load, .init_random = dc_init_random, .layer = dc_layer,
    .cache_new = attn_cuda_cache_new, .cache_destroy = attn_cuda_cache_destroy, .cache_crop = NULL,
    .step_graph = 1, /* the attention block and the layers read the positions from the device */
};
