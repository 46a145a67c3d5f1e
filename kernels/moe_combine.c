/* moe_combine: CPU reference. */
#include "moe_combine.h"

#include <math.h>
#include <stddef.h>

#include "util.h"

void moe_combine_cpu(float *out, int ldo, const float *resid, int ldr, const float *ys, int ldy, const int32_t *row,
                     const float *w, int T, int K, int H, const float *shared, int lds, const float *sg, int ldsg)
{
    DF_ASSERT(T >= 0 && K > 0 && H > 0 && ldo >= H && ldr >= H && ldy >= H && (!shared || lds >= H));
    for (int t = 0; t < T; t++) {
        const float s = !shared ? 0.0f : sg ? 1.0f / (1.0f + expf(-sg[(size_t)t * ldsg])) : 1.0f;
        for (int i = 0; i < H; i++) {
            float acc = 0.0f;
            for (int j = 0; j < K; j++) acc += w[(size_t)t * K + j] * ys[(size_t)row[(size_t)t * K + j] * ldy + i];
            if (shared) acc += s * shared[(size_t)t * lds + i];
            out[(size_t)t * ldo + i] = resid[(size_t)t * ldr + i] + acc;
        }
    }
}
