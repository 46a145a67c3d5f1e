/* The Qwen3.5-35B-A3B-shaped hybrid MoE target the benchmarks run on (random weights, nothing downloaded), from its
 * published config (transformers' Qwen3_5MoeTextConfig defaults, checkpoint Qwen/Qwen3.5-35B-A3B): 40 layers (or
 * fewer), hidden 2048, every 4th layer gated attention (16/2 heads of 256, partial RoPE over 64 dims), the others
 * Gated DeltaNet (16 q/k heads x 32 v heads of 128, conv kernel 4), every layer's MLP a sparse MoE block of 256
 * experts of width 512, 8 routed per token (softmax, renormalised) + 1 shared expert of width 512 with its sigmoid
 * gate, vocab 248320 (or the given one), untied lm_head, bf16. hf_config's qwen3_5_moe parse gives the same fields. */
#ifndef DFLASH_BENCH_QWEN35_A3B_H
#define DFLASH_BENCH_QWEN35_A3B_H

#include <stdio.h>
#include <string.h>

#include "hf_config.h"

static inline void qwen35_a3b_config(hf_config *cfg, int layers, int vocab)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->arch = HF_ARCH_QWEN3_5;
    snprintf(cfg->model_type, sizeof cfg->model_type, "qwen3_5_moe_text");
    cfg->hidden_size = 2048, cfg->num_layers = layers, cfg->num_heads = 16, cfg->num_kv_heads = 2, cfg->head_dim = 256;
    cfg->intermediate_size = 3 * 2048; /* no dense MLP: hf_config's default for the drafter */
    cfg->vocab_size = vocab > 0 ? vocab : 248320, cfg->rms_eps = 1e-6;
    cfg->rope_theta = 1e7, cfg->has_qk_norm = 1, cfg->max_position = 262144;
    cfg->is_hybrid = 1;
    for (int i = 0; i < layers && i < HF_MAX_LAYERS; i++) cfg->layer_linear[i] = (i + 1) % 4 != 0, cfg->layer_moe[i] = 1;
    cfg->linear_num_k_heads = 16, cfg->linear_num_v_heads = 32, cfg->linear_k_head_dim = 128;
    cfg->linear_v_head_dim = 128, cfg->linear_conv_kernel = 4;
    cfg->partial_rotary_factor = 0.25, cfg->rotary_dim = 64;
    cfg->num_experts = 256, cfg->num_experts_per_tok = 8, cfg->moe_intermediate_size = 512;
    cfg->shared_expert_intermediate_size = 512, cfg->norm_topk_prob = 1;
    snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "bfloat16");
}

#endif
