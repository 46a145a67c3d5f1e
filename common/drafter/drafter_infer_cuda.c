/* drafter_infer_cuda: see drafter_infer_cuda.h. */
#include "drafter_infer_cuda.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "anchors.h"
#include "argmax.h"
#include "cuda_check.h"
#include "drafter_cuda.h"
#include "drafter_layout.h"
#include "drafter_model.h"

struct drafter_infer_cuda {
    hf_config cfg;
    drafter_backend *b;
    uint16_t *w;        /* (numel) bf16 weights, drafter_layout order */
    uint16_t *logits;   /* (B, V) */
    int32_t *d_draft, *h_draft;
    int32_t *pos;       /* (max_ctx) 0..max_ctx-1 */
    int max_ctx, B, V;
    drafter_blocks blk; /* one block, rebuilt in place per call */
};

int drafter_infer_cuda_load(drafter_infer_cuda **out, const char *dir, const char *target_dir, const hf_config *target,
                            int fresh, uint64_t seed, int max_ctx, errbuf *err)
{
    drafter_model *m = NULL;
    int rc = drafter_model_load(&m, dir, target, err);
    if (rc) return rc;
    const hf_config *c = drafter_model_config(m);
    /* the check drafter_model_load does not make (drafter_infer.c makes it too) */
    if (c->num_target_layers != target->num_layers) {
        rc = errbuf_set(err, EINVAL, "%s/config.json: num_target_layers %d disagrees with the target's "
                        "num_hidden_layers %d", dir, c->num_target_layers, target->num_layers);
        drafter_model_destroy(&m);
        return rc;
    }
    if (max_ctx < 1) {
        drafter_model_destroy(&m);
        return errbuf_set(err, EINVAL, "drafter inference: a context of %d positions", max_ctx);
    }
    if (fresh) drafter_layout_init_weights(drafter_model_layout(m), drafter_weights(m), seed);
    drafter_infer_cuda *d = xcalloc(1, sizeof *d);
    d->cfg = *c;
    d->B = c->block_size, d->V = c->vocab_size, d->max_ctx = max_ctx;
    drafter_train_config tc = {.drafter = &d->cfg, .max_anchors = 1, .seed = 0, .gamma = 1.0};
    rc = drafter_cuda_create(&d->b, &tc, target_dir, -1, max_ctx, 1, err);
    if (rc) {
        errbuf_wrap(err, rc, "%s: drafter on the GPU", dir);
        drafter_model_destroy(&m);
        free(d);
        return rc;
    }
    const size_t n = drafter_numel(m);
    DF_ASSERT(n == drafter_layout_numel(&d->cfg));
    const float *wf = drafter_weights(m);
    uint16_t *wh = xmalloc(sizeof *wh * n);
    for (size_t i = 0; i < n; i++) wh[i] = f32_to_bf16(wf[i]);
    CHECK_CUDA(cudaMalloc((void **)&d->w, sizeof *wh * n));
    CHECK_CUDA(cudaMemcpy(d->w, wh, sizeof *wh * n, cudaMemcpyHostToDevice));
    free(wh);
    drafter_model_destroy(&m);
    CHECK_CUDA(cudaMalloc((void **)&d->logits, (size_t)d->B * (size_t)d->V * 2));
    CHECK_CUDA(cudaMalloc((void **)&d->d_draft, sizeof(int32_t) * (size_t)d->B));
    CHECK_CUDA(cudaMallocHost((void **)&d->h_draft, sizeof(int32_t) * (size_t)d->B));
    d->pos = xmalloc(sizeof *d->pos * (size_t)max_ctx);
    for (int t = 0; t < max_ctx; t++) d->pos[t] = t;
    /* one block: ctx rows [0, p), slots at p..p+B-1, no labels (inference trains nothing) */
    drafter_blocks_alloc_one(&d->blk, d->B);
    *out = d;
    return 0;
}

void drafter_infer_cuda_destroy(drafter_infer_cuda **dp)
{
    drafter_infer_cuda *d = *dp;
    if (!d) return;
    drafter_backend_destroy(&d->b); /* waits for its stream */
    CHECK_CUDA(cudaFree(d->w));
    CHECK_CUDA(cudaFree(d->logits));
    CHECK_CUDA(cudaFree(d->d_draft));
    CHECK_CUDA(cudaFreeHost(d->h_draft));
    drafter_blocks_free(&d->blk);
    free(d->pos);
    free(d);
    *dp = NULL;
}

const hf_config *drafter_infer_cuda_config(const drafter_infer_cuda *d) { return &d->cfg; }

int drafter_infer_cuda_block(drafter_infer_cuda *d, const uint16_t *ctx, int p, int32_t token, int32_t *draft,
                             errbuf *err)
{
    if (p < 1 || p > d->max_ctx)
        return errbuf_set(err, EINVAL, "drafter block at position %d: the context holds 1..%d positions", p,
                          d->max_ctx);
    drafter_blocks *b = &d->blk;
    drafter_blocks_set_one(b, p, token, d->cfg.mask_token_id);
    int rc = drafter_cuda_forward_logits(d->b, d->w, ctx, p, d->pos, b, d->logits, err);
    if (rc) return rc;
    void *st = drafter_cuda_stream(d->b);
    argmax_rows_cuda(d->d_draft, d->logits, d->V, d->B, d->V, st);
    CHECK_CUDA(cudaMemcpyAsync(d->h_draft, d->d_draft, sizeof(int32_t) * (size_t)d->B, cudaMemcpyDeviceToHost,
                               (cudaStream_t)st));
    CHECK_CUDA(cudaStreamSynchronize((cudaStream_t)st));
    memcpy(draft, d->h_draft, sizeof(int32_t) * (size_t)d->B);
    return 0;
}
