/* hf_config: reads a Hugging Face config.json (Qwen3, Llama, and the DFlash drafter layout) with jansson, and
 * writes the drafter's config.json. Required fields missing or of the wrong type are errors naming the file and
 * field; optional fields take the defaults transformers uses (documented per field below). */
#ifndef DFLASH_HF_CONFIG_H
#define DFLASH_HF_CONFIG_H

#include "util.h"

enum hf_arch { HF_ARCH_QWEN3, HF_ARCH_LLAMA };

#define HF_MAX_TAPS 64

typedef struct hf_config {
    enum hf_arch arch;        /* from model_type: "qwen3" or "llama" */
    char model_type[32];
    int hidden_size;          /* required */
    int num_layers;           /* num_hidden_layers, required */
    int num_heads;            /* num_attention_heads, required */
    int num_kv_heads;         /* num_key_value_heads; default num_heads */
    int head_dim;             /* default hidden_size / num_heads */
    int intermediate_size;    /* required */
    int vocab_size;           /* required */
    double rms_eps;           /* rms_norm_eps, required */
    double rope_theta;        /* top level or rope_parameters.rope_theta; required in one of them */
    int rope_llama3;          /* rope_scaling / rope_parameters with rope_type "llama3" */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_position;
    int tie_embeddings;       /* tie_word_embeddings; default 0 */
    int has_qk_norm;          /* 1 for qwen3, 0 for llama */
    int max_position;         /* max_position_embeddings; default 0 when absent */
    char torch_dtype[16];     /* torch_dtype or dtype; "" when absent */
    /* DFlash drafter fields (architectures contains "DFlashDraftModel"): */
    int is_dflash;
    int block_size;
    int num_target_layers;
    int mask_token_id;        /* dflash_config.mask_token_id */
    int num_taps;             /* dflash_config.target_layer_ids */
    int taps[HF_MAX_TAPS];
} hf_config;

/* Load path: a config.json file or a directory holding one. */
int hf_config_load(hf_config *cfg, const char *path, errbuf *err);
/* Parse from a string; `name` is used in messages in place of a file name. */
int hf_config_parse(hf_config *cfg, const char *json_text, const char *name, errbuf *err);
/* Write a DFlash drafter config.json (z-lab layout: Qwen3 fields + architectures, block_size, num_target_layers,
 * layer_types, dflash_config) atomically. */
int hf_config_write_dflash(const hf_config *cfg, const char *path, errbuf *err);

#endif
