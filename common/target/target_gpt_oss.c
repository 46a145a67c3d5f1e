/* target_gpt_oss: the gpt_oss family (gpt-oss-20b, gpt-oss-120b) on the CPU, fp32, following transformers'
 * modeling_gpt_oss.py: every layer the attention sub-layer (attn_block with its gpt_oss options: q/k/v/o biases, a
 * learned sink logit per head, the layer's sliding window from layer_types, no q/k norm; YaRN RoPE, whose attention
 * factor is in the logit scale), then post-attention RMSNorm and the MoE block (moe_block with its options: the
 * router's bias, top-k then softmax over the k, the experts' biases and the clamped SwiGLU); the experts read by
 * gptoss_experts (HF parameters or MXFP4 blocks + scales, dequantised at load). Its part of a decoding cache is every
 * layer's keys and values (attn_block's; a sliding layer reads only its window of them). Its row of the family table
 * is target_gpt_oss_family. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_block.h"
#include "attn_stack.h"
#include "gptoss_experts.h"
#include "moe_block.h"
#include "rmsnorm.h"
#include "target_model_impl.h"

typedef struct goss_layer {
    attn_block attn;
    float *post_norm;                    /* (H) */
    moe_block mb;
} goss_layer;

typedef struct goss_acts {
    attn_acts at;
    moe_scratch ms;
} goss_acts;

static void acts_reserve(void *acts, const hf_config *c, int T, int with_kv)
{
    goss_acts *a = acts;
    attn_acts_reserve(&a->at, c, T, with_kv); /* the MoE block grows its own scratch */
}

static void acts_free(void *acts)
{
    goss_acts *a = acts;
    attn_acts_free(&a->at);
    moe_scratch_free(&a->ms);
}

/* The MoE block of layer i: mlp.router.{weight,bias}, the experts (gptoss_experts). */
static int load_moe(const st_file *st, const hf_config *c, const char *prefix, int i, moe_block *b, errbuf *err)
{
    const int64_t H = c->hidden_size, E = c->num_experts, rs[2] = {E, H}, bs[1] = {E};
    char n[192];
    *b = (moe_block){0};
    snprintf(n, sizeof n, "%slayers.%d.mlp.router.weight", prefix, i);
    int rc = st_load_f32(st, n, &b->router, 2, rs, NULL, err);
    snprintf(n, sizeof n, "%slayers.%d.mlp.router.bias", prefix, i);
    if (!rc) rc = st_load_f32(st, n, &b->router_b, 1, bs, NULL, err);
    if (rc) return rc;
    gptoss_experts x;
    rc = gptoss_experts_load(&x, st, c, prefix, i, err);
    b->e_gate_up = x.gate_up, b->e_gate_up_b = x.gate_up_b, b->e_down = x.down, b->e_down_b = x.down_b;
    return rc;
}

static int load_layer(const st_file *st, const hf_config *c, const char *prefix, int i, void *layer, errbuf *err)
{
    goss_layer *l = layer;
    const int64_t H = c->hidden_size;
    char n[192];
    int rc = attn_block_load(&l->attn, st, c, prefix, i, err);
    if (!rc) {
        snprintf(n, sizeof n, "%slayers.%d.post_attention_layernorm.weight", prefix, i);
        rc = st_load_f32(st, n, &l->post_norm, 1, &H, NULL, err);
    }
    if (!rc) rc = load_moe(st, c, prefix, i, &l->mb, err);
    return rc;
}

static void free_layer(void *layer)
{
    goss_layer *l = layer;
    attn_block_free(&l->attn);
    moe_block_free(&l->mb);
    free(l->post_norm);
}

/* Decoder layer li over T rows x (T, H) at positions pos, in place; kv as attn_block's. */
static void goss_layer_cpu(const target_model *m, int li, float *x, void *acts, int T, const int32_t *pos,
                           const int32_t *cu_seqlens, int nseq, const attn_kv_view *kv)
{
    goss_acts *a = acts;
    const hf_config *c = &m->cfg;
    const goss_layer *l = attn_stack_layer(m, li);
    const int H = c->hidden_size;
    attn_block_forward_cpu(&l->attn, c, m->inv_freq, x, &a->at, T, pos, cu_seqlens, nseq, kv);
    rmsnorm_forward_cpu(a->at.u, H, x, H, l->post_norm, T, H, (float)c->rms_eps);
    moe_block_forward_cpu(&l->mb, c, &a->ms, x, a->at.u, T);
}

/* ---- the family's operations: attn_stack's, with this layer ---- */

static const attn_stack_ops goss_stack = {
    .layer_size = sizeof(goss_layer), .load_layer = load_layer, .free_layer = free_layer,
    .acts_size = sizeof(goss_acts), .reserve = acts_reserve, .free = acts_free, .layer = goss_layer_cpu,
};

static int goss_load(target_model *m, const st_file *st, const char *prefix, errbuf *err)
{
    return attn_stack_load(&goss_stack, m, st, prefix, err);
}

static const target_cpu_ops goss_cpu = {
    .load = goss_load, .destroy = attn_stack_destroy, .layer = attn_stack_layer_packed,
    .cache_new = attn_stack_cache_new,
    .cache_destroy = attn_stack_cache_destroy, .cache_layer = attn_stack_cache_layer,
    .cache_crop = attn_stack_cache_crop,
};

static int goss_takes(const hf_config *c) { return c->arch == HF_ARCH_GPT_OSS; }
static const char *goss_prefix(const st_file *st) { (void)st; return "model."; }
static int goss_rope_dims(const hf_config *c) { return c->head_dim; }

const target_family target_gpt_oss_family = {
    .name = "gpt_oss",
    .about = "gpt_oss targets (gpt-oss-20b, gpt-oss-120b)",
    .takes = goss_takes,
    .can = {[TARGET_BACKEND_CPU] = TARGET_CAN_FORWARD | TARGET_CAN_DECODE,
            [TARGET_BACKEND_CUDA] = TARGET_CAN_FORWARD | TARGET_CAN_DECODE},
    .prefix = goss_prefix,
    .norm_add = 0.0f,
    .rope_dims = goss_rope_dims,
    .cpu = &goss_cpu,
};
