/* spec_decode_cuda: see spec_decode_cuda.h. Every step ends with a host synchronisation (the next step's input is
 * the host's decision), so the target's stream and the drafter's never overlap: the drafter reads the committed
 * taps only after the target's stream has written them. */
#include "spec_decode_cuda.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "argmax.h"
#include "cuda_check.h"
#include "logits_mask.h"

struct spec_cuda {
    target_cuda *m;
    target_cuda_cache *c;
    drafter_infer_cuda *d;
    void *stream;            /* the target's */
    int V, max_len, B, K, KH;
    const int *taps;         /* the drafter's tap layers */
    uint16_t *ctx;           /* (max_len, KH) taps of the committed positions */
    uint16_t *baux;          /* (B, KH) taps of the verified block */
    uint16_t *logits;        /* (B, V) */
    int32_t *d_next, *h_next; /* (B) the target's greedy choices */
    int32_t *d_reserved;     /* (1) */
    int32_t reserved;        /* what d_reserved holds; -1: none */
};

int spec_cuda_create(spec_cuda **out, target_cuda *m, target_cuda_cache *c, drafter_infer_cuda *d, int max_len,
                     errbuf *err)
{
    const hf_config *tc = target_cuda_config(m);
    if (max_len < 2) return errbuf_set(err, EINVAL, "speculative decoding: %d positions", max_len);
    spec_cuda *s = xcalloc(1, sizeof *s);
    s->m = m, s->c = c, s->d = d, s->stream = target_cuda_stream(m), s->V = tc->vocab_size, s->max_len = max_len;
    s->B = 1;
    if (d) {
        const hf_config *dc = drafter_infer_cuda_config(d);
        s->B = dc->block_size, s->K = dc->num_taps, s->KH = dc->num_taps * dc->hidden_size, s->taps = dc->taps;
        CHECK_CUDA(cudaMalloc((void **)&s->ctx, (size_t)max_len * (size_t)s->KH * 2));
        CHECK_CUDA(cudaMalloc((void **)&s->baux, (size_t)s->B * (size_t)s->KH * 2));
    }
    CHECK_CUDA(cudaMalloc((void **)&s->logits, (size_t)s->B * (size_t)s->V * 2));
    CHECK_CUDA(cudaMalloc((void **)&s->d_next, sizeof(int32_t) * (size_t)s->B));
    CHECK_CUDA(cudaMallocHost((void **)&s->h_next, sizeof(int32_t) * (size_t)s->B));
    CHECK_CUDA(cudaMalloc((void **)&s->d_reserved, sizeof(int32_t)));
    s->reserved = -1;
    *out = s;
    return 0;
}

void spec_cuda_destroy(spec_cuda **sp)
{
    spec_cuda *s = *sp;
    if (!s) return;
    CHECK_CUDA(cudaStreamSynchronize((cudaStream_t)s->stream));
    if (s->ctx) CHECK_CUDA(cudaFree(s->ctx));
    if (s->baux) CHECK_CUDA(cudaFree(s->baux));
    CHECK_CUDA(cudaFree(s->logits));
    CHECK_CUDA(cudaFree(s->d_next));
    CHECK_CUDA(cudaFreeHost(s->h_next));
    CHECK_CUDA(cudaFree(s->d_reserved));
    free(s);
    *sp = NULL;
}

static int is_eos(const spec_opts *o, int32_t t)
{
    for (int i = 0; i < o->neos; i++)
        if (o->eos[i] == t) return 1;
    return 0;
}

static void result_init(spec_result *r, int max_new, int max_blocks)
{
    memset(r, 0, sizeof *r);
    r->tokens = xmalloc(sizeof(int32_t) * (size_t)(max_new > 0 ? max_new : 1));
    r->accepted = xmalloc(sizeof(int) * (size_t)(max_blocks > 0 ? max_blocks : 1));
}

/* Sequence 0 emptied, the reserved id on the device, room for the prompt and its answer. */
static int start_prompt(spec_cuda *s, int plen, const spec_opts *o, errbuf *err)
{
    if (plen + o->max_new > s->max_len)
        return errbuf_set(err, ENOSPC, "%d prompt tokens + %d new tokens exceed the cache (%d positions)", plen,
                          o->max_new, s->max_len);
    if (o->reserved >= s->V)
        return errbuf_set(err, EINVAL, "reserved id %d is outside the vocabulary (%d)", o->reserved, s->V);
    if (o->reserved >= 0 && o->reserved != s->reserved) {
        CHECK_CUDA(cudaMemcpy(s->d_reserved, &o->reserved, sizeof(int32_t), cudaMemcpyHostToDevice));
        s->reserved = o->reserved;
    }
    return target_cuda_cache_crop(s->c, 0, 0, err);
}

/* The target's greedy choice of the n rows of s->logits (never o->reserved) into s->h_next; waits for the stream. */
static void greedy_rows(spec_cuda *s, int n, const spec_opts *o)
{
    if (o->reserved >= 0) logits_mask_rows_cuda(s->logits, s->V, n, s->d_reserved, 1, s->stream);
    argmax_rows_cuda(s->d_next, s->logits, s->V, n, s->V, s->stream);
    CHECK_CUDA(cudaMemcpyAsync(s->h_next, s->d_next, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost,
                               (cudaStream_t)s->stream));
    CHECK_CUDA(cudaStreamSynchronize((cudaStream_t)s->stream));
}

int spec_decode_cuda(spec_cuda *s, const int32_t *prompt, int plen, const spec_opts *o, spec_result *r, errbuf *err)
{
    DF_ASSERT(s->d && plen >= 1 && o->max_new >= 1);
    const int B = s->B, K = s->K, KH = s->KH, total = plen + o->max_new;
    const int seq0 = 0;
    result_init(r, o->max_new, o->max_new);
    int rc = start_prompt(s, plen, o, err);
    if (rc) return rc;
    int32_t *seq = xmalloc(sizeof(int32_t) * (size_t)(total + 1)), block[DFLASH_MAX_BLOCK], draft[DFLASH_MAX_BLOCK];
    memcpy(seq, prompt, sizeof(int32_t) * (size_t)plen);

    double t0 = now_seconds();
    int n = plen; /* the prompt's taps straight into the context rows 0..plen-1 */
    if ((rc = target_cuda_cache_forward(s->c, 1, &seq0, &n, prompt, s->taps, K, s->ctx, KH, s->logits, 1, err)))
        goto done;
    greedy_rows(s, 1, o);
    seq[plen] = s->h_next[0];
    double t1 = now_seconds();
    r->prefill_s = t1 - t0;
    int start = plen, stopped = is_eos(o, seq[plen]);
    while (start + 1 < total && !stopped) {
        int vs = total - start < B ? total - start : B; /* verify no position past the end */
        if ((rc = drafter_infer_cuda_block(s->d, s->ctx, start, seq[start], draft, err))) goto done;
        block[0] = seq[start];
        for (int k = 1; k < vs; k++) block[k] = draft[k];
        n = vs;
        if ((rc = target_cuda_cache_forward(s->c, 1, &seq0, &n, block, s->taps, K, s->baux, KH, s->logits, 0, err)))
            goto done;
        greedy_rows(s, vs, o);
        int acc = 0;
        while (acc + 1 < vs && block[acc + 1] == s->h_next[acc]) acc++;
        for (int k = 1; k <= acc; k++) seq[start + k] = block[k];
        seq[start + acc + 1] = s->h_next[acc]; /* the bonus token */
        int produced = spec_block_commit(o, seq, start, acc, total, &stopped);
        /* the committed block positions start..start+produced-1 hold correct tokens: their taps are context */
        CHECK_CUDA(cudaMemcpyAsync(s->ctx + (size_t)start * KH, s->baux, (size_t)produced * KH * 2,
                                   cudaMemcpyDeviceToDevice, (cudaStream_t)s->stream));
        CHECK_CUDA(cudaStreamSynchronize((cudaStream_t)s->stream)); /* before the drafter's stream reads them */
        start += produced;
        if ((rc = target_cuda_cache_crop(s->c, 0, start, err))) goto done;
        r->accepted[r->nblocks++] = produced;
    }
    r->decode_s = now_seconds() - t1;
    r->ntokens = (start + 1 < total ? start + 1 : total) - plen;
    memcpy(r->tokens, seq + plen, sizeof(int32_t) * (size_t)r->ntokens);
done:
    free(seq);
    return rc;
}

int spec_target_greedy_cuda(spec_cuda *s, const int32_t *prompt, int plen, const spec_opts *o, spec_result *r,
                            errbuf *err)
{
    DF_ASSERT(plen >= 1 && o->max_new >= 1);
    const int seq0 = 0;
    result_init(r, o->max_new, 0);
    int rc = start_prompt(s, plen, o, err);
    if (rc) return rc;
    double t0 = now_seconds();
    int n = plen;
    if ((rc = target_cuda_cache_forward(s->c, 1, &seq0, &n, prompt, NULL, 0, NULL, 0, s->logits, 1, err))) return rc;
    greedy_rows(s, 1, o);
    r->tokens[r->ntokens++] = s->h_next[0];
    double t1 = now_seconds();
    r->prefill_s = t1 - t0;
    n = 1;
    while (r->ntokens < o->max_new && !is_eos(o, r->tokens[r->ntokens - 1])) {
        if ((rc = target_cuda_cache_forward(s->c, 1, &seq0, &n, &r->tokens[r->ntokens - 1], NULL, 0, NULL, 0,
                                            s->logits, 1, err)))
            return rc;
        greedy_rows(s, 1, o);
        r->tokens[r->ntokens++] = s->h_next[0];
    }
    r->decode_s = now_seconds() - t1;
    return 0;
}
