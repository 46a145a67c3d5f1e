/* The Qwen3-30B-A3B target shape the benchmarks run on (random weights, nothing downloaded), from its published
 * config.json (Qwen/Qwen3-30B-A3B, model_type qwen3_moe; Qwen3-Coder-30B-A3B has the same layers): 48 layers (or
 * fewer), hidden 2048, 32/4 attention heads of 128 with q/k norm, every layer's MLP a sparse MoE block of 128 experts
 * of width 768, 8 per token (softmax router, norm_topk_prob: the 8 weights renormalised), no shared expert,
 * intermediate_size 6144 (used by no layer: mlp_only_layers is empty; the width of the drafter a job derives),
 * vocab 151936, untied lm_head, rope theta 1e6, bf16. hf_config's qwen3_moe parse gives the same fields
 * (tests/unit/test_bench_shapes.c). */
#ifndef DFLASH_BENCH_QWEN3_30B_A3B_H
#define DFLASH_BENCH_QWEN3_30B_A3B_H

#include <stdio.h>
#include <string.h>

#include "hf_config.h"

static inline void qwen3_30b_a3b_config(hf_config *cfg, int layers, int vocab)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->arch = HF_ARCH_QWEN3_MOE;
    snprintf(cfg->model_type, sizeof cfg->model_type, "qwen3_moe");
    cfg->hidden_size = 2048, cfg->num_layers = layers, cfg->num_heads = 32, cfg->num_kv_heads = 4, cfg->head_dim = 128;
    cfg->intermediate_size = 6144, cfg->vocab_size = vocab > 0 ? vocab : 151936, cfg->rms_eps = 1e-6;
    cfg->rope_theta = 1e6, cfg->has_qk_norm = 1, cfg->max_position = 40960;
    cfg->partial_rotary_factor = 1, cfg->rotary_dim = 128;
    for (int i = 0; i < layers && i < HF_MAX_LAYERS; i++) cfg->layer_moe[i] = 1;
    cfg->num_experts = 128, cfg->num_experts_per_tok = 8, cfg->moe_intermediate_size = 768, cfg->norm_topk_prob = 1;
    snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "bfloat16");
}

#endif
