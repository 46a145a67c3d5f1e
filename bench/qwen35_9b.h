/* The Qwen3.5-9B-shaped hybrid target the benchmarks run on (random weights, nothing downloaded): 32 layers (or
 * fewer), hidden 4096, every 4th layer gated attention (16/4 heads of 256, partial RoPE over 64 dims), the others
 * Gated DeltaNet (16 q/k heads x 32 v heads of 128, conv kernel 4), dense SwiGLU FFN 12288, vocab 248320 (or the
 * given one), untied lm_head, bf16. */
#ifndef DFLASH_BENCH_QWEN35_9B_H
#define DFLASH_BENCH_QWEN35_9B_H

#include <stdio.h>
#include <string.h>

#include "hf_config.h"

static inline void qwen35_9b_config(hf_config *cfg, int layers, int vocab)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->arch = HF_ARCH_QWEN3_5;
    snprintf(cfg->model_type, sizeof cfg->model_type, "qwen3_5_text");
    cfg->hidden_size = 4096, cfg->num_layers = layers, cfg->num_heads = 16, cfg->num_kv_heads = 4, cfg->head_dim = 256;
    cfg->intermediate_size = 12288, cfg->vocab_size = vocab > 0 ? vocab : 248320, cfg->rms_eps = 1e-6;
    cfg->rope_theta = 1e7, cfg->has_qk_norm = 1, cfg->max_position = 262144;
    cfg->is_hybrid = 1;
    for (int i = 0; i < layers && i < HF_MAX_LAYERS; i++) cfg->layer_linear[i] = (i + 1) % 4 != 0;
    cfg->linear_num_k_heads = 16, cfg->linear_num_v_heads = 32, cfg->linear_k_head_dim = 128;
    cfg->linear_v_head_dim = 128, cfg->linear_conv_kernel = 4;
    cfg->partial_rotary_factor = 0.25, cfg->rotary_dim = 64, cfg->norm_topk_prob = 1;
    snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "bfloat16");
}

#endif
