/* generate_cuda: the GPU decoder of `dflash generate --backend cuda` (built into dflash-cuda only; see
 * generate_impl.h). Continuous batching over one KV cache of j->batch slots: each round first admits the next
 * prompts (file order) into the free slots and prefills them in one packed step (whole prompts, at most
 * PREFILL_TOKENS rows unless one prompt is longer), then runs one decode step over every active slot (one token
 * each). After a step: the logits checked for NaN and infinities (a flag per sequence on the device, copied back with
 * the ids: poisoned weights fail naming the first weight that is not finite), --suppress ids set to -inf, argmax on
 * the device, the ids copied back, each answer extended;
 * a finished answer is published to the in-order writer and its slot reused (cropped to 0). Nothing else lives
 * here: options, resume, writing and progress are generate.c's. */
#include "generate_impl.h"

#ifdef DFLASH_CUDA

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "argmax.h"
#include "cuda_check.h"
#include "logits_mask.h"
#include "nonfinite.h"
#include "target_decode_cuda.h"
#include "target_model_cuda.h"
#include "weights_check.h"

#define PREFILL_TOKENS 4096

typedef struct slot {
    int64_t i;   /* index into j->todo / j->res; -1: free */
    int limit;   /* answer tokens at most */
    int32_t last; /* the newest token, the next step's input */
} slot;

typedef struct gpu {
    target_cuda *m;
    target_cuda_cache *c;
    void *stream;
    uint16_t *d_logits;  /* (batch, V) bf16: each sequence's last row */
    int32_t *d_next, *h_next, *d_suppress;
    uint32_t *d_bad, *h_bad; /* (batch): a step's row r holds a NaN or an infinity */
    int V;
} gpu;

/* One step: forward of nrun sequences (seqs, n, ids), the next token of each into h_next[0..nrun). */
static int gpu_step(gpu *g, const gen_job *j, int nrun, const int *seqs, const int *n, const int32_t *ids,
                    errbuf *err)
{
    int rc = target_cuda_cache_forward(g->c, nrun, seqs, n, ids, NULL, 0, NULL, 0, g->d_logits, 1, err);
    if (rc) return rc;
    cudaStream_t st = (cudaStream_t)g->stream;
    /* the nrun rows (nrun, V) as one row of nrun groups: a flag per sequence, before the mask writes its -inf */
    CHECK_CUDA(cudaMemsetAsync(g->d_bad, 0, sizeof(uint32_t) * (size_t)nrun, st));
    nonfinite_groups_cuda(g->d_bad, g->d_logits, nrun * g->V, 1, nrun, g->V, g->stream);
    logits_mask_rows_cuda(g->d_logits, g->V, nrun, g->d_suppress, j->nsuppress, g->stream);
    argmax_rows_cuda(g->d_next, g->d_logits, g->V, nrun, g->V, g->stream);
    CHECK_CUDA(cudaMemcpyAsync(g->h_next, g->d_next, sizeof(int32_t) * (size_t)nrun, cudaMemcpyDeviceToHost, st));
    CHECK_CUDA(cudaMemcpyAsync(g->h_bad, g->d_bad, sizeof(uint32_t) * (size_t)nrun, cudaMemcpyDeviceToHost, st));
    CHECK_CUDA(cudaStreamSynchronize(st));
    for (int r = 0; r < nrun; r++) {
        if (!g->h_bad[r]) continue;
        char why[400];
        weights_explain_nonfinite(j->target_dir, why, sizeof why);
        return errbuf_set(err, ERANGE, "cache slot %d: the target's logits are not finite (NaN or inf): %s", seqs[r],
                          why);
    }
    for (int r = 0; r < nrun; r++) {
        int32_t t = g->h_next[r];
        int bad = t < 0 || t >= g->V;
        for (int k = 0; k < j->nsuppress && !bad; k++) bad = t == j->suppress[k];
        if (bad) /* every id left was -inf or NaN */
            return errbuf_set(err, ERANGE, "cache slot %d: the next token %d is not a valid, unsuppressed id of the "
                              "vocabulary (%d): the logits are -inf or NaN", seqs[r], t, g->V);
    }
    return 0;
}

/* Append token t to the answer of slot s; 1 when the answer is finished. */
static int take_token(gen_job *j, slot *s, int32_t t)
{
    result *r = &j->res[s->i];
    r->gen[r->n++] = t;
    s->last = t;
    atomic_fetch_add(&j->tokens, 1);
    if (gen_job_is_eos(j, t)) {
        r->stop = "eos";
        return 1;
    }
    return r->n == s->limit;
}

/* A step's next tokens (next[r] for slot seqs[r]) into their answers; a finished answer goes to the writer and frees
 * its slot. Returns how many finished. */
static int take_tokens(gen_job *j, slot *sl, const int *seqs, int nrun, const int32_t *next)
{
    int finished = 0;
    for (int r = 0; r < nrun; r++) {
        slot *s = &sl[seqs[r]];
        if (!take_token(j, s, next[r])) continue;
        gen_job_publish(j, s->i);
        s->i = -1;
        finished++;
    }
    return finished;
}

/* Whether --suppress names every id of the vocabulary (nothing left to generate). */
static int all_suppressed(const gen_job *j)
{
    int distinct = 0;
    for (int k = 0; k < j->nsuppress; k++) {
        int seen = 0;
        for (int q = 0; q < k && !seen; q++) seen = j->suppress[q] == j->suppress[k];
        distinct += !seen;
    }
    return distinct >= j->vocab;
}

void *generate_cuda_worker(void *arg)
{
    gen_job *j = arg;
    errbuf err = {{0}};
    gpu g = {.V = j->vocab};
    const int B = j->batch;
    int max_step = PREFILL_TOKENS; /* rows a step: the longest prompt in one prefill, every slot in one decode */
    if (j->longest > max_step) max_step = j->longest;
    if (B > max_step) max_step = B;
    slot *sl = xmalloc(sizeof *sl * (size_t)B);
    int *seqs = xmalloc(sizeof *seqs * (size_t)B), *n = xmalloc(sizeof *n * (size_t)B);
    int32_t *ids = xmalloc(sizeof *ids * (size_t)max_step);
    int64_t next = 0;
    int nactive = 0, rc = 0;
    DF_ASSERT(B >= 1 && max_step >= B);
    if (all_suppressed(j)) {
        rc = errbuf_set(&err, EINVAL, "every token id is suppressed (--suppress)");
        goto out;
    }
    rc = target_cuda_load(&g.m, j->target_dir, -1, max_step, B, NULL, &err);
    if (!rc && target_cuda_config(g.m)->vocab_size != j->vocab)
        rc = errbuf_set(&err, EINVAL, "%s: the CUDA target's vocabulary %d differs from config.json's %d",
                        j->target_dir, target_cuda_config(g.m)->vocab_size, j->vocab);
    if (!rc) rc = target_cuda_cache_create(&g.c, g.m, B, j->cache_len, max_step, &err);
    if (rc) goto out;
    g.stream = target_cuda_stream(g.m);
    CHECK_CUDA(cudaMalloc((void **)&g.d_logits, (size_t)B * (size_t)g.V * 2));
    CHECK_CUDA(cudaMalloc((void **)&g.d_next, sizeof(int32_t) * (size_t)B));
    CHECK_CUDA(cudaMallocHost((void **)&g.h_next, sizeof(int32_t) * (size_t)B));
    CHECK_CUDA(cudaMalloc((void **)&g.d_bad, sizeof(uint32_t) * (size_t)B));
    CHECK_CUDA(cudaMallocHost((void **)&g.h_bad, sizeof(uint32_t) * (size_t)B));
    if (j->nsuppress) {
        CHECK_CUDA(cudaMalloc((void **)&g.d_suppress, sizeof(int32_t) * (size_t)j->nsuppress));
        CHECK_CUDA(cudaMemcpy(g.d_suppress, j->suppress, sizeof(int32_t) * (size_t)j->nsuppress,
                              cudaMemcpyHostToDevice));
    }
    for (int k = 0; k < B; k++) sl[k].i = -1;

    while (!atomic_load(&j->failed) && (next < j->ntodo || nactive > 0)) {
        /* admit the next prompts into free slots: one packed prefill step (every sequence in it starts empty) */
        int nrun = 0, T = 0;
        for (int k = 0; k < B && next < j->ntodo; k++) {
            if (sl[k].i >= 0) continue;
            const prompt_line *p = &j->prompts->v[j->todo[next]];
            if (nrun > 0 && T + p->plen > max_step) break;
            if ((rc = target_cuda_cache_crop(g.c, k, 0, &err))) goto out;
            sl[k] = (slot){.i = next, .limit = gen_result_begin(j, p, &j->res[next])};
            memcpy(ids + T, p->ids, sizeof *ids * (size_t)p->plen);
            T += p->plen;
            seqs[nrun] = k, n[nrun++] = p->plen;
            next++;
        }
        if (nrun > 0) {
            nactive += nrun;
            if ((rc = gpu_step(&g, j, nrun, seqs, n, ids, &err))) {
                errbuf_wrap(&err, rc, "prefill of %d prompts (%d tokens) from line %" PRId64, nrun, T,
                            (int64_t)j->prompts->v[j->todo[sl[seqs[0]].i]].lineno);
                goto out;
            }
            nactive -= take_tokens(j, sl, seqs, nrun, g.h_next);
        }
        /* one token for every active slot */
        nrun = 0;
        for (int k = 0; k < B; k++)
            if (sl[k].i >= 0) seqs[nrun] = k, n[nrun] = 1, ids[nrun] = sl[k].last, nrun++;
        DF_ASSERT(nrun == nactive);
        if (nrun == 0) continue;
        if ((rc = gpu_step(&g, j, nrun, seqs, n, ids, &err))) {
            errbuf_wrap(&err, rc, "decode step over %d sequences", nrun);
            goto out;
        }
        nactive -= take_tokens(j, sl, seqs, nrun, g.h_next);
    }
out:
    if (rc) gen_job_fail(j, &err);
    if (g.d_logits) CHECK_CUDA(cudaFree(g.d_logits));
    if (g.d_next) CHECK_CUDA(cudaFree(g.d_next));
    if (g.h_next) CHECK_CUDA(cudaFreeHost(g.h_next));
    if (g.d_suppress) CHECK_CUDA(cudaFree(g.d_suppress));
    if (g.d_bad) CHECK_CUDA(cudaFree(g.d_bad));
    if (g.h_bad) CHECK_CUDA(cudaFreeHost(g.h_bad));
    target_cuda_cache_destroy(&g.c);
    target_cuda_destroy(&g.m);
    free(sl), free(seqs), free(n), free(ids);
    return NULL;
}

#endif
