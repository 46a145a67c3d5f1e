/* optim: the optimizer of drafter training, one path for the goldens and for production: the learning rate of a
 * step (linear warm-up, cosine decay), the clip coefficient from the global gradient norm, and AdamW (PyTorch
 * semantics, decoupled weight decay on matrices only, as drafter_layout says) over a range of the flat fp32 state,
 * from the state of step k into the state of step k+1 (double-buffered: source and destination may differ or be
 * the same buffers). A step that must not be applied (the NaN guard) copies the source range unchanged. */
#ifndef DFLASH_OPTIM_H
#define DFLASH_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "adamw.h"
#include "drafter_layout.h"
#include "job_config.h"

typedef struct optim_config {
    float lr, min_lr, beta1, beta2, eps, weight_decay, clip;
    long warmup_steps, total_steps;
} optim_config;

/* The train.* settings of a job. */
void optim_config_from_job(optim_config *o, const job_config *c);
/* Learning rate and AdamW parameters of 0-based step k. */
float optim_lr(const optim_config *o, uint64_t step);
adamw_params optim_adamw_params(const optim_config *o, uint64_t step);

/* A state buffer: weights, first and second moments, numel each. */
typedef struct optim_state {
    float *w, *m, *v;
} optim_state;

/* AdamW of 1-based step `step1` on the elements [lo, hi) of the layout: src -> dst with gradient g (g[0] is element
 * lo) times coef (the clip coefficient). apply == 0: dst = src on the range (the step is skipped). */
void optim_apply_range(const drafter_layout *L, size_t lo, size_t hi, const float *g, optim_state src, optim_state dst,
                       const adamw_params *ap, long step1, float coef, int apply);
/* The whole model in place (goldens, tests): global norm of g, clip, AdamW. Returns the norm before clipping. */
double optim_step_inplace(const drafter_layout *L, optim_state s, const float *g, const adamw_params *ap, long step1,
                          float clip);

#endif
