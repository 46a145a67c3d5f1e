#include "weights_check.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"
#include "util.h"

/* The first non-finite element of t, or -1 (F32, BF16, F16, F64; other dtypes hold no floats). *v: its value. */
static int64_t first_nonfinite(const st_tensor *t, double *v)
{
    const size_t es = st_dtype_size(t->dtype), n = es ? t->nbytes / es : 0;
    const unsigned char *p = t->data;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        switch (t->dtype) {
        case ST_F32: {
            float f;
            memcpy(&f, p + 4 * i, 4);
            if (isfinite(f)) continue;
            *v = f;
            return (int64_t)i;
        }
        case ST_F64: {
            double d;
            memcpy(&d, p + 8 * i, 8);
            if (isfinite(d)) continue;
            *v = d;
            return (int64_t)i;
        }
        case ST_BF16:
            memcpy(&h, p + 2 * i, 2);
            if ((h & 0x7f80u) != 0x7f80u) continue;
            *v = bf16_to_f32(h);
            return (int64_t)i;
        case ST_F16:
            memcpy(&h, p + 2 * i, 2);
            if ((h & 0x7c00u) != 0x7c00u) continue;
            *v = (h & 0x3ffu) ? NAN : (h & 0x8000u) ? -INFINITY : INFINITY;
            return (int64_t)i;
        default: return -1;
        }
    }
    return -1;
}

int weights_explain_nonfinite(const char *path, char *out, size_t n)
{
    errbuf err = {{0}};
    st_file *f = NULL;
    if (st_open(&f, path, &err)) {
        snprintf(out, n, "the weights could not be checked: %s", err.msg);
        return 0;
    }
    int found = 0;
    for (int i = 0; i < st_count(f) && !found; i++) {
        const st_tensor *t = st_at(f, i);
        double v = 0;
        int64_t at = first_nonfinite(t, &v);
        if (at < 0) continue;
        char idx[160] = "", layer[32] = "";
        size_t o = 0;
        int64_t rest = at;
        o += (size_t)snprintf(idx + o, sizeof idx - o, "[");
        for (int d = 0; d < t->ndim && o < sizeof idx; d++) { /* the element's index, row-major */
            int64_t stride = 1;
            for (int e = d + 1; e < t->ndim; e++) stride *= t->shape[e];
            o += (size_t)snprintf(idx + o, sizeof idx - o, d ? ", %lld" : "%lld", (long long)(rest / stride));
            rest %= stride;
        }
        if (o < sizeof idx) snprintf(idx + o, sizeof idx - o, "]");
        const char *l = strstr(t->name, "layers.");
        if (l) snprintf(layer, sizeof layer, " (layer %d)", atoi(l + 7));
        snprintf(out, n, "weight %s%s holds %s at %s (in %s)", t->name, layer,
                 isnan(v) ? "nan" : v > 0 ? "inf" : "-inf", idx, t->file ? t->file : path);
        found = 1;
    }
    if (!found) snprintf(out, n, "every weight of %s is finite: the activations overflow", path);
    st_close(&f);
    return found;
}
