/* nonfinite: CPU reference. */
#include "nonfinite.h"

#include <math.h>
#include <stddef.h>

int64_t nonfinite_groups_cpu(uint32_t *flags, const float *x, int ld, int n, int G, int C)
{
    int64_t first = -1;
    for (int r = 0; r < n; r++) {
        const float *row = x + (size_t)r * (size_t)ld;
        for (int g = 0; g < G; g++)
            for (int c = 0; c < C; c++) {
                if (isfinite(row[(size_t)g * C + c])) continue;
                if (first < 0) first = (int64_t)r * G * C + (int64_t)g * C + c;
                if (!flags) return first;
                flags[g] = 1;
                break; /* the rest of this group adds nothing */
            }
    }
    return first;
}
