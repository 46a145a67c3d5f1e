/* target_decode_cuda: decoding on the CUDA target, generic part. What the cache holds per layer is the family's
 * (target_cuda_ops cache_new: the dense family's keys and values; the hybrid family's also the linear-attention
 * states, whose crop re-runs the kept tokens of the last forward as on the CPU); whether a family decodes at all is
 * its row's can[TARGET_BACKEND_CUDA], checked first. Per step the host builds the rows' ids, absolute positions,
 * sequence indices, cu_seqlens and the rows whose logits are wanted, uploads them through a pinned stage, and runs
 * the target's layer loop (target_cuda_run_layers) with the cache attached. Lengths live on the host.
 * CUDA graphs: when the family's row says its step is capturable (target_cuda_ops.step_graph), a step against the
 * cache (not a packed prefill) is keyed by what its launches bake in (rows, sequences, taps, output buffers); the
 * second time a key is seen its layer loop is captured once, and from then on that step is the staging upload plus
 * one graph launch. The captured attention is launched for the cache's whole length (kv max_pos = max_len - 1):
 * kv_attention's partials and combine depend only on each row's position, so the bits are those of the step
 * launched kernel by kernel. */
#include "target_decode_cuda.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "target_model_cuda_impl.h"

#define TC_GRAPHS 16       /* captured step shapes kept per cache (the least recently used one is replaced) */
#define TC_GRAPH_TAPS 16

/* A step shape and what its launches bake in: T rows of nrun sequences (the stage's offsets), the taps and the
 * buffers they and the logits go to. */
typedef struct step_graph {
    int T, nrun, last_only, ntaps, ld_aux;
    int taps[TC_GRAPH_TAPS];
    const void *aux, *logits;
    int seen;                    /* steps of this key launched kernel by kernel so far */
    cudaGraphExec_t exec;        /* NULL until captured */
    unsigned long long used;     /* the step count at its last use */
} step_graph;

struct target_cuda_cache {
    target_cuda *m;
    int nseq, max_len, max_step;
    int *len;                    /* (nseq) host */
    int *past;                   /* (nseq) host: a step's lengths before it, for the family's cache_begin */
    void *state;                 /* the family's part (cache_new) */
    size_t bytes;
    int32_t *d_stage, *h_stage;  /* ids | pos | seq | cu | logit rows */
    cudaEvent_t staged;
    int graphs;                  /* 1: capturable steps run as CUDA graphs */
    step_graph g[TC_GRAPHS];
    int ngraphs;                 /* slots of g in use */
    unsigned long long steps;
    int captured;                /* graphs captured over the cache's life */
    long long replayed;          /* steps run as a graph launch */
};

int target_cuda_cache_create(target_cuda_cache **out, target_cuda *m, int nseq, int max_len, int max_step_tokens,
                             errbuf *err)
{
    const hf_config *c = &m->cfg;
    int rc = target_family_require(c, TARGET_BACKEND_CUDA, TARGET_CAN_DECODE, "decoding with a KV cache", NULL, err);
    if (rc) return rc;
    if (!m->full)
        return errbuf_set(err, EINVAL, "decoding needs the whole target (final norm and lm_head), not layers 0..%d",
                          m->nlayers - 1);
    if (nseq <= 0 || max_len <= 0 || max_step_tokens <= 0)
        return errbuf_set(err, EINVAL, "KV cache: %d sequences, %d positions and %d tokens a step must be positive",
                          nseq, max_len, max_step_tokens);
    if (max_step_tokens > m->max_tokens || nseq > m->max_seqs)
        return errbuf_set(err, EINVAL, "KV cache: %d tokens a step over %d sequences exceeds the target's workspace "
                          "(%d tokens, %d sequences)", max_step_tokens, nseq, m->max_tokens, m->max_seqs);
    target_cuda_cache *k = xcalloc(1, sizeof *k);
    k->m = m, k->nseq = nseq, k->max_len = max_len, k->max_step = max_step_tokens;
    if ((rc = m->ops->cache_new(m, nseq, max_len, max_step_tokens, &k->state, &k->bytes, err))) {
        free(k);
        return rc;
    }
    k->len = xcalloc((size_t)nseq, sizeof *k->len);
    k->past = xcalloc((size_t)nseq, sizeof *k->past);
    size_t nstage = 3 * (size_t)max_step_tokens + 2 * (size_t)nseq + 1;
    CHECK_CUDA(cudaMalloc((void **)&k->d_stage, nstage * sizeof(int32_t)));
    CHECK_CUDA(cudaMallocHost((void **)&k->h_stage, nstage * sizeof(int32_t)));
    CHECK_CUDA(cudaEventCreateWithFlags(&k->staged, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventRecord(k->staged, m->stream));
    const char *env = getenv("DFLASH_DECODE_GRAPHS"); /* "0": every step kernel by kernel (a check of the graphs) */
    k->graphs = !(env && !strcmp(env, "0"));
    *out = k;
    return 0;
}

static void graph_drop(target_cuda_cache *k, step_graph *g)
{
    if (g->exec) {
        CHECK_CUDA(cudaStreamSynchronize(k->m->stream)); /* a launch of it may still be in flight */
        CHECK_CUDA(cudaGraphExecDestroy(g->exec));
    }
    memset(g, 0, sizeof *g);
}

void target_cuda_cache_set_graphs(target_cuda_cache *k, int on)
{
    k->graphs = on != 0;
    if (!on) {
        for (int i = 0; i < k->ngraphs; i++) graph_drop(k, &k->g[i]);
        k->ngraphs = 0;
    }
}

void target_cuda_cache_graph_stats(const target_cuda_cache *k, int *captured, long long *replayed)
{
    *captured = k->captured;
    *replayed = k->replayed;
}

void target_cuda_cache_destroy(target_cuda_cache **kp)
{
    target_cuda_cache *k = *kp;
    if (!k) return;
    CHECK_CUDA(cudaStreamSynchronize(k->m->stream));
    target_cuda_cache_set_graphs(k, 0);
    k->m->ops->cache_destroy(k->state);
    CHECK_CUDA(cudaFree(k->d_stage));
    CHECK_CUDA(cudaFreeHost(k->h_stage));
    CHECK_CUDA(cudaEventDestroy(k->staged));
    free(k->len);
    free(k->past);
    free(k);
    *kp = NULL;
}

int target_cuda_cache_length(const target_cuda_cache *k, int seq) { return k->len[seq]; }
size_t target_cuda_cache_bytes(const target_cuda_cache *k) { return k->bytes; }

/* The graph slot of a step against the cache, found or made (replacing the least recently used one); NULL when the
 * step is not captured: graphs off, a family whose step is not capturable, a packed prefill, a crop's re-run, the
 * profiling mode (its events), the legacy default stream (not capturable), more taps than a key holds. */
static step_graph *graph_slot(target_cuda_cache *k, int T, int nrun, const int *taps, int ntaps, const uint16_t *aux,
                              int ld_aux, const uint16_t *logits, int last_only, int packed, int keep)
{
    const target_cuda *m = k->m;
    if (!k->graphs || !m->ops->step_graph || m->ops->cache_begin || packed || !keep || m->profiling || !m->stream ||
        ntaps > TC_GRAPH_TAPS)
        return NULL;
    step_graph key = {.T = T, .nrun = nrun, .last_only = last_only != 0, .ntaps = ntaps, .ld_aux = ntaps ? ld_aux : 0,
                      .aux = ntaps ? aux : NULL, .logits = logits};
    for (int i = 0; i < ntaps; i++) key.taps[i] = taps[i];
    step_graph *g = NULL, *lru = NULL;
    for (int i = 0; i < k->ngraphs && !g; i++) {
        step_graph *e = &k->g[i];
        if (e->T == key.T && e->nrun == key.nrun && e->last_only == key.last_only && e->ntaps == key.ntaps &&
            e->ld_aux == key.ld_aux && e->aux == key.aux && e->logits == key.logits &&
            !memcmp(e->taps, key.taps, sizeof key.taps))
            g = e;
        if (!lru || e->used < lru->used) lru = e;
    }
    if (!g) {
        if (k->ngraphs < TC_GRAPHS) g = &k->g[k->ngraphs++];
        else graph_drop(k, g = lru);
        *g = key;
    }
    g->used = ++k->steps;
    return g;
}

/* target_cuda_cache_forward; keep as the family's cache_begin takes it (0: a crop re-runs tokens). */
static int cache_step(target_cuda_cache *k, int nrun, const int *seqs, const int *n, const int32_t *ids,
                      const int *taps, int ntaps, uint16_t *aux, int ld_aux, uint16_t *logits, int last_only, int keep,
                      errbuf *err)
{
    target_cuda *m = k->m;
    const hf_config *c = &m->cfg;
    if (nrun <= 0 || nrun > k->nseq)
        return errbuf_set(err, EINVAL, "decode step over %d sequences (the cache has %d)", nrun, k->nseq);
    int T = 0, all_empty = 1, max_pos = 0, max_n = 0;
    for (int i = 0; i < nrun; i++) {
        int s = seqs[i];
        if (s < 0 || s >= k->nseq)
            return errbuf_set(err, EINVAL, "decode step: sequence %d is outside the cache's %d", s, k->nseq);
        for (int j = 0; j < i; j++)
            if (seqs[j] == s) return errbuf_set(err, EINVAL, "decode step: sequence %d appears twice", s);
        if (n[i] <= 0) return errbuf_set(err, EINVAL, "decode step: %d tokens for sequence %d", n[i], s);
        if (k->len[s] + n[i] > k->max_len)
            return errbuf_set(err, ENOSPC, "sequence %d: %d cached + %d new tokens exceed the cache's %d positions", s,
                              k->len[s], n[i], k->max_len);
        if (k->len[s]) all_empty = 0;
        if (k->len[s] + n[i] - 1 > max_pos) max_pos = k->len[s] + n[i] - 1;
        if (n[i] > max_n) max_n = n[i];
        T += n[i];
    }
    if (T > k->max_step)
        return errbuf_set(err, EINVAL, "decode step of %d tokens exceeds the cache's %d a step", T, k->max_step);
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab_size)
            return errbuf_set(err, EINVAL, "decode step: token id %d at row %d is outside the vocabulary (%d)", ids[t],
                              t, c->vocab_size);
    if (!aux) ntaps = 0;
    if (aux && ld_aux < ntaps * c->hidden_size)
        return errbuf_set(err, EINVAL, "aux row stride %d is below %d taps x %d", ld_aux, ntaps, c->hidden_size);
    int deepest, rc = target_request_depth(c, m->nlayers, m->full, taps, ntaps, logits != NULL, &deepest, err);
    if (rc) return rc;
    deepest = c->num_layers - 1; /* every layer, whatever the taps: the cache needs each layer's rows (or states) */

    CHECK_CUDA(cudaEventSynchronize(k->staged));
    int32_t *h = k->h_stage, *h_pos = h + T, *h_seq = h + 2 * T, *h_cu = h + 3 * T, *h_rows = h_cu + nrun + 1;
    memcpy(h, ids, sizeof(int32_t) * (size_t)T);
    h_cu[0] = 0;
    for (int i = 0, t = 0; i < nrun; i++) {
        for (int j = 0; j < n[i]; j++, t++) h_pos[t] = k->len[seqs[i]] + j, h_seq[t] = seqs[i];
        h_cu[i + 1] = t;
        h_rows[i] = t - 1;
    }
    size_t nstage = 3 * (size_t)T + 2 * (size_t)nrun + 1;
    CHECK_CUDA(cudaMemcpyAsync(k->d_stage, h, nstage * sizeof(int32_t), cudaMemcpyHostToDevice, m->stream));
    CHECK_CUDA(cudaEventRecord(k->staged, m->stream));
    if (m->ops->cache_begin) {
        int *past = k->past;
        for (int i = 0; i < nrun; i++) past[i] = k->len[seqs[i]];
        m->ops->cache_begin(k->state, nrun, seqs, past, n, ids, keep);
    }
    const int32_t *d = k->d_stage;
    tc_rows rows = {.T = T, .nseq = nrun, .max_seqlen = max_n, .ids = d, .pos = d + T, .cu = d + 3 * T};
    tc_kv_cache kv = {.state = k->state, .seq = d + 2 * T, .pos = d + T, .max_pos = max_pos, .packed = all_empty};
    m->nev = 0;
    for (int i = 0; i < TARGET_CUDA_NCLASS; i++) m->prof_ms[i] = 0;
    const int32_t *logit_rows = last_only ? d + 3 * T + nrun + 1 : NULL;
    step_graph *g = graph_slot(k, T, nrun, taps, ntaps, aux, ld_aux, logits, last_only, all_empty, keep);
    if (g) kv.max_pos = k->max_len - 1; /* the launches of any step of this shape (same bits: the file's header) */
    if (g && !g->exec && g->seen > 0) { /* the second step of this shape: its kernels and GEMM plans exist */
        cudaGraph_t graph;
        CHECK_CUDA(cudaStreamBeginCapture(m->stream, cudaStreamCaptureModeThreadLocal));
        target_cuda_run_layers(m, &rows, &kv, deepest, taps, ntaps, aux, ld_aux, NULL, logits, logit_rows, nrun);
        CHECK_CUDA(cudaStreamEndCapture(m->stream, &graph));
        CHECK_CUDA(cudaGraphInstantiate(&g->exec, graph, 0));
        CHECK_CUDA(cudaGraphDestroy(graph));
        k->captured++;
    }
    if (g && g->exec) {
        CHECK_CUDA(cudaGraphLaunch(g->exec, m->stream));
        k->replayed++;
    } else {
        target_cuda_run_layers(m, &rows, &kv, deepest, taps, ntaps, aux, ld_aux, NULL, logits, logit_rows, nrun);
        if (g) g->seen++;
    }
    for (int i = 0; i < nrun; i++) k->len[seqs[i]] += n[i];
    return 0;
}

int target_cuda_cache_forward(target_cuda_cache *k, int nrun, const int *seqs, const int *n, const int32_t *ids,
                              const int *taps, int ntaps, uint16_t *aux, int ld_aux, uint16_t *logits, int last_only,
                              errbuf *err)
{
    return cache_step(k, nrun, seqs, n, ids, taps, ntaps, aux, ld_aux, logits, last_only, 1, err);
}

int target_cuda_cache_crop(target_cuda_cache *k, int seq, int len, errbuf *err)
{
    if (seq < 0 || seq >= k->nseq)
        return errbuf_set(err, EINVAL, "crop: sequence %d is outside the cache's %d", seq, k->nseq);
    if (len < 0 || len > k->len[seq])
        return errbuf_set(err, EINVAL, "crop: sequence %d holds %d positions, cannot keep %d", seq, k->len[seq], len);
    if (!k->m->ops->cache_crop) {
        k->len[seq] = len;
        return 0;
    }
    int from = len;
    const int32_t *rerun = NULL;
    int n = k->m->ops->cache_crop(k->state, seq, len, k->len[seq], &from, &rerun, err);
    if (n < 0) return n;
    k->len[seq] = from;
    if (n > 0) { /* the family's states rebuilt from before the last forward: its first n tokens again */
        int rc = cache_step(k, 1, &seq, &n, rerun, NULL, 0, NULL, 0, NULL, 0, 0, err);
        DF_ASSERT(rc == 0); /* the same tokens it already ran, at the same positions */
    }
    k->len[seq] = len;
    return 0;
}
