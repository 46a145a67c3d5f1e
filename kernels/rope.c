/* rope: rotate-half rotary embedding (CPU reference) and the inverse-frequency table with Llama-3 scaling
 * (transformers _compute_llama3_parameters) or YaRN (_compute_yarn_parameters). */
#include "rope.h"

#include <math.h>

#include "util.h"

/* The dimension (of head_dim) that turns `rotations` times over max_pos positions. */
static double yarn_correction_dim(double rotations, int head_dim, double theta, int max_pos)
{
    return head_dim * log(max_pos / (rotations * 2.0 * M_PI)) / (2.0 * log(theta));
}

static void yarn_blend(double *inv_freq, int head_dim, const rope_params *p)
{
    DF_ASSERT(p->factor > 0 && p->original_max_position > 0 && p->beta_fast > p->beta_slow);
    double low = yarn_correction_dim(p->beta_fast, head_dim, p->theta, p->original_max_position);
    double high = yarn_correction_dim(p->beta_slow, head_dim, p->theta, p->original_max_position);
    if (p->truncate) low = floor(low), high = ceil(high);
    if (low < 0) low = 0;
    if (high > head_dim - 1) high = head_dim - 1;
    if (low == high) high += 0.001;
    for (int i = 0; i < head_dim / 2; i++) {
        double ramp = (i - low) / (high - low); /* 0: extrapolate (keep), 1: interpolate (divide by factor) */
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        inv_freq[i] = inv_freq[i] / p->factor * ramp + inv_freq[i] * (1.0 - ramp);
    }
}

void rope_inv_freq(double *inv_freq, int head_dim, const rope_params *p)
{
    DF_ASSERT(head_dim > 0 && head_dim % 2 == 0 && p->theta > 0);
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) inv_freq[i] = 1.0 / pow(p->theta, (double)(2 * i) / head_dim);
    if (p->yarn) {
        yarn_blend(inv_freq, head_dim, p);
        return;
    }
    if (!p->llama3) return;
    DF_ASSERT(p->factor > 0 && p->low_freq_factor > 0 && p->high_freq_factor > p->low_freq_factor &&
              p->original_max_position > 0);
    double orig = p->original_max_position;
    double low_wavelen = orig / p->low_freq_factor;   /* longer than this: divided by factor */
    double high_wavelen = orig / p->high_freq_factor; /* shorter than this: unchanged */
    for (int i = 0; i < half; i++) {
        double inv = inv_freq[i];
        double wavelen = 2.0 * M_PI / inv;
        if (wavelen > low_wavelen) {
            inv_freq[i] = inv / p->factor;
        } else if (wavelen >= high_wavelen) {
            double smooth = (orig / wavelen - p->low_freq_factor) / (p->high_freq_factor - p->low_freq_factor);
            inv_freq[i] = (1.0 - smooth) * inv / p->factor + smooth * inv;
        }
    }
}

void rope_apply_cpu(float *x, int ld, int n, int heads, int head_dim, const int32_t *pos, const double *inv_freq,
                    int inverse)
{
    DF_ASSERT(n >= 0 && heads >= 0 && head_dim > 0 && head_dim % 2 == 0 && ld >= heads * head_dim);
    int half = head_dim / 2;
    for (int t = 0; t < n; t++) {
        float *xt = x + (size_t)t * ld;
        for (int i = 0; i < half; i++) {
            double ang = (double)pos[t] * inv_freq[i];
            float c = (float)cos(ang), s = (float)sin(ang);
            if (inverse) s = -s;
            for (int h = 0; h < heads; h++) {
                float *xh = xt + (size_t)h * head_dim;
                float x1 = xh[i], x2 = xh[i + half];
                xh[i] = x1 * c - x2 * s;
                xh[i + half] = x2 * c + x1 * s;
            }
        }
    }
}
