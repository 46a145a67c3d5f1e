/* drafter_cuda: the DFlash drafter's forward and backward on one CUDA device, the same computation as
 * drafter_forward_backward (drafter_model.c) in bf16 with fp32 accumulation.
 *
 * Forward, per layer (NB = N*B block rows, T context rows):
 *   u = in_norm(x_in); qkv = u · [Wq;Wk;Wv]ᵀ (one GEMM: the three tensors are adjacent in the layout);
 *   kvc = F · [Wk;Wv]ᵀ; q|kb and kc are copied out of the raw GEMM outputs and normed + rotated in place (the raw
 *   values stay for the backward); attention reads vb and vc straight from the raw outputs; x_mid = x_in + attn·Woᵀ
 *   (the residual add is the GEMM's epilogue, beta = 1); y = post_norm(x_mid); gu = y · [Wgate;Wup]ᵀ;
 *   act = swiglu(gu); x_out = x_mid + act·Wdownᵀ. Every layer's activations are kept for the backward.
 * Backward in reverse; the weight gradients are GEMMs into the reducer's fp32 buffer in a fixed order, each matrix's
 * first with beta = 0 (it overwrites: the ops' contract writes every element, so nobody zeroes 4 GB a step) and
 * [Wk;Wv]'s second, the context's, with beta = 1; the norm-weight gradients (zeroed first: a few KB) go through
 * per-chunk partials summed in a fixed order: deterministic.
 * dF (context) is accumulated over the layers in bf16 through the GEMM epilogue. */
#include "drafter_cuda.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "anchors.h"
#include "block_accept.h"
#include "cross_entropy.h"
#include "cuda_check.h"
#include "dflash_attention.h"
#include "drafter_layout.h"
#include "embedding.h"
#include "hf_config.h"
#include "log.h"
#include "matmul.h"
#include "qk_norm_rope.h"
#include "rand_fill.h"
#include "rmsnorm.h"
#include "rope.h"
#include "safetensors.h"
#include "swiglu.h"
#include "target_family.h"
#include "target_model_cuda.h"

#define DC_MAX_EVENTS 1024
#define DC_MET_WORDS (2 + DFLASH_MAX_BLOCK) /* [0] Σ w·CE (double); [1..B] correct per slot; [B+1] run sum */
/* the attention backward's dS workspace at most (dflash_attention_backward_workspace: the Qwen3-8B drafter's 512
 * blocks over 3072 context rows take 1.6 GB; a batch of packed sequences needs it for its longest context only, which
 * each step's shape says, .max_ctx) */
#define DC_ATTN_WS_MAX ((size_t)4 << 30)

/* Saved activations of one layer, bf16 unless noted. */
typedef struct dc_acts {
    uint16_t *x_in;  /* (NB, H) residual in */
    uint16_t *u;     /* (NB, H) in-normed */
    uint16_t *qkv;   /* (NB, qd + 2kd) raw q | k | v of the block rows */
    uint16_t *qk;    /* (NB, qd + kd) q | k after norm + rope */
    uint16_t *kvc;   /* (T, 2kd) raw k | v of the context rows */
    uint16_t *kc;    /* (T, kd) context k after norm + rope */
    uint16_t *attn;  /* (NB, qd) */
    float *lse;      /* (NB, nh) */
    uint16_t *x_mid; /* (NB, H) after the attention residual */
    uint16_t *y;     /* (NB, H) post-normed */
    uint16_t *gu;    /* (NB, 2I) gate | up; the backward overwrites it with dgate | dup */
    uint16_t *act;   /* (NB, I) */
} dc_acts;

typedef struct drafter_cuda {
    drafter_backend base;
    drafter_train_config tc;
    hf_config cfg;
    drafter_layout L;
    int H, hd, nh, nkv, qd, kd, qkvw, I, K, nl, B, V;
    int max_tokens, max_seqs, max_blocks;
    int staged_max_ctx; /* the staged batch's longest block context (dc_stage): the attention's dflash_attn_shape.max_ctx */
    cudaStream_t stream;
    matmul_cuda *mm;
    cross_entropy_cuda_ctx *ce;
    uint16_t *embed, *lm_head; /* (V, H); lm_head == embed when tied */
    double *d_inv_freq;        /* (hd/2) */
    size_t device_bytes;
    /* forward */
    uint16_t *fc_out, *F;      /* (T, H) */
    dc_acts *acts;             /* (nl) */
    uint16_t *x_final, *h;     /* (NB, H) */
    float *ce_row;             /* (NB) */
    int32_t *argmax;           /* (NB) */
    /* backward */
    uint16_t *dh, *dres, *dy, *du; /* (NB, H) */
    uint16_t *dact;                /* (NB, I) */
    uint16_t *dattn;               /* (NB, qd) */
    uint16_t *dqkv;                /* (NB, qd + 2kd) */
    uint16_t *dkvc;                /* (T, 2kd) */
    uint16_t *dF, *dfc;            /* (T, H) */
    float *delta;                  /* (NB, nh) */
    void *attn_ws;                 /* the attention backward's dS tiles (attn_ws_bytes; 0 where it takes none) */
    size_t attn_ws_bytes;
    float *norm_ws, *qk_ws;
    /* the batch on the device: positions (T) | block_ids | block_pos | labels (NB) | ctx_start | ctx_len (N) |
     * weights (NB, float), packed per batch; staged through pinned memory */
    int32_t *d_batch;
    int32_t *h_stage;
    size_t stage_words;
    cudaEvent_t staged;        /* the last upload from h_stage has completed */
    /* metrics */
    uint64_t *d_met, *h_met;   /* DC_MET_WORDS each; h_met pinned */
    cudaEvent_t met_ready;
    drafter_metrics pending;   /* the host-known part of the last enqueued step */
    int pending_device;        /* its device part is in flight */
    uint64_t pending_id;       /* its batch id */
    uint64_t fault_nan_batch;  /* DFLASH_FAULT_NAN_BATCH (drafter.h): this batch's loss reads NaN; UINT64_MAX: none */
    /* profiling */
    int profiling, nev;
    cudaEvent_t ev[DC_MAX_EVENTS];
    int ev_class[DC_MAX_EVENTS];
    double prof_ms[DRAFTER_CUDA_NCLASS];
} drafter_cuda;

static void *dc_alloc(drafter_cuda *d, size_t bytes)
{
    void *p = NULL;
    CHECK_CUDA(cudaMalloc(&p, bytes ? bytes : 16));
    d->device_bytes += bytes;
    return p;
}

static void dc_free(void *pp)
{
    void **p = pp;
    if (*p) CHECK_CUDA(cudaFree(*p));
    *p = NULL;
}

/* Profiling: an event after each kernel group; the span since the previous event is charged to the group. */
static void dc_mark(drafter_cuda *d, int cls)
{
    if (!d->profiling || d->nev >= DC_MAX_EVENTS) return;
    d->ev_class[d->nev] = cls;
    CHECK_CUDA(cudaEventRecord(d->ev[d->nev++], d->stream));
}

static int dc_check_config(const hf_config *c, errbuf *err)
{
    if (!c->is_dflash) return errbuf_set(err, EINVAL, "drafter_cuda: not a DFlash drafter config");
    if (c->block_size < 2 || c->block_size > DFLASH_MAX_BLOCK)
        return errbuf_set(err, EINVAL, "drafter_cuda: block_size %d outside [2, %d]", c->block_size, DFLASH_MAX_BLOCK);
    if (c->num_kv_heads <= 0 || c->num_heads % c->num_kv_heads)
        return errbuf_set(err, EINVAL, "drafter_cuda: %d heads are not a multiple of %d kv heads", c->num_heads,
                          c->num_kv_heads);
    if (c->head_dim % 2) return errbuf_set(err, EINVAL, "drafter_cuda: head_dim %d is odd", c->head_dim);
    if (c->hidden_size % 8)
        return errbuf_set(err, EINVAL, "drafter_cuda: hidden_size %d is not a multiple of 8 (loss head)",
                          c->hidden_size);
    if (c->num_taps < 1) return errbuf_set(err, EINVAL, "drafter_cuda: no target taps");
    if (c->mask_token_id < 0 || c->mask_token_id >= c->vocab_size)
        return errbuf_set(err, EINVAL, "drafter_cuda: mask_token_id %d outside the vocabulary (%d)", c->mask_token_id,
                          c->vocab_size);
    return 0;
}

static void dc_destroy(drafter_backend *b);
static int dc_forward_backward(drafter_backend *b, const void *weights, float *grads, const drafter_batch *bt,
                               drafter_metrics *mt, errbuf *err);
static const drafter_backend_ops dc_ops = {.forward_backward = dc_forward_backward, .destroy = dc_destroy};

/* Everything but the frozen tables' values. */
static int dc_create(drafter_cuda **out, const drafter_train_config *tc, int device, int max_tokens, int max_seqs,
                     errbuf *err)
{
    int rc = dc_check_config(tc->drafter, err);
    if (rc) return rc;
    if (device >= 0) {
        int n = 0;
        CHECK_CUDA(cudaGetDeviceCount(&n));
        if (device >= n) return errbuf_set(err, ENODEV, "drafter_cuda: GPU %d requested, %d present", device, n);
        CHECK_CUDA(cudaSetDevice(device));
    }
    if (max_tokens <= 0 || max_seqs <= 0 || tc->max_anchors <= 0)
        return errbuf_set(err, EINVAL, "drafter_cuda: max_tokens %d, max_seqs %d and max_anchors %d must be positive",
                          max_tokens, max_seqs, tc->max_anchors);
    drafter_cuda *d = xcalloc(1, sizeof *d);
    d->base.ops = &dc_ops;
    d->tc = *tc;
    d->cfg = *tc->drafter;
    d->tc.drafter = &d->cfg;
    const hf_config *c = &d->cfg;
    drafter_layout_init(&d->L, c);
    d->H = c->hidden_size, d->hd = c->head_dim, d->nh = c->num_heads, d->nkv = c->num_kv_heads;
    d->qd = d->nh * d->hd, d->kd = d->nkv * d->hd, d->qkvw = d->qd + 2 * d->kd, d->I = c->intermediate_size;
    d->K = c->num_taps, d->nl = c->num_layers, d->B = c->block_size, d->V = c->vocab_size;
    d->max_tokens = max_tokens, d->max_seqs = max_seqs;
    /* anchors_sample takes at most min(len, max_anchors) per sequence */
    long long nmax = (long long)max_seqs * tc->max_anchors;
    d->max_blocks = (int)(nmax < max_tokens ? nmax : max_tokens);
    CHECK_CUDA(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
    d->mm = matmul_cuda_create(0);
    d->device_bytes += (size_t)64 << 20;

    const size_t H = (size_t)d->H, V = (size_t)d->V, T = (size_t)max_tokens, NB = (size_t)d->max_blocks * d->B;
    const size_t qd = (size_t)d->qd, kd = (size_t)d->kd, qkvw = (size_t)d->qkvw, I = (size_t)d->I;
    d->ce = cross_entropy_cuda_create((int)NB, d->H, d->V, 0);
    d->device_bytes += cross_entropy_cuda_workspace_bytes(d->ce);
    d->embed = dc_alloc(d, V * H * 2);
    d->lm_head = c->tie_embeddings ? d->embed : dc_alloc(d, V * H * 2);

    double *inv = xmalloc(sizeof(double) * (size_t)(d->hd / 2));
    rope_params rp = {.theta = c->rope_theta, .llama3 = c->rope_llama3, .factor = c->rope_factor,
                      .low_freq_factor = c->rope_low_freq_factor, .high_freq_factor = c->rope_high_freq_factor,
                      .original_max_position = c->rope_original_max_position};
    rope_inv_freq(inv, d->hd, &rp); /* as drafter_model.c: not rounded */
    d->d_inv_freq = dc_alloc(d, sizeof(double) * (size_t)(d->hd / 2));
    CHECK_CUDA(cudaMemcpy(d->d_inv_freq, inv, sizeof(double) * (size_t)(d->hd / 2), cudaMemcpyHostToDevice));
    free(inv);

    d->fc_out = dc_alloc(d, T * H * 2);
    d->F = dc_alloc(d, T * H * 2);
    d->acts = xcalloc((size_t)(d->nl > 0 ? d->nl : 1), sizeof *d->acts);
    for (int l = 0; l < d->nl; l++) {
        dc_acts *a = &d->acts[l];
        a->x_in = dc_alloc(d, NB * H * 2);
        a->u = dc_alloc(d, NB * H * 2);
        a->qkv = dc_alloc(d, NB * qkvw * 2);
        a->qk = dc_alloc(d, NB * (qd + kd) * 2);
        a->kvc = dc_alloc(d, T * 2 * kd * 2);
        a->kc = dc_alloc(d, T * kd * 2);
        a->attn = dc_alloc(d, NB * qd * 2);
        a->lse = dc_alloc(d, NB * (size_t)d->nh * sizeof(float));
        a->x_mid = dc_alloc(d, NB * H * 2);
        a->y = dc_alloc(d, NB * H * 2);
        a->gu = dc_alloc(d, NB * 2 * I * 2);
        a->act = dc_alloc(d, NB * I * 2);
    }
    d->x_final = dc_alloc(d, NB * H * 2);
    d->h = dc_alloc(d, NB * H * 2);
    d->ce_row = dc_alloc(d, NB * sizeof(float));
    d->argmax = dc_alloc(d, NB * sizeof(int32_t));
    d->dh = dc_alloc(d, NB * H * 2);
    d->dres = dc_alloc(d, NB * H * 2);
    d->dy = dc_alloc(d, NB * H * 2);
    d->du = dc_alloc(d, NB * H * 2);
    d->dact = dc_alloc(d, NB * I * 2);
    d->dattn = dc_alloc(d, NB * qd * 2);
    d->dqkv = dc_alloc(d, NB * qkvw * 2);
    d->dkvc = dc_alloc(d, T * 2 * kd * 2);
    d->dF = dc_alloc(d, T * H * 2);
    d->dfc = dc_alloc(d, T * H * 2);
    d->delta = dc_alloc(d, NB * (size_t)d->nh * sizeof(float));
    {
        const dflash_attn_shape ws = {.nblocks = d->max_blocks, .block_size = d->B, .nh = d->nh, .nkv = d->nkv,
                                      .hd = d->hd, .scale = 1.0f, .window = 0}; /* no window: the most tiles */
        /* at most DC_ATTN_WS_MAX: a batch whose blocks need more (its longest context, max_ctx) takes the slower
         * recompute path */
        const size_t need = dflash_attention_backward_workspace(&ws, (int)T);
        d->attn_ws_bytes = need < DC_ATTN_WS_MAX ? need : DC_ATTN_WS_MAX;
        if (need > DC_ATTN_WS_MAX)
            log_warn("drafter: the attention backward's dS workspace for %d blocks over %zu context rows would take "
                     "%.2f GiB; capped at %.0f GiB, so batches needing more recompute dS in dq (slower)",
                     d->max_blocks, (size_t)T, need / 1073741824.0, DC_ATTN_WS_MAX / 1073741824.0);
        d->attn_ws = d->attn_ws_bytes ? dc_alloc(d, d->attn_ws_bytes) : NULL;
    }
    size_t nws = rmsnorm_backward_cuda_workspace((int)NB, d->H), nws2 = rmsnorm_backward_cuda_workspace((int)T, d->H);
    d->norm_ws = dc_alloc(d, nws > nws2 ? nws : nws2);
    size_t qws = qk_norm_rope_backward_cuda_workspace((int)NB, d->nh, d->nkv, d->hd),
           qws2 = qk_norm_rope_backward_cuda_workspace((int)T, 0, d->nkv, d->hd);
    d->qk_ws = dc_alloc(d, qws > qws2 ? qws : qws2);

    d->stage_words = T + 5 * NB + 2 * (size_t)d->max_blocks;
    d->d_batch = dc_alloc(d, d->stage_words * 4);
    CHECK_CUDA(cudaMallocHost((void **)&d->h_stage, d->stage_words * 4));
    d->d_met = dc_alloc(d, DC_MET_WORDS * 8);
    CHECK_CUDA(cudaMallocHost((void **)&d->h_met, DC_MET_WORDS * 8));
    CHECK_CUDA(cudaEventCreateWithFlags(&d->staged, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventCreateWithFlags(&d->met_ready, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventRecord(d->staged, d->stream));
    CHECK_CUDA(cudaEventRecord(d->met_ready, d->stream));
    const char *fault = getenv("DFLASH_FAULT_NAN_BATCH");
    d->fault_nan_batch = fault && *fault ? strtoull(fault, NULL, 10) : UINT64_MAX;
    *out = d;
    return 0;
}

int drafter_cuda_create(drafter_backend **out, const drafter_train_config *tc, const char *target_dir, int device,
                        int max_tokens, int max_seqs, errbuf *err)
{
    hf_config tcfg;
    st_file *st = NULL;
    drafter_cuda *d = NULL;
    int rc = hf_config_load(&tcfg, target_dir, err);
    if (rc) return errbuf_wrap(err, rc, "frozen embedding and lm_head");
    const hf_config *c = tc->drafter;
    if (tcfg.hidden_size != c->hidden_size || tcfg.vocab_size != c->vocab_size)
        return errbuf_set(err, EINVAL, "%s: target hidden_size %d / vocab_size %d disagree with the drafter's %d / %d",
                          target_dir, tcfg.hidden_size, tcfg.vocab_size, c->hidden_size, c->vocab_size);
    if ((rc = st_open(&st, target_dir, err))) return rc;
    hf_config dcfg = *c;
    dcfg.tie_embeddings = tcfg.tie_embeddings; /* the tables are the target's */
    drafter_train_config tc2 = *tc;
    tc2.drafter = &dcfg;
    if ((rc = dc_create(&d, &tc2, device, max_tokens, max_seqs, err))) goto fail;
    /* the tables under the names the target's family gives them (the vision-language checkpoints keep the
     * embedding under model.language_model.): the same names target_model_load reads on the CPU */
    target_tables tb;
    rc = target_tables_find(&tcfg, st, &tb, err);
    if (!rc) rc = target_cuda_upload_tensor(st, tb.embed, d->embed, d->V, d->H, err);
    if (!rc && d->lm_head != d->embed) rc = target_cuda_upload_tensor(st, tb.lm_head, d->lm_head, d->V, d->H, err);
    if (rc) goto fail;
    st_close(&st);
    *out = &d->base;
    return 0;
fail:
    st_close(&st);
    if (d) dc_destroy(&d->base);
    return rc;
}

int drafter_cuda_create_random(drafter_backend **out, const drafter_train_config *tc, uint64_t seed, int device,
                               int max_tokens, int max_seqs, errbuf *err)
{
    drafter_cuda *d = NULL;
    int rc = dc_create(&d, tc, device, max_tokens, max_seqs, err);
    if (rc) return rc;
    const float a = 0.02f * sqrtf(3.0f); /* uniform [-a, a) has standard deviation 0.02 */
    size_t n = (size_t)d->V * d->H;
    rand_fill_bf16_cuda(d->embed, n, seed, a, 0.0f, d->stream);
    if (d->lm_head != d->embed) rand_fill_bf16_cuda(d->lm_head, n, seed + 1, a, 0.0f, d->stream);
    CHECK_CUDA(cudaStreamSynchronize(d->stream));
    *out = &d->base;
    return 0;
}

static void dc_destroy(drafter_backend *b)
{
    drafter_cuda *d = (drafter_cuda *)b;
    if (!d) return;
    CHECK_CUDA(cudaStreamSynchronize(d->stream));
    for (int l = 0; l < d->nl && d->acts; l++) {
        dc_acts *a = &d->acts[l];
        void *p[] = {&a->x_in, &a->u, &a->qkv, &a->qk, &a->kvc, &a->kc, &a->attn, &a->lse, &a->x_mid, &a->y, &a->gu,
                     &a->act};
        for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) dc_free(p[i]);
    }
    free(d->acts);
    if (d->lm_head != d->embed) dc_free(&d->lm_head);
    void *p[] = {&d->embed, &d->d_inv_freq, &d->fc_out, &d->F, &d->x_final, &d->h, &d->ce_row, &d->argmax, &d->dh,
                 &d->dres, &d->dy, &d->du, &d->dact, &d->dattn, &d->dqkv, &d->dkvc, &d->dF, &d->dfc, &d->delta,
                 &d->attn_ws, &d->norm_ws, &d->qk_ws, &d->d_batch, &d->d_met};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) dc_free(p[i]);
    if (d->h_stage) CHECK_CUDA(cudaFreeHost(d->h_stage));
    if (d->h_met) CHECK_CUDA(cudaFreeHost(d->h_met));
    if (d->staged) CHECK_CUDA(cudaEventDestroy(d->staged));
    if (d->met_ready) CHECK_CUDA(cudaEventDestroy(d->met_ready));
    for (int i = 0; i < DC_MAX_EVENTS; i++)
        if (d->ev[i]) CHECK_CUDA(cudaEventDestroy(d->ev[i]));
    cross_entropy_cuda_destroy(&d->ce);
    matmul_cuda_destroy(&d->mm);
    CHECK_CUDA(cudaStreamDestroy(d->stream));
    drafter_layout_destroy(&d->L);
    free(d);
}

static int dc_check_batch(const drafter_cuda *d, const drafter_batch *bt, errbuf *err)
{
    if (bt->ntok < 0 || bt->nseq < 0 || bt->ntok > d->max_tokens || bt->nseq > d->max_seqs)
        return errbuf_set(err, EINVAL, "batch %llu: %d tokens in %d sequences exceeds the workspace (%d tokens, %d "
                          "sequences)", (unsigned long long)bt->id, bt->ntok, bt->nseq, d->max_tokens, d->max_seqs);
    if (bt->cu_seqlens[0] != 0 || bt->cu_seqlens[bt->nseq] != bt->ntok)
        return errbuf_set(err, EINVAL, "batch %llu: cu_seqlens runs from %d to %d, expected 0 to %d",
                          (unsigned long long)bt->id, bt->cu_seqlens[0], bt->cu_seqlens[bt->nseq], bt->ntok);
    for (int s = 0; s < bt->nseq; s++)
        if (bt->cu_seqlens[s + 1] < bt->cu_seqlens[s])
            return errbuf_set(err, EINVAL, "batch %llu: cu_seqlens decreases at sequence %d",
                              (unsigned long long)bt->id, s);
    for (int t = 0; t < bt->ntok; t++)
        if (bt->input_ids[t] < 0 || bt->input_ids[t] >= d->V)
            return errbuf_set(err, EINVAL, "batch %llu: token id %d at position %d outside the vocabulary (%d)",
                              (unsigned long long)bt->id, bt->input_ids[t], t, d->V);
    return 0;
}

/* Attention inputs of layer a: q and kb from the normed copy, vb and vc from the raw GEMM outputs. */
static dflash_attn_cuda_in dc_attn_in(const drafter_cuda *d, const dc_acts *a, const int32_t *ctx_start,
                                      const int32_t *ctx_len, int T)
{
    dflash_attn_cuda_in in = {.q = a->qk, .ldq = d->qd + d->kd, .kc = a->kc, .ldkc = d->kd,
                              .vc = a->kvc + d->kd, .ldvc = 2 * d->kd, .kb = a->qk + d->qd, .ldkb = d->qd + d->kd,
                              .vb = a->qkv + d->qd + d->kd, .ldvb = d->qkvw, .ctx_start = ctx_start,
                              .ctx_len = ctx_len, .T = T};
    return in;
}

/* The batch's host arrays into the pinned stage (after the previous upload from it completed), in the order of
 * d->d_batch: positions (T) | block_ids | block_pos | labels (NB) | ctx_start | ctx_len (N) | weights (NB) | the
 * rows of non-zero weight (*nloss of them: the loss head computes only those). Returns the words written. */
static size_t dc_stage(drafter_cuda *d, const int32_t *positions, int T, const drafter_blocks *blk, int *nloss)
{
    const int N = blk->nblocks, NB = N * d->B;
    int32_t *hs = d->h_stage;
    size_t o = 0;
    memcpy(hs + o, positions, 4 * (size_t)T), o += (size_t)T;
    memcpy(hs + o, blk->block_ids, 4 * (size_t)NB), o += (size_t)NB;
    memcpy(hs + o, blk->block_pos, 4 * (size_t)NB), o += (size_t)NB;
    memcpy(hs + o, blk->labels, 4 * (size_t)NB), o += (size_t)NB;
    memcpy(hs + o, blk->ctx_start, 4 * (size_t)N), o += (size_t)N;
    memcpy(hs + o, blk->ctx_len, 4 * (size_t)N), o += (size_t)N;
    d->staged_max_ctx = 0;
    for (int j = 0; j < N; j++)
        if (blk->ctx_len[j] > d->staged_max_ctx) d->staged_max_ctx = blk->ctx_len[j];
    memcpy(hs + o, blk->weights, 4 * (size_t)NB), o += (size_t)NB;
    int nl = 0;
    for (int j = 0; j < NB; j++)
        if (blk->weights[j] != 0.0f) hs[o + nl++] = j;
    o += (size_t)nl;
    if (nloss) *nloss = nl;
    DF_ASSERT(o <= d->stage_words);
    return o;
}

/* The forward of N blocks (N*B rows) on T context rows aux (device bf16, (T, K*H)), the batch's arrays on the
 * device: every layer's activations kept in d->acts, the final hidden after the final norm in d->h. */
static void dc_forward(drafter_cuda *d, const uint16_t *w, const uint16_t *aux, int T, int N, const int32_t *d_pos,
                       const int32_t *d_bids, const int32_t *d_bpos, const int32_t *d_cstart, const int32_t *d_clen)
{
    const hf_config *c = &d->cfg;
    const int H = d->H, hd = d->hd, nh = d->nh, nkv = d->nkv, qd = d->qd, kd = d->kd, qkvw = d->qkvw, I = d->I;
    const int K = d->K, B = d->B, NB = N * B;
    const float eps = (float)c->rms_eps;
    cudaStream_t st = d->stream;
    matmul_cuda *mm = d->mm;
    const drafter_param *P = d->L.params;
    const uint16_t *w_fc = w + P[DRAFTER_PARAM_FC].offset;
    const uint16_t *w_hn = w + P[DRAFTER_PARAM_HIDDEN_NORM].offset, *w_fn = w + P[DRAFTER_PARAM_NORM].offset;
    const dflash_attn_shape as = {.nblocks = N, .block_size = B, .nh = nh, .nkv = nkv, .hd = hd,
                                  .scale = 1.0f / sqrtf((float)hd), .max_ctx = d->staged_max_ctx};
    /* context: F = hidden_norm(aux · fcᵀ), shared by every layer */
    matmul_forward_cuda(mm, d->fc_out, H, NULL, 0, 0.0f, aux, K * H, w_fc, T, H, K * H, st);
    dc_mark(d, DRAFTER_CUDA_GEMM);
    rmsnorm_forward_cuda(d->F, H, d->fc_out, H, w_hn, T, H, eps, st);
    embedding_forward_cuda(d->nl > 0 ? d->acts[0].x_in : d->x_final, d_bids, NB, d->embed, H, st);
    dc_mark(d, DRAFTER_CUDA_OTHER);
    for (int l = 0; l < d->nl; l++) {
        const drafter_param *p = drafter_layout_layer(&d->L, l, 0);
#define W(j) (w + p[j].offset)
        dc_acts *a = &d->acts[l];
        uint16_t *x_out = l + 1 < d->nl ? d->acts[l + 1].x_in : d->x_final;
        rmsnorm_forward_cuda(a->u, H, a->x_in, H, W(LP_IN_NORM), NB, H, eps, st);
        dc_mark(d, DRAFTER_CUDA_OTHER);
        /* the same W_k, W_v for block rows (from u) and context rows (from F); q|k|v are adjacent in the layout */
        matmul_forward_cuda(mm, a->qkv, qkvw, NULL, 0, 0.0f, a->u, H, W(LP_WQ), NB, qkvw, H, st);
        matmul_forward_cuda(mm, a->kvc, 2 * kd, NULL, 0, 0.0f, d->F, H, W(LP_WK), T, 2 * kd, H, st);
        dc_mark(d, DRAFTER_CUDA_GEMM);
        CHECK_CUDA(cudaMemcpy2DAsync(a->qk, (size_t)(qd + kd) * 2, a->qkv, (size_t)qkvw * 2, (size_t)(qd + kd) * 2,
                                     (size_t)NB, cudaMemcpyDeviceToDevice, st));
        CHECK_CUDA(cudaMemcpy2DAsync(a->kc, (size_t)kd * 2, a->kvc, (size_t)kd * 4, (size_t)kd * 2, (size_t)T,
                                     cudaMemcpyDeviceToDevice, st));
        qk_norm_rope_cuda(a->qk, qd + kd, a->qk + qd, qd + kd, NB, nh, nkv, hd, W(LP_Q_NORM), W(LP_K_NORM), eps,
                          d_bpos, d->d_inv_freq, st);
        qk_norm_rope_cuda(NULL, 0, a->kc, kd, T, 0, nkv, hd, NULL, W(LP_K_NORM), eps, d_pos, d->d_inv_freq, st);
        dc_mark(d, DRAFTER_CUDA_OTHER);
        dflash_attn_cuda_in in = dc_attn_in(d, a, d_cstart, d_clen, T);
        dflash_attn_shape las = as;
        las.window = hf_layer_window(c, l);
        dflash_attention_forward_cuda(a->attn, qd, a->lse, &in, &las, st);
        dc_mark(d, DRAFTER_CUDA_ATTN_FWD);
        matmul_forward_cuda(mm, a->x_mid, H, a->x_in, H, 1.0f, a->attn, qd, W(LP_WO), NB, H, qd, st);
        dc_mark(d, DRAFTER_CUDA_GEMM);
        rmsnorm_forward_cuda(a->y, H, a->x_mid, H, W(LP_POST_NORM), NB, H, eps, st);
        dc_mark(d, DRAFTER_CUDA_OTHER);
        matmul_forward_cuda(mm, a->gu, 2 * I, NULL, 0, 0.0f, a->y, H, W(LP_GATE), NB, 2 * I, H, st);
        dc_mark(d, DRAFTER_CUDA_GEMM);
        swiglu_forward_cuda(a->act, I, a->gu, 2 * I, NB, I, st);
        dc_mark(d, DRAFTER_CUDA_OTHER);
        matmul_forward_cuda(mm, x_out, H, a->x_mid, H, 1.0f, a->act, I, W(LP_DOWN), NB, H, I, st);
        dc_mark(d, DRAFTER_CUDA_GEMM);
#undef W
    }
    rmsnorm_forward_cuda(d->h, H, d->x_final, H, w_fn, NB, H, eps, st);
    dc_mark(d, DRAFTER_CUDA_OTHER);
}

int drafter_cuda_enqueue(drafter_backend *b, const uint16_t *w, float *g, const drafter_batch *bt, errbuf *err)
{
    drafter_cuda *d = (drafter_cuda *)b;
    int rc = dc_check_batch(d, bt, err);
    if (rc) return rc;
    const hf_config *c = &d->cfg;
    const int H = d->H, hd = d->hd, nh = d->nh, nkv = d->nkv, qd = d->qd, kd = d->kd, qkvw = d->qkvw, I = d->I;
    const int K = d->K, B = d->B, T = bt->ntok;
    const float eps = (float)c->rms_eps;
    cudaStream_t st = d->stream;
    matmul_cuda *mm = d->mm;

    /* anchors and blocks on the host, exactly as drafter_cpu.c */
    int32_t *anchors = NULL, *anchor_seq = NULL;
    const int N = anchors_sample(bt->cu_seqlens, bt->nseq, bt->loss_mask, d->tc.max_anchors, d->tc.seed, 0, bt->id,
                                 &anchors, &anchor_seq);
    DF_ASSERT(N <= d->max_blocks);
    drafter_blocks blk;
    drafter_blocks_build(&blk, bt->input_ids, bt->cu_seqlens, bt->loss_mask, anchors, anchor_seq, N, B,
                         c->mask_token_id, d->tc.gamma);
    const int NB = N * B;
    /* the metrics the host knows: which slots are trained and their weights (summed in the CPU backend's order) */
    drafter_metrics *pm = &d->pending;
    memset(pm, 0, sizeof *pm);
    for (int j = 0; j < N; j++)
        for (int k = 1; k < B; k++)
            if (blk.weights[j * B + k] != 0.0f) {
                pm->weight_sum += blk.weights[j * B + k];
                pm->slot_total[k]++;
            }
    pm->nblocks = N;
    d->pending_id = bt->id;

    /* upload through the pinned stage, once the previous upload from it has completed */
    CHECK_CUDA(cudaEventSynchronize(d->staged));
    int32_t *hs = d->h_stage;
    int nloss = 0;
    size_t o = dc_stage(d, bt->positions, T, &blk, &nloss);
    drafter_blocks_free(&blk);
    free(anchors);
    free(anchor_seq);
    const int32_t *d_pos = d->d_batch, *d_bids = d_pos + T, *d_bpos = d_bids + NB, *d_labels = d_bpos + NB;
    const int32_t *d_cstart = d_labels + NB, *d_clen = d_cstart + N;
    const float *d_weights = (const float *)(d_clen + N);
    const int32_t *d_loss_rows = (const int32_t *)(d_weights + NB);

    d->nev = 0;
    for (int i = 0; i < DRAFTER_CUDA_NCLASS; i++) d->prof_ms[i] = 0;
    dc_mark(d, DRAFTER_CUDA_OTHER);
    CHECK_CUDA(cudaMemcpyAsync(d->d_batch, hs, 4 * o, cudaMemcpyHostToDevice, st));
    CHECK_CUDA(cudaEventRecord(d->staged, st));
    d->pending_device = N > 0;
    if (N == 0) { /* nothing to train: zero gradients, no device metrics */
        CHECK_CUDA(cudaMemsetAsync(g, 0, d->L.numel * sizeof(float), st));
        CHECK_CUDA(cudaEventRecord(d->met_ready, st));
        return 0;
    }

    const drafter_param *P = d->L.params;
    const uint16_t *aux = bt->aux, *w_fc = w + P[DRAFTER_PARAM_FC].offset;
    const uint16_t *w_hn = w + P[DRAFTER_PARAM_HIDDEN_NORM].offset, *w_fn = w + P[DRAFTER_PARAM_NORM].offset;
    const dflash_attn_shape as = {.nblocks = N, .block_size = B, .nh = nh, .nkv = nkv, .hd = hd,
                                  .scale = 1.0f / sqrtf((float)hd), .max_ctx = d->staged_max_ctx};

    /* ---- forward ---- */
    dc_forward(d, w, aux, T, N, d_pos, d_bids, d_bpos, d_cstart, d_clen);
    /* loss head: Σ w·CE into d_met[0], dh = ∂(Σ w·CE)/∂h (loss_scale 1 as the CPU backend: the reducer divides) */
    cross_entropy_cuda(d->ce, d->ce_row, d->argmax, (double *)d->d_met, d->dh, H, d->h, H, d->lm_head, d_labels,
                       d_weights, 1.0f, NB, d_loss_rows, nloss, st);
    dc_mark(d, DRAFTER_CUDA_CE);
    block_accept_cuda((int64_t *)d->d_met + 1, d->argmax, d_labels, d_weights, N, B, st);
    CHECK_CUDA(cudaMemcpyAsync(d->h_met, d->d_met, DC_MET_WORDS * 8, cudaMemcpyDeviceToHost, st));
    CHECK_CUDA(cudaEventRecord(d->met_ready, st));

    /* ---- backward ---- */
    /* the norm weights' gradients add up partials (and [Wk;Wv]'s context GEMM adds to the block one's): the vectors
     * start at zero, every matrix's first GEMM overwrites */
    for (int i = 0; i < d->L.nparams; i++)
        if (P[i].ndim == 1) CHECK_CUDA(cudaMemsetAsync(g + P[i].offset, 0, P[i].numel * sizeof(float), st));
    rmsnorm_backward_cuda(d->dres, H, 0, g + P[DRAFTER_PARAM_NORM].offset, d->dh, H, d->x_final, H, w_fn, NB, H, eps,
                          d->norm_ws, st);
    dc_mark(d, DRAFTER_CUDA_OTHER);
    for (int l = d->nl - 1; l >= 0; l--) {
        const drafter_param *p = drafter_layout_layer(&d->L, l, 0);
#define W(j) (w + p[j].offset)
#define G(j) (g + p[j].offset)
        dc_acts *a = &d->acts[l];
        /* MLP: x_out = x_mid + act · W_downᵀ */
        matmul_backward_cuda(mm, d->dact, I, 0, G(LP_DOWN), 0, d->dres, H, a->act, I, W(LP_DOWN), NB, H, I, st);
        dc_mark(d, DRAFTER_CUDA_GEMM);
        swiglu_backward_cuda(a->gu, 2 * I, d->dact, I, a->gu, 2 * I, NB, I, st);
        dc_mark(d, DRAFTER_CUDA_OTHER);
        matmul_backward_cuda(mm, d->dy, H, 0, G(LP_GATE), 0, a->gu, 2 * I, a->y, H, W(LP_GATE), NB, 2 * I, H, st);
        dc_mark(d, DRAFTER_CUDA_GEMM);
        rmsnorm_backward_cuda(d->dres, H, 1, G(LP_POST_NORM), d->dy, H, a->x_mid, H, W(LP_POST_NORM), NB, H, eps,
                              d->norm_ws, st);
        dc_mark(d, DRAFTER_CUDA_OTHER);
        /* attention: x_mid = x_in + attn · W_oᵀ */
        matmul_backward_cuda(mm, d->dattn, qd, 0, G(LP_WO), 0, d->dres, H, a->attn, qd, W(LP_WO), NB, H, qd, st);
        dc_mark(d, DRAFTER_CUDA_GEMM);
        /* gradients straight into the layouts of the projection GEMMs: dq | dkb | dvb and dkc | dvc */
        dflash_attn_cuda_in in = dc_attn_in(d, a, d_cstart, d_clen, T);
        dflash_attn_cuda_grads ag = {.dq = d->dqkv, .lddq = qkvw, .dkc = d->dkvc, .lddkc = 2 * kd,
                                     .dvc = d->dkvc + kd, .lddvc = 2 * kd, .dkb = d->dqkv + qd, .lddkb = qkvw,
                                     .dvb = d->dqkv + qd + kd, .lddvb = qkvw};
        dflash_attn_shape las = as;
        las.window = hf_layer_window(&d->cfg, l);
        dflash_attention_backward_cuda(&ag, d->delta, d->attn_ws, d->attn_ws_bytes, d->dattn, qd, a->attn, qd, a->lse,
                                       &in, &las, st);
        dc_mark(d, DRAFTER_CUDA_ATTN_BWD);
        qk_norm_rope_backward_cuda(d->dqkv, qkvw, d->dqkv + qd, qkvw, a->qkv, qkvw, a->qkv + qd, qkvw, NB, nh, nkv,
                                   hd, W(LP_Q_NORM), W(LP_K_NORM), G(LP_Q_NORM), G(LP_K_NORM), eps, d_bpos,
                                   d->d_inv_freq, d->qk_ws, st);
        qk_norm_rope_backward_cuda(NULL, 0, d->dkvc, 2 * kd, NULL, 0, a->kvc, 2 * kd, T, 0, nkv, hd, NULL,
                                   W(LP_K_NORM), NULL, G(LP_K_NORM), eps, d_pos, d->d_inv_freq, d->qk_ws, st);
        dc_mark(d, DRAFTER_CUDA_OTHER);
        /* projections: q, kb, vb from u (one GEMM); kc, vc from F, dF summed over the layers */
        matmul_backward_cuda(mm, d->du, H, 0, G(LP_WQ), 0, d->dqkv, qkvw, a->u, H, W(LP_WQ), NB, qkvw, H, st);
        matmul_backward_cuda(mm, d->dF, H, l != d->nl - 1, G(LP_WK), 1, d->dkvc, 2 * kd, d->F, H, W(LP_WK), T,
                             2 * kd, H, st);
        dc_mark(d, DRAFTER_CUDA_GEMM);
        rmsnorm_backward_cuda(d->dres, H, 1, G(LP_IN_NORM), d->du, H, a->x_in, H, W(LP_IN_NORM), NB, H, eps,
                              d->norm_ws, st);
        dc_mark(d, DRAFTER_CUDA_OTHER);
#undef W
#undef G
    }
    if (d->nl == 0) CHECK_CUDA(cudaMemsetAsync(d->dF, 0, (size_t)T * H * 2, st));
    /* context fusion: F = hidden_norm(fc_out), fc_out = aux · fcᵀ; aux and the embedding are frozen */
    rmsnorm_backward_cuda(d->dfc, H, 0, g + P[DRAFTER_PARAM_HIDDEN_NORM].offset, d->dF, H, d->fc_out, H, w_hn, T, H,
                          eps, d->norm_ws, st);
    dc_mark(d, DRAFTER_CUDA_OTHER);
    matmul_backward_cuda(mm, NULL, 0, 0, g + P[DRAFTER_PARAM_FC].offset, 0, d->dfc, H, aux, K * H, w_fc, T, H, K * H,
                         st);
    dc_mark(d, DRAFTER_CUDA_GEMM);

    if (d->profiling && d->nev > 0) {
        CHECK_CUDA(cudaEventSynchronize(d->ev[d->nev - 1]));
        for (int i = 1; i < d->nev; i++) {
            float ms = 0;
            CHECK_CUDA(cudaEventElapsedTime(&ms, d->ev[i - 1], d->ev[i]));
            d->prof_ms[d->ev_class[i]] += ms;
        }
    }
    return 0;
}

int drafter_cuda_forward_logits(drafter_backend *b, const uint16_t *w, const uint16_t *aux, int T,
                                const int32_t *positions, const drafter_blocks *blk, uint16_t *logits, errbuf *err)
{
    drafter_cuda *d = (drafter_cuda *)b;
    const int N = blk->nblocks, B = d->B, NB = N * B;
    if (blk->block_size != B || N < 1 || N > d->max_blocks || T < 1 || T > d->max_tokens)
        return errbuf_set(err, EINVAL, "drafter forward: %d blocks of %d over %d context rows (the backend: blocks of "
                          "%d, at most %d blocks and %d rows)", N, blk->block_size, T, B, d->max_blocks,
                          d->max_tokens);
    for (int j = 0; j < NB; j++)
        if (blk->block_ids[j] < 0 || blk->block_ids[j] >= d->V)
            return errbuf_set(err, EINVAL, "drafter forward: block token %d of row %d is outside the vocabulary (%d)",
                              blk->block_ids[j], j, d->V);
    for (int j = 0; j < N; j++)
        if (blk->ctx_start[j] < 0 || blk->ctx_len[j] < 0 || blk->ctx_start[j] + blk->ctx_len[j] > T)
            return errbuf_set(err, EINVAL, "drafter forward: block %d sees context rows [%d, %d) of %d", j,
                              blk->ctx_start[j], blk->ctx_start[j] + blk->ctx_len[j], T);
    CHECK_CUDA(cudaEventSynchronize(d->staged));
    size_t o = dc_stage(d, positions, T, blk, NULL);
    const int32_t *d_pos = d->d_batch, *d_bids = d_pos + T, *d_bpos = d_bids + NB, *d_labels = d_bpos + NB;
    const int32_t *d_cstart = d_labels + NB, *d_clen = d_cstart + N;
    d->nev = 0;
    CHECK_CUDA(cudaMemcpyAsync(d->d_batch, d->h_stage, 4 * o, cudaMemcpyHostToDevice, d->stream));
    CHECK_CUDA(cudaEventRecord(d->staged, d->stream));
    dc_forward(d, w, aux, T, N, d_pos, d_bids, d_bpos, d_cstart, d_clen);
    matmul_forward_cuda(d->mm, logits, d->V, NULL, 0, 0.0f, d->h, d->H, d->lm_head, NB, d->V, d->H, d->stream);
    return 0;
}

void drafter_cuda_metrics(drafter_backend *b, drafter_metrics *mt)
{
    drafter_cuda *d = (drafter_cuda *)b;
    CHECK_CUDA(cudaEventSynchronize(d->met_ready));
    *mt = d->pending;
    if (d->fault_nan_batch == d->pending_id) mt->loss_sum = NAN; /* fault injection (tests of the NaN guard) */
    if (!d->pending_device) return;
    double wce;
    memcpy(&wce, &d->h_met[0], sizeof wce);
    const int64_t *cnt = (const int64_t *)d->h_met + 1;
    if (d->fault_nan_batch != d->pending_id) mt->loss_sum = wce;
    for (int k = 1; k < d->B; k++) mt->slot_correct[k] = (long)cnt[k];
    mt->accept_sum = (double)mt->nblocks + (double)cnt[d->B];
}

static int dc_forward_backward(drafter_backend *b, const void *weights, float *grads, const drafter_batch *bt,
                               drafter_metrics *mt, errbuf *err)
{
    int rc = drafter_cuda_enqueue(b, weights, grads, bt, err);
    if (rc) return rc;
    drafter_cuda_metrics(b, mt);
    /* the ops' contract: the gradients are complete on return (the caller may read them from another stream) */
    CHECK_CUDA(cudaStreamSynchronize(((drafter_cuda *)b)->stream));
    return 0;
}

void *drafter_cuda_stream(drafter_backend *b) { return ((drafter_cuda *)b)->stream; }
size_t drafter_cuda_device_bytes(const drafter_backend *b) { return ((const drafter_cuda *)b)->device_bytes; }

void drafter_cuda_set_profiling(drafter_backend *b, int on)
{
    drafter_cuda *d = (drafter_cuda *)b;
    d->profiling = on;
    if (on && !d->ev[0])
        for (int i = 0; i < DC_MAX_EVENTS; i++) CHECK_CUDA(cudaEventCreate(&d->ev[i]));
}

void drafter_cuda_profile(const drafter_backend *b, double ms[DRAFTER_CUDA_NCLASS])
{
    const drafter_cuda *d = (const drafter_cuda *)b;
    for (int i = 0; i < DRAFTER_CUDA_NCLASS; i++) ms[i] = d->prof_ms[i];
}

int drafter_cuda_warm_up(drafter_backend *b, const uint16_t *weights, errbuf *err)
{
    drafter_cuda *d = (drafter_cuda *)b;
    const int T = d->max_tokens, S = d->max_seqs < T ? d->max_seqs : T;
    const double t0 = now_seconds();
    /* the largest shape: S sequences sharing T tokens, every position trainable, so anchors_sample draws the most
     * blocks; zero taps, scratch gradients (the reducer's may hold a published step; the step overwrites them) */
    int32_t *ids = xcalloc((size_t)T, sizeof *ids), *pos = xmalloc(sizeof *pos * (size_t)T);
    int32_t *cu = xmalloc(sizeof *cu * (size_t)(S + 1));
    uint8_t *lm = xmalloc((size_t)T);
    memset(lm, 1, (size_t)T);
    for (int s = 0; s <= S; s++) cu[s] = (int32_t)((long long)T * s / S);
    for (int s = 0; s < S; s++)
        for (int t = cu[s]; t < cu[s + 1]; t++) pos[t] = t - cu[s];
    void *aux = NULL;
    float *grads = NULL;
    CHECK_CUDA(cudaMalloc(&aux, (size_t)T * d->K * d->H * sizeof(uint16_t)));
    CHECK_CUDA(cudaMalloc((void **)&grads, d->L.numel * sizeof(float)));
    CHECK_CUDA(cudaMemsetAsync(aux, 0, (size_t)T * d->K * d->H * sizeof(uint16_t), d->stream));
    drafter_batch bt = {.id = 0, .ntok = T, .nseq = S, .aux = aux, .input_ids = ids, .positions = pos,
                        .cu_seqlens = cu, .loss_mask = lm};
    drafter_metrics mt;
    int rc = dc_forward_backward(b, weights, grads, &bt, &mt, err);
    CHECK_CUDA(cudaStreamSynchronize(d->stream));
    CHECK_CUDA(cudaFree(aux));
    CHECK_CUDA(cudaFree(grads));
    free(ids);
    free(pos);
    free(cu);
    free(lm);
    if (!rc)
        log_info("warm-up: one step at the largest shape (%d tokens, %d sequences, %ld blocks) in %.2f s", T, S,
                 mt.nblocks, now_seconds() - t0);
    return rc;
}
