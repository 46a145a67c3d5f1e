/* The gpt-oss-20b target shape (openai/gpt-oss-20b's config.json): 24 layers (or fewer), hidden 2880, 64/8 heads of
 * 64, 32 experts of width 2880, top 4, vocab 201088, layers alternating sliding window 128 and full attention,
 * q/k/v/o biases and sinks, YaRN RoPE (theta 150000, factor 32 over 4096 positions, truncate false), MXFP4 experts
 * (dequantised at load), bf16. The config.json text, so that what reads it is hf_config_parse itself. */
#ifndef DFLASH_BENCH_GPT_OSS_20B_H
#define DFLASH_BENCH_GPT_OSS_20B_H

#define GPT_OSS_20B_CONFIG_JSON                                                                                    \
    "{\"architectures\": [\"GptOssForCausalLM\"], \"attention_bias\": true, \"attention_dropout\": 0.0, "           \
    "\"eos_token_id\": 200002, \"experts_per_token\": 4, \"head_dim\": 64, \"hidden_act\": \"silu\", "              \
    "\"hidden_size\": 2880, \"initial_context_length\": 4096, \"initializer_range\": 0.02, "                        \
    "\"intermediate_size\": 2880, \"layer_types\": [\"sliding_attention\", \"full_attention\", "                    \
    "\"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\", " \
    "\"full_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\", "     \
    "\"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\", " \
    "\"full_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\", "    \
    "\"sliding_attention\", \"full_attention\"], \"max_position_embeddings\": 131072, \"model_type\": \"gpt_oss\", " \
    "\"num_attention_heads\": 64, \"num_experts_per_tok\": 4, \"num_hidden_layers\": 24, "                          \
    "\"num_key_value_heads\": 8, \"num_local_experts\": 32, \"output_router_logits\": false, "                      \
    "\"pad_token_id\": 199999, \"quantization_config\": {\"modules_to_not_convert\": [\"model.layers.*.self_attn\", " \
    "\"model.layers.*.mlp.router\", \"model.embed_tokens\", \"lm_head\"], \"quant_method\": \"mxfp4\"}, "            \
    "\"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"beta_fast\": 32.0, \"beta_slow\": 1.0, \"factor\": 32.0, "        \
    "\"original_max_position_embeddings\": 4096, \"rope_type\": \"yarn\", \"truncate\": false}, "                    \
    "\"rope_theta\": 150000, \"router_aux_loss_coef\": 0.9, \"sliding_window\": 128, \"swiglu_limit\": 7.0, "       \
    "\"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.55.0.dev0\", "     \
    "\"use_cache\": true, \"vocab_size\": 201088}"

#endif
