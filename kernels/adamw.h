/* adamw: the optimizer step (PyTorch AdamW semantics, decoupled weight decay), the global gradient norm, and the
 * learning-rate schedule (linear warm-up then cosine decay). fp32 master weights and moments. */
#ifndef DFLASH_KERNEL_ADAMW_H
#define DFLASH_KERNEL_ADAMW_H

#include <stddef.h>

typedef struct adamw_params {
    float lr;           /* this step's learning rate (after the schedule) */
    float beta1, beta2, eps;
    float weight_decay; /* applied as p *= 1 - lr*wd before the update, only when decay != 0 for this tensor */
} adamw_params;

/* One step on n elements: g = grad * grad_scale (the clip coefficient); step is 1-based (bias correction);
 * decay selects whether weight decay applies to this tensor (matrices yes, norms no). */
void adamw_step_cpu(float *param, const float *grad, float *m, float *v, size_t n, const adamw_params *p,
                    long step, float grad_scale, int decay);
/* Σ grad² in double (sum over tensors, then sqrt for the global norm). */
double grad_sq_sum_cpu(const float *grad, size_t n);
/* Clip coefficient min(1, clip / (norm + 1e-6)); clip <= 0 disables clipping (returns 1). */
float grad_clip_coef(double norm, float clip);
/* Learning rate at 0-based step: linear warm-up over warmup_steps to peak, then cosine to min_lr at total_steps. */
float lr_schedule(long step, long warmup_steps, long total_steps, float peak_lr, float min_lr);

#endif
