/* hybrid_flow: the CUDA hybrid forward's data flow (common/target/target_hybrid_cuda.c) run on the CPU, for tests:
 * the same fused weight layouts (target_hybrid_layout's row maps), buffers, row strides, column offsets and
 * sequence of operators, each through its CPU reference (kernels/<op>.c) in fp32. With bf16 on, every weight and
 * every buffer the CUDA forward keeps in bf16 is rounded to bf16 where it does (A_log, dt_bias, g, beta and the
 * router logits stay fp32), so the run shows how far a bf16 forward lands from fp32: the GPU's distance is of the
 * same size, not the same values (a bf16 hybrid forward moves as far under 1e-6 relative differences before its
 * roundings as under the roundings themselves). The layer function is a line-by-line transcription of thc_linear /
 * thc_attn / thc_moe and the layer loop with *_cuda replaced by *_cpu: keep the two in step. Also the test
 * checkpoints: random hybrid checkpoints of a given shape, and the Qwen3-Next / vision-language layouts made from a
 * Qwen3.5 checkpoint. Header-only (static functions) for tests/unit and tests/gpu; a load error exits. */
#ifndef DFLASH_TESTS_HYBRID_FLOW_H
#define DFLASH_TESTS_HYBRID_FLOW_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attention.h"
#include "causal_conv1d.h"
#include "embedding.h"
#include "gated_delta_prep.h"
#include "gated_delta_rule.h"
#include "gated_rmsnorm.h"
#include "hf_config.h"
#include "matmul.h"
#include "moe_combine.h"
#include "moe_gemm.h"
#include "moe_group.h"
#include "moe_router.h"
#include "qk_norm_rope.h"
#include "rand_fill.h"
#include "rmsnorm.h"
#include "rope.h"
#include "safetensors.h"
#include "sigmoid_gate.h"
#include "swiglu.h"
#include "target_hybrid.h"
#include "target_hybrid_layout.h"
#include "target_model.h"
#include "util.h"

typedef struct hflow {
    int bf16;                 /* round as the CUDA forward does */
    int32_t *sel_save;        /* NULL, or (num_layers, T*K): the MoE picks of this run */
    const int32_t *sel_ref;   /* NULL, or a previous run's sel_save: picks that differ are counted in flips */
    long flips;
    /* internal */
    const st_file *st;
    const hf_config *c;
    const char *prefix;
    int C, VD, lin_w, attn_w, ldl;
} hflow;

static void hflow_rb(const hflow *f, float *p, size_t n)
{
    if (f->bf16)
        for (size_t i = 0; i < n; i++) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
}

static void hflow_rb_rows(const hflow *f, float *p, int ld, int rows, int cols)
{
    for (int r = 0; r < rows; r++) hflow_rb(f, p + (size_t)r * ld, (size_t)cols);
}

static void hflow_name(const hflow *f, char *n, size_t cap, int li, const char *suffix)
{
    if (li >= 0) snprintf(n, cap, "%slayers.%d.%s", f->prefix, li, suffix);
    else if (!strcmp(suffix, "lm_head.weight")) snprintf(n, cap, "%s", suffix);
    else snprintf(n, cap, "%s%s", f->prefix, suffix);
}

static int hflow_has(const hflow *f, int li, const char *suffix)
{
    char n[256];
    hflow_name(f, n, sizeof n, li, suffix);
    return st_find(f->st, n) != NULL;
}

static int hflow_ndim(const hflow *f, int li, const char *suffix)
{
    char n[256];
    hflow_name(f, n, sizeof n, li, suffix);
    const st_tensor *t = st_find(f->st, n);
    return t ? t->ndim : 0;
}

/* tensor (d0[, d1[, d2]]) of layer li (li < 0: model-level: embed_tokens, norm under the prefix; lm_head) as fp32
 * + add, rounded as uploaded */
static float *hflow_get(const hflow *f, int li, const char *suffix, int64_t d0, int64_t d1, int64_t d2, float add)
{
    char n[256];
    hflow_name(f, n, sizeof n, li, suffix);
    int64_t shape[3] = {d0, d1, d2};
    float *out = NULL;
    errbuf err = {{0}};
    if (st_load_f32(f->st, n, &out, d2 > 0 ? 3 : d1 > 0 ? 2 : 1, shape, NULL, &err)) {
        fprintf(stderr, "hybrid_flow: %s\n", err.msg);
        exit(1);
    }
    size_t cnt = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1) * (size_t)(d2 > 0 ? d2 : 1);
    for (size_t i = 0; i < cnt; i++) out[i] += add;
    if (!strstr(suffix, "A_log") && !strstr(suffix, "dt_bias")) hflow_rb(f, out, cnt); /* uploaded as bf16(w + add) */
    return out;
}

/* rows of src (rows, cols) to rows map[r] of dst */
static void hflow_put_rows(float *dst, const float *src, int rows, int cols, const int *map)
{
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)map[r] * cols, src + (size_t)r * cols, sizeof(float) * (size_t)cols);
}

/* One layer, transcribed from target_hybrid_cuda.c (loading and forward); x (T, H) updated in place. */
static void hflow_layer(hflow *f, int li, float *x, const target_batch *b, const double *inv)
{
    const hf_config *c = f->c;
    const int T = b->ntok, H = c->hidden_size, HK = c->linear_num_k_heads, HV = c->linear_num_v_heads;
    const int Dk = c->linear_k_head_dim, Dv = c->linear_v_head_dim, C = f->C, VD = f->VD;
    const int hd = c->head_dim, nh = c->num_heads, nkv = c->num_kv_heads, qd = nh * hd, kd = nkv * hd;
    const float eps = (float)c->rms_eps;
    float *in_norm = hflow_get(f, li, "input_layernorm.weight", H, 0, 0, 1.0f);
    float *post_norm = hflow_get(f, li, "post_attention_layernorm.weight", H, 0, 0, 1.0f);
    float *u = xmalloc(sizeof(float) * (size_t)T * H);
    rmsnorm_forward_cpu(u, H, x, H, in_norm, T, H, eps);
    hflow_rb(f, u, (size_t)T * H);
    if (c->layer_linear[li]) { /* thc_load_linear (Qwen3.5 layout) + thc_linear */
        const int W = f->lin_w;
        float *w = xmalloc(sizeof(float) * (size_t)W * H);
        if (hflow_has(f, li, "linear_attn.in_proj_qkvz.weight")) { /* Qwen3-Next: thc_load_linear's row maps */
            int *map = xmalloc(sizeof(int) * (size_t)(C + VD));
            float *t0 = hflow_get(f, li, "linear_attn.in_proj_qkvz.weight", C + VD, H, 0, 0.0f);
            float *t1 = hflow_get(f, li, "linear_attn.in_proj_ba.weight", 2 * HV, H, 0, 0.0f);
            for (int r = 0; r < C + VD; r++) map[r] = target_hybrid_qkvz_row(r, HK, HV, Dk, Dv);
            hflow_put_rows(w, t0, C + VD, H, map);
            for (int r = 0; r < 2 * HV; r++) map[r] = target_hybrid_ba_row(r, HK, HV);
            hflow_put_rows(w + (size_t)(C + VD) * H, t1, 2 * HV, H, map);
            free(map), free(t0), free(t1);
        } else {
            float *t0 = hflow_get(f, li, "linear_attn.in_proj_qkv.weight", C, H, 0, 0.0f);
            float *t1 = hflow_get(f, li, "linear_attn.in_proj_z.weight", VD, H, 0, 0.0f);
            float *t2 = hflow_get(f, li, "linear_attn.in_proj_b.weight", HV, H, 0, 0.0f);
            float *t3 = hflow_get(f, li, "linear_attn.in_proj_a.weight", HV, H, 0, 0.0f);
            memcpy(w, t0, sizeof(float) * (size_t)C * H);
            memcpy(w + (size_t)C * H, t1, sizeof(float) * (size_t)VD * H);
            memcpy(w + (size_t)(C + VD) * H, t2, sizeof(float) * (size_t)HV * H);
            memcpy(w + (size_t)(C + VD + HV) * H, t3, sizeof(float) * (size_t)HV * H);
            free(t0), free(t1), free(t2), free(t3);
        }
        const int squeezed = hflow_ndim(f, li, "linear_attn.conv1d.weight") == 2;
        float *conv = squeezed ? hflow_get(f, li, "linear_attn.conv1d.weight", C, c->linear_conv_kernel, 0, 0.0f)
                               : hflow_get(f, li, "linear_attn.conv1d.weight", C, 1, c->linear_conv_kernel, 0.0f);
        float *a_log = hflow_get(f, li, "linear_attn.A_log", HV, 0, 0, 0.0f);
        float *dt = hflow_get(f, li, "linear_attn.dt_bias", HV, 0, 0, 0.0f);
        float *gn = hflow_get(f, li, "linear_attn.norm.weight", Dv, 0, 0, 0.0f);
        float *wout = hflow_get(f, li, "linear_attn.out_proj.weight", H, VD, 0, 0.0f);
        float *proj = xmalloc(sizeof(float) * (size_t)T * W), *cv = xmalloc(sizeof(float) * (size_t)T * C);
        float *g = xmalloc(sizeof(float) * (size_t)T * HV), *beta = xmalloc(sizeof(float) * (size_t)T * HV);
        float *core = xmalloc(sizeof(float) * (size_t)T * VD);
        matmul_forward_cpu(proj, W, u, H, w, T, W, H, 0);
        hflow_rb(f, proj, (size_t)T * W);
        causal_conv1d_silu_cpu(cv, C, proj, W, conv, C, c->linear_conv_kernel, b->cu_seqlens, b->nseq);
        hflow_rb(f, cv, (size_t)T * C);
        gated_delta_prep_cpu(cv, C, T, HK, Dk, beta, g, HV, proj + C + VD, W, proj + C + VD + HV, W, a_log, dt, HV);
        hflow_rb(f, cv, (size_t)T * C);
        gated_delta_rule_forward_cpu(core, VD, cv, C, cv + HK * Dk, C, cv + 2 * HK * Dk, C, g, HV, beta, HV,
                                     b->cu_seqlens, b->nseq, HK, HV, Dk, Dv);
        hflow_rb(f, core, (size_t)T * VD);
        gated_rmsnorm_cpu(core, VD, core, VD, proj + C, W, gn, T, HV, Dv, eps);
        hflow_rb(f, core, (size_t)T * VD);
        matmul_forward_cpu(x, H, core, VD, wout, T, H, VD, 1);
        hflow_rb(f, x, (size_t)T * H);
        free(w), free(conv), free(a_log), free(dt), free(gn), free(wout);
        free(proj), free(cv), free(g), free(beta), free(core);
    } else { /* thc_load_attn + thc_attn */
        const int W = f->attn_w;
        float *w = xmalloc(sizeof(float) * (size_t)W * H);
        int *map = xmalloc(sizeof(int) * (size_t)(2 * qd));
        for (int r = 0; r < 2 * qd; r++) map[r] = target_hybrid_q_gate_row(r, nh, hd);
        float *tq = hflow_get(f, li, "self_attn.q_proj.weight", 2 * qd, H, 0, 0.0f);
        float *tk = hflow_get(f, li, "self_attn.k_proj.weight", kd, H, 0, 0.0f);
        float *tv = hflow_get(f, li, "self_attn.v_proj.weight", kd, H, 0, 0.0f);
        hflow_put_rows(w, tq, 2 * qd, H, map);
        memcpy(w + (size_t)(2 * qd) * H, tk, sizeof(float) * (size_t)kd * H);
        memcpy(w + (size_t)(2 * qd + kd) * H, tv, sizeof(float) * (size_t)kd * H);
        float *wo = hflow_get(f, li, "self_attn.o_proj.weight", H, qd, 0, 0.0f);
        float *qn = hflow_get(f, li, "self_attn.q_norm.weight", hd, 0, 0, 1.0f);
        float *kn = hflow_get(f, li, "self_attn.k_norm.weight", hd, 0, 0, 1.0f);
        float *proj = xmalloc(sizeof(float) * (size_t)T * W), *core = xmalloc(sizeof(float) * (size_t)T * qd);
        matmul_forward_cpu(proj, W, u, H, w, T, W, H, 0);
        hflow_rb(f, proj, (size_t)T * W);
        float *q = proj, *gate = proj + qd, *k = proj + 2 * qd, *v = proj + 2 * qd + kd;
        qk_norm_rope_partial_cpu(q, W, k, W, T, nh, nkv, hd, c->rotary_dim, qn, kn, eps, b->positions, inv);
        hflow_rb_rows(f, q, W, T, qd);
        hflow_rb_rows(f, k, W, T, kd);
        /* the CPU attention takes dense rows: the CUDA one reads q/k/v in place with stride W */
        float *qc = xmalloc(sizeof(float) * (size_t)T * qd), *kc = xmalloc(sizeof(float) * (size_t)T * kd);
        float *vc = xmalloc(sizeof(float) * (size_t)T * kd);
        for (int t = 0; t < T; t++) {
            memcpy(qc + (size_t)t * qd, q + (size_t)t * W, sizeof(float) * (size_t)qd);
            memcpy(kc + (size_t)t * kd, k + (size_t)t * W, sizeof(float) * (size_t)kd);
            memcpy(vc + (size_t)t * kd, v + (size_t)t * W, sizeof(float) * (size_t)kd);
        }
        attention_causal_forward_cpu(core, qc, kc, vc, b->cu_seqlens, b->nseq, nh, nkv, hd, 1.0f / sqrtf((float)hd));
        hflow_rb(f, core, (size_t)T * qd);
        sigmoid_gate_cpu(core, qd, core, qd, gate, W, T, qd);
        hflow_rb(f, core, (size_t)T * qd);
        matmul_forward_cpu(x, H, core, qd, wo, T, H, qd, 1);
        hflow_rb(f, x, (size_t)T * H);
        free(w), free(map), free(tq), free(tk), free(tv), free(wo), free(qn), free(kn), free(proj), free(core);
        free(qc), free(kc), free(vc);
    }
    rmsnorm_forward_cpu(u, H, x, H, post_norm, T, H, eps);
    hflow_rb(f, u, (size_t)T * H);
    if (c->num_experts > 0 && c->layer_moe[li]) { /* moe_cuda_layer_load + moe_cuda_forward (moe_block_cuda.c) */
        const int E = c->num_experts, K = c->num_experts_per_tok, Im = c->moe_intermediate_size;
        const int Is = c->shared_expert_intermediate_size, TK = T * K, ldl = f->ldl;
        float *wr = xcalloc((size_t)(E + 1) * H, sizeof(float));
        float *tr = hflow_get(f, li, "mlp.gate.weight", E, H, 0, 0.0f);
        memcpy(wr, tr, sizeof(float) * (size_t)E * H);
        float *egu_w = xmalloc(sizeof(float) * (size_t)E * 2 * Im * H), *ed_w = xmalloc(sizeof(float) * (size_t)E * H * Im);
        if (hflow_has(f, li, "mlp.experts.gate_up_proj")) { /* transformers' fused layout */
            float *a = hflow_get(f, li, "mlp.experts.gate_up_proj", E, 2 * Im, H, 0.0f);
            float *d = hflow_get(f, li, "mlp.experts.down_proj", E, H, Im, 0.0f);
            memcpy(egu_w, a, sizeof(float) * (size_t)E * 2 * Im * H);
            memcpy(ed_w, d, sizeof(float) * (size_t)E * H * Im);
            free(a), free(d);
        }
        char s[96];
        for (int e = 0; e < E && !hflow_has(f, li, "mlp.experts.gate_up_proj"); e++) {
            snprintf(s, sizeof s, "mlp.experts.%d.gate_proj.weight", e);
            float *a = hflow_get(f, li, s, Im, H, 0, 0.0f);
            snprintf(s, sizeof s, "mlp.experts.%d.up_proj.weight", e);
            float *bb = hflow_get(f, li, s, Im, H, 0, 0.0f);
            snprintf(s, sizeof s, "mlp.experts.%d.down_proj.weight", e);
            float *d = hflow_get(f, li, s, H, Im, 0, 0.0f);
            memcpy(egu_w + (size_t)e * 2 * Im * H, a, sizeof(float) * (size_t)Im * H);
            memcpy(egu_w + (size_t)e * 2 * Im * H + (size_t)Im * H, bb, sizeof(float) * (size_t)Im * H);
            memcpy(ed_w + (size_t)e * H * Im, d, sizeof(float) * (size_t)H * Im);
            free(a), free(bb), free(d);
        }
        float *sgu_w = xmalloc(sizeof(float) * (size_t)2 * Is * H);
        float *sa = hflow_get(f, li, "mlp.shared_expert.gate_proj.weight", Is, H, 0, 0.0f);
        float *sb = hflow_get(f, li, "mlp.shared_expert.up_proj.weight", Is, H, 0, 0.0f);
        float *sd_w = hflow_get(f, li, "mlp.shared_expert.down_proj.weight", H, Is, 0, 0.0f);
        float *sg_w = hflow_get(f, li, "mlp.shared_expert_gate.weight", 1, H, 0, 0.0f);
        memcpy(sgu_w, sa, sizeof(float) * (size_t)Is * H);
        memcpy(sgu_w + (size_t)Is * H, sb, sizeof(float) * (size_t)Is * H);
        memcpy(wr + (size_t)E * H, sg_w, sizeof(float) * (size_t)H);
        /* the forward: routed rows in expert order, then the shared expert's T rows as group E */
        float *logits = xmalloc(sizeof(float) * (size_t)T * ldl), *selw = xmalloc(sizeof(float) * (size_t)TK);
        int32_t *sel = xmalloc(sizeof(int32_t) * (size_t)TK), *off = xmalloc(sizeof(int32_t) * (size_t)(E + 2));
        const size_t R = (size_t)TK + (size_t)T, lda = (size_t)(Im > Is ? Im : Is);
        int32_t *rows = xmalloc(sizeof(int32_t) * ((size_t)TK + R)); /* slot_row (TK) | row_token (R) */
        int32_t *tiles = xmalloc(sizeof(int32_t) * 3 * (size_t)moe_group_max_tiles(TK, E, T, MOE_GEMM_BM));
        float *act = xmalloc(sizeof(float) * R * lda), *ys = xmalloc(sizeof(float) * R * H);
        matmul_forward_cpu(logits, ldl, u, H, wr, T, E + (Is > 0), H, 0);
        moe_router_topk_cpu(sel, selw, logits, ldl, T, E, K, c->norm_topk_prob);
        moe_group_cpu(sel, T, K, E, T, MOE_GEMM_BM, off, rows + TK, rows, tiles);
        moe_gemm_gate_up_cpu(act, (int)lda, u, H, rows + TK, off, E, H, Im, Is, egu_w, sgu_w);
        for (size_t r = 0; r < R; r++) hflow_rb(f, act + r * lda, lda);
        moe_gemm_down_cpu(ys, H, act, (int)lda, off, E, H, Im, Is, ed_w, sd_w);
        hflow_rb(f, ys, R * H);
        moe_combine_cpu(x, H, x, H, ys, H, rows, selw, T, K, H, ys + (size_t)TK * H, H, logits + E, ldl);
        hflow_rb(f, x, (size_t)T * H);
        if (f->sel_ref) /* routing against a reference run's */
            for (int i = 0; i < TK; i++) f->flips += sel[i] != f->sel_ref[(size_t)li * TK + i];
        if (f->sel_save) memcpy(f->sel_save + (size_t)li * TK, sel, sizeof(int32_t) * (size_t)TK);
        free(wr), free(tr), free(egu_w), free(ed_w), free(sgu_w), free(sa), free(sb), free(sd_w), free(sg_w);
        free(logits), free(selw), free(sel), free(off), free(rows), free(tiles), free(act), free(ys);
    } else {
        const int I = c->intermediate_size;
        float *wgu = xmalloc(sizeof(float) * (size_t)2 * I * H);
        float *a = hflow_get(f, li, "mlp.gate_proj.weight", I, H, 0, 0.0f), *bb = hflow_get(f, li, "mlp.up_proj.weight", I, H, 0, 0.0f);
        float *wd = hflow_get(f, li, "mlp.down_proj.weight", H, I, 0, 0.0f);
        memcpy(wgu, a, sizeof(float) * (size_t)I * H);
        memcpy(wgu + (size_t)I * H, bb, sizeof(float) * (size_t)I * H);
        float *gu = xmalloc(sizeof(float) * (size_t)T * 2 * I), *act = xmalloc(sizeof(float) * (size_t)T * I);
        matmul_forward_cpu(gu, 2 * I, u, H, wgu, T, 2 * I, H, 0);
        hflow_rb(f, gu, (size_t)T * 2 * I);
        for (int t = 0; t < T; t++)
            swiglu_forward_cpu(act + (size_t)t * I, gu + (size_t)t * 2 * I, gu + (size_t)t * 2 * I + I, (size_t)I);
        hflow_rb(f, act, (size_t)T * I);
        matmul_forward_cpu(x, H, act, I, wd, T, H, I, 1);
        hflow_rb(f, x, (size_t)T * H);
        free(wgu), free(a), free(bb), free(wd), free(gu), free(act);
    }
    free(in_norm), free(post_norm), free(u);
}

/* The forward of the checkpoint at dir over b: taps -> aux (T, ntaps*H), last (T, H), logits (T, V); any may be
 * NULL (logits and last: the whole model runs). */
static void hflow_forward(hflow *f, const char *dir, const target_batch *b, const int *taps, int ntaps, float *aux,
                          float *last, float *logits)
{
    errbuf err = {{0}};
    hf_config cfg;
    st_file *st = NULL;
    if (hf_config_load(&cfg, dir, &err) || st_open(&st, dir, &err)) {
        fprintf(stderr, "hybrid_flow: %s\n", err.msg);
        exit(1);
    }
    const hf_config *c = &cfg;
    f->st = st, f->c = c, f->prefix = target_hybrid_prefix(st), f->flips = 0;
    f->C = 2 * c->linear_num_k_heads * c->linear_k_head_dim + c->linear_num_v_heads * c->linear_v_head_dim;
    f->VD = c->linear_num_v_heads * c->linear_v_head_dim;
    f->lin_w = f->C + f->VD + 2 * c->linear_num_v_heads;
    f->attn_w = 2 * c->num_heads * c->head_dim + 2 * c->num_kv_heads * c->head_dim;
    f->ldl = (c->num_experts + 1 + 3) / 4 * 4;
    const int T = b->ntok, H = c->hidden_size, V = c->vocab_size, rd = c->rotary_dim;
    /* the partial-RoPE frequencies as tc_create makes them */
    double *inv = xmalloc(sizeof(double) * (size_t)rd / 2);
    rope_params rp = {.theta = c->rope_theta, .llama3 = c->rope_llama3, .factor = c->rope_factor,
                      .low_freq_factor = c->rope_low_freq_factor, .high_freq_factor = c->rope_high_freq_factor,
                      .original_max_position = c->rope_original_max_position};
    rope_inv_freq(inv, rd, &rp);
    if (!strcmp(c->torch_dtype, "bfloat16"))
        for (int i = 0; i < rd / 2; i++) inv[i] = bf16_to_f32(f32_to_bf16((float)inv[i]));
    int deepest = last || logits ? c->num_layers - 1 : -1;
    for (int i = 0; i < ntaps; i++) deepest = taps[i] > deepest ? taps[i] : deepest;
    float *embed = hflow_get(f, -1, "embed_tokens.weight", V, H, 0, 0.0f);
    float *x = xmalloc(sizeof(float) * (size_t)T * H);
    embedding_forward_cpu(x, b->input_ids, T, embed, V, H);
    free(embed);
    for (int li = 0; li <= deepest; li++) {
        hflow_layer(f, li, x, b, inv);
        for (int i = 0; aux && i < ntaps; i++)
            if (taps[i] == li)
                for (int t = 0; t < T; t++)
                    memcpy(aux + (size_t)t * ntaps * H + (size_t)i * H, x + (size_t)t * H, sizeof(float) * (size_t)H);
    }
    if (last) memcpy(last, x, sizeof(float) * (size_t)T * H);
    if (logits) {
        float *fn = hflow_get(f, -1, "norm.weight", H, 0, 0, 1.0f);
        float *lm = c->tie_embeddings ? hflow_get(f, -1, "embed_tokens.weight", V, H, 0, 0.0f)
                                      : hflow_get(f, -1, "lm_head.weight", V, H, 0, 0.0f);
        float *u = xmalloc(sizeof(float) * (size_t)T * H);
        rmsnorm_forward_cpu(u, H, x, H, fn, T, H, (float)c->rms_eps);
        hflow_rb(f, u, (size_t)T * H);
        matmul_forward_cpu(logits, V, u, H, lm, T, V, H, 0);
        hflow_rb(f, logits, (size_t)T * V);
        free(fn), free(lm), free(u);
    }
    free(x), free(inv);
    st_close(&st);
    f->st = NULL, f->c = NULL;
}

/* ---- test checkpoints ---- */

/* n rand_fill values (bit-identical on CPU and GPU) as f32, for st_write (which stores bf16: the same values) */
static float *hflow_rand_f32(size_t n, uint64_t seed, float scale, float bias)
{
    uint16_t *h = xmalloc(n * 2);
    rand_fill_bf16_cpu(h, n, seed, scale, bias);
    float *f = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(h[i]);
    free(h);
    return f;
}

/* A hybrid (Qwen3.5-style) checkpoint with random bf16 weights in a temp dir: the layer kinds of `kinds`
 * ('l' Gated DeltaNet, 'f' gated attention), dense MLP (E = 0) or MoE with transformers' fused expert tensors and a
 * shared expert. Zero-centred norms are stored as small w (the scale is 1 + w). */
typedef struct hybrid_spec {
    const char *kinds;
    int H, nh, nkv, hd, HK, HV, Dk, Dv, Kc, I, V, E, K, Im, Is;
} hybrid_spec;

static int write_hybrid_ckpt(const char *dir, const hybrid_spec *sp)
{
    const int L = (int)strlen(sp->kinds), H = sp->H, qd = sp->nh * sp->hd, kd = sp->nkv * sp->hd;
    const int C = 2 * sp->HK * sp->Dk + sp->HV * sp->Dv, VD = sp->HV * sp->Dv;
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"hidden_size\": %d, \"num_hidden_layers\": %d, "
            "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, \"intermediate_size\": %d, "
            "\"vocab_size\": %d, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", "
            "\"linear_num_key_heads\": %d, \"linear_num_value_heads\": %d, \"linear_key_head_dim\": %d, "
            "\"linear_value_head_dim\": %d, \"linear_conv_kernel_dim\": %d, "
            "\"rope_parameters\": {\"rope_theta\": 10000000.0, \"partial_rotary_factor\": 0.25, \"rope_type\": \"default\"}, ",
            sp->E ? "Qwen3_5MoeForCausalLM" : "Qwen3_5ForCausalLM", sp->E ? "qwen3_5_moe_text" : "qwen3_5_text", H, L,
            sp->nh, sp->nkv, sp->hd, sp->I, sp->V, sp->HK, sp->HV, sp->Dk, sp->Dv, sp->Kc);
    if (sp->E)
        fprintf(f, "\"num_experts\": %d, \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d, "
                "\"shared_expert_intermediate_size\": %d, ", sp->E, sp->K, sp->Im, sp->Is);
    fprintf(f, "\"layer_types\": [");
    for (int l = 0; l < L; l++) fprintf(f, "%s\"%s\"", l ? ", " : "", sp->kinds[l] == 'l' ? "linear_attention" : "full_attention");
    fprintf(f, "]}\n");
    fclose(f);
    const float a = 0.02f * sqrtf(3.0f);
    int cap = 8 + L * 24, n = 0;
    st_write_tensor *t = xcalloc((size_t)cap, sizeof *t);
    char (*names)[128] = xcalloc((size_t)cap, sizeof *names);
    uint64_t seed = 2000;
#define HADD(nm, nd, d0, d1, d2, scale, bias)                                                                 \
    do {                                                                                                       \
        snprintf(names[n], sizeof names[n], "%s", nm);                                                         \
        size_t cnt_ = (size_t)(d0) * ((d1) > 0 ? (size_t)(d1) : 1) * ((d2) > 0 ? (size_t)(d2) : 1);            \
        t[n] = (st_write_tensor){.name = names[n], .dtype = ST_BF16, .ndim = (nd), .shape = {(d0), (d1), (d2)}, \
                                 .data = hflow_rand_f32(cnt_, seed++, scale, bias)};                                 \
        n++;                                                                                                   \
    } while (0)
    HADD("model.embed_tokens.weight", 2, sp->V, H, 0, a, 0.0f);
    HADD("model.norm.weight", 1, H, 0, 0, 0.1f, 0.0f);
    for (int l = 0; l < L; l++) {
        char p[128];
#define HL(suffix, nd, d0, d1, d2, scale, bias)                     \
        snprintf(p, sizeof p, "model.layers.%d.%s", l, suffix);     \
        HADD(p, nd, d0, d1, d2, scale, bias)
        HL("input_layernorm.weight", 1, H, 0, 0, 0.1f, 0.0f);
        HL("post_attention_layernorm.weight", 1, H, 0, 0, 0.1f, 0.0f);
        if (sp->kinds[l] == 'l') {
            HL("linear_attn.in_proj_qkv.weight", 2, C, H, 0, a, 0.0f);
            HL("linear_attn.in_proj_z.weight", 2, VD, H, 0, a, 0.0f);
            HL("linear_attn.in_proj_b.weight", 2, sp->HV, H, 0, a, 0.0f);
            HL("linear_attn.in_proj_a.weight", 2, sp->HV, H, 0, a, 0.0f);
            HL("linear_attn.conv1d.weight", 3, C, 1, sp->Kc, 0.5f, 0.0f);
            HL("linear_attn.A_log", 1, sp->HV, 0, 0, 1.35f, 1.4f);
            HL("linear_attn.dt_bias", 1, sp->HV, 0, 0, 0.5f, 1.0f);
            HL("linear_attn.norm.weight", 1, sp->Dv, 0, 0, 0.1f, 1.0f);
            HL("linear_attn.out_proj.weight", 2, H, VD, 0, a, 0.0f);
        } else {
            HL("self_attn.q_proj.weight", 2, 2 * qd, H, 0, a, 0.0f);
            HL("self_attn.k_proj.weight", 2, kd, H, 0, a, 0.0f);
            HL("self_attn.v_proj.weight", 2, kd, H, 0, a, 0.0f);
            HL("self_attn.o_proj.weight", 2, H, qd, 0, a, 0.0f);
            HL("self_attn.q_norm.weight", 1, sp->hd, 0, 0, 0.1f, 0.0f);
            HL("self_attn.k_norm.weight", 1, sp->hd, 0, 0, 0.1f, 0.0f);
        }
        if (sp->E) {
            HL("mlp.gate.weight", 2, sp->E, H, 0, 0.2f, 0.0f);
            HL("mlp.experts.gate_up_proj", 3, sp->E, 2 * sp->Im, H, a, 0.0f);
            HL("mlp.experts.down_proj", 3, sp->E, H, sp->Im, a, 0.0f);
            HL("mlp.shared_expert.gate_proj.weight", 2, sp->Is, H, 0, a, 0.0f);
            HL("mlp.shared_expert.up_proj.weight", 2, sp->Is, H, 0, a, 0.0f);
            HL("mlp.shared_expert.down_proj.weight", 2, H, sp->Is, 0, a, 0.0f);
            HL("mlp.shared_expert_gate.weight", 2, 1, H, 0, a, 0.0f);
        } else {
            HL("mlp.gate_proj.weight", 2, sp->I, H, 0, a, 0.0f);
            HL("mlp.up_proj.weight", 2, sp->I, H, 0, a, 0.0f);
            HL("mlp.down_proj.weight", 2, H, sp->I, 0, a, 0.0f);
        }
#undef HL
    }
#undef HADD
    DF_ASSERT(n <= cap);
    errbuf err = {{0}};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = st_write(path, t, n, NULL, &err);
    if (rc) printf("FAIL hybrid checkpoint %s: %s\n", dir, err.msg);
    for (int i = 0; i < n; i++) free((void *)t[i].data);
    free(t), free(names);
    return rc;
}

/* The other checkpoint layouts the hybrid loaders read, made from the qwen35-tiny golden into dir: Qwen3-Next's
 * fused in_proj_qkvz / in_proj_ba (per q/k head group [q | k | v | z], [b | a]) with model_type qwen3_next, layer
 * 0's conv weight squeezed to (C, K), and every text weight under model.language_model. (the vision-language
 * checkpoints). Returns 0 or prints the failure. */
static int make_hybrid_layouts(const char *src, const char *dir)
{
    errbuf err = {{0}};
    hf_config c;
    st_file *st = NULL;
    if (hf_config_load(&c, src, &err) || st_open(&st, src, &err)) {
        printf("FAIL hybrid layouts: %s\n", err.msg);
        return -1;
    }
    const int H = c.hidden_size, HK = c.linear_num_k_heads, HV = c.linear_num_v_heads, Dk = c.linear_k_head_dim;
    const int Dv = c.linear_v_head_dim, r = HV / HK, grp = 2 * Dk + 2 * r * Dv;
    const size_t row = sizeof(float) * (size_t)H;
    const int n = st_count(st);
    st_write_tensor *t = xcalloc((size_t)n, sizeof *t);
    char (*names)[160] = xcalloc((size_t)n, sizeof *names);
    float **data = xcalloc((size_t)n, sizeof *data);
    int m = 0, rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const st_tensor *x = st_at(st, i);
        size_t cnt = 0;
        if (strstr(x->name, "in_proj_z.") || strstr(x->name, "in_proj_a.")) continue; /* folded into qkvz / ba */
        if ((rc = st_load_f32(st, x->name, &data[m], -1, NULL, &cnt, &err))) break;
        t[m] = (st_write_tensor){.name = names[m], .dtype = ST_F32, .ndim = x->ndim};
        memcpy(t[m].shape, x->shape, sizeof x->shape);
        if (!strncmp(x->name, "model.", 6)) snprintf(names[m], sizeof names[m], "model.language_model.%s", x->name + 6);
        else snprintf(names[m], sizeof names[m], "%s", x->name);
        int li = -1;
        if (strstr(x->name, "in_proj_qkv.") || strstr(x->name, "in_proj_b.")) sscanf(x->name, "model.layers.%d.", &li);
        char other[160];
        float *o = NULL, *f = NULL;
        if (li >= 0 && strstr(x->name, "in_proj_qkv.")) {
            snprintf(other, sizeof other, "model.layers.%d.linear_attn.in_proj_z.weight", li);
            if ((rc = st_load_f32(st, other, &o, -1, NULL, &cnt, &err))) break;
            const float *q = data[m];
            f = xmalloc(row * (size_t)HK * grp);
            for (int g = 0; g < HK; g++) {
                float *d = f + (size_t)g * grp * H;
                memcpy(d, q + (size_t)(g * Dk) * H, row * Dk);
                memcpy(d + (size_t)Dk * H, q + (size_t)(HK * Dk + g * Dk) * H, row * Dk);
                memcpy(d + (size_t)2 * Dk * H, q + (size_t)(2 * HK * Dk + g * r * Dv) * H, row * r * Dv);
                memcpy(d + (size_t)(2 * Dk + r * Dv) * H, o + (size_t)(g * r * Dv) * H, row * r * Dv);
            }
            t[m].shape[0] = HK * grp;
            snprintf(names[m], sizeof names[m], "model.language_model.layers.%d.linear_attn.in_proj_qkvz.weight", li);
        } else if (li >= 0) { /* in_proj_b + in_proj_a -> in_proj_ba */
            snprintf(other, sizeof other, "model.layers.%d.linear_attn.in_proj_a.weight", li);
            if ((rc = st_load_f32(st, other, &o, -1, NULL, &cnt, &err))) break;
            const float *b = data[m];
            f = xmalloc(row * (size_t)2 * HV);
            for (int g = 0; g < HK; g++) {
                memcpy(f + (size_t)(g * 2 * r) * H, b + (size_t)(g * r) * H, row * r);
                memcpy(f + (size_t)(g * 2 * r + r) * H, o + (size_t)(g * r) * H, row * r);
            }
            t[m].shape[0] = 2 * HV;
            snprintf(names[m], sizeof names[m], "model.language_model.layers.%d.linear_attn.in_proj_ba.weight", li);
        } else if (!strcmp(x->name, "model.layers.0.linear_attn.conv1d.weight")) {
            t[m].ndim = 2, t[m].shape[1] = t[m].shape[2], t[m].shape[2] = 0;
        }
        if (f) free(data[m]), data[m] = f;
        free(o);
        t[m].data = data[m];
        m++;
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!rc) rc = st_write(path, t, m, NULL, &err);
    for (int i = 0; i < n; i++) free(data[i]);
    free(t), free(names), free(data);
    st_close(&st);
    if (rc) {
        printf("FAIL hybrid layouts: %s\n", err.msg);
        return -1;
    }
    /* the golden's config with model_type qwen3_next (its layer_types kept) */
    char cfgp[1200];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", src);
    FILE *fi = fopen(cfgp, "r");
    char *text = xcalloc(1 << 16, 1), *mt = NULL;
    if (fi) {
        size_t len = fread(text, 1, (1 << 16) - 1, fi);
        text[len] = 0;
        fclose(fi);
        mt = strstr(text, "\"qwen3_5_text\"");
    }
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    FILE *fo = mt ? fopen(cfgp, "w") : NULL;
    if (fo) {
        fwrite(text, 1, (size_t)(mt - text), fo);
        fprintf(fo, "\"qwen3_next\"%s", mt + strlen("\"qwen3_5_text\""));
        fclose(fo);
    }
    free(text);
    if (!fo) {
        printf("FAIL hybrid layouts: %s/config.json: no model_type qwen3_5_text to rewrite\n", src);
        return -1;
    }
    return 0;
}

static void rm_layouts(const char *dir)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

#endif
