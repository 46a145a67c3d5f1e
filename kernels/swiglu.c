/* swiglu: CPU reference of silu(gate) * up and its backward. */
#include "swiglu.h"

#include <math.h>

void swiglu_forward_cpu(float *out, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], u = up[i]; /* read before write: out may alias gate or up */
        out[i] = g / (1.0f + expf(-g)) * u;
    }
}

void swiglu_backward_cpu(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], u = up[i], d = dout[i];
        float s = 1.0f / (1.0f + expf(-g));
        /* d silu/dg = s + g·s·(1−s) = s·(1 + g·(1−s)) */
        dgate[i] = d * u * s * (1.0f + g * (1.0f - s));
        dup[i] = d * g * s;
    }
}

void swiglu_clamped_forward_cpu(float *out, const float *gate, const float *up, size_t n, float alpha, float limit)
{
    for (size_t i = 0; i < n; i++) {
        float g = fminf(gate[i], limit), u = fmaxf(fminf(up[i], limit), -limit);
        out[i] = (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
    }
}
