/* moe_block_cuda: the sparse MoE block on CUDA (see the header). Rows of the grouped GEMMs: the T*K routed picks in
 * expert order, then (with a shared expert) the T tokens in order as group E, so the shared expert rides in the
 * same two launches as the routed ones and its output rows start at T*K, a row the host knows without asking. */
#include "moe_block_cuda.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "bias_add.h"
#include "cuda_check.h"
#include "matmul.h"
#include "moe_combine.h"
#include "moe_gemm.h"
#include "moe_group.h"
#include "moe_router.h"
#include "rand_fill.h"

struct moe_cuda {
    moe_cuda_shape s;
    int max_tokens, ldl, lda;  /* rows; router logits' row stride = router rows (moe_router_rows); act's */
    float *logits;             /* (T, ldl) fp32: E router logits, then the shared gate logit */
    int32_t *sel;              /* (T*K) */
    float *selw;               /* (T*K) */
    int32_t *off, *ntiles;     /* (E + 2), (1) */
    int32_t *row_token;        /* (T*K + T) */
    int32_t *slot_row;         /* (T*K) */
    int32_t *tiles;            /* (3 * max tiles) */
    void *work;                /* moe_group's */
    uint16_t *act, *ys;        /* (T*K + T, lda), (T*K + T, H) */
};

moe_cuda_shape moe_cuda_shape_of(const hf_config *c)
{
    moe_cuda_shape s = {.H = c->hidden_size, .E = c->num_experts, .K = c->num_experts_per_tok,
                        .Im = c->moe_intermediate_size, .Is = c->shared_expert_intermediate_size,
                        .shared_gate = c->shared_expert_intermediate_size > 0, .norm_topk = c->norm_topk_prob,
                        .bias = c->moe_bias, .alpha = (float)c->swiglu_alpha, .limit = (float)c->swiglu_limit};
    return s;
}

int moe_cuda_check(const moe_cuda_shape *s, errbuf *err)
{
    if (s->E <= 0 || s->E > 1023 || s->K <= 0 || s->K > s->E)
        return errbuf_set(err, EINVAL, "target_cuda: %d experts with top-%d unsupported (at most 1023 experts)", s->E,
                          s->K);
    if (s->H % 8 || s->Im <= 0 || s->Im % 8 || s->Is < 0 || s->Is % 8 || (s->shared_gate && s->Is == 0))
        return errbuf_set(err, EINVAL, "target_cuda: MoE hidden %d, moe_intermediate_size %d, "
                          "shared_expert_intermediate_size %d unsupported (multiples of 8)", s->H, s->Im, s->Is);
    return 0;
}

/* The router weight's rows: E (+ the shared gate) padded with zero rows to a multiple of 16, so that cuBLASLt
 * takes its fast path for the logits GEMM (257 columns ran at ~54 TFLOP/s); also the logits' row stride. */
static int moe_router_rows(const moe_cuda_shape *s) { return (s->E + s->shared_gate + 15) / 16 * 16; }

static int moe_rows(const moe_cuda_shape *s, int T) { return T * s->K + (s->Is > 0 ? T : 0); }

moe_cuda *moe_cuda_create(target_cuda *m, const moe_cuda_shape *s, int max_tokens)
{
    moe_cuda *b = xcalloc(1, sizeof *b);
    const size_t T = (size_t)max_tokens, TK = T * (size_t)s->K, R = (size_t)moe_rows(s, max_tokens);
    const int w = s->Im > s->Is ? s->Im : s->Is;
    b->s = *s, b->max_tokens = max_tokens;
    b->ldl = moe_router_rows(s);
    b->lda = (w + 7) / 8 * 8;
    b->logits = target_cuda_alloc(m, sizeof(float) * T * (size_t)b->ldl);
    b->sel = target_cuda_alloc(m, sizeof(int32_t) * TK);
    b->selw = target_cuda_alloc(m, sizeof(float) * TK);
    b->off = target_cuda_alloc(m, sizeof(int32_t) * (size_t)(s->E + 2));
    b->ntiles = target_cuda_alloc(m, sizeof(int32_t));
    b->row_token = target_cuda_alloc(m, sizeof(int32_t) * R);
    b->slot_row = target_cuda_alloc(m, sizeof(int32_t) * TK);
    b->tiles = target_cuda_alloc(m, sizeof(int32_t) * 3 *
                                 (size_t)moe_group_max_tiles((int)TK, s->E, s->Is > 0 ? max_tokens : 0, MOE_GEMM_BM));
    b->work = target_cuda_alloc(m, moe_group_cuda_workspace((int)TK, s->E));
    b->act = target_cuda_alloc(m, R * (size_t)b->lda * 2);
    b->ys = target_cuda_alloc(m, R * (size_t)s->H * 2);
    return b;
}

void moe_cuda_destroy(moe_cuda **pb)
{
    moe_cuda *b = *pb;
    if (!b) return;
    void *p[] = {&b->logits, &b->sel, &b->selw, &b->off, &b->ntiles, &b->row_token, &b->slot_row, &b->tiles,
                 &b->work, &b->act, &b->ys};
    for (size_t j = 0; j < sizeof p / sizeof p[0]; j++) target_cuda_free(p[j]);
    free(b);
    *pb = NULL;
}

void moe_cuda_layer_alloc(target_cuda *m, const moe_cuda_shape *s, moe_cuda_layer *l)
{
    const size_t H = (size_t)s->H, E = (size_t)s->E, Im = (size_t)s->Im, Is = (size_t)s->Is;
    l->router = target_cuda_alloc(m, (size_t)moe_router_rows(s) * H * 2); /* padding zeroed by load / init_random */
    l->e_gu = target_cuda_alloc(m, E * 2 * Im * H * 2);
    l->e_down = target_cuda_alloc(m, E * H * Im * 2);
    l->s_gu = l->s_down = NULL;
    l->router_b = l->e_gu_b = l->e_down_b = NULL;
    if (s->bias) {
        l->router_b = target_cuda_alloc(m, E * sizeof(float));
        l->e_gu_b = target_cuda_alloc(m, E * 2 * Im * sizeof(float));
        l->e_down_b = target_cuda_alloc(m, E * H * sizeof(float));
    }
    if (Is > 0) {
        l->s_gu = target_cuda_alloc(m, 2 * Is * H * 2);
        l->s_down = target_cuda_alloc(m, H * Is * 2);
    }
}

void moe_cuda_layer_free(moe_cuda_layer *l)
{
    void *p[] = {&l->router, &l->e_gu, &l->e_down, &l->s_gu, &l->s_down, &l->router_b, &l->e_gu_b, &l->e_down_b};
    for (size_t j = 0; j < sizeof p / sizeof p[0]; j++) target_cuda_free(p[j]);
}

/* The router's padding rows (after the E expert rows and the shared gate's) must stay 0. Written with the weights
 * (load, init_random), not when the buffer is laid out: a measuring arena hands out NULL, and a re-imported arena
 * already holds the weights. */
static void router_pad_zero(const moe_cuda_shape *s, uint16_t *router, cudaStream_t st)
{
    const size_t used = (size_t)(s->E + s->shared_gate), pad = (size_t)moe_router_rows(s) - used;
    if (pad) CHECK_CUDA(cudaMemsetAsync(router + used * (size_t)s->H, 0, pad * (size_t)s->H * 2, st));
}

/* Tensor prefix+suffix of shape (d0[, d1[, d2]]) (0 ends the shape) uploaded as bf16 to dst. */
static int moe_up(const st_file *st, const char *prefix, const char *suffix, uint16_t *dst, int64_t d0, int64_t d1,
                  int64_t d2, errbuf *err)
{
    char n[320];
    snprintf(n, sizeof n, "%s%s", prefix, suffix);
    int64_t shape[3] = {d0, d1, d2};
    float *f = NULL;
    int rc = st_load_f32(st, n, &f, d2 > 0 ? 3 : d1 > 0 ? 2 : 1, shape, NULL, err);
    if (!rc) target_cuda_put(dst, f, (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1) * (size_t)(d2 > 0 ? d2 : 1), 0.0f);
    free(f);
    return rc;
}

int moe_cuda_layer_load(const moe_cuda_shape *s, moe_cuda_layer *l, const st_file *st, const char *prefix,
                        errbuf *err)
{
    const int64_t H = s->H, E = s->E, Im = s->Im, Is = s->Is;
    char n[320];
    int rc = moe_up(st, prefix, "gate.weight", l->router, E, H, 0, err);
    snprintf(n, sizeof n, "%sexperts.gate_up_proj", prefix);
    if (!rc && st_find(st, n)) { /* transformers' fused layout */
        rc = moe_up(st, prefix, "experts.gate_up_proj", l->e_gu, E, 2 * Im, H, err);
        if (!rc) rc = moe_up(st, prefix, "experts.down_proj", l->e_down, E, H, Im, err);
    } else {
        char sfx[96];
        for (int64_t e = 0; e < E && !rc; e++) {
            uint16_t *gu = l->e_gu + (size_t)(e * 2 * Im * H);
            snprintf(sfx, sizeof sfx, "experts.%lld.gate_proj.weight", (long long)e);
            rc = moe_up(st, prefix, sfx, gu, Im, H, 0, err);
            snprintf(sfx, sizeof sfx, "experts.%lld.up_proj.weight", (long long)e);
            if (!rc) rc = moe_up(st, prefix, sfx, gu + (size_t)(Im * H), Im, H, 0, err);
            snprintf(sfx, sizeof sfx, "experts.%lld.down_proj.weight", (long long)e);
            if (!rc) rc = moe_up(st, prefix, sfx, l->e_down + (size_t)(e * H * Im), H, Im, 0, err);
        }
    }
    if (!rc && Is > 0) {
        rc = moe_up(st, prefix, "shared_expert.gate_proj.weight", l->s_gu, Is, H, 0, err);
        if (!rc) rc = moe_up(st, prefix, "shared_expert.up_proj.weight", l->s_gu + (size_t)(Is * H), Is, H, 0, err);
        if (!rc) rc = moe_up(st, prefix, "shared_expert.down_proj.weight", l->s_down, H, Is, 0, err);
    }
    if (!rc && s->shared_gate)
        rc = moe_up(st, prefix, "shared_expert_gate.weight", l->router + (size_t)(E * H), 1, H, 0, err);
    if (!rc) {
        router_pad_zero(s, l->router, 0);
        CHECK_CUDA(cudaDeviceSynchronize()); /* the legacy stream, ordered with the uploads' cudaMemcpy */
    }
    return rc;
}

void moe_cuda_layer_init_random(target_cuda *m, const moe_cuda_shape *s, moe_cuda_layer *l, uint64_t *seed, float a)
{
    const size_t H = (size_t)s->H, E = (size_t)s->E, Im = (size_t)s->Im, Is = (size_t)s->Is;
    cudaStream_t st = m->stream;
    uint64_t r = *seed;
    rand_fill_bf16_cuda(l->router, (E + (size_t)s->shared_gate) * H, r++, a, 0.0f, st);
    router_pad_zero(s, l->router, st);
    rand_fill_bf16_cuda(l->e_gu, E * 2 * Im * H, r++, a, 0.0f, st);
    rand_fill_bf16_cuda(l->e_down, E * H * Im, r++, a, 0.0f, st);
    if (s->bias) {
        CHECK_CUDA(cudaMemsetAsync(l->router_b, 0, E * sizeof(float), st));
        CHECK_CUDA(cudaMemsetAsync(l->e_gu_b, 0, E * 2 * Im * sizeof(float), st));
        CHECK_CUDA(cudaMemsetAsync(l->e_down_b, 0, E * H * sizeof(float), st));
    }
    if (Is > 0) {
        rand_fill_bf16_cuda(l->s_gu, 2 * Is * H, r++, a, 0.0f, st);
        rand_fill_bf16_cuda(l->s_down, H * Is, r++, a, 0.0f, st);
    }
    *seed = r;
}

void moe_cuda_forward(target_cuda *m, moe_cuda *b, const moe_cuda_layer *l, int T, const uint16_t *u, int ldu,
                      const uint16_t *resid, int ldr, uint16_t *dst, int ldd)
{
    const moe_cuda_shape *s = &b->s;
    const int H = s->H, E = s->E, K = s->K, TK = T * K, shared = s->Is > 0 ? T : 0;
    DF_ASSERT(T >= 0 && T <= b->max_tokens);
    if (T == 0) return;
    cudaStream_t st = m->stream;
    matmul_forward_f32_cuda(m->mm, b->logits, b->ldl, 0.0f, u, ldu, l->router, T, b->ldl, H, st);
    target_cuda_mark(m, TARGET_CUDA_MATMUL);
    bias_add_f32_cuda(b->logits, b->ldl, T, E, l->router_b, st);
    moe_router_topk_cuda(b->sel, b->selw, b->logits, b->ldl, T, E, K, s->norm_topk, st);
    moe_group_cuda(b->sel, T, K, E, shared, MOE_GEMM_BM, b->off, b->row_token, b->slot_row, b->tiles, b->ntiles,
                   b->work, st);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
    const int tiles = moe_group_max_tiles(TK, E, shared, MOE_GEMM_BM);
    const moe_gemm_opts ogu = {.bias = l->e_gu_b, .alpha = s->alpha, .limit = s->limit};
    const moe_gemm_opts odn = {.bias = l->e_down_b};
    moe_gemm_gate_up_opts_cuda(b->act, b->lda, u, ldu, b->row_token, b->tiles, b->ntiles, tiles, E, H, s->Im, s->Is,
                               l->e_gu, l->s_gu, &ogu, st);
    moe_gemm_down_opts_cuda(b->ys, H, b->act, b->lda, b->tiles, b->ntiles, tiles, E, H, s->Im, s->Is, l->e_down,
                            l->s_down, &odn, st);
    target_cuda_mark(m, TARGET_CUDA_MATMUL);
    moe_combine_cuda(dst, ldd, resid, ldr, b->ys, H, b->slot_row, b->selw, T, K, H,
                     shared ? b->ys + (size_t)TK * H : NULL, H, s->shared_gate ? b->logits + E : NULL, b->ldl, st);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
}
