/* compare_bf16_line: the one rule by which the GPU tests and the kernel case table hold a bf16 result against its
 * fp32 reference: ‖got − ref‖/‖ref‖ <= tol_norm and max|got − ref| / max(1, max|ref|) <= tol_max, no NaN. Prints
 * the "ok"/"FAIL" line with the figures; returns 1 when it passes. Host code only. */
#ifndef DFLASH_TESTS_COMPARE_BF16_H
#define DFLASH_TESTS_COMPARE_BF16_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util.h"

static inline int compare_bf16_line(const char *name, const uint16_t *got, const float *ref, size_t n, double tol_norm,
                                    double tol_max)
{
    double se = 0, sr = 0, e = 0, mx = 0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        double g = bf16_to_f32(got[i]), w = ref[i];
        if (isnan(g)) nan = 1;
        se += (g - w) * (g - w), sr += w * w;
        e = fmax(e, fabs(g - w)), mx = fmax(mx, fabs(w));
    }
    double nr = sr > 0 ? sqrt(se / sr) : sqrt(se), maxrel = e / fmax(1.0, mx);
    int ok = !nan && nr <= tol_norm && maxrel <= tol_max;
    printf("%s %s norm_rel=%.3g (tol %.0e) max_err/max(1,max|ref|)=%.3g (tol %.0e) max|ref|=%.3g\n",
           ok ? "ok" : "FAIL", name, nr, tol_norm, maxrel, tol_max, mx);
    fflush(stdout);
    return ok;
}

#endif
