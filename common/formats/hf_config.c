#include "hf_config.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json_util.h"

/* Field lookup: `prefix` ("" or "rope_scaling.") only shapes messages. A JSON null counts as absent. */
static const json_t *field_get(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

static int missing(const char *file, const char *prefix, const char *key, errbuf *err)
{
    return errbuf_set(err, EINVAL, "%s: missing required field %s%s", file, prefix, key);
}

static int wrong_type(const char *file, const char *prefix, const char *key, const char *want, const json_t *v,
                      errbuf *err)
{
    return errbuf_set(err, EINVAL, "%s: field %s%s: expected %s, got %s", file, prefix, key, want,
                      json_type_name(v));
}

/* An integer field in [lo, hi]; absent -> def when !required. */
static int get_int(const json_t *obj, const char *file, const char *prefix, const char *key, int required, int def,
                   long long lo, long long hi, int *out, errbuf *err)
{
    const json_t *v = field_get(obj, key);
    if (!v) {
        if (required) return missing(file, prefix, key, err);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v)) return wrong_type(file, prefix, key, "integer", v, err);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return errbuf_set(err, EINVAL, "%s: field %s%s: value %lld out of range [%lld, %lld]", file, prefix, key,
                          (long long)x, lo, hi);
    *out = (int)x;
    return 0;
}

/* A number field (integer or real) > 0. */
static int get_positive(const json_t *obj, const char *file, const char *prefix, const char *key, int required,
                        double *out, errbuf *err)
{
    const json_t *v = field_get(obj, key);
    if (!v) return required ? missing(file, prefix, key, err) : 0;
    if (!json_is_number(v)) return wrong_type(file, prefix, key, "number", v, err);
    double x = json_number_value(v);
    if (!(x > 0))
        return errbuf_set(err, EINVAL, "%s: field %s%s: value %g must be positive", file, prefix, key, x);
    *out = x;
    return 0;
}

static int get_bool(const json_t *obj, const char *file, const char *key, int def, int *out, errbuf *err)
{
    const json_t *v = field_get(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) return wrong_type(file, "", key, "boolean", v, err);
    *out = json_is_true(v);
    return 0;
}

/* An optional string field copied into dst[n]; "" when absent. */
static int get_str(const json_t *obj, const char *file, const char *prefix, const char *key, char *dst, size_t n,
                   int required, errbuf *err)
{
    const json_t *v = field_get(obj, key);
    dst[0] = '\0';
    if (!v) return required ? missing(file, prefix, key, err) : 0;
    if (!json_is_string(v)) return wrong_type(file, prefix, key, "string", v, err);
    const char *s = json_string_value(v);
    if (strlen(s) >= n)
        return errbuf_set(err, EINVAL, "%s: field %s%s: value \"%.40s...\" too long (at most %zu characters)", file,
                          prefix, key, s, n - 1);
    memcpy(dst, s, strlen(s) + 1);
    return 0;
}

/* YaRN (hf_config.h: rope_yarn), as transformers' _compute_yarn_parameters reads rope_scaling / rope_parameters. */
static double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

static int parse_yarn(hf_config *cfg, const json_t *rs, const char *file, const char *prefix, errbuf *err)
{
    int ret, orig = 0;
    double mscale = 0, mscale_all = 0, af = 0;
    cfg->rope_yarn = 1;
    cfg->rope_beta_fast = 32, cfg->rope_beta_slow = 1;
    if ((ret = get_positive(rs, file, prefix, "factor", 1, &cfg->rope_factor, err)) ||
        (ret = get_positive(rs, file, prefix, "beta_fast", 0, &cfg->rope_beta_fast, err)) ||
        (ret = get_positive(rs, file, prefix, "beta_slow", 0, &cfg->rope_beta_slow, err)) ||
        (ret = get_positive(rs, file, prefix, "mscale", 0, &mscale, err)) ||
        (ret = get_positive(rs, file, prefix, "mscale_all_dim", 0, &mscale_all, err)) ||
        (ret = get_positive(rs, file, prefix, "attention_factor", 0, &af, err)) ||
        (ret = get_bool(rs, file, "truncate", 1, &cfg->rope_truncate, err)) ||
        (ret = get_int(rs, file, prefix, "original_max_position_embeddings", 0, 0, 1, INT_MAX, &orig, err)))
        return ret;
    if (orig && cfg->max_position > 0) cfg->rope_factor = (double)cfg->max_position / orig;
    cfg->rope_original_max_position = orig ? orig : cfg->max_position;
    if (cfg->rope_original_max_position <= 0)
        return errbuf_set(err, EINVAL, "%s: field %soriginal_max_position_embeddings: needed by rope_type yarn (or "
                          "max_position_embeddings)", file, prefix);
    if (!(cfg->rope_beta_fast > cfg->rope_beta_slow))
        return errbuf_set(err, EINVAL, "%s: field %sbeta_fast: %g must be greater than beta_slow %g", file, prefix,
                          cfg->rope_beta_fast, cfg->rope_beta_slow);
    if (af > 0) cfg->rope_yarn_attention = af;
    else if (mscale > 0 && mscale_all > 0)
        cfg->rope_yarn_attention = yarn_mscale(cfg->rope_factor, mscale) / yarn_mscale(cfg->rope_factor, mscale_all);
    else cfg->rope_yarn_attention = yarn_mscale(cfg->rope_factor, 1.0);
    return 0;
}

/* Rope scaling: rope_scaling when present, else rope_parameters; "default", "llama3" and "yarn" are supported. */
static int parse_rope(hf_config *cfg, const json_t *root, const char *file, const char *tp, errbuf *err)
{
    char pre_params[48], pre_scaling[48];
    snprintf(pre_params, sizeof pre_params, "%srope_parameters.", tp);
    snprintf(pre_scaling, sizeof pre_scaling, "%srope_scaling.", tp);
    const json_t *params = field_get(root, "rope_parameters");
    if (params && !json_is_object(params)) return wrong_type(file, tp, "rope_parameters", "object", params, err);
    const json_t *scaling = field_get(root, "rope_scaling");
    if (scaling && !json_is_object(scaling)) return wrong_type(file, tp, "rope_scaling", "object", scaling, err);

    int ret;
    cfg->rope_theta = 0;
    if (field_get(root, "rope_theta")) {
        ret = get_positive(root, file, tp, "rope_theta", 1, &cfg->rope_theta, err);
    } else if (params && field_get(params, "rope_theta")) {
        ret = get_positive(params, file, pre_params, "rope_theta", 1, &cfg->rope_theta, err);
    } else {
        ret = errbuf_set(err, EINVAL, "%s: missing required field %srope_theta (or %srope_theta)", file, tp,
                         pre_params);
    }
    if (ret) return ret;

    const json_t *rs = scaling ? scaling : params;
    const char *prefix = scaling ? pre_scaling : pre_params;
    if (!rs) return 0;
    const char *tkey = field_get(rs, "rope_type") ? "rope_type" : "type";
    char type[32];
    ret = get_str(rs, file, prefix, tkey, type, sizeof type, 0, err);
    if (ret) return ret;
    if (type[0] == '\0' || strcmp(type, "default") == 0) return 0;
    if (strcmp(type, "yarn") == 0) return parse_yarn(cfg, rs, file, prefix, err);
    if (strcmp(type, "llama3") != 0)
        return errbuf_set(err, EINVAL, "%s: field %s%s: unsupported value \"%s\" (expected default, llama3 or yarn)",
                          file, prefix, tkey, type);
    cfg->rope_llama3 = 1;
    if ((ret = get_positive(rs, file, prefix, "factor", 1, &cfg->rope_factor, err)) ||
        (ret = get_positive(rs, file, prefix, "low_freq_factor", 1, &cfg->rope_low_freq_factor, err)) ||
        (ret = get_positive(rs, file, prefix, "high_freq_factor", 1, &cfg->rope_high_freq_factor, err)) ||
        (ret = get_int(rs, file, prefix, "original_max_position_embeddings", 1, 0, 1, INT_MAX,
                       &cfg->rope_original_max_position, err)))
        return ret;
    if (!(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor))
        return errbuf_set(err, EINVAL, "%s: field %shigh_freq_factor: %g must be greater than low_freq_factor %g",
                          file, prefix, cfg->rope_high_freq_factor, cfg->rope_low_freq_factor);
    return 0;
}

/* layer_types of "sliding_attention" / "full_attention", one per layer, into cfg->layer_sliding (the drafter's and
 * gpt_oss's; the hybrid family's linear/full kinds are parse_layer_types'). *given: whether the field is there (absent:
 * layer_sliding untouched, for the caller's default). Errors name the entry. */
/* The field layer_types (under prefix tp) of one string per layer, "full_attention" (0) or `other` (1), into
 * flag[0..num_layers); the errors name the field and the entry. */
static int get_layer_types(const json_t *lt, const char *file, const char *tp, int num_layers, const char *other,
                           unsigned char *flag, errbuf *err)
{
    if (!json_is_array(lt)) return wrong_type(file, tp, "layer_types", "array", lt, err);
    if (json_array_size(lt) != (size_t)num_layers)
        return errbuf_set(err, EINVAL, "%s: field %slayer_types: %zu entries, num_hidden_layers is %d", file, tp,
                          json_array_size(lt), num_layers);
    for (int i = 0; i < num_layers; i++) {
        const json_t *v = json_array_get(lt, (size_t)i);
        const char *s = json_is_string(v) ? json_string_value(v) : NULL;
        if (s && !strcmp(s, other)) flag[i] = 1;
        else if (s && !strcmp(s, "full_attention")) flag[i] = 0;
        else
            return errbuf_set(err, EINVAL, "%s: field %slayer_types[%d]: expected \"full_attention\" or \"%s\", got "
                              "%s%s%s", file, tp, i, other, s ? "\"" : "", s ? s : json_type_name(v), s ? "\"" : "");
    }
    return 0;
}

static int get_sliding_layer_types(hf_config *cfg, const json_t *obj, const char *file, int *given, errbuf *err)
{
    const json_t *lt = field_get(obj, "layer_types");
    *given = lt != NULL;
    return lt ? get_layer_types(lt, file, "", cfg->num_layers, "sliding_attention", cfg->layer_sliding, err) : 0;
}

/* The drafter's sliding-window layers (hf_config.h: layer_sliding, sliding_window). */
static int parse_dflash_windows(hf_config *cfg, const json_t *root, const char *file, errbuf *err)
{
    int ret, use = 0, sw = 4096, first = 28, nsliding = 0;
    if ((ret = get_bool(root, file, "use_sliding_window", 0, &use, err)) ||
        (ret = get_int(root, file, "", "sliding_window", 0, 4096, 1, INT_MAX, &sw, err)) ||
        (ret = get_int(root, file, "", "max_window_layers", 0, 28, 0, INT_MAX, &first, err)))
        return ret;
    if (cfg->num_layers > HF_MAX_LAYERS)
        return errbuf_set(err, EINVAL, "%s: field num_hidden_layers: %d layers (at most %d)", file, cfg->num_layers,
                          HF_MAX_LAYERS);
    int given;
    if ((ret = get_sliding_layer_types(cfg, root, file, &given, err))) return ret;
    for (int i = 0; i < cfg->num_layers; i++) {
        if (!given) cfg->layer_sliding[i] = use && i >= first;
        nsliding += cfg->layer_sliding[i];
    }
    cfg->sliding_window = use ? sw : 0;
    const json_t *causal = field_get(root, "is_causal");
    if (causal && !json_is_boolean(causal)) return wrong_type(file, "", "is_causal", "boolean", causal, err);
    if ((causal && json_is_true(causal)) || (nsliding && !causal))
        return errbuf_set(err, EINVAL, "%s: field is_causal: %s: z-lab's model.py then makes %s causal inside the "
                          "block; dflash's drafter attends both ways (is_causal false)", file,
                          causal ? "true" : "absent with sliding_attention layers",
                          causal ? "every layer" : "the sliding_attention layers");
    return 0;
}

static int parse_dflash(hf_config *cfg, const json_t *root, const char *file, errbuf *err)
{
    int ret;
    if ((ret = get_int(root, file, "", "block_size", 1, 0, 1, 4096, &cfg->block_size, err)) ||
        (ret = get_int(root, file, "", "num_target_layers", 1, 0, 1, 100000, &cfg->num_target_layers, err)))
        return ret;
    const json_t *dc = field_get(root, "dflash_config");
    if (!dc) return missing(file, "", "dflash_config", err);
    if (!json_is_object(dc)) return wrong_type(file, "", "dflash_config", "object", dc, err);
    if ((ret = get_int(dc, file, "dflash_config.", "mask_token_id", 1, 0, 0, cfg->vocab_size - 1,
                       &cfg->mask_token_id, err)))
        return ret;
    const json_t *ids = field_get(dc, "target_layer_ids");
    if (!ids) return missing(file, "dflash_config.", "target_layer_ids", err);
    if (!json_is_array(ids)) return wrong_type(file, "dflash_config.", "target_layer_ids", "array", ids, err);
    size_t n = json_array_size(ids);
    if (n < 1 || n > HF_MAX_TAPS)
        return errbuf_set(err, EINVAL, "%s: field dflash_config.target_layer_ids: %zu entries (1 to %d allowed)",
                          file, n, HF_MAX_TAPS);
    cfg->num_taps = (int)n;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v))
            return errbuf_set(err, EINVAL, "%s: field dflash_config.target_layer_ids[%zu]: expected integer, got %s",
                              file, i, json_type_name(v));
        json_int_t x = json_integer_value(v);
        if (x < 0 || x >= cfg->num_target_layers)
            return errbuf_set(err, EINVAL, "%s: field dflash_config.target_layer_ids[%zu]: layer %lld out of range "
                              "[0, %d)", file, i, (long long)x, cfg->num_target_layers);
        cfg->taps[i] = (int)x;
    }
    return parse_dflash_windows(cfg, root, file, err);
}

/* architectures (optional array of strings): sets is_dflash when it names DFlashDraftModel. */
static int parse_architectures(hf_config *cfg, const json_t *root, const char *file, errbuf *err)
{
    const json_t *a = field_get(root, "architectures");
    if (!a) return 0;
    if (!json_is_array(a)) return wrong_type(file, "", "architectures", "array", a, err);
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_string(v))
            return errbuf_set(err, EINVAL, "%s: field architectures[%zu]: expected string, got %s", file, i,
                              json_type_name(v));
        if (strcmp(json_string_value(v), "DFlashDraftModel") == 0) cfg->is_dflash = 1;
    }
    return 0;
}

/* get_positive with a default when absent. */
static int get_real_def(const json_t *obj, const char *file, const char *prefix, const char *key, double def,
                        double *out, errbuf *err)
{
    *out = def;
    return get_positive(obj, file, prefix, key, 0, out, err);
}

/* layer_types (array of "linear_attention" / "full_attention", one per layer), else full_attention_interval. */
static int parse_layer_types(hf_config *cfg, const json_t *tc, const char *file, const char *tp, errbuf *err)
{
    const json_t *lt = field_get(tc, "layer_types");
    if (!lt) {
        int interval, ret = get_int(tc, file, tp, "full_attention_interval", 0, 4, 1, 1 << 20, &interval, err);
        if (ret) return ret;
        for (int i = 0; i < cfg->num_layers; i++) cfg->layer_linear[i] = (i + 1) % interval != 0;
        return 0;
    }
    return get_layer_types(lt, file, tp, cfg->num_layers, "linear_attention", cfg->layer_linear, err);
}

/* Which layers use the sparse MoE block: every layer for qwen3_5_moe; qwen3_next and qwen3_moe (as their
 * transformers decoder layers decide): (i+1) % decoder_sparse_step == 0 and i not in mlp_only_layers. */
static int parse_moe_layers(hf_config *cfg, const json_t *tc, const char *file, const char *tp, errbuf *err)
{
    int step = 1, ret;
    if (cfg->arch == HF_ARCH_QWEN3_5) { /* Qwen3_5MoeDecoderLayer always has the sparse block */
        memset(cfg->layer_moe, 1, (size_t)cfg->num_layers);
        return 0;
    }
    if ((ret = get_int(tc, file, tp, "decoder_sparse_step", 0, 1, 1, 1 << 20, &step, err))) return ret;
    for (int i = 0; i < cfg->num_layers; i++) cfg->layer_moe[i] = (i + 1) % step == 0;
    const json_t *only = field_get(tc, "mlp_only_layers");
    if (!only) return 0;
    if (!json_is_array(only)) return wrong_type(file, tp, "mlp_only_layers", "array", only, err);
    for (size_t k = 0; k < json_array_size(only); k++) {
        const json_t *v = json_array_get(only, k);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= cfg->num_layers)
            return errbuf_set(err, EINVAL, "%s: field %smlp_only_layers[%zu]: expected a layer in [0, %d)", file, tp,
                              k, cfg->num_layers);
        cfg->layer_moe[json_integer_value(v)] = 0;
    }
    return 0;
}

/* The MoE fields (num_experts > 0): experts per token, expert width, shared expert, renormalisation (default
 * norm_topk_def: transformers' per architecture), the MoE layers. */
static int parse_moe(hf_config *cfg, const json_t *tc, const char *file, const char *tp, int norm_topk_def,
                     errbuf *err)
{
    int ret;
    if (cfg->num_layers > HF_MAX_LAYERS)
        return errbuf_set(err, EINVAL, "%s: field %snum_hidden_layers: %d layers, at most %d supported for MoE "
                          "targets", file, tp, cfg->num_layers, HF_MAX_LAYERS);
    if ((ret = get_int(tc, file, tp, "num_experts_per_tok", 1, 0, 1, cfg->num_experts, &cfg->num_experts_per_tok,
                       err)) ||
        (ret = get_int(tc, file, tp, "moe_intermediate_size", 1, 0, 1, 1 << 24, &cfg->moe_intermediate_size, err)) ||
        (ret = get_int(tc, file, tp, "shared_expert_intermediate_size", 0, 0, 0, 1 << 24,
                       &cfg->shared_expert_intermediate_size, err)) ||
        (ret = get_bool(tc, file, "norm_topk_prob", norm_topk_def, &cfg->norm_topk_prob, err)) ||
        (ret = parse_moe_layers(cfg, tc, file, tp, err)))
        return ret;
    if (cfg->arch == HF_ARCH_QWEN3_5) cfg->norm_topk_prob = 1; /* Qwen3.5's router always renormalises */
    return 0;
}

/* The hybrid fields: layer kinds, linear-attention shapes, partial RoPE, MoE. */
static int parse_hybrid(hf_config *cfg, const json_t *tc, const char *file, const char *tp, int moe, errbuf *err)
{
    int ret;
    cfg->is_hybrid = 1;
    if (cfg->num_layers > HF_MAX_LAYERS)
        return errbuf_set(err, EINVAL, "%s: field %snum_hidden_layers: %d layers, at most %d supported for hybrid "
                          "targets", file, tp, cfg->num_layers, HF_MAX_LAYERS);
    if ((ret = parse_layer_types(cfg, tc, file, tp, err)) ||
        (ret = get_int(tc, file, tp, "linear_num_key_heads", 0, 16, 1, 65536, &cfg->linear_num_k_heads, err)) ||
        (ret = get_int(tc, file, tp, "linear_num_value_heads", 0, 32, 1, 65536, &cfg->linear_num_v_heads, err)) ||
        (ret = get_int(tc, file, tp, "linear_key_head_dim", 0, 128, 1, 1 << 16, &cfg->linear_k_head_dim, err)) ||
        (ret = get_int(tc, file, tp, "linear_value_head_dim", 0, 128, 1, 1 << 16, &cfg->linear_v_head_dim, err)) ||
        (ret = get_int(tc, file, tp, "linear_conv_kernel_dim", 0, 4, 1, 1024, &cfg->linear_conv_kernel, err)))
        return ret;
    if (cfg->linear_num_v_heads % cfg->linear_num_k_heads != 0)
        return errbuf_set(err, EINVAL, "%s: field %slinear_num_value_heads: %d is not a multiple of "
                          "linear_num_key_heads %d", file, tp, cfg->linear_num_v_heads, cfg->linear_num_k_heads);
    /* partial_rotary_factor: top level (older configs) or inside rope_parameters (transformers 5) */
    const json_t *params = field_get(tc, "rope_parameters");
    if (field_get(tc, "partial_rotary_factor"))
        ret = get_positive(tc, file, tp, "partial_rotary_factor", 1, &cfg->partial_rotary_factor, err);
    else if (params && json_is_object(params)) {
        char pp[48];
        snprintf(pp, sizeof pp, "%srope_parameters.", tp);
        ret = get_real_def(params, file, pp, "partial_rotary_factor", 0.25, &cfg->partial_rotary_factor, err);
    } else
        cfg->partial_rotary_factor = 0.25;
    if (ret) return ret;
    cfg->rotary_dim = (int)(cfg->head_dim * cfg->partial_rotary_factor);
    if (cfg->partial_rotary_factor > 1 || cfg->rotary_dim < 2 || cfg->rotary_dim % 2)
        return errbuf_set(err, EINVAL, "%s: field %spartial_rotary_factor: %g gives a rotary dimension of %d for "
                          "head_dim %d (must be even, at least 2, at most head_dim)", file, tp,
                          cfg->partial_rotary_factor, cfg->rotary_dim, cfg->head_dim);
    if (moe) {
        if ((ret = get_int(tc, file, tp, "num_experts", 1, 0, 0, 1 << 20, &cfg->num_experts, err))) return ret;
    }
    if (cfg->num_experts > 0 && (ret = parse_moe(cfg, tc, file, tp, 1, err))) return ret;
    return 0;
}

/* gpt_oss (hf_config.h): experts on every layer, biases, sinks, sliding layers, the clamped SwiGLU, MXFP4. */
static int parse_gpt_oss(hf_config *cfg, const json_t *tc, const char *file, errbuf *err)
{
    int ret;
    if (cfg->num_layers > HF_MAX_LAYERS)
        return errbuf_set(err, EINVAL, "%s: field num_hidden_layers: %d layers, at most %d supported for gpt_oss",
                          file, cfg->num_layers, HF_MAX_LAYERS);
    cfg->swiglu_alpha = 1.702, cfg->swiglu_limit = 7.0;
    if ((ret = get_int(tc, file, "", "num_local_experts", 1, 0, 1, 1 << 20, &cfg->num_experts, err)) ||
        (ret = get_int(tc, file, "", "num_experts_per_tok", 1, 0, 1, cfg->num_experts, &cfg->num_experts_per_tok,
                       err)) ||
        (ret = get_bool(tc, file, "attention_bias", 1, &cfg->attention_bias, err)) ||
        (ret = get_positive(tc, file, "", "swiglu_alpha", 0, &cfg->swiglu_alpha, err)) ||
        (ret = get_positive(tc, file, "", "swiglu_limit", 0, &cfg->swiglu_limit, err)) ||
        (ret = get_int(tc, file, "", "sliding_window", 0, 128, 1, INT_MAX, &cfg->sliding_window, err)))
        return ret;
    if (!field_get(tc, "sliding_window") && json_is_null(json_object_get(tc, "sliding_window")))
        cfg->sliding_window = 0; /* null: the sliding layers see everything */
    cfg->moe_intermediate_size = cfg->intermediate_size;
    cfg->norm_topk_prob = 1; /* softmax over the top k logits = the top k of the softmax, renormalised */
    cfg->attn_sinks = cfg->moe_bias = 1;
    memset(cfg->layer_moe, 1, (size_t)cfg->num_layers);
    int given;
    if ((ret = get_sliding_layer_types(cfg, tc, file, &given, err))) return ret;
    for (int i = 0; !given && i < cfg->num_layers; i++) cfg->layer_sliding[i] = (i + 1) % 2 != 0;
    const json_t *q = field_get(tc, "quantization_config");
    if (q) {
        if (!json_is_object(q)) return wrong_type(file, "", "quantization_config", "object", q, err);
        char method[32];
        if ((ret = get_str(q, file, "quantization_config.", "quant_method", method, sizeof method, 1, err)))
            return ret;
        if (strcmp(method, "mxfp4"))
            return errbuf_set(err, EINVAL, "%s: field quantization_config.quant_method: unsupported value \"%s\" "
                              "(dflash reads gpt_oss checkpoints unquantised or with MXFP4 experts, quant_method "
                              "mxfp4)", file, method);
        cfg->experts_mxfp4 = 1;
    }
    return 0;
}

static int parse_root(hf_config *cfg, const json_t *root, const char *file, errbuf *err)
{
    if (!json_is_object(root))
        return errbuf_set(err, EINVAL, "%s: expected a JSON object, got %s", file, json_type_name(root));
    int ret, moe = 0;
    if ((ret = get_str(root, file, "", "model_type", cfg->model_type, sizeof cfg->model_type, 1, err))) return ret;
    const char *mt = cfg->model_type;
    const json_t *tc = root; /* where the text model's fields are */
    const char *tp = "";
    if (strcmp(mt, "qwen3") == 0) {
        cfg->arch = HF_ARCH_QWEN3;
        cfg->has_qk_norm = 1;
    } else if (strcmp(mt, "llama") == 0) {
        cfg->arch = HF_ARCH_LLAMA;
        cfg->has_qk_norm = 0;
    } else if (strcmp(mt, "qwen3_moe") == 0) {
        cfg->arch = HF_ARCH_QWEN3_MOE;
        cfg->has_qk_norm = 1;
    } else if (strcmp(mt, "gpt_oss") == 0) {
        cfg->arch = HF_ARCH_GPT_OSS;
        cfg->has_qk_norm = 0;
    } else if (!strcmp(mt, "qwen3_5") || !strcmp(mt, "qwen3_5_moe") || !strcmp(mt, "qwen3_5_text") ||
               !strcmp(mt, "qwen3_5_moe_text") || !strcmp(mt, "qwen3_next")) {
        cfg->arch = strcmp(mt, "qwen3_next") ? HF_ARCH_QWEN3_5 : HF_ARCH_QWEN3_NEXT;
        cfg->has_qk_norm = 1;
        moe = strstr(mt, "moe") != NULL;
        if (!strcmp(mt, "qwen3_5") || !strcmp(mt, "qwen3_5_moe")) { /* vision-language: the text model's config */
            tc = field_get(root, "text_config");
            if (!tc) return missing(file, "", "text_config", err);
            if (!json_is_object(tc)) return wrong_type(file, "", "text_config", "object", tc, err);
            tp = "text_config.";
            cfg->text_nested = 1;
        }
    } else {
        return errbuf_set(err, EINVAL, "%s: field model_type: unsupported value \"%s\" (expected qwen3, llama, "
                          "qwen3_moe, qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text, qwen3_next or gpt_oss)", file,
                          mt);
    }
    int hybrid = cfg->arch == HF_ARCH_QWEN3_5 || cfg->arch == HF_ARCH_QWEN3_NEXT;
    if (cfg->arch == HF_ARCH_QWEN3_NEXT &&
        (ret = get_int(tc, file, tp, "num_experts", 0, 0, 0, 1 << 20, &cfg->num_experts, err)))
        return ret;
    /* MoE hybrids may have no dense intermediate_size: the drafter then takes 3 * hidden_size (hf_config.h) */
    int need_inter = !(hybrid && (moe || cfg->num_experts > 0));
    if ((ret = get_int(tc, file, tp, "hidden_size", 1, 0, 1, 1 << 20, &cfg->hidden_size, err)) ||
        (ret = get_int(tc, file, tp, "num_hidden_layers", 1, 0, 1, 100000, &cfg->num_layers, err)) ||
        (ret = get_int(tc, file, tp, "num_attention_heads", 1, 0, 1, 65536, &cfg->num_heads, err)) ||
        (ret = get_int(tc, file, tp, "intermediate_size", need_inter, 0, 1, 1 << 24, &cfg->intermediate_size,
                       err)) ||
        (ret = get_int(tc, file, tp, "vocab_size", 1, 0, 1, 1 << 30, &cfg->vocab_size, err)) ||
        (ret = get_positive(tc, file, tp, "rms_norm_eps", 1, &cfg->rms_eps, err)) ||
        (ret = get_int(tc, file, tp, "num_key_value_heads", 0, cfg->num_heads, 1, cfg->num_heads,
                       &cfg->num_kv_heads, err)))
        return ret;
    if (!cfg->intermediate_size) cfg->intermediate_size = 3 * cfg->hidden_size;
    if (cfg->num_heads % cfg->num_kv_heads != 0)
        return errbuf_set(err, EINVAL, "%s: field %snum_key_value_heads: %d does not divide num_attention_heads %d",
                          file, tp, cfg->num_kv_heads, cfg->num_heads);
    int def_head_dim = hybrid ? 256 : cfg->hidden_size / cfg->num_heads;
    if ((ret = get_int(tc, file, tp, "head_dim", 0, def_head_dim, 1, 1 << 16, &cfg->head_dim, err))) return ret;
    if (cfg->head_dim < 1)
        return errbuf_set(err, EINVAL, "%s: field head_dim: default hidden_size / num_attention_heads = %d / %d is 0",
                          file, cfg->hidden_size, cfg->num_heads);
    /* tie_word_embeddings and the dtype: the outer config's when it has them (vision-language), else the text's */
    const json_t *tie_obj = field_get(root, "tie_word_embeddings") ? root : tc;
    if ((ret = get_bool(tie_obj, file, "tie_word_embeddings", 0, &cfg->tie_embeddings, err)) ||
        (ret = get_int(tc, file, tp, "max_position_embeddings", 0, 0, 1, INT_MAX, &cfg->max_position, err)) ||
        (ret = parse_rope(cfg, tc, file, tp, err)))
        return ret;
    const json_t *dobj = root;
    if (!field_get(root, "torch_dtype") && !field_get(root, "dtype")) dobj = tc;
    const char *dkey = field_get(dobj, "torch_dtype") ? "torch_dtype" : "dtype";
    if ((ret = get_str(dobj, file, dobj == root ? "" : tp, dkey, cfg->torch_dtype, sizeof cfg->torch_dtype, 0, err)))
        return ret;
    if (hybrid) {
        if ((ret = parse_hybrid(cfg, tc, file, tp, moe, err))) return ret;
    } else {
        cfg->partial_rotary_factor = 1;
        cfg->rotary_dim = cfg->head_dim;
    }
    /* qwen3_moe: Qwen3 attention and the sparse MoE block (Qwen3MoeConfig: norm_topk_prob defaults to false; the
     * expert count is num_experts, which transformers 5 writes as num_local_experts) */
    if (cfg->arch == HF_ARCH_QWEN3_MOE) {
        const char *ek = !field_get(tc, "num_experts") && field_get(tc, "num_local_experts") ? "num_local_experts"
                                                                                               : "num_experts";
        if ((ret = get_int(tc, file, tp, ek, 1, 0, 1, 1 << 20, &cfg->num_experts, err)) ||
            (ret = parse_moe(cfg, tc, file, tp, 0, err)))
            return ret;
    }
    if (cfg->arch == HF_ARCH_GPT_OSS && (ret = parse_gpt_oss(cfg, tc, file, err))) return ret;
    if ((ret = parse_architectures(cfg, root, file, err))) return ret;
    if (cfg->is_dflash) return parse_dflash(cfg, root, file, err);
    return 0;
}

int hf_config_parse(hf_config *cfg, const char *json_text, const char *name, errbuf *err)
{
    memset(cfg, 0, sizeof *cfg);
    json_error_t jerr;
    json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return errbuf_set(err, EINVAL, "%s:%d:%d: invalid JSON: %s", name, jerr.line, jerr.column, jerr.text);
    int ret = parse_root(cfg, root, name, err);
    json_decref(root);
    if (ret) memset(cfg, 0, sizeof *cfg);
    return ret;
}

void hf_config_as_qwen3(hf_config *cfg)
{
    cfg->arch = HF_ARCH_QWEN3;
    snprintf(cfg->model_type, sizeof cfg->model_type, "qwen3");
    cfg->has_qk_norm = 1;
    cfg->is_hybrid = cfg->text_nested = 0;
    memset(cfg->layer_linear, 0, sizeof cfg->layer_linear);
    memset(cfg->layer_moe, 0, sizeof cfg->layer_moe);
    cfg->linear_num_k_heads = cfg->linear_num_v_heads = cfg->linear_k_head_dim = cfg->linear_v_head_dim = 0;
    cfg->linear_conv_kernel = 0;
    cfg->partial_rotary_factor = 1;
    cfg->rotary_dim = cfg->head_dim;
    cfg->num_experts = cfg->num_experts_per_tok = cfg->moe_intermediate_size = 0;
    cfg->shared_expert_intermediate_size = cfg->norm_topk_prob = 0;
    cfg->rope_yarn = cfg->rope_truncate = 0;
    cfg->rope_beta_fast = cfg->rope_beta_slow = cfg->rope_yarn_attention = 0;
    cfg->attention_bias = cfg->attn_sinks = cfg->experts_mxfp4 = cfg->moe_bias = 0;
    cfg->swiglu_alpha = cfg->swiglu_limit = 0;
    memset(cfg->layer_sliding, 0, sizeof cfg->layer_sliding);
    cfg->sliding_window = 0;
}

/* Read a whole (small) text file into *out (xmalloc'd, NUL-terminated). */
static int file_read(const char *path, char **out, errbuf *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return errbuf_set(err, errno, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, len = 0, r;
    char *buf = xmalloc(cap);
    int ret = 0;
    while ((r = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += r;
        if (len > (64u << 20)) {
            ret = errbuf_set(err, EFBIG, "%s: larger than 64 MiB, not a config.json", path);
            break;
        }
        if (cap - len - 1 == 0) buf = xrealloc(buf, cap *= 2);
    }
    if (!ret && ferror(f)) ret = errbuf_set(err, EIO, "%s: read error", path);
    fclose(f);
    if (!ret) {
        buf[len] = '\0';
        if (strlen(buf) != len) ret = errbuf_set(err, EINVAL, "%s: contains a NUL byte, not a config.json", path);
    }
    if (ret) free(buf);
    else *out = buf;
    return ret;
}

int hf_config_load(hf_config *cfg, const char *path, errbuf *err)
{
    memset(cfg, 0, sizeof *cfg);
    struct stat sb;
    char *p;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        size_t n = strlen(path) + sizeof "/config.json";
        p = xmalloc(n);
        snprintf(p, n, "%s/config.json", path);
    } else {
        p = xstrdup(path);
    }
    char *text;
    int ret = file_read(p, &text, err);
    if (!ret) ret = hf_config_parse(cfg, text, p, err);
    free(text);
    free(p);
    return ret;
}

/* Fewest significant digits (<= 17) that print v so that it reads back exactly. */
static int real_digits(double v)
{
    char buf[40];
    for (int p = 1; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, v);
        if (strtod(buf, NULL) == v) return p;
    }
    return 17;
}

static int write_atomic(const char *path, const char *text, errbuf *err)
{
    size_t tn = strlen(path) + 5, len = strlen(text);
    char *tmp = xmalloc(tn);
    snprintf(tmp, tn, "%s.tmp", path);
    int ret = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        ret = errbuf_set(err, errno, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return ret;
    }
    const char *p = text;
    while (len && !ret) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno != EINTR) ret = -errno;
        if (w > 0) {
            p += w;
            len -= (size_t)w;
        }
    }
    if (!ret && fsync(fd) < 0) ret = -errno;
    if (close(fd) < 0 && !ret) ret = -errno;
    if (!ret && rename(tmp, path) < 0) ret = -errno;
    if (ret) {
        errbuf_set(err, -ret, "%s: cannot write: %s", path, strerror(-ret));
        unlink(tmp);
        free(tmp);
        return ret;
    }
    free(tmp);
    if ((ret = fsync_parent(path))) errbuf_set(err, -ret, "%s: cannot fsync its directory: %s", path, strerror(-ret));
    return ret;
}

int hf_eos_tokens(const char *dir, int vocab, int32_t *eos, int max, int *neos, errbuf *err)
{
    const char *files[] = {"generation_config.json", "config.json"};
    *neos = 0;
    for (int f = 0; f < 2 && *neos == 0; f++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, files[f]);
        if (access(path, F_OK) != 0) continue;
        json_t *root;
        int lrc = json_file_load(&root, path, 0, err);
        if (lrc) return lrc;
        const json_t *e = json_object_get(root, "eos_token_id");
        if (e && !json_is_null(e) && !json_is_integer(e) && !json_is_array(e)) {
            int rc = errbuf_set(err, EINVAL, "%s: field eos_token_id: expected an id or a list of ids, got %s", path,
                                json_type_name(e));
            json_decref(root);
            return rc;
        }
        size_t n = json_is_array(e) ? json_array_size(e) : json_is_integer(e) ? 1 : 0;
        for (size_t i = 0; i < n; i++) {
            const json_t *v = json_is_array(e) ? json_array_get(e, i) : e;
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab || *neos == max) {
                int rc = errbuf_set(err, EINVAL, "%s: field eos_token_id[%zu]: %s", path, i,
                                    *neos == max ? "too many ids" : "not a token id of the vocabulary");
                json_decref(root);
                return rc;
            }
            int32_t id = (int32_t)json_integer_value(v), dup = 0;
            for (int k = 0; k < *neos; k++) dup |= eos[k] == id;
            if (!dup) eos[(*neos)++] = id;
        }
        json_decref(root);
    }
    return 0;
}

int hf_config_write_dflash(const hf_config *cfg, const char *path, errbuf *err)
{
    if (cfg->num_taps < 1 || cfg->num_taps > HF_MAX_TAPS)
        return errbuf_set(err, EINVAL, "%s: cannot write: num_taps %d out of range [1, %d]", path, cfg->num_taps,
                          HF_MAX_TAPS);
    json_t *root = json_object(), *layer_types = json_array(), *taps = json_array();
    int nsliding = 0;
    for (int i = 0; i < cfg->num_layers; i++) {
        nsliding += cfg->layer_sliding[i];
        json_array_append_new(layer_types, json_string(cfg->layer_sliding[i] ? "sliding_attention" : "full_attention"));
    }
    for (int i = 0; i < cfg->num_taps; i++) json_array_append_new(taps, json_integer(cfg->taps[i]));
    json_object_set_new(root, "architectures", json_pack("[s]", "DFlashDraftModel"));
    json_object_set_new(root, "model_type", json_string(cfg->model_type[0] ? cfg->model_type : "qwen3"));
    json_object_set_new(root, "hidden_size", json_integer(cfg->hidden_size));
    json_object_set_new(root, "intermediate_size", json_integer(cfg->intermediate_size));
    json_object_set_new(root, "num_hidden_layers", json_integer(cfg->num_layers));
    json_object_set_new(root, "num_attention_heads", json_integer(cfg->num_heads));
    json_object_set_new(root, "num_key_value_heads", json_integer(cfg->num_kv_heads));
    json_object_set_new(root, "head_dim", json_integer(cfg->head_dim));
    json_object_set_new(root, "rms_norm_eps", json_real(cfg->rms_eps));
    json_object_set_new(root, "rope_theta", json_real(cfg->rope_theta));
    int digits = real_digits(cfg->rms_eps);
    if (real_digits(cfg->rope_theta) > digits) digits = real_digits(cfg->rope_theta);
    if (cfg->rope_llama3) {
        json_object_set_new(root, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", cfg->rope_factor,
                                      "low_freq_factor", cfg->rope_low_freq_factor, "high_freq_factor",
                                      cfg->rope_high_freq_factor, "original_max_position_embeddings",
                                      cfg->rope_original_max_position));
        double r[3] = {cfg->rope_factor, cfg->rope_low_freq_factor, cfg->rope_high_freq_factor};
        for (int i = 0; i < 3; i++)
            if (real_digits(r[i]) > digits) digits = real_digits(r[i]);
    }
    json_object_set_new(root, "vocab_size", json_integer(cfg->vocab_size));
    if (cfg->max_position > 0) json_object_set_new(root, "max_position_embeddings", json_integer(cfg->max_position));
    json_object_set_new(root, "tie_word_embeddings", json_boolean(cfg->tie_embeddings));
    json_object_set_new(root, "attention_bias", json_false());
    json_object_set_new(root, "torch_dtype", json_string(cfg->torch_dtype[0] ? cfg->torch_dtype : "bfloat16"));
    json_object_set_new(root, "block_size", json_integer(cfg->block_size));
    json_object_set_new(root, "num_target_layers", json_integer(cfg->num_target_layers));
    json_object_set_new(root, "layer_types", layer_types);
    if (nsliding) { /* read as z-lab's model.py does (hf_config.h); no key is written for a drafter without them */
        json_object_set_new(root, "use_sliding_window", json_boolean(cfg->sliding_window > 0));
        if (cfg->sliding_window > 0) json_object_set_new(root, "sliding_window", json_integer(cfg->sliding_window));
        json_object_set_new(root, "is_causal", json_false());
    }
    json_object_set_new(root, "dflash_config", json_pack("{s:i, s:o}", "mask_token_id", cfg->mask_token_id,
                                                         "target_layer_ids", taps));
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(digits));
    json_decref(root);
    DF_ASSERT(text);
    size_t n = strlen(text);
    char *withnl = xmalloc(n + 2);
    memcpy(withnl, text, n);
    memcpy(withnl + n, "\n", 2);
    free(text);
    int ret = write_atomic(path, withnl, err);
    free(withnl);
    return ret;
}

int32_t hf_reserved_token(const hf_config *target, const hf_config *drafter)
{
    return drafter && drafter->is_dflash ? drafter->mask_token_id : target->vocab_size - 1;
}
