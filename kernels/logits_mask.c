/* logits_mask: CPU reference. */
#include "logits_mask.h"

#include <math.h>
#include <stddef.h>

void logits_mask_rows_cpu(float *x, int ld, int n, const int32_t *ids, int nids)
{
    for (int r = 0; r < n; r++)
        for (int k = 0; k < nids; k++) x[(size_t)r * (size_t)ld + (size_t)ids[k]] = -INFINITY;
}
