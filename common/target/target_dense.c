/* target_dense: the dense family (Qwen3, Llama: every layer RMSNorm, attention with optional q/k norm and full
 * RoPE, SwiGLU MLP) on the CPU, fp32: its row of the family table, its layers, and its part of a decoding cache
 * (the keys and values of every layer). The attention sub-layer is attn_block's, the cache attn_stack's (both shared
 * with the qwen3_moe and gpt_oss families). The packed forward and decoding run the same layer function, attending within the packed
 * sequences or against the cache. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_block.h"
#include "attn_stack.h"
#include "matmul.h"
#include "rmsnorm.h"
#include "swiglu.h"
#include "target_model_impl.h"

typedef struct dense_layer {
    attn_block attn;
    float *post_norm;                    /* (H) */
    float *w_gate, *w_up, *w_down;       /* (I, H) x2, (H, I) */
} dense_layer;

/* The activations of a layer over T rows besides the residual stream x (T, H): the attention's (its u (T, H) is
 * the MLP's input too), gate and up (T, I). */
typedef struct dense_acts {
    attn_acts at;
    float *gate, *up;
    int rows;                            /* rows gate and up hold */
} dense_acts;

/* Grow a to T rows (with k and v unless the rows' keys and values live in a cache). */
static void acts_reserve(void *acts, const hf_config *c, int T, int with_kv)
{
    dense_acts *a = acts;
    attn_acts_reserve(&a->at, c, T, with_kv);
    if (T <= a->rows) return;
    size_t I = (size_t)c->intermediate_size, t = (size_t)T;
    free(a->gate);
    free(a->up);
    a->gate = xmalloc(t * I * sizeof(float));
    a->up = xmalloc(t * I * sizeof(float));
    a->rows = T;
}

static void acts_free(void *acts)
{
    dense_acts *a = acts;
    attn_acts_free(&a->at);
    free(a->gate);
    free(a->up);
    *a = (dense_acts){0};
}

static int load_tensor(const st_file *st, const char *name, float **out, int64_t d0, int64_t d1, errbuf *err)
{
    int64_t shape[2] = {d0, d1};
    return st_load_f32(st, name, out, d1 > 0 ? 2 : 1, shape, NULL, err);
}

static int load_layer(const st_file *st, const hf_config *c, const char *prefix, int i, void *layer, errbuf *err)
{
    dense_layer *l = layer;
    char n[192];
    int64_t H = c->hidden_size, I = c->intermediate_size;
    int rc = attn_block_load(&l->attn, st, c, prefix, i, err);
#define LOAD(field, suffix, a, b)                                                  \
    if (rc == 0) {                                                                  \
        snprintf(n, sizeof n, "%slayers.%d.%s", prefix, i, suffix);                \
        rc = load_tensor(st, n, &l->field, a, b, err);                              \
    }
    LOAD(post_norm, "post_attention_layernorm.weight", H, 0);
    LOAD(w_gate, "mlp.gate_proj.weight", I, H);
    LOAD(w_up, "mlp.up_proj.weight", I, H);
    LOAD(w_down, "mlp.down_proj.weight", H, I);
#undef LOAD
    return rc;
}

static void free_layer(void *layer)
{
    dense_layer *l = layer;
    attn_block_free(&l->attn);
    float **p[] = {&l->post_norm, &l->w_gate, &l->w_up, &l->w_down};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) XFREE(*p[i]);
}

/* Decoder layer li over T rows x (T, H) at positions pos, in place; kv as attn_block's (cu_seqlens and nseq are
 * read only without one). */
static void target_dense_layer_cpu(const target_model *m, int li, float *x, void *acts, int T,
                                   const int32_t *pos, const int32_t *cu_seqlens, int nseq, const attn_kv_view *kv)
{
    dense_acts *a = acts;
    const hf_config *c = &m->cfg;
    const dense_layer *l = attn_stack_layer(m, li);
    const int H = c->hidden_size, I = c->intermediate_size;
    const float eps = (float)c->rms_eps;
    attn_block_forward_cpu(&l->attn, c, m->inv_freq, x, &a->at, T, pos, cu_seqlens, nseq, kv);
    rmsnorm_forward_cpu(a->at.u, H, x, H, l->post_norm, T, H, eps);
    matmul_forward_cpu(a->gate, I, a->at.u, H, l->w_gate, T, I, H, 0);
    matmul_forward_cpu(a->up, I, a->at.u, H, l->w_up, T, I, H, 0);
    swiglu_forward_cpu(a->gate, a->gate, a->up, (size_t)T * (size_t)I);
    matmul_forward_cpu(x, H, a->gate, I, l->w_down, T, H, I, 1);
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
