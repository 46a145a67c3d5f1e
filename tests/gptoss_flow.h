/* gptoss_flow: the CUDA gpt_oss forward's data flow (common/target/target_gpt_oss_cuda.c with attn_block_cuda.c and
 * moe_block_cuda.c) run on the CPU, for tests: the same sequence of operators, each through its CPU reference
 * (kernels/<op>.c) in fp32. With bf16 on, every weight and every buffer the CUDA forward keeps in bf16 is rounded to
 * bf16 where it does (the biases, the sinks and the router logits stay fp32, as on the device), so the run shows how
 * far a bf16 forward lands from fp32: the GPU's distance is of the same size, not the same values. With bf16 off it
 * is the fp32 forward itself (test_gptoss_flow checks it against target_model_forward). The layer is a line-by-line
 * transcription of attn_cuda_forward + goc_layer_forward + moe_cuda_forward with *_cuda replaced by *_cpu: keep the
 * two in step. Header-only (static functions) for tests/unit and tests/gpu; a load error exits. */
#ifndef DFLASH_TESTS_GPTOSS_FLOW_H
#define DFLASH_TESTS_GPTOSS_FLOW_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "attn_block.h"
#include "bias_add.h"
#include "embedding.h"
#include "gptoss_experts.h"
#include "hf_config.h"
#include "matmul.h"
#include "moe_router.h"
#include "rmsnorm.h"
#include "rope.h"
#include "safetensors.h"
#include "swiglu.h"
#include "target_model.h"
#include "util.h"

static void gflow_rb(int bf16, float *p, size_t n)
{
    if (bf16)
        for (size_t i = 0; i < n; i++) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
}

static void gflow_die(const errbuf *err)
{
    fprintf(stderr, "gptoss_flow: %s\n", err->msg);
    exit(1);
}

static float *gflow_get(const st_file *st, const char *name, int64_t d0, int64_t d1, int bf16)
{
    int64_t shape[2] = {d0, d1};
    float *out = NULL;
    errbuf err = {{0}};
    if (st_load_f32(st, name, &out, d1 > 0 ? 2 : 1, shape, NULL, &err)) gflow_die(&err);
    gflow_rb(bf16, out, (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1));
    return out;
}

/* Layer li on x (T, H), in place. */
static void gflow_layer(const st_file *st, const hf_config *c, int li, float *x, const target_batch *b,
                        const double *inv, int bf16)
{
    const int T = b->ntok, H = c->hidden_size, hd = c->head_dim, nh = c->num_heads, nkv = c->num_kv_heads;
    const int qd = nh * hd, kd = nkv * hd, E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size;
    const float eps = (float)c->rms_eps;
    errbuf err = {{0}};
    attn_block a;
    if (attn_block_load(&a, st, c, "model.", li, &err)) gflow_die(&err);
    float *ws[] = {a.input_norm, a.wq, a.wk, a.wv, a.wo};
    size_t ns[] = {(size_t)H, (size_t)qd * H, (size_t)kd * H, (size_t)kd * H, (size_t)H * qd};
    for (int i = 0; i < 5; i++) gflow_rb(bf16, ws[i], ns[i]); /* weights uploaded as bf16; biases, sinks fp32 */
    char n[192];
    snprintf(n, sizeof n, "model.layers.%d.post_attention_layernorm.weight", li);
    float *post = gflow_get(st, n, H, 0, bf16);
    snprintf(n, sizeof n, "model.layers.%d.mlp.router.weight", li);
    float *router = gflow_get(st, n, E, H, bf16);
    snprintf(n, sizeof n, "model.layers.%d.mlp.router.bias", li);
    float *router_b = gflow_get(st, n, E, 0, 0);
    gptoss_experts ex;
    if (gptoss_experts_load(&ex, st, c, "model.", li, &err)) gflow_die(&err);
    gflow_rb(bf16, ex.gate_up, (size_t)E * 2 * I * H);
    gflow_rb(bf16, ex.down, (size_t)E * H * I);

    /* attention: rmsnorm -> u; qkv GEMM (bf16 out) + bias (bf16); RoPE (bf16); attention (bf16); o_proj with the
     * residual in its epilogue (bf16) + bias (bf16) */
    float *u = xmalloc(sizeof(float) * (size_t)T * H), *q = xmalloc(sizeof(float) * (size_t)T * qd);
    float *k = xmalloc(sizeof(float) * (size_t)T * kd), *v = xmalloc(sizeof(float) * (size_t)T * kd);
    float *at = xmalloc(sizeof(float) * (size_t)T * qd);
    rmsnorm_forward_cpu(u, H, x, H, a.input_norm, T, H, eps);
    gflow_rb(bf16, u, (size_t)T * H);
    matmul_forward_cpu(q, qd, u, H, a.wq, T, qd, H, 0);
    matmul_forward_cpu(k, kd, u, H, a.wk, T, kd, H, 0);
    matmul_forward_cpu(v, kd, u, H, a.wv, T, kd, H, 0);
    gflow_rb(bf16, q, (size_t)T * qd), gflow_rb(bf16, k, (size_t)T * kd), gflow_rb(bf16, v, (size_t)T * kd);
    bias_add_cpu(q, qd, T, qd, a.bq), bias_add_cpu(k, kd, T, kd, a.bk), bias_add_cpu(v, kd, T, kd, a.bv);
    gflow_rb(bf16, q, (size_t)T * qd), gflow_rb(bf16, k, (size_t)T * kd), gflow_rb(bf16, v, (size_t)T * kd);
    rope_apply_cpu(q, qd, T, nh, hd, b->positions, inv, 0);
    rope_apply_cpu(k, kd, T, nkv, hd, b->positions, inv, 0);
    gflow_rb(bf16, q, (size_t)T * qd), gflow_rb(bf16, k, (size_t)T * kd);
    const attention_opts o = {.window = a.window, .sinks = a.sinks};
    attention_causal_opts_forward_cpu(at, q, k, v, b->cu_seqlens, b->nseq, nh, nkv, hd, hf_attn_scale(c), &o);
    gflow_rb(bf16, at, (size_t)T * qd);
    matmul_forward_cpu(x, H, at, qd, a.wo, T, H, qd, 1);
    gflow_rb(bf16, x, (size_t)T * H);
    bias_add_cpu(x, H, T, H, a.bo);
    gflow_rb(bf16, x, (size_t)T * H);

    /* MoE: rmsnorm -> u (bf16); router logits fp32 + bias; top-k; per pick act (bf16) and ys (bf16); the combine
     * adds the weighted picks to the residual in fp32 (bf16 out) */
    rmsnorm_forward_cpu(u, H, x, H, post, T, H, eps);
    gflow_rb(bf16, u, (size_t)T * H);
    float *lg = xmalloc(sizeof(float) * (size_t)T * E), *selw = xmalloc(sizeof(float) * (size_t)T * K);
    int32_t *sel = xmalloc(sizeof(int32_t) * (size_t)T * K);
    matmul_forward_cpu(lg, E, u, H, router, T, E, H, 0);
    bias_add_cpu(lg, E, T, E, router_b);
    moe_router_topk_cpu(sel, selw, lg, E, T, E, K, c->norm_topk_prob);
    float *gu = xmalloc(sizeof(float) * 2 * (size_t)I), *act = xmalloc(sizeof(float) * (size_t)I);
    float *y = xmalloc(sizeof(float) * (size_t)H), *acc = xcalloc((size_t)T * H, sizeof(float));
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            const int e = sel[(size_t)t * K + j];
            matmul_forward_cpu(gu, 2 * I, u + (size_t)t * H, H, ex.gate_up + (size_t)e * 2 * I * H, 1, 2 * I, H, 0);
            bias_add_cpu(gu, 2 * I, 1, 2 * I, ex.gate_up_b + (size_t)e * 2 * I);
            swiglu_clamped_forward_cpu(act, gu, gu + I, (size_t)I, (float)c->swiglu_alpha, (float)c->swiglu_limit);
            gflow_rb(bf16, act, (size_t)I);
            matmul_forward_cpu(y, H, act, I, ex.down + (size_t)e * H * I, 1, H, I, 0);
            bias_add_cpu(y, H, 1, H, ex.down_b + (size_t)e * H);
            gflow_rb(bf16, y, (size_t)H);
            for (int i = 0; i < H; i++) acc[(size_t)t * H + i] += selw[(size_t)t * K + j] * y[i];
        }
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] += acc[i];
    gflow_rb(bf16, x, (size_t)T * H);
    attn_block_free(&a);
    gptoss_experts_free(&ex);
    free(post), free(router), free(router_b), free(u), free(q), free(k), free(v), free(at), free(lg), free(selw);
    free(sel), free(gu), free(act), free(y), free(acc);
}

/* The forward of checkpoint dir over b: taps -> aux (T, ntaps*H), last (T, H), logits (T, V); any may be NULL. */
static void gflow_forward(int bf16, const char *dir, const target_batch *b, const int *taps, int ntaps, float *aux,
                          float *last, float *logits)
{
    errbuf err = {{0}};
    hf_config cfg;
    st_file *st = NULL;
    if (hf_config_load(&cfg, dir, &err) || st_open(&st, dir, &err)) gflow_die(&err);
    const hf_config *c = &cfg;
    const int T = b->ntok, H = c->hidden_size, V = c->vocab_size, hd = c->head_dim;
    double *inv = xmalloc(sizeof(double) * (size_t)hd / 2); /* as target_model_load / tc_create make them */
    rope_params rp = {.theta = c->rope_theta, .llama3 = c->rope_llama3, .factor = c->rope_factor,
                      .low_freq_factor = c->rope_low_freq_factor, .high_freq_factor = c->rope_high_freq_factor,
                      .original_max_position = c->rope_original_max_position, .yarn = c->rope_yarn,
                      .beta_fast = c->rope_beta_fast, .beta_slow = c->rope_beta_slow, .truncate = c->rope_truncate};
    rope_inv_freq(inv, hd, &rp);
    if (!strcmp(c->torch_dtype, "bfloat16"))
        for (int i = 0; i < hd / 2; i++) inv[i] = bf16_to_f32(f32_to_bf16((float)inv[i]));
    int deepest = last || logits ? c->num_layers - 1 : -1;
    for (int i = 0; i < ntaps; i++) deepest = taps[i] > deepest ? taps[i] : deepest;
    float *embed = gflow_get(st, "model.embed_tokens.weight", V, H, bf16);
    float *x = xmalloc(sizeof(float) * (size_t)T * H);
    embedding_forward_cpu(x, b->input_ids, T, embed, V, H);
    free(embed);
    for (int li = 0; li <= deepest; li++) {
        gflow_layer(st, c, li, x, b, inv, bf16);
        for (int i = 0; aux && i < ntaps; i++)
            if (taps[i] == li)
                for (int t = 0; t < T; t++)
                    memcpy(aux + (size_t)t * ntaps * H + (size_t)i * H, x + (size_t)t * H, sizeof(float) * (size_t)H);
    }
    if (last) memcpy(last, x, sizeof(float) * (size_t)T * H);
    if (logits) {
        float *fn = gflow_get(st, "model.norm.weight", H, 0, bf16);
        float *lm = gflow_get(st, c->tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", V, H, bf16);
        float *u = xmalloc(sizeof(float) * (size_t)T * H);
        rmsnorm_forward_cpu(u, H, x, H, fn, T, H, (float)c->rms_eps);
        gflow_rb(bf16, u, (size_t)T * H);
        matmul_forward_cpu(logits, V, u, H, lm, T, V, H, 0);
        gflow_rb(bf16, logits, (size_t)T * V);
        free(fn), free(lm), free(u);
    }
    free(x), free(inv);
    st_close(&st);
}

#endif
