/* target_model_cuda: the CUDA target's generic part: the family chosen from the config (target_family_of) and its
 * CUDA operations (target_family_cuda_ops), the frozen tables and final norm under the family's names, RoPE
 * frequencies over the family's rotary dimensions, the batch staging, and the layer loop: embedding, the family's
 * layers, each writing its output where it is wanted (a tap block, the last buffer, or x), the final norm and
 * lm_head. No family branch here: what varies is in the family's row. */
#include "target_model_cuda.h"
#include "target_model_cuda_impl.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "embedding.h"
#include "gemv.h"
#include "log.h"
#include "matmul.h"
#include "rand_fill.h"
#include "rmsnorm.h"
#include "rope.h"
#include "safetensors.h"
#include "target_arena_cuda.h"

/* Every device buffer of the model, in one order (a kept arena's layout): the tables, the final norm, the RoPE
 * frequencies, the residual stream and the batch staging, then the family's (ops->create). */
static int tc_buffers(target_cuda *m, errbuf *err)
{
    const hf_config *c = &m->cfg;
    size_t H = (size_t)c->hidden_size, V = (size_t)c->vocab_size, t = (size_t)m->max_tokens;
    m->embed = target_cuda_alloc(m, V * H * 2);
    m->lm_head = c->tie_embeddings ? m->embed : target_cuda_alloc(m, V * H * 2);
    if (m->full) m->final_norm = target_cuda_alloc(m, H * 2);
    m->d_inv_freq = target_cuda_alloc(m, sizeof(double) * (size_t)m->fam->rope_dims(c) / 2);
    m->x = target_cuda_alloc(m, t * H * 2);
    m->u = target_cuda_alloc(m, t * H * 2);
    m->d_ids = target_cuda_alloc(m, (2 * t + (size_t)m->max_seqs + 1) * sizeof(int32_t));
    return m->ops->create(m, err);
}

static void layout_words(const target_cuda *m, const target_arena *a, char *out, size_t n)
{
    snprintf(out, n, "family %s, layers %d of %d%s, bf16, workspaces for %d tokens in %d sequences, %zu buffers, "
             "%zu bytes (layout %016llx)", m->fam->name, m->nlayers, m->cfg.num_layers,
             m->full ? " + final norm + lm_head" : "", m->max_tokens, m->max_seqs, target_arena_buffers(a),
             target_arena_bytes(a), (unsigned long long)target_arena_layout(a));
}

/* The arena of a kept model (m->arena): the deposited allocation when it is large enough for this layout (as it is
 * when its header names this identity and layout, else cleared for a reload), else a new one. want: the header the
 * weights will have once loaded. */
static int keep_map(target_cuda *m, target_cuda_keep *keep, target_arena_header *want, errbuf *err)
{
    target_arena *probe = target_arena_measure();
    m->arena = probe;
    int rc = tc_buffers(m, err); /* hands out NULL: only sizes and their order */
    size_t need = target_arena_bytes(probe);
    memset(want, 0, sizeof *want);
    want->magic = TARGET_ARENA_MAGIC;
    want->layout_digest = target_arena_layout(probe);
    layout_words(m, probe, want->layout, sizeof want->layout);
    snprintf(want->identity, sizeof want->identity, "%s", keep->identity);
    m->ops->destroy(m);
    m->embed = m->lm_head = m->final_norm = m->x = m->u = NULL;
    m->d_inv_freq = NULL;
    m->d_ids = NULL;
    m->device_bytes = (size_t)64 << 20; /* the cuBLASLt workspace; the buffers are counted again below */
    m->arena = NULL;
    target_arena_destroy(&probe);
    if (rc) return rc;
    int dev;
    CHECK_CUDA(cudaGetDevice(&dev));
    keep->why[0] = '\0';
    if (keep->fd >= 0 && keep->bytes < need) {
        snprintf(keep->why, sizeof keep->why, "the deposited allocation (%zu bytes) is too small for the layout now "
                 "(%s)", keep->bytes, want->layout);
        log_warn("the deposited target weights were not reused: %s", keep->why);
    } else if (keep->fd >= 0) {
        if ((rc = target_arena_map(&m->arena, dev, keep->fd, keep->bytes, err))) return rc;
        target_arena_header h;
        target_arena_header_read(m->arena, &h);
        if (h.magic != TARGET_ARENA_MAGIC)
            snprintf(keep->why, sizeof keep->why, "it holds no complete weights (a load into it was interrupted)");
        else if (h.layout_digest != want->layout_digest || strcmp(h.layout, want->layout))
            snprintf(keep->why, sizeof keep->why, "layout changed: was %.400s; now %.400s", h.layout, want->layout);
        else if (strcmp(h.identity, want->identity))
            snprintf(keep->why, sizeof keep->why, "checkpoint identity changed: was %.480s; now %.480s", h.identity,
                     want->identity);
        if (!keep->why[0]) {
            keep->result = TARGET_KEEP_REIMPORTED;
            return 0;
        }
        log_warn("the deposited target weights were not reused: %s", keep->why); /* said before the load starts */
        target_arena_header_write(m->arena, NULL); /* a reload killed half-way is never taken for weights */
        keep->result = TARGET_KEEP_RELOADED;
        return 0;
    }
    keep->result = TARGET_KEEP_NEW;
    return target_arena_map(&m->arena, dev, -1, need, err);
}

/* Everything but the weights' values: stream, cuBLASLt, the tables, inv_freq, workspaces, the family's layers; in a
 * kept arena when keep is given (keep_map). */
static int tc_create(target_cuda **out, const hf_config *cfg, int nlayers, int full, int max_tokens, int max_seqs,
                     void *stream, target_cuda_keep *keep, target_arena_header *want, errbuf *err)
{
    const target_family *fam;
    int rc = target_family_require(cfg, TARGET_BACKEND_CUDA, TARGET_CAN_FORWARD, "the target forward", &fam, err);
    if (rc) return rc;
    if (max_tokens <= 0 || max_seqs <= 0)
        return errbuf_set(err, EINVAL, "target_cuda: max_tokens %d and max_seqs %d must be positive", max_tokens,
                          max_seqs);
    if (cfg->head_dim % 2 || cfg->num_kv_heads <= 0 || cfg->num_heads % cfg->num_kv_heads)
        return errbuf_set(err, EINVAL, "target_cuda: head_dim %d / heads %d / kv heads %d unsupported", cfg->head_dim,
                          cfg->num_heads, cfg->num_kv_heads);
    target_cuda *m = xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    m->fam = fam;
    m->ops = target_family_cuda_ops(fam);
    m->nlayers = nlayers;
    m->full = full;
    m->max_tokens = max_tokens, m->max_seqs = max_seqs;
    m->gemv_rows = GEMV_DEFAULT_ROWS;
    if (stream) {
        m->stream = (cudaStream_t)stream;
    } else {
        CHECK_CUDA(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
        m->own_stream = 1;
    }
    m->mm = matmul_cuda_create(0);
    m->device_bytes += (size_t)64 << 20;
    if ((keep && (rc = keep_map(m, keep, want, err))) || (rc = tc_buffers(m, err))) {
        target_cuda_destroy(&m);
        return rc;
    }

    const hf_config *c = &m->cfg;
    const size_t rd = (size_t)fam->rope_dims(c);
    double *inv = xmalloc(sizeof(double) * rd / 2);
    rope_params rp = {.theta = c->rope_theta, .llama3 = c->rope_llama3, .factor = c->rope_factor,
                      .low_freq_factor = c->rope_low_freq_factor, .high_freq_factor = c->rope_high_freq_factor,
                      .original_max_position = c->rope_original_max_position, .yarn = c->rope_yarn,
                      .beta_fast = c->rope_beta_fast, .beta_slow = c->rope_beta_slow, .truncate = c->rope_truncate};
    rope_inv_freq(inv, (int)rd, &rp);
    /* as target_model.c: a bf16 checkpoint's reference rotates with bf16-rounded frequencies */
    if (!strcmp(c->torch_dtype, "bfloat16"))
        for (size_t i = 0; i < rd / 2; i++) inv[i] = bf16_to_f32(f32_to_bf16((float)inv[i]));
    CHECK_CUDA(cudaMemcpy(m->d_inv_freq, inv, sizeof(double) * rd / 2, cudaMemcpyHostToDevice));
    free(inv);

    size_t nstage = 2 * (size_t)max_tokens + (size_t)max_seqs + 1;
    CHECK_CUDA(cudaMallocHost((void **)&m->h_stage, nstage * sizeof(int32_t)));
    CHECK_CUDA(cudaEventCreateWithFlags(&m->staged, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventRecord(m->staged, m->stream));
    *out = m;
    return 0;
}

/* The final norm `name` (n) as bf16(w + add): a plain upload when add is 0 (bf16 bits kept as they are). */
static int upload_norm(const st_file *st, const char *name, uint16_t *dst, int n, float add, errbuf *err)
{
    if (add == 0.0f) return target_cuda_upload_tensor(st, name, dst, n, 0, err);
    float *f = NULL;
    int64_t shape[1] = {n};
    int rc = st_load_f32(st, name, &f, 1, shape, NULL, err);
    if (!rc) target_cuda_put(dst, f, (size_t)n, add);
    free(f);
    return rc;
}

/* Test-only fault hook (tests/gpu/gpu_keep_weights.sh): with DFLASH_FAULT_TARGET_LOAD_KILL=<file>, a load into a kept
 * arena that finds the file removes it and SIGKILLs its own process half-way (tables written, layers not): the
 * next instance must see an interrupted load, never weights. */
static void fault_kill_in_load(void)
{
    const char *f = getenv("DFLASH_FAULT_TARGET_LOAD_KILL");
    if (!f || unlink(f) != 0) return;
    log_warn("fault hook DFLASH_FAULT_TARGET_LOAD_KILL=%s: killed half-way through the load", f);
    CHECK_CUDA(cudaDeviceSynchronize());
    raise(SIGKILL);
}

/* target_cuda_load, into a kept arena when keep is given: a re-imported one reads nothing from the checkpoint, a
 * loaded one gets its header once the weights are complete. */
static int tc_load(target_cuda **out, const char *dir, int max_layer, int max_tokens, int max_seqs, void *stream,
                   target_cuda_keep *keep, errbuf *err)
{
    hf_config cfg;
    st_file *st = NULL;
    target_cuda *m = NULL;
    target_arena_header want;
    int rc = hf_config_load(&cfg, dir, err);
    if (rc) return rc;
    if (max_layer >= cfg.num_layers)
        return errbuf_set(err, EINVAL, "%s: layer %d requested but the model has %d layers", dir, max_layer,
                          cfg.num_layers);
    if (keep && strlen(keep->identity) >= sizeof want.identity)
        return errbuf_set(err, EINVAL, "%s: a checkpoint identity of %zu characters (at most %zu are kept)", dir,
                          strlen(keep->identity), sizeof want.identity - 1);
    int full = max_layer < 0, nlayers = full ? cfg.num_layers : max_layer + 1;
    rc = tc_create(&m, &cfg, nlayers, full, max_tokens, max_seqs, stream, keep, &want, err);
    if (rc) return rc;
    if (keep && keep->result == TARGET_KEEP_REIMPORTED) {
        *out = m;
        return 0;
    }
    if ((rc = st_open(&st, dir, err))) goto fail;
    const hf_config *c = &m->cfg;
    target_tables tb;
    rc = target_tables_find(c, st, &tb, err);
    if (!rc) rc = target_cuda_upload_tensor(st, tb.embed, m->embed, c->vocab_size, c->hidden_size, err);
    if (!rc && !tb.tied)
        rc = target_cuda_upload_tensor(st, tb.lm_head, m->lm_head, c->vocab_size, c->hidden_size, err);
    if (!rc && full) rc = upload_norm(st, tb.norm, m->final_norm, c->hidden_size, tb.norm_add, err);
    if (!rc && keep) fault_kill_in_load();
    if (!rc) rc = m->ops->load(m, st, m->fam->prefix(st), err);
    if (rc) goto fail;
    st_close(&st);
    if (keep) {
        want.bytes = target_arena_size(m->arena);
        target_arena_header_write(m->arena, &want);
    }
    *out = m;
    return 0;
fail:
    st_close(&st);
    target_cuda_destroy(&m);
    return rc;
}

int target_cuda_load(target_cuda **out, const char *dir, int max_layer, int max_tokens, int max_seqs, void *stream,
                     errbuf *err)
{
    return tc_load(out, dir, max_layer, max_tokens, max_seqs, stream, NULL, err);
}

int target_cuda_load_kept(target_cuda **out, const char *dir, int max_layer, int max_tokens, int max_seqs, void *stream,
                          target_cuda_keep *keep, errbuf *err)
{
    return tc_load(out, dir, max_layer, max_tokens, max_seqs, stream, keep, err);
}

int target_cuda_keep_export(const target_cuda *m, int *fd, size_t *bytes, errbuf *err)
{
    if (!m->arena) return errbuf_set(err, EINVAL, "target_cuda: this model keeps no device allocation");
    return target_arena_export(m->arena, fd, bytes, err);
}

int target_cuda_init_random(target_cuda **out, const hf_config *cfg, uint64_t seed, float init_std, int max_tokens,
                            int max_seqs, void *stream, errbuf *err)
{
    target_cuda *m = NULL;
    int rc = tc_create(&m, cfg, cfg->num_layers, 1, max_tokens, max_seqs, stream, NULL, NULL, err);
    if (rc) return rc;
    const hf_config *c = &m->cfg;
    size_t H = (size_t)c->hidden_size, V = (size_t)c->vocab_size;
    float a = init_std * sqrtf(3.0f); /* uniform [-a, a) has standard deviation a/sqrt(3) */
    uint64_t s = seed;
    rand_fill_bf16_cuda(m->embed, V * H, s++, a, 0.0f, m->stream);
    if (m->lm_head != m->embed) rand_fill_bf16_cuda(m->lm_head, V * H, s++, a, 0.0f, m->stream);
    rand_fill_bf16_cuda(m->final_norm, H, s++, 0.0f, 1.0f, m->stream);
    m->ops->init_random(m, &s, a);
    CHECK_CUDA(cudaStreamSynchronize(m->stream));
    *out = m;
    return 0;
}

void target_cuda_destroy(target_cuda **mp)
{
    target_cuda *m = *mp;
    if (!m) return;
    CHECK_CUDA(cudaStreamSynchronize(m->stream));
    if (m->ops) m->ops->destroy(m);
    if (m->lm_head != m->embed) target_cuda_free(&m->lm_head);
    void *bufs[] = {&m->embed, &m->final_norm, &m->d_inv_freq, &m->x, &m->u, &m->d_ids};
    for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++) target_cuda_free(bufs[j]);
    if (m->h_stage) CHECK_CUDA(cudaFreeHost(m->h_stage));
    if (m->staged) CHECK_CUDA(cudaEventDestroy(m->staged));
    for (int i = 0; i < TC_MAX_EVENTS; i++)
        if (m->ev[i]) CHECK_CUDA(cudaEventDestroy(m->ev[i]));
    matmul_cuda_destroy(&m->mm);
    target_arena_destroy(&m->arena);
    if (m->own_stream) CHECK_CUDA(cudaStreamDestroy(m->stream));
    free(m);
    *mp = NULL;
}

const hf_config *target_cuda_config(const target_cuda *m) { return &m->cfg; }
void *target_cuda_stream(const target_cuda *m) { return m->stream; }
const uint16_t *target_cuda_embedding(const target_cuda *m) { return m->embed; }
const uint16_t *target_cuda_lm_head(const target_cuda *m) { return m->lm_head; }
size_t target_cuda_device_bytes(const target_cuda *m) { return m->device_bytes; }

void target_cuda_set_gemv_rows(target_cuda *m, int rows)
{
    m->gemv_rows = rows < 0 ? 0 : rows > GEMV_MAX_M ? GEMV_MAX_M : rows;
}

void target_cuda_set_for_verification(target_cuda *m) { target_cuda_set_gemv_rows(m, 0); }

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

static uint16_t *layer_dst(target_cuda *m, int li, const int *taps, int ntaps, uint16_t *aux, int ld_aux,
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

static void layer_copies(target_cuda *m, int li, int first_tap, const int *taps, int ntaps, uint16_t *aux,
                              int ld_aux, uint16_t *last, const uint16_t *r, int ldr, int T)
{
    const int H = m->cfg.hidden_size;
    for (int i = first_tap + 1; first_tap >= 0 && i < ntaps; i++)
        if (taps[i] == li) tc_copy_rows(m, aux + (size_t)i * H, ld_aux, r, ldr, T, H);
    if (first_tap >= 0 && last && li == m->cfg.num_layers - 1) tc_copy_rows(m, last, H, r, ldr, T, H);
    target_cuda_mark(m, TARGET_CUDA_COPY);
}

static void finish(target_cuda *m, const uint16_t *r, int ldr, int T, uint16_t *logits,
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
        target_cuda_linear(m, logits, c->vocab_size, NULL, 0, 0.0f, rows_in, H, m->lm_head, n, c->vocab_size, H);
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
    const int T = rows->T, H = m->cfg.hidden_size;
    embedding_forward_cuda(m->x, rows->ids, T, m->embed, H, m->stream);
    target_cuda_mark(m, TARGET_CUDA_OTHER);
    uint16_t *r = m->x; /* the residual stream: x, or the tap block / last buffer the previous layer wrote */
    int ldr = H;
    for (int li = 0; li <= deepest; li++) {
        /* where this layer's output goes: its first tap block, else the caller's last buffer (last layer), else x */
        int ldd, first_tap;
        uint16_t *dst = layer_dst(m, li, taps, ntaps, aux, ld_aux, last, &ldd, &first_tap);
        m->ops->layer(m, li, rows, kv, r, ldr, dst, ldd);
        r = dst, ldr = ldd;
        /* a layer tapped twice, or tapped and also the requested last output: copies (rare) */
        layer_copies(m, li, first_tap, taps, ntaps, aux, ld_aux, last, r, ldr, T);
    }
    finish(m, r, ldr, T, logits, logit_rows, nlogit);
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
