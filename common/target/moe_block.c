/* moe_block: the sparse MoE MLP block on the CPU; moved out of target_hybrid.c so that every family with experts
 * runs the one block. */
#include "moe_block.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bias_add.h"
#include "matmul.h"
#include "moe_router.h"
#include "swiglu.h"

enum { MB_PROBS, MB_XS, MB_YS, MB_GU, MB_ACT, MB_UP };

static float *scratch(moe_scratch *s, int i, size_t n)
{
    if (s->cap[i] < n) {
        free(s->buf[i]);
        s->buf[i] = xmalloc(sizeof(float) * n);
        s->cap[i] = n;
    }
    return s->buf[i];
}

void moe_scratch_free(moe_scratch *s)
{
    for (int i = 0; i < 6; i++) free(s->buf[i]);
    free(s->idx);
    free(s->wts);
    free(s->sel);
    free(s->selw);
    *s = (moe_scratch){0};
}

/* Tensor "<prefix>layers.<layer>.mlp.<suffix>" of shape (d0[, d1[, d2]]) (0 ends the shape): into *out (NULL) or
 * into dst. */
static int ld(const st_file *st, const char *prefix, int layer, const char *suffix, float **out, float *dst,
              int64_t d0, int64_t d1, int64_t d2, errbuf *err)
{
    char n[256];
    snprintf(n, sizeof n, "%slayers.%d.mlp.%s", prefix, layer, suffix);
    int64_t shape[3] = {d0, d1, d2};
    int nd = d2 > 0 ? 3 : d1 > 0 ? 2 : 1;
    return dst ? st_read_f32(st, n, dst, nd, shape, err) : st_load_f32(st, n, out, nd, shape, NULL, err);
}

int moe_block_load(moe_block *b, const st_file *st, const hf_config *c, const char *prefix, int layer, errbuf *err)
{
    const int64_t H = c->hidden_size, E = c->num_experts, Im = c->moe_intermediate_size;
    const int64_t Is = c->shared_expert_intermediate_size;
    *b = (moe_block){0};
    int rc = ld(st, prefix, layer, "gate.weight", &b->router, NULL, E, H, 0, err);
    if (rc) return rc;
    char fused[256];
    snprintf(fused, sizeof fused, "%slayers.%d.mlp.experts.gate_up_proj", prefix, layer);
    if (st_find(st, fused)) { /* transformers' fused layout */
        rc = ld(st, prefix, layer, "experts.gate_up_proj", &b->e_gate_up, NULL, E, 2 * Im, H, err);
        if (!rc) rc = ld(st, prefix, layer, "experts.down_proj", &b->e_down, NULL, E, H, Im, err);
    } else {
        b->e_gate_up = xmalloc(sizeof(float) * (size_t)(E * 2 * Im * H));
        b->e_down = xmalloc(sizeof(float) * (size_t)(E * H * Im));
        char s[96];
        for (int64_t e = 0; e < E && !rc; e++) {
            float *gu = b->e_gate_up + e * 2 * Im * H;
            snprintf(s, sizeof s, "experts.%lld.gate_proj.weight", (long long)e);
            rc = ld(st, prefix, layer, s, NULL, gu, Im, H, 0, err);
            snprintf(s, sizeof s, "experts.%lld.up_proj.weight", (long long)e);
            if (!rc) rc = ld(st, prefix, layer, s, NULL, gu + Im * H, Im, H, 0, err);
            snprintf(s, sizeof s, "experts.%lld.down_proj.weight", (long long)e);
            if (!rc) rc = ld(st, prefix, layer, s, NULL, b->e_down + e * H * Im, H, Im, 0, err);
        }
    }
    if (!rc && Is > 0) {
        rc = ld(st, prefix, layer, "shared_expert.gate_proj.weight", &b->s_gate, NULL, Is, H, 0, err);
        if (!rc) rc = ld(st, prefix, layer, "shared_expert.up_proj.weight", &b->s_up, NULL, Is, H, 0, err);
        if (!rc) rc = ld(st, prefix, layer, "shared_expert.down_proj.weight", &b->s_down, NULL, H, Is, 0, err);
        if (!rc) rc = ld(st, prefix, layer, "shared_expert_gate.weight", &b->s_gate_w, NULL, 1, H, 0, err);
    }
    return rc;
}

void moe_block_free(moe_block *b)
{
    float **p[] = {&b->router, &b->e_gate_up, &b->e_down, &b->s_gate, &b->s_up, &b->s_down, &b->s_gate_w,
                   &b->router_b, &b->e_gate_up_b, &b->e_down_b};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) XFREE(*p[i]);
}

void moe_swiglu_mlp_cpu(float *x, const float *u, int n, int H, int I, const float *wg, const float *wu,
                        const float *wd, float *g, float *up)
{
    matmul_forward_cpu(g, I, u, H, wg, n, I, H, 0);
    matmul_forward_cpu(up, I, u, H, wu, n, I, H, 0);
    swiglu_forward_cpu(g, g, up, (size_t)n * (size_t)I);
    matmul_forward_cpu(x, H, g, I, wd, n, H, I, 1);
}

void moe_block_forward_cpu(const moe_block *b, const hf_config *c, moe_scratch *s, float *x, const float *u, int T)
{
    const int H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, Im = c->moe_intermediate_size;
    const int Is = c->shared_expert_intermediate_size;
    float *probs = scratch(s, MB_PROBS, (size_t)T * E);
    matmul_forward_cpu(probs, E, u, H, b->router, T, E, H, 0);
    bias_add_cpu(probs, E, T, E, b->router_b);
    size_t need = (size_t)T * K;
    if (s->idx_cap < need) {
        free(s->idx);
        free(s->wts);
        free(s->sel);
        free(s->selw);
        s->idx = xmalloc(sizeof(int) * need);
        s->wts = xmalloc(sizeof(float) * need);
        s->sel = xmalloc(sizeof(int32_t) * need);
        s->selw = xmalloc(sizeof(float) * need);
        s->idx_cap = need;
    }
    moe_router_topk_cpu(s->sel, s->selw, probs, E, T, E, K, c->norm_topk_prob);
    float *xs = scratch(s, MB_XS, (size_t)T * H), *ys = scratch(s, MB_YS, (size_t)T * H);
    float *gu = scratch(s, MB_GU, (size_t)T * 2 * Im), *act = scratch(s, MB_ACT, (size_t)T * Im);
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (s->sel[(size_t)t * K + j] == e) {
                    s->idx[n] = t;
                    s->wts[n] = s->selw[(size_t)t * K + j];
                    memcpy(xs + (size_t)n * H, u + (size_t)t * H, sizeof(float) * (size_t)H);
                    n++;
                }
        if (!n) continue;
        const float *wgu = b->e_gate_up + (size_t)e * 2 * Im * H, *wd = b->e_down + (size_t)e * H * Im;
        matmul_forward_cpu(gu, 2 * Im, xs, H, wgu, n, 2 * Im, H, 0);
        const float *bgu = b->e_gate_up_b ? b->e_gate_up_b + (size_t)e * 2 * Im : NULL;
        const float *bd = b->e_down_b ? b->e_down_b + (size_t)e * H : NULL;
        for (int r = 0; r < n; r++) {
            float *g = gu + (size_t)r * 2 * Im;
            for (int i = 0; bgu && i < 2 * Im; i++) g[i] += bgu[i];
            if (c->swiglu_limit > 0)
                swiglu_clamped_forward_cpu(act + (size_t)r * Im, g, g + Im, (size_t)Im, (float)c->swiglu_alpha,
                                           (float)c->swiglu_limit);
            else
                swiglu_forward_cpu(act + (size_t)r * Im, g, g + Im, (size_t)Im);
        }
        matmul_forward_cpu(ys, H, act, Im, wd, n, H, Im, 0);
        for (int r = 0; r < n; r++) {
            float *xt = x + (size_t)s->idx[r] * H;
            const float *yr = ys + (size_t)r * H, w = s->wts[r];
            if (bd)
                for (int i = 0; i < H; i++) xt[i] += (yr[i] + bd[i]) * w;
            else
                for (int i = 0; i < H; i++) xt[i] += yr[i] * w;
        }
    }
    if (Is > 0) {
        float *sh = scratch(s, MB_XS, (size_t)T * H), *sg = scratch(s, MB_YS, (size_t)T);
        float *g = scratch(s, MB_GU, (size_t)T * Is), *up = scratch(s, MB_UP, (size_t)T * Is);
        memset(sh, 0, sizeof(float) * (size_t)T * H);
        moe_swiglu_mlp_cpu(sh, u, T, H, Is, b->s_gate, b->s_up, b->s_down, g, up);
        matmul_forward_cpu(sg, 1, u, H, b->s_gate_w, T, 1, H, 0);
        for (int t = 0; t < T; t++) {
            float a = 1.0f / (1.0f + expf(-sg[t]));
            for (int i = 0; i < H; i++) x[(size_t)t * H + i] += a * sh[(size_t)t * H + i];
        }
    }
}
