/* bias_add: CPU reference. */
#include "bias_add.h"

#include <stddef.h>

void bias_add_cpu(float *x, int ld, int rows, int n, const float *b)
{
    for (int r = 0; b && r < rows; r++)
        for (int i = 0; i < n; i++) x[(size_t)r * (size_t)ld + (size_t)i] += b[i];
}
