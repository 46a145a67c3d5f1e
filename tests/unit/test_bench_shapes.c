/* The benchmark shapes of bench/ against what hf_config makes of the published config.json they stand for: the
 * Qwen3.5-35B-A3B one (text_config of Qwen/Qwen3.5-35B-A3B, the defaults of transformers' Qwen3_5MoeTextConfig)
 * parsed as qwen3_5_moe gives the fields bench/qwen35_a3b.h writes by hand; Qwen/Qwen3-30B-A3B's config.json
 * parsed as qwen3_moe gives those of bench/qwen3_30b_a3b.h. And the table of bench/bench_shapes.h: every row's shape
 * is run by a target family that forwards on CUDA, its model_type is the row's family, and the parameters a token uses
 * are those of the model it stands for (Qwen3-8B: 6.95 B without the embeddings). */
#include <string.h>

#include "bench/bench_shapes.h"
#include "bench/qwen35_a3b.h"
#include "bench/qwen3_30b_a3b.h"
#include "hf_config.h"
#include "target_family.h"
#include "tests/published_configs.h"
#include "tests/test.h"

static const char kQwen35A3B[] =
    "{\"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"], \"model_type\": \"qwen3_5_moe\", "
    "\"tie_word_embeddings\": false, \"text_config\": {\"model_type\": \"qwen3_5_moe_text\", \"hidden_size\": 2048, "
    "\"num_hidden_layers\": 40, \"num_attention_heads\": 16, \"num_key_value_heads\": 2, \"head_dim\": 256, "
    "\"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128, "
    "\"linear_num_key_heads\": 16, \"linear_num_value_heads\": 32, \"moe_intermediate_size\": 512, "
    "\"shared_expert_intermediate_size\": 512, \"num_experts\": 256, \"num_experts_per_tok\": 8, "
    "\"vocab_size\": 248320, \"rms_norm_eps\": 1e-06, \"max_position_embeddings\": 262144, \"dtype\": \"bfloat16\", "
    "\"full_attention_interval\": 4, \"layer_types\": [%s], \"rope_parameters\": {\"rope_type\": \"default\", "
    "\"rope_theta\": 10000000, \"partial_rotary_factor\": 0.25, \"mrope_section\": [11, 11, 10], "
    "\"mrope_interleaved\": true}}}";

TEST(qwen35_a3b_matches_published_config)
{
    char types[40 * 24] = "", json[sizeof kQwen35A3B + sizeof types];
    for (int i = 0; i < 40; i++)
        strcat(types, (i + 1) % 4 ? "\"linear_attention\"," : "\"full_attention\",");
    types[strlen(types) - 1] = 0;
    snprintf(json, sizeof json, kQwen35A3B, types);
    hf_config p, b;
    errbuf err = {{0}};
    REQUIRE(hf_config_parse(&p, json, "Qwen3.5-35B-A3B/config.json", &err) == 0);
    qwen35_a3b_config(&b, 40, 0);
    EXPECT(p.arch == b.arch && p.is_hybrid && b.is_hybrid && p.hidden_size == b.hidden_size);
    EXPECT(p.num_layers == b.num_layers && p.num_heads == b.num_heads && p.num_kv_heads == b.num_kv_heads);
    EXPECT(p.head_dim == b.head_dim && p.vocab_size == b.vocab_size && p.rms_eps == b.rms_eps);
    EXPECT(p.rope_theta == b.rope_theta && p.rotary_dim == b.rotary_dim && p.partial_rotary_factor == b.partial_rotary_factor);
    EXPECT(p.linear_num_k_heads == b.linear_num_k_heads && p.linear_num_v_heads == b.linear_num_v_heads);
    EXPECT(p.linear_k_head_dim == b.linear_k_head_dim && p.linear_v_head_dim == b.linear_v_head_dim);
    EXPECT(p.linear_conv_kernel == b.linear_conv_kernel && p.tie_embeddings == b.tie_embeddings);
    EXPECT(p.num_experts == b.num_experts && p.num_experts_per_tok == b.num_experts_per_tok);
    EXPECT(p.moe_intermediate_size == b.moe_intermediate_size);
    EXPECT(p.shared_expert_intermediate_size == b.shared_expert_intermediate_size);
    EXPECT(p.norm_topk_prob == b.norm_topk_prob && p.intermediate_size == b.intermediate_size);
    EXPECT(p.max_position == b.max_position);
    EXPECT(!memcmp(p.layer_linear, b.layer_linear, sizeof p.layer_linear));
    EXPECT(!memcmp(p.layer_moe, b.layer_moe, sizeof p.layer_moe));
}


TEST(qwen3_30b_a3b_matches_published_config)
{
    hf_config p, b;
    errbuf err = {{0}};
    REQUIRE(hf_config_parse(&p, qwen3_30b_a3b_json, "Qwen3-30B-A3B/config.json", &err) == 0);
    qwen3_30b_a3b_config(&b, 48, 0);
    EXPECT(p.arch == HF_ARCH_QWEN3_MOE && p.arch == b.arch && !strcmp(p.model_type, b.model_type));
    EXPECT(!p.is_hybrid && !b.is_hybrid && p.has_qk_norm == b.has_qk_norm && p.hidden_size == b.hidden_size);
    EXPECT(p.num_layers == b.num_layers && p.num_heads == b.num_heads && p.num_kv_heads == b.num_kv_heads);
    EXPECT(p.head_dim == b.head_dim && p.vocab_size == b.vocab_size && p.rms_eps == b.rms_eps);
    EXPECT(p.rope_theta == b.rope_theta && p.rotary_dim == b.rotary_dim && p.partial_rotary_factor == b.partial_rotary_factor);
    EXPECT(p.intermediate_size == b.intermediate_size && p.tie_embeddings == b.tie_embeddings);
    EXPECT(p.num_experts == b.num_experts && p.num_experts_per_tok == b.num_experts_per_tok);
    EXPECT(p.moe_intermediate_size == b.moe_intermediate_size && p.norm_topk_prob == b.norm_topk_prob);
    EXPECT(p.shared_expert_intermediate_size == b.shared_expert_intermediate_size);
    EXPECT(p.max_position == b.max_position && !strcmp(p.torch_dtype, b.torch_dtype));
    EXPECT(!memcmp(p.layer_moe, b.layer_moe, sizeof p.layer_moe) && !memcmp(p.layer_linear, b.layer_linear, sizeof p.layer_linear));
    EXPECT(!memcmp(p.layer_sliding, b.layer_sliding, sizeof p.layer_sliding) && p.sliding_window == b.sliding_window);
}

TEST(bench_shapes_rows_are_families_that_forward_on_cuda)
{
    const int lens[] = {773, 1876, 1, 2012};
    for (size_t i = 0; i < sizeof bench_shapes / sizeof bench_shapes[0]; i++) {
        const bench_shape *b = &bench_shapes[i];
        hf_config c;
        errbuf err = {{0}};
        REQUIRE(b->config(&c, b->layers, 0, &err) == 0);
        EXPECT(!strncmp(c.model_type, b->family, strlen(b->family)));
        EXPECT(c.num_layers == b->layers);
        const target_family *f = NULL;
        EXPECT(target_family_require(&c, TARGET_BACKEND_CUDA, TARGET_CAN_FORWARD, "bench", &f, &err) == 0);
        EXPECT(b->params_tok(&c) > 1e8);
        EXPECT(bench_attention_flops_tok(&c, lens, 4) > 0);
        EXPECT(bench_shape_find("test", b->family) == b);
    }
    hf_config c;
    errbuf err = {{0}};
    EXPECT(bench_shapes[0].config(&c, 36, 0, &err) == 0);
    double p = bench_shapes[0].params_tok(&c);
    EXPECT(p > 6.90e9 && p < 7.00e9);
    /* a window cuts the keys: gpt-oss's sliding layers see at most 128 */
    const bench_shape *g = bench_shape_find("test", "gpt_oss");
    EXPECT(g && g->config(&c, 24, 0, &err) == 0);
    const double windowed = bench_attention_flops_tok(&c, lens, 4);
    for (int l = 0; l < c.num_layers; l++) c.layer_sliding[l] = 0;
    EXPECT(bench_attention_flops_tok(&c, lens, 4) > 1.5 * windowed);
    EXPECT(bench_shape_find("test", "no_such_family") == NULL);
    EXPECT(bench_shapes[0].config(&c, 36, 1000, &err) == 0 && c.vocab_size == 1000);
}

TEST_MAIN
