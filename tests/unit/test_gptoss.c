/* The gpt_oss family on the CPU: hf_config reads gpt-oss-20b's config.json (experts, windows, biases, sinks, YaRN,
 * MXFP4) and refuses other quantisations by field; the YaRN frequency table (rope_inv_freq) against transformers' own
 * table (the goldens' rope.inv_freq); MXFP4 dequantisation; the experts' reader (HF's interleaved, transposed layout;
 * a missing MXFP4 tensor named). The kernels' options (attention sinks and windows, the MoE GEMMs' biases and clamped
 * SwiGLU, bias_add, YaRN's correction range) are rows of the kernel case table (tests/kernels/gptoss.c,
 * rope_inv_freq's regimes). The whole forward is checked by the gptoss-* goldens (dflash_golden). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/gpt_oss_20b.h"
#include "gptoss_experts.h"
#include "hf_config.h"
#include "rope.h"
#include "safetensors.h"
#include "target_family.h"
#include "tests/test.h"
#include "util.h"

static int parse(hf_config *c, const char *json, errbuf *err) { return hf_config_parse(c, json, "config.json", err); }

/* GPT_OSS_20B_CONFIG_JSON with `from` replaced by `to` (once). */
static char *edited(const char *from, const char *to)
{
    const char *s = GPT_OSS_20B_CONFIG_JSON, *at = strstr(s, from);
    REQUIRE(at);
    size_t n = strlen(s) + strlen(to) + 1;
    char *o = xmalloc(n);
    snprintf(o, n, "%.*s%s%s", (int)(at - s), s, to, at + strlen(from));
    return o;
}

TEST(config_of_gpt_oss_20b)
{
    hf_config c;
    errbuf err = {{0}};
    REQUIRE(parse(&c, GPT_OSS_20B_CONFIG_JSON, &err) == 0);
    EXPECT(c.arch == HF_ARCH_GPT_OSS && !c.has_qk_norm && c.num_layers == 24 && c.hidden_size == 2880);
    EXPECT(c.num_heads == 64 && c.num_kv_heads == 8 && c.head_dim == 64 && c.vocab_size == 201088);
    EXPECT(c.num_experts == 32 && c.num_experts_per_tok == 4 && c.moe_intermediate_size == 2880 && c.norm_topk_prob);
    EXPECT(c.shared_expert_intermediate_size == 0);
    EXPECT(c.attention_bias && c.attn_sinks && c.experts_mxfp4 && c.swiglu_alpha == 1.702 && c.swiglu_limit == 7.0);
    EXPECT(c.sliding_window == 128);
    for (int i = 0; i < 24; i++) {
        EXPECT(c.layer_moe[i] == 1);
        EXPECT(hf_layer_window(&c, i) == (i % 2 == 0 ? 128 : 0));
    }
    EXPECT(c.rope_yarn && !c.rope_llama3 && c.rope_theta == 150000 && c.rope_factor == 32);
    EXPECT(c.rope_beta_fast == 32 && c.rope_beta_slow == 1 && !c.rope_truncate && c.rope_original_max_position == 4096);
    EXPECT_NEAR(c.rope_yarn_attention, 0.1 * log(32.0) + 1.0, 1e-12);
    EXPECT_NEAR(hf_attn_scale(&c), (0.1 * log(32.0) + 1.0) * (0.1 * log(32.0) + 1.0) / 8.0, 1e-7);
    const target_family *f = target_family_of(&c);
    EXPECT(f && !strcmp(f->name, "gpt_oss") && f->rope_dims(&c) == 64);
    EXPECT(target_family_require(&c, TARGET_BACKEND_CPU, TARGET_CAN_FORWARD | TARGET_CAN_DECODE, "x", NULL, &err) == 0);
    /* the drafter derived from it is a plain Qwen3 model: no YaRN, biases, sinks or windows */
    hf_config d = c;
    hf_config_as_qwen3(&d);
    EXPECT(!d.rope_yarn && !d.attention_bias && !d.attn_sinks && !d.experts_mxfp4 && !d.swiglu_limit);
    EXPECT(hf_layer_window(&d, 0) == 0 && hf_attn_scale(&d) == 1.0f / 8.0f);
    /* without layer_types: even layers slide (GptOssConfig's default); an explicit attention_factor wins */
    char *j = edited("\"layer_types\"", "\"x_layer_types\"");
    REQUIRE(parse(&c, j, &err) == 0);
    EXPECT(hf_layer_window(&c, 0) == 128 && hf_layer_window(&c, 1) == 0 && hf_layer_window(&c, 22) == 128);
    free(j);
    j = edited("\"rope_type\": \"yarn\"", "\"rope_type\": \"yarn\", \"attention_factor\": 2.0");
    REQUIRE(parse(&c, j, &err) == 0);
    EXPECT(c.rope_yarn_attention == 2.0);
    free(j);
}

TEST(config_errors_name_the_field)
{
    hf_config c;
    errbuf err = {{0}};
    char *j = edited("\"quant_method\": \"mxfp4\"", "\"quant_method\": \"fp8\"");
    EXPECT(parse(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "config.json: field quantization_config.quant_method: unsupported value \"fp8\"");
    free(j);
    j = edited("\"sliding_attention\", \"full_attention\", \"sliding", "\"sliding_attention\", \"local\", \"sliding");
    EXPECT(parse(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "config.json: field layer_types[1]: expected \"full_attention\" or \"sliding_attention\"");
    free(j);
    j = edited("\"num_local_experts\": 32, ", "");
    EXPECT(parse(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "missing required field num_local_experts");
    free(j);
    j = edited("\"beta_fast\": 32.0", "\"beta_fast\": 0.5");
    EXPECT(parse(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "field rope_scaling.beta_fast: 0.5 must be greater than beta_slow 1");
    free(j);
    /* without quantization_config the experts are plain tensors */
    j = edited("\"quant_method\": \"mxfp4\"", "\"x\": 1");
    EXPECT(parse(&c, j, &err) == -EINVAL); /* an object without quant_method */
    EXPECT_CONTAINS(err.msg, "missing required field quantization_config.quant_method");
    free(j);
}

/* The goldens' configs: the gpt_oss row, their windows; hf_config + rope_inv_freq against transformers' inv_freq
 * buffer (float32 there; bf16-rounded for the bf16 checkpoints, as target_model_load rounds it). */
TEST(yarn_table_matches_transformers)
{
    const char *cases[] = {"gptoss-tiny", "gptoss-tiny-bf16", "gptoss-mxfp4"};
    for (int k = 0; k < 3; k++) {
        char dir[600], cs[600];
        snprintf(dir, sizeof dir, "%s/target", test_golden(cases[k]));
        snprintf(cs, sizeof cs, "%s/case.safetensors", test_golden(cases[k]));
        hf_config c;
        errbuf err = {{0}};
        REQUIRE(hf_config_load(&c, dir, &err) == 0);
        REQUIRE(c.rope_yarn && c.rope_factor == 32);
        const target_family *f = target_family_of(&c);
        EXPECT(f && !strcmp(f->name, "gpt_oss") && c.experts_mxfp4 == (k == 2) && c.attention_bias && c.attn_sinks);
        EXPECT(hf_layer_window(&c, 0) == 6 && hf_layer_window(&c, 1) == 0 && hf_layer_window(&c, 2) == 6);
        st_file *st = NULL;
        REQUIRE(st_open(&st, cs, &err) == 0);
        float *ref = NULL;
        size_t n = 0;
        REQUIRE(st_load_f32(st, "rope.inv_freq", &ref, -1, NULL, &n, &err) == 0);
        REQUIRE((int)n == c.head_dim / 2);
        rope_params p = {.theta = c.rope_theta, .yarn = 1, .factor = c.rope_factor,
                         .original_max_position = c.rope_original_max_position, .beta_fast = c.rope_beta_fast,
                         .beta_slow = c.rope_beta_slow, .truncate = c.rope_truncate};
        double inv[256];
        rope_inv_freq(inv, c.head_dim, &p);
        const int bf16 = !strcmp(c.torch_dtype, "bfloat16");
        for (size_t i = 0; i < n; i++) {
            double mine = bf16 ? bf16_to_f32(f32_to_bf16((float)inv[i])) : inv[i];
            EXPECT_NEAR(mine, ref[i], (bf16 ? 0 : 2e-7) * ref[i]);
        }
        /* the attention factor the golden's model used */
        const char *meta = st_metadata(st, "json");
        REQUIRE(meta);
        const char *a = strstr(meta, "\"rope_attention_scaling\": ");
        REQUIRE(a);
        EXPECT_NEAR(c.rope_yarn_attention, atof(a + strlen("\"rope_attention_scaling\": ")), 1e-12);
        free(ref);
        st_close(&st);
    }
}

TEST(mxfp4_dequant_codes)
{
    uint8_t blocks[2][16], scales[2] = {127 + 1, 127 - 3};
    for (int j = 0; j < 16; j++) blocks[0][j] = (uint8_t)(j | ((15 - j) << 4)), blocks[1][j] = 0x9f;
    float out[64];
    mxfp4_dequant(out, &blocks[0][0], scales, 2, 1);
    static const float fp4[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int j = 0; j < 16; j++) {
        EXPECT(out[2 * j] == fp4[j] * 2 && out[2 * j + 1] == fp4[15 - j] * 2);
        EXPECT(out[32 + 2 * j] == -6.0f / 8 && out[32 + 2 * j + 1] == -0.5f / 8);
    }
    EXPECT(signbit(out[16]) && out[16] == 0.0f); /* code 8: -0 */
}

/* An HF-layout checkpoint of one layer's experts (E 2, H 4, I 3; and H = I = 3, square as gpt-oss-20b's down_proj):
 * gate_up_proj (E, H, 2I) with gate in the even columns, down_proj (E, I, H); the reader gives per expert the gate
 * rows then the up rows, (E, 2I, H), and down (E, H, I). */
static void write_hf_experts(const char *path, int E, int H, int I)
{
    float *gu = xmalloc(sizeof(float) * E * H * 2 * I), *gub = xmalloc(sizeof(float) * E * 2 * I);
    float *dn = xmalloc(sizeof(float) * E * I * H), *dnb = xmalloc(sizeof(float) * E * H);
    for (int e = 0; e < E; e++) {
        for (int h = 0; h < H; h++)
            for (int j = 0; j < 2 * I; j++)
                gu[(e * H + h) * 2 * I + j] = (float)(1000 * e + 100 * (j % 2) + 10 * (j / 2) + h);
        for (int j = 0; j < 2 * I; j++) gub[e * 2 * I + j] = (float)(1000 * e + 100 * (j % 2) + j / 2);
        for (int i = 0; i < I; i++)
            for (int h = 0; h < H; h++) dn[(e * I + i) * H + h] = (float)(1000 * e + 10 * h + i);
        for (int h = 0; h < H; h++) dnb[e * H + h] = (float)(e * 10 + h);
    }
    st_write_tensor w[] = {
        {"model.layers.0.mlp.experts.gate_up_proj", ST_F32, 3, {E, H, 2 * I}, gu},
        {"model.layers.0.mlp.experts.gate_up_proj_bias", ST_F32, 2, {E, 2 * I}, gub},
        {"model.layers.0.mlp.experts.down_proj", ST_F32, 3, {E, I, H}, dn},
        {"model.layers.0.mlp.experts.down_proj_bias", ST_F32, 2, {E, H}, dnb},
    };
    errbuf err = {{0}};
    REQUIRE(st_write(path, w, 4, NULL, &err) == 0);
    free(gu), free(gub), free(dn), free(dnb);
}

TEST(experts_reader_layouts)
{
    hf_config c = {0};
    char *dir = test_tmpdir(), path[300];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    errbuf err = {{0}};
    st_file *st = NULL;
    gptoss_experts x;
    const int shapes[2][2] = {{4, 3}, {3, 3}};
    const int E = 2;
    for (int k = 0; k < 2; k++) {
        const int H = shapes[k][0], I = shapes[k][1];
        write_hf_experts(path, E, H, I);
        c.hidden_size = H, c.num_experts = E, c.moe_intermediate_size = I;
        REQUIRE(st_open(&st, path, &err) == 0);
        REQUIRE(gptoss_experts_load(&x, st, &c, "model.", 0, &err) == 0);
        for (int e = 0; e < E; e++) {
            for (int r = 0; r < 2 * I; r++) { /* row r: gate (r < I) or up unit r % I */
                const int up = r >= I, unit = r % I;
                for (int h = 0; h < H; h++)
                    EXPECT(x.gate_up[(e * 2 * I + r) * H + h] == 1000 * e + 100 * up + 10 * unit + h);
                EXPECT(x.gate_up_b[e * 2 * I + r] == 1000 * e + 100 * up + unit);
            }
            for (int h = 0; h < H; h++) {
                for (int i = 0; i < I; i++) EXPECT(x.down[(e * H + h) * I + i] == 1000 * e + 10 * h + i);
                EXPECT(x.down_b[e * H + h] == e * 10 + h);
            }
        }
        gptoss_experts_free(&x);
        if (k < 1) st_close(&st); /* the last one stays open for the MXFP4 checks below */
    }
    gptoss_experts_free(&x);
    /* the config says MXFP4: the blocks are missing, by name */
    c.experts_mxfp4 = 1, c.moe_intermediate_size = 32, c.hidden_size = 32;
    EXPECT(gptoss_experts_load(&x, st, &c, "model.", 0, &err) == -ENOENT);
    EXPECT_CONTAINS(err.msg, "tensor model.layers.0.mlp.experts.gate_up_proj_blocks missing");
    gptoss_experts_free(&x);
    st_close(&st);
    /* blocks of the wrong dtype are named with both shapes */
    float fb[1][64][1][16] = {{{{0}}}};
    uint8_t sc[1][64][1] = {{{0}}};
    (void)sc;
    st_write_tensor w2[] = {{"model.layers.0.mlp.experts.gate_up_proj_blocks", ST_F32, 4, {1, 64, 1, 16}, fb}};
    REQUIRE(st_write(path, w2, 1, NULL, &err) == 0);
    REQUIRE(st_open(&st, path, &err) == 0);
    c.num_experts = 1;
    EXPECT(gptoss_experts_load(&x, st, &c, "model.", 0, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "tensor model.layers.0.mlp.experts.gate_up_proj_blocks: F32 (1, 64, 1, 16), expected U8");
    gptoss_experts_free(&x);
    st_close(&st);
    unlink(path);
    rmdir(dir);
}

TEST_MAIN
