/* argmax: CPU reference (first index of the maximum; NaN never wins). */
#include "argmax.h"

#include <math.h>
#include <stddef.h>

void argmax_rows_cpu(int32_t *out, const float *x, int ld, int n, int V)
{
    for (int r = 0; r < n; r++) {
        const float *row = x + (size_t)r * (size_t)ld;
        int best = 0;
        float bv = -INFINITY;
        for (int i = 0; i < V; i++)
            if (row[i] > bv) bv = row[i], best = i;
        out[r] = best;
    }
}
