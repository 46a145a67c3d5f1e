/* hf_config: the four golden config.json files, defaults, every missing/wrong-typed field named in the error,
 * rope variants, the DFlash drafter fields (sliding-window layers too), and the z-lab writer round trip. */
#include <errno.h>
#include <jansson.h>

#include "hf_config.h"
#include "tests/published_configs.h"
#include "tests/test.h"

static json_t *load_json(const char *path)
{
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j) fprintf(stderr, "  %s: %s\n", path, jerr.text);
    REQUIRE(j);
    return j;
}

/* Parse a JSON object given as jansson, naming it "test.json". */
static int parse_json(hf_config *cfg, const json_t *j, errbuf *err)
{
    char *text = json_dumps(j, 0);
    int ret = hf_config_parse(cfg, text, "test.json", err);
    free(text);
    return ret;
}

static void check_target(const hf_config *c, const char *dtype)
{
    EXPECT(c->arch == HF_ARCH_QWEN3 && strcmp(c->model_type, "qwen3") == 0 && c->has_qk_norm == 1);
    EXPECT(c->hidden_size == 64 && c->num_layers == 8 && c->num_heads == 4 && c->num_kv_heads == 2);
    EXPECT(c->head_dim == 16 && c->intermediate_size == 160 && c->vocab_size == 512);
    EXPECT(c->rms_eps == 1e-6 && c->rope_theta == 1e6 && c->rope_llama3 == 0);
    EXPECT(c->tie_embeddings == 0 && c->max_position == 4096);
    EXPECT(strcmp(c->torch_dtype, dtype) == 0);
    EXPECT(c->is_dflash == 0);
}

TEST(golden_targets)
{
    hf_config c;
    errbuf err = {{0}};
    int ret = hf_config_load(&c, test_golden("tiny/target/config.json"), &err);
    if (ret) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(ret == 0);
    check_target(&c, "float32");
    REQUIRE(hf_config_load(&c, test_golden("tiny-bf16/target"), &err) == 0); /* directory form */
    check_target(&c, "bfloat16");
}

TEST(golden_drafters)
{
    const char *paths[2] = {"tiny/drafter/config.json", "tiny-bf16/drafter/config.json"};
    for (int k = 0; k < 2; k++) {
        hf_config c;
        errbuf err = {{0}};
        int ret = hf_config_load(&c, test_golden(paths[k]), &err);
        if (ret) fprintf(stderr, "  %s\n", err.msg);
        REQUIRE(ret == 0);
        EXPECT(c.is_dflash == 1 && c.block_size == 4 && c.num_target_layers == 8 && c.mask_token_id == 500);
        EXPECT(c.num_layers == 2 && c.hidden_size == 64 && c.head_dim == 16 && c.num_kv_heads == 2);
        EXPECT(c.rope_theta == 1e6 && c.rms_eps == 1e-6);
        REQUIRE(c.num_taps == 5);
        for (int i = 0; i < 5; i++) EXPECT(c.taps[i] == i + 1);
        EXPECT(strcmp(c.torch_dtype, k ? "bfloat16" : "float32") == 0);
    }
}

TEST(defaults)
{
    const char *text = "{\"model_type\": \"llama\", \"hidden_size\": 96, \"num_hidden_layers\": 3, "
                       "\"num_attention_heads\": 6, \"intermediate_size\": 200, \"vocab_size\": 1000, "
                       "\"rms_norm_eps\": 1e-5, \"rope_theta\": 10000, \"sliding_window\": null}";
    hf_config c;
    errbuf err = {{0}};
    REQUIRE(hf_config_parse(&c, text, "min.json", &err) == 0);
    EXPECT(c.arch == HF_ARCH_LLAMA && c.has_qk_norm == 0);
    EXPECT(c.num_kv_heads == 6 && c.head_dim == 16);
    EXPECT(c.tie_embeddings == 0 && c.max_position == 0 && c.torch_dtype[0] == '\0');
    EXPECT(c.rope_theta == 10000.0); /* an integer is accepted for a number */
    EXPECT(c.is_dflash == 0 && c.rope_llama3 == 0);
}

/* qwen3_moe (Qwen3-30B-A3B's published config.json): its MoE fields, the MoE layers as transformers decides them
 * ((i+1) % decoder_sparse_step == 0 and i not in mlp_only_layers), norm_topk_prob's default (false), and errors
 * naming the field. */
TEST(qwen3_moe_fields)
{
    hf_config c;
    errbuf err = {{0}};
    REQUIRE(hf_config_parse(&c, qwen3_30b_a3b_json, "test.json", &err) == 0);
    EXPECT(c.arch == HF_ARCH_QWEN3_MOE && !strcmp(c.model_type, "qwen3_moe") && c.has_qk_norm && !c.is_hybrid);
    EXPECT(c.hidden_size == 2048 && c.num_layers == 48 && c.num_heads == 32 && c.num_kv_heads == 4);
    EXPECT(c.head_dim == 128 && c.rotary_dim == 128 && c.intermediate_size == 6144 && c.vocab_size == 151936);
    EXPECT(c.num_experts == 128 && c.num_experts_per_tok == 8 && c.moe_intermediate_size == 768);
    EXPECT(c.shared_expert_intermediate_size == 0 && c.norm_topk_prob == 1 && c.rope_theta == 1e6);
    int moe_layers = 0;
    for (int i = 0; i < c.num_layers; i++) moe_layers += c.layer_moe[i];
    EXPECT(moe_layers == 48);
    /* decoder_sparse_step 3, mlp_only_layers [5, 0]; norm_topk_prob absent: transformers' default, false */
    json_error_t jerr;
    json_t *j = json_loads(qwen3_30b_a3b_json, 0, &jerr);
    REQUIRE(j);
    json_object_set_new(j, "decoder_sparse_step", json_integer(3));
    json_object_set_new(j, "mlp_only_layers", json_pack("[i, i]", 5, 0));
    json_object_del(j, "norm_topk_prob");
    REQUIRE(parse_json(&c, j, &err) == 0);
    for (int i = 0; i < 12; i++) EXPECT(c.layer_moe[i] == (i == 2 || i == 8 || i == 11));
    EXPECT(c.norm_topk_prob == 0);
    /* transformers 5 saves the expert count as num_local_experts */
    json_object_set_new(j, "num_local_experts", json_integer(64));
    json_object_del(j, "num_experts");
    REQUIRE(parse_json(&c, j, &err) == 0);
    EXPECT(c.num_experts == 64 && c.layer_moe[2] == 1);
    /* the drafter derived from it: plain Qwen3, the target's MLP width */
    hf_config_as_qwen3(&c);
    EXPECT(c.arch == HF_ARCH_QWEN3 && c.num_experts == 0 && c.intermediate_size == 6144 && c.layer_moe[2] == 0);
    /* errors name the field */
    const struct { const char *key; json_t *val; const char *want; } bad[] = {
        {"num_experts", NULL, "test.json: missing required field num_experts"},
        {"num_experts_per_tok", NULL, "test.json: missing required field num_experts_per_tok"},
        {"moe_intermediate_size", NULL, "test.json: missing required field moe_intermediate_size"},
        {"num_experts_per_tok", json_integer(129), "field num_experts_per_tok: value 129 out of range [1, 128]"},
        {"mlp_only_layers", json_pack("[i, i]", 3, 48), "field mlp_only_layers[1]: expected a layer in [0, 48)"},
        {"mlp_only_layers", json_integer(3), "field mlp_only_layers: expected array"},
        {"decoder_sparse_step", json_integer(0), "field decoder_sparse_step: value 0 out of range"},
        {"norm_topk_prob", json_string("yes"), "field norm_topk_prob: expected boolean"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *b = json_loads(qwen3_30b_a3b_json, 0, &jerr);
        REQUIRE(b);
        if (bad[i].val) json_object_set_new(b, bad[i].key, bad[i].val);
        else json_object_del(b, bad[i].key);
        EXPECT(parse_json(&c, b, &err) == -EINVAL);
        EXPECT_CONTAINS(err.msg, bad[i].want);
        json_decref(b);
    }
    json_decref(j);
}

TEST(missing_required_fields)
{
    const char *required[] = {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                              "vocab_size", "rms_norm_eps", "model_type"};
    for (size_t i = 0; i < sizeof required / sizeof *required; i++) {
        json_t *j = load_json(test_golden("tiny/target/config.json"));
        json_object_del(j, required[i]);
        hf_config c;
        errbuf err = {{0}};
        EXPECT(parse_json(&c, j, &err) == -EINVAL);
        char want[128];
        snprintf(want, sizeof want, "test.json: missing required field %s", required[i]);
        EXPECT_CONTAINS(err.msg, want);
        json_decref(j);
    }
    /* rope_theta: neither at top level nor in rope_parameters */
    json_t *j = load_json(test_golden("tiny/target/config.json"));
    json_object_del(json_object_get(j, "rope_parameters"), "rope_theta");
    hf_config c;
    errbuf err = {{0}};
    EXPECT(parse_json(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "test.json: missing required field rope_theta");
    json_decref(j);
    /* a null counts as missing for a required field */
    j = load_json(test_golden("tiny/target/config.json"));
    json_object_set_new(j, "vocab_size", json_null());
    EXPECT(parse_json(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "test.json: missing required field vocab_size");
    json_decref(j);
}

TEST(wrong_types)
{
    struct { const char *field; json_t *value; const char *want; } cases[] = {
        {"hidden_size", json_string("64"), "test.json: field hidden_size: expected integer, got string"},
        {"num_hidden_layers", json_real(8.0), "test.json: field num_hidden_layers: expected integer, got real"},
        {"num_key_value_heads", json_true(), "test.json: field num_key_value_heads: expected integer, got boolean"},
        {"head_dim", json_array(), "test.json: field head_dim: expected integer, got array"},
        {"rms_norm_eps", json_string("1e-6"), "test.json: field rms_norm_eps: expected number, got string"},
        {"tie_word_embeddings", json_string("no"), "test.json: field tie_word_embeddings: expected boolean"},
        {"model_type", json_integer(3), "test.json: field model_type: expected string, got integer"},
        {"dtype", json_integer(16), "test.json: field dtype: expected string, got integer"},
        {"rope_parameters", json_string("x"), "test.json: field rope_parameters: expected object, got string"},
        {"architectures", json_string("Qwen3"), "test.json: field architectures: expected array, got string"},
        {"max_position_embeddings", json_string("4k"), "field max_position_embeddings: expected integer"},
        /* values out of range */
        {"hidden_size", json_integer(0), "test.json: field hidden_size: value 0 out of range"},
        {"num_key_value_heads", json_integer(3), "field num_key_value_heads: 3 does not divide"},
        {"num_key_value_heads", json_integer(8), "field num_key_value_heads: value 8 out of range [1, 4]"},
        {"rms_norm_eps", json_real(-1e-6), "field rms_norm_eps: value -1e-06 must be positive"},
        {"model_type", json_string("mistral"), "test.json: field model_type: unsupported value \"mistral\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *j = load_json(test_golden("tiny/target/config.json"));
        json_object_set_new(j, cases[i].field, cases[i].value);
        hf_config c;
        errbuf err = {{0}};
        EXPECT(parse_json(&c, j, &err) == -EINVAL);
        EXPECT_CONTAINS(err.msg, cases[i].want);
        json_decref(j);
    }
}

TEST(invalid_json)
{
    hf_config c;
    errbuf err = {{0}};
    EXPECT(hf_config_parse(&c, "{\"hidden_size\": 64,\n \"x\": }", "cfg.json", &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "cfg.json:2:");
    EXPECT_CONTAINS(err.msg, "invalid JSON");
    EXPECT(hf_config_parse(&c, "[1]", "cfg.json", &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "cfg.json: expected a JSON object, got array");
    EXPECT(hf_config_load(&c, "/nonexistent/dir/config.json", &err) == -ENOENT);
    EXPECT_CONTAINS(err.msg, "/nonexistent/dir/config.json: cannot open");
}

TEST(rope_variants)
{
    hf_config c;
    errbuf err = {{0}};
    /* Llama-3.1 style: top-level rope_theta + rope_scaling */
    json_t *j = load_json(test_golden("tiny/target/config.json"));
    json_object_set_new(j, "model_type", json_string("llama"));
    json_object_del(j, "rope_parameters");
    json_object_set_new(j, "rope_theta", json_real(500000.0));
    json_object_set_new(j, "rope_scaling", json_pack("{s:f, s:f, s:f, s:i, s:s}", "factor", 8.0, "low_freq_factor",
                                                     1.0, "high_freq_factor", 4.0,
                                                     "original_max_position_embeddings", 8192, "rope_type", "llama3"));
    REQUIRE(parse_json(&c, j, &err) == 0);
    EXPECT(c.arch == HF_ARCH_LLAMA && c.rope_llama3 == 1 && c.rope_theta == 500000.0);
    EXPECT(c.rope_factor == 8.0 && c.rope_low_freq_factor == 1.0 && c.rope_high_freq_factor == 4.0);
    EXPECT(c.rope_original_max_position == 8192);
    /* missing scaling field */
    json_object_del(json_object_get(j, "rope_scaling"), "low_freq_factor");
    EXPECT(parse_json(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "test.json: missing required field rope_scaling.low_freq_factor");
    /* unsupported type, old "type" key */
    json_object_set_new(j, "rope_scaling", json_pack("{s:s, s:f}", "type", "dynamic", "factor", 4.0));
    EXPECT(parse_json(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "test.json: field rope_scaling.type: unsupported value \"dynamic\"");
    /* rope_scaling: null falls back to rope_parameters */
    json_object_set_new(j, "rope_scaling", json_null());
    json_object_set_new(j, "rope_parameters",
                        json_pack("{s:s, s:f, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "rope_theta", 5e5, "factor",
                                  32.0, "low_freq_factor", 1.0, "high_freq_factor", 4.0,
                                  "original_max_position_embeddings", 8192));
    json_object_del(j, "rope_theta");
    REQUIRE(parse_json(&c, j, &err) == 0);
    EXPECT(c.rope_llama3 == 1 && c.rope_factor == 32.0 && c.rope_theta == 5e5);
    json_object_set_new(json_object_get(j, "rope_parameters"), "rope_type", json_string("dynamic"));
    EXPECT(parse_json(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "field rope_parameters.rope_type: unsupported value \"dynamic\"");
    json_decref(j);
}

TEST(dflash_fields)
{
    const char *drop[] = {"block_size", "num_target_layers", "dflash_config"};
    hf_config c;
    errbuf err = {{0}};
    for (int i = 0; i < 3; i++) {
        json_t *j = load_json(test_golden("tiny/drafter/config.json"));
        json_object_del(j, drop[i]);
        EXPECT(parse_json(&c, j, &err) == -EINVAL);
        char want[128];
        snprintf(want, sizeof want, "test.json: missing required field %s", drop[i]);
        EXPECT_CONTAINS(err.msg, want);
        json_decref(j);
    }
    const char *sub[] = {"mask_token_id", "target_layer_ids"};
    for (int i = 0; i < 2; i++) {
        json_t *j = load_json(test_golden("tiny/drafter/config.json"));
        json_object_del(json_object_get(j, "dflash_config"), sub[i]);
        EXPECT(parse_json(&c, j, &err) == -EINVAL);
        char want[128];
        snprintf(want, sizeof want, "test.json: missing required field dflash_config.%s", sub[i]);
        EXPECT_CONTAINS(err.msg, want);
        json_decref(j);
    }
    json_t *j = load_json(test_golden("tiny/drafter/config.json"));
    json_t *dc = json_object_get(j, "dflash_config");
    json_object_set_new(dc, "target_layer_ids", json_pack("[i, i, s]", 1, 2, "3"));
    EXPECT(parse_json(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "test.json: field dflash_config.target_layer_ids[2]: expected integer, got string");
    json_object_set_new(dc, "target_layer_ids", json_pack("[i, i]", 1, 8));
    EXPECT(parse_json(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "field dflash_config.target_layer_ids[1]: layer 8 out of range [0, 8)");
    json_object_set_new(dc, "target_layer_ids", json_array());
    EXPECT(parse_json(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "field dflash_config.target_layer_ids: 0 entries");
    json_object_set_new(dc, "target_layer_ids", json_pack("[i]", 3));
    json_object_set_new(dc, "mask_token_id", json_integer(512));
    EXPECT(parse_json(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "field dflash_config.mask_token_id: value 512 out of range [0, 511]");
    json_object_set_new(j, "block_size", json_string("4"));
    EXPECT(parse_json(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "test.json: field block_size: expected integer, got string");
    json_decref(j);
}

TEST(write_dflash_round_trip)
{
    char *dir = test_tmpdir();
    char out[600];
    snprintf(out, sizeof out, "%s/config.json", dir);
    hf_config c, back;
    errbuf err = {{0}};
    REQUIRE(hf_config_load(&c, test_golden("tiny-bf16/drafter/config.json"), &err) == 0);
    int ret = hf_config_write_dflash(&c, out, &err);
    if (ret) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(ret == 0);
    REQUIRE(hf_config_load(&back, dir, &err) == 0);
    EXPECT(memcmp(&c, &back, sizeof c) == 0);
    /* the same JSON document as the z-lab golden, field for field */
    json_t *a = load_json(test_golden("tiny-bf16/drafter/config.json")), *b = load_json(out);
    EXPECT(json_equal(a, b));
    json_decref(a);
    json_decref(b);
    char tmp[620];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    EXPECT(access(tmp, F_OK) != 0);

    /* a Llama-3 drafter keeps its rope scaling */
    c.rope_llama3 = 1;
    c.rope_factor = 8.0;
    c.rope_low_freq_factor = 1.0;
    c.rope_high_freq_factor = 4.0;
    c.rope_original_max_position = 8192;
    c.rope_theta = 500000.0;
    c.rms_eps = 1e-5;
    c.num_taps = 3;
    memset(c.taps, 0, sizeof c.taps); /* unused entries read back as 0 */
    c.taps[0] = 0, c.taps[1] = 3, c.taps[2] = 7;
    REQUIRE(hf_config_write_dflash(&c, out, &err) == 0);
    REQUIRE(hf_config_load(&back, out, &err) == 0);
    EXPECT(memcmp(&c, &back, sizeof c) == 0);

    c.num_taps = 0;
    EXPECT(hf_config_write_dflash(&c, out, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, out);
    c.num_taps = 3;
    EXPECT(hf_config_write_dflash(&c, "/nonexistent/dir/config.json", &err) < 0);
    EXPECT_CONTAINS(err.msg, "/nonexistent/dir/config.json");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0);
}

/* Sliding-window drafter layers, read as transformers' Qwen3Config and z-lab's model.py read them. */
TEST(dflash_sliding_window)
{
    hf_config c;
    errbuf err = {{0}};
    /* the golden written by make_swa_golden.py (transformers read it back with this window), where the goldens'
     * folder has it (tests/goldens does; DFLASH_GOLDENS may name an older copy) */
    if (access(test_golden("swa-tiny/drafter/config.json"), F_OK) == 0) {
        REQUIRE(hf_config_load(&c, test_golden("swa-tiny/drafter"), &err) == 0);
        EXPECT(c.num_layers == 3 && c.sliding_window == 6);
        EXPECT(hf_layer_window(&c, 0) == 6 && hf_layer_window(&c, 1) == 0 && hf_layer_window(&c, 2) == 6);
    }
    json_t *j = load_json(test_golden("tiny/drafter/config.json"));
    json_object_set_new(j, "layer_types", json_pack("[s, s]", "sliding_attention", "full_attention"));
    json_object_set_new(j, "use_sliding_window", json_true());
    json_object_set_new(j, "sliding_window", json_integer(6));
    json_object_set_new(j, "is_causal", json_false());
    int ret = parse_json(&c, j, &err);
    if (ret) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(ret == 0);
    EXPECT(c.layer_sliding[0] == 1 && c.layer_sliding[1] == 0 && c.sliding_window == 6);
    EXPECT(hf_layer_window(&c, 0) == 6 && hf_layer_window(&c, 1) == 0);

    /* the written config.json reads back the same and carries the keys z-lab's model.py needs */
    char *dir = test_tmpdir();
    char out[600];
    snprintf(out, sizeof out, "%s/config.json", dir);
    hf_config back;
    REQUIRE(hf_config_write_dflash(&c, out, &err) == 0);
    REQUIRE(hf_config_load(&back, out, &err) == 0);
    EXPECT(memcmp(&c, &back, sizeof c) == 0);
    json_t *w = load_json(out);
    EXPECT(json_equal(json_object_get(w, "layer_types"), json_object_get(j, "layer_types")));
    EXPECT(json_is_true(json_object_get(w, "use_sliding_window")));
    EXPECT(json_integer_value(json_object_get(w, "sliding_window")) == 6);
    EXPECT(json_is_false(json_object_get(w, "is_causal")));
    json_decref(w);
    char cmd[640];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0);

    /* without use_sliding_window transformers drops the window: the layer then sees everything */
    json_object_set_new(j, "use_sliding_window", json_false());
    REQUIRE(parse_json(&c, j, &err) == 0);
    EXPECT(c.layer_sliding[0] == 1 && c.sliding_window == 0 && hf_layer_window(&c, 0) == 0);
    json_object_set_new(j, "use_sliding_window", json_true());

    /* sliding layers that z-lab would run causally (is_causal absent or true) are refused */
    json_object_del(j, "is_causal");
    EXPECT(parse_json(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "test.json: field is_causal: absent with sliding_attention layers");
    json_object_set_new(j, "is_causal", json_true());
    EXPECT(parse_json(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "test.json: field is_causal: true");
    json_object_set_new(j, "is_causal", json_false());

    json_object_set_new(j, "layer_types", json_pack("[s, s]", "full_attention", "local"));
    EXPECT(parse_json(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "test.json: field layer_types[1]: expected \"full_attention\" or \"sliding_attention\", "
                             "got \"local\"");
    json_object_set_new(j, "layer_types", json_pack("[s]", "full_attention"));
    EXPECT(parse_json(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "test.json: field layer_types: 1 entries, num_hidden_layers is 2");
    json_object_set_new(j, "layer_types", json_pack("[s, s]", "sliding_attention", "sliding_attention"));
    json_object_set_new(j, "sliding_window", json_integer(0));
    EXPECT(parse_json(&c, j, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "test.json: field sliding_window: value 0 out of range");

    /* no layer_types: transformers' rule, sliding from max_window_layers on */
    json_object_del(j, "layer_types");
    json_object_set_new(j, "sliding_window", json_integer(2048));
    json_object_set_new(j, "max_window_layers", json_integer(1));
    REQUIRE(parse_json(&c, j, &err) == 0);
    EXPECT(c.layer_sliding[0] == 0 && c.layer_sliding[1] == 1 && hf_layer_window(&c, 1) == 2048);
    json_decref(j);
}

TEST_MAIN
