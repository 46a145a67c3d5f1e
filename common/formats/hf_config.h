/* hf_config: reads a Hugging Face config.json (Qwen3, Llama, Qwen3-MoE, the hybrid Qwen3.5 / Qwen3.5-MoE / Qwen3-Next targets,
 * and the DFlash drafter layout) with jansson, and writes the drafter's config.json. The vision-language configs
 * (qwen3_5, qwen3_5_moe) are read from their text_config. Required fields missing or of the wrong type are errors
 * naming the file and field (text_config.x when nested); optional fields take the defaults transformers uses
 * (documented per field below). */
#ifndef DFLASH_HF_CONFIG_H
#define DFLASH_HF_CONFIG_H

#include <math.h>

#include "util.h"

enum hf_arch { HF_ARCH_QWEN3, HF_ARCH_LLAMA, HF_ARCH_QWEN3_5, HF_ARCH_QWEN3_NEXT, HF_ARCH_QWEN3_MOE, HF_ARCH_GPT_OSS };

#define HF_MAX_TAPS 64
#define HF_MAX_LAYERS 512     /* hybrid and MoE targets: the per-layer kind tables */

typedef struct hf_config {
    enum hf_arch arch;        /* from model_type: qwen3, llama, qwen3_5[_moe][_text] (QWEN3_5), qwen3_next, qwen3_moe,
                               * gpt_oss */
    char model_type[32];
    int hidden_size;          /* required */
    int num_layers;           /* num_hidden_layers, required */
    int num_heads;            /* num_attention_heads, required */
    int num_kv_heads;         /* num_key_value_heads; default num_heads */
    int head_dim;             /* default hidden_size / num_heads (hybrid: 256, transformers' default) */
    int intermediate_size;    /* required; MoE hybrids without it: 3 * hidden_size (the drafter's MLP width, the
                               * dense Qwen3.5 and Qwen3-30B-A3B ratio) */
    int vocab_size;           /* required */
    double rms_eps;           /* rms_norm_eps, required */
    double rope_theta;        /* top level or rope_parameters.rope_theta; required in one of them */
    int rope_llama3;          /* rope_scaling / rope_parameters with rope_type "llama3" */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_position;
    /* rope_type "yarn" (transformers' _compute_yarn_parameters): factor (max_position_embeddings /
     * original_max_position_embeddings when both are given, as transformers takes it), beta_fast (default 32),
     * beta_slow (default 1), truncate (default true), original_max_position_embeddings (default
     * max_position_embeddings); the attention factor scales cos and sin, so the attention's logits by its square
     * (hf_attn_scale): attention_factor, else get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when
     * both are given, else 0.1 ln(factor) + 1 (1 when factor <= 1). */
    int rope_yarn;
    double rope_beta_fast, rope_beta_slow, rope_yarn_attention;
    int rope_truncate;
    int tie_embeddings;       /* tie_word_embeddings; default 0 */
    int has_qk_norm;          /* 1 for qwen3 and the hybrids, 0 for llama */
    int max_position;         /* max_position_embeddings; default 0 when absent */
    char torch_dtype[16];     /* torch_dtype or dtype; "" when absent */
    /* Hybrid targets (arch QWEN3_5 / QWEN3_NEXT): Gated DeltaNet and gated full-attention layers, zero-centred
     * RMSNorm (1 + w), partial RoPE, optional MoE. */
    int is_hybrid;
    int text_nested;          /* the fields came from text_config (weights under model.language_model.) */
    unsigned char layer_linear[HF_MAX_LAYERS]; /* layer_types[i] == "linear_attention" (else full_attention);
                               * without layer_types: full every full_attention_interval-th layer (default 4) */
    unsigned char layer_moe[HF_MAX_LAYERS];    /* the layer's MLP is the sparse MoE block (qwen3_moe too) */
    int linear_num_k_heads;   /* linear_num_key_heads, default 16 */
    int linear_num_v_heads;   /* linear_num_value_heads, default 32; a multiple of linear_num_k_heads */
    int linear_k_head_dim;    /* linear_key_head_dim, default 128 */
    int linear_v_head_dim;    /* linear_value_head_dim, default 128 */
    int linear_conv_kernel;   /* linear_conv_kernel_dim, default 4 */
    double partial_rotary_factor; /* top level or rope_parameters; default 0.25 (hybrid), 1 otherwise */
    int rotary_dim;           /* int(head_dim * partial_rotary_factor), even, > 0 */
    /* MoE (the hybrids with experts, and qwen3_moe: num_experts required, norm_topk_prob default 0; both with
     * decoder_sparse_step (default 1) and mlp_only_layers (default none) deciding layer_moe) */
    int num_experts;          /* 0: dense MLP everywhere */
    int num_experts_per_tok;  /* required with num_experts > 0 */
    int moe_intermediate_size;            /* required with num_experts > 0 */
    int shared_expert_intermediate_size;  /* 0: no shared expert */
    int norm_topk_prob;       /* default 1 (Qwen3.5 always renormalises); qwen3_moe: default 0 */
    /* gpt_oss (GptOssConfig): every layer's MLP is the MoE block (experts of intermediate_size, num_local_experts,
     * router with a bias, top-k then softmax over the k: norm_topk_prob 1), experts with biases and the clamped
     * SwiGLU (swiglu_alpha default 1.702, swiglu_limit default 7); attention with q/k/v/o biases (attention_bias,
     * default true for gpt_oss) and a learned sink logit per head; layer_types sliding_attention / full_attention
     * (default: even layers sliding) in layer_sliding with sliding_window (default 128); quantization_config only
     * {quant_method: mxfp4} (experts_mxfp4: the experts as *_blocks + *_scales tensors). */
    int attention_bias;
    int moe_bias;             /* the router and the experts have biases (gpt_oss) */
    int attn_sinks;
    double swiglu_alpha, swiglu_limit; /* 0: the plain SwiGLU */
    int experts_mxfp4;
    /* DFlash drafter fields (architectures contains "DFlashDraftModel"): */
    int is_dflash;
    int block_size;
    int num_target_layers;
    int mask_token_id;        /* dflash_config.mask_token_id */
    int num_taps;             /* dflash_config.target_layer_ids */
    int taps[HF_MAX_TAPS];
    /* sliding-window layers (gpt_oss targets: above), as transformers' Qwen3Config and z-lab's model.py read them: layer_types[i]
     * "sliding_attention" (without layer_types: use_sliding_window and i >= max_window_layers, default 28);
     * sliding_window counts only with use_sliding_window true (else 0: the layer attends to everything); such
     * layers need is_causal false (z-lab makes them causal inside the block otherwise, which dflash does not do) */
    unsigned char layer_sliding[HF_MAX_LAYERS];
    int sliding_window;
} hf_config;

/* The attention window of layer l (dflash_attn_shape.window; a gpt_oss target's layers): sliding_window for a
 * sliding layer, else 0 (query t then sees keys t-window+1 .. t). */
static inline int hf_layer_window(const hf_config *c, int l) { return c->layer_sliding[l] ? c->sliding_window : 0; }

/* The attention's logit scale: 1/sqrt(head_dim), times the square of YaRN's attention factor (transformers scales
 * cos and sin, so q and k, by it). */
static inline float hf_attn_scale(const hf_config *c)
{
    if (!c->rope_yarn) return 1.0f / sqrtf((float)c->head_dim);
    return (float)(c->rope_yarn_attention * c->rope_yarn_attention / sqrt((double)c->head_dim));
}

/* Load path: a config.json file or a directory holding one. */
int hf_config_load(hf_config *cfg, const char *path, errbuf *err);
/* Parse from a string; `name` is used in messages in place of a file name. */
int hf_config_parse(hf_config *cfg, const char *json_text, const char *name, errbuf *err);
/* Turn a target's config into the plain Qwen3 layout of the DFlash drafter derived from it: model_type qwen3, q/k
 * norm, full RoPE, the hybrid, MoE and gpt_oss fields (YaRN, biases, sinks, windows) cleared; hidden size, heads, head_dim, MLP width, vocabulary, rope_theta
 * and the dtype kept. */
void hf_config_as_qwen3(hf_config *cfg);
/* Write a DFlash drafter config.json (z-lab layout: Qwen3 fields + architectures, block_size, num_target_layers,
 * layer_types, dflash_config; with sliding layers also use_sliding_window, sliding_window and is_causal false)
 * atomically. */
/* The model's stop tokens: eos_token_id (an id or a list) of dir/generation_config.json, else of dir/config.json
 * (a file that is absent or names none counts as none). Ids must lie in [0, vocab) and are kept once each, at most
 * max. *neos = 0 when neither names one. Errors name the file and the field. */
int hf_eos_tokens(const char *dir, int vocab, int32_t *eos, int max, int *neos, errbuf *err);
/* The id the target may not produce when dflash decodes with it: the drafter's mask token (a reserved id DFlash
 * adds to the vocabulary): drafter's dflash_config.mask_token_id when a drafter is given, else what a job's
 * drafter.mask_token_id = -1 takes, the target's last id. The one rule of a job's default mask token, generate's
 * default --suppress and eval's greedy choice, so that eval --walk takes generate's output. */
int32_t hf_reserved_token(const hf_config *target, const hf_config *drafter);

int hf_config_write_dflash(const hf_config *cfg, const char *path, errbuf *err);

#endif
