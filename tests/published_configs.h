/* published_configs: config.json files as their models publish them, for the tests that parse them (one copy each).
 */
#ifndef DFLASH_TESTS_PUBLISHED_CONFIGS_H
#define DFLASH_TESTS_PUBLISHED_CONFIGS_H

/* Qwen/Qwen3-30B-A3B's config.json (Qwen3-Coder-30B-A3B differs only in rope_theta and context) */
static const char qwen3_30b_a3b_json[] =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, "
    "\"bos_token_id\": 151643, \"decoder_sparse_step\": 1, \"eos_token_id\": 151645, \"head_dim\": 128, "
    "\"hidden_act\": \"silu\", \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 6144, "
    "\"max_position_embeddings\": 40960, \"max_window_layers\": 48, \"mlp_only_layers\": [], "
    "\"model_type\": \"qwen3_moe\", \"moe_intermediate_size\": 768, \"norm_topk_prob\": true, "
    "\"num_attention_heads\": 32, \"num_experts\": 128, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 48, "
    "\"num_key_value_heads\": 4, \"output_router_logits\": false, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, "
    "\"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.001, \"sliding_window\": null, "
    "\"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\", "
    "\"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}";

#endif
