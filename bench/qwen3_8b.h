/* The Qwen3-8B target shape the benchmarks run on (random weights, nothing downloaded): 36 layers (or fewer),
 * hidden 4096, 32/8 heads of 128, FFN 12288, vocab 151936, q/k norm, bf16. */
#ifndef DFLASH_BENCH_QWEN3_8B_H
#define DFLASH_BENCH_QWEN3_8B_H

#include <stdio.h>
#include <string.h>

#include "hf_config.h"

static inline void qwen3_8b_config(hf_config *cfg, int layers)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->arch = HF_ARCH_QWEN3;
    snprintf(cfg->model_type, sizeof cfg->model_type, "qwen3");
    cfg->hidden_size = 4096, cfg->num_layers = layers, cfg->num_heads = 32, cfg->num_kv_heads = 8, cfg->head_dim = 128;
    cfg->intermediate_size = 12288, cfg->vocab_size = 151936, cfg->rms_eps = 1e-6, cfg->rope_theta = 1e6;
    cfg->has_qk_norm = 1, cfg->max_position = 40960;
    snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "bfloat16");
}

#endif
