/* target_hybrid_cuda: the hybrid family on CUDA (its operations target_hybrid_cuda, reached through the family
 * table), following target_hybrid.c (the CPU reference): the packed forward and decoding with a cache. Per layer:
 * zero-centred RMSNorm, then
 *  - Gated DeltaNet: one fused GEMM [q | k | v | z | b | a], causal depthwise conv1d + SiLU over q|k|v (history
 *    restarting at each sequence start), l2-norm of q (scaled) and k with beta = sigmoid(b) and
 *    g = -exp(A_log) softplus(a + dt_bias) (gated_delta_prep), the chunked delta rule (fp32 state), the gated
 *    RMSNorm with silu(z), out_proj whose epilogue adds the residual;
 *  - or gated attention: one fused GEMM [q (every head) | gate (every head) | k | v] (q_proj's per-head [q | gate]
 *    rows are regrouped at load), q/k norm + partial RoPE, flash attention, output * sigmoid(gate), o_proj adding
 *    the residual;
 * then RMSNorm and the MLP: dense SwiGLU as Qwen3 (one gate|up GEMM, down_proj adding the residual), or the MoE
 * block (moe_block_cuda: routing, grouping by expert and the grouped expert GEMMs on the device, no host sync; the
 * shared expert with its sigmoid gate rides in the same launches). A layer's last kernel (down_proj GEMM or
 * moe_combine) writes the residual stream straight into the tap block / last buffer as the Qwen3 loop does.
 * Decoding (thc_cache below): the attention layers append their keys and values to the cache and attend to it
 * (flash-decoding) as the dense family does; the linear layers run the conv and the delta rule from each sequence's
 * carried history and fp32 state and store the new ones (causal_conv1d_silu_state_cuda,
 * gated_delta_chunk_forward_state_cuda: the tensor cores for a prefill, the fp32 kernel for steps of a few rows).
 * tests/hybrid_flow.h transcribes the loading and the forward with the kernels' CPU references (the unit test
 * test_target_hybrid_cuda_flow checks it against target_hybrid.c; test_target_gpu uses it as the GPU's bf16
 * reference): change the two together. */

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "attention.h"
#include "causal_conv1d.h"
#include "cuda_check.h"
#include "gated_delta_chunk.h"
#include "gated_delta_prep.h"
#include "gated_delta_rule.h"
#include "gated_rmsnorm.h"
#include "kv_attention.h"
#include "matmul.h"
#include "mlp_block_cuda.h"
#include "moe_block_cuda.h"
#include "qk_norm_rope.h"
#include "rand_fill.h"
#include "rmsnorm.h"
#include "sigmoid_gate.h"
#include "target_hybrid_layout.h"
#include "target_model_cuda_impl.h"

typedef struct thc_layer {
    int linear, moe;
    uint16_t *input_norm, *post_norm; /* (H), 1 + w */
    /* gated attention */
    uint16_t *w_attn;                 /* (2qd + 2kd, H): rows [q (qd) | gate (qd) | k (kd) | v (kd)] */
    uint16_t *w_o;                    /* (H, qd) */
    uint16_t *q_norm, *k_norm;        /* (hd), 1 + w */
    /* Gated DeltaNet */
    uint16_t *w_lin;                  /* (C + VD + 2 HV, H): rows [q | k | v (C) | z (VD) | b (HV) | a (HV)] */
    uint16_t *conv;                   /* (C, Kc) */
    float *a_log, *dt_bias;           /* (HV), fp32 */
    uint16_t *gnorm;                  /* (Dv), plain weight */
    uint16_t *w_out;                  /* (H, VD) */
    /* dense MLP */
    mlp_cuda_layer mlp;               /* the dense MLP (a layer layer_moe leaves dense) */
    moe_cuda_layer mw;                /* MoE */
} thc_layer;

struct target_hybrid_cuda {
    thc_layer *layers;
    int C, VD, lin_w, attn_w;         /* conv channels, value width, fused widths */
    /* workspaces, for max_tokens rows */
    uint16_t *proj;                   /* (T, max(lin_w, attn_w)) */
    uint16_t *conv;                   /* (T, C) */
    float *g, *beta;                  /* (T, HV) */
    uint16_t *core;                   /* (T, max(VD, qd)): delta-rule output / attention output */
    mlp_cuda mlpw;                    /* the dense MLP's workspaces; NULL without dense layers */
    moe_cuda_shape ms;                /* MoE */
    moe_cuda *moe;
};

#define thc_alloc target_cuda_alloc
#define thc_free target_cuda_free
#define thc_put target_cuda_put

static int thc_create(target_cuda *m, errbuf *err)
{
    const hf_config *c = &m->cfg;
    const int H = c->hidden_size, hd = c->head_dim, qd = c->num_heads * hd, kd = c->num_kv_heads * hd;
    const int HK = c->linear_num_k_heads, HV = c->linear_num_v_heads, Dk = c->linear_k_head_dim;
    const int Dv = c->linear_v_head_dim, E = c->num_experts;
    if (HK <= 0 || HV % HK || Dk <= 0 || Dk > 256 || Dv <= 0 || c->linear_conv_kernel <= 0)
        return errbuf_set(err, EINVAL, "target_cuda: linear attention with %d/%d heads of %d/%d, conv kernel %d "
                          "unsupported (key dim at most 256, value heads a multiple of key heads)", HK, HV, Dk, Dv,
                          c->linear_conv_kernel);
    if (hd > 256 || c->rotary_dim <= 0 || c->rotary_dim % 2 || c->rotary_dim > hd)
        return errbuf_set(err, EINVAL, "target_cuda: head_dim %d / rotary dim %d unsupported (head_dim at most 256)",
                          hd, c->rotary_dim);
    const moe_cuda_shape ms = moe_cuda_shape_of(c);
    if (E > 0 && moe_cuda_check(&ms, err)) return -EINVAL;
    struct target_hybrid_cuda *y = xcalloc(1, sizeof *y);
    m->layers = y;
    y->C = 2 * HK * Dk + HV * Dv, y->VD = HV * Dv;
    y->lin_w = y->C + y->VD + 2 * HV;
    y->attn_w = 2 * qd + 2 * kd;
    y->ms = ms;
    const size_t h2 = (size_t)H * 2, C = (size_t)y->C, VD = (size_t)y->VD;
    int any_dense = 0, any_moe = 0;
    y->layers = xcalloc((size_t)m->nlayers, sizeof *y->layers);
    for (int i = 0; i < m->nlayers; i++) {
        thc_layer *l = &y->layers[i];
        l->linear = c->layer_linear[i];
        l->moe = E > 0 && c->layer_moe[i];
        any_dense |= !l->moe, any_moe |= l->moe;
        l->input_norm = thc_alloc(m, h2);
        l->post_norm = thc_alloc(m, h2);
        if (l->linear) {
            l->w_lin = thc_alloc(m, (size_t)y->lin_w * h2);
            l->conv = thc_alloc(m, C * (size_t)c->linear_conv_kernel * 2);
            l->a_log = thc_alloc(m, sizeof(float) * (size_t)HV);
            l->dt_bias = thc_alloc(m, sizeof(float) * (size_t)HV);
            l->gnorm = thc_alloc(m, (size_t)Dv * 2);
            l->w_out = thc_alloc(m, VD * h2);
        } else {
            l->w_attn = thc_alloc(m, (size_t)y->attn_w * h2);
            l->w_o = thc_alloc(m, (size_t)qd * h2);
            l->q_norm = thc_alloc(m, (size_t)hd * 2);
            l->k_norm = thc_alloc(m, (size_t)hd * 2);
        }
        if (l->moe) {
            moe_cuda_layer_alloc(m, &ms, &l->mw);
        } else {
            mlp_cuda_layer_alloc(m, &l->mlp);
        }
    }
    const size_t T = (size_t)m->max_tokens;
    y->proj = thc_alloc(m, T * (size_t)(y->lin_w > y->attn_w ? y->lin_w : y->attn_w) * 2);
    y->conv = thc_alloc(m, T * C * 2);
    y->g = thc_alloc(m, sizeof(float) * T * (size_t)HV);
    y->beta = thc_alloc(m, sizeof(float) * T * (size_t)HV);
    y->core = thc_alloc(m, T * (VD > (size_t)qd ? VD : (size_t)qd) * 2);
    if (any_dense) mlp_cuda_alloc(m, &y->mlpw);
    if (any_moe) y->moe = moe_cuda_create(m, &ms, m->max_tokens);
    return 0;
}

static void thc_destroy(target_cuda *m)
{
    struct target_hybrid_cuda *y = m->layers;
    if (!y) return;
    for (int i = 0; y->layers && i < m->nlayers; i++) {
        thc_layer *l = &y->layers[i];
        void *p[] = {&l->input_norm, &l->post_norm, &l->w_attn, &l->w_o, &l->q_norm, &l->k_norm, &l->w_lin,
                     &l->conv, &l->a_log, &l->dt_bias, &l->gnorm, &l->w_out};
        for (size_t j = 0; j < sizeof p / sizeof p[0]; j++) thc_free(p[j]);
        mlp_cuda_layer_free(&l->mlp);
        moe_cuda_layer_free(&l->mw);
    }
    free(y->layers);
    void *b[] = {&y->proj, &y->conv, &y->g, &y->beta, &y->core};
    for (size_t j = 0; j < sizeof b / sizeof b[0]; j++) thc_free(b[j]);
    mlp_cuda_free(&y->mlpw);
    moe_cuda_destroy(&y->moe);
    free(y);
    m->layers = NULL;
}

/* ---- loading: every tensor goes through fp32 on the host (st_load_f32 converts and checks the shape), is
 * reordered there when the fused layout needs it, and is uploaded as bf16 ---- */

typedef struct thc_loader {
    const st_file *st;
    const char *prefix;
    int layer;
    errbuf *err;
} thc_loader;

static void thc_name(const thc_loader *L, char *n, size_t cap, const char *suffix)
{
    snprintf(n, cap, "%slayers.%d.%s", L->prefix, L->layer, suffix);
}

static int thc_has(const thc_loader *L, const char *suffix)
{
    char n[256];
    thc_name(L, n, sizeof n, suffix);
    return st_find(L->st, n) != NULL;
}

/* Tensor `suffix` of shape (d0[, d1[, d2]]) (0 ends the shape) as fp32 in *out (caller frees). */
static int thc_get(const thc_loader *L, const char *suffix, float **out, int64_t d0, int64_t d1, int64_t d2)
{
    char n[256];
    thc_name(L, n, sizeof n, suffix);
    int64_t shape[3] = {d0, d1, d2};
    return st_load_f32(L->st, n, out, d2 > 0 ? 3 : d1 > 0 ? 2 : 1, shape, NULL, L->err);
}

/* Tensor `suffix` (d0[, d1[, d2]]) uploaded as bf16(w + add) to dst. */
static int thc_up(const thc_loader *L, const char *suffix, uint16_t *dst, int64_t d0, int64_t d1, int64_t d2,
                  float add)
{
    float *f = NULL;
    int rc = thc_get(L, suffix, &f, d0, d1, d2);
    if (!rc) thc_put(dst, f, (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1) * (size_t)(d2 > 0 ? d2 : 1), add);
    free(f);
    return rc;
}

/* Tensor `suffix` (rows, cols): row r uploaded to row map(r) of dst (rows of cols). */
static int thc_up_rows(const thc_loader *L, const char *suffix, uint16_t *dst, int64_t rows, int64_t cols,
                       const int *map)
{
    float *f = NULL;
    int rc = thc_get(L, suffix, &f, rows, cols, 0);
    if (rc) return rc;
    float *p = xmalloc(sizeof(float) * (size_t)(rows * cols));
    for (int64_t r = 0; r < rows; r++)
        memcpy(p + (size_t)map[r] * (size_t)cols, f + (size_t)r * (size_t)cols, sizeof(float) * (size_t)cols);
    thc_put(dst, p, (size_t)(rows * cols), 0.0f);
    free(p);
    free(f);
    return 0;
}

/* fp32 vector `suffix` (n) to device fp32 dst */
static int thc_up_f32(const thc_loader *L, const char *suffix, float *dst, int64_t n)
{
    float *f = NULL;
    int rc = thc_get(L, suffix, &f, n, 0, 0);
    if (!rc) CHECK_CUDA(cudaMemcpy(dst, f, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
    free(f);
    return rc;
}

static int thc_load_linear(const thc_loader *L, const hf_config *c, const struct target_hybrid_cuda *y,
                           thc_layer *l)
{
    const int64_t H = c->hidden_size, HK = c->linear_num_k_heads, HV = c->linear_num_v_heads;
    const int64_t Dk = c->linear_k_head_dim, Dv = c->linear_v_head_dim, Kc = c->linear_conv_kernel;
    const int64_t C = y->C, VD = y->VD;
    int rc;
    if (thc_has(L, "linear_attn.in_proj_qkvz.weight")) { /* Qwen3-Next: per-group interleaved rows */
        const int64_t rows = C + VD, rows_ba = 2 * HV;
        int *map = xmalloc(sizeof(int) * (size_t)rows);
        for (int64_t r = 0; r < rows; r++) map[r] = target_hybrid_qkvz_row((int)r, (int)HK, (int)HV, (int)Dk, (int)Dv);
        rc = thc_up_rows(L, "linear_attn.in_proj_qkvz.weight", l->w_lin, rows, H, map);
        for (int64_t r = 0; r < rows_ba; r++) map[r] = target_hybrid_ba_row((int)r, (int)HK, (int)HV);
        if (!rc) rc = thc_up_rows(L, "linear_attn.in_proj_ba.weight", l->w_lin + (size_t)(C + VD) * H, rows_ba, H, map);
        free(map);
    } else {
        rc = thc_up(L, "linear_attn.in_proj_qkv.weight", l->w_lin, C, H, 0, 0.0f);
        if (!rc) rc = thc_up(L, "linear_attn.in_proj_z.weight", l->w_lin + (size_t)C * H, VD, H, 0, 0.0f);
        if (!rc) rc = thc_up(L, "linear_attn.in_proj_b.weight", l->w_lin + (size_t)(C + VD) * H, HV, H, 0, 0.0f);
        if (!rc) rc = thc_up(L, "linear_attn.in_proj_a.weight", l->w_lin + (size_t)(C + VD + HV) * H, HV, H, 0, 0.0f);
    }
    /* conv1d.weight is (C, 1, K) as nn.Conv1d stores it; some converters squeeze it to (C, K) */
    char n[256];
    thc_name(L, n, sizeof n, "linear_attn.conv1d.weight");
    const st_tensor *cw = st_find(L->st, n);
    if (!rc) rc = cw && cw->ndim == 2 ? thc_up(L, "linear_attn.conv1d.weight", l->conv, C, Kc, 0, 0.0f)
                                      : thc_up(L, "linear_attn.conv1d.weight", l->conv, C, 1, Kc, 0.0f);
    if (!rc) rc = thc_up_f32(L, "linear_attn.A_log", l->a_log, HV);
    if (!rc) rc = thc_up_f32(L, "linear_attn.dt_bias", l->dt_bias, HV);
    if (!rc) rc = thc_up(L, "linear_attn.norm.weight", l->gnorm, Dv, 0, 0, 0.0f);
    if (!rc) rc = thc_up(L, "linear_attn.out_proj.weight", l->w_out, H, VD, 0, 0.0f);
    return rc;
}

static int thc_load_attn(const thc_loader *L, const hf_config *c, thc_layer *l)
{
    const int64_t H = c->hidden_size, hd = c->head_dim, nh = c->num_heads, qd = nh * hd;
    const int64_t kd = (int64_t)c->num_kv_heads * hd;
    int *map = xmalloc(sizeof(int) * (size_t)(2 * qd));
    for (int64_t r = 0; r < 2 * qd; r++) map[r] = target_hybrid_q_gate_row((int)r, (int)nh, (int)hd);
    int rc = thc_up_rows(L, "self_attn.q_proj.weight", l->w_attn, 2 * qd, H, map);
    free(map);
    if (!rc) rc = thc_up(L, "self_attn.k_proj.weight", l->w_attn + (size_t)(2 * qd) * H, kd, H, 0, 0.0f);
    if (!rc) rc = thc_up(L, "self_attn.v_proj.weight", l->w_attn + (size_t)(2 * qd + kd) * H, kd, H, 0, 0.0f);
    if (!rc) rc = thc_up(L, "self_attn.o_proj.weight", l->w_o, H, qd, 0, 0.0f);
    if (!rc) rc = thc_up(L, "self_attn.q_norm.weight", l->q_norm, hd, 0, 0, 1.0f);
    if (!rc) rc = thc_up(L, "self_attn.k_norm.weight", l->k_norm, hd, 0, 0, 1.0f);
    return rc;
}

static int thc_load_moe(const thc_loader *L, const moe_cuda_shape *ms, thc_layer *l)
{
    char p[256];
    thc_name(L, p, sizeof p, "mlp.");
    return moe_cuda_layer_load(ms, &l->mw, L->st, p, L->err);
}

static int thc_load(target_cuda *m, const st_file *st, const char *prefix, errbuf *err)
{
    const hf_config *c = &m->cfg;
    struct target_hybrid_cuda *y = m->layers;
    const int64_t H = c->hidden_size;
    int rc = 0;
    for (int i = 0; i < m->nlayers && !rc; i++) {
        thc_layer *l = &y->layers[i];
        thc_loader L = {.st = st, .prefix = prefix, .layer = i, .err = err};
        rc = thc_up(&L, "input_layernorm.weight", l->input_norm, H, 0, 0, 1.0f);
        if (!rc) rc = thc_up(&L, "post_attention_layernorm.weight", l->post_norm, H, 0, 0, 1.0f);
        if (!rc) rc = l->linear ? thc_load_linear(&L, c, y, l) : thc_load_attn(&L, c, l);
        if (!rc && l->moe) {
            rc = thc_load_moe(&L, &y->ms, l);
        } else if (!rc) {
            rc = mlp_cuda_layer_load(m, &l->mlp, st, prefix, i, err);
        }
    }
    return rc;
}

static void thc_init_random(target_cuda *m, uint64_t *seed, float a)
{
    const hf_config *c = &m->cfg;
    struct target_hybrid_cuda *y = m->layers;
    const size_t H = (size_t)c->hidden_size, hd = (size_t)c->head_dim, qd = (size_t)c->num_heads * hd;
    const int HV = c->linear_num_v_heads;
    cudaStream_t st = m->stream;
    uint64_t s = *seed;
    float *alog = xmalloc(sizeof(float) * (size_t)HV), *dtb = xmalloc(sizeof(float) * (size_t)HV);
    for (int i = 0; i < m->nlayers; i++) {
        thc_layer *l = &y->layers[i];
        rand_fill_bf16_cuda(l->input_norm, H, s++, 0.0f, 1.0f, st);
        rand_fill_bf16_cuda(l->post_norm, H, s++, 0.0f, 1.0f, st);
        if (l->linear) {
            rand_fill_bf16_cuda(l->w_lin, (size_t)y->lin_w * H, s++, a, 0.0f, st);
            rand_fill_bf16_cuda(l->conv, (size_t)y->C * (size_t)c->linear_conv_kernel, s++, 0.5f, 0.0f, st);
            rand_fill_bf16_cuda(l->gnorm, (size_t)c->linear_v_head_dim, s++, 0.0f, 1.0f, st);
            rand_fill_bf16_cuda(l->w_out, H * (size_t)y->VD, s++, a, 0.0f, st);
            uint64_t r = s++;
            for (int h = 0; h < HV; h++) { /* transformers' init: A ~ U[0, 16) (here [1, 16)), dt_bias = 1 */
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                alog[h] = logf(1.0f + 15.0f * (float)((r >> 40) & 0xffffff) / 16777216.0f);
                dtb[h] = 1.0f;
            }
            CHECK_CUDA(cudaMemcpy(l->a_log, alog, sizeof(float) * (size_t)HV, cudaMemcpyHostToDevice));
            CHECK_CUDA(cudaMemcpy(l->dt_bias, dtb, sizeof(float) * (size_t)HV, cudaMemcpyHostToDevice));
        } else {
            rand_fill_bf16_cuda(l->w_attn, (size_t)y->attn_w * H, s++, a, 0.0f, st);
            rand_fill_bf16_cuda(l->w_o, H * qd, s++, a, 0.0f, st);
            rand_fill_bf16_cuda(l->q_norm, hd, s++, 0.0f, 1.0f, st);
            rand_fill_bf16_cuda(l->k_norm, hd, s++, 0.0f, 1.0f, st);
        }
        if (l->moe) {
            moe_cuda_layer_init_random(m, &y->ms, &l->mw, &s, a);
        } else {
            mlp_cuda_layer_init_random(m, &l->mlp, &s, a);
        }
    }
    free(alog);
    free(dtb);
    *seed = s;
}

/* ---- forward ---- */

/* ---- decoding: the family's part of a cache ----
 * Attention layers: keys then values, each (nseq, max_len, kd) bf16 (the dense family's layout). Linear layers: two
 * slots per sequence (slot 2*seq + parity) of the conv history (K-1, C) bf16 and of the delta-rule state
 * (HV, Dk, Dv) fp32. A step reads each sequence's states from its current slot and writes the new ones to the other,
 * which then becomes current: the slot left behind holds the states before the sequence's last step, and a crop
 * inside that step goes back to them and re-runs its kept tokens (their ids are kept), as the CPU does
 * (target_hybrid.c: there the states before are copies; here no copy is made). */
typedef struct thc_cache {
    target_cuda *m;
    int nseq, max_len;
    int *slot;                        /* (nlayers) index of layer li among the attention (or the linear) layers */
    uint16_t *kv;                     /* attention layer a: keys at kv + 2a*per, values at kv + (2a+1)*per */
    size_t seq_stride, per;           /* max_len*kd; nseq*seq_stride */
    float *workspace;                 /* kv_attention's */
    uint16_t *hist;                   /* linear layer l: (2 nseq, K-1, C) at hist + l*2*nseq*hist_n */
    float *delta;                     /* linear layer l: (2 nseq, HV, Dk, Dv) at delta + l*2*nseq*delta_n */
    size_t hist_n, delta_n;           /* elements of one slot */
    /* per sequence (host) */
    int *cur;                         /* the parity of the slots holding its states */
    int *zero;                        /* its states are a sequence start's: no slot is read */
    int *prev_zero;                   /* so were the states before its last step */
    int *start;                       /* the position where its last step started; -1: none since empty */
    int32_t *last_ids;                /* (nseq, max_len) that step's ids */
    /* the step's slots, read (nrun) | written (nrun), on the device and in a pinned stage */
    int32_t *d_io, *h_io;
    cudaEvent_t staged;
} thc_cache;

/* Gated DeltaNet over u (T, H); m->x = r + out_proj(...). ca: NULL (packed forward), or the decoding cache whose
 * linear layer sl the rows continue. */
static void thc_linear(target_cuda *m, const thc_layer *l, const tc_rows *rows, const thc_cache *ca, int sl,
                       const uint16_t *r, int ldr)
{
    const hf_config *c = &m->cfg;
    struct target_hybrid_cuda *y = m->layers;
    const int T = rows->T, H = c->hidden_size, HK = c->linear_num_k_heads, HV = c->linear_num_v_heads;
    const int Dk = c->linear_k_head_dim, Dv = c->linear_v_head_dim, C = y->C, VD = y->VD, W = y->lin_w;
    cudaStream_t st = m->stream;
    target_cuda_linear(m, y->proj, W, NULL, 0, 0.0f, m->u, H, l->w_lin, T, W, H);
    target_cuda_mark(m, TARGET_CUDA_MATMUL);
    const int32_t *d_in = ca ? ca->d_io : NULL, *d_out = ca ? ca->d_io + rows->nseq : NULL;
    if (ca)
        causal_conv1d_silu_state_cuda(y->conv, C, y->proj, W, l->conv, C, c->linear_conv_kernel, rows->cu, rows->nseq,
                                      T, ca->hist + (size_t)sl * 2 * ca->nseq * ca->hist_n, d_in, d_out, st);
    else
        causal_conv1d_silu_cuda(y->conv, C, y->proj, W, l->conv, C, c->linear_conv_kernel, rows->cu, rows->nseq, T,
                                st);
    gated_delta_prep_cuda(y->conv, C, T, HK, Dk, y->beta, y->g, HV, y->proj + C + VD, W, y->proj + C + VD + HV, W,
                          l->a_log, l->dt_bias, HV, st);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
    if (ca)
        gated_delta_chunk_forward_state_cuda(y->core, VD, y->conv, C, y->conv + HK * Dk, C, y->conv + 2 * HK * Dk, C,
                                             y->g, HV, y->beta, HV, rows->cu, rows->nseq, rows->max_seqlen, HK, HV,
                                             Dk, Dv, ca->delta + (size_t)sl * 2 * ca->nseq * ca->delta_n, d_in, d_out,
                                             st);
    else
        gated_delta_chunk_forward_cuda(y->core, VD, y->conv, C, y->conv + HK * Dk, C, y->conv + 2 * HK * Dk, C, y->g,
                                       HV, y->beta, HV, rows->cu, rows->nseq, HK, HV, Dk, Dv, st);
    target_cuda_mark(m, TARGET_CUDA_DELTA_RULE);
    gated_rmsnorm_cuda(y->core, VD, y->core, VD, y->proj + C, W, l->gnorm, T, HV, Dv, (float)c->rms_eps, st);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
    target_cuda_linear(m, m->x, H, r, ldr, 1.0f, y->core, VD, l->w_out, T, H, VD);
    target_cuda_mark(m, TARGET_CUDA_MATMUL);
}

/* Gated attention over u (T, H); m->x = r + o_proj(...). kv: NULL (packed forward) or the decoding cache, whose
 * attention layer sl the rows append to. */
static void thc_attn(target_cuda *m, const thc_layer *l, const tc_rows *rows, const tc_kv_cache *kv, int sl,
                     const uint16_t *r, int ldr)
{
    const hf_config *c = &m->cfg;
    struct target_hybrid_cuda *y = m->layers;
    const int T = rows->T, H = c->hidden_size, hd = c->head_dim, nh = c->num_heads, nkv = c->num_kv_heads;
    const int qd = nh * hd, kd = nkv * hd, W = y->attn_w;
    cudaStream_t st = m->stream;
    uint16_t *q = y->proj, *gate = y->proj + qd, *k = y->proj + 2 * qd, *v = y->proj + 2 * qd + kd;
    target_cuda_linear(m, y->proj, W, NULL, 0, 0.0f, m->u, H, l->w_attn, T, W, H);
    target_cuda_mark(m, TARGET_CUDA_MATMUL);
    qk_norm_rope_partial_cuda(q, W, k, W, T, nh, nkv, hd, c->rotary_dim, l->q_norm, l->k_norm, (float)c->rms_eps,
                              rows->pos, m->d_inv_freq, st);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
    const float scale = 1.0f / sqrtf((float)hd);
    const thc_cache *ca = kv ? kv->state : NULL;
    uint16_t *kc = ca ? ca->kv + (size_t)sl * 2 * ca->per : NULL, *vc = ca ? kc + ca->per : NULL;
    if (kv) kv_cache_append_cuda(kc, vc, ca->seq_stride, k, W, v, W, kv->seq, kv->pos, T, kd, st);
    if (!kv || kv->packed)
        attention_causal_forward_cuda(y->core, qd, q, W, k, W, v, W, rows->cu, rows->nseq, rows->max_seqlen, nh, nkv,
                                      hd, scale, st);
    else
        kv_attention_forward_cuda(y->core, qd, q, W, kc, vc, ca->seq_stride, kv->seq, kv->pos, T, kv->max_pos, nh,
                                  nkv, hd, scale, ca->workspace, st);
    target_cuda_mark(m, TARGET_CUDA_ATTENTION);
    sigmoid_gate_cuda(y->core, qd, y->core, qd, gate, W, T, qd, st);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
    target_cuda_linear(m, m->x, H, r, ldr, 1.0f, y->core, qd, l->w_o, T, H, qd);
    target_cuda_mark(m, TARGET_CUDA_MATMUL);
}

/* Layer li over rows: residual r (ldr) in, output to dst (ldd). */
static void thc_layer_forward(target_cuda *m, int li, const tc_rows *rows, const tc_kv_cache *kv, const uint16_t *r,
                              int ldr, uint16_t *dst, int ldd)
{
    const hf_config *c = &m->cfg;
    struct target_hybrid_cuda *y = m->layers;
    const int T = rows->T, H = c->hidden_size;
    const float eps = (float)c->rms_eps;
    cudaStream_t st = m->stream;
    const thc_layer *l = &y->layers[li];
    rmsnorm_forward_cuda(m->u, H, r, ldr, l->input_norm, T, H, eps, st);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
    const int sl = kv ? ((const thc_cache *)kv->state)->slot[li] : 0;
    if (l->linear) thc_linear(m, l, rows, kv ? kv->state : NULL, sl, r, ldr);
    else thc_attn(m, l, rows, kv, sl, r, ldr);
    if (!l->moe) {
        mlp_cuda_forward(m, &y->mlpw, &l->mlp, l->post_norm, T, dst, ldd); /* its norm's weight stored as 1 + w */
        return;
    }
    rmsnorm_forward_cuda(m->u, H, m->x, H, l->post_norm, T, H, eps, st);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
    moe_cuda_forward(m, y->moe, &l->mw, T, m->u, H, m->x, H, dst, ldd); /* dst = m->x + MoE(u) */
}

static int thc_cache_new(target_cuda *m, int nseq, int max_len, int max_step, void **state, size_t *bytes,
                         errbuf *err)
{
    const hf_config *c = &m->cfg;
    struct target_hybrid_cuda *y = m->layers;
    thc_cache *k = xcalloc(1, sizeof *k);
    k->m = m, k->nseq = nseq, k->max_len = max_len;
    k->slot = xcalloc((size_t)m->nlayers, sizeof *k->slot);
    int nlin = 0, nkvl = 0;
    for (int li = 0; li < m->nlayers; li++) k->slot[li] = y->layers[li].linear ? nlin++ : nkvl++;
    const size_t kd = (size_t)c->num_kv_heads * (size_t)c->head_dim;
    k->seq_stride = (size_t)max_len * kd, k->per = (size_t)nseq * k->seq_stride;
    k->hist_n = (size_t)(c->linear_conv_kernel - 1) * (size_t)y->C;
    k->delta_n = (size_t)c->linear_num_v_heads * (size_t)c->linear_k_head_dim * (size_t)c->linear_v_head_dim;
    const size_t kvb = (size_t)nkvl * 2 * k->per * 2, hb = (size_t)nlin * 2 * (size_t)nseq * k->hist_n * 2;
    const size_t db = (size_t)nlin * 2 * (size_t)nseq * k->delta_n * sizeof(float);
    const size_t ws = nkvl ? kv_attention_workspace_bytes(max_step, c->num_heads, c->head_dim, max_len - 1) : 0;
    struct { void **p; size_t n; } a[] = {{(void **)&k->kv, kvb}, {(void **)&k->hist, hb}, {(void **)&k->delta, db},
                                          {(void **)&k->workspace, ws}};
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) {
        cudaError_t e = cudaMalloc(a[i].p, a[i].n ? a[i].n : 1);
        if (e == cudaSuccess) continue;
        for (size_t j = 0; j < i; j++) CHECK_CUDA(cudaFree(*a[j].p));
        free(k->slot);
        free(k);
        return errbuf_set(err, ENOMEM, "hybrid decoding cache of %d sequences x %d positions: %.2f GiB of device "
                          "memory (keys and values %.2f, conv histories %.2f, delta-rule states %.2f, twice each for "
                          "a crop): %s", nseq, max_len, (double)(kvb + hb + db + ws) / (1 << 30),
                          (double)kvb / (1 << 30), (double)hb / (1 << 30), (double)db / (1 << 30),
                          cudaGetErrorString(e));
    }
    if (ws) CHECK_CUDA(cudaMemset(k->workspace, 0, ws)); /* kv_attention's counters start at zero */
    k->cur = xcalloc((size_t)nseq, sizeof *k->cur);
    k->zero = xmalloc((size_t)nseq * sizeof *k->zero);
    k->prev_zero = xmalloc((size_t)nseq * sizeof *k->prev_zero);
    k->start = xmalloc((size_t)nseq * sizeof *k->start);
    for (int s = 0; s < nseq; s++) k->zero[s] = k->prev_zero[s] = 1, k->start[s] = -1;
    k->last_ids = xmalloc((size_t)nseq * (size_t)max_len * sizeof *k->last_ids);
    CHECK_CUDA(cudaMalloc((void **)&k->d_io, sizeof(int32_t) * 2 * (size_t)nseq));
    CHECK_CUDA(cudaMallocHost((void **)&k->h_io, sizeof(int32_t) * 2 * (size_t)nseq));
    CHECK_CUDA(cudaEventCreateWithFlags(&k->staged, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventRecord(k->staged, m->stream));
    *bytes += kvb + hb + db + ws;
    *state = k;
    return 0;
}

static void thc_cache_destroy(void *state)
{
    thc_cache *k = state;
    CHECK_CUDA(cudaFree(k->kv));
    CHECK_CUDA(cudaFree(k->hist));
    CHECK_CUDA(cudaFree(k->delta));
    CHECK_CUDA(cudaFree(k->workspace));
    CHECK_CUDA(cudaFree(k->d_io));
    CHECK_CUDA(cudaFreeHost(k->h_io));
    CHECK_CUDA(cudaEventDestroy(k->staged));
    free(k->slot), free(k->cur), free(k->zero), free(k->prev_zero), free(k->start), free(k->last_ids);
    free(k);
}

/* The step's slots: a kept step reads the current ones and writes the others, which become current; a re-run
 * (keep = 0, after a crop) reads the ones from before the last step and rewrites the current ones. */
static void thc_cache_begin(void *state, int nrun, const int *seqs, const int *past, const int *n, const int32_t *ids,
                            int keep)
{
    thc_cache *k = state;
    CHECK_CUDA(cudaEventSynchronize(k->staged)); /* the previous step's upload from h_io has completed */
    int32_t *in = k->h_io, *out = k->h_io + nrun;
    for (int i = 0, t = 0; i < nrun; t += n[i], i++) {
        const int s = seqs[i];
        if (keep) {
            in[i] = k->zero[s] ? -1 : 2 * s + k->cur[s];
            out[i] = 2 * s + 1 - k->cur[s];
            k->prev_zero[s] = k->zero[s];
            k->cur[s] = 1 - k->cur[s];
            k->start[s] = past[i];
            memcpy(k->last_ids + (size_t)s * (size_t)k->max_len, ids + t, sizeof *ids * (size_t)n[i]);
        } else {
            in[i] = k->prev_zero[s] ? -1 : 2 * s + 1 - k->cur[s];
            out[i] = 2 * s + k->cur[s];
        }
        k->zero[s] = 0;
    }
    CHECK_CUDA(cudaMemcpyAsync(k->d_io, k->h_io, sizeof(int32_t) * 2 * (size_t)nrun, cudaMemcpyHostToDevice,
                               k->m->stream));
    CHECK_CUDA(cudaEventRecord(k->staged, k->m->stream));
}

static int thc_cache_crop(void *state, int seq, int len, int held, int *rerun_from, const int32_t **rerun_ids,
                          errbuf *err)
{
    thc_cache *k = state;
    *rerun_from = len;
    if (len == 0) { /* empty: the states of a sequence start */
        k->zero[seq] = 1;
        k->start[seq] = -1;
        return 0;
    }
    if (len == held) return 0;
    const int start = k->start[seq];
    if (start < 0 || len < start)
        return errbuf_set(err, EINVAL, "crop: sequence %d of a hybrid target (%s): cannot go back to %d positions, "
                          "before the start (%d) of its last step: the linear-attention states are kept for that "
                          "step only", seq, k->m->cfg.model_type, len, start < 0 ? held : start);
    if (len == start) { /* the states before the last step: its slots become current again */
        k->cur[seq] = 1 - k->cur[seq];
        k->zero[seq] = k->prev_zero[seq];
        return 0;
    }
    *rerun_from = start;
    *rerun_ids = k->last_ids + (size_t)seq * (size_t)k->max_len;
    return len - start;
}

const target_cuda_ops target_hybrid_cuda = {
    .create = thc_create, .destroy = thc_destroy, .load = thc_load, .init_random = thc_init_random,
    .layer = thc_layer_forward, .cache_new = thc_cache_new, .cache_destroy = thc_cache_destroy,
    .cache_begin = thc_cache_begin, .cache_crop = thc_cache_crop,
    .step_graph = 0, /* cache_begin stages each step's state bookkeeping from the host */
};
