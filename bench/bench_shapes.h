/* The target shapes the benchmarks run on, one row per --family (random weights, nothing downloaded): the shape's
 * config (bench/<shape>.h), its full depth, the words the banner prints and the parameters a token uses (non-embedding,
 * as torch counts them: the layers and the final norm; on MoE layers the router and the experts a token is routed to).
 * A benchmark picks its row with bench_shape_find(--family) in one place; a new family's shape is one new row.
 * Attention FLOPs are not here: bench_attention_flops_tok counts them from the config for every family alike (the
 * softmax-attention layers, each over its sliding window when it has one). */
#ifndef DFLASH_BENCH_SHAPES_H
#define DFLASH_BENCH_SHAPES_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "gpt_oss_20b.h"
#include "util.h"
#include "hf_config.h"
#include "qwen35_9b.h"
#include "qwen35_a3b.h"
#include "qwen3_30b_a3b.h"
#include "qwen3_8b.h"

typedef struct bench_shape {
    const char *family;                                        /* --family */
    const char *about;                                         /* the banner's words */
    int layers;                                                /* the shape's full depth */
    /* cfg for `layers` layers (<= the full depth) and vocabulary `vocab` (0: the shape's); 0, or -1 with err */
    int (*config)(hf_config *cfg, int layers, int vocab, errbuf *err);
    double (*params_tok)(const hf_config *cfg);                /* non-embedding parameters a token uses */
} bench_shape;

/* ---- the parameters a token uses, per family ---- */

/* attention projections (q, k, v, o) and the two norms of a Qwen3-style layer, q/k norms included */
static inline double bench_attn_params(const hf_config *c)
{
    const double H = c->hidden_size, hd = c->head_dim, qd = c->num_heads * hd, kd = c->num_kv_heads * hd;
    return qd * H + 2 * kd * H + H * qd + 2 * H + 2 * hd;
}

static inline double bench_dense_params(const hf_config *c) /* qwen3, llama; qwen3_moe's MoE layers add theirs */
{
    const double H = c->hidden_size, I = c->intermediate_size;
    double p = H;
    for (int i = 0; i < c->num_layers; i++)
        p += bench_attn_params(c) +
             (c->layer_moe[i] ? c->num_experts * H + 3 * H * c->moe_intermediate_size * c->num_experts_per_tok
                              : 3 * H * I);
    return p;
}

static inline double bench_hybrid_params(const hf_config *c) /* qwen3_5(_moe): gated q_proj, Gated DeltaNet layers */
{
    const double H = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    const double qd = c->num_heads * hd, kd = c->num_kv_heads * hd;
    const double C = 2.0 * c->linear_num_k_heads * c->linear_k_head_dim +
                     (double)c->linear_num_v_heads * c->linear_v_head_dim;
    const double VD = (double)c->linear_num_v_heads * c->linear_v_head_dim, HV = c->linear_num_v_heads;
    /* the MLP's parameters a token uses: dense, or the router (+ shared gate), K routed and the shared expert */
    const double Is = c->shared_expert_intermediate_size;
    const double mlp = c->num_experts > 0 ? (c->num_experts + (Is > 0)) * H +
                                                3 * H * c->moe_intermediate_size * c->num_experts_per_tok + 3 * H * Is
                                          : 3 * H * I;
    const double lin = (C + VD + 2 * HV) * H + C * c->linear_conv_kernel + H * VD + 2 * HV + c->linear_v_head_dim +
                       mlp + 2 * H;
    const double full = 2 * qd * H + 2 * kd * H + H * qd + mlp + 2 * H + 2 * hd;
    double p = H;
    for (int i = 0; i < c->num_layers; i++) p += c->layer_linear[i] ? lin : full;
    return p;
}

static inline double bench_gpt_oss_params(const hf_config *c) /* biases, sinks, router with bias, K experts */
{
    const double H = c->hidden_size, hd = c->head_dim, qd = c->num_heads * hd, kd = c->num_kv_heads * hd;
    const double E = c->num_experts, K = c->num_experts_per_tok, Ie = c->moe_intermediate_size;
    const double layer = qd * H + 2 * kd * H + H * qd + qd + 2 * kd + H + c->num_heads + E * H + E +
                         K * (3 * H * Ie + 2 * Ie + H) + 2 * H;
    return layer * c->num_layers + H;
}

/* ---- the shapes' configs ---- */

static inline int bench_qwen3_8b(hf_config *c, int layers, int vocab, errbuf *err)
{
    (void)err;
    qwen3_8b_config(c, layers);
    if (vocab > 0) c->vocab_size = vocab;
    return 0;
}

static inline int bench_qwen35_9b(hf_config *c, int layers, int vocab, errbuf *err)
{
    (void)err;
    qwen35_9b_config(c, layers, vocab);
    return 0;
}

static inline int bench_qwen35_a3b(hf_config *c, int layers, int vocab, errbuf *err)
{
    (void)err;
    qwen35_a3b_config(c, layers, vocab);
    return 0;
}

static inline int bench_qwen3_30b_a3b(hf_config *c, int layers, int vocab, errbuf *err)
{
    (void)err;
    qwen3_30b_a3b_config(c, layers, vocab);
    return 0;
}

static inline int bench_gpt_oss_20b(hf_config *c, int layers, int vocab, errbuf *err)
{
    if (hf_config_parse(c, GPT_OSS_20B_CONFIG_JSON, "gpt_oss_20b.h", err)) return -1;
    if (layers > c->num_layers) {
        errbuf_set(err, EINVAL, "--layers %d: gpt-oss-20b has %d", layers, c->num_layers);
        return -1;
    }
    c->num_layers = layers;
    if (vocab > 0) c->vocab_size = vocab;
    return 0;
}

static const bench_shape bench_shapes[] = {
    {"qwen3", "qwen3 (Qwen3-8B shape)", 36, bench_qwen3_8b, bench_dense_params},
    {"qwen3_5", "qwen3_5 (hybrid, Qwen3.5-9B shape: 3 Gated DeltaNet : 1 gated attention)", 32, bench_qwen35_9b,
     bench_hybrid_params},
    {"qwen3_5_moe",
     "qwen3_5_moe (hybrid MoE, Qwen3.5-35B-A3B shape: 256 experts, 8 routed + 1 shared; 3 Gated DeltaNet : 1 gated "
     "attention)",
     40, bench_qwen35_a3b, bench_hybrid_params},
    {"qwen3_moe", "qwen3_moe (Qwen3-30B-A3B shape: 128 experts of 768, 8 routed)", 48, bench_qwen3_30b_a3b,
     bench_dense_params},
    {"gpt_oss", "gpt_oss (gpt-oss-20b shape: 32 experts, top 4; sliding 128 / full; sinks, biases, YaRN)", 24,
     bench_gpt_oss_20b, bench_gpt_oss_params},
};

/* The row of --family `name`, or NULL with the families listed on stderr (prefixed by `who`). */
static inline const bench_shape *bench_shape_find(const char *who, const char *name)
{
    const size_t n = sizeof bench_shapes / sizeof bench_shapes[0];
    for (size_t i = 0; i < n; i++)
        if (!strcmp(bench_shapes[i].family, name)) return &bench_shapes[i];
    fprintf(stderr, "%s: --family %s: expected one of", who, name);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %s", bench_shapes[i].family);
    fprintf(stderr, "\n");
    return NULL;
}

/* Causal attention FLOPs a token (4 x heads x head_dim per attended key), as torch_target_anchor.py counts them
 * (n^2/2 keys a sequence of n), over the softmax-attention layers (not the Gated DeltaNet ones), each over its
 * sliding window where the layer has one; for the nseq sequences of lens[] (total T tokens). */
static inline double bench_attention_flops_tok(const hf_config *c, const int *lens, int nseq)
{
    double T = 0, f = 0;
    for (int s = 0; s < nseq; s++) T += lens[s];
    for (int l = 0; l < c->num_layers; l++) {
        if (c->layer_linear[l]) continue;
        const int W = hf_layer_window(c, l);
        double keys = 0; /* keys attended, summed over the batch's tokens */
        for (int s = 0; s < nseq; s++) {
            const double n = lens[s];
            keys += W > 0 && n > W ? (double)W * (W + 1) / 2 + (n - W) * W : n * n / 2;
        }
        f += 4.0 * c->num_heads * c->head_dim * keys;
    }
    return T > 0 ? f / T : 0;
}

#endif
