/* target_model_cuda: Qwen3/Llama target forward on one CUDA device. Per layer: RMSNorm, one fused q|k|v GEMM,
 * per-head q/k norm + RoPE, flash attention, o_proj GEMM whose epilogue adds the residual (beta = 1), RMSNorm, one
 * fused gate|up GEMM, SwiGLU, down_proj GEMM adding the residual. A tapped layer's down_proj writes its output (the
 * residual stream) straight into the tap column block of the caller's buffer (cuBLASLt C = residual, D = tap
 * block), and the next layer reads the residual from there: capture costs no kernel and no copy. */
#include "target_model_cuda.h"
#include "target_model_cuda_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "attention.h"
#include "kv_attention.h"
#include "cuda_check.h"
#include "embedding.h"
#include "matmul.h"
#include "qk_norm_rope.h"
#include "rand_fill.h"
#include "rmsnorm.h"
#include "rope.h"
#include "safetensors.h"
#include "swiglu.h"
#include "target_hybrid.h"
#include "target_hybrid_cuda.h"

static void *tc_alloc(target_cuda *m, size_t bytes)
{
    void *p = NULL;
    CHECK_CUDA(cudaMalloc(&p, bytes ? bytes : 16));
    m->device_bytes += bytes;
    return p;
}

static void tc_free(void **p)
{
    if (*p) CHECK_CUDA(cudaFree(*p));
    *p = NULL;
}

int target_cuda_upload_tensor(const st_file *st, const char *name, uint16_t *dst, int64_t d0, int64_t d1,
                              errbuf *err)
{
    const st_tensor *t = st_find(st, name);
    if (!t) return errbuf_set(err, ENOENT, "%s: tensor %s is missing", st_path(st), name);
    int ndim = d1 > 0 ? 2 : 1;
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1))
        return errbuf_set(err, EINVAL, "%s: tensor %s has shape [%lld%s%lld], expected [%lld%s%lld]", t->file, name,
                          (long long)t->shape[0], t->ndim > 1 ? ", " : "", t->ndim > 1 ? (long long)t->shape[1] : 0LL,
                          (long long)d0, ndim > 1 ? ", " : "", ndim > 1 ? (long long)d1 : 0LL);
    size_t n = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
    if (t->dtype == ST_BF16) {
        CHECK_CUDA(cudaMemcpy(dst, t->data, n * 2, cudaMemcpyHostToDevice));
        return 0;
    }
    if (t->dtype != ST_F32 && t->dtype != ST_F16)
        return errbuf_set(err, EINVAL, "%s: tensor %s has dtype %s, expected F32, BF16 or F16", t->file, name,
                          st_dtype_name(t->dtype));
    const size_t chunk = (size_t)1 << 24;
    uint16_t *h = xmalloc(sizeof *h * (n < chunk ? n : chunk));
    for (size_t off = 0; off < n; off += chunk) {
        size_t c = n - off < chunk ? n - off : chunk;
        for (size_t i = 0; i < c; i++) {
            float f;
            if (t->dtype == ST_F32) {
                memcpy(&f, (const char *)t->data + 4 * (off + i), 4);
            } else {
                uint16_t hv;
                memcpy(&hv, (const char *)t->data + 2 * (off + i), 2);
                f = f16_to_f32(hv);
            }
            h[i] = f32_to_bf16(f);
        }
        CHECK_CUDA(cudaMemcpy(dst + off, h, c * 2, cudaMemcpyHostToDevice));
    }
    free(h);
    return 0;
}

static void tc_alloc_layer(target_cuda *m, tc_layer *l)
{
    const hf_config *c = &m->cfg;
    size_t H = (size_t)c->hidden_size, hd = (size_t)c->head_dim, qd = (size_t)c->num_heads * hd;
    size_t kd = (size_t)c->num_kv_heads * hd, I = (size_t)c->intermediate_size;
    l->input_norm = tc_alloc(m, H * 2);
    l->post_norm = tc_alloc(m, H * 2);
    if (c->has_qk_norm) {
        l->q_norm = tc_alloc(m, hd * 2);
        l->k_norm = tc_alloc(m, hd * 2);
    }
    l->w_qkv = tc_alloc(m, (qd + 2 * kd) * H * 2);
    l->w_o = tc_alloc(m, H * qd * 2);
    l->w_gu = tc_alloc(m, 2 * I * H * 2);
    l->w_down = tc_alloc(m, H * I * 2);
}

static int tc_load_layer(target_cuda *m, const st_file *st, int i, errbuf *err)
{
    const hf_config *c = &m->cfg;
    tc_layer *l = &m->layers[i];
    int64_t H = c->hidden_size, hd = c->head_dim, qd = (int64_t)c->num_heads * hd, kd = (int64_t)c->num_kv_heads * hd;
    int64_t I = c->intermediate_size;
    char n[160];
    int rc = 0;
#define UP(dst, suffix, a, b)                                           \
    if (rc == 0) {                                                       \
        snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix);         \
        rc = target_cuda_upload_tensor(st, n, dst, a, b, err);                           \
    }
    UP(l->input_norm, "input_layernorm.weight", H, 0);
    UP(l->post_norm, "post_attention_layernorm.weight", H, 0);
    if (c->has_qk_norm) {
        UP(l->q_norm, "self_attn.q_norm.weight", hd, 0);
        UP(l->k_norm, "self_attn.k_norm.weight", hd, 0);
    }
    UP(l->w_qkv, "self_attn.q_proj.weight", qd, H);
    UP(l->w_qkv + qd * H, "self_attn.k_proj.weight", kd, H);
    UP(l->w_qkv + (qd + kd) * H, "self_attn.v_proj.weight", kd, H);
    UP(l->w_o, "self_attn.o_proj.weight", H, qd);
    UP(l->w_gu, "mlp.gate_proj.weight", I, H);
    UP(l->w_gu + I * H, "mlp.up_proj.weight", I, H);
    UP(l->w_down, "mlp.down_proj.weight", H, I);
#undef UP
    return rc;
}

/* Everything but the weights' values: stream, cuBLASLt, weight buffers, inv_freq, workspaces. */
static int tc_create(target_cuda **out, const hf_config *cfg, int nlayers, int full, int max_tokens, int max_seqs,
                     void *stream, errbuf *err)
{
    if (max_tokens <= 0 || max_seqs <= 0)
        return errbuf_set(err, EINVAL, "target_cuda: max_tokens %d and max_seqs %d must be positive", max_tokens,
                          max_seqs);
    if (cfg->head_dim % 2 || cfg->num_kv_heads <= 0 || cfg->num_heads % cfg->num_kv_heads)
        return errbuf_set(err, EINVAL, "target_cuda: head_dim %d / heads %d / kv heads %d unsupported", cfg->head_dim,
                          cfg->num_heads, cfg->num_kv_heads);
    target_cuda *m = xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    m->nlayers = nlayers;
    m->full = full;
    if (stream) {
        m->stream = (cudaStream_t)stream;
    } else {
        CHECK_CUDA(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
        m->own_stream = 1;
    }
    m->mm = matmul_cuda_create(0);
    m->device_bytes += (size_t)64 << 20;
    const hf_config *c = &m->cfg;
    size_t H = (size_t)c->hidden_size, V = (size_t)c->vocab_size, hd = (size_t)c->head_dim;
    size_t qd = (size_t)c->num_heads * hd, kd = (size_t)c->num_kv_heads * hd, I = (size_t)c->intermediate_size;
    m->embed = tc_alloc(m, V * H * 2);
    m->lm_head = c->tie_embeddings ? m->embed : tc_alloc(m, V * H * 2);
    if (full) m->final_norm = tc_alloc(m, H * 2);
    if (!c->is_hybrid) {
        m->layers = xcalloc((size_t)nlayers, sizeof *m->layers);
        for (int i = 0; i < nlayers; i++) tc_alloc_layer(m, &m->layers[i]);
    }

    /* hybrid targets rotate the first rotary_dim dimensions of each head (partial RoPE) */
    const size_t rd = c->is_hybrid ? (size_t)c->rotary_dim : hd;
    double *inv = xmalloc(sizeof(double) * rd / 2);
    rope_params rp = {.theta = c->rope_theta, .llama3 = c->rope_llama3, .factor = c->rope_factor,
                      .low_freq_factor = c->rope_low_freq_factor, .high_freq_factor = c->rope_high_freq_factor,
                      .original_max_position = c->rope_original_max_position};
    rope_inv_freq(inv, (int)rd, &rp);
    /* as target_model.c: a bf16 checkpoint's reference rotates with bf16-rounded frequencies */
    if (!strcmp(c->torch_dtype, "bfloat16"))
        for (size_t i = 0; i < rd / 2; i++) inv[i] = bf16_to_f32(f32_to_bf16((float)inv[i]));
    m->d_inv_freq = tc_alloc(m, sizeof(double) * rd / 2);
    CHECK_CUDA(cudaMemcpy(m->d_inv_freq, inv, sizeof(double) * rd / 2, cudaMemcpyHostToDevice));
    free(inv);

    size_t t = (size_t)max_tokens;
    m->max_tokens = max_tokens, m->max_seqs = max_seqs;
    m->x = tc_alloc(m, t * H * 2);
    m->u = tc_alloc(m, t * H * 2);
    if (!c->is_hybrid) { /* a hybrid target's own workspaces come from target_hybrid_cuda_create */
        m->qkv = tc_alloc(m, t * (qd + 2 * kd) * 2);
        m->attn = tc_alloc(m, t * qd * 2);
        m->gu = tc_alloc(m, t * 2 * I * 2);
        m->act = tc_alloc(m, t * I * 2);
    }
    size_t nstage = 2 * t + (size_t)max_seqs + 1;
    m->d_ids = tc_alloc(m, nstage * sizeof(int32_t));
    CHECK_CUDA(cudaMallocHost((void **)&m->h_stage, nstage * sizeof(int32_t)));
    CHECK_CUDA(cudaEventCreateWithFlags(&m->staged, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventRecord(m->staged, m->stream));
    if (c->is_hybrid) {
        int rc = target_hybrid_cuda_create(m, err);
        if (rc) {
            target_cuda_destroy(&m);
            return rc;
        }
    }
    *out = m;
    return 0;
}

int target_cuda_load(target_cuda **out, const char *dir, int max_layer, int max_tokens, int max_seqs, void *stream,
                     errbuf *err)
{
    hf_config cfg;
    st_file *st = NULL;
    target_cuda *m = NULL;
    int rc = hf_config_load(&cfg, dir, err);
    if (rc) return rc;
    if (max_layer >= cfg.num_layers)
        return errbuf_set(err, EINVAL, "%s: layer %d requested but the model has %d layers", dir, max_layer,
                          cfg.num_layers);
    int full = max_layer < 0, nlayers = full ? cfg.num_layers : max_layer + 1;
    rc = st_open(&st, dir, err);
    if (rc) return rc;
    rc = tc_create(&m, &cfg, nlayers, full, max_tokens, max_seqs, stream, err);
    if (rc) goto fail;
    const hf_config *c = &m->cfg;
    /* hybrid vision-language checkpoints keep the text model under model.language_model. */
    const char *prefix = c->is_hybrid ? target_hybrid_prefix(st) : "model.";
    char name[160];
    snprintf(name, sizeof name, "%sembed_tokens.weight", prefix);
    rc = target_cuda_upload_tensor(st, name, m->embed, c->vocab_size, c->hidden_size, err);
    if (!rc && !c->tie_embeddings)
        rc = target_cuda_upload_tensor(st, "lm_head.weight", m->lm_head, c->vocab_size, c->hidden_size, err);
    snprintf(name, sizeof name, "%snorm.weight", prefix);
    if (!rc && full)
        rc = c->is_hybrid ? target_hybrid_cuda_upload_norm(st, name, m->final_norm, c->hidden_size, err)
                          : target_cuda_upload_tensor(st, name, m->final_norm, c->hidden_size, 0, err);
    if (!rc && c->is_hybrid) rc = target_hybrid_cuda_load(m, st, prefix, err);
    for (int i = 0; !rc && !c->is_hybrid && i < nlayers; i++) rc = tc_load_layer(m, st, i, err);
    if (rc) goto fail;
    st_close(&st);
    *out = m;
    return 0;
fail:
    st_close(&st);
    target_cuda_destroy(&m);
    return rc;
}

int target_cuda_init_random(target_cuda **out, const hf_config *cfg, uint64_t seed, float init_std, int max_tokens,
                            int max_seqs, void *stream, errbuf *err)
{
    target_cuda *m = NULL;
    int rc = tc_create(&m, cfg, cfg->num_layers, 1, max_tokens, max_seqs, stream, err);
    if (rc) return rc;
    const hf_config *c = &m->cfg;
    size_t H = (size_t)c->hidden_size, V = (size_t)c->vocab_size, hd = (size_t)c->head_dim;
    size_t qd = (size_t)c->num_heads * hd, kd = (size_t)c->num_kv_heads * hd, I = (size_t)c->intermediate_size;
    float a = init_std * sqrtf(3.0f); /* uniform [-a, a) has standard deviation a/sqrt(3) */
    uint64_t s = seed;
    rand_fill_bf16_cuda(m->embed, V * H, s++, a, 0.0f, m->stream);
    if (m->lm_head != m->embed) rand_fill_bf16_cuda(m->lm_head, V * H, s++, a, 0.0f, m->stream);
    rand_fill_bf16_cuda(m->final_norm, H, s++, 0.0f, 1.0f, m->stream);
    if (m->hy) target_hybrid_cuda_init_random(m, &s, a);
    for (int i = 0; !m->hy && i < m->nlayers; i++) {
        tc_layer *l = &m->layers[i];
        rand_fill_bf16_cuda(l->input_norm, H, s++, 0.0f, 1.0f, m->stream);
        rand_fill_bf16_cuda(l->post_norm, H, s++, 0.0f, 1.0f, m->stream);
        if (l->q_norm) rand_fill_bf16_cuda(l->q_norm, hd, s++, 0.0f, 1.0f, m->stream);
        if (l->k_norm) rand_fill_bf16_cuda(l->k_norm, hd, s++, 0.0f, 1.0f, m->stream);
        rand_fill_bf16_cuda(l->w_qkv, (qd + 2 * kd) * H, s++, a, 0.0f, m->stream);
        rand_fill_bf16_cuda(l->w_o, H * qd, s++, a, 0.0f, m->stream);
        rand_fill_bf16_cuda(l->w_gu, 2 * I * H, s++, a, 0.0f, m->stream);
        rand_fill_bf16_cuda(l->w_down, H * I, s++, a, 0.0f, m->stream);
    }
    CHECK_CUDA(cudaStreamSynchronize(m->stream));
    *out = m;
    return 0;
}

void target_cuda_destroy(target_cuda **mp)
{
    target_cuda *m = *mp;
    if (!m) return;
    CHECK_CUDA(cudaStreamSynchronize(m->stream));
    target_hybrid_cuda_destroy(m);
    if (m->layers)
        for (int i = 0; i < m->nlayers; i++) {
            tc_layer *l = &m->layers[i];
            void **p[] = {(void **)&l->input_norm, (void **)&l->post_norm, (void **)&l->q_norm, (void **)&l->k_norm,
                          (void **)&l->w_qkv,      (void **)&l->w_o,       (void **)&l->w_gu,   (void **)&l->w_down};
            for (size_t j = 0; j < sizeof p / sizeof p[0]; j++) tc_free(p[j]);
        }
    free(m->layers);
    if (m->lm_head != m->embed) tc_free((void **)&m->lm_head);
    void **bufs[] = {(void **)&m->embed, (void **)&m->final_norm, (void **)&m->d_inv_freq, (void **)&m->x,
                     (void **)&m->u,     (void **)&m->qkv,        (void **)&m->attn,       (void **)&m->gu,
                     (void **)&m->act,   (void **)&m->d_ids};
    for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++) tc_free(bufs[j]);
    if (m->h_stage) CHECK_CUDA(cudaFreeHost(m->h_stage));
    if (m->staged) CHECK_CUDA(cudaEventDestroy(m->staged));
    for (int i = 0; i < TC_MAX_EVENTS; i++)
        if (m->ev[i]) CHECK_CUDA(cudaEventDestroy(m->ev[i]));
    matmul_cuda_destroy(&m->mm);
    if (m->own_stream) CHECK_CUDA(cudaStreamDestroy(m->stream));
    free(m);
    *mp = NULL;
}

const hf_config *target_cuda_config(const target_cuda *m) { return &m->cfg; }
void *target_cuda_stream(const target_cuda *m) { return m->stream; }
const uint16_t *target_cuda_embedding(const target_cuda *m) { return m->embed; }
const uint16_t *target_cuda_lm_head(const target_cuda *m) { return m->lm_head; }
size_t target_cuda_device_bytes(const target_cuda *m) { return m->device_bytes; }

void target_cuda_set_profiling(target_cuda *m, int on)
{
    m->profiling = on;
    if (on && !m->ev[0])
        for (int i = 0; i < TC_MAX_EVENTS; i++) CHECK_CUDA(cudaEventCreate(&m->ev[i]));
}

void target_cuda_profile(const target_cuda *m, double ms[TARGET_CUDA_NCLASS])
{
    for (int i = 0; i < TARGET_CUDA_NCLASS; i++) ms[i] = m->prof_ms[i];
}

/* Profiling: an event after each kernel; the span from the previous event is charged to the kernel's class. */
void target_cuda_mark(target_cuda *m, int cls)
{
    if (!m->profiling || m->nev >= TC_MAX_EVENTS) return;
    m->ev_class[m->nev] = cls;
    CHECK_CUDA(cudaEventRecord(m->ev[m->nev++], m->stream));
}

static int tc_check_batch(const target_cuda *m, const target_batch *b, errbuf *err)
{
    int rc = target_batch_check(&m->cfg, b, err);
    if (rc) return rc;
    if (b->ntok > m->max_tokens || b->nseq > m->max_seqs)
        return errbuf_set(err, EINVAL, "batch: %d tokens in %d sequences exceeds the workspace (%d tokens, %d sequences)",
                          b->ntok, b->nseq, m->max_tokens, m->max_seqs);
    return 0;
}

static void tc_copy_rows(target_cuda *m, uint16_t *dst, int ldd, const uint16_t *src, int lds, int T, int H)
{
    CHECK_CUDA(cudaMemcpy2DAsync(dst, (size_t)ldd * 2, src, (size_t)lds * 2, (size_t)H * 2, (size_t)T,
                                 cudaMemcpyDeviceToDevice, m->stream));
}

uint16_t *target_cuda_layer_dst(target_cuda *m, int li, const int *taps, int ntaps, uint16_t *aux, int ld_aux,
                                uint16_t *last, int *ldd, int *first_tap)
{
    const int H = m->cfg.hidden_size;
    *first_tap = -1;
    for (int i = 0; i < ntaps && *first_tap < 0; i++)
        if (taps[i] == li) *first_tap = i;
    if (*first_tap >= 0) {
        *ldd = ld_aux;
        return aux + (size_t)*first_tap * H;
    }
    *ldd = H;
    return last && li == m->cfg.num_layers - 1 ? last : m->x;
}

void target_cuda_layer_copies(target_cuda *m, int li, int first_tap, const int *taps, int ntaps, uint16_t *aux,
                              int ld_aux, uint16_t *last, const uint16_t *r, int ldr, int T)
{
    const int H = m->cfg.hidden_size;
    for (int i = first_tap + 1; first_tap >= 0 && i < ntaps; i++)
        if (taps[i] == li) tc_copy_rows(m, aux + (size_t)i * H, ld_aux, r, ldr, T, H);
    if (first_tap >= 0 && last && li == m->cfg.num_layers - 1) tc_copy_rows(m, last, H, r, ldr, T, H);
    target_cuda_mark(m, TARGET_CUDA_COPY);
}

void target_cuda_finish(target_cuda *m, const uint16_t *r, int ldr, int T, uint16_t *logits,
                        const int32_t *logit_rows, int nlogit)
{
    const hf_config *c = &m->cfg;
    const int H = c->hidden_size;
    cudaStream_t st = m->stream;
    if (logits) {
        rmsnorm_forward_cuda(m->u, H, r, ldr, m->final_norm, T, H, (float)c->rms_eps, st);
        target_cuda_mark(m, TARGET_CUDA_OTHER);
        const uint16_t *rows_in = m->u;
        int n = T;
        if (logit_rows) { /* only the rows asked for: gathered into x (free now) */
            embedding_forward_cuda(m->x, logit_rows, nlogit, m->u, H, st);
            rows_in = m->x, n = nlogit;
        }
        matmul_forward_cuda(m->mm, logits, c->vocab_size, NULL, 0, 0.0f, rows_in, H, m->lm_head, n, c->vocab_size, H,
                            st);
        target_cuda_mark(m, TARGET_CUDA_MATMUL);
    }
    if (m->profiling && m->nev > 0) {
        CHECK_CUDA(cudaEventSynchronize(m->ev[m->nev - 1]));
        for (int i = 1; i < m->nev; i++) {
            float ms = 0;
            CHECK_CUDA(cudaEventElapsedTime(&ms, m->ev[i - 1], m->ev[i]));
            m->prof_ms[m->ev_class[i]] += ms;
        }
    }
}

void target_cuda_run_layers(target_cuda *m, const tc_rows *rows, const tc_kv_cache *kv, int deepest, const int *taps,
                            int ntaps, uint16_t *aux, int ld_aux, uint16_t *last, uint16_t *logits,
                            const int32_t *logit_rows, int nlogit)
{
    if (m->hy) { /* hybrid targets: no KV-cache decoding (target_cuda_cache_create refuses them) */
        DF_ASSERT(!kv);
        target_hybrid_cuda_run_layers(m, rows, deepest, taps, ntaps, aux, ld_aux, last, logits, logit_rows, nlogit);
        return;
    }
    const hf_config *c = &m->cfg;
    const int T = rows->T, H = c->hidden_size, hd = c->head_dim, nh = c->num_heads, nkv = c->num_kv_heads;
    const int qd = nh * hd, kd = nkv * hd, I = c->intermediate_size, qkvw = qd + 2 * kd;
    const float eps = (float)c->rms_eps, scale = 1.0f / sqrtf((float)hd);
    cudaStream_t st = m->stream;

    embedding_forward_cuda(m->x, rows->ids, T, m->embed, H, st);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
    uint16_t *r = m->x; /* the residual stream: x, or the tap block / last buffer the previous layer wrote */
    int ldr = H;
    for (int li = 0; li <= deepest; li++) {
        const tc_layer *l = &m->layers[li];
        rmsnorm_forward_cuda(m->u, H, r, ldr, l->input_norm, T, H, eps, st);
        target_cuda_mark(m, TARGET_CUDA_OTHER);
        matmul_forward_cuda(m->mm, m->qkv, qkvw, NULL, 0, 0.0f, m->u, H, l->w_qkv, T, qkvw, H, st);
        target_cuda_mark(m, TARGET_CUDA_MATMUL);
        qk_norm_rope_cuda(m->qkv, qkvw, m->qkv + qd, qkvw, T, nh, nkv, hd, l->q_norm, l->k_norm, eps, rows->pos,
                          m->d_inv_freq, st);
        target_cuda_mark(m, TARGET_CUDA_OTHER);
        if (kv)
            kv_cache_append_cuda(kv->kc[li], kv->vc[li], kv->seq_stride, m->qkv + qd, qkvw, m->qkv + qd + kd, qkvw,
                                 kv->seq, kv->pos, T, kd, st);
        if (!kv || kv->packed)
            attention_causal_forward_cuda(m->attn, qd, m->qkv, qkvw, m->qkv + qd, qkvw, m->qkv + qd + kd, qkvw,
                                          rows->cu, rows->nseq, rows->max_seqlen, nh, nkv, hd, scale, st);
        else
            kv_attention_forward_cuda(m->attn, qd, m->qkv, qkvw, kv->kc[li], kv->vc[li], kv->seq_stride, kv->seq,
                                      kv->pos, T, kv->max_pos, nh, nkv, hd, scale, kv->workspace, st);
        target_cuda_mark(m, TARGET_CUDA_ATTENTION);
        matmul_forward_cuda(m->mm, m->x, H, r, ldr, 1.0f, m->attn, qd, l->w_o, T, H, qd, st);
        target_cuda_mark(m, TARGET_CUDA_MATMUL);
        rmsnorm_forward_cuda(m->u, H, m->x, H, l->post_norm, T, H, eps, st);
        target_cuda_mark(m, TARGET_CUDA_OTHER);
        matmul_forward_cuda(m->mm, m->gu, 2 * I, NULL, 0, 0.0f, m->u, H, l->w_gu, T, 2 * I, H, st);
        target_cuda_mark(m, TARGET_CUDA_MATMUL);
        swiglu_forward_cuda(m->act, I, m->gu, 2 * I, T, I, st);
        target_cuda_mark(m, TARGET_CUDA_OTHER);
        /* where this layer's output goes: its first tap block, else the caller's last buffer (last layer), else x */
        int ldd, first_tap;
        uint16_t *dst = target_cuda_layer_dst(m, li, taps, ntaps, aux, ld_aux, last, &ldd, &first_tap);
        matmul_forward_cuda(m->mm, dst, ldd, m->x, H, 1.0f, m->act, I, l->w_down, T, H, I, st);
        target_cuda_mark(m, TARGET_CUDA_MATMUL);
        r = dst, ldr = ldd;
        /* a layer tapped twice, or tapped and also the requested last output: copies (rare) */
        target_cuda_layer_copies(m, li, first_tap, taps, ntaps, aux, ld_aux, last, r, ldr, T);
    }
    target_cuda_finish(m, r, ldr, T, logits, logit_rows, nlogit);
}

int target_cuda_forward(target_cuda *m, const target_batch *b, const int *taps, int ntaps, uint16_t *aux, int ld_aux,
                        uint16_t *last, uint16_t *logits, errbuf *err)
{
    const hf_config *c = &m->cfg;
    int rc = tc_check_batch(m, b, err);
    if (rc) return rc;
    const int T = b->ntok, H = c->hidden_size;
    if (!aux) ntaps = 0;
    if (aux && ld_aux < ntaps * H)
        return errbuf_set(err, EINVAL, "aux row stride %d is below %d taps x %d", ld_aux, ntaps, H);
    int deepest;
    if ((rc = target_request_depth(c, m->nlayers, m->full, taps, ntaps, last || logits, &deepest, err))) return rc;
    int max_seqlen = 0;
    for (int s = 0; s < b->nseq; s++)
        if (b->cu_seqlens[s + 1] - b->cu_seqlens[s] > max_seqlen) max_seqlen = b->cu_seqlens[s + 1] - b->cu_seqlens[s];

    /* batch upload through the pinned stage, once the previous upload from it has completed */
    CHECK_CUDA(cudaEventSynchronize(m->staged));
    memcpy(m->h_stage, b->input_ids, sizeof(int32_t) * (size_t)T);
    memcpy(m->h_stage + T, b->positions, sizeof(int32_t) * (size_t)T);
    memcpy(m->h_stage + 2 * T, b->cu_seqlens, sizeof(int32_t) * (size_t)(b->nseq + 1));
    int32_t *d_ids = m->d_ids;
    CHECK_CUDA(cudaMemcpyAsync(d_ids, m->h_stage, sizeof(int32_t) * (size_t)(2 * T + b->nseq + 1),
                               cudaMemcpyHostToDevice, m->stream));
    CHECK_CUDA(cudaEventRecord(m->staged, m->stream));

    m->nev = 0;
    for (int i = 0; i < TARGET_CUDA_NCLASS; i++) m->prof_ms[i] = 0;
    target_cuda_mark(m, TARGET_CUDA_COPY);
    tc_rows rows = {.T = T, .nseq = b->nseq, .max_seqlen = max_seqlen, .ids = d_ids, .pos = d_ids + T,
                    .cu = d_ids + 2 * T};
    target_cuda_run_layers(m, &rows, NULL, deepest, taps, ntaps, aux, ld_aux, last, logits, NULL, 0);
    return 0;
}
