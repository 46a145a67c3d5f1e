/* sigmoid_gate: CPU reference. */
#include "sigmoid_gate.h"

#include <math.h>
#include <stddef.h>

#include "util.h"

void sigmoid_gate_cpu(float *y, int ldy, const float *x, int ldx, const float *gate, int ldg, int rows, int dim)
{
    DF_ASSERT(rows >= 0 && dim >= 0 && ldy >= dim && ldx >= dim && ldg >= dim);
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < dim; i++)
            y[(size_t)r * ldy + i] = x[(size_t)r * ldx + i] * (1.0f / (1.0f + expf(-gate[(size_t)r * ldg + i])));
}
