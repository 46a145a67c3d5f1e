/* target_dense: the dense family (Qwen3, Llama: every layer RMSNorm, attention with optional q/k norm and full
 * RoPE, SwiGLU MLP) on the CPU, fp32: its row of the family table, its layers, and its part of a decoding cache
 * (the keys and values of every layer). The attention sub-layer is attn_block's, the cache attn_stack's (both shared
 * with the qwen3_moe and gpt_oss families), the MLP mlp_block's (shared with qwen3_moe's dense layers). The packed forward and decoding run the same layer function, attending within the packed
 * sequences or against the cache. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_block.h"
#include "attn_stack.h"
#include "mlp_block.h"
#include "rmsnorm.h"
#include "target_model_impl.h"

typedef struct dense_layer {
    attn_block attn;
    float *post_norm;                    /* (H) */
    mlp_block mlp;
} dense_layer;

/* The activations of a layer over T rows besides the residual stream x (T, H): the attention's (its u (T, H) is
 * the MLP's input too) and the MLP's. */
typedef struct dense_acts {
    attn_acts at;
    mlp_acts mlp;
} dense_acts;

/* Grow a to T rows (with k and v unless the rows' keys and values live in a cache). */
static void acts_reserve(void *acts, const hf_config *c, int T, int with_kv)
{
    dense_acts *a = acts;
    attn_acts_reserve(&a->at, c, T, with_kv);
    mlp_acts_reserve(&a->mlp, c, T);
}

static void acts_free(void *acts)
{
    dense_acts *a = acts;
    attn_acts_free(&a->at);
    mlp_acts_free(&a->mlp);
}

static int load_layer(const st_file *st, const hf_config *c, const char *prefix, int i, void *layer, errbuf *err)
{
    dense_layer *l = layer;
    char n[192];
    int64_t shape[1] = {c->hidden_size};
    int rc = attn_block_load(&l->attn, st, c, prefix, i, err);
    snprintf(n, sizeof n, "%slayers.%d.post_attention_layernorm.weight", prefix, i);
    if (!rc) rc = st_load_f32(st, n, &l->post_norm, 1, shape, NULL, err);
    if (!rc) rc = mlp_block_load(&l->mlp, st, c, prefix, i, err);
    return rc;
}

static void free_layer(void *layer)
{
    dense_layer *l = layer;
    attn_block_free(&l->attn);
    mlp_block_free(&l->mlp);
    XFREE(l->post_norm);
}

/* Decoder layer li over T rows x (T, H) at positions pos, in place; kv as attn_block's (cu_seqlens and nseq are
 * read only without one). */
static void target_dense_layer_cpu(const target_model *m, int li, float *x, void *acts, int T,
                                   const int32_t *pos, const int32_t *cu_seqlens, int nseq, const attn_kv_view *kv)
{
    dense_acts *a = acts;
    const hf_config *c = &m->cfg;
    const dense_layer *l = attn_stack_layer(m, li);
    const int H = c->hidden_size;
    attn_block_forward_cpu(&l->attn, c, m->inv_freq, x, &a->at, T, pos, cu_seqlens, nseq, kv);
    rmsnorm_forward_cpu(a->at.u, H, x, H, l->post_norm, T, H, (float)c->rms_eps);
    mlp_block_forward_cpu(&l->mlp, c, &a->mlp, x, a->at.u, T);
}

/* ---- the family's operations: attn_stack's, with this layer ---- */

static const attn_stack_ops dense_stack = {
    .layer_size = sizeof(dense_layer), .load_layer = load_layer, .free_layer = free_layer,
    .acts_size = sizeof(dense_acts), .reserve = acts_reserve, .free = acts_free, .layer = target_dense_layer_cpu,
};

static int dense_load(target_model *m, const st_file *st, const char *prefix, errbuf *err)
{
    return attn_stack_load(&dense_stack, m, st, prefix, err);
}

static const target_cpu_ops dense_cpu = {
    .load = dense_load, .destroy = attn_stack_destroy, .layer = attn_stack_layer_packed,
    .cache_new = attn_stack_cache_new,
    .cache_destroy = attn_stack_cache_destroy, .cache_layer = attn_stack_cache_layer,
    .cache_crop = attn_stack_cache_crop,
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
