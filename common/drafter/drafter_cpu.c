/* The CPU model backend (common/drafter/drafter.h): drafter_model's forward and backward in fp32 on a view model
 * bound to the reducer's weights and gradients, with the target's frozen embedding and lm_head. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "drafter.h"
#include "target_model.h"

typedef struct drafter_cpu {
    drafter_backend base;
    drafter_train_config tc;
    hf_config cfg;
    target_model *tm;
    drafter_model *view;
    drafter_frozen fz;
    uint64_t fault_nan_batch;  /* DFLASH_FAULT_NAN_BATCH: this batch's loss reads NaN (UINT64_MAX: none) */
} drafter_cpu;

static int cpu_forward_backward(drafter_backend *b, const void *weights, float *grads, const drafter_batch *bt,
                                drafter_metrics *mt, errbuf *err)
{
    drafter_cpu *d = (drafter_cpu *)b;
    int32_t *anchors = NULL, *anchor_seq = NULL;
    int n = anchors_sample(bt->cu_seqlens, bt->nseq, bt->loss_mask, d->tc.max_anchors, d->tc.seed, 0, bt->id, &anchors,
                           &anchor_seq);
    drafter_blocks blk;
    drafter_blocks_build(&blk, bt->input_ids, bt->cu_seqlens, bt->loss_mask, anchors, anchor_seq, n,
                         d->cfg.block_size, d->cfg.mask_token_id, d->tc.gamma);
    *mt = (drafter_metrics){0};
    /* the model adds into its gradients; the ops' contract overwrites them */
    memset(grads, 0, sizeof(float) * drafter_numel(d->view));
    drafter_model_bind(d->view, weights, grads);
    drafter_forward_backward(d->view, &d->fz, (const float *)bt->aux, bt->ntok, bt->positions, &blk, 1, 1.0f, mt, NULL);
    if (d->fault_nan_batch == bt->id) mt->loss_sum = NAN; /* fault injection (tests of the NaN guard) */
    drafter_blocks_free(&blk);
    free(anchors);
    free(anchor_seq);
    (void)err;
    return 0;
}

static void cpu_destroy(drafter_backend *b)
{
    drafter_cpu *d = (drafter_cpu *)b;
    drafter_model_destroy(&d->view);
    target_model_destroy(&d->tm);
    free(d);
}

static const drafter_backend_ops cpu_ops = {.forward_backward = cpu_forward_backward, .destroy = cpu_destroy};

int drafter_cpu_create(drafter_backend **out, const drafter_train_config *tc, const char *target_dir, errbuf *err)
{
    drafter_cpu *d = xcalloc(1, sizeof *d);
    d->base.ops = &cpu_ops;
    d->tc = *tc;
    d->cfg = *tc->drafter;
    d->tc.drafter = &d->cfg;
    int rc = target_model_load(&d->tm, target_dir, 0, err);
    if (rc) {
        free(d);
        return errbuf_wrap(err, rc, "frozen embedding and lm_head");
    }
    d->fz = (drafter_frozen){.embed = target_model_embedding(d->tm), .lm_head = target_model_lm_head(d->tm),
                             .vocab = d->cfg.vocab_size};
    d->view = drafter_model_create_view(&d->cfg);
    const char *fault = getenv("DFLASH_FAULT_NAN_BATCH");
    d->fault_nan_batch = fault && *fault ? strtoull(fault, NULL, 10) : UINT64_MAX;
    *out = &d->base;
    return 0;
}
