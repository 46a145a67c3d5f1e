/* target_qwen3_moe_cuda: the qwen3_moe family on one CUDA device (its row of the CUDA operations), following
 * target_qwen3_moe.c (the CPU reference). Per layer: the Qwen3 attention sub-layer (attn_block_cuda, as the dense
 * family's), RMSNorm, then the sparse MoE block (moe_block_cuda: router GEMM in fp32, softmax + top-k with
 * norm_topk_prob, the rows grouped by expert on the device, grouped gate|up and down GEMMs, the weighted combine
 * adding the residual; no shared expert) or, on the layers hf_config's layer_moe leaves dense, the dense MLP
 * sub-layer (mlp_block_cuda, the norm included). A layer's last kernel writes the residual stream straight into the tap
 * block / last buffer. Its part of a decoding cache is attn_block_cuda's (every layer's keys and values). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "attn_block_cuda.h"
#include "mlp_block_cuda.h"
#include "moe_block_cuda.h"
#include "rand_fill.h"
#include "rmsnorm.h"
#include "target_model_cuda_impl.h"

typedef struct qmc_layer {
    attn_cuda_layer attn;
    uint16_t *post_norm;              /* (H) */
    int moe;
    moe_cuda_layer mw;                /* the sparse block */
    mlp_cuda_layer mlp;               /* the dense MLP */
} qmc_layer;

typedef struct qmoe_cuda {
    qmc_layer *l;                     /* (nlayers) */
    attn_cuda aw;                     /* workspaces for max_tokens rows */
    mlp_cuda mlpw;                    /* the dense MLP's workspaces; NULL without dense layers */
    moe_cuda_shape ms;
    moe_cuda *moe;                    /* NULL without MoE layers */
} qmoe_cuda;

static int qmc_create(target_cuda *m, errbuf *err)
{
    const hf_config *c = &m->cfg;
    const moe_cuda_shape ms = moe_cuda_shape_of(c);
    if (moe_cuda_check(&ms, err)) return -EINVAL;
    const size_t H = (size_t)c->hidden_size;
    qmoe_cuda *d = xcalloc(1, sizeof *d);
    m->layers = d;
    d->ms = ms;
    d->l = xcalloc((size_t)m->nlayers, sizeof *d->l);
    int any_dense = 0, any_moe = 0;
    for (int i = 0; i < m->nlayers; i++) {
        qmc_layer *l = &d->l[i];
        l->moe = c->layer_moe[i];
        any_dense |= !l->moe, any_moe |= l->moe;
        attn_cuda_layer_alloc(m, &l->attn);
        l->post_norm = target_cuda_alloc(m, H * 2);
        if (l->moe) {
            moe_cuda_layer_alloc(m, &ms, &l->mw);
        } else {
            mlp_cuda_layer_alloc(m, &l->mlp);
        }
    }
    attn_cuda_alloc(m, &d->aw);
    if (any_dense) mlp_cuda_alloc(m, &d->mlpw);
    if (any_moe) d->moe = moe_cuda_create(m, &ms, m->max_tokens);
    return 0;
}

static void qmc_destroy(target_cuda *m)
{
    qmoe_cuda *d = m->layers;
    if (!d) return;
    for (int i = 0; d->l && i < m->nlayers; i++) {
        qmc_layer *l = &d->l[i];
        attn_cuda_layer_free(&l->attn);
        moe_cuda_layer_free(&l->mw);
        target_cuda_free(&l->post_norm);
        mlp_cuda_layer_free(&l->mlp);
    }
    free(d->l);
    attn_cuda_free(&d->aw);
    mlp_cuda_free(&d->mlpw);
    moe_cuda_destroy(&d->moe);
    free(d);
    m->layers = NULL;
}

static int qmc_load(target_cuda *m, const st_file *st, const char *prefix, errbuf *err)
{
    const hf_config *c = &m->cfg;
    qmoe_cuda *d = m->layers;
    char n[192];
    int rc = 0;
    for (int i = 0; !rc && i < m->nlayers; i++) {
        qmc_layer *l = &d->l[i];
        rc = attn_cuda_layer_load(m, &l->attn, st, prefix, i, err);
        snprintf(n, sizeof n, "%slayers.%d.post_attention_layernorm.weight", prefix, i);
        if (!rc) rc = target_cuda_upload_tensor(st, n, l->post_norm, c->hidden_size, 0, err);
        if (!rc && l->moe) {
            snprintf(n, sizeof n, "%slayers.%d.mlp.", prefix, i);
            rc = moe_cuda_layer_load(&d->ms, &l->mw, st, n, err);
        } else if (!rc) {
            rc = mlp_cuda_layer_load(m, &l->mlp, st, prefix, i, err);
        }
    }
    return rc;
}

static void qmc_init_random(target_cuda *m, uint64_t *seed, float a)
{
    const hf_config *c = &m->cfg;
    qmoe_cuda *d = m->layers;
    const size_t H = (size_t)c->hidden_size;
    for (int i = 0; i < m->nlayers; i++) {
        qmc_layer *l = &d->l[i];
        attn_cuda_layer_init_random(m, &l->attn, seed, a);
        rand_fill_bf16_cuda(l->post_norm, H, (*seed)++, 0.0f, 1.0f, m->stream);
        if (l->moe) {
            moe_cuda_layer_init_random(m, &d->ms, &l->mw, seed, a);
        } else {
            mlp_cuda_layer_init_random(m, &l->mlp, seed, a);
        }
    }
}

static void qmc_layer_forward(target_cuda *m, int li, const tc_rows *rows, const tc_kv_cache *kv, const uint16_t *r,
                              int ldr, uint16_t *dst, int ldd)
{
    const hf_config *c = &m->cfg;
    qmoe_cuda *d = m->layers;
    const qmc_layer *l = &d->l[li];
    const int T = rows->T, H = c->hidden_size;
    attn_cuda_forward(m, &d->aw, &l->attn, li, rows, kv, r, ldr);
    if (!l->moe) {
        mlp_cuda_forward(m, &d->mlpw, &l->mlp, l->post_norm, T, dst, ldd);
        return;
    }
    rmsnorm_forward_cuda(m->u, H, m->x, H, l->post_norm, T, H, (float)c->rms_eps, m->stream);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
    moe_cuda_forward(m, d->moe, &l->mw, T, m->u, H, m->x, H, dst, ldd);
}

const target_cuda_ops target_qwen3_moe_cuda = {
    .create = qmc_create, .destroy = qmc_destroy, .load = qmc_load, .init_random = qmc_init_random,
    .layer = qmc_layer_forward, .cache_new = attn_cuda_cache_new, .cache_destroy = attn_cuda_cache_destroy,
    .cache_crop = NULL,
    .step_graph = 1, /* the attention block and the layers read the positions from the device */
};
