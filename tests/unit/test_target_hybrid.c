/* target_hybrid: the hybrid Qwen3.5-family configs (text, vision-language text_config, Qwen3-Next layer rules, the
 * errors naming file and field, the drafter derived from such a target), and the checkpoint layouts the loader must
 * read to the same forward: the golden's Qwen3.5 checkpoint rewritten as Qwen3-Next's fused in_proj_qkvz /
 * in_proj_ba (and a conv weight squeezed to (C, K)), as a sharded vision-language checkpoint
 * (model.language_model.*, vision and MTP tensors beside it), and the MoE golden with transformers' fused experts
 * (gate_up_proj). Also: packed sequences are independent (conv history and delta-rule state restart), a partial
 * load gives the same taps, and the delta-rule kernel against a direct evaluation of its closed form. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gated_delta_rule.h"
#include "hf_config.h"
#include "rng.h"
#include "safetensors.h"
#include "target_model.h"
#include "tests/test.h"
#include "util.h"

static int parse(hf_config *c, const char *text, errbuf *err) { return hf_config_parse(c, text, "test.json", err); }

/* ---- configs ---- */

TEST(golden_configs)
{
    hf_config c;
    errbuf err = {{0}};
    int rc = hf_config_load(&c, test_golden("qwen35-tiny/target"), &err);
    if (rc) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(rc == 0);
    EXPECT(c.arch == HF_ARCH_QWEN3_5 && c.is_hybrid && !c.text_nested && c.has_qk_norm);
    EXPECT(c.hidden_size == 64 && c.num_layers == 6 && c.num_heads == 4 && c.num_kv_heads == 2 && c.head_dim == 32);
    EXPECT(c.intermediate_size == 160 && c.vocab_size == 512 && c.num_experts == 0);
    EXPECT(c.linear_num_k_heads == 2 && c.linear_num_v_heads == 4 && c.linear_k_head_dim == 16);
    EXPECT(c.linear_v_head_dim == 24 && c.linear_conv_kernel == 4);
    EXPECT(c.partial_rotary_factor == 0.25 && c.rotary_dim == 8 && c.rope_theta == 1e7);
    const unsigned char lin[6] = {1, 1, 1, 0, 1, 0};
    for (int i = 0; i < 6; i++) EXPECT(c.layer_linear[i] == lin[i]);
    rc = hf_config_load(&c, test_golden("qwen35moe-tiny/target"), &err);
    if (rc) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(rc == 0);
    EXPECT(c.arch == HF_ARCH_QWEN3_5 && c.is_hybrid && c.num_experts == 8 && c.num_experts_per_tok == 2);
    EXPECT(c.moe_intermediate_size == 32 && c.shared_expert_intermediate_size == 48 && c.norm_topk_prob == 1);
    EXPECT(c.intermediate_size == 3 * 64); /* none in the config: the drafter's MLP width */
    for (int i = 0; i < 6; i++) EXPECT(c.layer_moe[i] == 1);
}

TEST(vision_language_text_config)
{
    const char *text = "{\"model_type\": \"qwen3_5_moe\", \"tie_word_embeddings\": true, \"dtype\": \"bfloat16\","
                       " \"text_config\": {\"model_type\": \"qwen3_5_moe_text\", \"hidden_size\": 32,"
                       " \"num_hidden_layers\": 3, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
                       " \"head_dim\": 16, \"vocab_size\": 100, \"rms_norm_eps\": 1e-6, \"num_experts\": 4,"
                       " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, \"tie_word_embeddings\": false,"
                       " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e6,"
                       " \"partial_rotary_factor\": 0.5, \"mrope_section\": [1, 1, 0], \"mrope_interleaved\": true},"
                       " \"full_attention_interval\": 3}}";
    hf_config c;
    errbuf err = {{0}};
    int rc = parse(&c, text, &err);
    if (rc) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(rc == 0);
    EXPECT(c.text_nested && c.is_hybrid && c.hidden_size == 32 && c.num_layers == 3 && c.head_dim == 16);
    EXPECT(c.tie_embeddings == 1 && strcmp(c.torch_dtype, "bfloat16") == 0); /* the outer config's */
    EXPECT(c.rotary_dim == 8 && c.rope_theta == 1e6 && c.num_experts == 4 && c.shared_expert_intermediate_size == 0);
    EXPECT(c.layer_linear[0] == 1 && c.layer_linear[1] == 1 && c.layer_linear[2] == 0);
    EXPECT(c.linear_num_k_heads == 16 && c.linear_num_v_heads == 32 && c.linear_k_head_dim == 128); /* defaults */
    /* a missing text field is named with its path */
    rc = parse(&c, "{\"model_type\": \"qwen3_5\", \"text_config\": {\"num_hidden_layers\": 2}}", &err);
    EXPECT(rc == -EINVAL);
    EXPECT_CONTAINS(err.msg, "test.json");
    EXPECT_CONTAINS(err.msg, "text_config.hidden_size");
    rc = parse(&c, "{\"model_type\": \"qwen3_5\"}", &err);
    EXPECT(rc == -EINVAL);
    EXPECT_CONTAINS(err.msg, "text_config");
}

static const char *NEXT_BASE =
    "\"hidden_size\": 32, \"num_hidden_layers\": 8, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
    " \"intermediate_size\": 48, \"vocab_size\": 100, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1e4, \"head_dim\": 16";

TEST(qwen3_next_rules)
{
    char text[2048];
    snprintf(text, sizeof text, "{\"model_type\": \"qwen3_next\", %s, \"partial_rotary_factor\": 0.5,"
             " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8,"
             " \"shared_expert_intermediate_size\": 8, \"decoder_sparse_step\": 2, \"mlp_only_layers\": [3],"
             " \"norm_topk_prob\": false}", NEXT_BASE);
    hf_config c;
    errbuf err = {{0}};
    int rc = parse(&c, text, &err);
    if (rc) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(rc == 0);
    EXPECT(c.arch == HF_ARCH_QWEN3_NEXT && c.is_hybrid && c.rotary_dim == 8 && c.norm_topk_prob == 0);
    EXPECT(c.intermediate_size == 48);
    const unsigned char lin[8] = {1, 1, 1, 0, 1, 1, 1, 0}, moe[8] = {0, 1, 0, 0, 0, 1, 0, 1};
    for (int i = 0; i < 8; i++) EXPECT(c.layer_linear[i] == lin[i] && c.layer_moe[i] == moe[i]);
    /* no experts: dense everywhere; partial_rotary_factor defaults to 0.25 */
    snprintf(text, sizeof text, "{\"model_type\": \"qwen3_next\", %s}", NEXT_BASE);
    REQUIRE(parse(&c, text, &err) == 0);
    EXPECT(c.num_experts == 0 && c.rotary_dim == 4);
}

TEST(hybrid_errors)
{
    struct { const char *extra, *want; } cases[] = {
        {"\"model_type\": \"qwen3_5_text\", \"layer_types\": [\"linear_attention\"]", "layer_types: 1 entries"},
        {"\"model_type\": \"qwen3_5_text\", \"layer_types\": [\"linear_attention\", \"full_attention\","
         " \"linear_attention\", \"sliding\", \"full_attention\", \"full_attention\", \"full_attention\","
         " \"full_attention\"]", "layer_types[3]"},
        {"\"model_type\": \"qwen3_5_text\", \"linear_num_key_heads\": 3, \"linear_num_value_heads\": 4",
         "linear_num_value_heads"},
        {"\"model_type\": \"qwen3_5_text\", \"partial_rotary_factor\": 0.01", "partial_rotary_factor"},
        {"\"model_type\": \"qwen3_5_moe_text\", \"num_experts\": 4", "num_experts_per_tok"},
        {"\"model_type\": \"qwen3_next\", \"num_experts\": 4, \"num_experts_per_tok\": 2,"
         " \"moe_intermediate_size\": 8, \"mlp_only_layers\": [9]", "mlp_only_layers[0]"},
        {"\"model_type\": \"qwen4\"", "model_type: unsupported value \"qwen4\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[2048];
        snprintf(text, sizeof text, "{%s, %s}", cases[i].extra, NEXT_BASE);
        hf_config c;
        errbuf err = {{0}};
        int rc = parse(&c, text, &err);
        EXPECT(rc == -EINVAL);
        EXPECT_CONTAINS(err.msg, "test.json");
        EXPECT_CONTAINS(err.msg, cases[i].want);
    }
}

/* The drafter derived from a hybrid target keeps its shapes and drops every hybrid field. */
TEST(drafter_from_hybrid_target)
{
    hf_config c;
    errbuf err = {{0}};
    REQUIRE(hf_config_load(&c, test_golden("qwen35moe-tiny/target"), &err) == 0);
    hf_config_as_qwen3(&c);
    EXPECT(c.arch == HF_ARCH_QWEN3 && strcmp(c.model_type, "qwen3") == 0 && c.has_qk_norm == 1 && !c.is_hybrid);
    EXPECT(c.hidden_size == 64 && c.num_heads == 4 && c.num_kv_heads == 2 && c.head_dim == 32 && c.vocab_size == 512);
    EXPECT(c.intermediate_size == 192 && c.rope_theta == 1e7 && c.rotary_dim == 32 && c.partial_rotary_factor == 1);
    EXPECT(c.num_experts == 0 && c.linear_num_v_heads == 0 && c.layer_linear[0] == 0 && c.layer_moe[0] == 0);
}

/* ---- checkpoint layouts ---- */

/* Every tensor of a checkpoint as f32, with its name and shape (for rewriting). */
typedef struct ckpt {
    int n;
    st_write_tensor *t;
    float **data;
} ckpt;

static void ckpt_read(ckpt *k, const char *dir)
{
    st_file *st = NULL;
    errbuf err = {{0}};
    REQUIRE(st_open(&st, dir, &err) == 0);
    k->n = st_count(st);
    k->t = xcalloc((size_t)k->n + 16, sizeof *k->t);
    k->data = xcalloc((size_t)k->n + 16, sizeof *k->data);
    for (int i = 0; i < k->n; i++) {
        const st_tensor *s = st_at(st, i);
        k->t[i].name = xstrdup(s->name);
        k->t[i].dtype = ST_F32;
        k->t[i].ndim = s->ndim;
        memcpy(k->t[i].shape, s->shape, sizeof s->shape);
        size_t cnt = 0;
        REQUIRE(st_load_f32(st, s->name, &k->data[i], -1, NULL, &cnt, &err) == 0);
        k->t[i].data = k->data[i];
    }
    st_close(&st);
}

static void ckpt_free(ckpt *k)
{
    for (int i = 0; i < k->n; i++) {
        free((char *)k->t[i].name);
        free(k->data[i]);
    }
    free(k->t);
    free(k->data);
}

static int ckpt_find(const ckpt *k, const char *name)
{
    for (int i = 0; i < k->n; i++)
        if (!strcmp(k->t[i].name, name)) return i;
    return -1;
}

/* Replace tensor i by (name, shape, data) (data owned by k afterwards). */
static void ckpt_set(ckpt *k, int i, const char *name, int ndim, const int64_t *shape, float *data)
{
    if (i < 0) i = k->n++;
    else {
        free((char *)k->t[i].name);
        free(k->data[i]);
    }
    k->t[i].name = xstrdup(name);
    k->t[i].dtype = ST_F32;
    k->t[i].ndim = ndim;
    memset(k->t[i].shape, 0, sizeof k->t[i].shape);
    memcpy(k->t[i].shape, shape, sizeof(int64_t) * (size_t)ndim);
    k->data[i] = data;
    k->t[i].data = data;
}

static void ckpt_drop(ckpt *k, int i)
{
    free((char *)k->t[i].name);
    free(k->data[i]);
    k->t[i] = k->t[k->n - 1];
    k->data[i] = k->data[k->n - 1];
    k->n--;
}

static char *tmpdir(void)
{
    char *d = xstrdup("/tmp/dflash-hybrid-XXXXXX");
    REQUIRE(mkdtemp(d));
    return d;
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    REQUIRE(f);
    fputs(text, f);
    fclose(f);
}

static json_t *golden_config(const char *rel)
{
    json_error_t je;
    json_t *j = json_load_file(test_golden(rel), 0, &je);
    REQUIRE(j);
    return j;
}

static void write_config(const char *dir, json_t *cfg)
{
    char *s = json_dumps(cfg, JSON_INDENT(1));
    write_text(dir, "config.json", s);
    free(s);
}

/* The golden batch's inputs. */
typedef struct batch_in {
    int32_t *ids, *pos, *cu;
    size_t T, ncu;
    target_batch b;
} batch_in;

static void batch_load(batch_in *bi, const char *case_rel)
{
    st_file *st = NULL;
    errbuf err = {{0}};
    REQUIRE(st_open(&st, test_golden(case_rel), &err) == 0);
    size_t np = 0;
    REQUIRE(st_load_i32(st, "input_ids", &bi->ids, &bi->T, &err) == 0);
    REQUIRE(st_load_i32(st, "position_ids", &bi->pos, &np, &err) == 0);
    REQUIRE(st_load_i32(st, "cu_seqlens", &bi->cu, &bi->ncu, &err) == 0);
    st_close(&st);
    bi->b = (target_batch){.ntok = (int)bi->T, .nseq = (int)bi->ncu - 1, .input_ids = bi->ids, .positions = bi->pos,
                           .cu_seqlens = bi->cu};
}

static void batch_free(batch_in *bi)
{
    free(bi->ids);
    free(bi->pos);
    free(bi->cu);
}

/* Taps [1, 3, 4] and the logits of the model in dir over the batch. */
static void run_model(const char *dir, const target_batch *b, float **aux, float **logits)
{
    target_model *m = NULL;
    errbuf err = {{0}};
    int rc = target_model_load(&m, dir, -1, &err);
    if (rc) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(rc == 0);
    const hf_config *c = target_model_config(m);
    const int taps[3] = {1, 3, 4};
    *aux = xmalloc(sizeof(float) * (size_t)b->ntok * 3 * (size_t)c->hidden_size);
    *logits = xmalloc(sizeof(float) * (size_t)b->ntok * (size_t)c->vocab_size);
    rc = target_model_forward(m, b, taps, 3, *aux, NULL, *logits, &err);
    if (rc) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(rc == 0);
    target_model_destroy(&m);
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

/* The reference run of a golden target, and a comparison of another checkpoint's run against it. */
static void expect_same_forward(const char *ref_dir, const char *dir, const batch_in *bi, int H, int V)
{
    float *a0, *l0, *a1, *l1;
    run_model(ref_dir, &bi->b, &a0, &l0);
    run_model(dir, &bi->b, &a1, &l1);
    double da = max_diff(a0, a1, bi->T * 3 * (size_t)H), dl = max_diff(l0, l1, bi->T * (size_t)V);
    if (da > 1e-5 || dl > 1e-5) fprintf(stderr, "  %s: taps differ by %g, logits by %g\n", dir, da, dl);
    EXPECT(da <= 1e-5 && dl <= 1e-5);
    free(a0); free(l0); free(a1); free(l1);
}

static void rm_rf(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "  could not remove %s\n", dir);
}

/* Qwen3-Next's fused in_proj_qkvz (per key head: q, k, r value heads of v, r of z) and in_proj_ba (r b, r a). */
TEST(qwen3_next_fused_layout)
{
    ckpt k;
    ckpt_read(&k, test_golden("qwen35-tiny/target"));
    const int64_t H = 64, HK = 2, HV = 4, Dk = 16, Dv = 24, r = HV / HK, grp = 2 * Dk + 2 * r * Dv;
    const unsigned char lin[6] = {1, 1, 1, 0, 1, 0};
    char n[160];
    for (int L = 0; L < 6; L++) {
        if (!lin[L]) continue;
        int iq, iz, ib, ia;
        snprintf(n, sizeof n, "model.layers.%d.linear_attn.in_proj_qkv.weight", L);
        iq = ckpt_find(&k, n);
        snprintf(n, sizeof n, "model.layers.%d.linear_attn.in_proj_z.weight", L);
        iz = ckpt_find(&k, n);
        snprintf(n, sizeof n, "model.layers.%d.linear_attn.in_proj_b.weight", L);
        ib = ckpt_find(&k, n);
        snprintf(n, sizeof n, "model.layers.%d.linear_attn.in_proj_a.weight", L);
        ia = ckpt_find(&k, n);
        REQUIRE(iq >= 0 && iz >= 0 && ib >= 0 && ia >= 0);
        const float *qkv = k.data[iq], *z = k.data[iz], *b = k.data[ib], *a = k.data[ia];
        float *qkvz = xmalloc(sizeof(float) * (size_t)(HK * grp * H));
        float *ba = xmalloc(sizeof(float) * (size_t)(HV * 2 * H));
        const size_t row = sizeof(float) * (size_t)H;
        for (int64_t g = 0; g < HK; g++) {
            float *dst = qkvz + g * grp * H;
            memcpy(dst, qkv + g * Dk * H, row * Dk);
            memcpy(dst + Dk * H, qkv + (HK * Dk + g * Dk) * H, row * Dk);
            memcpy(dst + 2 * Dk * H, qkv + (2 * HK * Dk + g * r * Dv) * H, row * r * Dv);
            memcpy(dst + (2 * Dk + r * Dv) * H, z + g * r * Dv * H, row * r * Dv);
            memcpy(ba + g * 2 * r * H, b + g * r * H, row * r);
            memcpy(ba + (g * 2 * r + r) * H, a + g * r * H, row * r);
        }
        int64_t s1[2] = {HK * grp, H}, s2[2] = {HV * 2, H};
        snprintf(n, sizeof n, "model.layers.%d.linear_attn.in_proj_qkvz.weight", L);
        ckpt_set(&k, iq, n, 2, s1, qkvz);
        snprintf(n, sizeof n, "model.layers.%d.linear_attn.in_proj_ba.weight", L);
        ckpt_set(&k, ib, n, 2, s2, ba);
        snprintf(n, sizeof n, "model.layers.%d.linear_attn.in_proj_z.weight", L);
        ckpt_drop(&k, ckpt_find(&k, n));
        snprintf(n, sizeof n, "model.layers.%d.linear_attn.in_proj_a.weight", L);
        ckpt_drop(&k, ckpt_find(&k, n));
    }
    /* and one depthwise conv weight squeezed to (C, K), as some converters store it */
    int ic = ckpt_find(&k, "model.layers.0.linear_attn.conv1d.weight");
    REQUIRE(ic >= 0 && k.t[ic].ndim == 3);
    k.t[ic].ndim = 2;
    k.t[ic].shape[1] = k.t[ic].shape[2];
    k.t[ic].shape[2] = 0;
    char *dir = tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    errbuf err = {{0}};
    REQUIRE(st_write(path, k.t, k.n, NULL, &err) == 0);
    json_t *cfg = golden_config("qwen35-tiny/target/config.json");
    json_object_set_new(cfg, "model_type", json_string("qwen3_next"));
    json_object_set_new(cfg, "architectures", json_pack("[s]", "Qwen3NextForCausalLM"));
    json_object_del(cfg, "layer_types"); /* Qwen3-Next's rule must give the same: (i+1) % 4 == 0 is full */
    json_object_set_new(cfg, "full_attention_interval", json_integer(4));
    write_config(dir, cfg);
    hf_config c;
    REQUIRE(hf_config_load(&c, dir, &err) == 0);
    /* the golden's layer_types (L L L F L F) differ from the interval rule at layer 5: put them back */
    EXPECT(c.layer_linear[3] == 0 && c.layer_linear[5] == 1);
    json_t *lt = json_array();
    for (int L = 0; L < 6; L++) json_array_append_new(lt, json_string(lin[L] ? "linear_attention" : "full_attention"));
    json_object_set_new(cfg, "layer_types", lt);
    write_config(dir, cfg);
    json_decref(cfg);
    batch_in bi;
    batch_load(&bi, "qwen35-tiny/case.safetensors");
    expect_same_forward(test_golden("qwen35-tiny/target"), dir, &bi, 64, 512);
    ckpt_free(&k);
    batch_free(&bi);
    rm_rf(dir);
    free(dir);
}

/* A vision-language checkpoint: text weights under model.language_model., vision and MTP tensors beside them,
 * two shards with an index, the config's fields under text_config. */
TEST(vision_language_sharded_layout)
{
    ckpt k;
    ckpt_read(&k, test_golden("qwen35-tiny/target"));
    char n[200];
    for (int i = 0; i < k.n; i++) {
        if (strncmp(k.t[i].name, "model.", 6) != 0) continue;
        snprintf(n, sizeof n, "model.language_model.%s", k.t[i].name + 6);
        free((char *)k.t[i].name);
        k.t[i].name = xstrdup(n);
    }
    int64_t s1[2] = {4, 8}, s2[1] = {64};
    float *vis = xcalloc(32, sizeof(float)), *mtp = xcalloc(64, sizeof(float));
    ckpt_set(&k, -1, "model.visual.patch_embed.proj.weight", 2, s1, vis);
    ckpt_set(&k, -1, "mtp.norm.weight", 1, s2, mtp);
    char *dir = tmpdir(), path[512];
    errbuf err = {{0}};
    const int half = k.n / 2;
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    REQUIRE(st_write(path, k.t, half, NULL, &err) == 0);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    REQUIRE(st_write(path, k.t + half, k.n - half, NULL, &err) == 0);
    json_t *wm = json_object();
    for (int i = 0; i < k.n; i++)
        json_object_set_new(wm, k.t[i].name, json_string(i < half ? "model-00001-of-00002.safetensors"
                                                                  : "model-00002-of-00002.safetensors"));
    json_t *idx = json_pack("{s:{}, s:o}", "metadata", "weight_map", wm);
    char *s = json_dumps(idx, 0);
    write_text(dir, "model.safetensors.index.json", s);
    free(s);
    json_decref(idx);
    json_t *text = golden_config("qwen35-tiny/target/config.json");
    json_t *cfg = json_pack("{s:s, s:[s], s:b, s:O, s:{s:i}}", "model_type", "qwen3_5", "architectures",
                            "Qwen3_5ForConditionalGeneration", "tie_word_embeddings", 0, "text_config", text,
                            "vision_config", "depth", 1);
    json_decref(text);
    write_config(dir, cfg);
    json_decref(cfg);
    batch_in bi;
    batch_load(&bi, "qwen35-tiny/case.safetensors");
    expect_same_forward(test_golden("qwen35-tiny/target"), dir, &bi, 64, 512);
    /* a missing text tensor is named with its full name and the checkpoint */
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    int drop = ckpt_find(&k, "model.language_model.layers.4.linear_attn.dt_bias");
    REQUIRE(drop >= half);
    ckpt_drop(&k, drop);
    REQUIRE(st_write(path, k.t + half, k.n - half, NULL, &err) == 0);
    target_model *m = NULL;
    EXPECT(target_model_load(&m, dir, -1, &err) != 0 && m == NULL);
    EXPECT_CONTAINS(err.msg, "model.language_model.layers.4.linear_attn.dt_bias");
    ckpt_free(&k);
    batch_free(&bi);
    rm_rf(dir);
    free(dir);
}

/* The MoE golden with transformers' fused experts: mlp.experts.gate_up_proj (E, 2*Im, H), down_proj (E, H, Im). */
TEST(moe_fused_experts_layout)
{
    ckpt k;
    ckpt_read(&k, test_golden("qwen35moe-tiny/target"));
    const int64_t E = 8, H = 64, Im = 32;
    char n[200];
    for (int L = 0; L < 6; L++) {
        float *gu = xmalloc(sizeof(float) * (size_t)(E * 2 * Im * H));
        float *dn = xmalloc(sizeof(float) * (size_t)(E * H * Im));
        for (int64_t e = 0; e < E; e++) {
            const char *part[3] = {"gate_proj", "up_proj", "down_proj"};
            for (int p = 0; p < 3; p++) {
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%lld.%s.weight", L, (long long)e, part[p]);
                int i = ckpt_find(&k, n);
                REQUIRE(i >= 0);
                float *dst = p == 0 ? gu + e * 2 * Im * H : p == 1 ? gu + (e * 2 + 1) * Im * H : dn + e * H * Im;
                memcpy(dst, k.data[i], sizeof(float) * (size_t)(Im * H));
                ckpt_drop(&k, i);
            }
        }
        int64_t s1[3] = {E, 2 * Im, H}, s2[3] = {E, H, Im};
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj", L);
        ckpt_set(&k, -1, n, 3, s1, gu);
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_proj", L);
        ckpt_set(&k, -1, n, 3, s2, dn);
    }
    char *dir = tmpdir(), path[512];
    errbuf err = {{0}};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    REQUIRE(st_write(path, k.t, k.n, NULL, &err) == 0);
    json_t *cfg = golden_config("qwen35moe-tiny/target/config.json");
    write_config(dir, cfg);
    json_decref(cfg);
    batch_in bi;
    batch_load(&bi, "qwen35moe-tiny/case.safetensors");
    expect_same_forward(test_golden("qwen35moe-tiny/target"), dir, &bi, 64, 512);
    ckpt_free(&k);
    batch_free(&bi);
    rm_rf(dir);
    free(dir);
}

/* Sequences of a packed batch are independent: each run alone gives the same taps; a load up to the deepest tap
 * gives the same taps as the full model. */
TEST(packed_sequences_independent)
{
    batch_in bi;
    batch_load(&bi, "qwen35moe-tiny/case.safetensors");
    target_model *m = NULL, *p = NULL;
    errbuf err = {{0}};
    REQUIRE(target_model_load(&m, test_golden("qwen35moe-tiny/target"), -1, &err) == 0);
    REQUIRE(target_model_load(&p, test_golden("qwen35moe-tiny/target"), 4, &err) == 0);
    EXPECT(target_model_loaded_layers(p) == 4);
    const int H = 64, taps[3] = {1, 3, 4};
    const size_t T = bi.T;
    float *all = xmalloc(sizeof(float) * T * 3 * H), *part = xmalloc(sizeof(float) * T * 3 * H);
    float *one = xmalloc(sizeof(float) * T * 3 * H);
    REQUIRE(target_model_forward(m, &bi.b, taps, 3, all, NULL, NULL, &err) == 0);
    REQUIRE(target_model_forward(p, &bi.b, taps, 3, part, NULL, NULL, &err) == 0);
    EXPECT(max_diff(all, part, T * 3 * H) == 0);
    EXPECT(target_model_forward(p, &bi.b, taps, 3, part, NULL, one, &err) != 0); /* logits need the full model */
    for (int s = 0; s < bi.b.nseq; s++) {
        int t0 = bi.cu[s], n = bi.cu[s + 1] - t0;
        int32_t cu1[2] = {0, n};
        target_batch b1 = {.ntok = n, .nseq = 1, .input_ids = bi.ids + t0, .positions = bi.pos + t0, .cu_seqlens = cu1};
        REQUIRE(target_model_forward(m, &b1, taps, 3, one, NULL, NULL, &err) == 0);
        /* the golden tolerance: BLAS blocks a different row count differently */
        double d = max_diff(one, all + (size_t)t0 * 3 * H, (size_t)n * 3 * H), tol = 0;
        for (size_t i = 0; i < (size_t)n * 3 * H; i++) tol = fmax(tol, fabs(one[i]));
        tol = 1e-4 * fmax(1.0, tol);
        if (d > tol) fprintf(stderr, "  sequence %d alone differs by %g (tol %g)\n", s, d, tol);
        EXPECT(d <= tol);
    }
    free(all); free(part); free(one);
    target_model_destroy(&m);
    target_model_destroy(&p);
    batch_free(&bi);
}

/* The kernel against the closed form of its recurrence, o_t = Σ_{s<=t} (Π_{u in (s, t]} exp(g_u)) · (q_t·k_s) ·
 * delta_s where delta_s = β_s (v_s − S_{s-1}ᵀ k_s) is itself recomputed from that sum: checked on two sequences
 * (GVA 2 value heads per key head), each from a zero state. */
TEST(gated_delta_rule_closed_form)
{
    const int hk = 1, hv = 2, dk = 3, dv = 2, T = 9, nseq = 2;
    const int32_t cu[3] = {0, 4, 9};
    rng r;
    rng_seed(&r, 42, 1, 2, 3);
    float q[T * hk * dk], k[T * hk * dk], v[T * hv * dv], g[T * hv], beta[T * hv], out[T * hv * dv];
    for (int i = 0; i < T * hk * dk; i++) { q[i] = rng_normal(&r); k[i] = rng_normal(&r) * 0.5f; }
    for (int i = 0; i < T * hv * dv; i++) v[i] = rng_normal(&r);
    for (int i = 0; i < T * hv; i++) { g[i] = -0.1f - 0.5f * rng_uniform(&r); beta[i] = rng_uniform(&r); }
    gated_delta_rule_forward_cpu(out, hv * dv, q, hk * dk, k, hk * dk, v, hv * dv, g, hv, beta, hv, cu, nseq, hk, hv,
                                 dk, dv);
    for (int s = 0; s < nseq; s++)
        for (int h = 0; h < hv; h++) {
            double delta[T][dv];
            for (int t = cu[s]; t < cu[s + 1]; t++) {
                /* S_t = Σ_{u<=t} decay(u, t] k_u ⊗ delta_u, with decay(u, t] = exp(Σ_{w in (u, t]} g_w) */
                double sk[dv], so[dv];
                for (int j = 0; j < dv; j++) sk[j] = so[j] = 0;
                for (int u = cu[s]; u < t; u++) {
                    double lg = 0;
                    for (int w = u + 1; w <= t; w++) lg += g[w * hv + h];
                    double kk = 0;
                    for (int i = 0; i < dk; i++) kk += (double)k[u * dk + i] * k[t * dk + i];
                    for (int j = 0; j < dv; j++) sk[j] += exp(lg) * kk * delta[u][j];
                }
                for (int j = 0; j < dv; j++) delta[t][j] = beta[t * hv + h] * (v[t * hv * dv + h * dv + j] - sk[j]);
                for (int u = cu[s]; u <= t; u++) {
                    double lg = 0;
                    for (int w = u + 1; w <= t; w++) lg += g[w * hv + h];
                    double qk = 0;
                    for (int i = 0; i < dk; i++) qk += (double)q[t * dk + i] * k[u * dk + i];
                    for (int j = 0; j < dv; j++) so[j] += exp(lg) * qk * delta[u][j];
                }
                for (int j = 0; j < dv; j++) EXPECT_NEAR(out[t * hv * dv + h * dv + j], so[j], 1e-4);
            }
        }
}

TEST_MAIN
