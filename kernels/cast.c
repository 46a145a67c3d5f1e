/* cast: CPU reference (util's f32_to_bf16: round to nearest even). */
#include "cast.h"

#include "util.h"

void cast_f32_bf16_cpu(uint16_t *out, const float *in, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = f32_to_bf16(in[i]);
}
