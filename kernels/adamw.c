/* adamw (CPU reference): mirrors torch.optim.AdamW's _single_tensor_adamw op by op in fp32 (scalar factors in
 * double, rounded to float where torch casts a Python scalar into a float tensor op), so a step matches the
 * PyTorch goldens to the last few ulps. m uses torch's lerp form m + (1-b1)(g - m), equal to b1 m + (1-b1) g. */
#include "adamw.h"

#include <math.h>

#include "util.h"

void adamw_step_cpu(float *param, const float *grad, float *m, float *v, size_t n, const adamw_params *p,
                    long step, float grad_scale, int decay)
{
    DF_ASSERT(step >= 1);
    const double lr = p->lr, b1 = p->beta1, b2 = p->beta2;
    const double bc1 = 1.0 - pow(b1, (double)step);
    const double bc2 = 1.0 - pow(b2, (double)step);
    const float step_size = (float)(lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    const float w1 = (float)(1.0 - b1), w2 = (float)(1.0 - b2), b2f = p->beta2, eps = p->eps;
    const int do_decay = decay && p->weight_decay != 0.0f;
    const float keep = (float)(1.0 - lr * (double)p->weight_decay);

    for (size_t i = 0; i < n; i++) {
        float x = param[i];
        if (do_decay) x *= keep;
        const float g = grad[i] * grad_scale;
        /* torch lerp: weight < 0.5 ? self + w (end - self) : end - (end - self)(1 - w) */
        const float mi = fabsf(w1) < 0.5f ? m[i] + w1 * (g - m[i]) : g - (g - m[i]) * (1.0f - w1);
        const float vi = v[i] * b2f + w2 * g * g;
        const float denom = sqrtf(vi) / bc2_sqrt + eps;
        x += -step_size * (mi / denom);
        m[i] = mi;
        v[i] = vi;
        param[i] = x;
    }
}

double grad_sq_sum_cpu(const float *grad, size_t n)
{
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) acc += (double)grad[i] * (double)grad[i];
    return acc;
}

float grad_clip_coef(double norm, float clip)
{
    if (clip <= 0.0f) return 1.0f;
    double c = (double)clip / (norm + 1e-6);
    return c < 1.0 ? (float)c : 1.0f;
}

float lr_schedule(long step, long warmup_steps, long total_steps, float peak_lr, float min_lr)
{
    if (step < warmup_steps) return (float)((double)peak_lr * (double)(step + 1) / (double)warmup_steps);
    long span = total_steps - warmup_steps;
    double progress = (double)(step - warmup_steps) / (double)(span > 1 ? span : 1);
    if (progress < 0.0) progress = 0.0;
    if (progress > 1.0) progress = 1.0;
    return (float)((double)min_lr + 0.5 * ((double)peak_lr - (double)min_lr) * (1.0 + cos(M_PI * progress)));
}
