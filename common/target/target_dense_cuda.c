/* target_dense_cuda: the dense family (Qwen3, Llama) on one CUDA device. Per layer: the attention sub-layer
 * (attn_block_cuda: RMSNorm, one fused q|k|v GEMM, per-head q/k norm + RoPE, flash attention or, decoding,
 * flash-decoding against the cache, o_proj GEMM adding the residual), then RMSNorm, one fused gate|up GEMM, SwiGLU,
 * down_proj GEMM adding the residual. A tapped layer's down_proj writes its output (the residual stream) straight
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
#include "cuda_check.h"
#include "matmul.h"
#include "rand_fill.h"
#include "rmsnorm.h"
#include "target_model_cuda_impl.h"

typedef struct tc_layer {
    attn_cuda_layer attn;
    uint16_t *post_norm;              /* (H) */
    uint16_t *w_gu;                   /* (2 I, H): gate_proj | up_proj rows */
    uint16_t *w_down;                 /* (H, I) */
} tc_layer;

typedef struct dense_cuda {
    tc_layer *l;                      /* (nlayers) */
    attn_cuda aw;                     /* workspaces for max_tokens rows */
    uint16_t *gu, *act;
} dense_cuda;

static int dc_create(target_cuda *m, errbuf *err)
{
    (void)err;
    const hf_config *c = &m->cfg;
    size_t H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size, t = (size_t)m->max_tokens;
    dense_cuda *d = xcalloc(1, sizeof *d);
    m->layers = d;
    d->l = xcalloc((size_t)m->nlayers, sizeof *d->l);
    for (int i = 0; i < m->nlayers; i++) {
        tc_layer *l = &d->l[i];
        attn_cuda_layer_alloc(m, &l->attn);
        l->post_norm = target_cuda_alloc(m, H * 2);
        l->w_gu = target_cuda_alloc(m, 2 * I * H * 2);
        l->w_down = target_cuda_alloc(m, H * I * 2);
    }
    attn_cuda_alloc(m, &d->aw);
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
        attn_cuda_layer_free(&l->attn);
        void *p[] = {&l->post_norm, &l->w_gu, &l->w_down};
        for (size_t j = 0; j < sizeof p / sizeof p[0]; j++) target_cuda_free(p[j]);
    }
    free(d->l);
    attn_cuda_free(&d->aw);
    void *b[] = {&d->gu, &d->act};
    for (size_t j = 0; j < sizeof b / sizeof b[0]; j++) target_cuda_free(b[j]);
    free(d);
    m->layers = NULL;
}

static int dc_load(target_cuda *m, const st_file *st, const char *prefix, errbuf *err)
{
    const hf_config *c = &m->cfg;
    dense_cuda *d = m->layers;
    int64_t H = c->hidden_size, I = c->intermediate_size;
    char n[192];
    int rc = 0;
    for (int i = 0; !rc && i < m->nlayers; i++) {
        tc_layer *l = &d->l[i];
        rc = attn_cuda_layer_load(m, &l->attn, st, prefix, i, err);
#define UP(dst, suffix, a, b)                                           \
    if (rc == 0) {                                                       \
        snprintf(n, sizeof n, "%slayers.%d.%s", prefix, i, suffix);     \
        rc = target_cuda_upload_tensor(st, n, dst, a, b, err);           \
    }
        UP(l->post_norm, "post_attention_layernorm.weight", H, 0);
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
    size_t H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
    for (int i = 0; i < m->nlayers; i++) {
        tc_layer *l = &d->l[i];
        attn_cuda_layer_init_random(m, &l->attn, seed, a);
        uint64_t s = *seed;
        rand_fill_bf16_cuda(l->post_norm, H, s++, 0.0f, 1.0f, m->stream);
        rand_fill_bf16_cuda(l->w_gu, 2 * I * H, s++, a, 0.0f, m->stream);
        rand_fill_bf16_cuda(l->w_down, H * I, s++, a, 0.0f, m->stream);
        *seed = s;
    }
}

static void dc_layer(target_cuda *m, int li, const tc_rows *rows, const tc_kv_cache *kv, const uint16_t *r, int ldr,
                     uint16_t *dst, int ldd)
{
    const hf_config *c = &m->cfg;
    dense_cuda *d = m->layers;
    const tc_layer *l = &d->l[li];
    const int T = rows->T, H = c->hidden_size, I = c->intermediate_size;
    attn_cuda_forward(m, &d->aw, &l->attn, li, rows, kv, r, ldr);
    target_cuda_norm_linear_swiglu(m, d->act, I, d->gu, m->u, m->x, H, l->post_norm, (float)c->rms_eps, l->w_gu, T,
                                   I, H);
    target_cuda_linear(m, dst, ldd, m->x, H, 1.0f, d->act, I, l->w_down, T, H, I);
    target_cuda_mark(m, TARGET_CUDA_MATMUL);
}

const target_cuda_ops target_dense_cuda = {
    .create = dc_create, .destroy = dc_destroy, .load = dc_load, .init_random = dc_init_random, .layer = dc_layer,
    .cache_new = attn_cuda_cache_new, .cache_destroy = attn_cuda_cache_destroy, .cache_crop = NULL,
    .step_graph = 1, /* the attention block and the layers read the positions from the device */
};
