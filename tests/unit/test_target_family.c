/* The target-family table (common/target/target_family.h): every golden target maps to its family, what a family
 * cannot do on a backend is refused by name before anything is loaded, and the frozen tables are found under the
 * family's names, also in a vision-language checkpoint (model.language_model.*): target_tables_find, the function
 * both drafter backends use, and the CPU drafter trained on such a checkpoint computes what it computes on the
 * plain one. The qwen3_moe row: its goldens, what it runs where. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drafter.h"
#include "drafter_layout.h"
#include "hf_config.h"
#include "safetensors.h"
#include "target_family.h"
#include "tests/test.h"
#include "util.h"

static hf_config golden_cfg(const char *rel)
{
    hf_config c;
    errbuf err = {{0}};
    REQUIRE(hf_config_load(&c, test_golden(rel), &err) == 0);
    return c;
}

TEST(golden_targets_map_to_their_family)
{
    const char *dense[] = {"tiny/target", "tiny-bf16/target"}, *hybrid[] = {"qwen35-tiny/target",
                                                                            "qwen35moe-tiny/target"};
    for (int i = 0; i < 2; i++) {
        hf_config c = golden_cfg(dense[i]);
        const target_family *f = target_family_of(&c);
        EXPECT(f && !strcmp(f->name, "dense") && f->rope_dims(&c) == c.head_dim && f->norm_add == 0.0f);
        c = golden_cfg(hybrid[i]);
        f = target_family_of(&c);
        EXPECT(f && !strcmp(f->name, "hybrid") && f->rope_dims(&c) == c.rotary_dim && f->norm_add == 1.0f);
        /* the drafter derived from a hybrid target is a plain Qwen3 model */
        hf_config_as_qwen3(&c);
        f = target_family_of(&c);
        EXPECT(f && !strcmp(f->name, "dense"));
    }
}

TEST(what_a_family_cannot_do_is_refused_naming_it)
{
    errbuf err = {{0}};
    const target_family *f = NULL;
    hf_config h = golden_cfg("qwen35-tiny/target"), d = golden_cfg("tiny/target");
    EXPECT(target_family_require(&h, TARGET_BACKEND_CPU, TARGET_CAN_FORWARD | TARGET_CAN_DECODE, "x", &f, &err) == 0);
    EXPECT(f && !strcmp(f->name, "hybrid"));
    EXPECT(target_family_require(&h, TARGET_BACKEND_CUDA, TARGET_CAN_FORWARD, "x", &f, &err) == 0);
    EXPECT(target_family_require(&d, TARGET_BACKEND_CUDA, TARGET_CAN_DECODE, "x", &f, &err) == 0);
    /* both families decode on both backends (tests/gpu/test_decode_gpu.c decodes the hybrid goldens on the GPU) */
    EXPECT(target_family_require(&h, TARGET_BACKEND_CUDA, TARGET_CAN_DECODE, "x", &f, &err) == 0);
    EXPECT(f && !strcmp(f->name, "hybrid"));
    /* a config no family takes: the families that can, and the model_type */
    hf_config u = d;
    u.arch = HF_ARCH_QWEN3_5;
    snprintf(u.model_type, sizeof u.model_type, "qwen3_5_text");
    EXPECT(target_family_of(&u) == NULL);
    EXPECT(target_family_require(&u, TARGET_BACKEND_CUDA, TARGET_CAN_DECODE, "decoding with a KV cache", NULL,
                                 &err) == -ENOTSUP);
    EXPECT_CONTAINS(err.msg, "decoding with a KV cache on the cuda backend supports qwen3 and llama targets");
    EXPECT_CONTAINS(err.msg, "hybrid Qwen3.5 family");
    EXPECT_CONTAINS(err.msg, "qwen3_moe targets (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B)");
    EXPECT_CONTAINS(err.msg, "this target is qwen3_5_text");
}

/* The qwen3_moe row: the golden Qwen3-MoE targets map to it (Qwen3 attention: full RoPE, plain RMSNorm), their MoE
 * layers are the ones transformers builds (both kinds occur), it runs and decodes on both backends, its frozen
 * tables are under model., and the drafter derived from it is dense. */
TEST(qwen3_moe_row)
{
    const char *cases[] = {"qwen3moe-tiny/target", "qwen3moe-tiny-bf16/target"};
    /* the MoE layers of make_qwen3moe_golden.py's configs: sparse step 1 without 0 and 4; step 2 without 5 */
    const unsigned char moe[2][6] = {{0, 1, 1, 1, 0, 1}, {0, 1, 0, 1, 0, 0}};
    for (int i = 0; i < 2; i++) {
        hf_config c = golden_cfg(cases[i]);
        const target_family *f = target_family_of(&c);
        EXPECT(f && !strcmp(f->name, "qwen3_moe") && f->rope_dims(&c) == c.head_dim && f->norm_add == 0.0f);
        EXPECT(c.num_layers == 6 && c.num_experts == 8 && c.shared_expert_intermediate_size == 0);
        EXPECT(memcmp(c.layer_moe, moe[i], 6) == 0);
        errbuf err = {{0}};
        EXPECT(target_family_require(&c, TARGET_BACKEND_CPU, TARGET_CAN_FORWARD | TARGET_CAN_DECODE, "x", &f, &err) ==
               0);
        st_file *st = NULL;
        target_tables tb;
        REQUIRE(st_open(&st, test_golden(cases[i]), &err) == 0);
        REQUIRE(target_tables_find(&c, st, &tb, &err) == 0);
        EXPECT(!strcmp(tb.embed, "model.embed_tokens.weight") && !strcmp(tb.norm, "model.norm.weight") &&
               !strcmp(tb.lm_head, "lm_head.weight") && st_find(st, tb.lm_head) && st_find(st, tb.norm));
        st_close(&st);
        EXPECT(target_family_require(&c, TARGET_BACKEND_CUDA, TARGET_CAN_FORWARD | TARGET_CAN_DECODE, "x", &f,
                                     &err) == 0);
        EXPECT(f && !strcmp(f->name, "qwen3_moe"));
        hf_config_as_qwen3(&c);
        f = target_family_of(&c);
        EXPECT(f && !strcmp(f->name, "dense"));
    }
}

/* The golden's target rewritten with every model.* tensor under model.language_model. (lm_head stays top level,
 * as in the Qwen3.5 vision-language checkpoints); config.json as it is. */
static char *vl_checkpoint(const char *rel)
{
    char *dir = xstrdup("/tmp/dflash_target_family_XXXXXX"), path[600];
    REQUIRE(mkdtemp(dir));
    st_file *st = NULL;
    errbuf err = {{0}};
    REQUIRE(st_open(&st, test_golden(rel), &err) == 0);
    const int n = st_count(st);
    st_write_tensor *t = xcalloc((size_t)n, sizeof *t);
    float **data = xcalloc((size_t)n, sizeof *data);
    char (*names)[200] = xcalloc((size_t)n, sizeof *names);
    for (int i = 0; i < n; i++) {
        const st_tensor *s = st_at(st, i);
        if (!strncmp(s->name, "model.", 6)) snprintf(names[i], sizeof names[i], "model.language_model.%s", s->name + 6);
        else snprintf(names[i], sizeof names[i], "%s", s->name);
        REQUIRE(st_load_f32(st, s->name, &data[i], -1, NULL, NULL, &err) == 0);
        t[i] = (st_write_tensor){.name = names[i], .dtype = ST_F32, .ndim = s->ndim, .data = data[i]};
        memcpy(t[i].shape, s->shape, sizeof s->shape);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    REQUIRE(st_write(path, t, n, NULL, &err) == 0);
    for (int i = 0; i < n; i++) free(data[i]);
    free(data), free(t), free(names);
    st_close(&st);
    char src[600];
    snprintf(src, sizeof src, "%s/config.json", test_golden(rel));
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *in = fopen(src, "rb"), *out = fopen(path, "wb");
    REQUIRE(in && out);
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, in)) > 0) REQUIRE(fwrite(buf, 1, k, out) == k);
    fclose(in);
    REQUIRE(fclose(out) == 0);
    return dir;
}

static void rm_dir(char *dir)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "  could not remove %s\n", dir);
    free(dir);
}

TEST(frozen_tables_found_under_the_vision_language_prefix)
{
    char *dir = vl_checkpoint("qwen35-tiny/target");
    hf_config c = golden_cfg("qwen35-tiny/target");
    st_file *st = NULL;
    errbuf err = {{0}};
    target_tables tb;
    REQUIRE(st_open(&st, dir, &err) == 0);
    REQUIRE(target_tables_find(&c, st, &tb, &err) == 0);
    EXPECT(!strcmp(tb.embed, "model.language_model.embed_tokens.weight"));
    EXPECT(!strcmp(tb.norm, "model.language_model.norm.weight"));
    EXPECT(!strcmp(tb.lm_head, c.tie_embeddings ? tb.embed : "lm_head.weight"));
    EXPECT(st_find(st, tb.embed) && st_find(st, tb.lm_head) && st_find(st, tb.norm));
    st_close(&st);
    /* the plain checkpoint: model. */
    REQUIRE(st_open(&st, test_golden("qwen35-tiny/target"), &err) == 0);
    REQUIRE(target_tables_find(&c, st, &tb, &err) == 0);
    EXPECT(!strcmp(tb.embed, "model.embed_tokens.weight") && !strcmp(tb.norm, "model.norm.weight"));
    st_close(&st);
    rm_dir(dir);
}

/* One CPU drafter step on a batch of the target's vocabulary, with the frozen tables of target_dir. */
static void drafter_step(const char *target_dir, const hf_config *dcfg, const float *w, float *g, drafter_metrics *mt)
{
    enum { T = 24 };
    drafter_train_config tc = {.drafter = dcfg, .max_anchors = 4, .seed = 7, .gamma = 4.0};
    drafter_backend *b = NULL;
    errbuf err = {{0}};
    if (drafter_cpu_create(&b, &tc, target_dir, &err)) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(b);
    int32_t ids[T], pos[T], cu[3] = {0, 14, T};
    uint8_t mask[T];
    const size_t K = (size_t)dcfg->num_taps, H = (size_t)dcfg->hidden_size;
    float *aux = xmalloc(sizeof(float) * T * K * H);
    for (int t = 0; t < T; t++) {
        ids[t] = (t * 37 + 11) % (dcfg->vocab_size - 1);
        pos[t] = t < 14 ? t : t - 14;
        mask[t] = pos[t] >= 3;
    }
    for (size_t i = 0; i < T * K * H; i++) aux[i] = (float)((int)(i * 2654435761u % 1000) - 500) / 1000.0f;
    drafter_batch bt = {.id = 3, .ntok = T, .nseq = 2, .aux = aux, .input_ids = ids, .positions = pos,
                        .cu_seqlens = cu, .loss_mask = mask};
    REQUIRE(b->ops->forward_backward(b, w, g, &bt, mt, &err) == 0);
    drafter_backend_destroy(&b);
    free(aux);
}

TEST(cpu_drafter_trains_on_a_vision_language_checkpoint)
{
    char *dir = vl_checkpoint("qwen35-tiny/target");
    hf_config d = golden_cfg("qwen35-tiny/target");
    hf_config_as_qwen3(&d);
    d.is_dflash = 1, d.num_layers = 1, d.block_size = 4, d.num_target_layers = 6, d.mask_token_id = d.vocab_size - 1;
    d.num_taps = 2, d.taps[0] = 1, d.taps[1] = 3;
    drafter_layout L;
    drafter_layout_init(&L, &d);
    float *w = xmalloc(sizeof(float) * L.numel), *g0 = xcalloc(L.numel, sizeof(float));
    float *g1 = xmalloc(sizeof(float) * L.numel);
    memset(g1, 0xff, sizeof(float) * L.numel); /* NaN: the step overwrites every element (drafter.h), g0 was zero */
    drafter_layout_init_weights(&L, w, 5);
    drafter_metrics m0, m1;
    drafter_step(test_golden("qwen35-tiny/target"), &d, w, g0, &m0);
    drafter_step(dir, &d, w, g1, &m1);
    EXPECT(m0.weight_sum > 0 && m0.loss_sum > 0);
    EXPECT(m1.loss_sum == m0.loss_sum && m1.weight_sum == m0.weight_sum);
    EXPECT(memcmp(g0, g1, sizeof(float) * L.numel) == 0);
    free(w), free(g0), free(g1);
    drafter_layout_destroy(&L);
    rm_dir(dir);
}

TEST_MAIN
