/* target_qwen3_moe: the qwen3_moe family (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B) on the CPU, fp32, following
 * transformers' modeling_qwen3_moe.py: every layer the Qwen3 attention sub-layer (attn_block: q/k norm, GQA, full
 * RoPE), then post-attention RMSNorm and either the sparse MoE block (moe_block: softmax router, top-k with
 * norm_topk_prob, SwiGLU experts, no shared expert) or, on the layers mlp_only_layers names and where
 * (i+1) % decoder_sparse_step != 0 (hf_config's layer_moe), a dense SwiGLU MLP of intermediate_size. Its part of a
 * decoding cache is every layer's keys and values (attn_block's). Its row of the family table is
 * target_qwen3_moe_family. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_block.h"
#include "attn_stack.h"
#include "mlp_block.h"
#include "moe_block.h"
#include "rmsnorm.h"
#include "target_model_impl.h"

typedef struct qmoe_layer {
    attn_block attn;
    float *post_norm;                    /* (H) */
    int moe;                             /* the sparse block (else the dense MLP) */
    moe_block mb;
    mlp_block mlp;                       /* the dense MLP */
} qmoe_layer;

/* A layer's activations over T rows besides the residual stream: the attention's (its u is the MLP's input), the
 * dense MLP's, the MoE block's scratch. */
typedef struct qmoe_acts {
    attn_acts at;
    mlp_acts mlp;
    moe_scratch ms;
} qmoe_acts;

static void acts_reserve(void *acts, const hf_config *c, int T, int with_kv)
{
    qmoe_acts *a = acts;
    attn_acts_reserve(&a->at, c, T, with_kv);
    mlp_acts_reserve(&a->mlp, c, T);
}

static void acts_free(void *acts)
{
    qmoe_acts *a = acts;
    attn_acts_free(&a->at);
    mlp_acts_free(&a->mlp);
    moe_scratch_free(&a->ms);
}

static int load_layer(const st_file *st, const hf_config *c, const char *prefix, int i, void *layer, errbuf *err)
{
    qmoe_layer *l = layer;
    int64_t shape[1] = {c->hidden_size};
    char n[192];
    int rc = attn_block_load(&l->attn, st, c, prefix, i, err);
    l->moe = c->layer_moe[i];
    snprintf(n, sizeof n, "%slayers.%d.post_attention_layernorm.weight", prefix, i);
    if (!rc) rc = st_load_f32(st, n, &l->post_norm, 1, shape, NULL, err);
    if (!rc) rc = l->moe ? moe_block_load(&l->mb, st, c, prefix, i, err) : mlp_block_load(&l->mlp, st, c, prefix, i, err);
    return rc;
}

static void free_layer(void *layer)
{
    qmoe_layer *l = layer;
    attn_block_free(&l->attn);
    moe_block_free(&l->mb);
    mlp_block_free(&l->mlp);
    XFREE(l->post_norm);
}

/* Decoder layer li over T rows x (T, H) at positions pos, in place; kv as attn_block's. */
static void qmoe_layer_cpu(const target_model *m, int li, float *x, void *acts, int T, const int32_t *pos,
                           const int32_t *cu_seqlens, int nseq, const attn_kv_view *kv)
{
    qmoe_acts *a = acts;
    const hf_config *c = &m->cfg;
    const qmoe_layer *l = attn_stack_layer(m, li);
    const int H = c->hidden_size;
    attn_block_forward_cpu(&l->attn, c, m->inv_freq, x, &a->at, T, pos, cu_seqlens, nseq, kv);
    rmsnorm_forward_cpu(a->at.u, H, x, H, l->post_norm, T, H, (float)c->rms_eps);
    if (l->moe)
        moe_block_forward_cpu(&l->mb, c, &a->ms, x, a->at.u, T);
    else
        mlp_block_forward_cpu(&l->mlp, c, &a->mlp, x, a->at.u, T);
}

/* ---- the family's operations: attn_stack's, with this layer ---- */

static const attn_stack_ops qmoe_stack = {
    .layer_size = sizeof(qmoe_layer), .load_layer = load_layer, .free_layer = free_layer,
    .acts_size = sizeof(qmoe_acts), .reserve = acts_reserve, .free = acts_free, .layer = qmoe_layer_cpu,
};

static int qmoe_load(target_model *m, const st_file *st, const char *prefix, errbuf *err)
{
    return attn_stack_load(&qmoe_stack, m, st, prefix, err);
}

static const target_cpu_ops qmoe_cpu = {
    .load = qmoe_load, .destroy = attn_stack_destroy, .layer = attn_stack_layer_packed,
    .cache_new = attn_stack_cache_new,
    .cache_destroy = attn_stack_cache_destroy, .cache_layer = attn_stack_cache_layer,
    .cache_crop = attn_stack_cache_crop,
};

static int qmoe_takes(const hf_config *c) { return c->arch == HF_ARCH_QWEN3_MOE; }
static const char *qmoe_prefix(const st_file *st) { (void)st; return "model."; }
static int qmoe_rope_dims(const hf_config *c) { return c->head_dim; }

const target_family target_qwen3_moe_family = {
    .name = "qwen3_moe",
    .about = "qwen3_moe targets (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B)",
    .takes = qmoe_takes,
    .can = {[TARGET_BACKEND_CPU] = TARGET_CAN_FORWARD | TARGET_CAN_DECODE,
            [TARGET_BACKEND_CUDA] = TARGET_CAN_FORWARD | TARGET_CAN_DECODE},
    .prefix = qmoe_prefix,
    .norm_add = 0.0f,
    .rope_dims = qmoe_rope_dims,
    .cpu = &qmoe_cpu,
};
