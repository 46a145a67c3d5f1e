/* colsum: CPU reference, in the CUDA kernel's order. */
#include "colsum.h"

#include <stddef.h>

void colsum_add_cpu(float *dw, const float *part, int nparts, int dim)
{
    for (int c = 0; c < dim; c++) {
        float s[32], t = 0.0f;
        for (int j = 0; j < 32; j++) {
            s[j] = 0.0f;
            for (int p = j; p < nparts; p += 32) s[j] += part[(size_t)p * dim + c];
        }
        for (int j = 0; j < 32; j++) t += s[j];
        dw[c] += t;
    }
}
