/* spec_decode_cuda: the GPU engine of spec_run (spec_decode.h: one loop for both backends). Every step ends with a
 * host synchronisation (the next step's input is
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
    int32_t reserved_want;   /* the current prompt's reserved id (spec_opts.reserved) */
};

int spec_cuda_create(spec_cuda **out, target_cuda *m, target_cuda_cache *c, drafter_infer_cuda *d, int max_len,
                     errbuf *err)
{
    const hf_config *tc = target_cuda_config(m);
    if (max_len < 2) return errbuf_set(err, EINVAL, "speculative decoding: %d positions", max_len);
    target_cuda_set_for_verification(m); /* its greedy steps round as its verified blocks */
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

/* Sequence 0 emptied, the reserved id on the device. */
static int start_prompt(spec_cuda *s, errbuf *err)
{
    if (s->reserved_want >= s->V)
        return errbuf_set(err, EINVAL, "reserved id %d is outside the vocabulary (%d)", s->reserved_want, s->V);
    if (s->reserved_want >= 0 && s->reserved_want != s->reserved) {
        CHECK_CUDA(cudaMemcpy(s->d_reserved, &s->reserved_want, sizeof(int32_t), cudaMemcpyHostToDevice));
        s->reserved = s->reserved_want;
    }
    return target_cuda_cache_crop(s->c, 0, 0, err);
}

/* The target's greedy choice of the n rows of s->logits (never the reserved id) into next; waits for the stream. */
static void greedy_rows(spec_cuda *s, int n, int32_t *next)
{
    if (s->reserved_want >= 0) logits_mask_rows_cuda(s->logits, s->V, n, s->d_reserved, 1, s->stream);
    argmax_rows_cuda(s->d_next, s->logits, s->V, n, s->V, s->stream);
    CHECK_CUDA(cudaMemcpyAsync(s->h_next, s->d_next, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost,
                               (cudaStream_t)s->stream));
    CHECK_CUDA(cudaStreamSynchronize((cudaStream_t)s->stream));
    memcpy(next, s->h_next, sizeof(int32_t) * (size_t)n);
}

/* ---- the engine of spec_run (spec_decode.h) ---- */

static int gpu_prefill(void *e, const int32_t *prompt, int plen, int with_taps, int32_t *first, errbuf *err)
{
    spec_cuda *s = e;
    const int seq0 = 0;
    int rc = start_prompt(s, err);
    if (rc) return rc;
    /* the prompt's taps straight into the context rows 0..plen-1 */
    rc = target_cuda_cache_forward(s->c, 1, &seq0, &plen, prompt, with_taps ? s->taps : NULL, with_taps ? s->K : 0,
                                   with_taps ? s->ctx : NULL, s->KH, s->logits, 1, err);
    if (!rc) greedy_rows(s, 1, first);
    return rc;
}

static int gpu_draft(void *e, int start, int32_t token, int32_t *draft, errbuf *err)
{
    spec_cuda *s = e;
    return drafter_infer_cuda_block(s->d, s->ctx, start, token, draft, err);
}

static int gpu_verify(void *e, const int32_t *block, int n, int with_taps, int32_t *next, errbuf *err)
{
    spec_cuda *s = e;
    const int seq0 = 0;
    int rc = target_cuda_cache_forward(s->c, 1, &seq0, &n, block, with_taps ? s->taps : NULL, with_taps ? s->K : 0,
                                       with_taps ? s->baux : NULL, s->KH, s->logits, 0, err);
    if (!rc) greedy_rows(s, n, next);
    return rc;
}

static int gpu_commit(void *e, int start, int n, errbuf *err)
{
    spec_cuda *s = e;
    CHECK_CUDA(cudaMemcpyAsync(s->ctx + (size_t)start * s->KH, s->baux, (size_t)n * s->KH * 2,
                               cudaMemcpyDeviceToDevice, (cudaStream_t)s->stream));
    CHECK_CUDA(cudaStreamSynchronize((cudaStream_t)s->stream)); /* before the drafter's stream reads them */
    return target_cuda_cache_crop(s->c, 0, start + n, err);
}

static const spec_engine_ops gpu_ops = {gpu_prefill, gpu_draft, gpu_verify, gpu_commit};

int spec_decode_cuda(spec_cuda *s, const int32_t *prompt, int plen, const spec_opts *o, spec_result *r, errbuf *err)
{
    DF_ASSERT(s->d);
    s->reserved_want = o->reserved;
    return spec_run(&gpu_ops, s, s->B, s->max_len, prompt, plen, o, r, err);
}

int spec_target_greedy_cuda(spec_cuda *s, const int32_t *prompt, int plen, const spec_opts *o, spec_result *r,
                            errbuf *err)
{
    s->reserved_want = o->reserved;
    return spec_run(&gpu_ops, s, 0, s->max_len, prompt, plen, o, r, err);
}
