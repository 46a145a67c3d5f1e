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

#include <stdint.h>

/* One tensor's slice [offset, offset + numel) of the flat state, and whether weight decay applies to it. A device
 * table of these, sorted by offset and not overlapping, tells adamw_apply_cuda the decay of each element (elements
 * outside every range: no decay). */
typedef struct adamw_range {
    uint64_t offset, numel;
    int32_t decay, reserved;
} adamw_range;

#ifdef __cplusplus
extern "C" {
#endif
/* CUDA optimizer over the flat fp32 state, no host synchronisation. All pointers are device pointers except p.
 * Bytes of workspace grad_sq_sum_cuda needs (a fixed number of per-block partial sums). */
size_t grad_sq_sum_cuda_workspace(size_t n);
/* *sq_sum (device double) = Σ (grad·grad_scale)² over n fp32 (the product rounded to fp32, its square accumulated
 * in double); deterministic (per-block partials in workspace, then a fixed-order sum). */
void grad_sq_sum_cuda(double *sq_sum, const float *grad, size_t n, float grad_scale, void *workspace, void *stream);
/* One AdamW step as adamw_step_cpu over n elements of the gradient fp32(grad·grad_scale) (e.g. 1/Σ loss weights) with
 * the clip coefficient grad_clip_coef(sqrt(*sq_sum), clip) (*sq_sum from grad_sq_sum_cuda with the same grad_scale):
 * reads w/m/v from the *_src buffers, writes the *_dst buffers (may be the same as src) and w_bf16 = bf16(new w).
 * Decay per element from ranges (device, nranges). NaN guard: when sqrt(*sq_sum) or *loss (device, may be NULL) is
 * not finite the step is skipped: dst = src, w_bf16 = bf16(src w), and *skipped (device int) = 1 (else 0). lr is
 * p->lr (host, this step's schedule value); step is 1-based (bias correction, computed on the host). */
void adamw_apply_cuda(float *w_dst, float *m_dst, float *v_dst, uint16_t *w_bf16, const float *w_src,
                      const float *m_src, const float *v_src, const float *grad, float grad_scale, size_t n,
                      const adamw_range *ranges, int nranges, const double *sq_sum, const float *loss, float clip, const adamw_params *p,
                      long step, int *skipped, void *stream);
#ifdef __cplusplus
}
#endif

#endif
