#include "optim.h"

#include <math.h>
#include <string.h>

void optim_config_from_job(optim_config *o, const job_config *c)
{
    *o = (optim_config){.lr = (float)c->train.lr, .min_lr = (float)c->train.min_lr, .beta1 = (float)c->train.beta1,
                        .beta2 = (float)c->train.beta2, .eps = (float)c->train.eps,
                        .weight_decay = (float)c->train.weight_decay, .clip = (float)c->train.clip,
                        .warmup_steps = c->train.warmup_steps, .total_steps = c->train.steps};
}

float optim_lr(const optim_config *o, uint64_t step)
{
    return lr_schedule((long)step, o->warmup_steps, o->total_steps, o->lr, o->min_lr);
}

adamw_params optim_adamw_params(const optim_config *o, uint64_t step)
{
    return (adamw_params){.lr = optim_lr(o, step), .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps,
                          .weight_decay = o->weight_decay};
}

void optim_apply_range(const drafter_layout *L, size_t lo, size_t hi, const float *g, optim_state src, optim_state dst,
                       const adamw_params *ap, long step1, float coef, int apply)
{
    if (hi <= lo) return;
    const size_t n = hi - lo;
    if (dst.w != src.w) {
        memcpy(dst.w + lo, src.w + lo, sizeof(float) * n);
        memcpy(dst.m + lo, src.m + lo, sizeof(float) * n);
        memcpy(dst.v + lo, src.v + lo, sizeof(float) * n);
    }
    if (!apply) return;
    for (int i = 0; i < L->nparams; i++) {
        const drafter_param *q = &L->params[i];
        size_t a = q->offset > lo ? q->offset : lo, e = q->offset + q->numel < hi ? q->offset + q->numel : hi;
        if (a >= e) continue;
        adamw_step_cpu(dst.w + a, g + (a - lo), dst.m + a, dst.v + a, e - a, ap, step1, coef, q->decay);
    }
}

double optim_step_inplace(const drafter_layout *L, optim_state s, const float *g, const adamw_params *ap, long step1,
                          float clip)
{
    double norm = sqrt(grad_sq_sum_cpu(g, L->numel));
    optim_apply_range(L, 0, L->numel, g, s, s, ap, step1, grad_clip_coef(norm, clip), 1);
    return norm;
}
