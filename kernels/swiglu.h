/* swiglu: out = silu(gate) * up elementwise, and its backward. */
#ifndef DFLASH_KERNEL_SWIGLU_H
#define DFLASH_KERNEL_SWIGLU_H

#include <stddef.h>

/* out[i] = gate[i] / (1 + exp(-gate[i])) * up[i]; out may alias gate or up. */
void swiglu_forward_cpu(float *out, const float *gate, const float *up, size_t n);
/* dgate[i], dup[i] from dout and the forward inputs (overwritten, not accumulated). */
void swiglu_backward_cpu(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);

#endif
