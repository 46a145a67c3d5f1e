/* drafter: the model-backend seam of drafter training. A backend computes, for one batch, the forward and backward
 * of the DFlash drafter against weights it does not own (a read-only view of the reducer's state of step k, in the
 * backend's memory) and accumulates the gradients into a buffer it does not own either (the reducer's); it keeps
 * only its frozen tables (the target's embedding and lm_head) and workspaces. It draws the batch's anchors itself
 * (deterministic in job.seed and the batch id) from the batch's tokens. For tests of the NaN guard, the environment
 * variable DFLASH_FAULT_NAN_BATCH=<batch id> makes that batch's loss NaN. Backends: drafter_cpu.c (host fp32,
 * kernels' CPU references), drafter_cuda.c (drafter_cuda.h: one GPU, bf16 compute). Errors: 0 / -errno with an
 * errbuf. */
#ifndef DFLASH_DRAFTER_H
#define DFLASH_DRAFTER_H

#include <stdint.h>

#include "drafter_model.h"
#include "util.h"

/* One packed batch as the hidden-state slot holds it: the taps in the backend's memory, the tokens on the host (the
 * anchors are drawn there). */
typedef struct drafter_batch {
    uint64_t id;                       /* batch id: picks the anchors (with the seed) */
    int ntok, nseq;
    const void *aux;                   /* (ntok, K*H) target taps: float on the cpu backend, bf16 on cuda */
    const int32_t *input_ids, *positions, *cu_seqlens; /* host */
    const uint8_t *loss_mask;                          /* host */
} drafter_batch;

/* How a backend trains: the drafter's config and the anchor settings of the job. */
typedef struct drafter_train_config {
    const hf_config *drafter;
    int max_anchors;                   /* anchors per sequence */
    uint64_t seed;                     /* job.seed */
    double gamma;                      /* slot weight decay exp(-(k-1)/gamma) */
} drafter_train_config;

typedef struct drafter_backend drafter_backend;

typedef struct drafter_backend_ops {
    /* grads = ∂(Σ w·CE)/∂weights over the batch, every element written (what grads held before is never read: the
     * caller need not zero it); the batch's metrics into *mt (zeroed first). */
    int (*forward_backward)(drafter_backend *b, const void *weights, float *grads, const drafter_batch *batch,
                            drafter_metrics *mt, errbuf *err);
    void (*destroy)(drafter_backend *b);
} drafter_backend_ops;

struct drafter_backend {
    const drafter_backend_ops *ops;
};

static inline void drafter_backend_destroy(drafter_backend **b)
{
    if (*b) (*b)->ops->destroy(*b);
    *b = NULL;
}

/* The CPU backend: fp32 on the host; the frozen tables are loaded from the target checkpoint directory. */
int drafter_cpu_create(drafter_backend **out, const drafter_train_config *tc, const char *target_dir, errbuf *err);

#endif
